"""What the campaign's kills cost the trials in flight, from the log: how many were in flight at the kills, how
many continued mid-trajectory, how many turns were sampled again, and what became of their workspaces.

    trials_in_flight_at_kills      over the kills of a sampler, sandbox or staleness controller: the trials issued
                                   and without a final state when the kill landed (log append times)
    trials_resumed_mid_trajectory  continuations a restarted controller issued for its predecessor's trials
                                   (``rollout.resume``: the original's cancel names the restart)
    turns_resampled_after_kill     turns sampled again because of a kill: the turn in flight of each such
                                   continuation, and every turn of a lineage with two completed records (its reply
                                   lost with a dead controller). A turn in flight at a sampler kill is resent to the
                                   restarted sampler, which logs it once: it shows in no record, and is not counted
    workspaces_recovered           sandboxes a restarted sandbox actor took over (``WorkspaceRecovered``:
                                   reattached, or rolled back to before the command running at the kill)
    workspaces_lost                a workspace a restarted sandbox actor could not recover, or a trial a restarted
                                   controller found without its sandbox (``TrialEnded``, "workspace lost")
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from schemas import Event, SamplerTurn, StalenessDecision, TrialEnded, TrialIssued, WorkspaceRecovered
from t1_actors.rollout.recovery import open_trials
from t1_actors.rollout.resume import RESTARTED, WORKSPACE_LOST

KILLS_THAT_CUT_TRIALS = ("sampler", "sandbox", "staleness")


def resumption_report(events: Sequence[tuple[float, Event]], kill_times: Sequence[float]) -> dict[str, Any]:
    """The keys above, over ``events`` (append time in Unix seconds, event; in log order) and the Unix times of
    the kills of the roles in ``KILLS_THAT_CUT_TRIALS``."""
    ordered = sorted(events, key=lambda pair: pair[0])
    in_flight = sum(len(open_trials(e for t, e in ordered if t < kill)) for kill in kill_times)
    parents = {e.trial_id: e.resumed_from for _, e in ordered if isinstance(e, TrialIssued) and e.resumed_from}
    restarted = {e.trial_id for _, e in ordered if isinstance(e, StalenessDecision) and e.decision == "cancel"
                 and RESTARTED in e.reason}
    resumed = [c for c, original in parents.items() if original in restarted]
    resumed_reasons = [e.reason for _, e in ordered if isinstance(e, StalenessDecision) and e.decision == "resume"
                       and e.trial_id in restarted]

    def root(trial_id: str) -> str:
        while trial_id in parents:
            trial_id = parents[trial_id]
        return trial_id

    completed = Counter((root(e.trial_id), e.turn) for _, e in ordered
                        if isinstance(e, SamplerTurn) and e.finish_reason in ("stop", "length"))
    recovered = [e for _, e in ordered if isinstance(e, WorkspaceRecovered)]
    lost_at_controller = [e for _, e in ordered if isinstance(e, TrialEnded) and WORKSPACE_LOST in (e.infra_error or "")]
    return {
        "trials_in_flight_at_kills": in_flight,
        "trials_resumed_mid_trajectory": len(resumed),
        "turns_resampled_after_kill": (sum("sampled again" in reason for reason in resumed_reasons)
                                       + sum(n - 1 for n in completed.values() if n > 1)),
        "workspaces_recovered": sum(e.outcome != "lost" for e in recovered),
        "workspaces_rolled_back": sum(e.outcome == "rolled_back" for e in recovered),
        "workspaces_lost": sum(e.outcome == "lost" for e in recovered) + len(lost_at_controller),
    }
