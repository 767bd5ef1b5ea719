"""Run one command with a wall-clock deadline and capped output, draining both pipes as it goes.

Output past ``max_output_bytes`` per stream is read and dropped (the command keeps running, as under
Docker), and the stream is flagged truncated. At the deadline ``kill()`` ends the whole tree.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

_CHUNK = 1 << 16


@dataclass(frozen=True)
class Captured:
    exit_code: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    duration_s: float
    timed_out: bool


class _Stream:
    def __init__(self, limit: int):
        self.limit = limit
        self.parts: list[bytes] = []
        self.kept = 0
        self.truncated = False

    def feed(self, data: bytes) -> None:
        room = self.limit - self.kept
        if len(data) > room:
            self.truncated = True
            data = data[:max(room, 0)]
        if data:
            self.parts.append(data)
            self.kept += len(data)

    def value(self) -> bytes:
        return b"".join(self.parts)


def run_captured(argv: list[str], *, env: dict[str, str], timeout_s: float, max_output_bytes: int,
                 kill: Callable[[], None], stdin: bytes | None = None, cwd: str | None = None,
                 pass_fds: tuple[int, ...] = ()) -> Captured:
    """Run ``argv``; ``kill`` must end it and every descendant (a cgroup kill). Exit code 128+N for signal N.
    ``pass_fds``: descriptors the command inherits, at the same numbers."""
    start = time.monotonic()
    deadline = start + timeout_s
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            pass_fds=pass_fds)
    streams = {proc.stdout.fileno(): _Stream(max_output_bytes), proc.stderr.fileno(): _Stream(max_output_bytes)}
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        pending = memoryview(stdin) if stdin else None
        if pending is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                _end(proc, kill)
                deadline = float("inf")  # after the kill, drain what is left until the pipes close
                left = 5.0
            for key, _ in selector.select(timeout=min(left, 1.0)):
                if pending is not None and key.fd == proc.stdin.fileno():
                    try:
                        pending = pending[os.write(key.fd, pending[:_CHUNK]):]
                    except BrokenPipeError:
                        pending = memoryview(b"")
                    if not pending:
                        selector.unregister(key.fd)
                        proc.stdin.close()
                        pending = None
                    continue
                try:
                    data = os.read(key.fd, _CHUNK)
                except BlockingIOError:
                    continue
                if data:
                    streams[key.fd].feed(data)
                else:
                    selector.unregister(key.fd)
    try:
        code = proc.wait(timeout=max(0.0, deadline - time.monotonic()) if deadline != float("inf") else 5.0)
    except subprocess.TimeoutExpired:
        timed_out = True
        _end(proc, kill)
        code = proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    out_stream, err_stream = list(streams.values())
    return Captured(128 - code if code < 0 else code, out_stream.value(), err_stream.value(),
                    out_stream.truncated, err_stream.truncated, time.monotonic() - start, timed_out)


def _end(proc: subprocess.Popen, kill: Callable[[], None]) -> None:
    kill()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
