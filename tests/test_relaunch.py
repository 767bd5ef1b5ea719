"""A whole campaign killed at once and relaunched: ``t1-actor launch --resume`` (t1_actors/job/resume.py).

The checks a relaunch makes before anything starts (the config key by key, where the run stands), the schedule's
share (a logged warm-up handed to the critic, not played again), and end to end: a micro campaign whose every
process is SIGKILLed early in RL, relaunched with --resume, ends with its summary, its learner steps contiguous up
to rl_steps, no trial trained twice and the log's audit clean.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import trio
from fixtures.campaign import ROOT, micro_config
from fixtures.trials import play_in_world

from schemas import EvalResult, LearnerStep, TrialIssued, WeightsPublished
from storage import EventLog
from t1_actors.eval.protocol import EvalConfig
from t1_actors.job.main import RunLocationError, _with_policy, load_campaign_config, run_campaign
from t1_actors.job.resume import ResumeError, check_same_config, resume_state
from t1_actors.layout import tokenizer_path, weights_dir
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.rollout.play import run_warmup
from t1_actors.rollout.trials import BatchStats
from t1_actors.runtime.config import write_resolved
from t1_actors.schedule import CampaignConfig, Controller, TaskSplits, play_schedule, warmup_task_ids
from t1_actors.staleness import pause_rl_clock, rl_clock_path
from t1_actors.stats import labelled_attempts
from tools._replay.audit import audit_log
from tools.chaos._relaunch import kill_campaign


def _config(tmp_path, *, quick: bool = True):
    return load_campaign_config(micro_config(tmp_path), quick=quick, run_dir=tmp_path / "run")


def test_a_run_directory_with_a_log_is_refused_naming_resume(tmp_path):
    config = _config(tmp_path)
    (tmp_path / "run" / "log").mkdir(parents=True)
    with pytest.raises(RunLocationError, match=r"--run-dir NEW_DIR for a new run, or --resume"):
        run_campaign(config)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["log"]  # nothing was touched


def test_resume_refuses_a_config_that_computes_something_else_naming_each_key(tmp_path):
    config = _config(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # as the supervisor writes it: samplers from a published version, the vocabulary from the tokenizer
    resolved = _with_policy(config, str(weights_dir(run_dir, 3)), 3).to_jsonable()
    resolved["model"]["vocab_size"] = 731
    (run_dir / "config.resolved.json").write_text(json.dumps(resolved))
    check_same_config(config, run_dir)
    data = config.to_jsonable()
    data["transport"]["heartbeat_timeout_s"] = 5.0  # how processes talk and are restarted does not count
    data["supervisor"]["restart_limit"] = 9
    check_same_config(type(config).model_validate(data), run_dir)
    data["campaign"]["rl_steps"] = 9
    data["ppo"]["actor_lr"] = 1e-3
    with pytest.raises(ResumeError, match=r"in 2 key\(s\) .*campaign\.rl_steps: run 5, this config 9; ppo\.actor_lr"):
        check_same_config(type(config).model_validate(data), run_dir)
    # the first launch had --quick: its overrides are keys too
    with pytest.raises(ResumeError, match=r"in \d+ key\(s\) .*campaign\.rl_steps: run 5, this config 40.*--quick"):
        check_same_config(_config(tmp_path, quick=False), run_dir)
    (run_dir / "config.resolved.json").write_text("{")
    with pytest.raises(ResumeError, match="cannot read the config it ran with"):
        check_same_config(config, run_dir)


def test_resume_reads_where_the_run_stands(tmp_path):
    config = _config(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_resolved(config, run_dir / "config.resolved.json")
    assert not resume_state(config).prepared  # no log: phases 1-3 run again
    log = EventLog.open(run_dir / "log", create=True)
    with log.writer("campaign") as w:
        w.append(WeightsPublished(version=0, sha256="0" * 64, location=str(weights_dir(run_dir, 0)), step=0))
        w.commit()
    with pytest.raises(ResumeError, match="the log holds policy version 0 but .* is gone"):
        resume_state(config)
    weights_dir(run_dir, 0).mkdir(parents=True)
    tokenizer_path(run_dir).write_text("{}")
    state = resume_state(config)
    assert state.prepared and not state.finished and state.newest.version == 0 and 0 <= state.down_s < 60
    with log.writer("learner-0") as w:
        w.append(WeightsPublished(version=1, sha256="1" * 64, location=str(weights_dir(run_dir, 1)), step=0))
        w.append(EvalResult(label="after", policy_version=1, n=1, resolved=0, mean_reward=0.0, ci_low=0.0,
                            ci_high=1.0, last=True))
        w.commit()
    state = resume_state(config)
    assert state.finished and state.newest.version == 1


def test_the_down_time_is_not_taken_from_rl_seconds(tmp_path):
    assert not pause_rl_clock(tmp_path, "staleness-0", 100.0)  # RL never started: no clock to pause
    path = rl_clock_path(tmp_path, "staleness-0")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"rl_started_at": 1000.0, "paused_s": 5.0}))
    assert pause_rl_clock(tmp_path, "staleness-0", 100.0)
    assert json.loads(path.read_text()) == {"rl_started_at": 1000.0, "paused_s": 105.0}


class _Logger:
    def info(self, event: str, **fields) -> None:
        pass

    warning = info


def test_a_logged_warm_up_is_handed_to_the_critic_not_played_again(trial_world):
    """A controller died after its warm-up trials' trajectories were logged (one commit) and before the critic
    warmed up: the next one hands those trials to the critic and plays none. One whose trajectories were never
    logged (killed mid warm-up) plays the warm-up again; the critic sees only the new trials."""
    def schedule(logged: list):
        async def body(ports, runner, tasks):
            ids = [t.id for t in tasks]
            splits = TaskSplits(rl=ids[:14], validation=[], eval=ids[19:20], pass_k=[])
            if logged == ["play"]:
                await run_warmup(runner, warmup_task_ids(splits.rl, 3, 0), concurrency=3)
                logged[:] = ports.events
            elif logged == ["issue"]:
                logged[:] = [TrialIssued(trial_id=f"dead-{i}", task_id=t, split="warmup", policy_version_wanted=0)
                             for i, t in enumerate(warmup_task_ids(splits.rl, 3, 0))]
            ports.events = []
            handed: list[list[str]] = []

            async def events(kind):
                return [e for e in (*logged, *ports.events) if e.kind == kind]

            async def warm_up_critic(trial_ids) -> None:
                handed.append(list(trial_ids))

            async def wait_for_version(version, until) -> None:
                pass

            controller = Controller(logger=_Logger(), version=lambda: 0, wait_for_version=wait_for_version,
                                    events=events, rl_seconds_left=lambda: 600.0, warm_up_critic=warm_up_critic)
            with trio.fail_after(300):
                await play_schedule(runner, controller, splits,
                                    campaign=CampaignConfig(warmup_trials=3, rl_steps=0, eval_concurrency=4),
                                    staleness=StalenessConfig(batch_size=2),
                                    eval_config=EvalConfig(temperatures=[1.0], pass_k_tasks=0, sft_passes="warm_start"),
                                    run_temperature=1.0, stats=BatchStats())
            return handed, [e for e in ports.events if isinstance(e, TrialIssued)]

        return play_in_world(trial_world, body)

    logged: list = ["play"]
    handed, issued = schedule(logged)
    warm = [e.trial_id for e in logged if isinstance(e, TrialIssued)]
    assert len(warm) == 3 and handed == [[t for t in dict.fromkeys(e.trial_id for e in logged if e.kind == "trajectory")]]
    assert set(handed[0]) <= set(warm) and handed[0]
    assert [e.split for e in issued] == ["eval"]  # only the RL policy's pass: no warm-up trial played again
    handed, issued = schedule(["issue"])
    assert sorted(e.split for e in issued) == ["eval", "warmup", "warmup", "warmup"]
    assert not any(t.startswith("dead-") for t in handed[0]) and set(handed[0]) <= {e.trial_id for e in issued}


# ---- end to end ------------------------------------------------------------------------------------------------

RL_STEPS = 4


def _launch(config, run_dir, *extra: str) -> subprocess.Popen:
    """``t1-actor launch --quick`` in a session of its own (its process group is not the test's)."""
    return subprocess.Popen([sys.executable, "-m", "t1_actors.cli", "launch", "--config", str(config), "--quick",
                             "--run-dir", str(run_dir), *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _steps(run_dir) -> list[LearnerStep]:
    try:
        return [e for _, e in EventLog.open(run_dir / "log").events(kinds=["learner_step"])]
    except Exception:  # not there yet, or being created
        return []


@pytest.mark.slow
def test_a_campaign_killed_whole_early_in_rl_goes_on_with_resume(tmp_path):
    """Every process of the campaign SIGKILLed at once once its first learner step is logged; ``--resume`` on the
    same run directory skips phases 1-3 and ends the campaign: summary written, steps 0..rl_steps-1 (versions
    1..rl_steps) each once, no trial trained twice, every trial accounted for (``t1-replay audit``), each eval
    attempt counted once."""
    config = micro_config(tmp_path, campaign={"sft_steps": 30, "rl_steps": RL_STEPS, "rl_seconds": 900,
                                              "warmup_trials": 4},
                          eval={"temperatures": [1.0], "pass_k_tasks": 2, "pass_k_samples": 2},
                          staleness={"batch_size": 4}, critic={"warmup_trajectories": 2})
    run_dir = tmp_path / "run"
    first = _launch(config, run_dir)
    deadline = time.monotonic() + 900
    while first.poll() is None and time.monotonic() < deadline and not _steps(run_dir):
        time.sleep(0.5)
    assert first.poll() is None, "the campaign ended before its first learner step was seen"
    killed = kill_campaign(first.pid)
    before = _steps(run_dir)
    output, _ = first.communicate(timeout=60)
    assert 1 <= len(before) < RL_STEPS and len(killed) >= 7, (len(before), killed)  # the launcher and six actors
    tokenizer = tokenizer_path(run_dir).stat().st_mtime_ns

    refused = subprocess.run([sys.executable, "-m", "t1_actors.cli", "launch", "--config", str(config), "--quick",
                              "--run-dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--resume" in refused.stderr, refused.stderr[-2000:]

    second = _launch(config, run_dir, "--resume")
    output, _ = second.communicate(timeout=900)
    assert second.returncode == 0, output[-6000:]
    assert "resume:" in output and "oracle pool" not in output  # phases 1-3 skipped
    assert tokenizer_path(run_dir).stat().st_mtime_ns == tokenizer
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_after"] is not None and summary["timings_s"]["down_s"] >= 0

    log = EventLog.open(run_dir / "log")
    steps = [e for _, e in log.events(kinds=["learner_step"]) if isinstance(e, LearnerStep)]
    assert [s.step for s in steps] == list(range(RL_STEPS)), [s.step for s in steps]
    assert sorted(s.policy_version for s in steps) == list(range(1, RL_STEPS + 1))
    trained = [t for s in steps for t in s.trials]
    assert len(trained) == len(set(trained)), "a trial was trained twice"
    audit = audit_log(log, run_dir)
    assert audit.clean and audit.learner_steps == RL_STEPS and audit.trials_unaccounted == 0, audit.to_json()
    passes = {e.label: e for _, e in log.events(kinds=["eval_result"]) if isinstance(e, EvalResult)}
    attempts = labelled_attempts(e for _, e in log.events(kinds=["trial_issued", "verifier_result"]))
    assert passes["after"].policy_version == RL_STEPS
    for label, result in passes.items():
        assert len(attempts.get(label, [])) == result.n, label
