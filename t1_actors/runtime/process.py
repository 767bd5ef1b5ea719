"""Process-level guards for actor processes started by a supervisor."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int) -> None:
    """Ask Linux to SIGTERM this process when its supervisor dies (even by SIGKILL): no orphans.

    The actor handles SIGTERM as a clean shutdown (its log writer commits). If the supervisor is
    already gone (we were reparented before the request took effect) exit at once.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != expected_parent:
        sys.stderr.write("t1-actor: the supervisor that started this actor is gone; exiting\n")
        sys.exit(1)
