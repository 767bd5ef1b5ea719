"""CPU seconds of a process tree, from /proc: what a side of the bench spent, whatever the machine's load.

``tree_cpu(pid)`` sums user + system time of ``pid`` and every live descendant, with the time of the
children each has already reaped (a finished sandbox or verifier run counts once its parent reaps it), by
role: the actor a process is (``t1_actors.cli ROLE``), or ``other`` (the launcher, sandboxes, pytest).
"""

from __future__ import annotations

import os
from collections import defaultdict

_TICK = os.sysconf("SC_CLK_TCK")
ROLES = ("staleness", "sampler", "sandbox", "verifier", "critic", "learner")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, own + reaped children's CPU seconds), or None for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return ppid, (utime + stime + cutime + cstime) / _TICK


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "other"
    for i, arg in enumerate(argv[:-1]):
        if arg.endswith(b"t1_actors.cli") and argv[i + 1].decode() in ROLES:
            return argv[i + 1].decode()
    return "other"


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds of ``root``'s tree by role (the module's doc); ``total`` their sum."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = _stat(int(name))
            if found is not None:
                parents[int(name)], cpu[int(name)] = found
    children = defaultdict(list)
    for pid, ppid in parents.items():
        children[ppid].append(pid)
    by_role: dict[str, float] = defaultdict(float)

    def walk(pid: int, role: str) -> None:
        own = _role(pid)
        role = own if own != "other" else role  # a sandbox or pytest counts for the actor that runs it
        by_role[role] += cpu.get(pid, 0.0)
        for child in children.get(pid, ()):
            walk(child, role)

    if root in cpu:
        walk(root, "other")
    by_role["total"] = sum(v for k, v in by_role.items())
    return dict(by_role)


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds between two snapshots, by role (never negative: a process gone takes its time along)."""
    return {k: round(max(0.0, after.get(k, 0.0) - before.get(k, 0.0)), 2) for k in after}
