"""The learner actor: PPO steps on admitted TITO trajectories, weights published as policy versions.

Data path (everything through the run's log, read with a cursor):
1. the staleness controller logs a trial's ``TrajectoryAssembled`` chunks and admits it
   (``StalenessDecision(decision="admit")``); the critic logs ``CriticValues`` for every chunk;
2. once ``batch_size`` admitted trials have values for all their chunks (admission order), the learner
   runs one PPO step with R3 replay (``backends.torch_learner`` or ``backends.megatron_learner``);
3. it checkpoints (policy, optimiser, cursor blob), appends ``LearnerStep`` and ``WeightsPublished``,
   and sends ``PolicyUpdate`` to every sampler.
A restarted learner resumes from its checkpoint: the cursor blob holds the log position, the admitted
trials not trained yet and the last step's events, appended again if the crash came before they were
(exactly once: a step is neither trained twice nor lost).

Config: ``[learner]`` (``LearnerConfig``), ``[ppo]`` (``t1_actors.train.ppo.PPOConfig``), ``[model]``;
options: ``policy_path`` (default: the newest ``WeightsPublished`` in the log, else fresh weights,
published as version 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
import trio
from pydantic import BaseModel, ConfigDict, Field

from schemas import CriticValues, LearnerStep, StalenessDecision, WeightsPublished, decode, encode
from storage import EventLog
from storage.config import StorageConfig
from t1_actors.backends.learner_backend import open_learner_backend
from t1_actors.backends.torch_learner import PublishedWeights
from t1_actors.layout import checkpoints_dir
from t1_actors.policy import ModelConfig, MoEPolicy
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.runtime.actor import Actor, on_event
from t1_actors.runtime.errors import NoSuchPeer
from t1_actors.train.batch import collate, trial_records
from t1_actors.train.ppo import PPOConfig


class LearnerConfig(BaseModel):
    """[learner]: engine and batching of the learner actor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["torch", "megatron"] = Field(
        "torch", description="torch: the PPO step in plain PyTorch; megatron: on a megatron-core GPTModel (the "
                             "megatron extra; trains the whole policy only: [ppo] actor_params = ['*'])")
    batch_size: int | None = Field(None, gt=0,
                                   description="admitted trials per PPO step; None = [staleness] batch_size")
    replay: bool = Field(True, description="R3: the training forward replays the sampler's routing")
    fidelity_metrics: bool = Field(True, description="also measure the logprob gap / routing mismatch without R3")
    max_tokens_per_microbatch: int = Field(
        32768, ge=64,
        description="the most token positions one forward/backward holds (torch backend): a minibatch above it runs "
                    "as groups of rows, a chunk longer than it in segments that keep only the earlier segments' K/V "
                    "(same loss and gradients); memory then grows with a chunk only by its K/V and their gradients. "
                    "The default holds today's 32 x 768-token batches in one pass")
    threads: int = Field(2, gt=0, description="torch threads of the learner process")
    seed: int = Field(0, description="seed of the minibatch shuffles, and of fresh initial weights when there is "
                                     "neither a policy_path nor a published version")
    poll_interval_s: float = Field(0.05, gt=0, description="how often the learner reads the run's log for newly "
                                                          "admitted trials and critic values")
    publish_deadline_s: float = Field(60.0, gt=0, description="time each sampler has to acknowledge a new policy "
                                                              "version; a sampler that misses it is logged, not "
                                                              "waited for")


class LearnerOptions(BaseModel):
    """``[[actors]] options`` of a learner: where its first policy comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy_path: str | None = Field(None, description="a saved policy (HF Qwen3-MoE dir) to start from as version 0; "
                                                      "None: the newest version published in the log, else fresh "
                                                      "weights from [model] and [learner] seed, published as "
                                                      "version 0")


def _hex(record) -> str:
    return encode(record).hex()


class LearnerActor(Actor):
    role = "learner"
    Options = LearnerOptions

    async def setup(self) -> None:
        self.learner_config: LearnerConfig = self.config.section(LearnerConfig)
        self.ppo_config: PPOConfig = self.config.section(PPOConfig)
        self.model_config: ModelConfig = self.config.section(ModelConfig)
        torch.set_num_threads(self.learner_config.threads)
        size = self.learner_config.batch_size
        self.batch_size = size if size is not None else self.config.section(StalenessConfig).batch_size
        run_dir = Path(self.ctx.run_dir)
        self.event_log = EventLog.open(self.config.log_location(), create=True, config=self.config.section(StorageConfig))
        self.weights_root = run_dir / "weights"
        self.checkpoint_path = checkpoints_dir(run_dir) / f"{self.name}.pt"
        self.pending: list[str] = []
        self.ready: dict[str, tuple[list, dict]] = {}  # pending trials with every chunk valued
        self.changed: set[str] = set()  # pending trials with news since their last look
        self.engine = None
        self.position: dict[str, int] | None = None

    def status(self) -> dict[str, float]:
        engine = self.engine
        return {"policy_version": float(engine.policy_version if engine else -1), "pending": float(len(self.pending)),
                "steps": float(engine.step_count if engine else 0)}

    # ---- the loop ---------------------------------------------------------------------------------
    async def run(self) -> None:
        replay_events = await trio.to_thread.run_sync(self._build_engine)
        if replay_events:  # a crash came between the checkpoint and logging its events
            step, published = replay_events
            await self.log(step, commit=False)
            await self.log(published)
            await self._announce(PublishedWeights(published.version, published.sha256, published.location,
                                                  published.step))
        cursor = self.event_log.cursor(self.position, kinds=self.followed_kinds())
        async for events in cursor.atail(interval=self.learner_config.poll_interval_s):
            for _, event in events:
                await self.on_logged(event)
            while trials := await self._ready_trials():
                await self._train(trials, cursor.position)

    @on_event(StalenessDecision)
    async def _admitted(self, event: StalenessDecision) -> None:
        if event.decision == "admit" and event.trial_id not in self.pending:
            self.pending.append(event.trial_id)
            self.changed.add(event.trial_id)

    @on_event(CriticValues)
    async def _valued(self, event: CriticValues) -> None:
        self.changed.add(event.trial_id)

    async def _ready_trials(self) -> list[str]:
        """The first ``batch_size`` pending trials whose every chunk the critic has valued."""
        chosen = []
        for trial in self.pending:
            if trial not in self.ready and trial in self.changed:  # look again only when something arrived
                self.changed.discard(trial)
                chunks, values = trial_records(e for _, e in await self.event_log.aby_trial(trial))
                if chunks and all((c.trial_id, c.chunk) in values for c in chunks):
                    self.ready[trial] = (chunks, values)
            if trial in self.ready:
                chosen.append(trial)
                if len(chosen) == self.batch_size:
                    return chosen
        return []

    async def _train(self, trials: list[str], position: dict[str, int]) -> None:
        chunks = [c for t in trials for c in self.ready[t][0]]
        values = {k: v for t in trials for k, v in self.ready[t][1].items()}
        batch = collate(chunks, values, num_layers=self.model_config.num_layers, top_k=self.model_config.top_k,
                        require_routing=self.learner_config.replay)
        result = await trio.to_thread.run_sync(self.engine.step, batch)
        published = await trio.to_thread.run_sync(self.engine.publish, self.weights_root)
        remaining = [t for t in self.pending if t not in trials]
        blob = json.dumps({"position": position, "pending": remaining, "step": _hex(result.event()),
                           "published": _hex(published.event())}).encode()
        await trio.to_thread.run_sync(self.engine.save_checkpoint, self.checkpoint_path, blob)
        self.pending = remaining
        for t in trials:
            self.ready.pop(t, None)
        await self.log(result.event(), commit=False)
        await self.log(published.event())
        self.logger.info("learner_step", step=result.step, policy_version=result.policy_version,
                         **{k: round(v, 5) for k, v in result.metrics.items()})
        await self._announce(published)

    async def _announce(self, published: PublishedWeights) -> None:
        try:
            group = self.peer("sampler")
        except NoSuchPeer:
            return  # a run without samplers (tests, offline learning)
        replies = await group.broadcast(published.message(), deadline_s=self.learner_config.publish_deadline_s)
        for name, reply in replies.items():
            if isinstance(reply, Exception):
                self.logger.warning("policy_update_failed", sampler=name, error=str(reply))

    # ---- engine, initial policy, resume -----------------------------------------------------------
    def _initial_policy(self) -> tuple[MoEPolicy, int]:
        if self.options.policy_path:
            return MoEPolicy.load(self.options.policy_path), 0
        published = [e for _, e in self.event_log.events(kinds=["weights_published"])]
        if published:
            newest = max(published, key=lambda e: e.version)
            return MoEPolicy.load(newest.location), newest.version
        torch.manual_seed(self.learner_config.seed)
        return MoEPolicy(self.model_config), -1  # -1: publish it as version 0 first

    def _build_engine(self):
        """Build the engine; restore the checkpoint if any. Returns the (LearnerStep, WeightsPublished) the
        checkpoint recorded when the log lacks them, else None."""
        policy, version = self._initial_policy()
        if policy.config != self.model_config:
            raise ValueError(f"the initial policy's shape {policy.config} differs from [model] {self.model_config}; "
                             "fix [model] or point policy_path at a matching checkpoint")
        lc = self.learner_config
        engine = open_learner_backend(lc.backend, policy, self.ppo_config, policy_version=max(version, 0),
                                      replay=lc.replay, fidelity_metrics=lc.fidelity_metrics, seed=lc.seed,
                                      max_tokens_per_microbatch=lc.max_tokens_per_microbatch)
        self.engine = engine
        if self.checkpoint_path.is_file():
            state = json.loads(engine.load_checkpoint(self.checkpoint_path).decode())
            self.position, self.pending = state["position"], list(state["pending"])
            self.changed = set(self.pending)
            step: LearnerStep = decode(bytes.fromhex(state["step"]))
            published: WeightsPublished = decode(bytes.fromhex(state["published"]))
            logged = {e.step for _, e in self.event_log.events(kinds=["learner_step"])}
            self.logger.info("learner_resumed", step=step.step, policy_version=engine.policy_version,
                             pending=len(self.pending))
            return None if step.step in logged else (step, published)
        if version < 0:
            first = engine.publish(self.weights_root)
            trio.from_thread.run(self.log, first.event())
        return None
