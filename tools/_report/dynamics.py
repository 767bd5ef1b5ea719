"""The report's side of the training dynamics (``t1_actors.job.dynamics``): turns and tokens per trajectory at each
learner step with the step's finishes stacked, the trajectory-length histogram before vs after RL, and their lines
in summary.md.

    d = Dynamics.fold(view.events)
    figures = plot_dynamics(d.summary(), d.lengths(), out_dir)   # report/dynamics.png, report/trajectory_lengths.png
    lines = dynamics_markdown(d.summary())
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

GROUPS = {"before_rl": "before RL (SFT policy)", "after_rl": "after RL"}


def _pyplot():
    import matplotlib  # noqa: PLC0415 - matplotlib only when plotting (pyplot: 0.6 s importtime)

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib only when plotting (pyplot: 0.6 s importtime)

    return plt


def plot_per_step(summary: dict[str, Any], ax_turns, ax_tokens, ax_finishes) -> None:
    """Mean turns and tokens per trajectory of each learner step's trials, the p10-p90 band around them, and the
    step's finishes by reason stacked (context edits and truncations beside them as lines)."""
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415 - matplotlib only when plotting (0.6 s importtime)

    for ax, key in ((ax_turns, "turns"), (ax_tokens, "tokens")):
        points = [p for p in summary[key]["per_step"] if p.get("mean") is not None]
        if points:
            x = [p["step"] for p in points]
            ax.fill_between(x, [p["p10"] for p in points], [p["p90"] for p in points], alpha=0.25, label="p10-p90")
            ax.plot(x, [p["mean"] for p in points], ".-", label="mean")
            ax.legend(loc="best", fontsize=8)
        ax.set_xlabel("learner step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{key.capitalize()} per trajectory")
    steps = summary["per_step"]
    x = np.array([s["step"] for s in steps])
    bottom = np.zeros(len(steps))
    for reason in sorted({r for s in steps for r in s["finishes"]}):
        n = np.array([s["finishes"].get(reason, 0) for s in steps], dtype=float)
        ax_finishes.bar(x, n, bottom=bottom, label=reason)
        bottom += n
    for key, style in (("context_edits", "k^-"), ("truncations", "rv-")):
        n = [sum(s[key].values()) for s in steps]
        if any(n):
            ax_finishes.plot(x, n, style, label=key.replace("_", " "))
    ax_finishes.set_xlabel("learner step")
    ax_finishes.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_finishes.set_ylabel("trials of the step")
    ax_finishes.set_title("Finishes by reason")
    if ax_finishes.get_legend_handles_labels()[0]:
        ax_finishes.legend(loc="best", fontsize=8)


def plot_probe(summary: dict[str, Any], ax) -> None:
    """The validation probe's resolved rate after K learner steps (empty when the run has no probe passes)."""
    probe = [p for p in summary["probe"] if p["rate"] is not None]
    if probe:
        ax.plot([p["step"] for p in probe], [p["rate"] for p in probe], "o-")
    ax.set_xlabel("learner steps done")
    ax.set_ylabel("resolved rate")
    ax.set_title("Validation probe" if probe else "Validation probe (none in this run)")


def plot_lengths(lengths: dict[str, dict[str, list[int]]], ax_turns, ax_tokens) -> None:
    """Histograms of turns and tokens per trajectory, the before-RL trials against the after-RL ones."""
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415 - matplotlib only when plotting (0.6 s importtime)

    for ax, key in ((ax_turns, "turns"), (ax_tokens, "tokens")):
        groups = {GROUPS[name]: lengths[name][key] for name in GROUPS if lengths[name][key]}
        if groups:
            every = [v for values in groups.values() for v in values]
            bins = (np.arange(min(every) - 0.5, max(every) + 1.5) if key == "turns"
                    else np.histogram_bin_edges(every, bins=20))
            ax.hist(list(groups.values()), bins=bins, label=[f"{name} (n={len(v)})" for name, v in groups.items()])
            if key == "turns":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(loc="best", fontsize=8)
        ax.set_xlabel(f"{key} per trajectory")
        ax.set_ylabel("eval trials")
        ax.set_title(f"Trajectory length ({key}), before vs after RL")


def plot_dynamics(summary: dict[str, Any], lengths: dict[str, dict[str, list[int]]], out_dir: Path) -> list[Path]:
    """report/dynamics.png (per step) and report/trajectory_lengths.png (before vs after RL); their paths."""
    plt = _pyplot()
    out_dir = Path(out_dir)
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    plot_per_step(summary, axes[0], axes[1], axes[2])
    plot_probe(summary, axes[3])
    fig.tight_layout()
    written = [out_dir / "dynamics.png"]
    fig.savefig(written[0], dpi=90)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    plot_lengths(lengths, axes[0], axes[1])
    fig.tight_layout()
    written.append(out_dir / "trajectory_lengths.png")
    fig.savefig(written[1], dpi=90)
    plt.close("all")
    return written


def _q(q: dict[str, Any] | None, key: str) -> str:
    return "-" if not q or q.get(key) is None else f"{q[key]:.4g}"


def dynamics_markdown(summary: dict[str, Any]) -> list[str]:
    """summary.md's section: turns and tokens per trajectory before and after RL, then one row per learner step
    (its trials' turns and tokens, finishes, context edits, truncations), then the probe's passes."""
    lines = ["", "## Dynamics: turns and tokens per trajectory", "",
             "| trials | quantity | mean | p10 | p50 | p90 | max | n |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, title in GROUPS.items():
        for key in ("turns", "tokens"):
            q = summary[key].get(name)
            lines.append(f"| {title} | {key} | " + " | ".join(_q(q, k) for k in ("mean", "p10", "p50", "p90", "max"))
                         + f" | {q['n'] if q else 0} |")
    if summary["per_step"]:
        lines += ["", "| learner step | trials | turns mean (p10-p90) | tokens mean (p10-p90) | finishes | "
                  "context edits | truncations |", "| --- | --- | --- | --- | --- | --- | --- |"]
        turns = {p["step"]: p for p in summary["turns"]["per_step"]}
        tokens = {p["step"]: p for p in summary["tokens"]["per_step"]}
        for s in summary["per_step"]:
            t, k = turns.get(s["step"]), tokens.get(s["step"])
            lines.append(f"| {s['step']} | {s['trials']} | {_q(t, 'mean')} ({_q(t, 'p10')}-{_q(t, 'p90')}) | "
                         f"{_q(k, 'mean')} ({_q(k, 'p10')}-{_q(k, 'p90')}) | {_counts(s['finishes'])} | "
                         f"{_counts(s['context_edits'])} | {_counts(s['truncations'])} |")
    if summary["probe"]:
        lines += ["", "| probe after K steps | resolved | n | rate |", "| --- | --- | --- | --- |"]
        lines += [f"| {p['step']} | {p['resolved']} | {p['n']} | {_q(p, 'rate')} |" for p in summary["probe"]]
    return lines


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counts.items()) or "-"
