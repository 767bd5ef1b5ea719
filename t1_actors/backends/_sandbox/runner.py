"""Run a command inside a mounted sandbox root: bubblewrap for the namespaces, a fresh cgroup for the
memory and process caps and the kill switch, rlimits for CPU time, file size and core dumps, and (unless
``seccomp=False``) the system-call filter of ``seccomp.py``."""

from __future__ import annotations

import itertools
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from t1_actors.backends._sandbox import cgroups, linux, seccomp
from t1_actors.backends._sandbox.interface import ExecResult, SandboxInfraError
from t1_actors.backends._sandbox.process import run_captured

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", "DEBIAN_FRONTEND": "noninteractive"}
_counter = itertools.count()


@dataclass(frozen=True)
class ExecLimits:
    """Caps of one command. CPU seconds (RLIMIT_CPU) = the wall-clock timeout times ``cpus`` (at least 1), + 1."""

    timeout_s: float
    memory_bytes: int
    pids: int = 256
    cpus: float = 1.0
    file_size_bytes: int = 512 << 20
    max_output_bytes: int = 64 << 10

    @property
    def cpu_seconds(self) -> int:
        return int(math.ceil(self.timeout_s * max(self.cpus, 1.0))) + 1


def bwrap_path() -> str:
    found = shutil.which("bwrap")
    if not found:
        raise SandboxInfraError("bubblewrap (bwrap) is not installed; apt-get install bubblewrap")
    return found


def run_in_root(root: Path, argv: list[str], *, env: dict[str, str], workdir: str, limits: ExecLimits,
                network: bool, name: str, stdin: bytes | None = None, seccomp_filter: bool = True) -> ExecResult:
    """Run ``argv`` with ``root`` as /, in fresh pid/ipc/uts (and net unless ``network``) namespaces, under the
    seccomp filter unless ``seccomp_filter`` is False."""
    caps = [arg for cap in linux.DOCKER_DEFAULT_CAPS for arg in ("--cap-add", cap)]
    filter_fd = seccomp.filter_fd() if seccomp_filter else -1
    try:
        return _run(root, argv, env, workdir, limits, network, name, stdin, caps, filter_fd)
    finally:
        if filter_fd >= 0:
            os.close(filter_fd)


def _run(root: Path, argv: list[str], env: dict[str, str], workdir: str, limits: ExecLimits, network: bool,
         name: str, stdin: bytes | None, caps: list[str], filter_fd: int) -> ExecResult:
    sandbox = [bwrap_path(), "--bind", str(root), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm",
               "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
               *([] if network else ["--unshare-net"]), "--die-with-parent",  # no tty is ever passed: no --new-session
               "--cap-drop", "ALL", *caps, *(["--seccomp", str(filter_fd)] if filter_fd >= 0 else []),
               "--chdir", workdir, "--", *argv]
    cg_name = f"{name}-{os.getpid()}-{next(_counter)}"
    with cgroups.CommandCgroup(cg_name, cgroups.CgroupLimits(limits.memory_bytes, limits.pids)) as cg:
        launcher = (f"{cg.enter_snippet()}ulimit -t {limits.cpu_seconds} && ulimit -c 0 && "  # dash: one per call
                    f"ulimit -f {max(1, limits.file_size_bytes // 512)} && exec \"$@\"")  # -f: 512-byte blocks
        try:
            done = run_captured(["/bin/sh", "-c", launcher, "t1-launch", *sandbox], env=env, stdin=stdin,
                                timeout_s=limits.timeout_s, max_output_bytes=limits.max_output_bytes, kill=cg.kill,
                                pass_fds=(filter_fd,) if filter_fd >= 0 else ())
        except OSError as exc:
            raise SandboxInfraError(f"could not start the sandbox process: {exc}") from exc
        hit = cg.hit()
    stderr = done.stderr.decode("utf-8", "replace")
    if done.exit_code == 1 and stderr.startswith("bwrap:") and not done.timed_out:
        raise SandboxInfraError(f"bubblewrap failed: {stderr.strip()[:500]}")
    killed_by = "timeout" if done.timed_out else hit or _signal_limit(done.exit_code)
    return ExecResult(done.exit_code, done.stdout.decode("utf-8", "replace"), stderr, done.duration_s,
                      done.stdout_truncated, done.stderr_truncated, done.timed_out, killed_by)


def _signal_limit(exit_code: int) -> str | None:
    return {128 + 24: "cpu", 128 + 25: "file_size", 128 + 9: "killed"}.get(exit_code)
