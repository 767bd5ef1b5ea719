"""Process-level guard for actor processes started by a supervisor: no orphans.

PR_SET_PDEATHSIG is no use here: it fires when the parent *thread* that forked us exits, and trio
starts processes from worker threads that come and go. Instead the actor watches the supervisor's
process with a pidfd (readable once it exits) and shuts itself down cleanly when it is gone.
"""

from __future__ import annotations

import os

import trio


async def wait_for_exit(pid: int) -> None:
    """Return once process ``pid`` has exited (at once if it does not exist)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd (old kernel): poll our parent pid instead
        while os.getppid() == pid:
            await trio.sleep(0.5)
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
