"""What a campaign's log says about its RL phase: how long it took, what it produced, where the time went.

Everything here reads the run's event log only (append times, ``SandboxExec.duration_s``,
``VerifierResult.duration_s``, ``LearnerStep``, ``CriticValues``): no figure is measured outside it.

The RL phase is the window from the first training trial issued to the publication of policy version
``steps`` (the ``steps``-th PPO step). Its wall time is split into parts by what was running at each
instant, as intervals read from the log:

- ``learner step``: from the last ``CriticValues`` of a step's trials (the batch became ready) to the
  step's ``LearnerStep`` (collate, the PPO step, publishing the weights, the checkpoint);
- ``critic``: from a trial's admission (``StalenessDecision``) to its last ``CriticValues``;
- ``sampling``: each ``SamplerTurn``, from the trial's previous event (its issue, or the tool call before
  the turn) to the turn's append (the request, the batcher's queue and decode; turn 0 includes the
  sandbox's start, which logs no event of its own);
- ``sandbox exec``: each ``SandboxExec``'s own ``duration_s``, ending at its append;
- ``verification``: each ``VerifierResult``'s ``duration_s``, ending at its append;
- ``the log``: from a trial's ``VerifierResult`` to the controller's decision on it (assembling and
  appending its trajectory, committing), the log's share a trial waits on;
- ``waiting``: none of these (transport, polling, the actors waiting on each other).

``time_shares`` attributes each instant to the first running part in that order (they sum to 1 with
``waiting``); ``busy_shares`` gives each part's own union of intervals over the window (they overlap).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PARTS = ("learner step", "critic", "sampling", "sandbox exec", "verification", "the log")


def rl_window(log, steps: int) -> tuple[float, float]:
    """(start, end) in Unix seconds: the first training trial's issue to policy version ``steps``'s
    publication. ValueError if the log has no training trial, fewer published versions, or that version
    before the first training trial."""
    times = dict(log.append_times(kinds=["trial_issued", "weights_published"]))
    starts = [times[i] for i, e in log.events(kinds=["trial_issued"]) if e.split == "train"]
    ends = [times[i] for i, e in log.events(kinds=["weights_published"]) if e.version == steps]
    if not starts or not ends:
        raise ValueError(f"the log has {len(starts)} training trials and no policy version {steps}: "
                         "the RL phase did not reach its step budget")
    if min(ends) <= min(starts):
        raise ValueError(f"policy version {steps} was published before the first training trial: no RL window")
    return min(starts), min(ends)


def rl_figures(log, steps: int) -> dict:
    """The RL phase's wall time, PPO steps and trajectories (trials the steps trained on), and rates."""
    start, end = rl_window(log, steps)
    times = dict(log.append_times(kinds=["learner_step", "trial_issued"]))
    learned = [e for i, e in log.events(kinds=["learner_step"]) if times[i] <= end and e.step < steps]
    issued = sum(1 for i, e in log.events(kinds=["trial_issued"]) if e.split == "train" and start <= times[i] <= end)
    trajectories = sum(len(e.trials) for e in learned)
    seconds = end - start
    return {"rl_seconds": round(seconds, 2), "steps": len(learned), "trajectories": trajectories,
            "trials_issued": issued, "trajectories_per_s": round(trajectories / seconds, 4),
            "steps_per_s": round(len(learned) / seconds, 5),
            "steps_per_minute": round(60 * len(learned) / seconds, 2),
            "trajectories_per_minute": round(60 * trajectories / seconds, 2),
            "learner_step_s": round(sum(e.metrics.get("step_seconds", 0.0) for e in learned) / max(len(learned), 1), 2)}


def part_intervals(log) -> dict[str, list[tuple[float, float]]]:
    """Every part's intervals (start, end) in Unix seconds, read from the log (the module's doc)."""
    times = dict(log.append_times())
    by_trial: dict[str, list[tuple[float, object]]] = defaultdict(list)
    steps = []
    for event_id, event in log.events():
        trial = getattr(event, "trial_id", None)
        if trial is not None:
            by_trial[trial].append((times[event_id], event))
        if event.kind == "learner_step":
            steps.append((times[event_id], event))
    parts: dict[str, list[tuple[float, float]]] = {part: [] for part in PARTS}
    # a continuation samples under its own id but executes in its original's sandbox (the original's id)
    resumed = {e.trial_id: e.resumed_from for events in by_trial.values() for _, e in events
               if e.kind == "trial_issued" and e.resumed_from}

    def sandbox_of(trial: str) -> str:
        while trial in resumed:
            trial = resumed[trial]
        return trial

    execs = {trial: sorted(ts for ts, e in events if e.kind == "sandbox_exec") for trial, events in by_trial.items()}
    valued: dict[str, float] = {}
    for trial, events in by_trial.items():
        events.sort(key=lambda item: item[0])
        issued = admitted = verified = None
        for ts, event in events:
            kind = event.kind
            if kind == "trial_issued":
                issued = ts
            elif kind == "sampler_turn" and issued is not None:
                before = [t for t in execs.get(sandbox_of(trial), ()) if issued <= t <= ts]
                parts["sampling"].append((max(before, default=issued), ts))
            elif kind == "sandbox_exec":
                parts["sandbox exec"].append((ts - event.duration_s, ts))
            elif kind == "verifier_result":
                parts["verification"].append((ts - event.duration_s, ts))
                verified = ts
            elif kind == "staleness_decision":
                if verified is not None and event.decision in ("admit", "drop"):
                    parts["the log"].append((verified, ts))
                if event.decision == "admit":
                    admitted = ts
            elif kind == "critic_values":
                valued[trial] = max(valued.get(trial, ts), ts)
        if admitted is not None and trial in valued:
            parts["critic"].append((admitted, valued[trial]))
    for ts, step in steps:
        ready = [valued[t] for t in step.trials if t in valued and valued[t] <= ts]
        if ready:
            parts["learner step"].append((max(ready), ts))
    return parts


def _union(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The intervals clipped to [lo, hi], merged: disjoint and sorted."""
    merged: list[list[float]] = []
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(intervals: list[tuple[float, float]], taken: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint sorted ``intervals`` less the disjoint sorted ``taken``."""
    out, j = [], 0
    for a, b in intervals:
        while j < len(taken) and taken[j][1] <= a:
            j += 1
        k, start = j, a
        while k < len(taken) and taken[k][0] < b:
            if taken[k][0] > start:
                out.append((start, taken[k][0]))
            start = max(start, taken[k][1])
            k += 1
        if start < b:
            out.append((start, b))
    return out


def time_shares(log, window: tuple[float, float]) -> dict:
    """``time_shares`` (exclusive, in ``PARTS`` order, plus ``waiting``; sum 1) and ``busy_shares`` (each
    part's own union) of the window's wall time."""
    lo, hi = window
    wall = hi - lo
    if wall <= 0:
        raise ValueError(f"empty window {window}")
    taken: list[tuple[float, float]] = []
    shares, busy = {}, {}
    for part, intervals in part_intervals(log).items():
        own = _union(intervals, lo, hi)
        busy[part] = round(_length(own) / wall, 4)
        alone = _minus(own, taken)
        shares[part] = round(_length(alone) / wall, 4)
        taken = _union(taken + alone, lo, hi)
    shares["waiting"] = round(max(0.0, 1.0 - _length(taken) / wall), 4)
    return {"time_shares": shares, "busy_shares": busy}


def last_version(log) -> int:
    """The newest published policy version (0: the SFT policy only, no RL step yet)."""
    return max((e.version for _, e in log.events(kinds=["weights_published"])), default=0)


def plot_time_shares(log, out_dir) -> Path | None:
    """``time_shares.png``: where the RL phase's wall time went (the whole phase: the first training trial
    to the last published version), exclusive shares as one bar, each part's own busy share beside it.
    None when the log has no RL step."""
    steps = last_version(log)
    if steps < 1:
        return None
    try:
        window = rl_window(log, steps)
    except ValueError:
        return None
    shares = time_shares(log, window)
    import matplotlib  # noqa: PLC0415 - matplotlib only when plotting (pyplot: 0.6 s importtime)

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib only when plotting (pyplot: 0.6 s importtime)

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    start = 0.0
    for part, share in shares["time_shares"].items():
        left.barh([0], [share], left=[start], label=f"{part} {share:.0%}")
        start += share
    left.set_xlim(0, 1)
    left.set_yticks([])
    left.set_xlabel(f"share of the RL phase's {window[1] - window[0]:.0f} s ({steps} steps), each instant to the "
                    "first running part")
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8)
    busy = shares["busy_shares"]
    right.barh(list(busy), list(busy.values()))
    right.set_xlim(0, 1)
    right.invert_yaxis()
    right.set_xlabel("each part's own busy share (overlapping)")
    fig.suptitle("where the RL phase's wall time goes (from the log's timestamps)")
    fig.tight_layout()
    path = Path(out_dir) / "time_shares.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
