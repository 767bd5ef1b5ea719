"""Trial orchestration, transport-free: run many trials concurrently, verify, assemble, admit or drop.

``TrialRunner`` drives one trial from issue to decision through ``TrialPorts`` (the sampler, sandbox
and verifier, whatever process they live in) and appends every fact to the log. ``run_batches``,
``run_eval`` (``t1_actors.rollout.eval_pass``) and ``run_warmup`` (``t1_actors.rollout.play``) are the three
schedules the staleness controller runs; the admission rules themselves live in ``t1_actors.rollout.admission``.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np
import trio

from schemas import ContextEdited, StalenessDecision, TrialEnded, TrialIssued, VerifierResult
from t1_actors import tito
from t1_actors.policy.chat_template import render_chat
from t1_actors.policy.chat_tokenizer import BASH_TOOL, as_chat_tokenizer
from t1_actors.policy.generation import NO_PREFIX, TurnPrefix
from t1_actors.rollout.admission import LengthBias, StalenessConfig, admit, policy_lag, trials_to_launch
from t1_actors.rollout.loop import Generation, RolloutLimits, ToolOutcome, TrialRollout, run_trial
from t1_actors.rollout.opens import SANDBOX_NOT_OPENED, SandboxOpens, SandboxUnavailable


class TrialPorts(Protocol):
    """What a trial needs from the other actors. Each call may raise ``trio.Cancelled`` when the tail is cut."""

    async def open_sandbox(self, trial_id: str, task_id: str) -> None:
        """Open the trial's sandbox; ``SandboxUnavailable`` when the sandbox's infrastructure failed to (an
        environment that cannot be built, the disk budget spent: ``rollout.opens``), any other error as it is."""
    async def execute(self, trial_id: str, turn: int, command: str, timeout_s: float) -> ToolOutcome: ...
    async def close_sandbox(self, trial_id: str) -> None: ...
    async def generate(self, trial_id: str, turn: int, prompt_ids: np.ndarray, seed: int | None = None,
                       temperature: float | None = None, prefix: TurnPrefix = NO_PREFIX,
                       record_routing: bool = True) -> Generation:
        """One assistant turn; ``temperature`` None: the run's sampling temperature (training trials). ``prefix``:
        what the prompt shares with the trial's previous turn; the generation may then carry only the routing
        rows from its ``routing_start`` on (the runner puts the previous turn's back). ``record_routing`` False:
        the turn's record leaves its routing to the trial's trajectory (a trial played to be trained)."""
    async def cancel(self, trial_id: str, *, sandbox_id: str | None = None) -> None:
        """Abort the trial's generation; with ``sandbox_id``, also stop its running command and sandbox."""
    async def verify(self, trial_id: str, task_id: str, *, sandbox_id: str | None = None) -> VerifierResult:
        """Verify the root of sandbox ``sandbox_id`` (None: the trial's own); the result names ``trial_id``."""
    async def log(self, *events: Any) -> None: ...
    def learner_version(self) -> int: ...


def eval_seed(task_id: str, turn: int, sample: int = 0) -> int:
    """The sampling seed of an eval turn: a function of the task, the turn and the sample index only
    (common random numbers).

    Every eval of a run (before and after RL, each temperature, each policy) then draws the same uniforms
    for a task's ``sample``-th attempt, so a task that flips between two evals flipped because the policy
    or the temperature changed, not because the draw did: the paired test (``t1_actors.stats``) sees the
    change's effect instead of two independent samples' noise. pass@k takes samples 0..n-1.
    """
    key = f"{task_id}/{turn}" if sample == 0 else f"{task_id}/{turn}/{sample}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2  # < 2**62, the range the torch sampler draws its own seeds from


def resolved_by(result: VerifierResult | None) -> bool:
    """A trial resolved its task: verified without an infrastructure error, and every one of its tests passed."""
    return result is not None and result.resolved


@dataclass
class TrialOutcome:
    trial_id: str
    task_id: str
    family: str
    rollout: TrialRollout
    result: VerifierResult | None
    chunks: list = field(default_factory=list)
    oldest_version: int = 0
    sample: int = 0  # which sample of its task (an eval pass's pass@k attempts)
    tito: dict[str, float] = field(default_factory=dict)

    @property
    def resolved(self) -> bool:
        return resolved_by(self.result)


class TrialRunner:
    """Runs trials of tasks through the ports; knows nothing of processes or sockets."""

    def __init__(self, ports: TrialPorts, tasks: dict[str, Any], tokenizer, limits: RolloutLimits, run_tag: str = "t",
                 tito_repairs: Sequence[str] = (), routing_in_turns: bool = False, max_open_failures: int = 10):
        self.ports, self.tasks, self.limits = ports, tasks, limits
        # sandboxes that cannot be opened: throttled while others are held, the run ended when none can be
        self.opens = SandboxOpens(max_open_failures)
        # a trained trial's turn records keep their routing rows too (stored again by its trajectory): the log
        # then holds all a restarted controller needs to resume it with R3 exact (rollout.resume)
        self.routing_in_turns = routing_in_turns
        self.tokenizer = as_chat_tokenizer(tokenizer)  # a bare tokenizers.Tokenizer is t1's own BPE
        tools = None if self.tokenizer.chat_template is None else [BASH_TOOL]  # an HF template lists the tool
        # t1's own template as itself: the harness then renders a growing chat message by message
        self.render = render_chat if tools is None else partial(self.tokenizer.apply_chat_template, tools=tools)
        self.tito_repairs = tuple(tito_repairs)  # () = exact sampler contexts (split where not strict)
        self._ids = itertools.count()
        # trial ids name sandbox roots in a base dir every run on the host shares: two runners (two runs of
        # one config started in the same second, two `t1-actor eval`s) must never issue the same id, or one
        # run's verifier scores the other's root
        self.run_tag = f"{run_tag}-{secrets.token_hex(4)}"

    def new_trial_id(self, split: str) -> str:
        """``<run_tag>-<8 random hex digits>-<split>-<n>``: unique across runners, processes and hosts."""
        return f"{self.run_tag}-{split}-{next(self._ids):06d}"

    async def open_sandbox(self, sandbox_id: str, task_id: str, *,
                           sent: Callable[[bool], None] | None = None) -> str | None:
        """Open a trial's sandbox: None once open, or why the sandbox's infrastructure could not (the trial then
        ends as an infrastructure failure: ``end_unopened``). Throttled while opens fail (``rollout.opens``);
        ``sent(True)`` is called as a request goes out, ``sent(False)`` when it was refused. A refusal that other
        trials' ends undo (the disk budget: ``opens.may_wait``) is asked again, after the backoff, for up to
        ``opens.wait_s``: an eval pass keeps every task, a batch its trial."""
        first_refusal: float | None = None
        while True:
            async with self.opens.turn():
                if sent is not None:
                    sent(True)
                try:
                    # shielded: a trial cut between the request and its answer left its continuation guessing
                    # whether the sandbox exists (it guessed yes, and played and verified a refused one); the
                    # cut lands at the next checkpoint, with open_sent true only for a sandbox that opened
                    with trio.CancelScope(shield=True):
                        await self.ports.open_sandbox(sandbox_id, task_id)
                except SandboxUnavailable as error:
                    if sent is not None:
                        sent(False)  # nothing opened: cut while it waits to ask again, a continuation opens it
                    self.opens.fail(str(error))
                    now = trio.current_time()
                    first_refusal = now if first_refusal is None else first_refusal
                    if not self.opens.may_wait(str(error), now - first_refusal):
                        return f"{SANDBOX_NOT_OPENED}: {error}"
                    continue  # the next turn waits out the backoff
                self.opens.succeeded(sandbox_id)
            return None

    async def end_unopened(self, trial_id: str, task_id: str, rollout: TrialRollout, why: str, *,
                           assemble: bool) -> TrialOutcome:
        """End a trial whose sandbox could not be opened: ``TrialEnded(finish="infra_error")``, never verified,
        scored or trained on; ``SandboxesUnavailable`` once no open succeeds any more (``rollout.opens``)."""
        rollout.finish, rollout.infra_error = "infra_error", why
        outcome = await self.finish(trial_id, task_id, rollout, assemble=assemble)
        self.opens.raise_if_exhausted()
        return outcome

    async def close_sandbox(self, sandbox_id: str) -> None:
        """Close a sandbox, shielded from the caller's cancellation; it counts as held until closed (what it holds
        of the disk budget is free only then)."""
        try:
            with trio.CancelScope(shield=True):
                await self.ports.close_sandbox(sandbox_id)
        finally:
            self.opens.closed(sandbox_id)

    def limits_of(self, task_id: str) -> RolloutLimits:
        """The run's budgets, with the task's own turn cap where it is lower."""
        max_turns = min(self.limits.max_turns, self.tasks[task_id].limits.max_turns)
        return RolloutLimits(**{**self.limits.__dict__, "max_turns": max_turns})

    async def play(self, trial_id: str, task_id: str, *, rollout: TrialRollout | None = None,
                   sandbox_id: str | None = None, seeded: bool = False, sample_index: int = 0,
                   temperature: float | None = None, trained: bool = False) -> TrialRollout:
        """The agent's turns only (sampler + sandbox); the sandbox stays open for the verifier.

        ``sandbox_id`` is the trial whose sandbox this one works in: a continuation keeps its original's.
        ``seeded``: each turn samples with ``eval_seed(task_id, turn, sample_index)`` (evals); else the
        sampler's own draws. ``temperature`` None: the run's sampling temperature. ``trained``: the trial is
        played to be trained, so its turns' routing rows are stored by its trajectory, not by each turn's record.
        """
        ports, task = self.ports, self.tasks[task_id]
        sandbox_id = sandbox_id or trial_id

        async def sample(prompt_ids: np.ndarray, turn: int) -> Generation:
            seed = eval_seed(task_id, turn, sample_index) if seeded else None
            previous = rollout_so_far.turns[-1] if rollout_so_far.turns else None
            prefix = TurnPrefix() if previous is None else TurnPrefix.after(
                previous.prompt_ids, previous.sampled_ids, previous.routing, previous.policy_version, prompt_ids)
            generation = await ports.generate(trial_id, turn, prompt_ids, seed=seed, temperature=temperature,
                                              prefix=prefix, record_routing=not trained or self.routing_in_turns)
            return rollout_so_far.routing_rows.full(generation, None if previous is None else previous.routing)

        async def execute(command: str, turn: int) -> ToolOutcome:
            return await ports.execute(sandbox_id, turn, command, task.limits.command_timeout_s)

        rollout_so_far = rollout if rollout is not None else TrialRollout()
        return await run_trial(task.instruction, sample=sample, execute=execute,
                               encode=self.tokenizer.encode, decode=self.tokenizer.decode,
                               limits=self.limits_of(task_id), rollout=rollout_so_far, render=self.render)

    async def finish(self, trial_id: str, task_id: str, rollout: TrialRollout, *, assemble: bool,
                     sandbox_id: str | None = None) -> TrialOutcome:
        """Verify the final workspace, then (for training) assemble the TITO trajectory."""
        task = self.tasks[task_id]
        result = None
        edits = [ContextEdited(trial_id=trial_id, turn=e.turn, strategy=e.strategy, tokens_before=e.tokens_before,
                               tokens_after=e.tokens_after, messages_edited=e.messages_edited)
                 for e in rollout.context_edits]
        await self.ports.log(*edits, TrialEnded(trial_id=trial_id, finish=rollout.finish, turns=len(rollout.turns),
                                                infra_error=rollout.infra_error, truncations=dict(rollout.truncations),
                                                context_edits=len(edits), tokens=rollout.tokens,
                                                duration_s=time.monotonic() - rollout.started))
        if rollout.infra_error is None and rollout.turns:
            result = await self.ports.verify(trial_id, task_id,
                                             sandbox_id=sandbox_id if sandbox_id != trial_id else None)
        outcome = TrialOutcome(trial_id, task_id, task.family or "", rollout, result)
        if assemble and result is not None and result.infra_error is None:
            outcome.chunks = tito.assemble(rollout.turns, self.tokenizer, reward=result.reward, repairs=self.tito_repairs)
            outcome.tito = tito.tito_metrics(outcome.chunks)
            outcome.oldest_version = min(t.policy_version for t in rollout.turns)
        return outcome


@dataclass
class InFlight:
    """A train trial being played (or cancelled and waiting for its continuation): its partial rollout lives here."""

    trial_id: str
    task_id: str
    rollout: TrialRollout = field(default_factory=TrialRollout)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    sandbox_id: str = ""  # the original trial's: a continuation works on in the same sandbox
    continuations: int = 0
    why: str = ""  # why it is continued, when not because the batch was cut (a controller's restart)
    played: bool = False  # its agent loop had ended (rebuilt from the log): the continuation only verifies it
    open_sent: bool = True  # its SandboxOpen went out (False: cut while waiting to open; a continuation opens it)

    def __post_init__(self) -> None:
        self.sandbox_id = self.sandbox_id or self.trial_id


@dataclass
class BatchStats:
    batches: int = 0
    admitted: int = 0
    dropped: int = 0
    cancelled: int = 0
    resumed: int = 0
    bias: LengthBias = field(default_factory=LengthBias)
    tito: list[dict[str, float]] = field(default_factory=list)


@dataclass
class _Batch:
    size: int
    target: int
    admitted: int = 0
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    changed: trio.Event = field(default_factory=trio.Event)

    def poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


async def _train_trial(runner: TrialRunner, flight: InFlight, batch: _Batch, config: StalenessConfig,
                       stats: BatchStats) -> None:
    ports = runner.ports
    outcome = None
    with flight.scope:
        if not flight.open_sent:
            unopened = await runner.open_sandbox(flight.sandbox_id, flight.task_id,
                                                 sent=partial(setattr, flight, "open_sent"))
            if unopened is not None:  # an infrastructure failure, logged; the batch issues another trial
                # (open_sent is False: cut while its ending is logged, a continuation opens its sandbox anew)
                await runner.end_unopened(flight.trial_id, flight.task_id, flight.rollout, unopened, assemble=True)
                del batch.in_flight[flight.trial_id]
                batch.poke()
                return
        rollout = flight.rollout if flight.played else await runner.play(
            flight.trial_id, flight.task_id, rollout=flight.rollout, sandbox_id=flight.sandbox_id, trained=True)
        if rollout.finish == "cancelled":
            return  # stays in flight: the batch's end records the cancellation
        flight.played = True  # cut from here on (while verified), a continuation only verifies it
        outcome = await runner.finish(flight.trial_id, flight.task_id, rollout, assemble=True,
                                      sandbox_id=flight.sandbox_id)
    if outcome is None:
        return  # cancelled with the tail: stays in flight, the batch's end records it
    del batch.in_flight[flight.trial_id]
    try:
        if not outcome.chunks:  # infrastructure failure: its actor recorded it under this trial's id (a
            return              # continuation's too: the verifier names the result by the trial, not the sandbox)
        lag = policy_lag(ports.learner_version(), outcome.oldest_version)
        within = admit(lag, config.max_staleness)
        ok = within and batch.admitted < batch.size
        batch.admitted += ok
        stats.admitted += ok
        stats.dropped += not ok
        decision = "admit" if ok else "drop"
        reason = "" if ok else (f"lag {lag} > max_staleness {config.max_staleness}" if not within else "batch full")
        stats.bias.record(decision, len(rollout.turns), rollout.tokens)
        stats.tito.append(outcome.tito)
        events = [tito.to_event(c, trial_id=flight.trial_id, task_id=flight.task_id) for c in outcome.chunks]
        events.append(StalenessDecision(trial_id=flight.trial_id, decision=decision, lag=lag,
                                        policy_version=outcome.oldest_version, reason=reason,
                                        turns=len(rollout.turns), tokens=rollout.tokens))
        await ports.log(*events)
    finally:
        await runner.close_sandbox(flight.sandbox_id)
        batch.poke()


async def run_batches(runner: TrialRunner, next_task: Callable[[], str], config: StalenessConfig, *,
                      until: Callable[[], bool], wait_for_learner: Callable[[int], Awaitable[None]],
                      stats: BatchStats | None = None, max_batches_ahead: int = 1,
                      resumed: Sequence[InFlight] = (),
                      between_batches: Callable[[], Awaitable[None]] | None = None,
                      first_batch: int = 0) -> BatchStats:
    """Asynchronous rollouts for PPO, one batch at a time.

    Batch n keeps ``trials_to_launch(B, oversample)`` trials going (topped up when one is dropped), admits
    a finished trajectory iff its policy lag is within ``max_staleness``, and once B are admitted cancels
    the tail: each cancelled trial is recorded, then dropped or (``on_cancel = "continue"``) resumed in the
    next batch with its tokens and per-token versions kept. Batch n starts only once the learner has
    reached version n - max_batches_ahead, so rollouts never run further ahead than that. ``resumed``:
    trials already cancelled (their decision logged) that the first batch continues the same way, e.g. those
    a killed controller left mid-trajectory, rebuilt from the log (``rollout.resume``).
    ``between_batches``: awaited after each full batch, before the next is issued (a validation probe): no
    train trial runs meanwhile (the cut tail waits for its continuation, its sandbox kept). ``first_batch``: the
    number of the first batch (the steps a restarted controller's predecessors took: ``schedule.steps_taken``).
    """
    stats = stats or BatchStats()
    ports = runner.ports
    resumable: list[InFlight] = list(resumed)
    runner.opens.held.update(f.sandbox_id for f in resumed)  # open: their sandboxes survived the restart
    number = first_batch
    while not until():
        await wait_for_learner(number - max_batches_ahead)
        if until():
            break
        launch = trials_to_launch(config.batch_size, config.oversample, config.max_in_flight)
        batch = _Batch(config.batch_size, launch)
        async with trio.open_nursery() as nursery:
            for cancelled in resumable:
                # A continuation is a new trial id (a cancelled id stays cancelled at every actor), linked by
                # resumed_from, working in the original's sandbox with the original's turns and versions.
                flight = InFlight(f"{cancelled.sandbox_id}~c{cancelled.continuations + 1}", cancelled.task_id,
                                   cancelled.rollout, sandbox_id=cancelled.sandbox_id,
                                   continuations=cancelled.continuations + 1, played=cancelled.played,
                                   open_sent=cancelled.open_sent)
                await ports.log(StalenessDecision(trial_id=cancelled.trial_id, decision="resume", lag=0,
                                                  policy_version=ports.learner_version(),
                                                  turns=len(flight.rollout.turns), tokens=flight.rollout.tokens,
                                                  reason=f"continued as {flight.trial_id}{cancelled.why}"),
                                TrialIssued(trial_id=flight.trial_id, task_id=flight.task_id, split="train",
                                            policy_version_wanted=ports.learner_version(),
                                            resumed_from=cancelled.trial_id))
                stats.resumed += 1
                batch.in_flight[flight.trial_id] = flight
                nursery.start_soon(partial(_train_trial, runner, flight, batch, config, stats))
            resumable = []
            while batch.admitted < batch.size and not until():
                while len(batch.in_flight) + batch.admitted < batch.target:
                    task_id = next_task()
                    flight = InFlight(runner.new_trial_id("train"), task_id, open_sent=False)
                    await ports.log(TrialIssued(trial_id=flight.trial_id, task_id=task_id, split="train",
                                                policy_version_wanted=ports.learner_version()))
                    batch.in_flight[flight.trial_id] = flight
                    nursery.start_soon(partial(_train_trial, runner, flight, batch, config, stats))
                with trio.move_on_after(1.0):
                    await batch.changed.wait()
            for flight in list(batch.in_flight.values()):  # the batch is full (or time is up): cut the tail
                flight.scope.cancel()
                keep = config.on_cancel == "continue" and not until()
                with trio.move_on_after(5.0):
                    await ports.cancel(flight.trial_id, sandbox_id=None if keep else flight.sandbox_id)
        for flight in list(batch.in_flight.values()):
            keep = config.on_cancel == "continue" and not until()
            await ports.log(StalenessDecision(trial_id=flight.trial_id, decision="cancel", lag=0,
                                              policy_version=ports.learner_version(),
                                              turns=len(flight.rollout.turns), tokens=flight.rollout.tokens,
                                              reason="batch full; kept for continuation" if keep else "batch full"))
            stats.cancelled += 1
            stats.bias.record("cancel", len(flight.rollout.turns), flight.rollout.tokens)
            if keep:
                resumable.append(flight)
            else:
                await runner.close_sandbox(flight.sandbox_id)
        if batch.admitted >= batch.size:
            number += 1
            stats.batches += 1
            if between_batches is not None:
                await between_batches()
    for flight in resumable:
        await runner.close_sandbox(flight.sandbox_id)
    return stats
