"""Training-inference drift of logged trajectories, with and without R3 and TITO.

For every logged trajectory the learner-side logprobs are recomputed with the policy version that
sampled each loss token, at the sampling temperature, four ways:

- ``r3_tito``: sampled ids (TITO), expert selection replayed from the record (R3) - the recipe;
- ``tito``: sampled ids, live routing;
- ``r3``: re-rendered ids (decode, re-tokenize: what a trainer without TITO trains on), routing
  replayed from the record of the sampled token that holds each re-rendered token's first byte;
- ``none``: re-rendered ids, live routing.

The gap of a loss token is |train logprob - sampler logprob|. On re-rendered ids a token is compared
one to one where both streams have the same token over the same bytes; where they segment the bytes
differently the segment's summed logprobs are compared and the difference shared over its sampled loss
tokens (per-token mean stays token-weighted). Also measured: routing mismatch per layer without replay
(share of positions whose selected expert set differs from the record), loss-region drift (trained ids
that differ from the ids the sampler emitted, from the SamplerTurn events; TITO guarantees 0), the
boundary repair cases and the share of loss tokens whose turn boundary needed retokenization; and, over every
assembled trial whatever the limit, the boundaries' case shares and the tokens the template changed between
turns (``boundaries``, see ``tools._replay.boundaries``).
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from schemas import SamplerTurn, TrajectoryAssembled, TrialIssued
from t1_actors import tito
from tools._replay.align import Rerendered, rerender
from tools._replay.boundaries import boundary_report
from tools._replay.run import RunError

MODES = ("r3_tito", "tito", "r3", "none")


def token_logprobs(model, ids: np.ndarray, *, routing_replay: np.ndarray | None = None,
                   temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """log pi(T_j | T_<j) at temperature for j >= 1 (index 0 is NaN), and the routing used [n-1, L, k].

    The last token is never fed (it has no successor), so ``routing_replay`` needs rows for the first
    n - 1 positions only.
    """
    n = len(ids)
    inputs = torch.from_numpy(ids[:-1].astype(np.int64)).unsqueeze(0)
    replay = None
    if routing_replay is not None:
        replay = torch.from_numpy(np.asarray(routing_replay[: n - 1]).astype(np.int64)).unsqueeze(0)
    with torch.no_grad():
        out = model(inputs, routing_replay=replay, capture_routing=True)
    logp = torch.log_softmax(out.logits[0].double() / temperature, dim=-1)
    picked = logp.gather(-1, torch.from_numpy(ids[1:].astype(np.int64)).unsqueeze(-1)).squeeze(-1)
    lp = np.full(n, np.nan)
    lp[1:] = picked.numpy()
    return lp, out.routing[0].numpy()


def routing_mismatch(live: np.ndarray, record: np.ndarray) -> np.ndarray:
    """Per layer, the share of positions whose selected expert SET differs from the record. [L]"""
    rows = min(len(live), len(record))
    a = np.sort(live[:rows].astype(np.int64), axis=-1)
    b = np.sort(record[:rows].astype(np.int64), axis=-1)
    return (a != b).any(axis=-1).mean(axis=0) if rows else np.zeros(live.shape[1])


def row_versions(loss_mask: np.ndarray, token_versions: np.ndarray, default: int) -> np.ndarray:
    """Policy version that produced routing row p (fed position p): the version of the first loss token
    after p - the turn that consumed p - or the last loss token's version past the final turn."""
    n = len(loss_mask)
    out = np.full(max(n - 1, 0), default, dtype=np.int64)
    nxt = default
    for p in range(n - 2, -1, -1):
        if loss_mask[p + 1]:
            nxt = int(token_versions[p + 1])
        out[p] = nxt
    return out


@dataclass
class GapStats:
    total: float = 0.0
    count: int = 0
    max: float = 0.0

    def add(self, values: np.ndarray) -> None:
        values = np.abs(values[np.isfinite(values)])
        if len(values):
            self.total += float(values.sum())
            self.count += len(values)
            self.max = max(self.max, float(values.max()))

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass
class DriftReport:
    trajectories: int = 0
    loss_tokens: int = 0
    gaps: dict[str, GapStats] = field(default_factory=lambda: {m: GapStats() for m in MODES})
    mismatch_sum: np.ndarray | None = None
    mismatch_n: int = 0
    drifted_loss_tokens: int = 0
    checked_loss_tokens: int = 0
    logprob_record_mismatch: int = 0
    rerendered_drifted: int = 0
    rerendered_loss_tokens: int = 0
    out_of_vocab_tokens: int = 0
    retokenized_loss_tokens: int = 0
    repair_cases: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    versions: set = field(default_factory=set)
    by_case: dict[str, GapStats] = field(default_factory=dict)
    # (trials whose loss tokens span one policy version or several, mode) -> gap: R3 must be exact across versions
    by_versions: dict[tuple[str, str], GapStats] = field(default_factory=dict)

    def to_json(self) -> dict:
        share = lambda a, b: a / b if b else None  # noqa: E731
        per_layer = (self.mismatch_sum / self.mismatch_n).tolist() if self.mismatch_n else []
        out = {f"gap_{m}": self.gaps[m].mean for m in MODES}
        out.update({f"gap_{m}_max": (self.gaps[m].max if self.gaps[m].count else None) for m in MODES})
        out.update({
            "trajectories": self.trajectories,
            "loss_tokens": self.loss_tokens,
            "drift_rate_loss": share(self.drifted_loss_tokens, self.checked_loss_tokens),
            "drift_rate_loss_rerendered": share(self.rerendered_drifted, self.rerendered_loss_tokens),
            "logprob_record_mismatch": self.logprob_record_mismatch,
            "retokenized_share": share(self.retokenized_loss_tokens, self.loss_tokens),
            "out_of_vocab_tokens": self.out_of_vocab_tokens,
            "repair_cases": dict(self.repair_cases),
            "routing_mismatch": {"per_layer": per_layer,
                                 "mean": float(np.mean(per_layer)) if per_layer else None},
            "gap_r3_tito_by_case": {case: g.mean for case, g in sorted(self.by_case.items())},
            "gap_by_versions": {span: {mode: g.mean for (s, mode), g in sorted(self.by_versions.items()) if s == span}
                                for span in sorted({s for s, _ in self.by_versions})},
            "loss_tokens_by_versions": {span: g.count for (span, mode), g in sorted(self.by_versions.items())
                                        if mode == "tito"},
            "versions": sorted(self.versions),
            "skipped": dict(self.skipped),
        })
        return out


def loss_runs(loss_mask: np.ndarray) -> list[tuple[int, int]]:
    """Contiguous runs [start, end) of loss tokens (one per sampled turn)."""
    runs, start = [], None
    for j, m in enumerate(loss_mask.tolist() + [0]):
        if m and start is None:
            start = j
        elif not m and start is not None:
            runs.append((start, j))
            start = None
    return runs


CASE_ORDER = ("single_turn", "strict", "version", "normalized", "retokenized", "split")


def worst_case(traj: TrajectoryAssembled) -> str:
    """The weakest repair a chunk needed (normalized and retokenized train on a slightly different context)."""
    cases = [c for c in traj.boundary_cases]
    return max(cases, key=CASE_ORDER.index) if cases else "single_turn"


def retokenized_loss_tokens(traj: TrajectoryAssembled) -> int:
    """Loss tokens of the turns whose outgoing boundary was repaired by retokenization (case 3).

    ``boundary_cases[n]`` is the repair leading into the chunk's turn n (chunk 0 has none for its first
    turn, a later chunk's first entry is its incoming split), as ``t1_actors.tito`` records them; a turn's
    sampled ids are one loss run.
    """
    runs = loss_runs(np.asarray(traj.loss_mask))
    offset = 1 if traj.chunk > 0 else 0
    cases = list(traj.boundary_cases)[offset:]
    return sum(end - start for (start, end), case in zip(runs, cases) if case == "retokenized")


def sampled_stream(turns: list[SamplerTurn]) -> tuple[np.ndarray, np.ndarray]:
    """The ids and logprobs the sampler emitted in a trial, turn after turn."""
    turns = sorted(turns, key=lambda t: t.turn)
    if not turns:
        return np.zeros(0, np.int32), np.zeros(0, np.float32)
    return (np.concatenate([t.sampled_ids for t in turns]),
            np.concatenate([t.sampler_logprobs for t in turns]))


def loss_region_drift(trained: np.ndarray, sampled: np.ndarray) -> int:
    """Loss tokens whose trained id is not the sampled id at that place (insertions/deletions count)."""
    if len(trained) == len(sampled):
        return int((trained != sampled).sum())
    matcher = difflib.SequenceMatcher(a=trained.tolist(), b=sampled.tolist(), autojunk=False)
    equal = sum(block.size for block in matcher.get_matching_blocks())
    return int(len(trained) - equal)


def check_loss_region(report: DriftReport, chunks: list[TrajectoryAssembled], turns: list[SamplerTurn]) -> None:
    """Compare a trial's loss region (all chunks, in order) with the ids and logprobs its sampler emitted."""
    chunks = sorted(chunks, key=lambda c: c.chunk)
    trained = np.concatenate([np.asarray(c.token_ids)[np.asarray(c.loss_mask).astype(bool)] for c in chunks])
    logprobs = np.concatenate([np.asarray(c.sampler_logprobs)[np.asarray(c.loss_mask).astype(bool)] for c in chunks])
    sampled_ids, sampled_lp = sampled_stream(turns)
    report.checked_loss_tokens += len(trained)
    report.drifted_loss_tokens += loss_region_drift(trained, sampled_ids)
    if len(sampled_lp) != len(logprobs) or not np.array_equal(logprobs.astype(np.float32), sampled_lp):
        report.logprob_record_mismatch += 1


def measure(report: DriftReport, traj: TrajectoryAssembled, *, models, temperature: float, tokenizer,
            trial_spans_versions: bool = False) -> None:
    """Add one trajectory chunk to ``report``. ``models(version)`` returns the policy of a version;
    ``trial_spans_versions``: the chunk's trial has loss tokens of several policy versions (its gaps are also
    reported apart: ``gap_by_versions``)."""
    ids = np.asarray(traj.token_ids)
    mask = np.asarray(traj.loss_mask).astype(bool)
    q = np.asarray(traj.sampler_logprobs, dtype=np.float64)
    versions = np.asarray(traj.token_versions)
    loss = np.flatnonzero(mask)
    if len(ids) < 2 or not len(loss):
        report.skipped["no loss tokens"] += 1
        return
    policies = {v: models(v) for v in sorted({int(v) for v in versions[loss]})}  # fails before counting
    report.trajectories += 1
    report.loss_tokens += len(loss)
    report.repair_cases.update(traj.boundary_cases)
    report.retokenized_loss_tokens += retokenized_loss_tokens(traj)
    record = np.asarray(traj.routing) if traj.routing is not None else None
    loss_versions = sorted({int(v) for v in versions[loss]})
    report.versions.update(loss_versions)

    # --- TITO: the sampled ids
    lp = {"r3_tito": np.full(len(ids), np.nan), "tito": np.full(len(ids), np.nan)}
    live_rows = np.zeros((len(ids) - 1, 0, 0))
    rows_version = row_versions(mask, versions, loss_versions[-1])
    sampled_lp: dict[int, dict[str, np.ndarray]] = {}  # every position's logprob, per version and routing
    for v in loss_versions:
        model = policies[v]
        at = loss[versions[loss] == v]
        plain, live = token_logprobs(model, ids, temperature=temperature)
        sampled_lp[v] = {"none": plain}
        lp["tito"][at] = plain[at]
        if v == loss_versions[0]:
            live_rows = live.copy()
        live_rows[rows_version == v] = live[rows_version == v]
        if record is not None:
            replayed, _ = token_logprobs(model, ids, routing_replay=record, temperature=temperature)
            sampled_lp[v]["r3"] = replayed
            lp["r3_tito"][at] = replayed[at]
    span = "multi_version" if trial_spans_versions else "single_version"
    report.gaps["tito"].add(lp["tito"][loss] - q[loss])
    report.by_versions.setdefault((span, "tito"), GapStats()).add(lp["tito"][loss] - q[loss])
    if record is not None:
        report.gaps["r3_tito"].add(lp["r3_tito"][loss] - q[loss])
        report.by_versions.setdefault((span, "r3_tito"), GapStats()).add(lp["r3_tito"][loss] - q[loss])
        report.by_case.setdefault(worst_case(traj), GapStats()).add(lp["r3_tito"][loss] - q[loss])
        mism = routing_mismatch(live_rows, record)
        report.mismatch_sum = mism if report.mismatch_sum is None else report.mismatch_sum + mism
        report.mismatch_n += 1
    else:
        report.skipped["no routing record (R3 not measurable)"] += 1

    # --- without TITO: re-rendered ids
    if tokenizer is None:
        report.skipped["no tokenizer (re-rendered modes not measurable)"] += 1
        return
    unknown = int((ids >= tokenizer.get_vocab_size()).sum())
    if unknown:
        # the policy can emit ids the tokenizer lacks (model vocab > tokenizer vocab): no text to re-render
        report.out_of_vocab_tokens += unknown
        report.skipped["ids outside the tokenizer's vocabulary (re-rendered modes not measurable)"] += 1
        return
    twin = rerender(tokenizer, ids)
    if not twin.decodable:
        report.skipped["sampled bytes not re-renderable"] += 1
        return
    _measure_rerendered(report, twin, ids, mask, q, versions, record, policies, sampled_lp, temperature)


def _measure_rerendered(report: DriftReport, twin: Rerendered, ids, mask, q, versions, record, policies,
                        sampled_lp, temperature: float) -> None:
    """Gaps on re-rendered ids. Per segment of common boundaries: log p_train(segment's bytes as
    re-rendered) - log p(the same bytes as sampled), where the sampled side is the sampler's logprob on loss
    tokens and the learner's own (same routing mode) on context tokens merged into the segment; spread
    over the segment's loss tokens. A segment that is one identical token on both sides is a plain
    per-token gap."""
    new_ids = twin.ids
    if len(new_ids) < 2:
        return
    # routing of each re-rendered position: the record of the sampled token holding its first byte
    owner = np.searchsorted(twin.sampled_spans[:, 1], twin.rerendered_spans[:, 0], side="right")
    mapped = None
    if record is not None:
        mapped = record[np.clip(owner[: len(new_ids) - 1], 0, len(record) - 1)]
    by_version: dict[int, dict[str, np.ndarray]] = {}
    for v, model in policies.items():
        by_version[v] = {"none": token_logprobs(model, new_ids, temperature=temperature)[0]}
        if mapped is not None:
            by_version[v]["r3"] = token_logprobs(model, new_ids, routing_replay=mapped, temperature=temperature)[0]
    for seg_sampled, seg_new in twin.segments:
        loss_here = [j for j in seg_sampled if mask[j]]
        if not loss_here:
            continue
        report.rerendered_loss_tokens += len(loss_here)
        same = len(seg_sampled) == 1 and len(seg_new) == 1 and ids[seg_sampled[0]] == new_ids[seg_new[0]]
        if not same:
            report.rerendered_drifted += len(loss_here)
        if seg_new[0] == 0:
            continue  # the very first token has no logprob
        if seg_sampled[0] == 0:
            continue
        v = int(versions[loss_here[0]])
        context = [j for j in seg_sampled if not mask[j]]
        for mode, lp in by_version[v].items():
            sampled_side = q[loss_here].sum() + sampled_lp[v][mode][context].sum()
            diff = float(lp[seg_new].sum() - sampled_side) / len(loss_here)
            report.gaps[mode].add(np.full(len(loss_here), diff))


def lineage_turns(trial_id: str, turns_by_trial: dict[str, list[SamplerTurn]],
                  parents: dict[str, str | None]) -> list[SamplerTurn]:
    """A trial's sampler turns including those of the trials it continues (partial-rollout resumption:
    ``TrialIssued.resumed_from``); a turn number the continuation sampled again is taken from it."""
    chain, seen = [], set()
    while trial_id is not None and trial_id not in seen:
        seen.add(trial_id)
        chain.append(trial_id)
        trial_id = parents.get(trial_id)
    by_turn: dict[int, SamplerTurn] = {}
    for tid in reversed(chain):  # oldest first, so later trials overwrite re-sampled turns
        for t in turns_by_trial.get(tid, []):
            by_turn[t.turn] = t
    return [by_turn[k] for k in sorted(by_turn)]


def whole_turns(turns: list[SamplerTurn]) -> list[SamplerTurn]:
    """A trial's lineage with every record whole (``tito.expand_turns``); the turns up to the first that extends a
    turn the log does not hold (a lineage cut short) when one does."""
    try:
        return tito.expand_turns(turns)
    except tito.TitoError:
        whole: list[SamplerTurn] = []
        for turn in turns:
            try:
                whole = tito.expand_turns([*whole, turn])
            except tito.TitoError:
                break
        return whole


def drift_of_run(view, *, limit: int | None = None, tokenizer=None, trial: str | None = None) -> dict:
    """Drift of every logged trajectory chunk of a run (``view``: a ``RunView``), as one JSON-able dict.

    ``limit``: only the first ``limit`` trials (log order of their first chunk), each with every chunk it has, so
    that each of them is measured and checked exactly as a run without the limit checks it (a trial's loss region
    is compared with its sampler's whole stream: a trial cut between its chunks would not match it).
    """
    report = DriftReport()
    parents = {e.trial_id: e.resumed_from for _, e in view.of_kind(TrialIssued)}
    own_turns = view.sampler_turns()
    turns_by_trial = {tid: whole_turns(lineage_turns(tid, own_turns, parents)) for tid in set(own_turns) | set(parents)}
    chunks = [e for _, e in view.of_kind(TrajectoryAssembled) if trial is None or e.trial_id == trial]
    every_trial: dict[str, list[TrajectoryAssembled]] = {}
    for traj in chunks:
        every_trial.setdefault(traj.trial_id, []).append(traj)
    boundaries = boundary_report(every_trial, turns_by_trial, tokenizer)  # all trials: no model needed
    versions_of_trial = {tid: {int(v) for c in cs for v in np.asarray(c.token_versions)[np.asarray(c.loss_mask) > 0]}
                         for tid, cs in every_trial.items()}
    if limit is not None:
        first_trials = set(list(every_trial)[:limit])  # every_trial: in log order of each trial's first chunk
        chunks = [traj for traj in chunks if traj.trial_id in first_trials]
    for traj in chunks:
        turns = turns_by_trial.get(traj.trial_id, [])
        temperature = turns[0].temperature if turns else 1.0
        try:
            measure(report, traj, models=view.model, temperature=temperature, tokenizer=tokenizer,
                    trial_spans_versions=len(versions_of_trial[traj.trial_id]) > 1)
        except RunError as exc:  # e.g. a version's weights were not kept: measure the others
            report.skipped[str(exc)] += 1
    by_trial: dict[str, list[TrajectoryAssembled]] = {}
    for traj in chunks:
        by_trial.setdefault(traj.trial_id, []).append(traj)
    for trial_id, trial_chunks in by_trial.items():
        if turns_by_trial.get(trial_id):
            check_loss_region(report, trial_chunks, turns_by_trial[trial_id])
        else:
            report.skipped["no SamplerTurn events for the trial (loss-region drift not checked)"] += 1
    if chunks and report.trajectories == 0 and report.skipped:
        raise RunError("no trajectory could be replayed: " + "; ".join(report.skipped))
    out = report.to_json()
    out["boundaries"] = boundaries
    out["run"] = str(view.root or view.log_path)
    out["checksums"] = {str(v): view.weights_checksum_ok(v) for v in sorted(report.versions)}
    return out
