"""Did RL change the eval split? Paired statistics over the same tasks evaluated before and after.

Two independent binomial intervals (``wilson_interval``) waste the pairing: every eval task is played
once before and once after RL, so the change is measured per task. Resolved flips are tested with the
exact McNemar test (only discordant tasks carry information); the reward change gets a normal-theory
interval over the per-task differences.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from schemas import TrialIssued, VerifierResult


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % by default)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


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
    resolved_delta: float = 0.0  # (gained - lost) / tasks: the change of the resolved rate
    resolved_delta_ci95: tuple[float, float] = (0.0, 0.0)

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
    reward, reward_half = paired_mean_ci([after[t].reward - before[t].reward for t in common], z)
    flips, flips_half = paired_mean_ci([float(after[t].resolved) - float(before[t].resolved) for t in common], z)
    return PairedChange(tasks=len(common), resolved_before=sum(before[t].resolved for t in common),
                        resolved_after=sum(after[t].resolved for t in common), gained=gained, lost=lost,
                        mcnemar_p=mcnemar_exact_p(gained, lost), reward_delta=reward,
                        reward_delta_ci95=(reward - reward_half, reward + reward_half), resolved_delta=flips,
                        resolved_delta_ci95=(flips - flips_half, flips + flips_half))


def paired_mean_ci(deltas: list[float], z: float = 1.96) -> tuple[float, float]:
    """Mean of per-task differences and its normal-theory half-width: mean +- z * sd / sqrt(n)."""
    mean = sum(deltas) / len(deltas)
    sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1)) if len(deltas) > 1 else 0.0
    return mean, z * sd / math.sqrt(len(deltas))


def eval_reward(result: VerifierResult) -> float:
    """What an eval scores a trial's reward by: the dense reward r = P / S (``t1_actors.train.reward.reward``),
    whatever reward the run trains on (``[verifier] reward``). A dense result's own reward, bit for bit; a
    binary one's P / S from its count, so the passes of a binary-reward run, the SFT passes it reads from a
    dense one and every arm of an ablation are on one scale."""
    if result.reward_kind == "dense":
        return result.reward
    return result.passed / result.reward_scale


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
        out.setdefault(trial.policy_version_wanted, {})[trial.task_id] = Outcome(result.resolved, eval_reward(result))
    return out


@dataclass(frozen=True)
class Attempt:
    """One scored eval trial: which task, which sample of it, and the verifier's per-test outcomes."""

    task_id: str
    sample: int
    resolved: bool
    reward: float
    tests: dict[str, str]


def labelled_attempts(events: Iterable) -> dict[str, list[Attempt]]:
    """Per eval pass (``TrialIssued.label``): its scored trials, one per attempt (task, sample). Infrastructure
    failures are left out, as the pass's own counts leave them out; trials of logs written before labels existed
    are left out too (``eval_outcomes`` groups those by version).

    An attempt issued twice under one label (a pass a restarted or relaunched staleness controller played again:
    its first trials were closed, or finished and then played again) counts once: the trial issued last, the
    one the pass's ``EvalResult`` counted (scored or not)."""
    issued: dict[tuple[str, str, int], TrialIssued] = {}
    results: dict[str, VerifierResult] = {}
    for event in events:
        if isinstance(event, TrialIssued) and event.split == "eval" and event.label:
            issued[(event.label, event.task_id, event.sample)] = event  # the last one issued wins
        elif isinstance(event, VerifierResult):
            results[event.trial_id] = event
    out: dict[str, list[Attempt]] = {}
    for trial in issued.values():
        trial_id = trial.trial_id
        result = results.get(trial_id)
        if result is None or result.infra_error is not None:
            continue
        out.setdefault(trial.label, []).append(Attempt(trial.task_id, trial.sample, result.resolved, eval_reward(result),
                                                       dict(result.tests)))
    return out


def first_attempts(attempts: Iterable[Attempt]) -> dict[str, Outcome]:
    """task id -> the outcome of its sample 0: what ``paired_change`` compares between two passes."""
    return {a.task_id: Outcome(a.resolved, a.reward) for a in attempts if a.sample == 0}


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples of which c passed (Chen et al. 2021):

        pass@k = 1 - C(n - c, k) / C(n, k)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_curve(attempts: Iterable[Attempt]) -> dict[int, float]:
    """pass@k for k = 1..n, averaged over tasks, n = the fewest samples any task has."""
    by_task: dict[str, list[bool]] = {}
    for a in attempts:
        by_task.setdefault(a.task_id, []).append(a.resolved)
    if not by_task:
        return {}
    n = min(len(v) for v in by_task.values())
    return {k: sum(pass_at_k(len(v), sum(v), k) for v in by_task.values()) / len(by_task) for k in range(1, n + 1)}


def part_of(test_id: str) -> int | None:
    """The requirement position of a composite task's test (``...::test_p2_first_line`` -> 2)."""
    name = test_id.rsplit("::", 1)[-1]
    if name.startswith("test_p") and "_" in name[6:]:
        head = name[6:].split("_", 1)[0]
        if head.isdigit():
            return int(head)
    return None


def per_position_rates(attempts: Iterable[Attempt]) -> dict[int, float]:
    """For composite tasks: the share of attempts whose requirement at position i passes all its tests."""
    done: dict[int, list[bool]] = {}
    for a in attempts:
        parts: dict[int, bool] = {}
        for test_id, outcome in a.tests.items():
            position = part_of(test_id)
            if position is not None:
                parts[position] = parts.get(position, True) and outcome == "passed"
        for position, passed in parts.items():
            done.setdefault(position, []).append(passed)
    return {position: sum(v) / len(v) for position, v in sorted(done.items())}
