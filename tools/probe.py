"""`t1-probe`: synchronous on-policy RL from a run's checkpoint, in one process: the campaign's twin.

    t1-probe RUN [--ckpt weights/v00000] [--steps N] [--tasks N] [--group N] [--eval-tasks 320]
                 [--eval-every N] [--set SECTION.KEY=VALUE ...] [--seed S] [--json]

What the campaign's PPO does, apart from asynchrony, transport and staleness: the critic's warm-up on the
campaign's warm-up tasks (``[campaign] warmup_trials``, GAE only), then each step samples ``--tasks`` RL tasks
``--group`` times each with the current weights, in the campaign's RL order for ``--seed``, verifies them,
takes one PPO step with the run's ``[ppo]`` settings (``--set ppo.actor_lr=1e-3`` changes one) and loads the
new weights into the sampler. Defaults come from the run: ``[campaign] rl_steps`` steps of ``[staleness]
batch_size`` trials (``batch_size / group_size`` tasks x ``group_size``), ``[campaign] seed``: the same number
of updates on the same tasks as the run's asynchronous campaign.

The SFT and the final policy go through the campaign's eval protocol (``t1_actors.eval.protocol``, without
pass@k): the best temperature on the validation split, then the eval split there, every pass seeded by
``trials.eval_seed`` (common random numbers), so ``vs_sft_best`` (gained / lost, McNemar p, the resolved
change with its 95 % CI) is the figure the campaign's ``eval_change_vs_sft_best`` is compared with
(bench/sync_async.py). ``--eval-every N`` adds passes at the SFT's best temperature.
``logged_sft_agreement``: on how many tasks the probe's SFT pass matches the run's logged one (same seeds:
all of them, unless batching changes a draw).

On-policy check: sampler and learner hold the same fp32 weights, so the learner's first forward of each
step (before any update) must reproduce the sampler's logprobs: a mean |logprob gap| above 1e-5 is
flagged, exit 1 (something between sampling and training disagrees: TITO contexts, routing replay,
temperature). Unlike approx KL, the gap is taken before the step's first update, so it holds for any
``epochs`` / ``minibatches``. This probe found the TITO
repair flaw, the memorised-task effect and the norm-gain recipe (docs/history.md, "Earlier rounds").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import trio
from rich.table import Table

from storage import EventLog
from t1_actors import tito
from t1_actors.backends.local_sandbox import LocalSandboxBackend
from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.backends.sandbox_backend import SandboxConfig
from t1_actors.backends.torch_learner import TorchCritic, TorchLearner, collate
from t1_actors.backends.torch_sampler import TorchSampler
from t1_actors.critic import CriticConfig
from t1_actors.eval.protocol import EvalConfig, evaluate_policy
from t1_actors.eval.skills import EvalPasses, best_label
from t1_actors.job import config as job_config
from t1_actors.layout import has_log, log_location, tokenizer_path
from t1_actors.policy import MoEPolicy
from t1_actors.policy.sampling import SamplingParams
from t1_actors.policy.tokenizer import load_tokenizer, special_token_ids
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.rollout.eval_pass import run_eval
from t1_actors.rollout.inprocess import InProcessPorts
from t1_actors.rollout.play import play_all
from t1_actors.rollout.trials import TrialRunner
from t1_actors.runtime.config import ConfigError
from t1_actors.schedule import CampaignConfig, rl_task_order, warmup_task_ids
from t1_actors.stats import Outcome, eval_reward, first_attempts, paired_change
from t1_actors.tasks import build_task_sets
from t1_actors.tasks.config import TasksConfig
from t1_actors.train.ppo import PPOConfig
from t1_actors.verify.engine import Verifier, VerifierConfig
from tools._output import console, fail, print_json

ON_POLICY_GAP = 1e-5  # mean |logprob gap| of the first forward; fp32 on both sides gives ~1e-7


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1-probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run directory (config.resolved.json, tokenizer.json, weights/)")
    parser.add_argument("--ckpt", default="weights/v00000", help="policy directory inside RUN (default: the SFT policy)")
    parser.add_argument("--steps", type=int, default=None, help="PPO steps (default: the run's [campaign] rl_steps)")
    parser.add_argument("--tasks", type=int, default=None,
                        help="RL tasks per step (default: [staleness] batch_size / group_size)")
    parser.add_argument("--group", type=int, default=None,
                        help="attempts per task (default: [staleness] group_size; rloo's group)")
    parser.add_argument("--eval-tasks", type=int, default=320, help="first N tasks of the eval split (0: no eval)")
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override the run's config, VALUE as JSON (e.g. ppo.actor_lr=1e-3, "
                             "'ppo.actor_params=[\"*\"]'); repeatable")
    parser.add_argument("--seed", type=int, default=None,
                        help="the campaign seed whose warm-up and RL task order to follow (default: the run's)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json", action="store_true")
    return parser


def probe_config(run: Path, overrides: list[str]):
    """The run's resolved config with ``SECTION.KEY=VALUE`` overrides, validated like any config."""
    path = run / "config.resolved.json"
    if not path.is_file():
        raise ConfigError(f"{run}: no config.resolved.json; point t1-probe at a run directory t1-actor launch wrote")
    data = job_config.load_config(path).to_jsonable()
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
    return job_config.parse_config(data, f"{path} with --set")  # looked up at call time: a test swaps the rule set


class Probe:
    """The engines of one probe: a sampler and a learner on copies of one checkpoint, a sandbox, a verifier."""

    def __init__(self, run: Path, config, ckpt: str, threads: int):
        torch.set_num_threads(threads)
        self.config, self.campaign = config, config.section(CampaignConfig)
        self.ppo = config.section(PPOConfig)
        self.tasks = build_task_sets(config.section(TasksConfig))
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
        self.sandbox = LocalSandboxBackend(config.section(SandboxConfig).local)
        self.verifier = Verifier(config.section(VerifierConfig))

    def close(self) -> None:
        self.verifier.close()
        self.sandbox.close()

    def runner(self, sampler):
        params = SamplingParams(max_new_tokens=self.campaign.max_new_tokens,
                                temperature=self.config.section(SamplerConfig).temperature, stop_ids=(self.stop_id,))
        ports = InProcessPorts(sampler, self.tasks.by_id, params, self.sandbox, self.verifier)
        return TrialRunner(ports, self.tasks.by_id, self.tokenizer, self.campaign.rollout_limits(),
                           run_tag="probe", tito_repairs=self.campaign.tito_repairs)

    async def evaluate(self, runner, task_ids: list[str]) -> dict:
        """Each task once, its turns seeded by ``eval_seed``: task id -> Outcome."""
        outcomes = await play_all(runner, task_ids, "eval", assemble=False,
                                  concurrency=self.campaign.eval_concurrency)
        return {o.task_id: Outcome(o.resolved, eval_reward(o.result)) for o in outcomes
                if o.result is not None and o.result.infra_error is None}

    async def warm_up_critic(self, runner, task_ids: list[str]) -> dict:
        """The campaign's critic warm-up: the SFT policy plays ``task_ids`` once each, the critic fits their
        returns in batches of ``[critic] warmup_batch`` (as the critic actor does) before any PPO step."""
        outcomes = await play_all(runner, task_ids, "warmup", assemble=True,
                                  concurrency=self.campaign.eval_concurrency)
        trajectories = [tito.to_event(c, trial_id=o.trial_id, task_id=o.task_id) for o in outcomes for c in o.chunks]
        size, model = self.config.section(CriticConfig).warmup_batch, self.learner.policy.config
        batches = [collate(trajectories[i:i + size], None, num_layers=model.num_layers, top_k=model.top_k,
                           require_routing=False) for i in range(0, len(trajectories), size)]
        report = self.learner.critic.warmup(batches)
        return {"trajectories": report.trajectories, "ev_before": report.explained_variance_before,
                "ev_after": report.explained_variance_after}

    async def step(self, runner, task_ids: list[str], group: int, weights_dir: Path, sampler) -> dict:
        """Sample, verify, one PPO step, reload the sampler: the step's figures."""
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


class _Events:
    """The in-process ports' events read like a log (``EvalPasses.read``)."""

    def __init__(self, events: list):
        self._events = events

    def events(self, kinds):
        return ((i, e) for i, e in enumerate(self._events) if e.kind in kinds)


def logged_sft_best(run: Path):
    """The run's own SFT pass at its best temperature (label -> task -> Outcome), when its log has one."""
    if not has_log(run):
        return None, None

    passes = EvalPasses.read(EventLog.open(log_location(run)))
    name = best_label(passes.results, "sft")
    return (name, first_attempts(passes.attempts[name])) if name in passes.attempts else (None, None)


async def run_probe(args, run: Path, config, show) -> dict:
    probe = Probe(run, config, args.ckpt, args.threads)
    campaign = config.section(CampaignConfig)
    rl_ids = [t.id for t in probe.tasks.rl]
    order = rl_task_order(rl_ids, args.seed)  # the campaign's task orders for this seed
    warm_ids = warmup_task_ids(rl_ids, campaign.warmup_trials, args.seed)
    eval_ids = [t.id for t in probe.tasks.eval[: args.eval_tasks]]
    validation_ids = [t.id for t in probe.tasks.validation] if eval_ids else []
    run_temperature = config.section(SamplerConfig).temperature
    report: dict = {"run": str(run), "ckpt": args.ckpt, "actor_params": list(probe.ppo.actor_params),
                    "trained_tensors": len(probe.learner.trained_params), "steps": [], "evals": [],
                    "tasks_per_step": args.tasks, "group": args.group, "seed": args.seed}
    try:
        async with TorchSampler.open(probe.sampler_policy, config=SamplerConfig(max_batch=64)) as sampler:
            runner = probe.runner(sampler)
            events = runner.ports.events
            done: dict = {}

            async def protocol(policy: str) -> float:
                return await evaluate_policy(runner, policy, validation_ids=validation_ids, eval_ids=eval_ids,
                                             pass_k_ids=[], config=config.section(EvalConfig),
                                             run_temperature=run_temperature,
                                             concurrency=campaign.eval_concurrency, done=done,
                                             on_pass=lambda name: _shown(show, f"eval {name}"))

            def attempts_of(name: str) -> dict:
                return first_attempts(EvalPasses.read(_Events(events)).attempts[name])

            sft_best = None
            if eval_ids:
                report["sft_best_T"] = await protocol("sft")
                sft_best = attempts_of(best_label(done, "sft"))
                show(f"SFT at its best T = {report['sft_best_T']:g}: {sum(o.resolved for o in sft_best.values())}/"
                     f"{len(sft_best)} resolved")
                name, logged = logged_sft_best(run)
                if logged is not None and done.get(name) is not None:
                    common = sorted(set(logged) & set(sft_best))
                    report["logged_sft_agreement"] = {
                        "label": name, "tasks": len(common),
                        "same_outcome": sum(logged[t].resolved == sft_best[t].resolved for t in common)}

            async def evaluate(step: int) -> None:
                label = f"probe_step{step}"
                await run_eval_at(runner, eval_ids, label, report["sft_best_T"], campaign.eval_concurrency)
                change = paired_change(sft_best, attempts_of(label)).as_dict()
                report["evals"].append({"step": step, "temperature": report["sft_best_T"], **change})
                show(f"eval after {step} steps at T = {report['sft_best_T']:g}: {change['resolved_after']}/"
                     f"{change['tasks']} resolved (SFT {change['resolved_before']}); gained {change['gained']}, "
                     f"lost {change['lost']}, McNemar p = {change['mcnemar_p']:.3g}")

            if probe.learner.critic is not None and warm_ids:
                report["critic_warmup"] = await probe.warm_up_critic(runner, warm_ids)
                show(f"critic warm-up: EV {report['critic_warmup']['ev_before']:.2f} -> "
                     f"{report['critic_warmup']['ev_after']:.2f} on {report['critic_warmup']['trajectories']}")
            with tempfile.TemporaryDirectory(prefix="t1-probe-") as weights_dir:
                for step in range(args.steps):
                    chosen = [order[(step * args.tasks + i) % len(order)] for i in range(args.tasks)]
                    figures = await probe.step(runner, chosen, args.group, Path(weights_dir), sampler)
                    report["steps"].append({"step": step, **figures})
                    show(f"step {step:3d}  reward {figures['reward']:.3f}  resolved {figures['resolved']:.3f}  "
                         f"entropy {figures['entropy']:.4f}  logprob gap {figures['logprob_gap']:.1e}"
                         f"{'' if figures['on_policy'] else '  OFF-POLICY'}  {figures['sample_s']}+{figures['learn_s']} s")
                    if eval_ids and args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
                        await evaluate(step + 1)
            if eval_ids:  # the RL policy under the same protocol: its best T on validation, the eval split there
                report["rl_best_T"] = await protocol("rl")
                change = paired_change(sft_best, attempts_of(best_label(done, "rl"))).as_dict()
                report["vs_sft_best"] = {"step": args.steps, "sft_T": report["sft_best_T"],
                                         "rl_T": report["rl_best_T"], **change}
                report["evals"].append({"step": args.steps, "temperature": report["rl_best_T"], **change})
                show(f"RL at its best T = {report['rl_best_T']:g} vs SFT at its best T = {report['sft_best_T']:g}: "
                     f"{change['resolved_before']} -> {change['resolved_after']}/{change['tasks']}; gained "
                     f"{change['gained']}, lost {change['lost']}, McNemar p = {change['mcnemar_p']:.3g}")
    finally:
        probe.close()
    report["off_policy_steps"] = [s["step"] for s in report["steps"] if not s["on_policy"]]
    report["steps_per_minute"] = round(60 * len(report["steps"]) / max(
        sum(s["sample_s"] + s["learn_s"] for s in report["steps"]), 1e-9), 2)
    return report


async def _shown(show, line: str) -> None:
    show(line)


async def run_eval_at(runner, task_ids: list[str], label: str, temperature: float, concurrency: int) -> None:
    await run_eval(runner, task_ids, label=label, concurrency=concurrency, temperature=temperature)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    run = Path(args.run)
    out = console()
    show = (lambda line: None) if args.json else out.print
    try:
        config = probe_config(run, args.set)
        campaign, staleness = config.section(CampaignConfig), config.section(StalenessConfig)
        args.group = staleness.group_size if args.group is None else args.group
        args.tasks = max(1, staleness.batch_size // args.group) if args.tasks is None else args.tasks
        args.steps = (campaign.rl_steps or 25) if args.steps is None else args.steps
        args.seed = campaign.seed if args.seed is None else args.seed
        if args.steps < 1 or args.tasks < 1 or args.group < 1 or args.eval_tasks < 0:
            return fail("--steps, --tasks and --group must be >= 1 and --eval-tasks >= 0")
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
