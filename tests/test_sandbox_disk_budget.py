"""The disks of all trials of one local sandbox backend are held to ``[sandbox.local] disk_total_mb``: a trial
reserves its disk before the image is made and gives it back once its root is deleted; one that does not fit is
refused, an infrastructure failure naming the numbers and the setting; trials taken over after a restart count."""

from __future__ import annotations

import os
import threading
import time

import pytest
from pydantic import ValidationError

from t1_actors.backends._sandbox import cgroups, disk
from t1_actors.backends._sandbox.layers import mounts_under, remove_tree
from t1_actors.backends.local_sandbox import (
    DiskBudgetExceeded,
    LocalSandboxBackend,
    LocalSandboxConfig,
    SandboxInfraError,
)
from t1_actors.tasks.model import Environment, FileSpec, Limits, Task
from t1_actors.tasks.model import Tests as TaskTests

needs_root = pytest.mark.skipif(os.geteuid() != 0 or cgroups.available() is not None or disk.available() is not None,
                                reason="the local sandbox needs root, cgroup v1 memory/pids and loop devices")

TASK = Task(id="budget", family="test", instruction="do it", tests=TaskTests(files={"test_x.py": "def test_x(): pass\n"}),
            environment=Environment(files={"/app/in.txt": FileSpec(content="hello\n")}),
            limits=Limits(command_timeout_s=10, memory_mb=256, max_output_bytes=4096, build_timeout_s=60))
SHARE = 16  # MB: each trial's disk


def _trials(base) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[0] for p in (base / "trials").iterdir())


def test_the_budget_is_checked_against_the_trials_disk_in_the_config():
    assert LocalSandboxConfig().disk_total_mb == 0  # derived when the backend starts
    with pytest.raises(ValidationError, match="cannot hold one trial's disk"):
        LocalSandboxConfig(disk_mb=64, disk_total_mb=32)
    with pytest.raises(ValidationError, match="disk_mb = 0 gives them none"):
        LocalSandboxConfig(disk_mb=0, disk_total_mb=1024)
    LocalSandboxConfig(disk_mb=0)  # no disks, no budget


@needs_root
def test_a_budget_of_two_trials_refuses_the_third_until_one_is_deleted(tmp_path):
    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path / "sb"), disk_mb=SHARE,
                                                     disk_total_mb=2 * SHARE))
    try:
        first, second = backend.open(TASK, "first"), backend.open(TASK, "second")
        with pytest.raises(DiskBudgetExceeded) as refused:
            backend.open(TASK, "third")
        assert isinstance(refused.value, SandboxInfraError)  # an infrastructure failure, never a scored trial
        message = str(refused.value)
        for said in ("trial third refused", "disk_mb = 16", "32 of 32 MB are held by 2 open trial(s)", "0 MB left",
                     "is [sandbox.local] disk_total_mb", "Raise [sandbox.local] disk_total_mb", "lower disk_mb"):
            assert said in message, message
        assert _trials(tmp_path / "sb") == ["first", "second"]  # refused before anything was made
        assert backend.disk_budget is not None and backend.disk_budget.held_mb() == 2 * SHARE

        first.close()  # deleted by the reaper, off this thread: the next open waits for it, not refused
        third = backend.open(TASK, "third")
        assert third.exec("cat in.txt").stdout == "hello\n"
        assert backend.disk_budget.held_mb() == 2 * SHARE
        second.close()
        third.close()
        backend.wait_torn_down()
        assert backend.disk_budget.held_mb() == 0
    finally:
        backend.close()
    assert mounts_under(tmp_path / "sb" / "trials") == []


@needs_root
def test_trials_opened_at_once_from_threads_get_the_budget_exactly_once(tmp_path):
    """The backend is called from worker threads (trio.to_thread, the SFT oracle pool): six opens at once on a
    budget of two disks give two trials and four refusals."""
    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path / "sb"), disk_mb=SHARE,
                                                     disk_total_mb=2 * SHARE))
    backend.image(TASK)  # built once, before the race
    opened, refused = [], []
    start = threading.Barrier(6)

    def one(i: int) -> None:
        start.wait()
        try:
            opened.append(backend.open(TASK, f"racer-{i}"))
        except DiskBudgetExceeded as exc:
            refused.append(exc)

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert (len(opened), len(refused)) == (2, 4)
        assert backend.disk_budget is not None and backend.disk_budget.held_mb() == 2 * SHARE
        assert len(_trials(tmp_path / "sb")) == 2
    finally:
        backend.close()
    assert backend.disk_budget.held_mb() == 0


@needs_root
def test_trials_taken_over_after_a_restart_count_against_the_budget(tmp_path):
    """A process dies with two trials open (here: their owner files name a process started after they were
    written, as a pid reused after the owner's death); the next backend takes them over and they hold its budget,
    past it when the budget shrank across the restart: nothing new opens until one is deleted."""
    base = tmp_path / "sb"
    config = LocalSandboxConfig(base_dir=str(base), disk_mb=SHARE, disk_total_mb=2 * SHARE)
    dead = LocalSandboxBackend(config, sweep=False)
    left = [dead.open(TASK, name) for name in ("kept-1", "kept-2")]
    for sandbox in left:
        assert sandbox.exec("echo mine > f").exit_code == 0
        dead._forget(sandbox)  # its process is gone: nobody closes it
        owner = sandbox.directory / "owner"
        owner.write_text(str(os.getppid()))
        past = time.time() - 10 * 365 * 86400
        os.utime(owner, (past, past))
    dead.close()

    backend = LocalSandboxBackend(config.model_copy(update={"disk_total_mb": SHARE}), sweep=False)  # shrank: one disk
    try:
        kept = [backend.adopt(TASK, name) for name in ("kept-1", "kept-2")]
        assert all(k is not None and k[1].outcome == "reattached" for k in kept)
        assert backend.disk_budget is not None and backend.disk_budget.held_mb() == 2 * SHARE  # charged past it
        with pytest.raises(DiskBudgetExceeded, match=r"32 of 16 MB are held by 2 open trial\(s\), 0 MB left"):
            backend.open(TASK, "new")
        assert backend.sweep_stale() == 0
        sandboxes = [k[0] for k in kept if k is not None]
        assert sandboxes[0].exec("cat f").stdout == "mine\n"
        sandboxes[0].close()
        with pytest.raises(DiskBudgetExceeded):  # 16 of 16 still held by the other
            backend.open(TASK, "new")
        sandboxes[1].close()
        assert backend.open(TASK, "new").exec("cat in.txt").stdout == "hello\n"
        assert backend.disk_budget.held_mb() == SHARE
    finally:
        backend.close()
        for directory in (base / "trials").iterdir():  # not taken over (the test failed): no mount outlives it
            remove_tree(directory)
    assert mounts_under(base / "trials") == []


@needs_root
def test_the_derived_budget_is_the_free_space_less_a_margin_counting_what_dead_trials_wrote(tmp_path):
    base = tmp_path / "sb"
    dead = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(base), disk_mb=SHARE))
    try:
        budget = dead.disk_budget
        assert budget is not None and "is derived (disk_total_mb = 0)" in budget.origin
        fs = os.statvfs(base / "trials")
        free_mb = fs.f_bavail * fs.f_frsize >> 20
        margin_mb = max(disk.MARGIN_MIN_MB, free_mb // 10)
        assert abs(budget.total_mb - (free_mb - margin_mb)) <= 64, (budget.total_mb, free_mb)  # the disk moves
        sandbox = dead.open(TASK, "writer")
        assert sandbox.exec("head -c 8M /dev/zero > f").exit_code == 0  # taken from the free space
        dead._forget(sandbox)
        (sandbox.directory / "owner").write_text(str(os.getppid()))
        past = time.time() - 10 * 365 * 86400
        os.utime(sandbox.directory / "owner", (past, past))
    finally:
        dead.close()
    os.sync()  # the loop device's writes reach the image file's blocks

    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(base), disk_mb=SHARE))  # sweeps the dead root
    try:
        assert backend.disk_budget is not None
        written = int(backend.disk_budget.origin.split("(of which ")[1].split(" MB")[0])
        assert written >= 8, backend.disk_budget.origin  # counted as free: swept (as here) or charged whole
        assert _trials(base) == []
    finally:
        backend.close()
        for directory in (base / "trials").iterdir():
            remove_tree(directory)
    with pytest.raises(SandboxInfraError, match="no room for one trial's disk"):
        LocalSandboxBackend(LocalSandboxConfig(base_dir=str(base), disk_mb=(free_mb << 1) + 4096))
