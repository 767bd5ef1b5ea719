"""The critic actor: the value model. Warm-up, values for GAE, the clipped value loss after each step.

Data path (everything through the run's log, read with a cursor):
- warm-up: with ``[critic] warmup_trajectories = N > 0`` the critic values no training trajectory before
  it has fitted one epoch (``[ppo] critic_warmup_epochs``) on the offline trajectories of warm-up trials
  (``TrialIssued(split="warmup")``). The warm-up runs when asked, ``Generic(op="critic_warmup",
  args={"trial_ids": [...]})`` (the staleness controller, once its warm-up trials are logged), or by
  itself once N warm-up trials have trajectories in the log, whichever comes first; only once. It
  appends ``CriticWarmup`` with explained variance before and after. N = 0: no warm-up;
- every admitted trial (``StalenessDecision(decision="admit")``): ``CriticValues`` for each chunk;
- every ``LearnerStep``: one update on that step's trajectories with the clipped value loss, whose
  V_old are the values this critic logged for them (those the learner used for GAE).
It checkpoints its model, optimiser and cursor blob after each update and resumes from them.

Config: ``[critic]`` (``CriticConfig``), ``[ppo]``, ``[model]``; options: ``policy_path`` for the trunk's
initial weights (default: the newest ``WeightsPublished`` in the log, else fresh weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import trio
from pydantic import BaseModel, ConfigDict, Field

from schemas import Ack, Generic, LearnerStep, StalenessDecision, TrajectoryAssembled, TrialIssued
from storage import EventLog
from storage.config import StorageConfig
from t1_actors.backends.torch_critic import TorchCritic
from t1_actors.backends.torch_learner import cursor_bytes, cursor_tensor
from t1_actors.layout import checkpoints_dir
from t1_actors.policy import ModelConfig, MoEPolicy
from t1_actors.policy.value import ValueModel
from t1_actors.runtime.actor import Actor, handles, on_event
from t1_actors.train.batch import collate, trial_records
from t1_actors.train.ppo import PPOConfig


class CriticConfig(BaseModel):
    """[critic]: when to warm up, and the engine's threads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    warmup_trajectories: int = Field(0, ge=0, description="warm-up trials to expect before valuing (0: no warm-up)")
    warmup_batch: int = Field(32, gt=0, description="trajectories per forward during warm-up")
    threads: int = Field(1, gt=0, description="torch threads of the critic process")
    max_tokens_per_microbatch: int = Field(
        32768, ge=64,
        description="the most token positions one forward/backward of the value model holds: its own key, as the "
                    "critic is its own process (and a position costs it no logits); same rule as [learner]'s")
    seed: int = Field(0, description="seed of the value updates' minibatch shuffles, and of fresh trunk weights "
                                     "when there is neither a policy_path nor a published version")
    poll_interval_s: float = Field(0.05, gt=0, description="how often the critic reads the run's log for warm-up "
                                                          "trials, admitted trials and learner steps")


class CriticOptions(BaseModel):
    """``[[actors]] options`` of a critic: where its value model's trunk comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy_path: str | None = Field(None, description="a saved policy (HF Qwen3-MoE dir) whose weights start the "
                                                      "value model's trunk ([ppo] value_init_from_policy); None: the "
                                                      "newest version published in the log, else fresh weights from "
                                                      "[model] and [critic] seed")


class CriticActor(Actor):
    role = "critic"
    Options = CriticOptions

    async def setup(self) -> None:
        self.critic_config: CriticConfig = self.config.section(CriticConfig)
        self.ppo_config: PPOConfig = self.config.section(PPOConfig)
        self.model_config: ModelConfig = self.config.section(ModelConfig)
        torch.set_num_threads(self.critic_config.threads)
        run_dir = Path(self.ctx.run_dir)
        self.event_log = EventLog.open(self.config.log_location(), create=True, config=self.config.section(StorageConfig))
        self.checkpoint_path = checkpoints_dir(run_dir) / f"{self.name}.pt"
        self.engine: TorchCritic | None = None
        self.position: dict[str, int] | None = None
        self.warmed = self.critic_config.warmup_trajectories == 0
        self.warmup_trials: set[str] = set()  # issued as warm-up trials
        self.warmup_logged: set[str] = set()  # ... whose trajectories are in the log
        self.waiting: list[str] = []  # admitted before warm-up: valued right after it
        self._lock = trio.Lock()  # the event loop and the warm-up request take turns
        self._changed = False  # the model changed since the last checkpoint
        self._engine_ready = trio.Event()

    def status(self) -> dict[str, float]:
        return {"critic_version": float(self.engine.version if self.engine else -1), "warmed": float(self.warmed),
                "waiting": float(len(self.waiting))}

    async def run(self) -> None:
        await trio.to_thread.run_sync(self._build_engine)
        self._engine_ready.set()
        cursor = self.event_log.cursor(self.position, kinds=self.followed_kinds())
        async for events in cursor.atail(interval=self.critic_config.poll_interval_s):
            async with self._lock:
                for _, event in events:
                    await self.on_logged(event)
                if not self.warmed and len(self.warmup_logged) >= self.critic_config.warmup_trajectories:
                    await self._warmup(sorted(self.warmup_logged))
                self.position = cursor.position  # every event up to here is handled
                if self._changed:
                    await self._checkpoint()

    # ---- what it follows in the log -------------------------------------------------------------------
    @on_event(TrialIssued)
    async def _issued(self, event: TrialIssued) -> None:
        if event.split == "warmup":
            self.warmup_trials.add(event.trial_id)

    @on_event(TrajectoryAssembled)
    async def _assembled(self, event: TrajectoryAssembled) -> None:
        if event.trial_id in self.warmup_trials:
            self.warmup_logged.add(event.trial_id)

    @on_event(StalenessDecision)
    async def _decided(self, event: StalenessDecision) -> None:
        if event.decision != "admit":
            return
        if self.warmed:
            await self._value(event.trial_id)
        else:
            self.waiting.append(event.trial_id)

    @on_event(LearnerStep)
    async def _stepped(self, event: LearnerStep) -> None:
        if self.warmed:
            await self._update(event)

    @handles(Generic)
    async def generic(self, request: Generic) -> Ack:
        if request.op != "critic_warmup":
            raise ValueError(f"critic: unknown op {request.op!r} (known: critic_warmup)")
        await self._engine_ready.wait()
        async with self._lock:
            if self.warmed:
                return Ack(detail="critic already warm")
            trials = list(request.args.get("trial_ids") or sorted(self.warmup_logged))
            report = await self._warmup(trials)
            await self._checkpoint()
        return Ack(detail=f"critic warmed on {report.trajectories if report else 0} trajectories")

    # ---- the three jobs ---------------------------------------------------------------------------
    async def _value(self, trial_id: str) -> None:
        chunks, logged = trial_records(e for _, e in await self.event_log.aby_trial(trial_id))
        for chunk in chunks:
            done = logged.get((chunk.trial_id, chunk.chunk))
            if done is not None and done.critic_version == self.engine.version:
                continue  # already valued by this very critic (a restart replays the cursor's tail)
            values = await trio.to_thread.run_sync(self.engine.critic_values, chunk)
            await self.log(values, commit=False)
        await self.commit()

    async def _warmup(self, trials: list[str]):
        """One warm-up on these trials' trajectories, then value the admitted trials that waited for it."""
        trajectories, report = [], None
        for trial in trials:
            trajectories += trial_records(e for _, e in await self.event_log.aby_trial(trial))[0]
        if trajectories:
            size = self.critic_config.warmup_batch
            batches = [self._collate(trajectories[i:i + size]) for i in range(0, len(trajectories), size)]
            report = await trio.to_thread.run_sync(self.engine.warmup, batches)
            await self.log(report.event())
            self.logger.info("critic_warmup", trajectories=report.trajectories,
                             ev_before=report.explained_variance_before, ev_after=report.explained_variance_after)
        self.warmed = True
        waiting, self.waiting = self.waiting, []
        for trial in waiting:
            await self._value(trial)
        self._changed = True
        return report

    async def _update(self, step: LearnerStep) -> None:
        chunks, values = [], {}
        for trial in step.trials:
            c, v = trial_records(e for _, e in await self.event_log.aby_trial(trial))
            chunks += c
            values.update(v)
        missing = [c.trial_id for c in chunks if (c.trial_id, c.chunk) not in values]
        if not chunks or missing:
            self.logger.warning("critic_update_skipped", step=step.step, missing_values=missing[:5])
            return
        metrics = await trio.to_thread.run_sync(self.engine.update, self._collate(chunks, values))
        self.logger.info("critic_update", step=step.step, critic_version=self.engine.version, **metrics)
        self._changed = True

    def _collate(self, trajectories, values=None):
        return collate(trajectories, values, num_layers=self.model_config.num_layers,
                       top_k=self.model_config.top_k, require_routing=False)

    # ---- engine and checkpoints -------------------------------------------------------------------
    def _build_engine(self) -> None:
        if self.options.policy_path:
            policy = MoEPolicy.load(self.options.policy_path)
        else:
            published = [e for _, e in self.event_log.events(kinds=["weights_published"])]
            if published:
                policy = MoEPolicy.load(max(published, key=lambda e: e.version).location)
            else:
                torch.manual_seed(self.critic_config.seed)
                policy = MoEPolicy(self.model_config)
        cfg = self.ppo_config
        model = ValueModel.from_policy(policy) if cfg.value_init_from_policy else ValueModel(policy.config)
        self.engine = TorchCritic(model, cfg, seed=self.critic_config.seed,
                                  max_tokens_per_microbatch=self.critic_config.max_tokens_per_microbatch)
        if self.checkpoint_path.is_file():
            state = torch.load(self.checkpoint_path, weights_only=True)
            self.engine.load_state_dict(state["critic"])
            blob = json.loads(cursor_bytes(state["cursor"]).decode())
            self.position, self.warmed = blob["position"], blob["warmed"]
            self.warmup_trials, self.warmup_logged = set(blob["warmup_trials"]), set(blob["warmup_logged"])
            self.waiting = blob["waiting"]

    async def _checkpoint(self) -> None:
        """Model, optimiser and the cursor blob: the position of the last fully handled event batch."""
        self._changed = False
        blob = json.dumps({"position": self.position, "warmed": self.warmed, "warmup_trials": sorted(self.warmup_trials),
                           "warmup_logged": sorted(self.warmup_logged), "waiting": self.waiting}).encode()
        state = {"critic": self.engine.state_dict(), "cursor": cursor_tensor(blob)}

        def write() -> None:
            self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.checkpoint_path.with_name(self.checkpoint_path.name + ".tmp")
            torch.save(state, tmp)
            tmp.replace(self.checkpoint_path)

        await trio.to_thread.run_sync(write)
