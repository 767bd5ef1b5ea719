"""`t1-actor eval`: any policy on a task set (own, Terminal-Bench, Harbor): resolved rate with its CI, per
category and difficulty, pass@k, failure classes kept apart, resumable, pairable.

    t1-actor eval --tasks DIR_OR_LIST [--tasks ...] --policy POLICY [--attempts K] [--temperature T]
                  [--seed S] [--concurrency N] [--filter KEY=VALUE ...] [--out RUN] [--json]
    t1-actor eval --compare RUN_A RUN_B [--json]

POLICY: ``oracle`` (the task's solution: checks the harness; its failures are the harness's), ``noop``
(nothing: what passes by itself), and the model policies, each through the campaign's agent loop
(``_models``): ``run:RUN[@VERSION]`` (a t1 run's policy, newest version by default), ``hf:DIR`` (a Hugging
Face Qwen3-MoE / Qwen3.5-MoE checkpoint with its tokenizer and chat template), ``sglang:URL`` (what a running
SGLang server serves, with ``--tokenizer``).

RUN gets the eval's own event log (``RUN/log``: every trial, turn, exec, ending and verification; ``t1-replay
show RUN --trial ID`` reads it), ``RUN/eval.json`` (the summary) and ``RUN/eval.md`` (the table). Running again
with the same RUN skips the (task, attempt) pairs already finished; a different policy, task set, attempts,
temperature or seed for the same RUN is refused, nothing touched. With ``--seed`` equal, two evals of the
same tasks draw the same uniforms per (task, turn, attempt): ``--compare`` pairs them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import trio

from storage import EventLog
from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig
from t1_actors.backends.sampler_backend import BackendUnavailable
from t1_actors.policy.sampling import SamplingParams
from t1_actors.policy.tokenizer import load_tokenizer, special_token_ids
from t1_actors.rollout.trials import TrialRunner
from t1_actors.runtime.config import ConfigError
from t1_actors.task_eval._models import is_model_policy, model_source
from t1_actors.task_eval._progress import EvalProgress
from t1_actors.task_eval._runner import EvalPorts, ModelPolicy, NoopPolicy, OraclePolicy, play_attempt
from t1_actors.task_eval._summary import attempt_rows, compare, markdown, summarise
from t1_actors.tasks.errors import TaskFormatError
from t1_actors.tasks.formats import load_tasks
from t1_actors.verify.engine import Verifier, VerifierConfig

__all__ = ["main", "attempt_rows", "summarise", "compare", "markdown"]

POLICIES = "oracle | noop | run:RUN[@VERSION] | hf:DIR | sglang:URL"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1-actor eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", action="append", default=[], metavar="DIR_OR_LIST",
                        help="a task directory, a directory of them, or a file listing task directories (repeatable)")
    parser.add_argument("--policy", default=None, help=POLICIES)
    parser.add_argument("--tokenizer", default=None,
                        help="hf:/sglang: the tokenizer (HF directory, tokenizer.json, or a t1 run directory)")
    parser.add_argument("--model-config", default=None,
                        help="sglang: a directory with the served model's config.json (default: the server's)")
    parser.add_argument("--max-turns", type=int, default=None, help="model policies (default: the run's, else 4)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="per turn (default: the run's, else 64)")
    parser.add_argument("--max-context", type=int, default=None, help="tokens (default: the run's, else 768)")
    parser.add_argument("--context-strategy", choices=["end", "drop_old_outputs", "window"], default=None,
                        help="when the next prompt would not fit --max-context (default: the run's, else end)")
    parser.add_argument("--keep-last-turns", type=int, default=None,
                        help="drop_old_outputs keeps this many last turns' outputs (default: the run's, else 2)")
    parser.add_argument("--tool-output-chars", type=int, default=None,
                        help="a longer tool output is cut (default: the run's, else 240)")
    parser.add_argument("--attempts", type=int, default=1, help="attempts per task (pass@k for k <= this)")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the run's)")
    parser.add_argument("--seed", type=int, default=0, help="0: the campaign's eval draws; another value, another stream")
    parser.add_argument("--concurrency", type=int, default=4, help="attempts played at once")
    parser.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                        help="keep tasks whose metadata KEY equals VALUE (category=..., difficulty=...); repeatable")
    parser.add_argument("--out", default=None, help="the eval's run directory (default runs/eval-TIMESTAMP)")
    parser.add_argument("--compare", nargs=2, default=None, metavar=("RUN_A", "RUN_B"),
                        help="pair two finished evals by (task, attempt) instead of running one")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (run: and hf: policies)")
    parser.add_argument("--sandbox-dir", default=None, help="local sandbox base directory")
    parser.add_argument("--verifier-dir", default=None, help="verifier base directory")
    parser.add_argument("--json", action="store_true", help="last line: the summary as one JSON object")
    return parser


def load_task_set(sources: list[str], filters: list[str]) -> list:
    """Tasks from directories or list files, filtered on metadata; ids unique across sources."""
    wanted = {}
    for item in filters:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--filter {item!r}: write KEY=VALUE, e.g. category=debugging")
        wanted[key] = value
    tasks: dict[str, Any] = {}
    for source in sources:
        path = Path(source)
        roots = [path] if path.is_dir() else None
        if roots is None:
            if not path.is_file():
                raise ConfigError(f"--tasks {source}: no such directory or list file")
            roots = [Path(line.strip()) if Path(line.strip()).is_absolute() else path.parent / line.strip()
                     for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        for root in roots:
            try:
                found = load_tasks(root)
            except TaskFormatError as exc:
                raise ConfigError(f"--tasks {source}: {exc}") from None
            for task in found:
                if task.id in tasks:
                    raise ConfigError(f"--tasks: task id {task.id!r} appears twice ({root}); rename one")
                tasks[task.id] = task
    kept = [t for t in tasks.values() if all(str(t.metadata.get(k, "")) == v for k, v in wanted.items())]
    if not kept:
        raise ConfigError(f"--tasks {' '.join(sources)}: no task" + (f" matches {filters}" if filters else ""))
    return sorted(kept, key=lambda t: t.id)


def _header(args, tasks: list, source) -> dict[str, Any]:
    header = {"policy": args.policy, "attempts": args.attempts, "temperature": args.temperature, "seed": args.seed,
              "task_ids": [t.id for t in tasks], "filters": sorted(args.filter)}
    if source is not None:
        limits = source.campaign.rollout_limits()
        header["limits"] = {"max_turns": limits.max_turns, "max_new_tokens": limits.max_new_tokens,
                            "max_context": limits.max_context, "tool_output_chars": limits.tool_output_chars,
                            "context_strategy": limits.context_strategy, "keep_last_turns": limits.keep_last_turns}
    return header


def _check_resume(out: Path, header: dict[str, Any]) -> None:
    path = out / "eval-config.json"
    if not path.is_file():
        return
    previous = json.loads(path.read_text())
    if isinstance(previous.get("limits"), dict) and isinstance(header.get("limits"), dict):
        # an eval written before a limit was recorded resumes under that limit's current value
        header = {**header, "limits": {k: v for k, v in header["limits"].items() if k in previous["limits"]}}
    for key in ("policy", "attempts", "temperature", "seed", "task_ids", "limits"):
        if key in previous and previous.get(key) != header.get(key):
            shown = "the task set" if key == "task_ids" else f"{key} = {previous.get(key)!r}"
            raise ConfigError(f"--out {out}: it holds an eval with {shown}, this one differs; pass a new --out "
                              "(nothing was touched)")


async def _run(args, tasks: list, out: Path, header: dict, show, stream, source) -> dict[str, Any]:
    log = EventLog.open(out / "log", create=not (out / "log").exists())
    done = attempt_rows(log)
    todo = [(t, a) for t in tasks for a in range(args.attempts) if (t.id, a) not in done]
    if done:
        show(f"resuming {out}: {len(done)} of {len(tasks) * args.attempts} attempts already finished, skipped")
    by_id = {t.id: t for t in tasks}
    sandbox_config = LocalSandboxConfig(**({"base_dir": args.sandbox_dir} if args.sandbox_dir else {}))
    verifier = Verifier(VerifierConfig(**({"base_dir": args.verifier_dir} if args.verifier_dir else {})))
    backend = LocalSandboxBackend(sandbox_config)
    # a model policy's turns carry routing: the writer needs the policy's shape
    routing = source.routing_shape() if source is not None else {}
    try:
        with log.writer(f"eval-{secrets.token_hex(4)}", **routing) as writer:
            ports = EvalPorts(tasks=by_id, sandbox_backend=backend, verifier=verifier, writer=writer, seed=args.seed)
            async with contextlib.AsyncExitStack() as stack:
                if args.policy == "oracle":
                    policy = OraclePolicy()
                elif args.policy == "noop":
                    policy = NoopPolicy()
                else:
                    sampler = await stack.enter_async_context(source.open_sampler(args.threads))
                    policy = _model_policy(args.policy, source, ports, sampler, by_id)
                limiter = trio.CapacityLimiter(max(1, args.concurrency))

                with EvalProgress(stream, len(tasks) * args.attempts, len(done)) as progress:
                    async def one(task, attempt: int) -> None:
                        async with limiter:
                            outcome = await play_attempt(ports, policy, task, attempt, "eval")
                        progress.finished(task.id, attempt, outcome)

                    async with trio.open_nursery() as nursery:
                        for task, attempt in todo:
                            nursery.start_soon(one, task, attempt)
    finally:
        verifier.close()
        backend.close()
    rows = attempt_rows(EventLog.open(out / "log"))
    summary = summarise(rows, by_id, header={k: v for k, v in header.items() if k != "task_ids"})
    summary["unhonoured"] = {r["task"]: r["unhonoured"] for r in summary["tasks"] if r.get("unhonoured")}
    return summary


def _model_policy(name: str, source, ports, sampler, by_id):
    """The campaign's agent loop on ``sampler``, with the source's tokenizer, limits and temperature."""
    tokenizer = load_tokenizer(source.tokenizer)
    ports.sampler, ports.version = sampler, source.version
    ports.params = SamplingParams(max_new_tokens=source.campaign.max_new_tokens, temperature=source.temperature,
                                  stop_ids=(special_token_ids(tokenizer)["<|im_end|>"],))
    runner = TrialRunner(ports, by_id, tokenizer, source.campaign.rollout_limits(), run_tag="eval")
    return ModelPolicy(name=name, temperature=source.temperature, runner=runner)


def _compare(args, show) -> int:
    logs = []
    for run in args.compare:
        if not (Path(run) / "log").exists():
            raise ConfigError(f"--compare {run}: no eval log there ({Path(run) / 'log'})")
        logs.append(attempt_rows(EventLog.open(Path(run) / "log")))
    try:
        change = compare(*logs)
    except ValueError as exc:
        raise ConfigError(f"--compare: {exc}") from None
    low, high = change["reward_delta_ci95"]
    show(f"| | {args.compare[0]} | {args.compare[1]} |\n|---|---|---|\n"
         f"| resolved (paired attempts: {change['tasks']}) | {change['resolved_before']} | {change['resolved_after']} |\n\n"
         f"gained {change['gained']}, lost {change['lost']} (exact McNemar p = {change['mcnemar_p']:.3g}); "
         f"reward change {change['reward_delta']:+.3f} (95 % CI {low:+.3f} .. {high:+.3f})")
    if args.json:
        print(json.dumps(change))
    return 0


def _server_lost(exc: BaseException) -> BackendUnavailable | None:
    """The ``BackendUnavailable`` that ended the eval (alone or inside trio's exception groups), else None."""
    if isinstance(exc, BackendUnavailable):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        if (found := _server_lost(inner)) is not None:
            return found
    return None


def _resume_command(argv: list[str] | None, out: Path) -> str:
    """This eval's command line with its ``--out`` named: run again, it skips the finished attempts."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "eval":
        args = args[1:]
    if "--out" not in args:
        args += ["--out", str(out)]
    return "t1-actor eval " + shlex.join(args)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    stream = sys.stderr if args.json else sys.stdout  # the human-readable lines; stdout's last line is the JSON

    def show(line: str) -> None:
        print(line, file=stream)

    try:
        if args.compare:
            return _compare(args, show)
        if not args.tasks or not args.policy:
            raise ConfigError(f"give --tasks DIR_OR_LIST and --policy ({POLICIES}), or --compare RUN_A RUN_B")
        if args.policy not in ("oracle", "noop") and not is_model_policy(args.policy):
            raise ConfigError(f"--policy {args.policy!r}: use {POLICIES}")
        if args.attempts < 1 or args.concurrency < 1:
            raise ConfigError("--attempts and --concurrency must be >= 1")
        source = None
        if is_model_policy(args.policy):  # read once, before anything is written: weights, tokenizer, limits
            source = model_source(args.policy, temperature=args.temperature, tokenizer=args.tokenizer,
                                  model_config=args.model_config,
                                  limits={"max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens,
                                          "max_context": args.max_context, "context_strategy": args.context_strategy,
                                          "keep_last_turns": args.keep_last_turns,
                                          "tool_output_chars": args.tool_output_chars})
            args.temperature = source.temperature
        elif args.tokenizer or args.model_config:
            raise ConfigError(f"--tokenizer / --model-config: only for model policies, not --policy {args.policy}")
        tasks = load_task_set(args.tasks, args.filter)
        out = Path(args.out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
        header = _header(args, tasks, source)
        _check_resume(out, header)
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval-config.json").write_text(json.dumps(header, indent=2))
        try:
            summary = trio.run(_run, args, tasks, out, header, show, stream, source)
        except BaseException as exc:
            if (lost := _server_lost(exc)) is None:
                raise
            done = len(attempt_rows(EventLog.open(out / "log")))
            print(f"t1-actor eval: the policy's server stopped serving ({lost}); {done} of "
                  f"{len(tasks) * args.attempts} attempts finished and are kept in {out}; once it serves again, "
                  f"resume with: {_resume_command(argv, out)}", file=sys.stderr)
            return 3
    except ConfigError as exc:
        print(f"t1-actor eval: {exc}", file=sys.stderr)
        return 2
    (out / "eval.json").write_text(json.dumps(summary, indent=2))
    table = markdown(summary)
    (out / "eval.md").write_text(table)
    show(table + f"\nlog, summary and table: {out}/(log, eval.json, eval.md)")
    if args.json:
        print(json.dumps(summary))
    return 0
