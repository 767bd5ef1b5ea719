"""A whole campaign killed at once, as a reboot kills it: every process of ``t1-actor launch``'s tree.

The actors run in sessions of their own (the supervisor starts each with ``start_new_session``), so killing the
launcher's process group alone would leave them to notice their supervisor gone and stop cleanly: not a crash.
``kill_campaign`` first stops the whole tree (SIGSTOP, again until no new process appears: nothing runs on, forks
or logs while the rest is being found), then SIGKILLs every process of it; what any of them had not committed
to the log is lost, as in a power cut.
"""

from __future__ import annotations

import os
import signal
import time

from t1_actors.backends._sandbox.owner import alive
from tools.chaos._leftovers import _tree


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_campaign(launcher_pid: int, *, wait_s: float = 30.0) -> dict[int, str]:
    """SIGKILL ``launcher_pid`` and every process below it, all stopped first; returns them (pid -> start time)
    once none is alive (or ``wait_s`` passed). The launcher's process group too, when it leads one (started with
    ``start_new_session``)."""
    stopped: dict[int, str] = {}
    while True:
        tree = _tree(launcher_pid)
        new = {pid: start for pid, start in tree.items() if pid not in stopped}
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        stopped.update(new)
    try:
        if os.getpgid(launcher_pid) == launcher_pid:  # only a group it leads (never the caller's own)
            os.killpg(launcher_pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while any(alive(pid) for pid in stopped if pid != launcher_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return stopped
