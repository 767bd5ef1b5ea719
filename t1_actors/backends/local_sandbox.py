"""The local sandbox backend (embedded default): bubblewrap over a private copy-on-write root per trial.

Each trial's root is an overlayfs stack (see ``_sandbox/layers.py``): the host's system directories at
the bottom, read-only, under a mask that hides the host's accounts, its secrets in /etc and its /var
(``_sandbox/hostview.py``); the task's environment image above them (the Dockerfile replayed, files and
setup; built once per environment and cached); the trial's own upper layer on top, where every write
lands. The host is never modified; closing a sandbox unmounts it and deletes the upper layer.

Each tool call runs in ``bwrap`` with fresh pid/ipc/uts/net namespaces (no network during the agent's
turns; build steps get the host's, as a Docker build would), Docker's default capabilities less
CAP_MKNOD, a system-call filter like Docker's default seccomp profile (``_sandbox/seccomp.py``;
``seccomp = false`` turns it off), and its own cgroup: memory and process caps and a kill switch for the whole tree at the
wall-clock timeout; rlimits cap CPU seconds (timeout x the task's ``cpus``) and file size; output is
capped per stream and flagged when truncated. Processes do not outlive their tool call (the pid namespace ends with it).
The trial's upper layer lives on its own disk (``_sandbox/disk.py``: a sparse ext4 image of ``disk_mb``,
loop-mounted), so its writes stop there and never fill the host's.

Usage::

    backend = LocalSandboxBackend(LocalSandboxConfig())
    sandbox = backend.open(task, "trial-1")
    result = sandbox.exec("ls /app", timeout_s=5)
    sandbox.close()
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import glob
import json
import os
import queue
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from t1_actors.backends._sandbox import cgroups, disk, hostview, reattach, seccomp
from t1_actors.backends._sandbox.image import Image, SandboxBuildError, build_image
from t1_actors.backends._sandbox.interface import BuildReport, ExecResult, Sandbox, SandboxBackend, SandboxInfraError
from t1_actors.backends._sandbox.layers import Layer, RootStack, make_skeleton, remove_tree, unmount_all
from t1_actors.backends._sandbox.rootfs import RootFS
from t1_actors.backends._sandbox.runner import BASE_ENV, ExecLimits, bwrap_path, run_in_root

if TYPE_CHECKING:
    from t1_actors.tasks.model import Task

__all__ = ["LocalSandboxConfig", "LocalSandboxBackend", "LocalSandbox", "TrialRoot", "locate_trial", "ExecResult",
           "SandboxInfraError", "SandboxBuildError", "Sandbox", "SandboxBackend", "BuildReport"]

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
TRIAL_FILE = "trial.json"  # in each trial's directory: its TrialRoot, for the verifier


class LocalSandboxConfig(BaseModel):
    """The ``[sandbox.local]`` section of the run config. Per-command limits come from each task's Limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_dir: str = Field("/tmp/t1-sandbox", description="images, trials and the skeleton root live here")
    pids_max: int = Field(256, gt=8, description="processes + threads per command (fork bombs stop here)")
    file_size_mb: int = Field(512, gt=0, description="largest file one command may write")
    disk_mb: int = Field(4096, ge=0, description="all a trial may write, on its own loop-mounted ext4 image "
                                                 "(sparse); 0: on the host's disk, uncapped")
    build_network: bool = Field(True, description="Dockerfile RUN / setup steps may reach package registries")
    build_memory_mb: int = Field(4096, gt=0, description="memory cap of one environment build step")
    seccomp: bool = Field(True, description="every command and build step under a system-call filter like "
                                            "Docker's default profile (no namespaces, mounts, keyrings, bpf, "
                                            "perf, modules; _sandbox/seccomp.py); false: none")
    snapshots: bool = Field(True, description="a copy of the trial's upper layer when each command starts "
                                              "(_sandbox/reattach.py), so a command running when the sandbox actor "
                                              "is killed is rolled back and run again; false: such a trial is lost")


@dataclass(frozen=True)
class TrialRoot:
    """What the verifier needs to stack its own view on a trial's final root (same host, shared disk)."""

    trial_id: str
    stack: RootStack
    upper: Layer
    workdir: str
    env: dict[str, str]

    def to_json(self) -> dict:
        return {"trial_id": self.trial_id, "stack": self.stack.to_json(), "upper": str(self.upper.path),
                "workdir": self.workdir, "env": self.env}

    @classmethod
    def from_json(cls, data: dict) -> TrialRoot:
        return cls(data["trial_id"], RootStack.from_json(data["stack"]), Layer(Path(data["upper"])),
                   data["workdir"], data["env"])


def locate_trial(base_dir: str | os.PathLike, trial_id: str) -> TrialRoot:
    """The root of an open trial of the local backend whose base dir is ``base_dir`` (any process, same host):
    how the verifier actor finds what the sandbox actor built. SandboxInfraError when there is none."""
    trials = Path(base_dir) / "trials"
    prefix = _SAFE.sub("_", trial_id)[:64] + "-"
    for directory in trials.glob(f"{glob.escape(prefix)}*"):
        try:
            data = json.loads((directory / TRIAL_FILE).read_text())
        except (OSError, ValueError):
            continue
        if data.get("trial_id") == trial_id:
            return TrialRoot.from_json(data)
    raise SandboxInfraError(f"no open sandbox of trial {trial_id} under {trials}; the verifier must run on the "
                            f"sandbox's host with the same [sandbox.local] base_dir, before SandboxClose")


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

    def _reap(self) -> None:
        """Unmount and delete closed trials off the caller's path (umount waits for RCU grace periods)."""
        while (item := self._teardown.get()) is not None:
            mounted, directory = item
            try:
                unmount_all(mounted)
                remove_tree(directory)
            finally:
                self._teardown.task_done()
        self._teardown.task_done()

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
        directory = self.trials_dir / f"{_SAFE.sub('_', trial_id)[:64]}-{secrets.token_hex(4)}"
        stack = RootStack(self.base_stack.skeleton, (image.layer, *self.base_stack.layers), self.base_stack.system_dirs)
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
        cannot be recovered is deleted and SandboxInfraError says why."""
        prefix = _SAFE.sub("_", trial_id)[:64] + "-"
        for directory in self.trials_dir.glob(f"{glob.escape(prefix)}*"):
            try:
                trial_root = TrialRoot.from_json(json.loads((directory / TRIAL_FILE).read_text()))
                owner = int((directory / "owner").read_text())
                owned_since = (directory / "owner").stat().st_mtime
            except (OSError, ValueError, KeyError):
                continue
            if trial_root.trial_id != trial_id or owner == os.getpid() or _alive(owner, owned_since):
                continue
            try:
                takeover = reattach.take_over(directory, trial_root.stack, trial_root.upper, directory / "root")
                (directory / "owner").write_text(str(os.getpid()))
            except (OSError, SandboxInfraError) as exc:
                remove_tree(directory)
                raise SandboxInfraError(f"the workspace of trial {trial_id} is lost: {exc}") from exc
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
            try:
                owner = int((directory / "owner").read_text())
                owned_since: float | None = (directory / "owner").stat().st_mtime
            except (OSError, ValueError):  # no owner yet (being opened), or already being torn down
                try:
                    if time.time() - directory.stat().st_mtime < 600:
                        continue
                except OSError:
                    continue
                owner = owned_since = None
            if owner is not None and _alive(owner, owned_since):
                continue
            remove_tree(directory)
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


def _alive(pid: int, since: float | None = None) -> bool:
    """Process ``pid`` is running (one we may not signal counts: it is not ours to sweep). A zombie is not: a
    SIGKILLed owner whose parent has not reaped it yet (or whose parent died too, left to an init that reaps
    late) holds nothing. With ``since`` (when the owner wrote its pid, Unix seconds) a process started after it
    is another one that got the pid again."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc to read: the signal says whether it exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if fields[0] in ("Z", "X"):
        return False
    if since is not None:
        started = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        if started > since + 2.0:  # the stat's start time has a clock tick's resolution; mtimes may be coarser
            return False
    return True


@functools.cache  # fixed while the machine runs: read once, not per trial root swept
def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


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
        if self.backend._reaper.is_alive():
            self.backend._teardown.put((self._mounted, self.directory))
        else:
            unmount_all(self._mounted)
            remove_tree(self.directory)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxInfraError(f"sandbox of trial {self.trial_id} is closed")

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
