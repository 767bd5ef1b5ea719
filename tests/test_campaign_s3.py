"""A campaign whose event log lives on S3 (``[storage] url``), against a real S3-API server (moto's server
mode on loopback, tests/conftest.py): every actor and the job append to the log there, the run directory
keeps only the rest (tokenizer, weights, summary, report) and records the log's URL, and ``t1-replay``
reads the log by that URL. The campaign is killed whole (every process, SIGKILL) once its first learner step's
weights are out and relaunched with ``--resume``: the new writers take over their dead predecessors' S3 leases
(storage/_lease.py) and the run ends as one. A bad URL is refused before any phase starts, naming it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from fixtures.campaign import ROOT, SMALL, launch, micro_config

from schemas import LearnerStep
from storage import EventLog
from t1_actors.layout import weights_dir
from tools._replay.audit import audit_log
from tools.chaos._relaunch import kill_campaign

RL_STEPS = 4  # killed once step 0's weights are out: the relaunch has steps left to take


def _replay(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.replay", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def s3_run(s3_endpoint, tmp_path_factory, quick_campaign):
    """SMALL, warm-started from the session's quick campaign ([campaign] warm_start_from: its tokenizer and
    SFT policy, so no corpus pool or SFT of its own): what is under test is where each phase's facts go."""
    tmp = tmp_path_factory.mktemp("campaign-s3")
    url = f"s3://t1-tests/{tmp.name}/log"
    run_dir = tmp / "run"
    changes = {**SMALL, "campaign": {**SMALL["campaign"], "rl_steps": RL_STEPS, "rl_seconds": 900,
                                     "warm_start_from": str(quick_campaign.run_dir)}}
    config = micro_config(tmp, storage={"url": url}, **changes)
    first = launch(config, run_dir)
    deadline = time.monotonic() + 900  # until the first step's weights are out (a local file: a cheap poll)
    while first.poll() is None and time.monotonic() < deadline and not weights_dir(run_dir, 1).is_dir():
        time.sleep(0.2)
    killed = kill_campaign(first.pid) if first.poll() is None else {}
    first_output, _ = first.communicate(timeout=60)
    before = len(_learner_steps(url))
    assert len(killed) >= 7 and before < RL_STEPS, (before, first_output[-4000:])  # all seven processes, in RL
    relaunched = launch(config, run_dir, None, "--resume")
    output, _ = relaunched.communicate(timeout=900)
    return relaunched.returncode, output, run_dir, url, tmp


def _learner_steps(url: str) -> list[LearnerStep]:
    try:
        return [e for _, e in EventLog.open(url).events(kinds=["learner_step"]) if isinstance(e, LearnerStep)]
    except Exception:  # not created yet
        return []


@pytest.mark.slow
def test_a_campaign_keeps_its_log_on_s3_and_the_rest_in_the_run_directory(s3_run):
    code, output, run_dir, url, _ = s3_run
    assert code == 0, output[-4000:]
    assert not (run_dir / "log").exists()
    assert (run_dir / "log.url").read_text().strip() == url
    assert (run_dir / "tokenizer.json").is_file() and (run_dir / "weights").is_dir()
    log = EventLog.open(url)
    counts = log.counts()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["events"] == counts
    assert counts["learner_step"] == RL_STEPS
    published = {e.version for _, e in log.events(kinds=["weights_published"])}
    assert published == set(range(RL_STEPS + 1))  # version 0 + one a step
    # every actor and the job wrote its own segment there
    assert {"campaign", "staleness-0", "sampler-0", "sandbox-0", "verifier-0", "critic-0", "learner-0"} <= set(
        log.segments())


@pytest.mark.slow
def test_the_campaign_killed_whole_went_on_from_its_s3_log(s3_run):
    code, output, run_dir, url, _ = s3_run
    assert code == 0, output[-4000:]
    assert "resume:" in output and "oracle pool" not in output  # phases 1-3 skipped
    log = EventLog.open(url)
    steps = [e for _, e in log.events(kinds=["learner_step"]) if isinstance(e, LearnerStep)]
    assert [s.step for s in steps] == list(range(RL_STEPS))
    trained = [t for s in steps for t in s.trials]
    assert len(trained) == len(set(trained)), "a trial was trained twice"
    audit = audit_log(log, run_dir)
    assert audit.clean and audit.trials_unaccounted == 0, audit.to_json()


@pytest.mark.slow
def test_t1_replay_report_and_drift_read_the_log_by_its_url(s3_run):
    code, output, run_dir, url, tmp = s3_run
    assert code == 0, output[-4000:]
    report = _replay("report", url, "--out", str(tmp / "report"), "--json")
    assert report.returncode == 0, report.stderr[-3000:]
    assert json.loads(report.stdout)["learner_steps"] == EventLog.open(url).counts()["learner_step"] == RL_STEPS
    assert list((tmp / "report").glob("*.png"))
    drift = _replay("drift", url, "--limit", "4", "--json")
    assert drift.returncode == 0, drift.stderr[-3000:]
    out = json.loads(drift.stdout)
    assert out["trajectories"] >= 1 and out["loss_tokens"] > 0
    assert all(out["checksums"].values())  # weights found by version from the log, checksums verified
    trial = next(e.trial_id for _, e in EventLog.open(url).events(kinds=["trajectory"]))
    show = _replay("show", url, "--trial", trial, "--json")
    assert show.returncode == 0, show.stderr[-3000:]
    assert json.loads(show.stdout)["trial_id"] == trial
    by_dir = _replay("state", str(run_dir), "--json")  # the run directory finds its log through log.url
    by_url = _replay("state", url, "--json")
    assert by_dir.returncode == by_url.returncode == 0, by_dir.stderr[-2000:] + by_url.stderr[-2000:]
    assert json.loads(by_dir.stdout) == json.loads(by_url.stdout)


def test_a_missing_bucket_is_refused_before_anything_starts_naming_the_url(s3_endpoint, tmp_path):
    url = "s3://no-such-bucket/run/log"
    run_dir = tmp_path / "run"
    process = launch(micro_config(tmp_path, storage={"url": url}), run_dir)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 2, output[-3000:]
    assert url in output and "does not exist" in output
    assert not run_dir.exists()  # refused before the corpus, the tokenizer or SFT
