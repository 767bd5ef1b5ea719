"""The campaign's RL phase in one process: the same schedule, the same engines, no actors, no log.

What the staleness controller plays (``rollout.trials.run_batches``: ``batch_size`` admitted trials per
step, ``oversample``, ``max_staleness``, the cancelled tail continued or dropped, at most one batch ahead
of the learner), over ``InProcessPorts`` (the torch sampler with the run's ``[sampler]`` settings, the
local sandbox and the verifier called directly), with the learner stepping in a worker thread as soon as
``batch_size`` trials are admitted (the critic's values and update inside the step, as ``t1-probe``'s
learner does) and the sampler loading each new version between generations. The critic warms up first on
the campaign's warm-up trials, as the campaign's does. Threads as in the campaign: one torch thread per
engine (the sampler's, the learner's), the sandbox and verifier in their own processes.

``run_one_process`` returns the RL window's figures as ``tools._report.time_shares.rl_figures`` computes them for the
campaign: the first training trial's issue to the publication of version ``steps``.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from pathlib import Path

import trio

from bench.lib.cpu import spent, tree_cpu
from schemas import StalenessDecision, TrajectoryAssembled, TrialIssued
from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.backends.sandbox_backend import SandboxConfig
from t1_actors.critic import CriticConfig
from t1_actors.learner import LearnerConfig
from t1_actors.policy.config import ModelConfig
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.rollout.inprocess import InProcessPorts
from t1_actors.schedule import CampaignConfig
from t1_actors.tasks.config import TasksConfig
from t1_actors.train.ppo import PPOConfig
from t1_actors.verify.engine import VerifierConfig


class _LearningPorts(InProcessPorts):
    """In-process ports that hand admitted trials to the learner and stamp the RL window."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chunks: dict[str, list] = {}
        self.admitted: list[str] = []
        self.changed = trio.Event()
        self.train_issues: list[float] = []
        self.cpu_at_start: dict[str, float] = {}

    async def log(self, *events):
        await super().log(*events)
        for event in events:
            if isinstance(event, TrajectoryAssembled):
                self.chunks.setdefault(event.trial_id, []).append(event)
            elif isinstance(event, StalenessDecision) and event.decision == "admit":
                self.admitted.append(event.trial_id)
                self.changed.set()
                self.changed = trio.Event()
            elif isinstance(event, TrialIssued) and event.split == "train":
                if not self.train_issues:
                    self.cpu_at_start = tree_cpu(os.getpid())
                self.train_issues.append(time.time())


async def run_one_process(config, sft_run: Path, steps: int) -> dict:
    import torch

    from t1_actors.backends.local_sandbox import LocalSandboxBackend
    from t1_actors.backends.torch_learner import TorchCritic, TorchLearner, collate
    from t1_actors.backends.torch_sampler import TorchSampler
    from t1_actors.layout import tokenizer_path, weights_dir
    from t1_actors.policy import MoEPolicy
    from t1_actors.policy.sampling import SamplingParams
    from t1_actors.policy.tokenizer import load_tokenizer, special_token_ids
    from t1_actors.rollout.admission import grouped
    from t1_actors.rollout.play import run_warmup
    from t1_actors.rollout.trials import BatchStats, TrialRunner, run_batches
    from t1_actors.schedule import rl_task_order, warmup_task_ids
    from t1_actors.tasks import build_task_sets
    from t1_actors.verify.engine import Verifier

    campaign, staleness, ppo = config.section(CampaignConfig), config.section(StalenessConfig), config.section(PPOConfig)
    sampler_config, learner_config = config.section(SamplerConfig), config.section(LearnerConfig)
    model = config.section(ModelConfig)
    torch.set_num_threads(learner_config.threads)
    tasks = build_task_sets(config.section(TasksConfig))
    tokenizer = load_tokenizer(tokenizer_path(sft_run))
    policy = MoEPolicy.load(weights_dir(sft_run, 0))
    critic = TorchCritic.for_policy(policy, ppo, seed=config.section(CriticConfig).seed) \
        if ppo.advantage_estimator == "gae" else None
    learner = TorchLearner(policy, ppo, critic=critic, replay=learner_config.replay,
                           fidelity_metrics=learner_config.fidelity_metrics, seed=learner_config.seed)
    sandbox = LocalSandboxBackend(config.section(SandboxConfig).local)
    verifier = Verifier(config.section(VerifierConfig))
    params = SamplingParams(max_new_tokens=campaign.max_new_tokens, temperature=sampler_config.temperature,
                            top_p=sampler_config.top_p,
                            stop_ids=(special_token_ids(tokenizer)["<|im_end|>"],))
    rl_ids = [t.id for t in tasks.rl]
    published_at: list[float] = []
    step_seconds: list[float] = []
    cpu_at_end: dict[str, float] = {}
    stats = BatchStats()
    try:
        async with TorchSampler.open(MoEPolicy.load(weights_dir(sft_run, 0)), config=sampler_config) as sampler:
            ports = _LearningPorts(sampler, tasks.by_id, params, sandbox, verifier)
            runner = TrialRunner(ports, tasks.by_id, tokenizer, campaign.rollout_limits(), run_tag="one",
                                 tito_repairs=campaign.tito_repairs)
            if critic is not None and campaign.warmup_trials:
                warm = await run_warmup(runner, warmup_task_ids(rl_ids, campaign.warmup_trials, campaign.seed),
                                        concurrency=campaign.eval_concurrency)
                size = config.section(CriticConfig).warmup_batch
                chunks = [c for t in warm for c in ports.chunks.pop(t, [])]
                batches = [collate(chunks[i:i + size], None, num_layers=model.num_layers, top_k=model.top_k,
                                   require_routing=False) for i in range(0, len(chunks), size)]
                await trio.to_thread.run_sync(critic.warmup, batches)
            ports.chunks.clear()
            version_changed = trio.Event()

            async def learn(weights_root: Path) -> None:
                nonlocal version_changed
                while learner.step_count < steps:
                    while len(ports.admitted) < staleness.batch_size:
                        await ports.changed.wait()
                    trials = ports.admitted[:staleness.batch_size]
                    del ports.admitted[:staleness.batch_size]
                    batch = collate([c for t in trials for c in ports.chunks.pop(t)], None,
                                    num_layers=model.num_layers, top_k=model.top_k,
                                    require_routing=learner_config.replay)
                    if critic is None:  # rloo: A needs no critic values
                        batch = batch.with_old_values(torch.zeros(batch.token_ids.shape))
                    result = await trio.to_thread.run_sync(learner.step, batch)
                    step_seconds.append(result.metrics["step_seconds"])
                    published = await trio.to_thread.run_sync(learner.publish, weights_root)
                    published_at.append(time.time())
                    if len(published_at) == steps:
                        cpu_at_end.update(tree_cpu(os.getpid()))
                    ports.version = published.version  # what the controller learns from WeightsPublished
                    version_changed.set()
                    version_changed = trio.Event()
                    nursery.start_soon(sampler.load_weights, published.location, published.version)

            async def wait_for_learner(version: int) -> None:
                while ports.version < version and stats.batches < steps:
                    with trio.move_on_after(1.0):
                        await version_changed.wait()

            order = grouped(itertools.cycle(rl_task_order(rl_ids, campaign.seed)), staleness.group_size)
            with tempfile.TemporaryDirectory(prefix="t1-one-process-") as weights_root:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(learn, Path(weights_root))
                    await run_batches(runner, lambda: next(order), staleness,
                                      until=lambda: stats.batches >= steps, wait_for_learner=wait_for_learner,
                                      stats=stats)
    finally:
        verifier.close()
        sandbox.close()
    start, end = ports.train_issues[0], published_at[steps - 1]
    seconds = end - start
    trajectories = steps * staleness.batch_size
    return {"rl_seconds": round(seconds, 2), "steps": steps, "trajectories": trajectories,
            "trials_issued": sum(t <= end for t in ports.train_issues),
            "trajectories_per_s": round(trajectories / seconds, 4),
            "steps_per_s": round(steps / seconds, 5), "steps_per_minute": round(60 * steps / seconds, 2),
            "trajectories_per_minute": round(60 * trajectories / seconds, 2),
            "learner_step_s": round(sum(step_seconds[:steps]) / steps, 2),
            "cpu_s": spent(ports.cpu_at_start, cpu_at_end),
            "admitted": stats.admitted, "dropped": stats.dropped, "cancelled": stats.cancelled}
