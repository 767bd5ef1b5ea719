"""A restarted staleness controller resumes the train trials its dead predecessor left mid-trajectory.

A trial's state is its logged turns (``SamplerTurn``: the prompt the sampler saw, the ids it sampled, their
logprobs, routing rows and policy version) plus its sandbox's workspace (each command's output is a
``SandboxExec``). ``rebuild_rollout`` plays the agent loop again (``loop.run_trial``) against the log instead of
the engines: each turn's prompt is rendered and tokenized anew from the chat so far and must equal the logged
one id for id (else ``RebuildError``); each sampled turn is the logged record, each command's output the logged
one. The replay stops at the first turn or command the log does not hold: the one in flight at the kill. What
it returns is the in-memory rollout the dead controller held (context edits, truncation counts and per-turn
versions and routing included), which ``run_batches`` continues as a continuation, the mechanism of
``on_cancel = "continue"``: a new trial id, ``TrialIssued.resumed_from``, a ``resume`` decision. Only the turn in
flight is sampled again.

``resume_open_trials`` applies it to the train trials still in their agent loop:

- sandbox still held by the sandbox actor: cancelled with reason ``RESTARTED`` ("kept for continuation") and
  returned as a flight for the first batch, which samples the turn in flight again, or runs the commands of the
  last turn that have no output in the log (``TrialRollout.outputs_so_far`` holds those that have);
- a command running at the kill goes on at the sandbox actor, which logs its output when it ends: the replay is
  retried until the task's command timeout (plus a grace) has passed. The sandbox actor is asked which
  sandboxes it holds only then: one it holds has logged every command it started (a restarted sandbox actor
  holds none of its predecessor's, or restores them to before the command in flight), so a command still
  without output never started, and running it is running it once;
- sandbox gone: an infrastructure failure (``TrialEnded``, ``WORKSPACE_LOST``), never scored;
- a loop that had ended without its ending logged (the sampler logged the turn in flight after the kill: an
  answer, or the last turn the budgets allow): continued the same way, straight to its verification;
- a log that does not replay (``RebuildError``): closed as before (``recovery.closing_event``) with the reason.

Eval and warm-up trials are not resumed: a restarted controller plays an unfinished eval pass or warm-up again
from its start (its aggregate lived in the dead process), so their open trials are closed as before
(``recovery.close_abandoned``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import trio

from schemas import Event, SamplerTurn, SandboxExec, StalenessDecision, TrialEnded, TrialIssued
from t1_actors import tito
from t1_actors.policy.generation import Generation
from t1_actors.rollout.loop import ToolOutcome, TrialRollout, run_trial
from t1_actors.rollout.recovery import ABANDONED, OpenTrial, closing_event
from t1_actors.rollout.trials import InFlight, TrialRunner

RESTARTED = "the staleness controller that played it died mid-trajectory"
WORKSPACE_LOST = "workspace lost"
COMMAND_GRACE_S = 10.0  # beyond a command's own timeout: the sandbox actor logging its output


class RebuildError(Exception):
    """The log does not replay into the trial the dead controller held (a prompt or a lineage differs)."""


class _EndOfLog(Exception):
    """The replay reached what the log does not hold: the turn (or the command) in flight at the kill."""

    def __init__(self, turn: int, command: str | None = None):
        super().__init__(turn, command)
        self.turn, self.command = turn, command


@dataclass
class Rebuilt:
    """A rollout replayed from the log, and where the log ran out: at sampling turn ``turn`` (``"turn"``), at a
    command of turn ``turn`` (``"command"``: it was running), or nowhere (``"none"``: the agent loop had ended)."""

    rollout: TrialRollout
    in_flight: Literal["turn", "command", "none"]
    turn: int
    command: str | None = None


def lineage(trial_id: str, issued: dict[str, TrialIssued]) -> list[str]:
    """The trial and the trials it continues (``resumed_from``), oldest first."""
    chain: list[str] = []
    current: str | None = trial_id
    while current is not None and current not in chain:
        chain.append(current)
        trial = issued.get(current)
        current = trial.resumed_from if trial is not None else None
    return chain[::-1]


def logged_turns(records: Sequence[SamplerTurn]) -> list[SamplerTurn]:
    """The turns the agent saw, each whole (``tito.expand_turns``): for each turn number the record of the latest
    trial of the lineage (``records`` in lineage order: a continuation samples again the turn its original was
    cut in), from turn 0 up to the first turn without a completed record (none, cancelled or failed)."""
    by_turn = {record.turn: record for record in records}
    kept: list[SamplerTurn] = []
    while (record := by_turn.get(len(kept))) is not None and record.finish_reason in ("stop", "length"):
        kept.append(record)
    try:
        return tito.expand_turns(kept)
    except tito.TitoError as error:
        raise RebuildError(str(error)) from error


def _outputs_of_turn(records: list[SandboxExec], commands: list[str]) -> list[SandboxExec]:
    """The records of one turn's commands the agent is to see: the longest tail of the turn's records whose
    commands are the turn's first ones, in order (an earlier attempt at the turn, by a trial cut from its batch
    while the command ran, comes before the continuation's)."""
    for n in range(min(len(records), len(commands)), 0, -1):
        if [r.command for r in records[-n:]] == commands[:n]:
            return records[-n:]
    return []


async def rebuild_rollout(runner: TrialRunner, task_id: str, turns: Sequence[SamplerTurn],
                          execs: Sequence[SandboxExec]) -> Rebuilt:
    """Replay the agent loop of a trial of ``task_id`` from its lineage's turn records (``turns``, in lineage
    order) and its sandbox's command records (``execs``, in log order). Raises ``RebuildError`` when a prompt the
    loop renders differs from the one the sampler saw: the rollout would not be the one that was played."""
    whole = logged_turns(turns)
    by_turn: dict[int, list[SandboxExec]] = {}
    for record in execs:
        by_turn.setdefault(record.turn, []).append(record)
    rollout = TrialRollout()
    chosen: dict[int, list[SandboxExec]] = {}
    outputs: dict[int, list[str]] = {}  # each turn's outputs replayed so far

    async def sample(prompt_ids: np.ndarray, turn: int) -> Generation:
        if turn >= len(whole):
            raise _EndOfLog(turn)
        record = whole[turn]
        if not np.array_equal(prompt_ids, record.prompt_ids):
            raise RebuildError(f"turn {turn}: the prompt rendered from the log ({len(prompt_ids)} ids) is not the "
                               f"one the sampler saw ({len(record.prompt_ids)} ids)")
        return Generation(len(prompt_ids), record.sampled_ids, record.sampler_logprobs, record.routing,
                          record.finish_reason, record.policy_version, record.error)

    async def execute(command: str, turn: int) -> ToolOutcome:
        if turn not in chosen:
            chosen[turn] = _outputs_of_turn(by_turn.get(turn, []), rollout.turns[turn].commands)
        if not chosen[turn]:
            rollout.outputs_so_far = outputs.get(turn, [])  # a continuation runs only the turn's other commands
            raise _EndOfLog(turn, command)
        record = chosen[turn].pop(0)
        outcome = ToolOutcome(record.exit_code, record.stdout + record.stderr, record.infra_error)
        outputs.setdefault(turn, []).append(outcome.output)
        return outcome

    try:
        await run_trial(runner.tasks[task_id].instruction, sample=sample, execute=execute,
                        encode=runner.tokenizer.encode, decode=runner.tokenizer.decode,
                        limits=runner.limits_of(task_id), rollout=rollout, render=runner.render)
    except _EndOfLog as end:
        return Rebuilt(rollout, "turn" if end.command is None else "command", end.turn, end.command)
    return Rebuilt(rollout, "none", len(rollout.turns))


def _what_again(rebuilt: Rebuilt) -> str:
    if rebuilt.in_flight == "none":
        return f"its agent loop had ended ({rebuilt.rollout.finish}): verified as it is"
    if rebuilt.in_flight == "command":
        done = len(rebuilt.rollout.outputs_so_far)
        return f"turn {rebuilt.turn}'s commands from {rebuilt.command!r} (its command {done}) on run"
    return f"turn {rebuilt.turn} sampled again"


TrialEvents = Callable[[str], Awaitable[list[Event]]]  # every logged event of one trial id, in log order


async def rebuild_trial(runner: TrialRunner, trial_id: str, trial_events: TrialEvents
                        ) -> tuple[TrialIssued, list[str], Rebuilt]:
    """Read a trial's lineage from the log and replay it: its issue, its lineage (oldest first), the rebuild."""
    issued: dict[str, TrialIssued] = {}
    events: dict[str, list[Event]] = {}
    current: str | None = trial_id
    while current is not None and current not in events:
        events[current] = await trial_events(current)
        found = [e for e in events[current] if isinstance(e, TrialIssued)]
        if not found:
            raise RebuildError(f"trial {current} has no TrialIssued in the log")
        issued[current] = found[0]
        current = found[0].resumed_from
    chain = lineage(trial_id, issued)
    turns = [e for t in chain for e in events[t] if isinstance(e, SamplerTurn)]
    execs = [e for e in events[chain[0]] if isinstance(e, SandboxExec)]  # a lineage works in its root's sandbox
    return issued[trial_id], chain, await rebuild_rollout(runner, issued[trial_id].task_id, turns, execs)


async def resume_open_trials(pending: Sequence[OpenTrial], runner: TrialRunner, *, trial_events: TrialEvents,
                             open_sandboxes: Callable[[list[str]], Awaitable[set[str]]],
                             close_sandbox: Callable[[str], Awaitable[None]], version: int,
                             command_wait_s: float | None = None, poll_s: float = 1.0
                             ) -> tuple[list[InFlight], list[OpenTrial]]:
    """Resume what can be of the trials a dead controller left open (``pending``, from ``recovery.open_trials``).

    Returns the flights ``run_batches(resumed=...)`` continues (each already cancelled in the log with reason
    ``RESTARTED``) and the trials left to ``recovery.close_abandoned`` (eval and warm-up trials, train trials
    whose ending is logged). The others reach their final state here, with their reason, and their sandboxes are
    closed. ``open_sandboxes(ids)``: which of these sandboxes the sandbox actor still holds. ``command_wait_s``:
    how long a command running at the kill may take to log its output (None: the task's command timeout plus
    ``COMMAND_GRACE_S``)."""
    candidates = [t for t in pending if t.split == "train" and not t.ended]
    left = [t for t in pending if t not in candidates]
    rebuilt: dict[str, tuple[TrialIssued, list[str], Rebuilt] | RebuildError] = {}

    async def rebuild(trial: OpenTrial) -> None:
        try:
            rebuilt[trial.trial_id] = await rebuild_trial(runner, trial.trial_id, trial_events)
        except RebuildError as error:
            rebuilt[trial.trial_id] = error

    def waiting_until(trial: OpenTrial) -> float | None:
        """When waiting for the trial's command in flight to log its output ends (None: nothing to wait for)."""
        state = rebuilt[trial.trial_id]
        if isinstance(state, RebuildError) or state[2].in_flight != "command":
            return None
        wait_s = command_wait_s
        if wait_s is None:
            wait_s = runner.tasks[state[0].task_id].limits.command_timeout_s + COMMAND_GRACE_S
        return start + wait_s

    start = trio.current_time()
    for trial in candidates:
        await rebuild(trial)
    while waiting := [t for t in candidates if (until := waiting_until(t)) is not None and trio.current_time() < until]:
        await trio.sleep(poll_s)  # the sandbox actor logs a command's output when the command ends
        for trial in waiting:
            await rebuild(trial)
    # Asked after the wait: a sandbox the actor still holds has served every command it started, and logged it
    # (a killed sandbox actor's sandboxes are gone, or restored to before the command in flight), so a command
    # still without a record never started: the continuation runs it.
    alive = await open_sandboxes(sorted({t.sandbox_id for t in candidates}))
    flights: list[InFlight] = []
    for trial in candidates:
        state = rebuilt[trial.trial_id]
        if trial.sandbox_id not in alive:
            await runner.ports.log(TrialEnded(trial_id=trial.trial_id, finish="infra_error", infra_error=(
                f"{WORKSPACE_LOST}: sandbox {trial.sandbox_id} is no longer held by the sandbox actor")))
            continue
        if isinstance(state, RebuildError):
            await runner.ports.log(closing_event(trial, version, f"{ABANDONED}; not resumed: {state}"))
            await close_sandbox(trial.sandbox_id)
            continue
        issue, chain, replayed = state
        rollout = replayed.rollout
        with trio.move_on_after(5.0):  # the dead controller's turn in flight, if the sampler still plays it
            await runner.ports.cancel(trial.trial_id)
        await runner.ports.log(StalenessDecision(
            trial_id=trial.trial_id, decision="cancel", lag=0, policy_version=version, turns=len(rollout.turns),
            tokens=rollout.tokens, reason=f"{RESTARTED}; kept for continuation"))
        flights.append(InFlight(trial.trial_id, issue.task_id, rollout, sandbox_id=trial.sandbox_id,
                                continuations=len(chain) - 1, played=replayed.in_flight == "none", why=(
                                    f" after the staleness controller's restart (rebuilt from the log: "
                                    f"{len(rollout.turns)} turns; {_what_again(replayed)})")))
    return flights, left
