"""Executed oracle outputs kept with a run and reused by a later one (``[campaign] oracle_pool_from``), and
``t1-actor launch --until sft`` (t1_actors/warmstart/oracle_outputs.py, t1_actors/job/main.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from functools import partial

import pytest
from fixtures.campaign import ROOT, micro_config

from t1_actors.backends.local_sandbox import DiskBudgetExceeded, ExecResult, SandboxBuildError, SandboxInfraError
from t1_actors.job.config import load_config
from t1_actors.job.resume import resume_state
from t1_actors.policy.tokenizer import train_tokenizer
from t1_actors.runtime.config import ConfigError
from t1_actors.tasks import TasksConfig, build_task_sets
from t1_actors.warmstart.finetune import chat_corpus, execute_oracle_pool
from t1_actors.warmstart.oracle_outputs import OracleOutputs, outputs_path, read_outputs, task_digest, write_outputs


@pytest.fixture(scope="module")
def tasks():
    return build_task_sets(TasksConfig(seed=0, train_size=24, eval_size=4, validation_size=4)).sft[:6]


def test_an_output_is_reused_only_for_the_very_task_that_produced_it(tasks, tmp_path):
    executed = []

    def execute(task):
        executed.append(task.id)
        return [f"out of {task.id}", "2nd"]

    first = OracleOutputs()
    for task in tasks:
        first.outputs(task, execute)
    write_outputs(tmp_path, first.kept)
    assert first.reused == 0 and executed == [t.id for t in tasks]

    changed = tasks[0].model_copy(update={"instruction": tasks[0].instruction + " Twice."})  # same id, other task
    executed.clear()
    second = OracleOutputs(read_outputs(tmp_path))
    got = [second.outputs(task, execute) for task in [changed, *tasks[1:]]]
    assert executed == [changed.id]  # only the changed task ran again
    assert second.reused == len(tasks) - 1
    assert got[1:] == [[f"out of {t.id}", "2nd"] for t in tasks[1:]]
    assert second.kept[changed.id][0] == task_digest(changed) != task_digest(tasks[0])


def test_a_failed_oracle_is_not_kept(tasks, tmp_path):
    pool = OracleOutputs()
    assert pool.outputs(tasks[0], lambda task: None) is None
    assert pool.kept == {} and pool.reused == 0
    write_outputs(tmp_path, pool.kept)
    assert read_outputs(tmp_path) == {}


class _Sandbox:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def exec(self, command):
        return ExecResult(0, f"ran {command[:20]}", "", 0.0)


class _Sandboxes:
    """A sandbox backend whose open raises ``refuse(task)`` when that is an error, else opens a sandbox."""

    def __init__(self, refuse):
        self.refuse = refuse

    def open(self, task, trial_id):
        error = self.refuse(task)
        if error is not None:
            raise error
        return _Sandbox()


def _pool(tasks, sandboxes):
    """The SFT oracle pool as the warm start runs it (t1_actors.job.sft.warm_start): each oracle executed in a
    sandbox of ``sandboxes`` through ``OracleOutputs``, two workers."""
    pool = OracleOutputs()
    tokenizer = train_tokenizer(chat_corpus(tasks), 512)
    examples, failures = execute_oracle_pool(tasks, lambda task: pool.outputs(task, partial(pool.execute, sandboxes)),
                                             tokenizer, tool_output_chars=200, max_len=4096, workers=2)
    return pool, examples, failures


def test_oracles_lost_to_sandbox_infrastructure_errors_are_counted_and_said(tasks):
    refused = {tasks[1].id: DiskBudgetExceeded("trial sft-x refused: 0 MB left; raise [sandbox.local] disk_total_mb"),
               tasks[4].id: SandboxBuildError("apt-get exited 100")}
    pool, examples, failures = _pool(tasks, _Sandboxes(lambda task: refused.get(task.id)))
    assert failures == pool.lost == 2 and examples and set(pool.kept) == {t.id for t in tasks} - set(refused)
    line = pool.losses()
    assert line.startswith("oracle pool: 2 example(s) lost to sandbox infrastructure errors"), line
    assert f"the first: task {tasks[1].id}: DiskBudgetExceeded: trial sft-x refused" in line or (
        f"the first: task {tasks[4].id}: SandboxBuildError: apt-get exited 100" in line), line  # two workers
    pool.check_losses(len(tasks))  # some were executed: SFT goes on
    assert OracleOutputs().losses() == ""


def test_an_oracle_pool_lost_whole_fails_with_the_sandboxes_error(tasks):
    pool, examples, failures = _pool(tasks, _Sandboxes(lambda task: SandboxBuildError(f"task {task.id}: no network")))
    assert failures == pool.lost == len(tasks) and not examples
    with pytest.raises(SandboxInfraError, match=rf"every one of its {len(tasks)} oracles was lost .* the first: task "
                                                r".*: SandboxBuildError: task .*: no network"):
        pool.check_losses(len(tasks))


def test_an_error_that_is_not_the_sandboxes_is_not_swallowed_by_the_oracle_pool(tasks):
    with pytest.raises(ValueError, match="a bug"):
        _pool(tasks, _Sandboxes(lambda task: ValueError("a bug")))


def test_a_source_without_outputs_is_refused_naming_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"oracle_pool_from = .*oracle_outputs\.jsonl\.gz"):
        read_outputs(tmp_path)


def test_a_pool_source_with_a_warm_start_is_refused(tmp_path):
    config = micro_config(tmp_path, campaign={"oracle_pool_from": "runs/a", "warm_start_from": "runs/b"})
    with pytest.raises(ConfigError, match="oracle_pool_from .* warm_start_from"):
        load_config(config, quick=True)


def _launch_until_sft(config, run_dir):
    return subprocess.run([sys.executable, "-m", "t1_actors.cli", "launch", "--config", str(config), "--quick",
                           "--until", "sft", "--run-dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_until_sft_reuses_the_quick_runs_pool_and_stops_resumable(quick_campaign, tmp_path):
    """A run of the quick campaign's tasks with its pool: nothing executed again, the same outputs kept, SFT and its
    imitation done, no actor started; ``--resume`` would go on with RL."""
    assert quick_campaign.returncode == 0, quick_campaign.output[-3000:]
    source = read_outputs(quick_campaign.run_dir)
    config = micro_config(tmp_path, campaign={"oracle_pool_from": str(quick_campaign.run_dir), "sft_steps": 4})
    run_dir = tmp_path / "run"
    done = _launch_until_sft(config, run_dir)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    sft = json.loads((run_dir / "sft.json").read_text())["sft"]
    assert sft["steps"] == 4 and sft["imitation"]["chats"] > 0
    assert sft["oracle_reused"] == len(source) > 0  # every SFT and validation oracle came from the source run
    assert read_outputs(run_dir) == source
    assert not (run_dir / "summary.json").exists()
    state = resume_state(load_config(config, quick=True, run_dir=run_dir))
    assert state.prepared and not state.finished and state.newest is not None and state.newest.version == 0
    with gzip.open(outputs_path(run_dir), "rt") as lines:
        assert all(set(json.loads(line)) == {"task", "digest", "outputs"} for line in lines)


def test_a_missing_pool_source_is_refused_before_anything_is_written(tmp_path):
    config = micro_config(tmp_path, campaign={"oracle_pool_from": str(tmp_path / "nowhere")})
    done = _launch_until_sft(config, tmp_path / "run")
    assert done.returncode == 2
    assert "oracle_pool_from" in done.stderr and "nothing was touched" in done.stderr
    assert not (tmp_path / "run").exists()
