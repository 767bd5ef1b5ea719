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

from t1_actors.backends._sandbox import cgroups
from t1_actors.backends._sandbox.layers import mounts_under
from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig, SandboxInfraError
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
    child.join(10)

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
    assert mounts_under(tmp_path / "sandbox" / "trials") == []
