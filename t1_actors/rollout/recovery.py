"""A restarted staleness controller closes what its previous incarnation left open (and did not resume).

With ``[staleness] resume_after_restart`` (off by default: its log cost), the train trials still in their agent
loop are first continued mid-trajectory where their sandbox survives (``rollout.resume``); what is closed here is
the rest.

A controller killed mid-pass leaves trials issued with no final state: their rollouts lived in the dead
process's memory, so nobody will ever decide them. Before it plays on, the new controller reads the log
and closes each one with a recorded reason, so every trial issued still reaches exactly one final state
(the rules ``t1-replay audit`` checks):

- a train trial never decided (no admit, drop or cancel) is cancelled and closed:
  ``StalenessDecision(decision="cancel", reason="abandoned: ...")``; nothing of it reaches the learner;
- an eval or warm-up trial whose agent loop never ended gets ``TrialEnded(finish="abandoned",
  infra_error=...)``: a failure with its reason, never a reward of 0;
- an eval or warm-up trial whose loop ended and whose verification was asked for is the verifier's: it logs
  its result whoever asked. The controller waits for it (up to ``wait_s``) and closes the trial the same way
  only if none comes.

Their sandboxes are closed too (a continuation works in its original's sandbox). The final-state rules here
mirror the audit's on purpose: the audit (tools/_replay/audit.py) is the judge, this is the actor's own
bookkeeping.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import trio

from schemas import Event, StalenessDecision, TrialEnded, TrialIssued, VerifierResult

ABANDONED = "abandoned: the staleness controller that issued it died before deciding it"


@dataclass(frozen=True)
class OpenTrial:
    trial_id: str
    split: str
    sandbox_id: str  # the sandbox it works in: its own, or its original's for a continuation
    ended: bool  # its agent loop ended (TrialEnded logged): a verification may be on its way


def open_trials(events: Iterable[Event]) -> list[OpenTrial]:
    """Trials issued with no final state yet, in issue order."""
    issued: dict[str, TrialIssued] = {}
    final: set[str] = set()
    ended: set[str] = set()
    for event in events:
        if isinstance(event, TrialIssued):
            issued[event.trial_id] = event
        elif isinstance(event, StalenessDecision) and event.decision in ("admit", "drop", "cancel"):
            final.add(event.trial_id)
        elif isinstance(event, VerifierResult):
            trial = issued.get(event.trial_id)
            if event.infra_error is not None or (trial is not None and trial.split != "train"):
                final.add(event.trial_id)  # a train trial's final state is the controller's decision
        elif isinstance(event, TrialEnded):
            ended.add(event.trial_id)
            if event.infra_error is not None:
                final.add(event.trial_id)
    root = {t: (trial.resumed_from or t) for t, trial in issued.items()}

    def sandbox_of(trial_id: str) -> str:
        while root.get(trial_id, trial_id) != trial_id:
            trial_id = root[trial_id]
        return trial_id

    return [OpenTrial(t, trial.split, sandbox_of(t), t in ended) for t, trial in issued.items() if t not in final]


def closing_event(trial: OpenTrial, version: int, why: str = ABANDONED) -> Event:
    """The final state that closes an abandoned trial, with its reason."""
    if trial.split == "train":
        return StalenessDecision(trial_id=trial.trial_id, decision="cancel", lag=0, policy_version=version,
                                 reason=why)
    return TrialEnded(trial_id=trial.trial_id, finish="abandoned", infra_error=why)


async def close_abandoned(pending: list[OpenTrial], events: Callable[[], Awaitable[list[Event]]],
                          log: Callable[..., Awaitable[None]], close_sandbox: Callable[[str], Awaitable[None]],
                          version: int, *, wait_s: float = 60.0, poll_s: float = 1.0) -> list[str]:
    """Close the ``pending`` trials (``open_trials`` of the log read before this controller issued any
    trial of its own: every one belongs to a dead controller); returns the ids closed here.

    ``events()`` reads the log's trial events now; ``log(*events)`` appends and commits them. The trials
    awaiting their verifier are waited for up to ``wait_s``. Await it before playing on: run beside the
    schedule, a short last pass could end the campaign (and cancel this) before the wait is over."""
    closed: list[str] = []
    waiting = [t for t in pending if t.split != "train" and t.ended]
    now = [t for t in pending if t not in waiting]
    if now:
        await log(*[closing_event(t, version) for t in now])
        closed += [t.trial_id for t in now]
    with trio.move_on_after(wait_s):
        while waiting:
            still = {t.trial_id for t in open_trials(await events())}
            waiting = [t for t in waiting if t.trial_id in still]
            if waiting:
                await trio.sleep(poll_s)
    if waiting:
        await log(*[closing_event(t, version, ABANDONED + "; its verification never reported") for t in waiting])
        closed += [t.trial_id for t in waiting]
    for sandbox_id in dict.fromkeys(t.sandbox_id for t in pending):
        await close_sandbox(sandbox_id)
    return closed
