"""The system's state rebuilt by folding the log: ``state = reduce(apply, events[:k+1], RunState())``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schemas import (
    ActorLifecycle,
    CriticValues,
    CriticWarmup,
    EvalResult,
    Event,
    LearnerStep,
    SamplerTurn,
    SandboxExec,
    StalenessDecision,
    TrajectoryAssembled,
    TrialIssued,
    VerifierResult,
    WeightsPublished,
)


@dataclass
class TrialState:
    task_id: str = ""
    split: str = ""
    version_wanted: int = 0
    turns: int = 0
    tokens: int = 0
    commands: int = 0
    status: str = "issued"  # issued | sampling | verified | assembled | admitted | dropped | cancelled | resumed
    reward: float | None = None
    versions: set = field(default_factory=set)


@dataclass
class RunState:
    events: int = 0
    counts: Counter = field(default_factory=Counter)
    policy_version: int | None = None
    weights_location: str | None = None
    learner_step: int | None = None
    last_metrics: dict = field(default_factory=dict)
    critic_version: int | None = None
    critic_warmup: dict | None = None
    trials: dict[str, TrialState] = field(default_factory=dict)
    decisions: Counter = field(default_factory=Counter)
    actors: dict[str, str] = field(default_factory=dict)
    last_eval: dict | None = None
    reward_sum: float = 0.0
    reward_n: int = 0

    def trial(self, trial_id: str) -> TrialState:
        return self.trials.setdefault(trial_id, TrialState())

    def to_json(self, *, trial_limit: int = 50) -> dict:
        status = Counter(t.status for t in self.trials.values())
        open_trials = [tid for tid, t in self.trials.items() if t.status in ("issued", "sampling")]
        return {
            "events": self.events,
            "counts": dict(self.counts),
            "policy_version": self.policy_version,
            "weights_location": self.weights_location,
            "learner_step": self.learner_step,
            "last_learner_metrics": self.last_metrics,
            "critic_version": self.critic_version,
            "critic_warmup": self.critic_warmup,
            "trials": {"total": len(self.trials), "by_status": dict(status)},
            "in_flight": open_trials[:trial_limit],
            "in_flight_count": len(open_trials),
            "staleness_decisions": dict(self.decisions),
            "mean_reward": self.reward_sum / self.reward_n if self.reward_n else None,
            "verified": self.reward_n,
            "actors": self.actors,
            "last_eval": self.last_eval,
        }


_FOLDS: dict[type, Callable[[RunState, Any], None]] = {}


def folds(event_type: type[Event]):
    """Register ``fn(state, event)`` as what an event of this type means for the state."""
    def register(fn):
        _FOLDS[event_type] = fn
        return fn
    return register


def apply(state: RunState, event: Event) -> RunState:
    """Fold one event into the state (the ``@folds`` functions below are the only place that knows what
    each event means for it; an event type without one only counts)."""
    state.events += 1
    state.counts[event.kind] += 1
    fold = _FOLDS.get(type(event))
    if fold is not None:
        fold(state, event)
    return state


@folds(TrialIssued)
def _issued(state: RunState, event: TrialIssued) -> None:
    t = state.trial(event.trial_id)
    t.task_id, t.split, t.version_wanted = event.task_id, event.split, event.policy_version_wanted


@folds(SamplerTurn)
def _sampled(state: RunState, event: SamplerTurn) -> None:
    t = state.trial(event.trial_id)
    t.turns = max(t.turns, event.turn + 1)
    t.tokens += len(event.sampled_ids)
    t.versions.add(event.policy_version)
    if t.status == "issued":
        t.status = "sampling"
    if event.finish_reason == "cancelled":
        t.status = "cancelled"


@folds(SandboxExec)
def _executed(state: RunState, event: SandboxExec) -> None:
    state.trial(event.trial_id).commands += 1


@folds(VerifierResult)
def _verified(state: RunState, event: VerifierResult) -> None:
    t = state.trial(event.trial_id)
    t.task_id = t.task_id or event.task_id
    t.reward = event.reward
    if t.status in ("issued", "sampling"):
        t.status = "verified"
    state.reward_sum += event.reward
    state.reward_n += 1


@folds(TrajectoryAssembled)
def _assembled(state: RunState, event: TrajectoryAssembled) -> None:
    t = state.trial(event.trial_id)
    if t.status in ("issued", "sampling", "verified"):
        t.status = "assembled"


@folds(StalenessDecision)
def _decided(state: RunState, event: StalenessDecision) -> None:
    state.decisions[event.decision] += 1
    # resume: this (cancelled) trial goes on as a new trial (TrialIssued.resumed_from names this one)
    state.trial(event.trial_id).status = {"admit": "admitted", "drop": "dropped", "cancel": "cancelled",
                                          "resume": "resumed"}[event.decision]


@folds(LearnerStep)
def _stepped(state: RunState, event: LearnerStep) -> None:
    state.learner_step = event.step
    state.policy_version = max(state.policy_version or 0, event.policy_version)
    state.last_metrics = dict(event.metrics)


@folds(WeightsPublished)
def _published(state: RunState, event: WeightsPublished) -> None:
    if state.policy_version is None or event.version >= state.policy_version:
        state.policy_version = event.version
        state.weights_location = event.location


@folds(CriticValues)
def _valued(state: RunState, event: CriticValues) -> None:
    state.critic_version = max(state.critic_version or 0, event.critic_version)


@folds(CriticWarmup)
def _critic_warmed(state: RunState, event: CriticWarmup) -> None:
    state.critic_warmup = {"epochs": event.epochs, "trajectories": event.trajectories,
                           "explained_variance_before": event.explained_variance_before,
                           "explained_variance_after": event.explained_variance_after}


@folds(EvalResult)
def _evaluated(state: RunState, event: EvalResult) -> None:
    state.last_eval = {"label": event.label, "policy_version": event.policy_version, "n": event.n,
                       "resolved": event.resolved, "mean_reward": event.mean_reward,
                       "ci": [event.ci_low, event.ci_high]}


@folds(ActorLifecycle)
def _lifecycle(state: RunState, event: ActorLifecycle) -> None:
    state.actors[event.actor] = event.state


def fold_state(events: list[tuple[str, Event]], upto: int | None = None) -> RunState:
    """The state after events[0..upto] (inclusive; all when None)."""
    state = RunState()
    for _, event in events[: None if upto is None else upto + 1]:
        apply(state, event)
    return state
