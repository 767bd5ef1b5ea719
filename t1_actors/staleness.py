"""The staleness controller actor: issues trials, admits or drops them by policy lag, cuts the tail.

It plays the campaign's schedule (``t1_actors.schedule``: SFT eval, warm-up and the critic's warm-up,
asynchronous PPO with a validation probe every ``[eval] probe_every`` steps, RL eval; each phase skipped on
restart when the log shows it done; the trials a killed predecessor left mid-trajectory are resumed from the
log where their sandbox survives, ``rollout.resume``, and the others closed with their reason first:
``rollout.recovery``). Trials reach the
sampler, sandbox and verifier actors through ``ActorPorts``; the orchestration itself is
``t1_actors.rollout.trials`` and the admission rules ``t1_actors.rollout.admission``. It learns the learner's
version by tailing the log for ``WeightsPublished``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import trio

from schemas import (
    Ack,
    Cancel,
    ExecRequest,
    GenerateRequest,
    Generic,
    SandboxClose,
    SandboxExec,
    SandboxOpen,
    VerifierResult,
    VerifyRequest,
    WeightsPublished,
)
from storage import EventLog
from storage.config import StorageConfig
from t1_actors.backends.local_sandbox import SandboxInfraError
from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.eval.protocol import EvalConfig, pass_k_subset
from t1_actors.layout import checkpoints_dir, tokenizer_path
from t1_actors.policy.generation import NO_PREFIX, Generation, TurnPrefix
from t1_actors.policy.tokenizer import load_tokenizer, special_token_ids
from t1_actors.rollout import ToolOutcome
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.rollout.opens import SandboxesUnavailable, SandboxUnavailable
from t1_actors.rollout.recovery import close_abandoned, open_trials
from t1_actors.rollout.resume import resume_open_trials
from t1_actors.rollout.trials import BatchStats, InFlight, TrialRunner
from t1_actors.runtime.actor import Actor
from t1_actors.runtime.errors import PeerGone, RemoteError, RuntimeFault
from t1_actors.runtime.reachability import PeerWatch, ping_call, while_reachable
from t1_actors.schedule import CampaignConfig, Controller, TaskSplits, play_schedule
from t1_actors.tasks import build_task_sets
from t1_actors.tasks.config import TasksConfig


class ActorPorts:
    """``TrialPorts`` over the runtime: the sampler, sandbox and verifier actors, and this actor's log."""

    def __init__(self, actor: StalenessActor, campaign: CampaignConfig, stop_id: int):
        self.actor, self.campaign, self.stop_id = actor, campaign, stop_id
        self.deadline = actor.config.transport.control_deadline_s

    async def open_sandbox(self, trial_id: str, task_id: str) -> None:
        try:
            await self.actor.peer("sandbox").call_bulk(SandboxOpen(trial_id=trial_id, task_id=task_id))
        except RemoteError as error:
            if error.error != SandboxInfraError.__name__:  # the sandbox actor's mark of its infrastructure's failures
                raise
            raise SandboxUnavailable(error.detail) from error

    async def execute(self, trial_id: str, turn: int, command: str, timeout_s: float) -> ToolOutcome:
        reply = await self.actor.peer("sandbox").call_bulk(
            ExecRequest(trial_id=trial_id, turn=turn, command=command, timeout_s=timeout_s))
        if not isinstance(reply, SandboxExec):
            raise TypeError(f"sandbox answered {type(reply).__name__} to an exec request")
        return ToolOutcome(reply.exit_code, reply.stdout + reply.stderr, reply.infra_error)

    async def close_sandbox(self, trial_id: str) -> None:
        with trio.move_on_after(30):
            await self.actor.peer("sandbox").call_bulk(SandboxClose(trial_id=trial_id))

    async def generate(self, trial_id: str, turn: int, prompt_ids: np.ndarray, seed: int | None = None,
                       temperature: float | None = None, prefix: TurnPrefix = NO_PREFIX,
                       record_routing: bool = True) -> Generation:
        c = self.campaign
        samplers = self.actor.peer("sampler")  # every turn of a trial to one replica: its prefix cache stays warm
        name = samplers.pick(trial_id)
        request = GenerateRequest(
            trial_id=trial_id, turn=turn, input_ids=prompt_ids, max_new_tokens=c.max_new_tokens,
            temperature=temperature or self.actor.temperature, top_p=self.actor.top_p, stop_ids=[self.stop_id],
            policy_version_wanted=self.actor.version, seed=seed, prefix_len=prefix.shared, prefix_rows=prefix.rows,
            prefix_version=prefix.version, record_routing=record_routing)
        watch = getattr(self.actor, "watch", None)
        try:
            # a sampler killed mid-turn and restarted answers this same request (only this turn is sampled
            # again); one that stays away longer than the wait ends the trial as an infrastructure failure
            reply = await (samplers.call_bulk(request, to=name) if watch is None else while_reachable(
                watch, name, request.kind, self.actor.staleness.sampler_restart_wait_s,
                lambda: samplers.call_bulk(request, to=name)))
        except PeerGone as gone:
            return Generation(len(prompt_ids), np.zeros(0, np.int32), np.zeros(0, np.float32), None, "error",
                              self.actor.version, error=str(gone))
        return Generation.from_reply(reply, len(prompt_ids))

    async def cancel(self, trial_id: str, *, sandbox_id: str | None = None) -> None:
        message = Cancel(trial_id=trial_id, reason="batch full")
        await self.actor.peer("sampler").broadcast(message)
        if sandbox_id is not None:
            await self.actor.peer("sandbox").broadcast(Cancel(trial_id=sandbox_id, reason="batch full"))

    async def verify(self, trial_id: str, task_id: str, *, sandbox_id: str | None = None) -> VerifierResult:
        reply = await self.actor.peer("verifier").call_bulk(VerifyRequest(trial_id=trial_id, task_id=task_id,
                                                                          sandbox_id=sandbox_id))
        if not isinstance(reply, VerifierResult):
            raise TypeError(f"verifier answered {type(reply).__name__} to a verify request")
        return reply

    async def log(self, *events) -> None:
        for event in events:
            await self.actor.log(event, commit=False)
        await self.actor.commit()

    def learner_version(self) -> int:
        return self.actor.version


def rl_clock_path(run_dir: str | Path, name: str) -> Path:
    """Where the staleness controller ``name`` keeps RL's clock: its start and the seconds it stood still."""
    return checkpoints_dir(run_dir) / f"{name}.json"


def pause_rl_clock(run_dir: str | Path, name: str, seconds: float) -> bool:
    """Add ``seconds`` to the time RL's clock stood still (a validation probe; the time a whole campaign was
    down before ``t1-actor launch --resume``): RL's ``rl_seconds`` are for training. False when RL has not
    started (no clock yet: nothing to pause)."""
    path = rl_clock_path(run_dir, name)
    try:
        clock = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    clock["paused_s"] = float(clock.get("paused_s", 0.0)) + seconds
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(clock))
    partial.replace(path)
    return True


ABANDONED_WAIT_S = 30.0  # how long a restarted controller waits for verifications its predecessor asked for
SANDBOX_ANSWER_WAIT_S = 60.0  # how long it asks a silent sandbox actor which sandboxes it holds


class StalenessActor(Actor):
    role = "staleness"

    async def setup(self) -> None:
        self.campaign: CampaignConfig = self.config.section(CampaignConfig)
        self.staleness: StalenessConfig = self.config.section(StalenessConfig)
        sampler = self.config.section(SamplerConfig)
        self.temperature, self.top_p = sampler.temperature, sampler.top_p
        sets = await trio.to_thread.run_sync(build_task_sets, self.config.section(TasksConfig))
        self.eval_config: EvalConfig = self.config.section(EvalConfig)
        self.splits = TaskSplits(rl=[t.id for t in sets.rl], validation=[t.id for t in sets.validation],
                                 eval=[t.id for t in sets.eval],
                                 pass_k=pass_k_subset(sets.eval, self.eval_config.pass_k_tasks))
        self.tasks = sets.by_id
        self.tokenizer = load_tokenizer(tokenizer_path(self.ctx.run_dir))
        self.reader = EventLog.open(self.config.log_location(), config=self.config.section(StorageConfig))
        self.version = 0
        self.version_changed = trio.Event()
        self.stats = BatchStats()

    def status(self) -> dict[str, float]:
        watch = getattr(self, "watch", None)
        return {"policy_version": float(self.version), "admitted": float(self.stats.admitted),
                "dropped": float(self.stats.dropped), "cancelled": float(self.stats.cancelled),
                "unreachable_peers": float(len(watch.unreachable) if watch is not None else 0)}

    async def _follow_versions(self) -> None:
        """Tail the log for published weights: the learner's version is the newest one."""
        cursor = self.reader.cursor(kinds=["weights_published"])
        while True:
            for _event_id, event in await cursor.apoll():
                if isinstance(event, WeightsPublished) and event.version > self.version:
                    self.version = event.version
                    self.version_changed.set()
                    self.version_changed = trio.Event()
            await trio.sleep(0.2)

    def _rl_clock(self) -> dict[str, float]:
        """RL's wall-clock budget survives a restart of this actor: its start (and the seconds its clock stood
        still, the validation probes') are kept beside the log."""
        path = rl_clock_path(self.ctx.run_dir, self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            clock = json.loads(path.read_text())
            return {"rl_started_at": float(clock["rl_started_at"]), "paused_s": float(clock.get("paused_s", 0.0))}
        except (OSError, ValueError, KeyError):
            clock = {"rl_started_at": time.time(), "paused_s": 0.0}
            path.write_text(json.dumps(clock))
            return clock

    def _rl_seconds_left(self) -> float:
        clock = self._rl_clock()
        return max(0.0, self.campaign.rl_seconds - (time.time() - clock["rl_started_at"] - clock["paused_s"]))

    def _pause_rl_clock(self, seconds: float) -> None:
        self._rl_clock()
        pause_rl_clock(self.ctx.run_dir, self.name, seconds)

    async def _events(self, kind: str) -> list:
        return await trio.to_thread.run_sync(lambda: [e for _, e in self.reader.events(kinds=[kind])])

    async def _trial_events(self) -> list:
        kinds = ["trial_issued", "staleness_decision", "trial_ended", "verifier_result"]
        return await trio.to_thread.run_sync(lambda: [e for _, e in self.reader.events(kinds=kinds)])

    async def _events_of_trial(self, trial_id: str) -> list:
        return [e for _, e in await self.reader.aby_trial(trial_id)]

    async def _open_sandboxes(self, sandbox_ids: list[str]) -> set[str]:
        """Which of these sandboxes the sandbox actor still holds; asked again while it does not answer (it may be
        restarting, and taking them over) for up to ``SANDBOX_ANSWER_WAIT_S``, then none (it cannot say)."""
        with trio.move_on_after(SANDBOX_ANSWER_WAIT_S):
            while True:
                try:
                    reply = await self.peer("sandbox").call(Generic(op="open_sandboxes",
                                                                    args={"trial_ids": sandbox_ids}))
                    return set(json.loads(reply.detail)) if isinstance(reply, Ack) else set()
                except RuntimeFault as error:
                    self.logger.warning("open_sandboxes_unanswered", error=str(error))
                await trio.sleep(2.0)
        return set()

    async def _close_quietly(self, sandbox_id: str) -> None:
        """Close a dead predecessor's sandbox; one the sandbox actor no longer knows is already gone."""
        try:
            await self.peer("sandbox").call(SandboxClose(trial_id=sandbox_id))
        except RuntimeFault as error:
            self.logger.warning("abandoned_sandbox_not_closed", trial_id=sandbox_id, error=str(error))

    async def wait_for_version(self, version: int, until) -> None:
        while self.version < version and not until():
            with trio.move_on_after(1.0):
                await self.version_changed.wait()

    async def run(self) -> None:
        stop_id = special_token_ids(self.tokenizer)["<|im_end|>"]
        runner = TrialRunner(ActorPorts(self, self.campaign, stop_id), self.tasks, self.tokenizer,
                             self.campaign.rollout_limits(),
                             run_tag=f"{self.ctx.run_id}-{self.name}",
                             tito_repairs=self.campaign.tito_repairs,
                             routing_in_turns=self.staleness.resume_after_restart,
                             max_open_failures=self.staleness.max_open_failures)

        async def warm_up_critic(trial_ids: list[str]) -> None:
            await self.peer("critic").call_bulk(Generic(op="critic_warmup", args={"trial_ids": trial_ids}))

        controller = Controller(logger=self.logger, version=lambda: self.version, wait_for_version=self.wait_for_version,
                                events=self._events, rl_seconds_left=self._rl_seconds_left,
                                warm_up_critic=warm_up_critic, pause_rl_clock=self._pause_rl_clock)
        # Trials a killed predecessor left open, closed before this one issues any. Not beside the schedule:
        # a restart late in the final eval lets the last pass end (and the campaign stop) within the wait.
        # the learner's version as the log has it now: a restarted (or relaunched) controller's first trials want
        # it, before the version follower has read the log
        version = self.version = max((e.version for e in await self._events("weights_published")), default=0)
        abandoned = open_trials(await self._trial_events())
        resumed: list[InFlight] = []
        if abandoned:
            if self.staleness.resume_after_restart:
                resumed, abandoned = await resume_open_trials(
                    abandoned, runner, trial_events=self._events_of_trial, open_sandboxes=self._open_sandboxes,
                    close_sandbox=self._close_quietly, version=version)
                self.logger.warning("resuming_trials_mid_trajectory", n=len(resumed),
                                    trials=[f.trial_id for f in resumed])
            self.logger.warning("closing_abandoned_trials", n=len(abandoned))
            await close_abandoned(abandoned, self._trial_events, runner.ports.log, self._close_quietly, version,
                                  wait_s=ABANDONED_WAIT_S)
        transport = self.config.transport
        watch = PeerWatch(self.name, {s.name: s.role for s in self.config.actors if s.name != self.name},
                          ping_call(self.peer), self.log, interval_s=transport.heartbeat_interval_s,
                          timeout_s=transport.heartbeat_timeout_s)
        self.watch = watch
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_versions)
            nursery.start_soon(watch.run)  # a peer cut off (e.g. a sampler's host) is logged, not a silent pause
            try:
                await play_schedule(runner, controller, self.splits, campaign=self.campaign, staleness=self.staleness,
                                    eval_config=self.eval_config, run_temperature=self.temperature,
                                    stats=self.stats, resumed=resumed)
            except* SandboxesUnavailable as group:  # every open fails: one line with the sandbox's error, then die
                first: BaseException = group
                while isinstance(first, BaseExceptionGroup):
                    first = first.exceptions[0]
                self.logger.error("sandboxes_unavailable", error=str(first), failed_opens=runner.opens.failed)
                raise
            nursery.cancel_scope.cancel()
        self.logger.info("campaign_schedule_done", policy_version=self.version)
