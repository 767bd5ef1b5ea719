"""bench/campaign.py: the RL window and the time shares come from the log's own timestamps; the bench runs
end to end on a tiny budget and prints every key README quotes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from schemas import (
    CriticValues,
    LearnerStep,
    SamplerTurn,
    SandboxExec,
    StalenessDecision,
    TrialIssued,
    VerifierResult,
    WeightsPublished,
)
from storage import EventLog

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools._report.time_shares import PARTS, rl_figures, rl_window, time_shares  # noqa: E402

PAUSE = 0.03


def _turn(trial: str, turn: int) -> SamplerTurn:
    return SamplerTurn(trial_id=trial, turn=turn, prompt_ids=np.arange(4, dtype=np.int32),
                       sampled_ids=np.arange(2, dtype=np.int32), sampler_logprobs=np.zeros(2, np.float32),
                       policy_version=0, finish_reason="stop", temperature=1.0, top_p=1.0)


def _tiny_log(path: Path, exec_s: float, verify_s: float) -> EventLog:
    """One trial through every part, written by the writers the actors use, with pauses between facts:
    issue, a turn, a tool call of ``exec_s``, a last turn, a verification of ``verify_s``, admission,
    the critic's values, one learner step and its weights."""
    log = EventLog.open(path, create=True)
    writers = {name: log.writer(name) for name in ("staleness-0", "sampler-0", "sandbox-0", "verifier-0",
                                                     "critic-0", "learner-0")}

    def append(writer: str, event, pause: float = PAUSE) -> None:
        time.sleep(pause)
        writers[writer].append(event)
        writers[writer].commit()

    append("staleness-0", TrialIssued(trial_id="t0", task_id="task", split="train", policy_version_wanted=0), 0)
    append("sampler-0", _turn("t0", 0))
    append("sandbox-0", SandboxExec(trial_id="t0", turn=0, command="ls", exit_code=0, stdout="", stderr="",
                                    duration_s=exec_s), exec_s)
    append("sampler-0", _turn("t0", 1))
    append("verifier-0", VerifierResult(trial_id="t0", task_id="task", tests={"a": "passed"}, passed=1, total=1,
                                        reward=0.05, reward_scale=20, verifier_sha256="0" * 64,
                                        duration_s=verify_s), verify_s)
    append("staleness-0", StalenessDecision(trial_id="t0", decision="admit", lag=0, policy_version=0))
    append("critic-0", CriticValues(trial_id="t0", chunk=0, values=np.zeros(6, np.float32), critic_version=0))
    append("learner-0", LearnerStep(step=0, policy_version=1, trials=["t0"], metrics={"step_seconds": PAUSE}))
    append("learner-0", WeightsPublished(version=1, sha256="0" * 64, location="weights/v00001", step=0))
    for writer in writers.values():
        writer.close()
    return EventLog.open(path)


def _stamps(log: EventLog) -> dict[str, float]:
    return {event.kind + str(getattr(event, "turn", "")): ts
            for (event_id, ts), (_, event) in zip(log.append_times(), log.events())}


def test_the_window_and_the_shares_are_the_logs_own_intervals(tmp_path):
    log = _tiny_log(tmp_path / "log", exec_s=0.08, verify_s=0.05)
    at = _stamps(log)
    start, end = rl_window(log, 1)
    assert (start, end) == (at["trial_issued"], at["weights_published"])
    figures = rl_figures(log, 1)
    assert figures["steps"] == 1 and figures["trajectories"] == 1 and figures["trials_issued"] == 1
    assert figures["rl_seconds"] == pytest.approx(end - start, abs=0.01)
    assert figures["trajectories_per_s"] == pytest.approx(1 / (end - start), rel=0.01)

    shares = time_shares(log, (start, end))
    exclusive, busy = shares["time_shares"], shares["busy_shares"]
    assert set(exclusive) == set(PARTS) | {"waiting"} and set(busy) == set(PARTS)
    assert sum(exclusive.values()) <= 1 + 1e-3 and all(0 <= v <= 1 for v in exclusive.values())
    wall = end - start
    # each part's interval, as the log has it (the turns start at the trial's issue and at its tool call)
    expected = {
        "sampling": (at["sampler_turn0"] - at["trial_issued"]) + (at["sampler_turn1"] - at["sandbox_exec0"]),
        "sandbox exec": 0.08, "verification": 0.05,
        "the log": at["staleness_decision"] - at["verifier_result"],
        "critic": at["critic_values"] - at["staleness_decision"],
        "learner step": at["learner_step"] - at["critic_values"],
    }
    for part, seconds in expected.items():
        assert busy[part] == pytest.approx(seconds / wall, abs=2e-3), part
    # the learner's step comes first; what no part covers is waiting (at least the weights' publication)
    assert exclusive["learner step"] == busy["learner step"]
    assert exclusive["waiting"] == pytest.approx(1 - sum(exclusive[p] for p in PARTS), abs=1e-3)
    assert exclusive["waiting"] >= (at["weights_published"] - at["learner_step"]) / wall - 2e-3


def test_a_longer_tool_call_takes_a_larger_share(tmp_path):
    short = _tiny_log(tmp_path / "short", exec_s=0.02, verify_s=0.02)
    long = _tiny_log(tmp_path / "long", exec_s=0.2, verify_s=0.02)
    share = {name: time_shares(log, rl_window(log, 1))["busy_shares"]["sandbox exec"]
             for name, log in (("short", short), ("long", long))}
    assert share["long"] > 2 * share["short"] > 0


def test_a_log_short_of_its_step_budget_is_refused(tmp_path):
    log = _tiny_log(tmp_path / "log", exec_s=0.01, verify_s=0.01)
    with pytest.raises(ValueError, match="policy version 2"):
        rl_window(log, 2)


@pytest.mark.slow
def test_the_bench_runs_both_sides_on_a_tiny_budget(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "campaign.py"), "--steps", "1", "--batch", "4",
                          "--sft-steps", "10", "--keep", str(tmp_path / "work")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = out.stdout.strip().splitlines()
    assert lines, f"the bench printed nothing (exit {out.returncode}): {out.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert out.returncode == 0, (result.get("error"), result.get("six_processes_error"), out.stderr[-3000:])
    for side in ("six_processes", "one_process"):
        figures = result[side]
        assert figures["steps"] == 1 and figures["trajectories"] == 4, side
        assert figures["trajectories_per_s"] > 0 and figures["steps_per_s"] > 0 and figures["rl_seconds"] > 0
    assert result["actor_system_ratio"] == pytest.approx(
        result["six_processes"]["trajectories_per_s"] / result["one_process"]["trajectories_per_s"], abs=1e-3)
    assert set(result["time_shares"]) == set(PARTS) | {"waiting"}
    assert sum(result["time_shares"].values()) <= 1 + 1e-3
    assert isinstance(result["goal_met"], bool)
    # the shares are the campaign log's: recomputed from the run the bench kept
    log = EventLog.open(tmp_path / "work" / "campaign" / "log")
    assert time_shares(log, rl_window(log, 1))["time_shares"] == result["time_shares"]
