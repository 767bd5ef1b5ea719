"""Who owns a trial root: the pid written in it, and whether that process still runs (``local_sandbox``'s adopt
and sweep). A zombie owns nothing, nor does a process that got the pid again after the owner wrote it."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def trial_owner(directory: Path) -> tuple[int, float] | None:
    """The pid that owns the trial root in ``directory`` and when it wrote it (Unix seconds); None without one."""
    try:
        return int((directory / "owner").read_text()), (directory / "owner").stat().st_mtime
    except (OSError, ValueError):
        return None


def alive(pid: int, since: float | None = None) -> bool:
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
        started = boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        if started > since + 2.0:  # the stat's start time has a clock tick's resolution; mtimes may be coarser
            return False
    return True


@functools.cache  # fixed while the machine runs: read once, not per trial root swept
def boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0
