"""The training dynamics (t1_actors/job/dynamics.py): turns and tokens per trajectory before RL, after RL and per
learner step, finishes per step, the validation probe; the report's figures and section; the TensorBoard export.

A constructed log of the records real runs write (every number below is worked out by hand), and the session's
``quick_campaign`` for the same keys on a real run."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from schemas import ContextEdited, EvalResult, LearnerStep, SamplerTurn, TrialEnded, TrialIssued
from storage import EventLog
from t1_actors.job.dynamics import DYNAMICS_KINDS, Dynamics, trajectory_tokens
from t1_actors.rollout.endings import trial_endings
from t1_actors.tito import expand_turns


def _turn(trial: str, k: int, prompt, sampled, *, prefix_len: int = 0, finish: str = "stop") -> SamplerTurn:
    sampled = np.asarray(sampled, dtype=np.int32)
    return SamplerTurn(trial_id=trial, turn=k, prompt_ids=np.asarray(prompt, dtype=np.int32), prefix_len=prefix_len,
                       sampled_ids=sampled, sampler_logprobs=np.zeros(len(sampled), np.float32), policy_version=0,
                       finish_reason=finish, temperature=1.0, top_p=1.0)


P0, A0 = list(range(1, 11)), [11, 12, 13, 14]  # a first prompt of 10 ids, 4 sampled: a stream of 14
NEW, A1 = [15, 16, 17], [18, 19, 20, 21, 22]  # the second prompt adds 3 ids (an output), 5 sampled


def _issue(trial: str, split: str = "train", label: str = "", resumed_from: str | None = None) -> TrialIssued:
    return TrialIssued(trial_id=trial, task_id="task", split=split, label=label, policy_version_wanted=0,
                       resumed_from=resumed_from)


def _end(trial: str, finish: str, turns: int, **kw) -> TrialEnded:
    return TrialEnded(trial_id=trial, finish=finish, turns=turns, **kw)


def _probe(k: int, resolved: int, n: int) -> EvalResult:
    return EvalResult(label=f"probe_s{k}", policy_version=k, n=n, resolved=resolved, mean_reward=0.1 * k,
                      ci_low=0.0, ci_high=1.0)


def constructed_events() -> list:
    """Eval passes before (1 turn of 14 tokens; 2 turns, the second stored after its prefix: 22) and after RL (3
    turns stored whole, the third prompt edited to 8 shared ids + 5 new: 10+4+6+3+5+2 = 30); train trials t1 (14
    tokens, step 0), t2 cancelled in its second turn and continued as t2~c1 (turn 1 sampled again: 22, step 0), t3
    (step 1), t4 (dropped: no step); probes after 2 and 4 steps."""
    stream = P0 + A0
    events = [
        _issue("e1", "eval", "before"), _turn("e1", 0, P0, A0), _end("e1", "answered", 1),
        _issue("e2", "eval", "before"), _turn("e2", 0, P0, A0), _turn("e2", 1, NEW, A1, prefix_len=14),
        _end("e2", "max_turns", 2),
        _issue("e3", "eval", "after"), _turn("e3", 0, P0, A0), _turn("e3", 1, stream + [15] * 6, [30, 31, 32]),
        _turn("e3", 2, P0[:8] + [40] * 5, [41, 42]),
        ContextEdited(trial_id="e3", turn=2, strategy="drop_old_outputs", tokens_before=30, tokens_after=13,
                      messages_edited=1),
        _end("e3", "answered", 3, truncations={"tool_output": 1}, context_edits=1),
        _issue("t1"), _turn("t1", 0, P0, A0),
        ContextEdited(trial_id="t1", turn=0, strategy="window", tokens_before=9, tokens_after=8, messages_edited=2),
        _end("t1", "answered", 1, context_edits=1),
        _issue("t2"), _turn("t2", 0, P0, A0), _turn("t2", 1, NEW, [18, 19], prefix_len=14, finish="cancelled"),
        _issue("t2~c1", resumed_from="t2"), _turn("t2~c1", 1, NEW, A1, prefix_len=14),
        _end("t2~c1", "turn_tokens", 2, truncations={"turn_tokens": 1}),
        LearnerStep(step=0, policy_version=1, trials=["t1", "t2~c1"], metrics={"policy_loss": 0.5, "entropy": 2.0}),
        _issue("t3"), _turn("t3", 0, P0, [11]), _end("t3", "context", 1),
        _issue("t4"), _turn("t4", 0, P0, A0), _end("t4", "answered", 1),
        LearnerStep(step=1, policy_version=2, trials=["t3"], metrics={"policy_loss": 0.25, "entropy": 1.5}),
        _issue("p1", "eval", "probe_s2"), _turn("p1", 0, P0, A0), _end("p1", "answered", 1), _probe(2, 1, 4),
        _probe(4, 3, 4),
    ]
    return [(f"w:{i}", e) for i, e in enumerate(events)]


def test_trajectory_tokens_counts_each_position_once_however_the_turns_are_stored():
    whole = [_turn("x", 0, P0, A0), _turn("x", 1, P0 + A0 + NEW, A1)]
    stored = [_turn("x", 0, P0, A0), _turn("x", 1, NEW, A1, prefix_len=14)]
    final = len(P0 + A0 + NEW) + len(A1)  # a stream that only grows: its final length, prompt and completions
    assert trajectory_tokens(whole) == trajectory_tokens(expand_turns(stored)) == final == 22
    edited = whole + [_turn("x", 2, P0[:8] + [40] * 5, [41, 42])]  # only the 5 ids it does not share count
    assert trajectory_tokens(edited) == 22 + 5 + 2
    assert trajectory_tokens([]) == 0


def test_dynamics_summary_of_a_constructed_log():
    events = constructed_events()
    out = Dynamics.fold(events).summary()
    assert out["turns"]["before_rl"] == {"mean": 1.5, "p10": pytest.approx(1.1), "p50": 1.5, "p90": pytest.approx(1.9),
                                         "max": 2.0, "n": 2}
    assert out["tokens"]["before_rl"]["mean"] == 18 and out["tokens"]["before_rl"]["max"] == 22
    assert out["tokens"]["after_rl"] == {"mean": 30, "p10": 30, "p50": 30, "p90": 30, "max": 30, "n": 1}
    assert out["turns"]["after_rl"]["mean"] == 3
    # step 0 trained t1 (1 turn, 14 tokens) and the continuation of t2 (2 turns: its original's first, 22 tokens)
    turns, tokens = out["turns"]["per_step"], out["tokens"]["per_step"]
    assert [(p["step"], p["mean"], p["n"]) for p in turns] == [(0, 1.5, 2), (1, 1.0, 1)]
    assert [(p["step"], p["mean"], p["max"]) for p in tokens] == [(0, 18.0, 22.0), (1, 11.0, 11.0)]
    assert out["per_step"] == [
        {"step": 0, "policy_version": 1, "trials": 2, "finishes": {"answered": 1, "turn_tokens": 1},
         "truncations": {"turn_tokens": 1}, "context_edits": {"window": 1}},
        {"step": 1, "policy_version": 2, "trials": 1, "finishes": {"context": 1}, "truncations": {},
         "context_edits": {}}]
    assert out["probe"] == [
        {"step": 2, "label": "probe_s2", "resolved": 1, "n": 4, "rate": 0.25, "mean_reward": 0.2},
        {"step": 4, "label": "probe_s4", "resolved": 3, "n": 4, "rate": 0.75, "mean_reward": pytest.approx(0.4)}]
    # the per-split counts are the same fold, grouped by split: the probe's trial is an eval trial like any other
    endings = trial_endings(events)
    assert endings["finishes"] == {"eval": {"answered": 3, "max_turns": 1},
                                   "train": {"answered": 2, "context": 1, "turn_tokens": 1}}
    assert endings["context_edits"] == {"eval": {"drop_old_outputs": 1}, "train": {"window": 1}}
    lengths = Dynamics.fold(events).lengths()
    assert lengths == {"before_rl": {"turns": [1, 2], "tokens": [14, 22]}, "after_rl": {"turns": [3], "tokens": [30]}}


def test_before_rl_comes_from_the_log_that_holds_the_sft_passes():
    """[eval] sft_passes = "warm_start": this run's log has no "before" pass; the warm-start run's log has it."""
    events = constructed_events()
    rl_only = [(i, e) for i, e in events if getattr(e, "trial_id", "") not in ("e1", "e2")]
    assert Dynamics.fold(rl_only).summary()["turns"]["before_rl"] is None
    out = Dynamics.fold(rl_only).summary(before=Dynamics.fold(events))
    assert out["turns"]["before_rl"]["n"] == 2 and out["turns"]["after_rl"]["n"] == 1


def _write_log(path, events) -> None:
    log = EventLog.open(path, create=True)
    with log.writer("w") as writer:
        for _, event in events:
            writer.append(event)
        writer.commit()


def _tensors(directory) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(directory))
    acc.Reload()
    return {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def test_export_tensorboard_writes_the_per_step_scalars_and_replaces_its_earlier_files(tmp_path, capsys):
    from tools.replay import main

    log_dir = tmp_path / "run" / "log"
    _write_log(log_dir, constructed_events())
    tb = tmp_path / "tb"
    tb.mkdir()
    (tb / "notes.txt").write_text("kept")
    assert main(["export", "--tensorboard", str(tb), str(log_dir), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(first["files"]) == 1 and first["removed"] == [] and first["steps"] == [0, 1, 2, 4]
    scalars = _tensors(tb)
    assert scalars["dynamics/turns/mean"] == [(0, 1.5), (1, 1.0)]
    assert scalars["dynamics/tokens/max"] == [(0, 22.0), (1, 11.0)]
    assert scalars["dynamics/trials"] == [(0, 2.0), (1, 1.0)]
    assert scalars["finishes/context"] == [(0, 0.0), (1, 1.0)] and scalars["finishes/answered"] == [(0, 1.0), (1, 0.0)]
    assert scalars["context_edits/window"] == [(0, 1.0), (1, 0.0)]
    assert scalars["truncations/turn_tokens"] == [(0, 1.0), (1, 0.0)]
    assert scalars["context_edits/total"] == scalars["truncations/total"] == [(0, 1.0), (1, 0.0)]
    assert scalars["learner/policy_loss"] == [(0, 0.5), (1, 0.25)] and scalars["learner/entropy"] == [(0, 2.0), (1, 1.5)]
    assert scalars["probe/resolved_rate"] == [(2, 0.25), (4, 0.75)]
    assert main(["export", "--tensorboard", str(tb), str(log_dir), "--json"]) == 0  # again: replaced, not doubled
    second = json.loads(capsys.readouterr().out)
    assert second["removed"] == [first["files"][0].rsplit("/", 1)[1]]
    assert sorted(p.name for p in tb.iterdir()) == sorted(["notes.txt", second["files"][0].rsplit("/", 1)[1]])
    assert _tensors(tb) == scalars


def test_export_without_tensorboard_names_the_extra_and_writes_nothing(tmp_path, capsys, monkeypatch):
    from tools.replay import main

    log_dir = tmp_path / "log"
    _write_log(log_dir, constructed_events())
    monkeypatch.setitem(sys.modules, "tensorboard.summary", None)  # import tensorboard.summary: ImportError
    assert main(["export", "--tensorboard", str(tmp_path / "tb"), str(log_dir)]) == 2
    assert "t1[tensorboard]" in capsys.readouterr().err
    assert not (tmp_path / "tb").exists()


def test_report_has_the_dynamics_figures_and_section(tmp_path):
    from tools.report import write_report

    log_dir = tmp_path / "run" / "log"
    _write_log(log_dir, constructed_events())
    out = write_report(tmp_path / "run", tmp_path / "report")
    names = {p.rsplit("/", 1)[1] for p in out["figures"]}
    assert {"dynamics.png", "trajectory_lengths.png"} <= names
    assert all((tmp_path / "report" / n).stat().st_size > 1000 for n in ("dynamics.png", "trajectory_lengths.png"))
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "## Dynamics: turns and tokens per trajectory" in md
    assert "| before RL (SFT policy) | tokens | 18 | 14.8 | 18 | 21.2 | 22 | 2 |" in md
    assert "| 0 | 2 | 1.5 (1.1-1.9) | 18 (14.8-21.2) | answered 1, turn_tokens 1 | window 1 | turn_tokens 1 |" in md
    assert "| 4 | 3 | 4 | 0.75 |" in md  # the probe after 4 steps
    assert out["dynamics"]["probe"][0]["rate"] == 0.25


@pytest.mark.slow
def test_a_real_run_has_the_dynamics_in_summary_report_and_tensorboard(quick_campaign, tmp_path, capsys):
    """The session's quick campaign: before/after RL over the 12 paired eval trials each, one entry per learner
    step with its trials, a trained trajectory that only grew has exactly its TITO chunk's length in tokens, the
    report's figures, and the export's learner metrics equal to the log's."""
    from tools.replay import main

    code, output, run_dir, _ = quick_campaign
    assert code == 0, output[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    log = EventLog.open(run_dir / "log")
    steps = {e.step: e for _, e in log.events(kinds=["learner_step"])}
    for key in ("turns", "tokens"):
        assert summary[key]["before_rl"]["n"] == summary[key]["after_rl"]["n"] == 12
        assert [p["step"] for p in summary[key]["per_step"]] == sorted(steps)
    assert summary["turns"]["sft"] and summary["turns"]["rl"]  # the eval passes' mean turns stay beside them
    assert [(s["step"], s["trials"]) for s in summary["per_step"]] == [(k, len(e.trials)) for k, e in sorted(steps.items())]
    for entry, turns in zip(summary["per_step"], summary["turns"]["per_step"]):
        assert sum(entry["finishes"].values()) == turns["n"] == entry["trials"]
    probes = {e.label: e for _, e in log.events(kinds=["eval_result"]) if e.label.startswith("probe_s")}
    assert probes  # the shared quick campaign probes (fixtures.campaign.QUICK)
    assert [(p["step"], p["resolved"], p["n"]) for p in summary["probe"]] == [
        (int(name[len("probe_s"):]), e.resolved, e.n) for name, e in sorted(probes.items(), key=lambda i: int(i[0][7:]))]
    trajectories = Dynamics.fold(log.events(kinds=DYNAMICS_KINDS)).trajectories()
    chunks: dict[str, list] = {}
    for _, chunk in log.events(kinds=["trajectory"]):
        chunks.setdefault(chunk.trial_id, []).append(chunk)
    single = {t: c[0] for t, c in chunks.items() if len(c) == 1}
    assert single and all(trajectories[t].tokens == len(c.token_ids) for t, c in single.items())
    for name in ("dynamics.png", "trajectory_lengths.png"):
        assert (run_dir / "report" / name).stat().st_size > 1000
    assert "## Dynamics" in (run_dir / "report" / "summary.md").read_text()
    assert main(["export", "--tensorboard", str(tmp_path / "tb"), str(run_dir), "--json"]) == 0
    capsys.readouterr()
    scalars = _tensors(tmp_path / "tb")
    for name in steps[min(steps)].metrics:
        assert scalars[f"learner/{name}"] == [(k, pytest.approx(e.metrics[name], rel=1e-6, abs=1e-6))
                                              for k, e in sorted(steps.items())]
    assert [k for k, _ in scalars["dynamics/tokens/mean"]] == sorted(steps)
