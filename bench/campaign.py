"""The actor system against one process: the campaign's RL phase through six actor processes vs in one.

    python bench/campaign.py [--run RUN] [--steps 6] [--batch N] [--sft-steps N] [--keep DIR]

Both sides start from one SFT policy (RUN's version 0 and tokenizer, or a quick one the bench trains
first: configs/tiny.toml's --quick recipe on the tests' micro corpus) and play the same RL schedule on the
same config: the campaign's warm-up trials and the critic's warm-up, then ``--steps`` PPO steps of
``[staleness] batch_size`` admitted trials (RUN's, or ``--batch``) drawn in the campaign's RL order, with
the same oversampling, staleness and cancellation rules (``rollout.trials.run_batches``), the same
engines and threads. Budgets are steps, not seconds.

- six processes: ``t1-actor launch`` with ``[campaign] warm_start_from`` = the SFT run and ``rl_steps``;
  its RL window read from its log (the first training trial's issue to policy version ``steps``);
- one process: ``lib/one_process.run_one_process`` (the same ``run_batches`` over ``InProcessPorts``, the
  learner stepping in a worker thread), timed over the same window.

The evals are not timed (the campaign's protocol runs on a small split around its RL phase; the one
process plays none). Last line: one JSON object with both sides' ``trajectories_per_s`` and
``steps_per_s`` (and per minute), ``actor_system_ratio`` (six processes / one process, trajectories per
second; goal >= 0.9), ``cpu_s`` of each side's process tree over its RL window (by actor role for the
campaign: bench/lib/cpu.py) and ``cpu_s_per_trajectory``, and where the campaign's RL wall time went, from
its log's own timestamps:
``time_shares`` (exclusive, summing to 1 with ``waiting``) and ``busy_shares`` (each part's own; see
tools/_report/time_shares.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from t1_actors.rollout.admission import StalenessConfig
from t1_actors.schedule import CampaignConfig
from t1_actors.tasks.config import TasksConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TINY = ROOT / "configs" / "tiny.toml"
GOAL = 0.9
EVAL_SPLIT = {"eval_size": 8, "recovery_eval": 4, "validation_size": 4, "recovery_validation": 4}


def micro_data(work: Path, sft_steps: int | None) -> dict:
    """configs/tiny.toml with --quick, on the tests' micro corpus (tests/fixtures/campaign.py::micro_config_data)."""
    from t1_actors.job.main import load_campaign_config

    data = load_campaign_config(TINY, quick=True, run_dir=work / "sft").to_jsonable()
    data["tasks"].update(train_size=200)
    data["campaign"].update(sft_seconds=40, warmup_trials=6, eval_concurrency=12)
    if sft_steps is not None:
        data["campaign"]["sft_steps"] = sft_steps
    data["critic"].update(warmup_trajectories=4)
    data["staleness"].update(batch_size=6)
    return data


def train_sft(data: dict, run_dir: Path) -> Path:
    """Phases 1-3 of the campaign (corpus, tokenizer, SFT) into ``run_dir``: what ``warm_start_from`` reads."""
    from t1_actors.job.config import parse_config
    from t1_actors.job.main import _with_vocab
    from t1_actors.job.sft import publish_initial_policy, train_run_tokenizer, warm_start
    from t1_actors.runtime.config import write_resolved
    from t1_actors.tasks import build_task_sets

    config = parse_config(data, "bench")
    run_dir.mkdir(parents=True, exist_ok=True)
    tasks = build_task_sets(config.section(TasksConfig))
    tokenizer = train_run_tokenizer(run_dir, tasks.sft, config.section(CampaignConfig).tokenizer_vocab)
    config = _with_vocab(config, tokenizer.vocab_size)
    policy, _report = warm_start(config, tasks, tokenizer)
    publish_initial_policy(run_dir, policy)
    write_resolved(config, run_dir / "config.resolved.json")
    return run_dir


def bench_config(base: dict, sft_run: Path, work: Path, steps: int, batch: int | None):
    """The one config both sides run: the base run's, warm-started from its SFT policy, ``steps`` PPO
    steps, a small eval split and a one-temperature protocol (evals are not timed), fresh scratch dirs."""
    from t1_actors.job.config import parse_config

    data = json.loads(json.dumps(base))
    data["run"]["dir"] = str(work / "campaign")
    tasks = data["tasks"]
    tasks.update({k: min(v, tasks.get(k, v)) for k, v in EVAL_SPLIT.items()})
    for key in ("composite_eval", "composite_validation"):
        if key in tasks:
            tasks[key] = min(tasks[key], 2)
    data["campaign"].update(rl_steps=steps, rl_seconds=3600.0, warm_start_from=str(sft_run), tokenizer=None)
    data["eval"] = {**data.get("eval", {}), "temperatures": [data["sampler"]["temperature"]], "pass_k_tasks": 0,
                    "sft_passes": "run"}
    if batch is not None:
        data["staleness"]["batch_size"] = batch
        data["staleness"]["max_in_flight"] = max(batch, data["staleness"].get("max_in_flight", batch))
    data["sandbox"] = {**data.get("sandbox", {}),
                       "local": {**data.get("sandbox", {}).get("local", {}), "base_dir": str(work / "sandbox")}}
    data["verifier"] = {**data.get("verifier", {}), "base_dir": str(work / "verifier")}
    for actor in data.get("actors", []):
        actor.get("options", {}).pop("policy_path", None)  # the launcher points samplers at version 0
    return parse_config(data, "bench")


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None) + " }"
    raise TypeError(f"no TOML for {value!r}")


def to_toml(data: dict) -> str:
    """A config's JSON form as TOML (``t1-actor launch`` takes a campaign as TOML): sections as tables,
    ``[[actors]]`` as an array of tables, None left out (the default)."""
    lines: list[str] = []
    for name, body in data.items():
        if isinstance(body, dict):
            lines.append(f"[{name}]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in body.items() if v is not None]
        elif isinstance(body, list) and body and isinstance(body[0], dict):
            for item in body:
                lines.append(f"[[{name}]]")
                lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in item.items() if v is not None]
        lines.append("")
    return "\n".join(lines)


def run_campaign(config_path: Path, run_dir: Path, steps: int, timeout_s: float) -> dict:
    """``t1-actor launch`` on the config, its process tree's CPU seconds snapshotted when the log shows
    the first training trial and policy version ``steps`` (polled every half second); returns its exit
    code, output tail and the CPU the RL window took, by role."""
    from bench.lib.cpu import spent, tree_cpu
    from storage import EventLog

    started = time.monotonic()
    output = open(run_dir.parent / "campaign.out", "w+")
    process = subprocess.Popen([sys.executable, "-m", "t1_actors.cli", "launch", "--config", str(config_path),
                                "--run-dir", str(run_dir)], cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
    snapshots: list[dict] = []
    cursor = None
    try:
        while process.poll() is None and time.monotonic() - started < timeout_s:
            time.sleep(0.5)
            if len(snapshots) == 2:
                continue
            if cursor is None:
                try:
                    cursor = EventLog.open(run_dir / "log").cursor(kinds=["trial_issued", "weights_published"])
                except Exception:  # no log yet
                    continue
            for _, event in cursor.poll():
                if not snapshots and event.kind == "trial_issued" and event.split == "train":
                    snapshots.append(tree_cpu(process.pid))
                elif len(snapshots) == 1 and event.kind == "weights_published" and event.version == steps:
                    snapshots.append(tree_cpu(process.pid))
                    break
        if process.poll() is None:
            process.kill()
        process.wait()
    finally:
        output.seek(0)
        tail = output.read()[-3000:]
        output.close()
    return {"code": process.returncode, "seconds": round(time.monotonic() - started, 1), "tail": tail,
            "cpu_s": spent(*snapshots) if len(snapshots) == 2 else None}


def campaign_side(run_dir: Path, steps: int) -> dict:
    """The campaign's RL figures and time shares, from its log alone."""
    from storage import EventLog
    from tools._report.time_shares import rl_figures, rl_window, time_shares

    log = EventLog.open(run_dir / "log")
    return {**rl_figures(log, steps), **time_shares(log, rl_window(log, steps))}


def ratio(six: dict | None, one: dict | None, key: str) -> float | None:
    if not six or not one or not one.get(key):
        return None
    return round(six[key] / one[key], 3)


def main(argv: list[str] | None = None) -> int:
    import trio

    from bench.lib.one_process import run_one_process

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default=None, help="a run directory whose SFT policy and config both sides use")
    parser.add_argument("--steps", type=int, default=6, help="PPO steps of each side (default 6)")
    parser.add_argument("--batch", type=int, default=None, help="[staleness] batch_size (default: the run's)")
    parser.add_argument("--sft-steps", type=int, default=None, help="the bench's own SFT: steps (default: the recipe)")
    parser.add_argument("--keep", default=None, help="keep the scratch (SFT run, campaign run) in this directory")
    parser.add_argument("--timeout", type=float, default=900.0, help="the campaign's wall-clock limit, seconds")
    args = parser.parse_args(argv)

    work = Path(args.keep or tempfile.mkdtemp(prefix="t1-bench-campaign-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"bench": "campaign", "steps": args.steps}
    try:
        started = time.monotonic()
        if args.run:
            sft_run = Path(args.run).resolve()
            base = json.loads((sft_run / "config.resolved.json").read_text())
        else:
            sft_run = train_sft(micro_data(work, args.sft_steps), work / "sft")
            base = json.loads((sft_run / "config.resolved.json").read_text())
        result["sft_run"] = str(sft_run) if args.run else "trained by the bench (micro corpus, --quick recipe)"
        result["sft_seconds"] = round(time.monotonic() - started, 1)
        config = bench_config(base, sft_run, work, args.steps, args.batch)
        staleness = config.section(StalenessConfig)
        result["config"] = {"batch_size": staleness.batch_size, "oversample": staleness.oversample,
                            "max_staleness": staleness.max_staleness, "on_cancel": staleness.on_cancel,
                            "group_size": staleness.group_size,
                            "warmup_trials": config.section(CampaignConfig).warmup_trials,
                            "max_turns": config.section(CampaignConfig).max_turns,
                            "max_new_tokens": config.section(CampaignConfig).max_new_tokens}
        config_path = work / "bench-config.toml"
        config_path.write_text(to_toml(config.to_jsonable()))

        launched = run_campaign(config_path, work / "campaign", args.steps, args.timeout)
        try:
            six = campaign_side(work / "campaign", args.steps)
            six["cpu_s"] = launched["cpu_s"]
        except (OSError, ValueError) as error:
            six = None
            result["six_processes_error"] = f"{error}; launch exit {launched['code']}: {launched['tail'][-1500:]}"
        one = trio.run(run_one_process, config, sft_run, args.steps)
        result["six_processes"] = six and {k: v for k, v in six.items() if not k.endswith("_shares")}
        result["one_process"] = one
        result["actor_system_ratio"] = ratio(six, one, "trajectories_per_s")
        result["steps_ratio"] = ratio(six, one, "steps_per_s")
        result["cpu_s_per_trajectory"] = {side: figures and figures.get("cpu_s") and round(
            figures["cpu_s"]["total"] / figures["trajectories"], 3) for side, figures in (("six_processes", six),
                                                                                    ("one_process", one))}
        result["time_shares"] = six and six["time_shares"]
        result["busy_shares"] = six and six["busy_shares"]
        result["goal"] = GOAL
        result["goal_met"] = None if result["actor_system_ratio"] is None else result["actor_system_ratio"] >= GOAL
        result["bench_seconds"] = round(time.monotonic() - started, 1)
    except Exception as error:  # the bench still ends with its JSON line, naming what stopped it
        traceback.print_exc()
        result["error"] = f"{type(error).__name__}: {error}"
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return 0 if result.get("actor_system_ratio") is not None else 1


if __name__ == "__main__":
    sys.exit(main())
