"""`t1-probe`: synchronous on-policy RL from a run's checkpoint, in one process.

    t1-probe RUN [--ckpt weights/v00000] [--steps 25] [--tasks 16] [--group 4] [--eval-tasks 320]
                 [--eval-every N] [--set SECTION.KEY=VALUE ...] [--seed 0] [--json]

What one PPO update does, apart from asynchrony, transport and staleness: each step samples `--tasks`
fresh RL tasks (the run's `[tasks] rl_size` carve-out, else its train split) `--group` times each with the
current weights, verifies them, takes one PPO step with the run's `[ppo]` settings (`--set ppo.actor_lr=1e-3`
changes one) and loads the new weights into the sampler. The eval split is played before, after and every
`--eval-every` steps with common random numbers (`trials.eval_seed`), so the paired change (gained / lost,
exact McNemar p) counts flips caused by the updates, not by the draws.

On-policy check: sampler and learner hold the same fp32 weights, so the learner's first forward of each
step (before any update) must reproduce the sampler's logprobs: a mean |logprob gap| above 1e-5 is
flagged, exit 1 (something between sampling and training disagrees: TITO contexts, routing replay,
temperature). Unlike approx KL, the gap is taken before the step's first update, so it holds for any
``epochs`` / ``minibatches``. This probe found the TITO
repair flaw, the memorised-task effect and the norm-gain recipe (README, "Measured").
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table

from tools._output import console, fail, print_json

ON_POLICY_GAP = 1e-5  # mean |logprob gap| of the first forward; fp32 on both sides gives ~1e-7


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1-probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run directory (config.resolved.json, tokenizer.json, weights/)")
    parser.add_argument("--ckpt", default="weights/v00000", help="policy directory inside RUN (default: the SFT policy)")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--tasks", type=int, default=16, help="RL tasks per step")
    parser.add_argument("--group", type=int, default=4, help="attempts per task (the rloo group)")
    parser.add_argument("--eval-tasks", type=int, default=320, help="first N tasks of the eval split (0: no eval)")
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override the run's config, VALUE as JSON (e.g. ppo.actor_lr=1e-3, "
                             "'ppo.actor_params=[\"*\"]'); repeatable")
    parser.add_argument("--seed", type=int, default=0, help="order of the RL tasks")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json", action="store_true")
    return parser


def probe_config(run: Path, overrides: list[str]):
    """The run's resolved config with ``SECTION.KEY=VALUE`` overrides, validated like any config."""
    from t1_actors.config import ConfigError, load_config, parse_config

    path = run / "config.resolved.json"
    if not path.is_file():
        raise ConfigError(f"{run}: no config.resolved.json; point t1-probe at a run directory t1-actor launch wrote")
    data = load_config(path).to_jsonable()
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, field = key.partition(".")
        if not (sep and dot and field):
            raise ConfigError(f"--set {item!r}: write SECTION.KEY=VALUE, e.g. ppo.actor_lr=1e-3")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # a bare string, e.g. ppo.advantage_estimator=gae
        if not isinstance(data.get(section), dict):
            raise ConfigError(f"--set {item!r}: the config has no [{section}] section")
        data[section][field] = value
    return parse_config(data, f"{path} with --set")


class Probe:
    """The engines of one probe: a sampler and a learner on copies of one checkpoint, a sandbox, a verifier."""

    def __init__(self, run: Path, config, ckpt: str, threads: int):
        import torch

        from t1_actors.backends.local_sandbox import LocalSandboxBackend
        from t1_actors.backends.torch_learner import TorchCritic, TorchLearner
        from t1_actors.campaign import tokenizer_path
        from t1_actors.policy import MoEPolicy
        from t1_actors.policy.tokenizer import load_tokenizer, special_token_ids
        from t1_actors.tasks import build_task_sets
        from t1_actors.verification import Verifier

        torch.set_num_threads(threads)
        self.config, self.campaign = config, config.section("campaign")
        self.ppo = config.section("ppo")
        self.tasks = build_task_sets(config.section("tasks"))
        self.tokenizer = load_tokenizer(tokenizer_path(run))
        self.stop_id = special_token_ids(self.tokenizer)["<|im_end|>"]
        try:
            self.sampler_policy = MoEPolicy.load(run / ckpt)
            policy = MoEPolicy.load(run / ckpt)
        except OSError as error:
            raise FileNotFoundError(f"{run / ckpt}: cannot load a policy ({error}); --ckpt names a directory "
                                    "inside RUN, e.g. weights/v00000") from None
        critic = TorchCritic.for_policy(policy, self.ppo) if self.ppo.advantage_estimator == "gae" else None
        self.learner = TorchLearner(policy, self.ppo, critic=critic, fidelity_metrics=False)
        self.sandbox = LocalSandboxBackend(config.section("sandbox").local)
        self.verifier = Verifier(config.section("verifier"))

    def close(self) -> None:
        self.verifier.close()
        self.sandbox.close()

    def runner(self, sampler):
        from t1_actors.inprocess import InProcessPorts
        from t1_actors.policy.sampling import SamplingParams
        from t1_actors.trials import TrialRunner

        params = SamplingParams(max_new_tokens=self.campaign.max_new_tokens,
                                temperature=self.config.section("sampler").temperature, stop_ids=(self.stop_id,))
        ports = InProcessPorts(sampler, self.tasks.by_id, params, self.sandbox, self.verifier)
        return TrialRunner(ports, self.tasks.by_id, self.tokenizer, self.campaign.rollout_limits(),
                           run_tag="probe", tito_repairs=self.campaign.tito_repairs)

    async def evaluate(self, runner, task_ids: list[str]) -> dict:
        """Each task once, its turns seeded by ``eval_seed``: task id -> Outcome."""
        from t1_actors.eval_stats import Outcome
        from t1_actors.trials import play_all

        outcomes = await play_all(runner, task_ids, "eval", assemble=False,
                                  concurrency=self.campaign.eval_concurrency)
        return {o.task_id: Outcome(o.resolved, o.result.reward) for o in outcomes
                if o.result is not None and o.result.infra_error is None}

    async def step(self, runner, task_ids: list[str], group: int, weights_dir: Path, sampler) -> dict:
        """Sample, verify, one PPO step, reload the sampler: the step's figures."""
        import numpy as np
        import torch

        from t1_actors import tito
        from t1_actors.backends.torch_learner import collate
        from t1_actors.trials import play_all

        started = time.monotonic()
        outcomes = await play_all(runner, [t for t in task_ids for _ in range(group)], "train", assemble=True,
                                  concurrency=self.campaign.eval_concurrency)
        played = [o for o in outcomes if o.chunks]
        if not played:
            raise RuntimeError("no attempt of this step produced a trajectory (every sandbox or verifier failed?)")
        trajectories = [tito.to_event(chunk, trial_id=o.trial_id, task_id=o.task_id) for o in played for chunk in o.chunks]
        model = self.learner.policy.config
        batch = collate(trajectories, None, num_layers=model.num_layers, top_k=model.top_k, require_routing=True)
        if self.learner.critic is None:  # rloo: A needs no critic values
            batch = batch.with_old_values(torch.zeros(batch.token_ids.shape))
        sampled = time.monotonic()
        result = self.learner.step(batch)
        published = self.learner.publish(weights_dir)
        await sampler.load_weights(published.location, published.version)
        metrics = result.metrics
        return {"reward": float(np.mean([o.result.reward for o in played])),
                "resolved": float(np.mean([o.resolved for o in played])), "trajectories": len(trajectories),
                "entropy": metrics["entropy"], "approx_kl": metrics["approx_kl"], "grad_norm": metrics["grad_norm"],
                "logprob_gap": metrics["logprob_gap_r3"], "on_policy": metrics["logprob_gap_r3"] <= ON_POLICY_GAP,
                "sample_s": round(sampled - started, 2), "learn_s": round(time.monotonic() - sampled, 2)}


async def run_probe(args, run: Path, config, show) -> dict:
    from t1_actors.backends.sampler_backend import SamplerConfig
    from t1_actors.backends.torch_sampler import TorchSampler
    from t1_actors.eval_stats import paired_change

    probe = Probe(run, config, args.ckpt, args.threads)
    pool = list(probe.tasks.rl)
    random.Random(args.seed).shuffle(pool)
    eval_ids = [t.id for t in probe.tasks.eval[: args.eval_tasks]]
    report: dict = {"run": str(run), "ckpt": args.ckpt, "actor_params": list(probe.ppo.actor_params),
                    "trained_tensors": len(probe.learner.trained_params), "steps": [], "evals": []}
    try:
        async with TorchSampler.open(probe.sampler_policy, config=SamplerConfig(max_batch=64)) as sampler:
            runner = probe.runner(sampler)
            before = await probe.evaluate(runner, eval_ids) if eval_ids else None

            async def evaluate(step: int) -> None:
                outcomes = await probe.evaluate(runner, eval_ids)
                change = paired_change(before, outcomes).as_dict()
                report["evals"].append({"step": step, **change})
                show(f"eval after {step} steps: {change['resolved_after']}/{change['tasks']} resolved (before "
                     f"{change['resolved_before']}); gained {change['gained']}, lost {change['lost']}, "
                     f"McNemar p = {change['mcnemar_p']:.3g}")

            if before is not None:
                show(f"eval before: {sum(o.resolved for o in before.values())}/{len(before)} resolved")
            with tempfile.TemporaryDirectory(prefix="t1-probe-") as weights_dir:
                for step in range(args.steps):
                    chosen = [pool[(step * args.tasks + i) % len(pool)].id for i in range(args.tasks)]
                    figures = await probe.step(runner, chosen, args.group, Path(weights_dir), sampler)
                    report["steps"].append({"step": step, **figures})
                    show(f"step {step:3d}  reward {figures['reward']:.3f}  resolved {figures['resolved']:.3f}  "
                         f"entropy {figures['entropy']:.4f}  logprob gap {figures['logprob_gap']:.1e}"
                         f"{'' if figures['on_policy'] else '  OFF-POLICY'}  {figures['sample_s']}+{figures['learn_s']} s")
                    last = step + 1 == args.steps
                    if before is not None and (last or (args.eval_every and (step + 1) % args.eval_every == 0)):
                        await evaluate(step + 1)
    finally:
        probe.close()
    report["off_policy_steps"] = [s["step"] for s in report["steps"] if not s["on_policy"]]
    return report


def main(argv: list[str] | None = None) -> int:
    import trio

    from t1_actors.config import ConfigError

    args = _parser().parse_args(argv)
    if args.steps < 1 or args.tasks < 1 or args.group < 1 or args.eval_tasks < 0:
        return fail("--steps, --tasks and --group must be >= 1 and --eval-tasks >= 0")
    run = Path(args.run)
    out = console()
    show = (lambda line: None) if args.json else out.print
    try:
        config = probe_config(run, args.set)
        report = trio.run(run_probe, args, run, config, show)
    except (ConfigError, FileNotFoundError, ValueError) as error:
        return fail(str(error))
    if args.json:
        print_json(report)
    else:
        table = Table("steps", "mean reward", "mean resolved", "mean entropy", "max logprob gap")
        for start in range(0, len(report["steps"]), 5):
            rows = report["steps"][start:start + 5]
            table.add_row(f"{rows[0]['step']}-{rows[-1]['step']}",
                          f"{sum(r['reward'] for r in rows) / len(rows):.3f}",
                          f"{sum(r['resolved'] for r in rows) / len(rows):.3f}",
                          f"{sum(r['entropy'] for r in rows) / len(rows):.4f}",
                          f"{max(r['logprob_gap'] for r in rows):.1e}")
        out.print(table)
        if report["off_policy_steps"]:
            out.print(f"OFF-POLICY at steps {report['off_policy_steps']}: the learner's logprobs differ from the "
                      "sampler's with identical weights; check with t1-replay drift")
    return 1 if report["off_policy_steps"] else 0


if __name__ == "__main__":
    sys.exit(main())
