"""t1-replay drift on a small real run: real weights per version, real sampler, real TITO, real log."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from _replay_data import build_run

from schemas import SamplerTurn, TrajectoryAssembled
from storage import EventLog
from tools._replay.align import rerender, token_bytes
from tools._replay.drift import drift_of_run, loss_region_drift, routing_mismatch
from tools._replay.run import RunError, RunView
from tools.replay import main

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("exact") / "run", trials=4, router_noise=0.0)


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("noisy") / "run", trials=4, router_noise=0.05)


def _drift(run, **kw):
    view = RunView.open(run)
    return drift_of_run(view, tokenizer=view.tokenizer(), **kw)


def test_strict_trajectories_replay_to_the_sampler_logprobs(exact_run):
    view = RunView.open(exact_run)
    strict = [e.trial_id for _, e in view.of_kind(TrajectoryAssembled) if set(e.boundary_cases) == {"strict"}]
    assert strict, "the fixture should hold at least one strict trajectory"
    for trial in strict:
        out = drift_of_run(view, tokenizer=view.tokenizer(), trial=trial)
        assert out["gap_r3_tito"] < 1e-5 and out["gap_tito"] < 1e-5
        assert out["routing_mismatch"]["mean"] == 0.0


def test_exact_run_report(exact_run):
    out = _drift(exact_run)
    assert out["trajectories"] == 4 and out["versions"] == [0, 1]
    assert out["drift_rate_loss"] == 0.0 and out["logprob_record_mismatch"] == 0
    # the sampled ids of a random policy are not the tokenizer's canonical segmentation: re-rendering drifts
    assert out["drift_rate_loss_rerendered"] > 0
    assert out["gap_none"] > out["gap_r3_tito"]
    assert 0.0 <= out["retokenized_share"] <= 1.0
    assert sum(out["repair_cases"].values()) == 4  # 4 two-turn trials, one boundary each
    assert out["checksums"] == {"0": True, "1": True}


def test_sampler_routing_noise_is_removed_by_r3(noisy_run):
    out = _drift(noisy_run)
    assert out["routing_mismatch"]["mean"] > 0.2
    assert len(out["routing_mismatch"]["per_layer"]) == 2
    assert out["gap_r3_tito"] < out["gap_tito"]
    assert out["gap_r3"] < out["gap_none"]


def test_loss_region_drift_is_detected(exact_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(exact_run, run)
    view = RunView.open(run)
    turns = [e for _, e in view.by_trial("trial-0") if isinstance(e, SamplerTurn)]
    traj = next(e for _, e in view.by_trial("trial-0") if isinstance(e, TrajectoryAssembled))
    ids = np.array(traj.token_ids)
    first_loss = int(np.flatnonzero(traj.loss_mask)[0])
    ids[first_loss] = (ids[first_loss] + 1) % 500 + 20  # a trainer that trains on another id than sampled
    log = EventLog.open(run / "log")
    shape = dict(routing_shape=(2, 2), num_experts=4)
    with log.writer("tampered-0", **shape) as w:
        for t in turns:
            w.append(t.model_copy(update={"trial_id": "trial-x"}))
        w.append(TrajectoryAssembled(**{**{k: getattr(traj, k) for k in type(traj).model_fields},
                                        "trial_id": "trial-x", "token_ids": ids.astype(np.int32)}))
        w.commit()
    out = _drift(run, trial="trial-x")
    assert out["drift_rate_loss"] > 0


def test_missing_weights_are_named(exact_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(exact_run, run)
    shutil.rmtree(run / "weights" / "v1")
    assert main(["drift", str(run), "--json"]) == 0  # version 0's trajectories are still measured
    out = json.loads(capsys.readouterr().out)
    assert out["trajectories"] == 2 and out["versions"] == [0]
    assert any("no weights for policy version 1" in reason for reason in out["skipped"])
    shutil.rmtree(run / "weights" / "v0")
    assert main(["drift", str(run), "--json"]) == 2
    assert "no weights for policy version" in capsys.readouterr().err


def test_cli_json_keys(exact_run, capsys):
    assert main(["drift", str(exact_run), "--json", "--limit", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("gap_r3_tito", "gap_none", "drift_rate_loss", "retokenized_share", "routing_mismatch"):
        assert key in out
    assert out["trajectories"] == 2


def test_cli_table(exact_run, capsys):
    assert main(["drift", str(exact_run)]) == 0
    text = capsys.readouterr().out
    assert "r3_tito" in text and "loss-region drift" in text


def test_routing_mismatch_counts_sets_not_order():
    record = np.array([[[0, 1], [2, 3]], [[1, 2], [0, 3]]], dtype=np.uint8)
    live = np.array([[[1, 0], [2, 3]], [[1, 3], [3, 0]]])
    assert routing_mismatch(live, record).tolist() == [0.5, 0.0]


def test_loss_region_drift_counts_insertions():
    assert loss_region_drift(np.array([1, 2, 3]), np.array([1, 2, 3])) == 0
    assert loss_region_drift(np.array([1, 9, 3]), np.array([1, 2, 3])) == 1
    assert loss_region_drift(np.array([1, 2, 3, 4]), np.array([1, 2, 3])) == 1


def test_rerender_aligns_a_noncanonical_segmentation():
    from t1_actors.policy.tokenizer import default_tokenizer

    tok = default_tokenizer().backend_tokenizer
    canonical = np.array(tok.encode("hello world", add_special_tokens=False).ids, dtype=np.int32)
    # spell the same text one byte-token at a time: same bytes, other ids
    pieces = b"".join(token_bytes(tok, canonical))
    from tools._replay.align import _unicode_to_byte
    byte_to_char = {b: c for c, b in _unicode_to_byte().items()}
    spelled = np.array([tok.token_to_id(byte_to_char[b]) for b in pieces], dtype=np.int32)
    twin = rerender(tok, spelled)
    assert twin.decodable and twin.ids.tolist() == canonical.tolist()
    assert sum(len(a) for a, _ in twin.segments) == len(spelled)
    assert sum(len(b) for _, b in twin.segments) == len(canonical)


def test_not_a_run_is_a_clear_error(tmp_path):
    with pytest.raises(RunError, match="does not exist"):
        RunView.open(tmp_path / "nope")


def test_continued_trial_checks_the_turns_of_the_trial_it_resumes(exact_run, tmp_path):
    from schemas import TrialIssued

    run = tmp_path / "run"
    shutil.copytree(exact_run, run)
    view = RunView.open(run)
    turns = sorted((e for _, e in view.by_trial("trial-0") if isinstance(e, SamplerTurn)), key=lambda t: t.turn)
    traj = next(e for _, e in view.by_trial("trial-0") if isinstance(e, TrajectoryAssembled))
    log = EventLog.open(run / "log")
    with log.writer("resume-0", routing_shape=(2, 2), num_experts=4) as w:
        w.append(TrialIssued(trial_id="parent", task_id="task-0", policy_version_wanted=0))
        w.append(turns[0].model_copy(update={"trial_id": "parent"}))
        w.append(TrialIssued(trial_id="child", task_id="task-0", policy_version_wanted=0, resumed_from="parent"))
        w.append(turns[1].model_copy(update={"trial_id": "child"}))
        w.append(traj.model_copy(update={"trial_id": "child"}))
        w.commit()
    out = _drift(run, trial="child")
    assert out["drift_rate_loss"] == 0.0 and out["logprob_record_mismatch"] == 0
    assert out["trajectories"] == 1


def _append_two_chunk_trial(run, trial_id: str) -> None:
    """trial-0's two turns as a new trial whose second turn ran policy version 1: TITO opens a second chunk."""
    from schemas import TrialIssued
    from t1_actors import tito

    view = RunView.open(run)
    turns = sorted((e for _, e in view.by_trial("trial-0") if isinstance(e, SamplerTurn)), key=lambda t: t.turn)
    turns = [t.model_copy(update={"trial_id": trial_id, "policy_version": i}) for i, t in enumerate(turns[:2])]
    chunks = tito.assemble(turns, view.tokenizer(), reward=0.0)
    assert len(chunks) == 2, "a new policy version between two turns opens a chunk"
    log = EventLog.open(run / "log")
    with log.writer("two-chunks-0", routing_shape=(2, 2), num_experts=4) as w:
        w.append(TrialIssued(trial_id=trial_id, task_id="task-0", policy_version_wanted=0))
        for turn in turns:
            w.append(turn)
        for chunk in chunks:
            w.append(tito.to_event(chunk, trial_id=trial_id, task_id="task-0"))
        w.commit()


def test_limit_checks_whole_trials_as_a_full_run_does(exact_run, tmp_path):
    """--limit N takes the first N trials with every chunk: a limit falling between a trial's two chunks used to
    compare one chunk's loss region with the trial's whole sampler stream (a spurious logprob_record_mismatch)."""
    run = tmp_path / "run"
    shutil.copytree(exact_run, run)
    _append_two_chunk_trial(run, "two-chunks")
    assert _drift(run, trial="two-chunks", limit=1) == _drift(run, trial="two-chunks")
    view = RunView.open(run)
    chunks = [e.trial_id for _, e in view.of_kind(TrajectoryAssembled)]
    trials = list(dict.fromkeys(chunks))
    first = trials[: trials.index("two-chunks") + 1]
    out = _drift(run, limit=len(first))
    assert out["trajectories"] == sum(trial in first for trial in chunks)
    assert out["logprob_record_mismatch"] == 0 and out["drift_rate_loss"] == 0.0
