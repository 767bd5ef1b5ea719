"""One cgroup per command: memory and process caps (cgroup v1 memory/pids), and a kill switch for the
whole tree (``cgroup.kill`` of the unified hierarchy; SIGKILL of every member where that is missing).

The command's launcher shell writes its own pid into ``procs_files`` before it execs anything, so every
descendant is born inside; nothing races a fork bomb.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from t1_actors.backends._sandbox.interface import SandboxInfraError

ROOT = Path("/sys/fs/cgroup")
_PREFIX = "t1-sandbox"


@dataclass(frozen=True)
class CgroupLimits:
    memory_bytes: int
    pids: int


def available() -> str | None:
    """None when per-command cgroups work here; otherwise why not and the fix."""
    for controller in ("memory", "pids"):
        path = ROOT / controller
        if not (path / "cgroup.procs").exists():
            return f"cgroup v1 controller {controller} is not mounted at {path}"
        if not os.access(path, os.W_OK):
            return f"{path} is not writable; run the sandbox as root"
    return None


class CommandCgroup:
    """The cgroups of one command. Use as a context manager; leaving removes them (killing leftovers)."""

    def __init__(self, name: str, limits: CgroupLimits):
        self.name = name
        self.limits = limits
        self.dirs: dict[str, Path] = {}
        # No cpu controller: a CFS quota made every command ~15 ms slower to start here; CPU is capped by
        # RLIMIT_CPU (the launcher's ulimit -t) and the wall-clock timeout instead.
        for controller in ("memory", "pids", "unified"):
            base = ROOT / controller
            if not base.is_dir():
                continue
            path = base / _PREFIX / name
            try:
                path.mkdir(parents=True, exist_ok=False)
            except FileExistsError:
                _kill_and_remove(path)
                path.mkdir()
            except OSError as exc:
                self.remove()
                raise SandboxInfraError(f"cannot create cgroup {path}: {exc}") from exc
            self.dirs[controller] = path
        try:
            self._write("memory", "memory.limit_in_bytes", limits.memory_bytes)
            self._write("memory", "memory.swappiness", 0, optional=True)
            self._write("pids", "pids.max", limits.pids)
        except OSError as exc:
            self.remove()
            raise SandboxInfraError(f"cannot set limits on cgroup {name}: {exc}") from exc

    def _write(self, controller: str, key: str, value: int, optional: bool = False) -> None:
        try:
            (self.dirs[controller] / key).write_text(str(value))
        except OSError:
            if not optional:
                raise

    @property
    def procs_files(self) -> list[str]:
        return [str(path / "cgroup.procs") for path in self.dirs.values()]

    def enter_snippet(self) -> str:
        """Shell that moves the running shell (``$$``) into every cgroup of this command."""
        return "".join(f"echo $$ > {f} && " for f in self.procs_files)

    def enter(self, pid: int | None = None) -> None:
        """Move ``pid`` (default: this process) into every cgroup of this command."""
        for file in self.procs_files:
            Path(file).write_text(str(pid or os.getpid()))

    def kill(self) -> None:
        for path in self.dirs.values():
            _kill_members(path)

    def hit(self) -> str | None:
        """Which cap a command ran into: 'memory' (the OOM killer fired) or 'pids' (forks refused)."""
        if "memory" in self.dirs and _read_int(self.dirs["memory"] / "memory.oom_control", "oom_kill") > 0:
            return "memory"
        if "pids" in self.dirs and _read_int(self.dirs["pids"] / "pids.events", "max") > 0:
            return "pids"
        return None

    def remove(self) -> None:
        for path in self.dirs.values():
            _kill_and_remove(path)
        self.dirs = {}

    def __enter__(self) -> CommandCgroup:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def _read_int(file: Path, key: str) -> int:
    try:
        for line in file.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except OSError:
        pass
    return 0


def _kill_members(path: Path) -> None:
    kill_file = path / "cgroup.kill"
    if kill_file.exists():
        try:
            kill_file.write_text("1")
            return
        except OSError:
            pass
    try:
        pids = (path / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _kill_and_remove(path: Path) -> None:
    for attempt in range(200):  # members take a moment to die after SIGKILL
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            _kill_members(path)
            time.sleep(0.005 if attempt < 20 else 0.05)
    raise SandboxInfraError(f"cgroup {path} still has live processes after SIGKILL; remove it by hand")


def kill_all(prefix: str) -> int:
    """SIGKILL every process of every command cgroup whose name starts with ``prefix``. Returns how many cgroups."""
    hit = 0
    for controller in ("unified", "pids", "memory"):
        base = ROOT / controller / _PREFIX
        if not base.is_dir():
            continue
        for path in base.iterdir():
            if path.name.startswith(prefix):
                _kill_members(path)
                hit += 1
        if hit:
            break
    return hit


def sweep_stale() -> int:
    """Remove command cgroups whose creating process is gone (a crashed run); their members are killed."""
    removed = 0
    for controller in ("memory", "pids", "unified"):
        base = ROOT / controller / _PREFIX
        if not base.is_dir():
            continue
        for path in base.iterdir():
            parts = path.name.rsplit("-", 2)
            if not path.is_dir() or len(parts) != 3 or not parts[1].isdigit():
                continue
            try:
                os.kill(int(parts[1]), 0)
                continue  # its creator still runs
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            try:
                _kill_and_remove(path)
                removed += 1
            except SandboxInfraError:
                pass
    return removed
