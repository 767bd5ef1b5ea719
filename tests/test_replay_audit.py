"""The log audit (`t1-replay audit`): clean on a well-formed log, and it catches each doctored one."""

from __future__ import annotations

import numpy as np
import pytest

from schemas import (
    ContextEdited,
    LearnerStep,
    StalenessDecision,
    TrajectoryAssembled,
    TrialEnded,
    TrialIssued,
    VerifierResult,
    WeightsPublished,
)
from t1_actors.layout import sha256_file
from tools._replay.audit import Audit, audit_events


def _verified(trial_id: str, reward: float = 0.5, infra_error: str | None = None) -> VerifierResult:
    return VerifierResult(trial_id=trial_id, task_id="t", tests={"a": "passed"}, passed=1, total=2, reward=reward,
                          reward_scale=20, verifier_sha256="0" * 64, infra_error=infra_error)


def _weights(tmp_path, version: int) -> WeightsPublished:
    directory = tmp_path / "weights" / f"v{version:06d}"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(np.arange(8 + version, dtype=np.int32).tobytes())
    return WeightsPublished(version=version, sha256=sha256_file(directory / "model.safetensors"),
                            location=str(directory), step=version)


def _decide(trial_id: str, decision: str, reason: str = "") -> StalenessDecision:
    return StalenessDecision(trial_id=trial_id, decision=decision, lag=0, policy_version=0, reason=reason)


@pytest.fixture
def events(tmp_path) -> list:
    """A small campaign's log: an eval trial, a warm-up one, train trials admitted, dropped, cancelled and
    closed, cancelled and resumed, one failed by its sandbox; two learner steps; three versions."""
    facts = [_weights(tmp_path, 0),
             TrialIssued(trial_id="e0", task_id="t", split="eval", policy_version_wanted=0), _verified("e0"),
             TrialIssued(trial_id="w0", task_id="t", split="warmup", policy_version_wanted=0), _verified("w0", 0.1)]
    for n in range(5):
        facts.append(TrialIssued(trial_id=f"r{n}", task_id="t", split="train", policy_version_wanted=0))
    facts += [_verified("r0"), _decide("r0", "admit"), _verified("r1", 0.2), _decide("r1", "drop", "batch full"),
              _decide("r2", "cancel", "batch full"), _decide("r3", "cancel", "batch full; kept"),
              _decide("r3", "resume", "continued as r3~c1"),
              TrialIssued(trial_id="r3~c1", task_id="t", split="train", policy_version_wanted=0, resumed_from="r3"),
              _verified("r3~c1", 0.3), _decide("r3~c1", "admit"),
              TrialEnded(trial_id="r4", finish="infra_error", infra_error="sandbox: environment build failed"),
              LearnerStep(step=0, policy_version=1, trials=["r0"], metrics={}), _weights(tmp_path, 1),
              LearnerStep(step=1, policy_version=2, trials=["r3~c1"], metrics={}), _weights(tmp_path, 2)]
    return [(f"w:{i}", e) for i, e in enumerate(facts)]


def test_a_well_formed_log_is_clean_and_says_what_it_checked(events):
    audit = audit_events(events)
    assert audit.clean, audit.to_json()
    assert (audit.events_checked, audit.trials_issued, audit.learner_steps, audit.weights_checked) == (len(events), 8, 2, 3)
    assert audit.final_states == {"verified": 2, "admit": 2, "drop": 1, "cancelled, closed": 1,
                                  "cancelled, resumed": 1, "failed": 1}


def test_an_audit_that_checked_nothing_is_not_clean():
    assert not audit_events([]).clean


def _without(events, kind: str, trial_id: str) -> list:
    return [(i, e) for i, e in events if not (e.kind == kind and getattr(e, "trial_id", None) == trial_id)]


@pytest.mark.parametrize("doctor, finding", [
    (lambda ev, tmp: _without(ev, "staleness_decision", "r0"), "trials_unaccounted"),  # a final state removed
    (lambda ev, tmp: _without(ev, "verifier_result", "e0"), "trials_unaccounted"),
    (lambda ev, tmp: _without(ev, "trial_ended", "r4"), "trials_unaccounted"),
    (lambda ev, tmp: ev + [("w:99", ev[3][1])], "events_duplicated"),  # an event logged twice
    (lambda ev, tmp: ev + [ev[3]], "events_duplicated"),  # an event id twice
    (lambda ev, tmp: ev + [("w:99", _decide("r1", "admit"))], "trials_final_twice"),
    # a continuation's result named by its original (before VerifyRequest.sandbox_id): the original has two
    (lambda ev, tmp: ev + [("w:99", _verified("r0", 0.3))], "trials_verified_twice"),
    (lambda ev, tmp: _without(ev, "trial_issued", "r3~c1"), "continuations_unlinked"),
    (lambda ev, tmp: [(i, e) for i, e in ev if not (e.kind == "learner_step" and e.step == 0)],  # a step skipped
     "learner_steps_gap"),
    (lambda ev, tmp: ev + [("w:99", LearnerStep(step=2, policy_version=3, trials=["r0"], metrics={}))],
     "trajectories_consumed_twice"),
    (lambda ev, tmp: ev + [("w:99", LearnerStep(step=2, policy_version=3, trials=["r1"], metrics={}))],
     "trajectories_consumed_unadmitted"),
    (lambda ev, tmp: ev + [("w:99", WeightsPublished(version=1, sha256="0" * 64, location="x", step=1))],
     "versions_out_of_order"),
])
def test_the_audit_catches_each_doctored_log(events, tmp_path, doctor, finding):
    audit = audit_events(doctor(events, tmp_path))
    assert getattr(audit, finding) >= 1, audit.to_json()
    assert not audit.clean
    assert audit.examples[finding]


def test_a_changed_weights_file_is_caught(events, tmp_path):
    (tmp_path / "weights" / "v000001" / "model.safetensors").write_bytes(b"not the published weights")
    audit = audit_events(events)
    assert audit.weights_mismatched == 1 and not audit.clean
    assert "version 1" in audit.examples["weights_mismatched"][0]


def test_every_zero_count_is_reported(events):
    out = audit_events(events).to_json()
    assert set(Audit.MUST_BE_ZERO) <= set(out) and out["clean"] is True


def test_the_chaos_reports_audit_mutations_are_each_caught_on_a_real_shaped_log(events, tmp_path):
    """`t1-actor chaos` doctors its campaign's own log ten ways (tools/chaos/_audit_mutations.py); on this
    log every mutation has its target, and each one fails the audit by the count it names."""
    from tools.chaos._audit_mutations import MUTATIONS, audit_mutations

    out = audit_mutations(events, tmp_path)
    assert out["audit_mutations"] == {"tried": len(MUTATIONS), "caught": len(MUTATIONS)}, out["audit_mutations_each"]
    assert audit_events(events).clean  # the mutations worked on copies: the log itself is untouched


def _chunk(trial_id: str, index: int, reward: float) -> TrajectoryAssembled:
    ids = np.arange(6, dtype=np.int32)
    return TrajectoryAssembled(trial_id=trial_id, chunk=index, task_id="t", token_ids=ids,
                               loss_mask=np.array([0, 0, 1, 1, 0, 1], np.uint8), sampler_logprobs=np.zeros(6, np.float32),
                               token_versions=np.zeros(6, np.int32), boundary_cases=["version"] if index else [],
                               reward=reward, policy_version=0, turns=1)


def test_a_trials_chunks_are_one_trajectory_and_its_context_edits_are_counted(events):
    edit = ContextEdited(trial_id="r0", turn=3, strategy="window", tokens_before=900, tokens_after=400,
                         messages_edited=4)
    whole = [*events, ("c:0", _chunk("r0", 0, 0.5)), ("c:1", _chunk("r0", 1, 0.5)), ("c:2", edit),
             ("c:3", TrialEnded(trial_id="r0", finish="max_turns", context_edits=1))]
    audit = audit_events(whole)
    assert audit.clean and audit.trials_assembled == 1, audit.to_json()
    doctored = [*events, ("c:0", _chunk("r0", 0, 0.5)), ("c:1", _chunk("r0", 2, 0.25)), ("c:2", edit),
                ("c:3", TrialEnded(trial_id="r0", finish="max_turns", context_edits=0))]
    audit = audit_events(doctored)
    assert not audit.clean
    assert (audit.chunks_misnumbered, audit.chunk_rewards_differ, audit.context_edits_uncounted) == (1, 1, 1)
    assert audit.examples["context_edits_uncounted"] == ["r0: 1 edits, its ending counts 0"]
