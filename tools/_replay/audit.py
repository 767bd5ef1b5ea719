"""The log's own audit: is every trial, step and version accounted for? (``t1-replay audit RUN``)

What a trusted log promises, checked from the log alone (and the weights files it names):

- every trial issued reaches exactly one final state: an eval or warm-up trial is verified; a train trial
  is admitted, dropped or cancelled (a cancelled one is closed, or resumed as a continuation that names it
  in ``resumed_from`` and has its own final state); any trial may instead fail with a recorded reason (an
  infrastructure error of its sandbox, sampler or verifier: never a reward of 0);
- a trial has at most one ``VerifierResult`` (a continuation's names the continuation, not the original whose
  sandbox it played on);
- no event is logged twice: no event id twice, and no second event with the same kind and content;
- learner steps are contiguous (0, 1, 2, ... with none missing or repeated), each consumes a trajectory
  at most once, and only admitted ones;
- weight versions are published in increasing order, once each, and each version's file matches the
  checksum its event records;
- a trial's trajectory chunks (a TITO split, a context edit or a new policy version each open one) are numbered
  0, 1, 2, ... and all carry the trial's one reward; each context edit is counted by its trial's ending.

Every count that must be 0 comes with the count of what was checked, so an audit that checked nothing
cannot pass for a clean one (``Audit.clean`` requires both).
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from schemas import (
    ContextEdited,
    Event,
    LearnerStep,
    StalenessDecision,
    TrajectoryAssembled,
    TrialEnded,
    TrialIssued,
    VerifierResult,
    WeightsPublished,
    encode,
)
from t1_actors.layout import sha256_file, weights_dir

_EXAMPLES = 5  # ids listed per finding (the counts are complete)


@dataclass
class Audit:
    events_checked: int = 0
    events_duplicated: int = 0  # a second event with the same kind and content, or an event id seen twice
    trials_issued: int = 0
    trials_unaccounted: int = 0  # no final state
    trials_final_twice: int = 0  # more than one final state
    trials_verified: int = 0  # trials with a VerifierResult
    trials_verified_twice: int = 0  # a trial with more than one VerifierResult (each names the trial it verified)
    final_states: Counter = field(default_factory=Counter)
    continuations_unlinked: int = 0  # a "resume" without the continuation naming it, or the reverse
    learner_steps: int = 0
    learner_steps_gap: int = 0  # missing or repeated step numbers
    trajectories_consumed_twice: int = 0
    trajectories_consumed_unadmitted: int = 0
    versions_published: int = 0
    versions_out_of_order: int = 0  # a version published at or below an earlier one
    weights_checked: int = 0
    weights_mismatched: int = 0  # missing file, or its sha256 differs from the event's
    trials_assembled: int = 0
    chunks_misnumbered: int = 0  # a trial's chunks are not 0, 1, 2, ... (one missing, repeated or out of order)
    chunk_rewards_differ: int = 0  # the chunks of one trial carry different rewards
    context_edits_uncounted: int = 0  # a trial's ContextEdited events differ from its TrialEnded.context_edits
    examples: dict[str, list[str]] = field(default_factory=dict)

    MUST_BE_ZERO = ("events_duplicated", "trials_unaccounted", "trials_final_twice", "trials_verified_twice",
                    "continuations_unlinked",
                    "learner_steps_gap", "trajectories_consumed_twice", "trajectories_consumed_unadmitted",
                    "versions_out_of_order", "weights_mismatched", "chunks_misnumbered", "chunk_rewards_differ",
                    "context_edits_uncounted")
    CHECKED = ("events_checked", "trials_issued")  # must be > 0 for the zeros to mean anything

    @property
    def clean(self) -> bool:
        return all(getattr(self, k) == 0 for k in self.MUST_BE_ZERO) and all(getattr(self, k) > 0
                                                                               for k in self.CHECKED)

    def note(self, finding: str, what: str) -> None:
        listed = self.examples.setdefault(finding, [])
        if len(listed) < _EXAMPLES:
            listed.append(what)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["final_states"] = dict(self.final_states)
        out["examples"] = {k: v for k, v in self.examples.items() if v}
        out["clean"] = self.clean
        return out


def audit_events(events: Iterable[tuple[str, Event]], *, weights_root: Path | None = None) -> Audit:
    """Audit ``(event_id, event)`` pairs in log order. ``weights_root``: the run directory, whose layout
    says where version v's weights are when the event's location (relative to the launch's working
    directory) is not found as it is."""
    audit = Audit()
    ids: set[str] = set()
    contents: set[bytes] = set()
    issued: dict[str, TrialIssued] = {}
    decisions: dict[str, list[str]] = defaultdict(list)
    verified: Counter = Counter()
    results: Counter = Counter()  # VerifierResults by trial, failed ones too
    failed: set[str] = set()
    continued_from: dict[str, str] = {}  # continuation -> the cancelled trial it resumes
    steps: list[LearnerStep] = []
    published: list[WeightsPublished] = []
    chunks: dict[str, list[TrajectoryAssembled]] = defaultdict(list)
    edits: Counter = Counter()
    counted_edits: dict[str, int] = {}
    for event_id, event in events:
        audit.events_checked += 1
        digest = hashlib.sha256(encode(event)).digest()
        if event_id in ids or digest in contents:
            audit.events_duplicated += 1
            audit.note("events_duplicated", f"{event_id} ({event.kind})")
        ids.add(event_id)
        contents.add(digest)
        if isinstance(event, TrialIssued):
            issued[event.trial_id] = event
            if event.resumed_from is not None:
                continued_from[event.trial_id] = event.resumed_from
        elif isinstance(event, StalenessDecision):
            decisions[event.trial_id].append(event.decision)
        elif isinstance(event, VerifierResult):
            results[event.trial_id] += 1
            if event.infra_error is not None:
                failed.add(event.trial_id)
            else:
                verified[event.trial_id] += 1
        elif isinstance(event, TrialEnded):
            counted_edits[event.trial_id] = event.context_edits
            if event.infra_error is not None:
                failed.add(event.trial_id)
        elif isinstance(event, TrajectoryAssembled):
            chunks[event.trial_id].append(event)
        elif isinstance(event, ContextEdited):
            edits[event.trial_id] += 1
        elif isinstance(event, LearnerStep):
            steps.append(event)
        elif isinstance(event, WeightsPublished):
            published.append(event)
    _audit_trials(audit, issued, decisions, verified, failed, continued_from)
    audit.trials_verified = len(results)
    for trial_id, n in results.items():
        if n > 1:
            audit.trials_verified_twice += 1
            audit.note("trials_verified_twice", f"{trial_id}: {n} VerifierResults")
    _audit_steps(audit, steps, decisions)
    _audit_versions(audit, published, weights_root)
    _audit_chunks(audit, chunks, edits, counted_edits)
    return audit


def _audit_chunks(audit: Audit, chunks: dict[str, list[TrajectoryAssembled]], edits: Counter,
                  counted_edits: dict[str, int]) -> None:
    """One trajectory per trial, however many chunks: numbered from 0 without gaps, one reward for all."""
    for trial_id, trial_chunks in chunks.items():
        audit.trials_assembled += 1
        if sorted(c.chunk for c in trial_chunks) != list(range(len(trial_chunks))):
            audit.chunks_misnumbered += 1
            audit.note("chunks_misnumbered", trial_id)
        if len({c.reward for c in trial_chunks}) > 1:
            audit.chunk_rewards_differ += 1
            audit.note("chunk_rewards_differ", trial_id)
    for trial_id, n in edits.items():
        if counted_edits.get(trial_id) != n:
            audit.context_edits_uncounted += 1
            audit.note("context_edits_uncounted", f"{trial_id}: {n} edits, its ending counts "
                                                  f"{counted_edits.get(trial_id)}")


def audit_log(log, run_dir: str | Path | None = None) -> Audit:
    """``audit_events`` over a whole ``EventLog``."""
    return audit_events(log.events(), weights_root=None if run_dir is None else Path(run_dir))


def _audit_trials(audit: Audit, issued: dict[str, TrialIssued], decisions: dict[str, list[str]],
                  verified: Counter, failed: set[str], continued_from: dict[str, str]) -> None:
    resumed_by = {original: continuation for continuation, original in continued_from.items()}
    audit.trials_issued = len(issued)
    for trial_id, trial in issued.items():
        said = decisions.get(trial_id, [])
        if trial.split == "train":
            finals = [d for d in said if d in ("admit", "drop", "cancel")]
            if "resume" in said and ("cancel" not in said or trial_id not in resumed_by):
                audit.continuations_unlinked += 1
                audit.note("continuations_unlinked", trial_id)
        else:
            finals = ["verified"] * verified[trial_id]
        if not finals and trial_id in failed:
            finals = ["failed"]
        if not finals:
            audit.trials_unaccounted += 1
            audit.note("trials_unaccounted", f"{trial_id} ({trial.split})")
        elif len(finals) > 1:
            audit.trials_final_twice += 1
            audit.note("trials_final_twice", f"{trial_id}: {finals}")
        else:
            state = finals[0]
            if state == "cancel":
                state = "cancelled, resumed" if "resume" in said else "cancelled, closed"
            audit.final_states[state] += 1
    for continuation, original in continued_from.items():
        if "resume" not in decisions.get(original, []):
            audit.continuations_unlinked += 1
            audit.note("continuations_unlinked", f"{continuation} resumes {original}, which was never resumed")


def _audit_steps(audit: Audit, steps: list[LearnerStep], decisions: dict[str, list[str]]) -> None:
    audit.learner_steps = len(steps)
    numbers = Counter(s.step for s in steps)
    if numbers:
        expected = set(range(min(min(numbers), 0), max(numbers) + 1))
        missing = sorted(expected - set(numbers))
        repeated = sorted(n for n, c in numbers.items() if c > 1)
        audit.learner_steps_gap = len(missing) + sum(numbers[n] - 1 for n in repeated)
        for n in missing:
            audit.note("learner_steps_gap", f"step {n} missing")
        for n in repeated:
            audit.note("learner_steps_gap", f"step {n} logged {numbers[n]} times")
    consumed: Counter = Counter(t for s in steps for t in s.trials)
    for trial_id, times in consumed.items():
        if times > 1:
            audit.trajectories_consumed_twice += 1
            audit.note("trajectories_consumed_twice", f"{trial_id} x{times}")
        if "admit" not in decisions.get(trial_id, []):
            audit.trajectories_consumed_unadmitted += 1
            audit.note("trajectories_consumed_unadmitted", trial_id)


def _audit_versions(audit: Audit, published: list[WeightsPublished], root: Path | None) -> None:
    audit.versions_published = len(published)
    newest = -1
    for event in published:
        if event.version <= newest:
            audit.versions_out_of_order += 1
            audit.note("versions_out_of_order", f"version {event.version} after {newest}")
        newest = max(newest, event.version)
        location = Path(event.location)
        if not location.is_dir() and root is not None:  # relative to the launch's cwd: the run's own layout
            location = weights_dir(root, event.version)
        files = sorted(location.glob("*.safetensors")) if location.is_dir() else []
        audit.weights_checked += 1
        if not files or event.sha256 not in {sha256_file(f) for f in files} | {sha256_file(*files)}:
            audit.weights_mismatched += 1
            audit.note("weights_mismatched", f"version {event.version} at {event.location}")
