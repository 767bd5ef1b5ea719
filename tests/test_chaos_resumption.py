"""The chaos report's resumption keys (tools/chaos/_resumption.py), counted from a log's events and kill times."""

from __future__ import annotations

import numpy as np

from schemas import SamplerTurn, StalenessDecision, TrialEnded, TrialIssued, WorkspaceRecovered
from t1_actors.rollout.resume import RESTARTED, WORKSPACE_LOST
from tools.chaos._resumption import resumption_report


def _turn(trial_id: str, turn: int, finish: str = "stop") -> SamplerTurn:
    return SamplerTurn(trial_id=trial_id, turn=turn, prompt_ids=np.arange(3, dtype=np.int32),
                       sampled_ids=np.arange(2, dtype=np.int32), sampler_logprobs=np.zeros(2, np.float32),
                       policy_version=0, finish_reason=finish, temperature=1.0, top_p=1.0)


def _issue(trial_id: str, resumed_from: str | None = None) -> TrialIssued:
    return TrialIssued(trial_id=trial_id, task_id="t", policy_version_wanted=0, resumed_from=resumed_from)


def test_the_resumption_keys_count_what_the_kills_cost_and_nothing_else():
    events = [
        (1.0, _issue("a")), (1.1, _issue("b")), (1.2, _issue("c")), (1.3, _issue("d")),
        (2.0, _turn("a", 0)), (2.1, _turn("b", 0)), (2.2, _turn("b", 1)),  # b's turn 1: completed, reply lost
        (2.3, StalenessDecision(trial_id="d", decision="admit", lag=0, policy_version=0)),
        # kill of the controller at 3.0: a, b, c in flight (d already decided)
        (4.0, StalenessDecision(trial_id="a", decision="cancel", lag=0, policy_version=0,
                                reason=f"{RESTARTED}; kept for continuation")),
        (4.1, StalenessDecision(trial_id="b", decision="cancel", lag=0, policy_version=0,
                                reason=f"{RESTARTED}; kept for continuation")),
        (4.2, TrialEnded(trial_id="c", finish="infra_error", infra_error=f"{WORKSPACE_LOST}: sandbox c gone")),
        (5.0, StalenessDecision(trial_id="a", decision="resume", lag=0, policy_version=0,
                                reason="continued as a~c1 after the staleness controller's restart (rebuilt from "
                                       "the log: 1 turns; turn 1 sampled again)")),
        (5.1, _issue("a~c1", "a")), (5.2, _turn("a~c1", 1)),
        (5.3, StalenessDecision(trial_id="b", decision="resume", lag=0, policy_version=0,
                                reason="continued as b~c1 after the staleness controller's restart (rebuilt from "
                                       "the log: 2 turns; turn 2 sampled again)")),
        (5.4, _issue("b~c1", "b")), (5.5, _turn("b~c1", 1)),  # b's turn 1 sampled a second time
        # a batch cut is no kill: its cancelled turn sampled again is not counted
        (6.0, _issue("e")), (6.1, _turn("e", 0, "cancelled")),
        (6.2, StalenessDecision(trial_id="e", decision="cancel", lag=0, policy_version=0, reason="batch full")),
        (6.3, StalenessDecision(trial_id="e", decision="resume", lag=0, policy_version=0, reason="continued as e~c1")),
        (6.4, _issue("e~c1", "e")), (6.5, _turn("e~c1", 0)),
        (7.0, WorkspaceRecovered(trial_id="a", outcome="reattached")),
        (7.1, WorkspaceRecovered(trial_id="b", outcome="rolled_back", turn=2, command="make")),
        (7.2, WorkspaceRecovered(trial_id="x", outcome="lost", reason="no snapshot")),
    ]
    report = resumption_report(events, kill_times=[3.0, 6.15])
    assert report == {"trials_in_flight_at_kills": 3 + 3,  # at 3.0: a, b, c; at 6.15: a~c1, b~c1, e (not yet cut)
                      "trials_resumed_mid_trajectory": 2, "turns_resampled_after_kill": 2 + 1,
                      "workspaces_recovered": 2, "workspaces_rolled_back": 1, "workspaces_lost": 2}
