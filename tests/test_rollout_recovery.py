"""A restarted staleness controller closes what a killed one left open, and the audit agrees it is closed."""

from __future__ import annotations

import trio

from schemas import StalenessDecision, TrialEnded, TrialIssued, VerifierResult
from t1_actors.rollout.recovery import ABANDONED, close_abandoned, open_trials
from tools._replay.audit import audit_events


def _verified(trial_id: str, infra_error: str | None = None) -> VerifierResult:
    return VerifierResult(trial_id=trial_id, task_id="t", tests={}, passed=0, total=1, reward=0.0, reward_scale=20,
                          verifier_sha256="0" * 64, infra_error=infra_error)


def _killed_mid_pass() -> list:
    """What a controller killed mid-RL and mid-eval leaves in the log, one trial of each kind of state."""
    issue = lambda t, split="train", **kw: TrialIssued(trial_id=t, task_id="t", split=split,  # noqa: E731
                                                        policy_version_wanted=0, **kw)
    return [
        issue("e-done", "eval"), TrialEnded(trial_id="e-done", finish="answered"), _verified("e-done"),
        issue("e-looping", "eval"),  # its agent loop was running: nobody will end it
        issue("e-verifying", "eval"), TrialEnded(trial_id="e-verifying", finish="answered"),  # the verifier's
        issue("w-failed", "warmup"), TrialEnded(trial_id="w-failed", finish="infra_error", infra_error="mount"),
        issue("r-admitted"), StalenessDecision(trial_id="r-admitted", decision="admit", lag=0, policy_version=0),
        issue("r-verified"), TrialEnded(trial_id="r-verified", finish="answered"), _verified("r-verified"),
        issue("r-cut"), StalenessDecision(trial_id="r-cut", decision="cancel", lag=0, policy_version=0),
        StalenessDecision(trial_id="r-cut", decision="resume", lag=0, policy_version=0),
        issue("r-cut~c1", resumed_from="r-cut"),  # the continuation was in flight
    ]


def test_the_open_trials_are_those_without_a_final_state_and_a_continuation_keeps_its_sandbox():
    found = {t.trial_id: t for t in open_trials(_killed_mid_pass())}
    assert sorted(found) == ["e-looping", "e-verifying", "r-cut~c1", "r-verified"]
    assert found["r-cut~c1"].sandbox_id == "r-cut" and found["e-looping"].sandbox_id == "e-looping"
    assert found["e-verifying"].ended and not found["e-looping"].ended
    assert not audit_events(enumerate(_killed_mid_pass())).clean  # what the chaos run's audit found


def test_closing_them_leaves_the_audit_clean_and_waits_for_a_verification_on_its_way():
    log = _killed_mid_pass()
    pending = open_trials(log)
    closed_sandboxes: list[str] = []

    async def events():
        return list(log)

    async def append(*events):
        log.extend(events)

    async def close(sandbox_id):
        closed_sandboxes.append(sandbox_id)

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: close_abandoned(pending, events, append, close, 3, wait_s=30, poll_s=0.01))
            await trio.sleep(0.1)
            log.append(_verified("e-verifying"))  # the verifier reports after the restart

    trio.run(main)
    audit = audit_events((str(i), e) for i, e in enumerate(log))
    assert audit.clean, audit.to_json()
    assert audit.final_states["failed"] == 2 and audit.final_states["cancelled, closed"] == 2
    added = [e for e in log[len(_killed_mid_pass()):] if not isinstance(e, VerifierResult)]
    assert {e.trial_id for e in added} == {"e-looping", "r-cut~c1", "r-verified"}
    assert all(ABANDONED in (getattr(e, "reason", "") or getattr(e, "infra_error", "")) for e in added)
    assert all(e.policy_version == 3 for e in added if isinstance(e, StalenessDecision))
    assert sorted(closed_sandboxes) == ["e-looping", "e-verifying", "r-cut", "r-verified"]


def test_a_verification_that_never_reports_is_closed_after_the_wait():
    log = _killed_mid_pass()

    async def events():
        return list(log)

    async def append(*events):
        log.extend(events)

    async def close(sandbox_id):
        pass

    closed = trio.run(lambda: close_abandoned(open_trials(log), events, append, close, 0, wait_s=0.05, poll_s=0.01))
    assert "e-verifying" in closed
    assert audit_events((str(i), e) for i, e in enumerate(log)).clean
