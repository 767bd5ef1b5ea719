"""Did RL change the eval split? Paired statistics over the same tasks evaluated before and after.

Two independent binomial intervals (``wilson_interval``) waste the pairing: every eval task is played
once before and once after RL, so the change is measured per task. Resolved flips are tested with the
exact McNemar test (only discordant tasks carry information); the reward change gets a normal-theory
interval over the per-task differences.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable

from schemas import TrialIssued, VerifierResult


@dataclass(frozen=True)
class Outcome:
    resolved: bool
    reward: float


@dataclass(frozen=True)
class PairedChange:
    tasks: int  # evaluated both before and after
    resolved_before: int
    resolved_after: int
    gained: int  # unresolved before, resolved after
    lost: int  # resolved before, unresolved after
    mcnemar_p: float  # exact two-sided
    reward_delta: float  # mean over tasks of (after - before)
    reward_delta_ci95: tuple[float, float]

    def as_dict(self) -> dict:
        return asdict(self)


def mcnemar_exact_p(gained: int, lost: int) -> float:
    """Exact two-sided McNemar test: P(a split at least this uneven of the n = b + c discordant tasks).

        p = min(1, 2 * sum_{i <= min(b, c)} C(n, i) / 2^n)
    """
    if gained < 0 or lost < 0:
        raise ValueError(f"counts must be >= 0, got gained={gained}, lost={lost}")
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def paired_change(before: dict[str, Outcome], after: dict[str, Outcome], z: float = 1.96) -> PairedChange:
    """Compare the tasks present in both evaluations (keyed by task id)."""
    common = sorted(set(before) & set(after))
    if not common:
        raise ValueError("no task was evaluated both before and after; nothing to compare")
    gained = sum(not before[t].resolved and after[t].resolved for t in common)
    lost = sum(before[t].resolved and not after[t].resolved for t in common)
    deltas = [after[t].reward - before[t].reward for t in common]
    mean = sum(deltas) / len(deltas)
    sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1)) if len(deltas) > 1 else 0.0
    half = z * sd / math.sqrt(len(deltas))
    return PairedChange(tasks=len(common), resolved_before=sum(before[t].resolved for t in common),
                        resolved_after=sum(after[t].resolved for t in common), gained=gained, lost=lost,
                        mcnemar_p=mcnemar_exact_p(gained, lost), reward_delta=mean,
                        reward_delta_ci95=(mean - half, mean + half))


def eval_outcomes(events: Iterable) -> dict[int, dict[str, Outcome]]:
    """Per policy version an eval was run at (the version its trials were issued for): task -> outcome.

    Built from the log's ``TrialIssued`` (split ``eval``) and ``VerifierResult`` events; trials that
    failed for infrastructure reasons are left out, as the eval's own counts leave them out.
    """
    issued: dict[str, TrialIssued] = {}
    results: dict[str, VerifierResult] = {}
    for event in events:
        if isinstance(event, TrialIssued) and event.split == "eval":
            issued[event.trial_id] = event
        elif isinstance(event, VerifierResult):
            results[event.trial_id] = event
    out: dict[int, dict[str, Outcome]] = {}
    for trial_id, trial in issued.items():
        result = results.get(trial_id)
        if result is None or result.infra_error is not None:
            continue
        resolved = result.total > 0 and result.passed == result.total
        out.setdefault(trial.policy_version_wanted, {})[trial.task_id] = Outcome(resolved, result.reward)
    return out
