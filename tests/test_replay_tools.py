"""t1-replay show / state / report on a small real run."""

from __future__ import annotations

import json

import pytest
import torch
from _replay_data import build_run

from tools.replay import main
from tools.report import write_report

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("tools") / "run", trials=3)


def test_show_json(run, capsys):
    assert main(["show", str(run), "--trial", "trial-1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["task_id"] == "task-1" and len(out["turns"]) == 2 and len(out["commands"]) == 2
    assert out["verifier"]["passed"] == 1 and out["reward"] == pytest.approx(1 / 20)
    chunk = out["trajectory"][0]
    loss = [s for s in chunk["segments"] if s["loss"]]
    assert sum(len(s["ids"]) for s in loss) == chunk["loss_tokens"] == sum(t["sampled_tokens"] for t in out["turns"])
    assert all(isinstance(s["text"], str) for s in chunk["segments"])
    assert len(out["turns"][0]["routing"]["layers"]) == 2
    assert out["staleness"][0]["decision"] == "admit"


def test_show_human(run, capsys):
    assert main(["show", str(run), "--trial", "trial-0"]) == 0
    text = capsys.readouterr().out
    assert "⟦" in text and "$ echo 0" in text and "verifier:" in text


def test_show_unknown_trial(run, capsys):
    assert main(["show", str(run), "--trial", "nope"]) == 2
    assert "trial 'nope' is not in the log" in capsys.readouterr().err


def test_state_at_event(run, capsys):
    assert main(["state", str(run), "--json"]) == 0
    end = json.loads(capsys.readouterr().out)
    assert end["policy_version"] == 1 and end["learner_step"] == 1
    assert end["trials"]["by_status"] == {"admitted": 2, "cancelled": 1}
    assert end["in_flight_count"] == 0 and end["verified"] == 3

    # fold only up to the first trial's issue: it is in flight, nothing verified yet
    assert main(["state", str(run), "--at", "staleness-0:0", "--json"]) == 0
    early = json.loads(capsys.readouterr().out)
    assert early["at"]["kind"] == "trial_issued"
    assert early["in_flight"] == ["trial-0"] and early["verified"] == 0
    assert early["events"] < end["events"]

    assert main(["state", str(run), "--at", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["events"] == 4


def test_state_unknown_event(run, capsys):
    assert main(["state", str(run), "--at", "ghost:7"]) == 2
    assert "is not in" in capsys.readouterr().err


def test_report_writes_plots_and_summary(run, tmp_path, capsys):
    out = write_report(run, tmp_path / "report")
    assert out["verified_train_trials"] == 3
    assert out["mean_reward"] == pytest.approx((0 + 1 + 2) / 3 / 20)
    assert out["critic_warmup_ev"] == [-3.0, 0.7]
    assert out["staleness_decisions"] == {"admit": 2, "cancel": 1} and out["cancellations"] == 1
    assert out["mean_off_policy"] == {"kl_sampler_learner": 0.003, "off_policy_masked_fraction": 0.25}
    for figure in out["figures"]:
        with open(figure, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "mean reward" in md and "overview.png" in md
    assert main(["report", str(run), "--out", str(tmp_path / "r2"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["learner_steps"] == 1


def test_show_prints_brackets_verbatim(tmp_path, capsys):
    from schemas import SandboxExec, TrialIssued
    from storage import EventLog

    log = EventLog.open(tmp_path / "run" / "log", create=True)
    with log.writer("sandbox-0") as w:
        w.append(TrialIssued(trial_id="t", task_id="x", policy_version_wanted=0))
        w.append(SandboxExec(trial_id="t", turn=0, command="[ -f /app/a ] && echo [bold]yes[/bold]", exit_code=0,
                             stdout="[red]out[/red]\n", stderr="", duration_s=0.1))
        w.commit()
    assert main(["show", str(tmp_path / "run"), "--trial", "t"]) == 0
    text = capsys.readouterr().out
    assert "$ [ -f /app/a ] && echo [bold]yes[/bold]" in text and "[red]out[/red]" in text
