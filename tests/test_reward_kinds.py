"""`[verifier] reward = "dense" | "binary"`: the equations, the verifier's reward and its logged kind, the eval's
dense score of either, the audit's check of each, and old logs read as dense."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import TrialIssued, VerifierResult
from schemas.codec import from_wire, to_wire
from t1_actors.stats import eval_reward, labelled_attempts
from t1_actors.train import ppo
from t1_actors.verify.engine import Verifier, VerifierConfig
from tools._audit.verifier_checks import VerifierAudit, check_result


def test_binary_reward_pays_one_for_all_tests_passed_and_nothing_else():
    assert ppo.binary_reward(4, 4) == 1.0 and ppo.binary_reward(1, 1) == 1.0
    assert ppo.binary_reward(3, 4) == 0.0 and ppo.binary_reward(0, 4) == 0.0
    assert ppo.binary_reward(0, 0) == 0.0  # no test ran: not a pass
    for passed, total in [(-1, 2), (3, 2), (0, -1)]:
        with pytest.raises(ValueError, match="0 <= passed <= total"):
            ppo.binary_reward(passed, total)
    with pytest.raises(ValueError, match="'dense' or 'binary'"):
        ppo.task_reward("sparse", 1, 2)  # type: ignore[arg-type]


@given(st.integers(0, 40), st.integers(0, 40))
def test_the_dense_reward_is_todays_bit_for_bit(passed, extra):
    total = passed + extra
    assert ppo.task_reward("dense", passed, total) == ppo.reward(passed) == passed / 20
    assert ppo.task_reward("binary", passed, total) == float(total > 0 and extra == 0)


def _verifier(tmp_path, kind: str) -> Verifier:
    return Verifier(VerifierConfig(base_dir=str(tmp_path / kind), reward=kind))


@pytest.mark.parametrize(("kind", "tests", "reward"), [
    ("dense", {"a": "passed", "b": "failed", "c": "passed"}, 0.1),
    ("binary", {"a": "passed", "b": "failed", "c": "passed"}, 0.0),
    ("dense", {"a": "passed", "b": "passed"}, 0.1),
    ("binary", {"a": "passed", "b": "passed"}, 1.0),
    ("binary", {"a": "passed", "b": "skipped"}, 0.0),  # only passed counts
])
def test_the_verifier_computes_the_configured_reward_and_logs_its_kind(tmp_path, kind, tests, reward):
    verifier = _verifier(tmp_path, kind)
    reply = {"tests": tests, "collected": list(tests), "timed_out": False, "tamper_flags": []}
    outcome = verifier._scored(SimpleNamespace(id="task"), SimpleNamespace(trial_id="t0"), "0" * 64, reply, 0.0)
    event = outcome.to_event()
    assert outcome.reward == event.reward == reward and event.reward_kind == kind
    assert event.passed == sum(v == "passed" for v in tests.values()) and event.reward_scale == 20
    failed = verifier._failed(SimpleNamespace(id="task"), SimpleNamespace(trial_id="t1"), "0" * 64, "boom", 0.0)
    assert failed.reward == 0.0 and failed.to_event().reward_kind == kind and failed.infra_error == "boom"
    forged = verifier._scored(SimpleNamespace(id="task"), SimpleNamespace(trial_id="t2"), "0" * 64,
                              {**reply, "tamper_flags": ["report_forged:test_a"]}, 0.0)
    assert forged.passed == 0 and forged.reward == 0.0


def _result(trial: str, passed: int, total: int, kind: str, reward: float | None = None) -> VerifierResult:
    if reward is None:
        reward = ppo.task_reward(kind, passed, total)  # type: ignore[arg-type]
    return VerifierResult(trial_id=trial, task_id="task", tests={f"t{i}": "passed" if i < passed else "failed"
                                                                   for i in range(total)},
                          passed=passed, total=total, reward=reward, reward_scale=20, verifier_sha256="0" * 64,
                          reward_kind=kind)


def test_an_eval_scores_the_dense_reward_whatever_the_run_trains_on():
    dense, binary = _result("e0", 3, 4, "dense"), _result("e1", 3, 4, "binary")
    assert binary.reward == 0.0 and eval_reward(binary) == eval_reward(dense) == dense.reward == 3 / 20
    assert eval_reward(_result("e2", 4, 4, "binary")) == 4 / 20
    events = [TrialIssued(trial_id="e1", task_id="task", split="eval", label="rl_best", policy_version_wanted=2),
              binary]
    [attempt] = labelled_attempts(events)["rl_best"]
    assert attempt.reward == 3 / 20 and not attempt.resolved


def test_the_audit_checks_each_result_by_its_reward_kind():
    audit = VerifierAudit()
    for i, result in enumerate([_result("a", 2, 2, "binary"), _result("b", 1, 2, "binary"),
                                _result("c", 1, 2, "dense")]):
        check_result(audit, f"verifier-0:{i}", result, None, 20)
    assert audit.inconsistent == []
    check_result(audit, "verifier-0:3", _result("d", 1, 2, "binary", reward=0.05), None, 20)
    check_result(audit, "verifier-0:4", _result("e", 2, 2, "dense", reward=1.0), None, 20)
    assert [(i["trial_id"], i["problems"]) for i in audit.inconsistent] == [
        ("d", ["reward 0.05 != 1[P = N] with P = 1, N = 2 (binary reward)"]),
        ("e", ["reward 1.0 != P/S = 2/20 (dense reward)"])]


def test_a_verifier_result_of_a_log_before_reward_kinds_reads_as_dense():
    wire = to_wire(_result("old", 1, 2, "dense"))
    assert wire["v"] == 2 and wire["f"].pop("reward_kind") == "dense"
    old = from_wire({**wire, "v": 1})
    assert isinstance(old, VerifierResult) and old.reward_kind == "dense" and eval_reward(old) == old.reward
