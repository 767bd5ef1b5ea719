"""``t1-actor launch --resume``: a campaign whose every process died at once (a reboot, the process group
killed) goes on from its log, in the same run directory.

What a relaunch may rely on, and what this module checks before anything starts (``resume_state``):

- the config decides what the run computes exactly as the run's ``config.resolved.json`` does: every key but
  the few that only say how processes talk, are restarted or were filled in by the job (``OPERATIONAL``);
  a difference is refused naming each key (``--quick`` included: its overrides change keys);
- phases 1-3 are skipped when the run's tokenizer and policy version 0 are on disk and the log holds
  ``WeightsPublished`` v0 (``Resume.prepared``); otherwise they run again, as on a first launch;
- the actors then start on the existing log and resume from it as a restarted actor does (docs/runtime.md): the
  learner from its checkpoint (the next step number follows the last logged one), the critic from its own, the
  staleness controller skips what the log shows done, closes or resumes what was in flight, and goes on with a
  half-played eval pass from its verified attempts; the samplers serve the newest published version;
- RL's wall-clock budget (``rl_seconds``) does not count the time the campaign was down: from the log's last
  event to the relaunch (``Resume.down_s``, added to each staleness controller's paused time);
- a run whose log holds the RL policy's last eval pass is over: only its summary is written again.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas import EvalResult, WeightsPublished
from storage import EventLog, LogError
from storage.config import StorageConfig
from t1_actors.job.config import parse_config
from t1_actors.layout import has_log, tokenizer_path, weights_dir

RESOLVED = "config.resolved.json"
SFT_REPORT = "sft.json"  # phase 3's report and timings, kept for a relaunch's summary

# Keys that do not decide what a run computes: how its processes talk, are restarted and placed, and what the job
# itself fills in (the vocabulary from the run's tokenizer, a local SGLang server's URL, the policy a sampler starts
# from). An actor's addresses are how it is reached: a run resubmitted to Slurm gets other nodes, so other addresses.
OPERATIONAL = ("run.dir", "transport.", "supervisor.", "slurm.", "model.vocab_size", "sampler.sglang_url")
ACTOR_OPERATIONAL = re.compile(r"^actors\[[^\]]+\]\.(address|bulk_address)$")
SAMPLER_SET_BY_JOB = ("policy_path", "initial_version")


class ResumeError(ValueError):
    """The run directory cannot be resumed with this config (found before anything started)."""


@dataclass
class Resume:
    """What a relaunch finds in the run directory."""

    prepared: bool  # tokenizer, weights v0 and WeightsPublished v0: phases 1-3 are done
    finished: bool  # the RL policy's last eval pass is logged: only the summary is left
    newest: WeightsPublished | None  # the newest published version (what the samplers start from)
    down_s: float  # seconds from the log's last event to this relaunch
    sft: dict[str, Any] | None = None  # phase 3's report, as the first launch wrote it
    timings: dict[str, float] = field(default_factory=dict)  # phases 2-3's seconds, as the first launch took them


def flatten(config_json: dict[str, Any]) -> dict[str, Any]:
    """A resolved config as dotted keys (``campaign.rl_steps``; ``actors[sampler-0].options.seed``), without the
    ``OPERATIONAL`` keys and the sampler options the job sets."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            out[prefix] = value

    for section, value in config_json.items():
        if section != "actors":
            walk(section, value)
    for spec in config_json.get("actors", []):
        spec = dict(spec)
        if spec.get("role") == "sampler":
            spec["options"] = {k: v for k, v in (spec.get("options") or {}).items() if k not in SAMPLER_SET_BY_JOB}
        walk(f"actors[{spec.get('name')}]", spec)
    return {k: v for k, v in out.items() if not any(k == o or (o.endswith(".") and k.startswith(o))
                                                     for o in OPERATIONAL)
            and not ACTOR_OPERATIONAL.match(k)}


def differing_keys(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """The keys (``flatten``'s) whose values differ between two resolved configs, or that only one has."""
    a, b = flatten(ours), flatten(theirs)
    return sorted(k for k in set(a) | set(b) if a.get(k, "<unset>") != b.get(k, "<unset>"))


def check_same_config(config, run_dir: Path) -> None:
    """Refuse a config that would compute something else than the run's: ``ResumeError`` naming the keys."""
    path = run_dir / RESOLVED
    try:
        data = json.loads(path.read_text())
        theirs = parse_config(data, str(path)).to_jsonable()  # defaults of keys added since filled in, as here
    except (OSError, ValueError) as error:
        raise ResumeError(f"{run_dir}: cannot read the config it ran with ({error}); nothing was touched") from None
    keys = differing_keys(config.to_jsonable(), theirs)
    if keys:
        a, b = flatten(config.to_jsonable()), flatten(theirs)
        shown = "; ".join(f"{k}: run {b.get(k, '<unset>')!r}, this config {a.get(k, '<unset>')!r}" for k in keys[:8])
        more = f" (and {len(keys) - 8} more)" if len(keys) > 8 else ""
        raise ResumeError(f"--resume: this config differs from {path} in {len(keys)} key(s) that decide what the run "
                          f"computes: {shown}{more}; resume with the config (and --quick, if any) of the first "
                          "launch, or launch a new run with --run-dir NEW_DIR (nothing was touched)")


def rl_over(evals: list[EvalResult]) -> bool:
    """Whether the RL policy's last eval pass is logged: the campaign's actors phase is over."""
    return any(e.last and (e.label == "after" or e.label.startswith("rl_")) for e in evals)


def resume_state(config) -> Resume:
    """Check that ``config``'s run directory can be resumed with it, and read where the run stands."""
    run_dir = Path(config.run.dir)
    if not has_log(run_dir):  # killed before the log existed (phases 1-3): they run again
        if (run_dir / RESOLVED).is_file():
            check_same_config(config, run_dir)
        return Resume(prepared=False, finished=False, newest=None, down_s=0.0)
    check_same_config(config, run_dir)
    try:
        log = EventLog.open(config.log_location(), config=config.section(StorageConfig))
        published = [e for _, e in log.events(kinds=["weights_published"]) if isinstance(e, WeightsPublished)]
        evals = [e for _, e in log.events(kinds=["eval_result"]) if isinstance(e, EvalResult)]
        times = log.append_times()
    except LogError as error:
        raise ResumeError(f"--resume: {run_dir}'s log cannot be read: {error}") from None
    down_s = max(0.0, time.time() - times[-1][1]) if times else 0.0
    newest = max(published, key=lambda e: e.version, default=None)
    prepared = any(e.version == 0 for e in published)
    if prepared:
        missing = [str(p) for p in (tokenizer_path(run_dir), weights_dir(run_dir, 0)) if not p.exists()]
        if missing:
            raise ResumeError(f"--resume: the log holds policy version 0 but {', '.join(missing)} is gone; the run "
                              "cannot go on without them (launch a new run with --run-dir NEW_DIR)")
    kept: dict[str, Any] = {}
    try:
        kept = json.loads((run_dir / SFT_REPORT).read_text())
    except (OSError, ValueError):
        pass  # a run made before relaunches kept it: its summary says sft null
    return Resume(prepared=prepared, finished=prepared and rl_over(evals), newest=newest, down_s=down_s,
                  sft=kept.get("sft"), timings=dict(kept.get("timings_s", {})))


def keep_sft_report(run_dir: Path, sft: dict[str, Any], timings: dict[str, float]) -> None:
    """Phase 3's report and the seconds phases 2-3 took, for the summary a relaunch writes."""
    partial = run_dir / (SFT_REPORT + ".partial")
    partial.write_text(json.dumps({"sft": sft, "timings_s": timings}, indent=2, sort_keys=True))
    partial.replace(run_dir / SFT_REPORT)
