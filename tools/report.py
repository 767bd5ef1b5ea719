"""Plots and a markdown summary of a run, from its event log.

    from tools.report import write_report
    write_report(run_dir)            # -> RUN/report/*.png + RUN/report/summary.md, returns the summary dict

Every figure is a plain function of the run's events (``series_of`` gathers them once), so the
campaign can call ``write_report`` at the end of a run and ``t1-replay report RUN`` does the same.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from schemas import (
    CriticWarmup,
    EvalResult,
    LearnerStep,
    SamplerTurn,
    StalenessDecision,
    TrajectoryAssembled,
    TrialIssued,
    VerifierResult,
)
from storage import EventLog
from t1_actors.job.dynamics import Dynamics
from t1_actors.stats import labelled_attempts, pass_at_k_curve
from tools._replay.run import RunError, RunView
from tools._report.dynamics import dynamics_markdown, plot_dynamics
from tools._report.skill import kl_rl_sft, plot_pass_at_k
from tools._report.time_shares import plot_time_shares

MAX_PANELS = 24  # learner_metrics.png: one panel per learner_step metric, in name order, at most this many


def series_of(events) -> dict:
    """The run's time series, from (event_id, event) pairs in log order."""
    split = {e.trial_id: e.split for _, e in events if isinstance(e, TrialIssued)}
    rewards, reward_of = [], {}
    steps, metrics = [], defaultdict(list)
    lengths, turns, lags = [], [], defaultdict(list)
    decisions, cancelled_turns = Counter(), 0
    cancellations = []  # cumulative count after each event that cancels
    warmup, evals, step_rewards = None, [], []
    for _, e in events:
        if isinstance(e, VerifierResult):
            reward_of[e.trial_id] = e.reward
            if split.get(e.trial_id, "train") == "train":
                rewards.append(e.reward)
        elif isinstance(e, LearnerStep):
            steps.append(e.step)
            for key, value in e.metrics.items():
                metrics[key].append((e.step, value))
            got = [reward_of[t] for t in e.trials if t in reward_of]
            step_rewards.append((e.step, float(np.mean(got)) if got else np.nan))
        elif isinstance(e, TrajectoryAssembled):
            lengths.append(len(e.token_ids))
            turns.append(e.turns)
        elif isinstance(e, StalenessDecision):
            decisions[e.decision] += 1
            lags[e.decision].append(e.lag)
            if e.decision == "cancel":
                cancellations.append(len(cancellations) + 1)
        elif isinstance(e, SamplerTurn) and e.finish_reason == "cancelled":
            cancelled_turns += 1
        elif isinstance(e, CriticWarmup):
            warmup = (e.explained_variance_before, e.explained_variance_after)
        elif isinstance(e, EvalResult):
            evals.append(e)
    return {"rewards": rewards, "step_rewards": step_rewards, "steps": steps, "metrics": dict(metrics),
            "lengths": lengths, "turns": turns, "lags": dict(lags), "decisions": decisions,
            "cancellations": cancellations, "cancelled_turns": cancelled_turns, "warmup": warmup, "evals": evals}


def _metric_keys(metrics: dict, *needles: str) -> list[str]:
    return sorted(k for k in metrics if any(n in k.lower() for n in needles))


def _running_mean(values: list[float], window: int) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    idx = np.arange(1, len(v) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def plot_reward(s: dict, ax) -> None:
    if s["rewards"]:
        x = np.arange(1, len(s["rewards"]) + 1)
        ax.plot(x, s["rewards"], ".", alpha=0.25, label="trial reward P/S")
        ax.plot(x, _running_mean(s["rewards"], 32), label="running mean (32)")
        ax.set_xlabel("verified train trial")
    ax.set_ylabel("reward")
    ax.set_title("Reward")
    ax.legend(loc="best", fontsize=8)


def plot_step_reward(s: dict, ax) -> None:
    pts = [p for p in s["step_rewards"] if np.isfinite(p[1])]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ".-")
    ax.set_xlabel("learner step")
    ax.set_ylabel("mean reward of the step's trials")
    ax.set_title("Reward per learner step")


def plot_evals(s: dict, ax) -> None:
    evals = [e for e in s["evals"] if e.n]
    for label in sorted({e.label for e in evals}):
        mine = [e for e in evals if e.label == label]
        x = [e.policy_version for e in mine]
        y = [e.resolved / e.n for e in mine]
        err = [[max(0.0, yi - e.ci_low) for yi, e in zip(y, mine)], [max(0.0, e.ci_high - yi) for yi, e in zip(y, mine)]]
        ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3, label=label)
    ax.set_xlabel("policy version")
    ax.set_ylabel("resolved rate")
    ax.set_title("Evaluation (95% CI)")
    if evals:
        ax.legend(loc="best", fontsize=8)


def plot_explained_variance(s: dict, ax) -> None:
    for key in _metric_keys(s["metrics"], "explained_var"):
        pts = s["metrics"][key]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ".-", label=key)
    if s["warmup"] is not None:
        ax.axhline(s["warmup"][0], ls=":", color="grey", label=f"before warm-up {s['warmup'][0]:.2f}")
        ax.axhline(s["warmup"][1], ls="--", color="black", label=f"after warm-up {s['warmup'][1]:.2f}")
    ax.set_xlabel("learner step")
    ax.set_title("Critic explained variance")
    ax.legend(loc="best", fontsize=8)


def plot_turns_and_length(s: dict, ax_turns, ax_len) -> None:
    if s["turns"]:
        ax_turns.hist(s["turns"], bins=np.arange(0.5, max(s["turns"]) + 1.5), rwidth=0.8)
    ax_turns.set_xlabel("turns per trajectory")
    ax_turns.set_title("Turns")
    if s["lengths"]:
        ax_len.hist(s["lengths"], bins=30)
    ax_len.set_xlabel("tokens per trajectory chunk")
    ax_len.set_title("Sequence length")


def plot_gap(s: dict, ax) -> None:
    for key in _metric_keys(s["metrics"], "gap", "logprob_diff", "mismatch"):
        pts = s["metrics"][key]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ".-", label=key)
    ax.set_xlabel("learner step")
    ax.set_title("Train-inference gap (mean |delta logprob|)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)


def plot_staleness(s: dict, ax) -> None:
    lags = s["lags"]
    if lags:
        values = [lags[d] for d in sorted(lags)]
        lo = min(min(v) for v in values)
        hi = max(max(v) for v in values)
        ax.hist(values, bins=np.arange(lo - 0.5, hi + 1.5), label=sorted(lags), stacked=True, rwidth=0.8)
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel("policy-version lag")
    ax.set_title("Staleness decisions")


def plot_cancellations(s: dict, ax) -> None:
    if s["cancellations"]:
        ax.step(np.arange(1, len(s["cancellations"]) + 1), s["cancellations"], where="post")
    ax.set_xlabel("cancel decision")
    ax.set_ylabel("cumulative cancellations")
    ax.set_title(f"Cancellations ({len(s['cancellations'])} trials, {s['cancelled_turns']} turns)")


def plot_learner_metrics(s: dict, fig) -> None:
    keys = sorted(s["metrics"])[:MAX_PANELS]
    cols = 4
    rows = max(1, (len(keys) + cols - 1) // cols)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(rows, cols, i + 1)
        pts = s["metrics"][key]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ".-")
        ax.set_title(key, fontsize=8)
        ax.tick_params(labelsize=6)


def summary_of(s: dict) -> dict:
    """Headline numbers of a run."""
    r = s["rewards"]
    quarter = max(1, len(r) // 4)
    last_ev = {k: s["metrics"][k][-1][1] for k in _metric_keys(s["metrics"], "explained_var")}
    gaps = {k: float(np.mean([p[1] for p in s["metrics"][k]])) for k in _metric_keys(s["metrics"], "gap")}
    off_policy = {k: float(np.mean([p[1] for p in s["metrics"][k]]))
                  for k in _metric_keys(s["metrics"], "off_policy", "kl_sampler")}
    all_lags = [lag for v in s["lags"].values() for lag in v]
    return {
        "verified_train_trials": len(r),
        "mean_reward": float(np.mean(r)) if r else None,
        "mean_reward_first_quarter": float(np.mean(r[:quarter])) if r else None,
        "mean_reward_last_quarter": float(np.mean(r[-quarter:])) if r else None,
        "learner_steps": len(s["steps"]),
        "critic_warmup_ev": list(s["warmup"]) if s["warmup"] else None,
        "last_explained_variance": last_ev,
        "mean_gaps": gaps,
        "mean_off_policy": off_policy,  # the sampler-learner KL, the weights' mean, truncated / masked fractions
        "staleness_decisions": dict(s["decisions"]),
        "mean_lag": float(np.mean(all_lags)) if all_lags else None,
        "cancellations": len(s["cancellations"]),
        "cancelled_turns": s["cancelled_turns"],
        "mean_turns": float(np.mean(s["turns"])) if s["turns"] else None,
        "mean_sequence_length": float(np.mean(s["lengths"])) if s["lengths"] else None,
        "evals": [{"label": e.label, "policy_version": e.policy_version, "n": e.n, "resolved": e.resolved,
                   "resolved_rate": e.resolved / e.n if e.n else None, "mean_reward": e.mean_reward,
                   "ci": [e.ci_low, e.ci_high]} for e in s["evals"]],
    }


def write_plots(events, out_dir: str | Path) -> list[Path]:
    """The run's PNG figures under ``out_dir``; returns their paths."""
    import matplotlib  # noqa: PLC0415 - matplotlib only when plotting (pyplot: 0.6 s importtime)

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib only when plotting (pyplot: 0.6 s importtime)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = events if isinstance(events, dict) else series_of(events)
    written = []

    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    plot_reward(s, axes[0, 0])
    plot_step_reward(s, axes[0, 1])
    plot_explained_variance(s, axes[0, 2])
    plot_gap(s, axes[0, 3])
    plot_turns_and_length(s, axes[1, 0], axes[1, 1])
    plot_staleness(s, axes[1, 2])
    plot_evals(s, axes[1, 3])
    fig.tight_layout()
    written.append(_save(fig, out_dir / "overview.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    plot_cancellations(s, ax)
    fig.tight_layout()
    written.append(_save(fig, out_dir / "cancellations.png"))

    if s["metrics"]:
        fig = plt.figure(figsize=(14, 3 * max(1, (min(len(s["metrics"]), MAX_PANELS) + 3) // 4)))
        plot_learner_metrics(s, fig)
        fig.tight_layout()
        written.append(_save(fig, out_dir / "learner_metrics.png"))
    plt.close("all")
    return written


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=90)
    return path


def markdown_summary(summary: dict, figures: list[Path], run: str, sections: list[str] = ()) -> str:
    """summary.md: the headline table, the evals, the endings, ``sections`` (lines), the figures."""
    lines = [f"# Run report: {run}", "", "| quantity | value |", "| --- | --- |"]
    for key, value in summary.items():
        if key in ("evals", "endings", "dynamics"):
            continue
        lines.append(f"| {key.replace('_', ' ')} | {_fmt(value)} |")
    if summary["evals"]:
        lines += ["", "## Evaluations", "", "| label | version | n | resolved | rate | mean reward | 95% CI |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for e in summary["evals"]:
            lines.append(f"| {e['label']} | {e['policy_version']} | {e['n']} | {e['resolved']} | "
                         f"{_fmt(e['resolved_rate'])} | {_fmt(e['mean_reward'])} | "
                         f"{_fmt(e['ci'][0])}..{_fmt(e['ci'][1])} |")
    endings = summary.get("endings") or {}
    if any(endings.values()):  # nothing cut or edited silently: every finish, cut and context edit, per split
        lines += ["", "## How trials ended, what was cut, what was edited", "", "| count | split | reasons |",
                  "| --- | --- | --- |"]
        for key, by_split in endings.items():
            for split, reasons in by_split.items():
                lines.append(f"| {key.replace('_', ' ')} | {split} | {_fmt(reasons)} |")
    lines += list(sections)
    lines += ["", "## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures]
    return "\n".join(lines) + "\n"


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> dict:
    """PNG plots + summary.md of the run at ``run_dir`` (default output RUN/report/). Returns the summary
    with ``figures`` and ``markdown`` paths added, and ``dynamics`` (``Dynamics.summary``: turns and tokens per
    trajectory before RL, after RL and per learner step; finishes per step; the probe)."""
    view = RunView.open(run_dir)
    if out_dir is None and view.root is None:
        raise RunError(f"{run_dir}: no run directory on this machine to write report/ into; pass --out DIR")
    out = Path(out_dir) if out_dir is not None else view.root / "report"
    s = series_of(view.events)
    figures = write_plots(s, out)
    summary = summary_of(s)
    summary["kl_rl_sft"] = kl_rl_sft(view)
    dynamics = Dynamics.fold(view.events)  # the endings' fold too: one fold of each fact
    summary["endings"] = dynamics.endings.counts(dynamics.endings.split_of)
    summary["dynamics"] = dynamics.summary()
    figures += plot_dynamics(summary["dynamics"], dynamics.lengths(), out)
    curve = plot_pass_at_k(_pass_at_k(view), out)
    if curve is not None:
        figures.append(curve)
    shares = plot_time_shares(EventLog.open(view.log_path), out)  # where the RL phase's wall time went
    if shares is not None:
        figures.append(shares)
    md = out / "summary.md"
    md.write_text(markdown_summary(summary, figures, str(view.root or view.log_path),
                                   dynamics_markdown(summary["dynamics"])))
    return {**summary, "figures": [str(p) for p in figures], "markdown": str(md)}


def _pass_at_k(view) -> dict:
    attempts = labelled_attempts(e for _, e in view.events)
    return {policy: pass_at_k_curve(attempts.get(f"{policy}_passk", [])) for policy in ("sft", "rl")}
