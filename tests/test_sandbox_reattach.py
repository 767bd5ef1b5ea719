"""A trial's workspace outlives its sandbox process: a process SIGKILLed with trials open leaves their roots mounted,
and the next one takes them over by trial id: as they were, or rolled back to the snapshot taken when the command
running at the kill started (_sandbox/reattach.py); a root that cannot be recovered is deleted and said lost."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
import trio

pytest.importorskip("t1_actors.runtime.host")

from _trio import trio_test

from schemas import ExecRequest, SandboxClose, SandboxExec, SandboxOpen, TrialIssued, WorkspaceRecovered
from storage import EventLog
from t1_actors.backends._sandbox import cgroups
from t1_actors.backends._sandbox.layers import mounts_under, remove_tree
from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig, SandboxInfraError
from t1_actors.runtime.host import run_actor_process
from t1_actors.runtime.peers import connect
from t1_actors.sandbox import SandboxActor
from t1_actors.tasks import build_task_sets
from t1_actors.tasks.config import TasksConfig
from t1_actors.tasks.model import Environment, FileSpec, Limits, Task
from t1_actors.tasks.model import Tests as TaskTests

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or cgroups.available() is not None,
                                reason="the local sandbox needs root and cgroup v1 memory/pids")

TASK = Task(id="keep", family="test", instruction="do it", tests=TaskTests(files={"test_x.py": "def test_x(): pass\n"}),
            environment=Environment(files={"/app/in.txt": FileSpec(content="hello\n")}),
            limits=Limits(command_timeout_s=10, memory_mb=256, max_output_bytes=4096, build_timeout_s=60))


def _play_then_die(base_dir: str, ready: Path) -> None:
    """A sandbox process with three trials open when it is killed: "done" between commands, "running" inside a
    command that has changed its workspace, "unsnapped" the same without snapshots. It never returns."""
    for name, snapshots in (("done", True), ("running", True), ("unsnapped", False)):
        backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=base_dir, snapshots=snapshots), sweep=False)
        sandbox = backend.open(TASK, name)
        sandbox.begin_command(0, "echo one > f")
        assert sandbox.exec("echo one > f").exit_code == 0
        sandbox.end_command()  # its output is logged
        if name != "done":
            sandbox.begin_command(1, "echo two >> f")
            assert sandbox.exec("echo two >> f").exit_code == 0  # the kill lands before its output is logged
    ready.write_text("ready")
    time.sleep(3600)


def test_a_killed_sandbox_process_leaves_its_workspaces_to_the_next_one(tmp_path):
    base = str(tmp_path / "sandbox")
    ready = tmp_path / "ready"
    child = multiprocessing.get_context("spawn").Process(target=_play_then_die, args=(base, ready), daemon=True)
    child.start()
    deadline = time.monotonic() + 240
    while not ready.exists() and child.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), "the sandbox process did not get its trials going"
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    # not reaped yet: a zombie, as a killed actor is until its parent (or a late-reaping init) waits for it; a
    # zombie owns nothing (taking it for alive once left a relaunch's every workspace lost)
    stat = Path(f"/proc/{child.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"

    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=base), sweep=False)
    try:
        done, kept = backend.adopt(TASK, "done")
        assert kept.outcome == "reattached" and done.exec("cat f in.txt").stdout == "one\nhello\n"
        running, rolled = backend.adopt(TASK, "running")
        assert (rolled.outcome, rolled.turn, rolled.command) == ("rolled_back", 1, "echo two >> f")
        assert running.exec("cat f").stdout == "one\n"  # as the command found it: it can run again, once
        running.begin_command(1, "echo two >> f")
        assert running.exec("echo two >> f && cat f").stdout == "one\ntwo\n"
        running.end_command()
        with pytest.raises(SandboxInfraError, match="lost: .*no snapshot"):
            backend.adopt(TASK, "unsnapped")
        assert backend.adopt(TASK, "never-opened") is None
        assert backend.sweep_stale() == 0  # nothing left to sweep: the lost one is already gone
        trials = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "sandbox" / "trials").iterdir())
        assert trials == ["done", "running"]
    finally:
        backend.close()
        child.join(10)
    assert mounts_under(tmp_path / "sandbox" / "trials") == []


def test_a_root_whose_owner_pid_was_reused_is_stale(tmp_path):
    """The owner file names a pid; a process started after the file was written got that pid again (here this
    very process, started long before a file we date forward) and owns nothing: the root is swept."""
    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path / "sandbox")), sweep=False)
    sandbox = None
    try:
        sandbox = backend.open(TASK, "reused")
        owner = sandbox.directory / "owner"
        assert backend.sweep_stale() == 0  # its owner is this process, alive
        backend._forget(sandbox)
        (owner).write_text(str(os.getppid()))  # a live process that started before the file...
        assert backend.sweep_stale() == 0
        past = time.time() - 10 * 365 * 86400  # ...and one that, by the file's date, started after it
        os.utime(owner, (past, past))
        assert backend.sweep_stale() == 1
        assert not sandbox.directory.exists()
    finally:
        backend.close()
        if sandbox is not None and sandbox.directory.exists():  # not swept (the test failed): its mounts must not outlive it
            remove_tree(sandbox.directory)


def _start_actor(config) -> multiprocessing.Process:
    process = multiprocessing.get_context("spawn").Process(target=run_actor_process,
                                                           args=(SandboxActor, config, "sandbox-0"), daemon=True)
    process.start()
    return process


@trio_test
async def test_a_command_running_when_the_sandbox_actor_is_killed_runs_again_once_on_its_rolled_back_workspace(
        tmp_path, actor_config):
    tasks = {"seed": 0, "train_size": 2, "eval_size": 2}
    config = actor_config({"name": "sandbox-0", "role": "sandbox", "actor_class": "t1_actors.sandbox:SandboxActor"},
                          run_id="reattach-test", tasks=tasks, sandbox={"local": {"base_dir": str(tmp_path / "sb")}})
    task = build_task_sets(TasksConfig(**tasks)).train[0]
    slow = "echo two >> f; sleep 3; cat f"
    first, second = _start_actor(config), None
    try:
        async with connect(config, "test") as peers:
            sandbox = peers("sandbox")
            with trio.fail_after(240):
                await sandbox.call(SandboxOpen(trial_id="a", task_id=task.id), deadline_s=240)
            await sandbox.call(ExecRequest(trial_id="a", turn=0, command="echo one > f", timeout_s=10), deadline_s=30)
            log = EventLog.open(config.run.dir / "log")
            writer = log.writer("controller")  # what the staleness controller logged: the trial is open
            writer.append(TrialIssued(trial_id="a", task_id=task.id, split="train", policy_version_wanted=0))
            writer.commit()
            replies = []
            with trio.fail_after(240):
                async with trio.open_nursery() as nursery:
                    async def in_flight() -> None:
                        replies.append(await sandbox.call_bulk(ExecRequest(trial_id="a", turn=1, command=slow,
                                                                           timeout_s=10)))

                    nursery.start_soon(in_flight)
                    await trio.sleep(1.0)  # "echo two >> f" has run; the command sleeps
                    assert first.pid is not None
                    os.kill(first.pid, signal.SIGKILL)
                    first.join(10)
                    second = _start_actor(config)  # what the supervisor does; the request is resent to it
            [reply] = replies
            assert isinstance(reply, SandboxExec) and reply.stdout == "one\ntwo\n", reply  # run once, not twice
            await sandbox.call(SandboxClose(trial_id="a"), deadline_s=30)
        events = [e for _, e in log.by_trial("a")]
        [recovered] = [e for e in events if isinstance(e, WorkspaceRecovered)]
        assert (recovered.outcome, recovered.turn, recovered.command) == ("rolled_back", 1, slow)
        assert [(e.turn, e.stdout) for e in events if isinstance(e, SandboxExec)] == [(0, ""), (1, "one\ntwo\n")]
    finally:
        for process in (first, second):
            if process is not None and process.is_alive():
                process.terminate()  # a clean stop: the actor unmounts what it holds
                process.join(30)
    assert mounts_under(tmp_path / "sb" / "trials") == []
