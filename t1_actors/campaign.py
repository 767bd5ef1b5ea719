"""The main job: a whole T1-style campaign on the embedded default, wired from the run's config.

    t1-actor launch --config configs/tiny.toml [--quick] [--run-dir DIR]

1. corpus: the synthetic train/eval task sets ([tasks]), disjoint by construction; ``[tasks] rl_size``
   keeps the last train tasks for RL alone;
2. tokenizer: a byte-level BPE trained on the rendered oracle chats of the SFT tasks;
3. SFT warm start on executed oracle trajectories of the SFT tasks -> policy version 0 (safetensors,
   checksum, event);
4. the six actors as processes under the supervisor: the staleness controller evaluates the SFT policy
   on the eval split, plays warm-up trials for the critic's warm-up, runs asynchronous PPO on the RL
   tasks for ``rl_seconds``, and evaluates again;
5. ``summary.json`` and the training-dynamics plots in the run directory.

Everything the actors do is in the run's Zarr log (RUN/log); ``t1-replay`` reads it back.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from schemas import WeightsPublished

from .rollout import RolloutLimits


class CampaignConfig(BaseModel):
    """[campaign]: the phases' budgets. Defaults: the <= 30 min tiny run on 2 CPU cores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    tokenizer_vocab: int = Field(1024, ge=300)
    sft_steps: int | None = Field(600, gt=0, description="SFT optimiser steps (None: train until sft_seconds); "
                                                        "a step budget makes two runs of one seed the same")
    sft_seconds: float = Field(1800.0, gt=0, description="upper bound on SFT's wall time (the whole budget when "
                                                         "sft_steps is None)")
    sft_batch_size: int = Field(32, gt=0)
    sft_lr: float = Field(1e-3, gt=0)
    sft_max_len: int = Field(640, gt=16)
    sft_threads: int = Field(2, gt=0)
    sft_oracle_workers: int = Field(2, gt=0, description="sandboxes executing oracles at once before SFT")
    sft_anchor_every: int = Field(2, ge=0, description="every n-th SFT step trains on one fixed anchor batch "
                                                       "(0: never); see warmstart.supervised_finetune")
    warmup_trials: int = Field(64, ge=0)
    rl_steps: int | None = Field(None, ge=0, description="PPO steps (admitted batches) of the RL phase; None: "
                                                        "until rl_seconds")
    rl_seconds: float = Field(660.0, ge=0, description="upper bound on the RL phase's wall time (the whole budget "
                                                       "when rl_steps is None)")
    eval_concurrency: int = Field(32, gt=0)
    max_turns: int = Field(4, gt=0)
    max_new_tokens: int = Field(64, gt=0)
    max_context: int = Field(768, gt=32)
    tool_output_chars: int = Field(240, gt=0)
    actor_ready_timeout_s: float = Field(120.0, gt=0)
    finish_timeout_s: float = Field(600.0, gt=0)  # after rl_seconds: last steps and the final eval
    warm_start_from: str | None = Field(None, description="a previous run's directory: reuse its tokenizer and "
                                                          "SFT policy (version 0) instead of phases 2-3")
    tito_repairs: list[Literal["normalized", "retokenized"]] = Field(
        [], description="TITO repairs tried before a split ([] = every loss token keeps the sampler's exact "
                        "context; a repaired boundary trains later turns on a context the sampler never saw)")

    def rollout_limits(self) -> RolloutLimits:
        return RolloutLimits(max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                             max_context=self.max_context, tool_output_chars=self.tool_output_chars)


# ---------------------------------------------------------------------------------------------- paths

from .layout import log_path, tokenizer_path, weights_dir  # noqa: E402  (the run's paths, defined once)


# ---------------------------------------------------------------------------------------------- phases

def train_run_tokenizer(run_dir: Path, train_tasks: list, vocab: int):
    """Phase 2: the tiny BPE, trained on rendered oracle chats of the training split only."""
    from .policy.tokenizer import train_tokenizer
    from .warmstart import chat_corpus

    from .policy import load_tokenizer

    train_tokenizer(chat_corpus(train_tasks), vocab).save(str(tokenizer_path(run_dir)))
    return load_tokenizer(tokenizer_path(run_dir))  # exactly what the run's actors will load


def warm_start(config, tasks, tokenizer, *, pool_progress=None, progress=None) -> tuple[Any, dict[str, Any]]:
    """Phase 3: execute the SFT tasks' oracles (``tasks.sft``), then SFT on them; returns the policy and a report."""
    from .backends.local_sandbox import LocalSandboxBackend
    from .policy import MoEPolicy
    from .policy.tokenizer import special_token_ids
    from .tasks import oracle_trajectory
    from .warmstart import execute_oracle_pool, supervised_finetune

    campaign: CampaignConfig = config.section("campaign")
    torch.manual_seed(campaign.seed)
    torch.set_num_threads(campaign.sft_threads)
    sandboxes = LocalSandboxBackend(config.section("sandbox").local)

    def execute_oracle(task) -> list[str] | None:
        try:
            with sandboxes.open(task, f"sft-{task.id}") as sandbox:
                outputs = []
                for command in oracle_trajectory(task):
                    result = sandbox.exec(command)
                    outputs.append(result.stdout + result.stderr)
                return outputs
        except Exception:  # an infrastructure hiccup costs one example, never the run
            return None

    pool_start = time.monotonic()
    try:
        examples, failures = execute_oracle_pool(tasks.sft, execute_oracle, tokenizer,
                                                 tool_output_chars=campaign.tool_output_chars,
                                                 max_len=campaign.sft_max_len, workers=campaign.sft_oracle_workers,
                                                 progress=pool_progress)
    finally:
        sandboxes.close()
    pool_seconds = time.monotonic() - pool_start
    policy = MoEPolicy(config.section("model"))
    pad_id = special_token_ids(tokenizer)["<|endoftext|>"]
    report = supervised_finetune(policy, examples, seconds=campaign.sft_seconds, batch_size=campaign.sft_batch_size,
                                 lr=campaign.sft_lr, pad_id=pad_id, seed=campaign.seed, steps=campaign.sft_steps,
                                 anchor_every=campaign.sft_anchor_every, progress=progress)
    return policy, {"steps": report.steps, "examples_seen": report.examples_seen,
                    "distinct_examples": report.distinct_examples, "epochs": round(report.epochs, 2),
                    "final_loss": report.final_loss, "seconds": round(report.seconds, 1),
                    "tokens_per_s": round(report.tokens_per_s, 1), "oracle_failures": failures,
                    "oracle_pool_seconds": round(pool_seconds, 1), "parameters": policy.num_parameters()}


def reuse_warm_start(previous: Path, run_dir: Path):
    """Phases 2-3 taken from a previous run: its tokenizer and its SFT policy (version 0), copied in."""
    import shutil

    from .policy import MoEPolicy
    from .policy.tokenizer import load_tokenizer

    source_tokenizer, source_policy = tokenizer_path(previous), weights_dir(previous, 0)
    missing = [str(p) for p in (source_tokenizer, source_policy) if not p.exists()]
    if missing:
        raise FileNotFoundError(f"[campaign] warm_start_from = {str(previous)!r}: missing {missing}; point it at "
                                "the directory of a run that finished its SFT phase")
    shutil.copyfile(source_tokenizer, tokenizer_path(run_dir))
    policy = MoEPolicy.load(source_policy)
    return load_tokenizer(tokenizer_path(run_dir)), policy, {"warm_start_from": str(previous)}


def check_warm_start_tasks(previous: Path, tasks) -> None:
    """Refuse a warm start whose SFT was fitted on this run's RL tasks: that would quietly undo ``rl_size``."""
    from .tasks import TasksConfig, build_task_sets

    if not tasks.carved:
        return  # no carve-out asked for: RL shares the SFT tasks by design
    resolved = previous / "config.resolved.json"
    try:
        previous_tasks = TasksConfig.model_validate(json.loads(resolved.read_text())["tasks"])
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"[campaign] warm_start_from = {str(previous)!r}: cannot tell which tasks its SFT saw "
                         f"({resolved}: {error}); with [tasks] rl_size set, warm-start only from a t1 run directory"
                         ) from None
    seen = {t.id for t in build_task_sets(previous_tasks).sft}
    overlap = sum(1 for t in tasks.rl if t.id in seen)
    if overlap:
        raise ValueError(f"[campaign] warm_start_from = {str(previous)!r}: its SFT was fitted on {overlap} of this "
                         f"run's {len(tasks.rl)} RL tasks ([tasks] rl_size); raise [tasks] train_size past the "
                         f"{len(seen)} tasks it saw, or warm-start from a run with the same [tasks] section")


# what decides an eval pass's draws besides the policy: equal in both runs, or their SFT passes differ
_DRAW_KEYS = {"tasks": None, "eval": None, "sampler": ("temperature", "top_p"),
              "campaign": ("max_turns", "max_new_tokens", "max_context", "tool_output_chars")}


def check_warm_start_passes(previous: Path, config) -> None:
    """``[eval] sft_passes = "warm_start"``: the previous run's log holds the SFT policy's whole protocol,
    played on the same tasks with the same eval settings, so its passes are this run's SFT passes."""
    from schemas import EvalResult
    from storage import EventLog

    from .skill_report import is_sft_label

    where = f"[eval] sft_passes = 'warm_start' with warm_start_from = {str(previous)!r}"
    try:
        theirs = json.loads((previous / "config.resolved.json").read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{where}: cannot read its config ({error})") from None
    from .config import section_model

    for section, keys in _DRAW_KEYS.items():
        try:
            a = section_model(section).model_validate(theirs.get(section, {})).model_dump(mode="json")
        except ValueError as error:
            raise ValueError(f"{where}: its [{section}] no longer validates ({error})") from None
        b = config.section(section).model_dump(mode="json")
        for key in keys or sorted(set(a) | set(b)):
            if (section, key) != ("eval", "sft_passes") and a.get(key) != b.get(key):
                raise ValueError(f"{where}: its [{section}] {key} = {a.get(key)!r}, this run's = {b.get(key)!r}; "
                                 "the SFT passes would not be the draws this run's RL passes pair with: make them "
                                 "equal, or set [eval] sft_passes = 'run'")
    if not log_path(previous).exists():
        raise ValueError(f"{where}: it has no log ({log_path(previous)})")
    results = [e for _, e in EventLog.open(log_path(previous)).events(kinds=["eval_result"])
               if isinstance(e, EvalResult) and is_sft_label(e.label)]
    if not any(e.last for e in results):
        raise ValueError(f"{where}: its log holds {len(results)} SFT eval passes but not the protocol's last one; "
                         "let that run finish its SFT evals, or set [eval] sft_passes = 'run'")


def sft_passes_log(config):
    """The log the SFT policy's eval passes are read from, when not this run's (``[eval] sft_passes``)."""
    from storage import EventLog

    if config.section("eval").sft_passes != "warm_start":
        return None
    return EventLog.open(log_path(Path(config.section("campaign").warm_start_from)))


def code_version() -> dict[str, Any] | None:
    """The commit the run's code came from (and whether the tree had changes): which code a figure is of."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None  # not a git checkout (an installed wheel)
    return {"commit": commit, "dirty": bool(dirty)}


def publish_initial_policy(run_dir: Path, policy) -> WeightsPublished:
    """Version 0 = the SFT checkpoint, published like any learner version (safetensors + sha256)."""
    from .layout import sha256_file

    directory = weights_dir(run_dir, 0)
    policy.save(directory)
    weights = next(directory.glob("*.safetensors"))
    return WeightsPublished(version=0, sha256=sha256_file(weights), location=str(directory), step=0)


def write_summary(run_dir: Path, *, eval_before, eval_after, actors: list[str], counts: dict[str, int],
                  extra: dict[str, Any]) -> dict[str, Any]:
    from .skill_report import scored

    summary = {"eval_before": scored(eval_before), "eval_after": scored(eval_after), "actors": actors,
               "events": counts, **extra}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary


def eval_change(log, sft_log=None, passes=None) -> dict[str, Any] | None:
    """The paired before/after comparison over the eval tasks (None until both evals are in the log).

    Eval trials carry the label of their pass (``before`` / ``after``); in logs written before labels
    existed they are told apart by the learner's version they were issued at (version 0 before, any later
    one after). ``sft_log``: the log the SFT policy's passes are read from (``[eval] sft_passes``);
    ``passes``: those logs' ``EvalPasses`` when the caller has read them already."""
    from .eval_stats import eval_outcomes, first_attempts, paired_change
    from .skill_report import EvalPasses

    attempts = (passes or EvalPasses.read(log, sft_log)).attempts
    if "before" in attempts and "after" in attempts:
        return paired_change(first_attempts(attempts["before"]), first_attempts(attempts["after"])).as_dict()
    if attempts or sft_log is not None:
        return None
    by_version = eval_outcomes(e for _, e in log.events(kinds=["trial_issued", "verifier_result"]))
    versions = sorted(by_version)
    if len(versions) < 2:
        return None
    after: dict = {}
    for version in versions[1:]:
        after.update(by_version[version])
    return paired_change(by_version[versions[0]], after).as_dict()


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


# ---------------------------------------------------------------------------------------------- the run

def load_campaign_config(path: str | Path, *, quick: bool = False, run_dir: str | Path | None = None):
    """Read the run's TOML, apply the ``[quick.*]`` overrides with ``--quick`` and ``--run-dir``, validate
    (every section and every rule across them: ``config_rules``)."""
    from .config import load_config

    return load_config(path, quick=quick, run_dir=run_dir)


def _with_vocab(config, vocab_size: int):
    """The config with the model's vocabulary sized to the trained tokenizer (BPE may stop short of the
    asked size on a small corpus; logits for ids no text maps to would only waste probability mass)."""
    from .config import parse_config

    data = _jsonable(config)
    data["model"] = {**config.section("model").model_dump(mode="json"), "vocab_size": vocab_size}
    return parse_config(data, "campaign")


def _jsonable(config) -> dict:
    data = config.to_jsonable()
    if config.run.hmac_key is not None:
        data["run"]["hmac_key"] = config.run.hmac_key.get_secret_value()
    return data


def _with_policy(config, location: str):
    """The config with every sampler starting from the SFT checkpoint (version 0)."""
    actors = []
    for spec in config.actors:
        if spec.role == "sampler":
            spec = spec.model_copy(update={"options": {**spec.options, "policy_path": location}})
        actors.append(spec)
    data = _jsonable(config)
    data["actors"] = [a.model_dump(mode="json") for a in actors]
    from .config import parse_config
    return parse_config(data, "campaign")


def run_campaign(config, *, console=None, write_report=None) -> dict[str, Any]:
    """Run every phase; returns the summary (also written to RUN/summary.json).

    ``write_report(run_dir) -> dict`` draws the plots (the CLI passes ``tools.report.write_report``; this
    module stays below the faces that read logs)."""
    import trio
    from rich.console import Console

    from storage import EventLog

    from .progress import run_actors, sft_with_progress
    from .tasks import build_task_sets

    console = console or Console(stderr=True)
    campaign: CampaignConfig = config.section("campaign")
    run_dir = Path(config.run.dir)
    if (log_path(run_dir)).exists():
        raise FileExistsError(f"{run_dir} already holds a run's log; pass --run-dir NEW_DIR (nothing was touched)")
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    code = code_version()  # now: a commit landing while the run goes must not be credited with it
    timings: dict[str, float] = {}

    with console.status("[bold]1/5 task corpus[/]"):
        tasks = build_task_sets(config.section("tasks"))
    console.log(f"corpus: SFT on {len(tasks.sft)} tasks, RL on {len(tasks.rl)}, {len(tasks.validation)} validation "
                f"and {len(tasks.eval)} eval tasks")
    if campaign.warm_start_from is not None:
        check_warm_start_tasks(Path(campaign.warm_start_from), tasks)
        if config.section("eval").sft_passes == "warm_start":
            check_warm_start_passes(Path(campaign.warm_start_from), config)
        tokenizer, policy, sft = reuse_warm_start(Path(campaign.warm_start_from), run_dir)
        config = _with_vocab(config, tokenizer.vocab_size)
        if policy.config != config.section("model"):
            raise ValueError(f"[campaign] warm_start_from: the policy in {campaign.warm_start_from} has model "
                             f"{policy.config.model_dump()}, the config asks for {config.section('model').model_dump()}; "
                             "make [model] match it")
        console.log(f"warm start reused from {campaign.warm_start_from} (tokenizer and SFT policy version 0)")
    else:
        with console.status("[bold]2/5 tokenizer[/]"):
            tokenizer = train_run_tokenizer(run_dir, tasks.sft, campaign.tokenizer_vocab)
        console.log(f"tokenizer: {tokenizer.vocab_size} ids -> {tokenizer_path(run_dir)}")
        config = _with_vocab(config, tokenizer.vocab_size)
        timings["prepare_s"] = time.monotonic() - started
        sft_start = time.monotonic()
        policy, sft = sft_with_progress(config, tasks, tokenizer, campaign, console)
        timings["sft_s"] = time.monotonic() - sft_start
        console.log(f"oracle pool: {sft['distinct_examples']} executed oracle chats in {sft['oracle_pool_seconds']:.0f} s; "
                    f"SFT: {sft['steps']} steps ({sft['epochs']:.1f} epochs), loss {sft['final_loss']:.3f}, "
                    f"{sft['tokens_per_s']:.0f} tok/s")
    published = publish_initial_policy(run_dir, policy)
    log = EventLog.open(log_path(run_dir), create=True)
    model = config.section("model")
    with log.writer("campaign", routing_shape=(model.num_layers, model.top_k), num_experts=model.num_experts) as w:
        w.append(published)
        w.commit()
    del policy

    run_config = _with_policy(config, published.location)
    rl_start = time.monotonic()
    trio.run(run_actors, run_config, campaign, console)
    timings["actors_s"] = time.monotonic() - rl_start
    timings["total_s"] = time.monotonic() - started
    return summarise(run_dir, run_config, sft=sft, timings=timings, console=console, write_report=write_report,
                     code=code)


def summarise(run_dir: Path, config, *, sft: dict, timings: dict, console, write_report=None,
              code: dict[str, Any] | None = None) -> dict[str, Any]:
    """Phase 5: summary.json and the plots, both from the log alone."""
    from storage import EventLog

    from .skill_report import EvalPasses, skill_report

    log = EventLog.open(log_path(run_dir))
    sft_log = sft_passes_log(config)
    passes = EvalPasses.read(log, sft_log)
    evals = passes.results
    counts = log.counts()
    roles = sorted({spec.role for spec in config.actors})
    report: dict[str, Any] = {}
    try:
        report = write_report(run_dir) if write_report is not None else {}
    except Exception as exc:  # plots must never cost the run its summary
        console.log(f"[yellow]plots failed: {exc!r}")
    ppo_cfg, staleness = config.section("ppo"), config.section("staleness")
    recipe = {"advantage_estimator": ppo_cfg.advantage_estimator, "group_size": staleness.group_size,
              "actor_params": list(ppo_cfg.actor_params), "reward": f"P / {ppo_cfg.reward_scale}"}
    skill = skill_report(passes, run_temperature=config.section("sampler").temperature, recipe=recipe)
    skill["kl_rl_sft"] = report.get("kl_rl_sft") if isinstance(report, dict) else None
    summary = write_summary(run_dir, eval_before=evals.get("before"), eval_after=evals.get("after"), actors=roles,
                            counts=counts, extra={"sft": sft, "timings_s": {k: round(v, 1) for k, v in timings.items()},
                                                  "report": report, "eval_change": eval_change(log, sft_log, passes), "code": code,
                                                  "sft_passes_from": config.section("campaign").warm_start_from
                                                  if sft_log is not None else None, **skill})
    before, after, change = summary["eval_before"], summary["eval_after"], summary["eval_change"]
    if before and after:
        console.log(f"[bold]eval resolved: {before['resolved_rate']:.1%} -> {after['resolved_rate']:.1%} "
                    f"(n={after['n']}); mean reward {before['mean_reward']:.3f} -> {after['mean_reward']:.3f}")
    if change:
        low, high = change["reward_delta_ci95"]
        console.log(f"paired over {change['tasks']} eval tasks: {change['gained']} newly resolved, {change['lost']} "
                    f"lost (exact McNemar p = {change['mcnemar_p']:.3g}); reward change {change['reward_delta']:+.3f} "
                    f"(95 % CI {low:+.3f} .. {high:+.3f})")
    vs_best = summary.get("eval_change_vs_sft_best")
    if vs_best and summary.get("eval_sft_best") and summary.get("eval_rl_best"):
        s, r = summary["eval_sft_best"], summary["eval_rl_best"]
        low, high = vs_best["reward_delta_ci95"]
        console.log(f"[bold]RL at its best T = {r['temperature']:g} vs SFT at its best T = {s['temperature']:g}: "
                    f"{s['resolved_rate']:.1%} -> {r['resolved_rate']:.1%}; {vs_best['gained']} gained, "
                    f"{vs_best['lost']} lost (exact McNemar p = {vs_best['mcnemar_p']:.3g}); reward change "
                    f"{vs_best['reward_delta']:+.3f} (95 % CI {low:+.3f} .. {high:+.3f})")
    console.log(f"summary: {run_dir / 'summary.json'}")
    return summary
