"""``t1-replay export --tensorboard DIR RUN``: a run's per-step scalars as TensorBoard event files.

    export_tensorboard(view, "tb/run-a")   # then: tensorboard --logdir tb

Written with the ``tensorboard`` package (the optional extra ``t1[tensorboard]``), from the log alone:

- ``dynamics/turns/{mean,p10,p50,p90,max}`` and ``dynamics/tokens/...``: per trajectory, over the trials each
  learner step trained (``t1_actors.job.dynamics``), at that step (``LearnerStep.step``); ``dynamics/trials``;
- ``finishes/<reason>``, ``context_edits/<strategy>``, ``truncations/<what>``: the same trials' endings (reasons
  that a step lacks are written as 0 once they appear in the run, so every curve spans every step), and
  ``context_edits/total``, ``truncations/total`` at every step (0: nothing edited, nothing cut);
- ``learner/<metric>``: every ``LearnerStep.metrics`` value, at its step;
- ``probe/resolved_rate``, ``probe/mean_reward``: the validation probe after K learner steps, at step K.

Exporting again replaces what an earlier export wrote in DIR (event files named ``*.t1-replay``); other files in
DIR are left alone. The new file is written aside and moved in, so DIR never holds half of an export.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from schemas import EvalResult, LearnerStep
from storage import EventLog
from t1_actors.eval.protocol import probe_step
from t1_actors.job.dynamics import QUANTILES, Dynamics

SUFFIX = ".t1-replay"  # ends the name of every event file this exporter writes (TensorBoard reads "*tfevents*")
EXTRA = "t1[tensorboard]"


class TensorBoardMissing(RuntimeError):
    """The ``tensorboard`` package is not installed; the message names the extra that installs it."""


def scalars(events: list, times: dict[str, float] | None = None) -> list[tuple[str, int, float, float]]:
    """(tag, step, value, wall time) of every scalar the export writes, from ``(event_id, event)`` pairs in log
    order. The wall time of step k is the append time (``times``: event id -> Unix seconds) of its ``LearnerStep``,
    of a probe its ``EvalResult``'s; 0.0 where ``times`` lacks it."""
    dynamics = Dynamics.fold(events)
    summary = dynamics.summary()
    wall: dict[tuple[str, int], float] = {}
    for event_id, event in events:
        if isinstance(event, LearnerStep):
            wall["step", event.step] = (times or {}).get(event_id, 0.0)
        elif isinstance(event, EvalResult) and (step := probe_step(event.label)) is not None:
            wall["probe", step] = (times or {}).get(event_id, 0.0)
    out: list[tuple[str, int, float]] = []
    for key in ("turns", "tokens"):
        for point in summary[key]["per_step"]:
            for stat in ("mean", *QUANTILES, "max"):
                if point.get(stat) is not None:
                    out.append((f"dynamics/{key}/{stat}", point["step"], float(point[stat])))
    for entry in summary["per_step"]:
        out.append(("dynamics/trials", entry["step"], float(entry["trials"])))
    for key in ("finishes", "context_edits", "truncations"):
        reasons = sorted({r for entry in summary["per_step"] for r in entry[key]})
        for entry in summary["per_step"]:
            out += [(f"{key}/{reason}", entry["step"], float(entry[key].get(reason, 0))) for reason in reasons]
            if key != "finishes":  # a curve at 0 says nothing was cut or edited
                out.append((f"{key}/total", entry["step"], float(sum(entry[key].values()))))
    for step, event in sorted(dynamics.steps.items()):
        out += [(f"learner/{name}", step, float(value)) for name, value in sorted(event.metrics.items())]
    for probe in summary["probe"]:
        if probe["rate"] is not None:
            out.append(("probe/resolved_rate", probe["step"], float(probe["rate"])))
        out.append(("probe/mean_reward", probe["step"], float(probe["mean_reward"])))
    return [(tag, step, value, wall.get(("probe" if tag.startswith("probe/") else "step", step), 0.0))
            for tag, step, value in out]


def _writer_class() -> Any:
    try:
        from tensorboard.summary import Writer  # noqa: PLC0415 - optional extra: only this command needs it
    except ImportError as exc:
        raise TensorBoardMissing(f"t1-replay export --tensorboard needs the tensorboard package: pip install "
                                 f"'{EXTRA}' (or pip install tensorboard) ({exc})") from exc
    return Writer


def export_tensorboard(view, out_dir: str | Path) -> dict[str, Any]:
    """The run's per-step scalars (``scalars``) as one TensorBoard event file in ``out_dir``, replacing the files an
    earlier export wrote there. Returns {"dir", "files", "removed", "tags", "scalars", "steps"}."""
    writer_class = _writer_class()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    points = scalars(view.events, dict(EventLog.open(view.log_path).append_times(["learner_step", "eval_result"])))
    staging = Path(tempfile.mkdtemp(prefix=".t1-replay-export-", dir=out))
    try:
        writer = writer_class(str(staging))
        for tag, step, value, wall_time in points:
            writer.add_scalar(tag, value, step, wall_time=wall_time)  # when the log got it, not the export's clock
        writer.close()
        written = sorted(staging.iterdir())
        removed = sorted(p.name for p in out.iterdir() if p.is_file() and "tfevents" in p.name
                         and p.name.endswith(SUFFIX))
        for name in removed:
            (out / name).unlink()
        files = []
        for path in written:
            target = out / (path.name + SUFFIX)
            os.replace(path, target)
            files.append(str(target))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"dir": str(out), "files": files, "removed": removed, "tags": sorted({p[0] for p in points}),
            "scalars": len(points), "steps": sorted({p[1] for p in points})}
