"""Paired before/after statistics of the eval split (t1_actors.stats)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import TrialIssued, VerifierResult
from t1_actors.stats import Outcome, eval_outcomes, mcnemar_exact_p, paired_change


def test_mcnemar_known_values():
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(10, 0) == pytest.approx(2 / 1024)
    assert mcnemar_exact_p(3, 3) == 1.0
    # 12 gained vs 3 lost: 2 * P(X <= 3), X ~ Bin(15, 1/2)
    assert mcnemar_exact_p(12, 3) == pytest.approx(2 * sum(math.comb(15, i) for i in range(4)) / 2 ** 15)
    with pytest.raises(ValueError, match="counts must be >= 0"):
        mcnemar_exact_p(-1, 2)


@given(st.integers(0, 200), st.integers(0, 200))
def test_mcnemar_is_symmetric_and_a_probability(b, c):
    p = mcnemar_exact_p(b, c)
    assert 0 < p <= 1 and p == mcnemar_exact_p(c, b)
    assert mcnemar_exact_p(b + 1, 0) <= mcnemar_exact_p(b, 0)


def test_paired_change_counts_flips_and_reward_differences():
    before = {"a": Outcome(False, 0.1), "b": Outcome(True, 0.3), "c": Outcome(False, 0.0), "d": Outcome(True, 0.2)}
    after = {"a": Outcome(True, 0.3), "b": Outcome(False, 0.1), "c": Outcome(True, 0.2), "e": Outcome(True, 0.5)}
    change = paired_change(before, after)
    assert change.tasks == 3  # d and e were evaluated only once
    assert (change.gained, change.lost) == (2, 1)
    assert (change.resolved_before, change.resolved_after) == (1, 2)
    assert change.reward_delta == pytest.approx((0.2 - 0.2 + 0.2) / 3)
    low, high = change.reward_delta_ci95
    assert low < change.reward_delta < high
    with pytest.raises(ValueError, match="no task was evaluated both"):
        paired_change({"x": Outcome(True, 1.0)}, {"y": Outcome(True, 1.0)})


def _result(trial, task, passed, total, infra=None):
    return VerifierResult(trial_id=trial, task_id=task, tests={}, passed=passed, total=total, reward=passed / 20,
                          reward_scale=20, verifier_sha256="0" * 64, infra_error=infra)


def test_eval_outcomes_groups_eval_trials_by_the_version_they_were_issued_for():
    events = [
        TrialIssued(trial_id="e0", task_id="t1", split="eval", policy_version_wanted=0),
        TrialIssued(trial_id="e1", task_id="t2", split="eval", policy_version_wanted=0),
        TrialIssued(trial_id="w0", task_id="t9", split="warmup", policy_version_wanted=0),
        TrialIssued(trial_id="e2", task_id="t1", split="eval", policy_version_wanted=7),
        TrialIssued(trial_id="e3", task_id="t2", split="eval", policy_version_wanted=7),
        _result("e0", "t1", 3, 3), _result("e1", "t2", 1, 4), _result("w0", "t9", 2, 2),
        _result("e2", "t1", 2, 3), _result("e3", "t2", 0, 0, infra="sandbox died"),
    ]
    outcomes = eval_outcomes(events)
    assert set(outcomes) == {0, 7}
    assert outcomes[0] == {"t1": Outcome(True, 0.15), "t2": Outcome(False, 0.05)}
    assert outcomes[7] == {"t1": Outcome(False, 0.1)}  # the infrastructure failure is not scored
