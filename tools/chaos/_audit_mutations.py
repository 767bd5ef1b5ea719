"""The audit's own positive controls: the campaign's real log, doctored one way at a time, must fail it.

A clean audit means something only if the same audit, on the same log with one fact removed, repeated or
changed, is not clean. Each mutation below picks its target from the log itself (a real eval trial's
verification, a real admitted trajectory, a real published version...), is audited with ``audit_events``
and counts as caught when the finding it names is >= 1 and the audit is no longer clean. A mutation whose
target the log lacks (no continuation was resumed, one learner step only) is listed as not applicable,
never counted as caught.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from schemas import Event, LearnerStep, StalenessDecision, TrialIssued, VerifierResult, WeightsPublished
from t1_actors.layout import weights_dir
from tools._replay.audit import audit_events

Events = list[tuple[str, Event]]


def _first(events: Events, match: Callable[[Event], bool]) -> int | None:
    return next((i for i, (_, e) in enumerate(events) if match(e)), None)


def _without(events: Events, index: int | None) -> Events | None:
    return None if index is None else events[:index] + events[index + 1:]


def _result_removed(events: Events, scratch: Path) -> Events | None:
    verified = {e.trial_id for _, e in events if isinstance(e, TrialIssued) and e.split in ("eval", "warmup")}
    return _without(events, _first(events, lambda e: isinstance(e, VerifierResult) and e.trial_id in verified
                                   and e.infra_error is None))


def _admission_removed(events: Events, scratch: Path) -> Events | None:
    return _without(events, _first(events, lambda e: isinstance(e, StalenessDecision) and e.decision == "admit"))


def _logged_twice(events: Events, scratch: Path) -> Events | None:
    i = _first(events, lambda e: isinstance(e, TrialIssued))
    return None if i is None else events + [("chaos:again", events[i][1])]


def _id_twice(events: Events, scratch: Path) -> Events | None:
    i = _first(events, lambda e: isinstance(e, VerifierResult))
    if i is None:
        return None
    copy = events[i][1].model_copy(update={"duration_s": events[i][1].duration_s + 1.0})  # other content
    return events + [(events[i][0], copy)]


def _decided_twice(events: Events, scratch: Path) -> Events | None:
    i = _first(events, lambda e: isinstance(e, StalenessDecision) and e.decision == "admit")
    return None if i is None else events + [("chaos:drop", events[i][1].model_copy(update={"decision": "drop"}))]


def _continuation_unlinked(events: Events, scratch: Path) -> Events | None:
    return _without(events, _first(events, lambda e: isinstance(e, TrialIssued) and e.resumed_from is not None))


def _step_removed(events: Events, scratch: Path) -> Events | None:
    steps = [e for _, e in events if isinstance(e, LearnerStep)]
    if len(steps) < 2:
        return None
    return _without(events, _first(events, lambda e: isinstance(e, LearnerStep) and e.step == steps[0].step))


def _consumed_twice(events: Events, scratch: Path) -> Events | None:
    steps = [e for _, e in events if isinstance(e, LearnerStep) and e.trials]
    if not steps:
        return None
    last = max(steps, key=lambda s: s.step)
    again = last.model_copy(update={"step": last.step + 1, "policy_version": last.policy_version + 1,
                                    "trials": steps[0].trials[:1]})
    return events + [("chaos:step", again)]


def _version_out_of_order(events: Events, scratch: Path) -> Events | None:
    published = [e for _, e in events if isinstance(e, WeightsPublished)]
    if len(published) < 2:
        return None
    return events + [("chaos:version", published[1])]


def _weights_changed(events: Events, scratch: Path) -> Events | None:
    def where(e: WeightsPublished) -> Path:  # as the audit finds it: the location, else the run's layout
        return Path(e.location) if Path(e.location).is_dir() else weights_dir(scratch.parent, e.version)

    i = _first(events, lambda e: isinstance(e, WeightsPublished) and (where(e) / "model.safetensors").is_file())
    if i is None:
        return None
    published = events[i][1]
    copy = scratch / f"weights-v{published.version}"
    shutil.copytree(where(published), copy, dirs_exist_ok=True)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight
    weights.write_bytes(bytes(data))
    return events[:i] + [(events[i][0], published.model_copy(update={"location": str(copy)}))] + events[i + 1:]


# name -> (the audit's count that must catch it, the mutation)
MUTATIONS: dict[str, tuple[str, Callable[[Events, Path], Events | None]]] = {
    "an eval trial's verification removed": ("trials_unaccounted", _result_removed),
    "a train trial's admission removed": ("trials_unaccounted", _admission_removed),
    "an event logged twice": ("events_duplicated", _logged_twice),
    "an event id used twice": ("events_duplicated", _id_twice),
    "a second final decision": ("trials_final_twice", _decided_twice),
    "a continuation's issue removed": ("continuations_unlinked", _continuation_unlinked),
    "a learner step removed": ("learner_steps_gap", _step_removed),
    "a trajectory consumed twice": ("trajectories_consumed_twice", _consumed_twice),
    "a version published again": ("versions_out_of_order", _version_out_of_order),
    "a published weights file changed": ("weights_mismatched", _weights_changed),
}


def audit_mutations(events: Iterable[tuple[str, Event]], run_dir: Path) -> dict[str, Any]:
    """Each mutation of the log's ``events`` audited (scratch files under ``RUN/audit-mutations``);
    ``{tried, caught}`` and each one's outcome."""
    events = list(events)
    scratch = run_dir / "audit-mutations"
    scratch.mkdir(parents=True, exist_ok=True)
    each: dict[str, dict[str, Any]] = {}
    for name, (finding, mutate) in MUTATIONS.items():
        doctored = mutate(events, scratch)
        if doctored is None:
            each[name] = {"finding": finding, "applicable": False}
            continue
        audit = audit_events(doctored, weights_root=run_dir)
        each[name] = {"finding": finding, "applicable": True,
                      "caught": getattr(audit, finding) >= 1 and not audit.clean}
    tried = [e for e in each.values() if e["applicable"]]
    return {"audit_mutations": {"tried": len(tried), "caught": sum(e["caught"] for e in tried)},
            "audit_mutations_each": each}
