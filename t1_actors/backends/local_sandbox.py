"""The local sandbox backend (embedded default): bubblewrap over a private copy-on-write root per trial.

Each trial's root is an overlayfs stack (see ``_sandbox/layers.py``): the host's system directories at
the bottom, read-only, under a mask that hides the host's accounts, its secrets in /etc and its /var
(``_sandbox/hostview.py``); the task's environment image above them (the Dockerfile replayed, files and
setup; built once per environment and cached); the trial's own upper layer on top, where every write
lands. The host is never modified; closing a sandbox unmounts it and deletes the upper layer.

Each tool call runs in ``bwrap`` with fresh pid/ipc/uts/net namespaces (no network during the agent's
turns; build steps get the host's, as a Docker build would), Docker's default capabilities less
CAP_MKNOD, a system-call filter like Docker's default seccomp profile (``_sandbox/seccomp.py``;
``seccomp = false`` turns it off), and its own cgroup: memory and process caps and a kill switch for the whole
tree at the wall-clock timeout; rlimits cap CPU seconds (timeout x the task's ``cpus``) and file size; output is
capped per stream and flagged. Processes do not outlive their tool call (the pid namespace ends with it).
The trial's upper layer lives on its own disk (``_sandbox/disk.py``: a sparse ext4 image of ``disk_mb``,
loop-mounted), so its writes stop there and never fill the host's. The backend's disks together are held to
``disk_total_mb`` (``disk.DiskBudget``): a trial reserves its disk's size before it is made, until its root is
deleted; one that does not fit is refused before anything is made (``DiskBudgetExceeded``); ``adopt`` charges too.

Usage::

    backend = LocalSandboxBackend(LocalSandboxConfig())
    sandbox = backend.open(task, "trial-1")
    result = sandbox.exec("ls /app", timeout_s=5)
    sandbox.close()
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import queue
import secrets
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

from t1_actors.backends._sandbox import cgroups, disk, hostview, reattach, seccomp
from t1_actors.backends._sandbox.disk import DiskBudget, DiskBudgetExceeded
from t1_actors.backends._sandbox.image import Image, SandboxBuildError, build_image
from t1_actors.backends._sandbox.interface import BuildReport, ExecResult, Sandbox, SandboxBackend, SandboxInfraError
from t1_actors.backends._sandbox.layers import Layer, RootStack, make_skeleton, remove_tree, unmount_all
from t1_actors.backends._sandbox.owner import alive, trial_owner
from t1_actors.backends._sandbox.rootfs import RootFS
from t1_actors.backends._sandbox.runner import BASE_ENV, ExecLimits, bwrap_path, run_in_root
from t1_actors.backends._sandbox.trial_root import TRIAL_FILE, TrialRoot, locate_trial, trial_dir_prefix, trial_roots

if TYPE_CHECKING:
    from t1_actors.tasks.model import Task

__all__ = ["LocalSandboxConfig", "LocalSandboxBackend", "LocalSandbox", "TrialRoot", "locate_trial", "ExecResult",
           "SandboxInfraError", "SandboxBuildError", "DiskBudgetExceeded", "Sandbox", "SandboxBackend", "BuildReport"]


class LocalSandboxConfig(BaseModel):
    """The ``[sandbox.local]`` section of the run config. Per-command limits come from each task's Limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_dir: str = Field("/tmp/t1-sandbox", description="images, trials and the skeleton root live here")
    pids_max: int = Field(256, gt=8, description="processes + threads per command (fork bombs stop here)")
    file_size_mb: int = Field(512, gt=0, description="largest file one command may write")
    disk_mb: int = Field(1024, ge=0, description="all a trial may write, on its own loop-mounted ext4 image "
                                                 "(sparse); 0: on the host's disk, uncapped (and no disk_total_mb)")
    disk_total_mb: int = Field(
        0, ge=0, description="the disks of all open trials of one sandbox backend together (the sum of their "
                             "disk_mb, trials taken over after a restart included): a trial that would pass it is "
                             "refused before it starts, an infrastructure failure. 0: the space free on base_dir's "
                             "file system when the backend starts, less a tenth (at least 2048 MB); it assumes no "
                             "other backend draws on that disk meanwhile (give each its share if several do)")
    build_network: bool = Field(True, description="Dockerfile RUN / setup steps may reach package registries")
    build_memory_mb: int = Field(4096, gt=0, description="memory cap of one environment build step")
    seccomp: bool = Field(True, description="every command and build step under a system-call filter like "
                                            "Docker's default profile (no namespaces, mounts, keyrings, bpf, "
                                            "perf, modules; _sandbox/seccomp.py); false: none")
    snapshots: bool = Field(True, description="a copy of the trial's upper layer when each command starts "
                                              "(_sandbox/reattach.py), so a command running when the sandbox actor "
                                              "is killed is rolled back and run again; false: such a trial is lost")

    @model_validator(mode="after")
    def _check(self) -> LocalSandboxConfig:
        if self.disk_total_mb and not self.disk_mb:
            raise ValueError(f"disk_total_mb = {self.disk_total_mb} budgets the trials' own disks and disk_mb = 0 "
                             f"gives them none: set disk_total_mb = 0, or disk_mb > 0")
        if 0 < self.disk_total_mb < self.disk_mb:
            raise ValueError(f"disk_total_mb = {self.disk_total_mb} cannot hold one trial's disk (disk_mb = "
                             f"{self.disk_mb}): raise disk_total_mb to at least {self.disk_mb} (times the trials "
                             f"run at once), or lower disk_mb")
        return self


class LocalSandboxBackend:
    """Opens local sandboxes. Thread-safe; one per process is plenty."""

    name = "local"

    def __init__(self, config: LocalSandboxConfig | None = None, *, sweep: bool = True):
        self.config = config or LocalSandboxConfig()
        problem = cgroups.available()
        if problem:
            raise SandboxInfraError(f"local sandbox needs per-command cgroups: {problem}")
        bwrap_path()
        if self.config.seccomp:
            seccomp.compiled()  # fails here, naming the key, when libseccomp or pyseccomp is missing
        if self.config.disk_mb and (problem := disk.available()):
            raise SandboxInfraError(f"per-trial disks ([sandbox.local] disk_mb = {self.config.disk_mb}): {problem}; "
                                    f"set disk_mb = 0 to write on the host's disk, uncapped")
        self.base = Path(self.config.base_dir)
        self.trials_dir = self.base / "trials"
        self.trials_dir.mkdir(parents=True, exist_ok=True)
        self.disk_budget = self._make_disk_budget() if self.config.disk_mb else None
        system_dirs = make_skeleton(self.base / "skeleton")
        mask = hostview.make_mask(self.base / "masks", system_dirs)  # the host's accounts and secrets hidden
        self.base_stack = RootStack(self.base / "skeleton", (mask,), system_dirs)
        self._images: dict[str, tuple[Task, Image]] = {}
        self._lock = threading.Lock()
        self._open: dict[str, LocalSandbox] = {}
        self._teardown: queue.Queue[tuple[list[str], Path] | None] = queue.Queue()
        self._reaper = threading.Thread(target=self._reap, name="t1-sandbox-reaper", daemon=True)
        self._reaper.start()
        atexit.register(self.wait_torn_down)  # a daemon reaper must not leave mounts behind at exit
        if sweep:  # else the caller takes over the trials it still wants (adopt), then sweeps
            self.sweep_stale()

    def _make_disk_budget(self) -> DiskBudget:
        """``disk_total_mb``, or the free space less a margin (``disk.derived_budget``) counting what the roots of
        dead processes hold as free: each is taken over (and charged its whole disk) or swept."""
        size = self.config.disk_total_mb
        if size:
            return DiskBudget(size, "is [sandbox.local] disk_total_mb")
        leftover = sum(disk.written_mb(d) for d in self.trials_dir.iterdir() if (owner := trial_owner(d)) is not None
                       and owner[0] != os.getpid() and not alive(*owner))
        size, origin = disk.derived_budget(self.trials_dir, leftover)
        if size < self.config.disk_mb:
            raise SandboxInfraError(f"no room for one trial's disk ([sandbox.local] disk_mb = {self.config.disk_mb}): "
                                    f"the disk budget {origin}, {size} MB. Free disk space, lower disk_mb, or set "
                                    f"disk_total_mb (the trials' disks together) yourself")
        return DiskBudget(size, origin)

    def _reap(self) -> None:
        """Unmount and delete closed trials off the caller's path (umount waits for RCU grace periods)."""
        while (item := self._teardown.get()) is not None:
            mounted, directory = item
            try:
                unmount_all(mounted)
                remove_tree(directory)
            finally:
                self._release_disk(directory)
                self._teardown.task_done()
        self._teardown.task_done()

    def _release_disk(self, directory: Path) -> None:
        if self.disk_budget is not None:
            self.disk_budget.release(directory.name)

    def wait_torn_down(self) -> None:
        """Block until every closed sandbox is unmounted and deleted."""
        self._teardown.join()

    def image(self, task: Task) -> Image:
        """The task's environment image (built on first use, then cached on disk and in memory)."""
        with self._lock:
            known = self._images.get(task.id)
        if known is not None and known[0] is task and (known[1].layer.path / "meta.json").is_file():
            return dataclasses.replace(known[1], report=dataclasses.replace(known[1].report, cached=True))
        limits = task.limits
        build_limits = ExecLimits(limits.build_timeout_s, self.config.build_memory_mb << 20, self.config.pids_max,
                                  max(limits.cpus, 1.0), self.config.file_size_mb << 20, 64 << 10)
        image = build_image(task, self.base / "images", self.base_stack, build_limits, self.config.build_network,
                            seccomp_filter=self.config.seccomp)
        with self._lock:
            self._images[task.id] = (task, image)  # the same Task object skips re-hashing its build context
        return image

    def open(self, task: Task, trial_id: str) -> LocalSandbox:
        image = self.image(task)
        directory = self.trials_dir / f"{trial_dir_prefix(trial_id)}{secrets.token_hex(4)}"
        stack = RootStack(self.base_stack.skeleton, (image.layer, *self.base_stack.layers), self.base_stack.system_dirs)
        if self.disk_budget is not None:  # before anything is made: a refused trial leaves nothing behind
            self.disk_budget.reserve(directory.name, self.config.disk_mb, trial_id)
        try:
            directory.mkdir(parents=True)
            (directory / "owner").write_text(str(os.getpid()))
            # the upper and work dirs on the trial's own disk (unmounted last: it is first in `mounted`)
            home = disk.make_disk(directory, self.config.disk_mb) if self.config.disk_mb else directory
            upper = Layer(home / "upper").create(stack.system_dirs)
            merged = directory / "root"
            merged.mkdir()
            mounted = ([str(home)] if home != directory else []) + stack.mount(merged, upper, home / "work")
        except (OSError, SandboxInfraError) as exc:
            remove_tree(directory)
            self._release_disk(directory)
            if isinstance(exc, SandboxInfraError):
                raise
            raise SandboxInfraError(f"cannot mount the root of trial {trial_id}: {exc}") from exc
        trial_root = TrialRoot(trial_id, stack, upper, image.workdir, {**BASE_ENV, **image.env})
        reattach.record_mounts(directory, mounted)
        (directory / TRIAL_FILE).write_text(json.dumps(trial_root.to_json()))
        sandbox = LocalSandbox(self, task, trial_id, directory, merged, mounted, trial_root, image.report)
        with self._lock:
            self._open[sandbox.directory.name] = sandbox
        return sandbox

    def adopt(self, task: Task, trial_id: str) -> tuple[LocalSandbox, reattach.Takeover] | None:
        """Take over the root of ``trial_id`` that a killed process left (its owner dead), rolled back to before the
        command it was running, if any (``_sandbox/reattach.py``). None when there is no such root; a root that
        cannot be recovered is deleted and SandboxInfraError says why. The root's disk counts against the disk
        budget (its size, as it was made), even past the budget: it exists already."""
        for directory, trial_root in trial_roots(self.trials_dir, trial_id):
            owner = trial_owner(directory)
            if owner is None or owner[0] == os.getpid() or alive(*owner):
                continue
            try:
                takeover = reattach.take_over(directory, trial_root.stack, trial_root.upper, directory / "root")
                (directory / "owner").write_text(str(os.getpid()))
            except (OSError, SandboxInfraError) as exc:
                remove_tree(directory)
                raise SandboxInfraError(f"the workspace of trial {trial_id} is lost: {exc}") from exc
            if self.disk_budget is not None:
                self.disk_budget.charge(directory.name, disk.image_mb(directory))
            sandbox = LocalSandbox(self, task, trial_id, directory, directory / "root", takeover.mounted, trial_root,
                                   self.image(task).report)
            with self._lock:
                self._open[directory.name] = sandbox
            return sandbox, takeover
        return None

    def _forget(self, sandbox: LocalSandbox) -> None:
        with self._lock:
            self._open.pop(sandbox.directory.name, None)

    def sweep_stale(self) -> int:
        """Unmount and delete trial roots whose owning process is gone (a crashed run). Returns how many."""
        swept = 0
        for directory in self.trials_dir.iterdir():
            owner = trial_owner(directory)
            if owner is None:  # no owner yet (being opened), or already being torn down
                try:
                    if time.time() - directory.stat().st_mtime < 600:
                        continue
                except OSError:
                    continue
            elif alive(*owner):
                continue
            remove_tree(directory)
            self._release_disk(directory)  # none held, unless the root was forgotten by its own process
            swept += 1
        cgroups.sweep_stale()
        return swept

    def close(self) -> None:
        """Close every open sandbox and wait until every closed one is torn down."""
        with self._lock:
            sandboxes = list(self._open.values())
        for sandbox in sandboxes:
            sandbox.close()
        if self._reaper.is_alive():
            self._teardown.put(None)
            self._reaper.join()


class LocalSandbox:
    """One trial's sandbox. ``exec`` may be called from any thread, one call at a time per trial."""

    def __init__(self, backend: LocalSandboxBackend, task: Task, trial_id: str, directory: Path, root: Path,
                 mounted: list[str], trial_root: TrialRoot, build: BuildReport):
        self.backend = backend
        self.task = task
        self.trial_id = trial_id
        self.directory = directory
        self.root = root
        self.trial_root = trial_root
        self.build = build
        self._mounted = mounted
        self._files = RootFS(root)
        self._closed = False

    def limits(self, timeout_s: float | None) -> ExecLimits:
        limits = self.task.limits
        config = self.backend.config
        return ExecLimits(timeout_s or limits.command_timeout_s, limits.memory_mb << 20, config.pids_max,
                          limits.cpus, config.file_size_mb << 20, limits.max_output_bytes)

    def exec(self, command: str, timeout_s: float | None = None, *, network: bool = False) -> ExecResult:
        """Run ``command`` through /bin/sh in the trial's root, in its workdir, without network."""
        self._check_open()
        workdir = self.trial_root.workdir
        if not self._files.is_dir(workdir):  # the agent removed it: start in / (bwrap would refuse to chdir)
            workdir = "/"
        result = run_in_root(self.root, ["/bin/sh", "-c", command], env=self.trial_root.env, workdir=workdir,
                             limits=self.limits(timeout_s), network=network, name=self.directory.name,
                             seccomp_filter=self.backend.config.seccomp)
        if (result.exit_code != 0 and result.killed_by is None and self.backend.config.disk_mb
                and disk.disk_full(self.directory / disk.MOUNTPOINT, result.stderr)):
            result = dataclasses.replace(result, killed_by="disk")  # it failed with the trial's disk full
        return result

    def begin_command(self, turn: int, command: str) -> float:
        """Before running a command whose output will be logged: snapshot the workspace (``snapshots``) and record
        the command as running, until ``end_command``; returns the snapshot's seconds (0 without one)."""
        self._check_open()
        seconds = reattach.take_snapshot(self.directory, self.trial_root.upper) if self.backend.config.snapshots else 0.0
        reattach.mark_running(self.directory, turn, command)
        return seconds

    def end_command(self) -> None:
        """The command's output is logged: a kill from now on leaves its effects in the workspace, as they should."""
        reattach.mark_done(self.directory)

    def interrupt(self) -> int:
        """Kill whatever command of this trial is running now (its ``exec`` returns, killed). Thread-safe."""
        return cgroups.kill_all(self.directory.name + "-")

    def read_file(self, path: str) -> bytes:
        self._check_open()
        return self._files.read(path)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._check_open()
        self._files.write(path, data, mode)

    def close(self) -> None:
        """Unmount and delete the trial's root. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.backend._forget(self)
        (self.directory / TRIAL_FILE).unlink(missing_ok=True)  # at once: no verifier finds a closed trial
        budget = self.backend.disk_budget
        if self.backend._reaper.is_alive():
            if budget is not None:
                budget.leaving(self.directory.name)  # released once the reaper has deleted the root
            self.backend._teardown.put((self._mounted, self.directory))
        else:
            try:
                unmount_all(self._mounted)
                remove_tree(self.directory)
            finally:
                self.backend._release_disk(self.directory)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxInfraError(f"sandbox of trial {self.trial_id} is closed")

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
