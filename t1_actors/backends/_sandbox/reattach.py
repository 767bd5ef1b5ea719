"""A trial's workspace kept across its sandbox actor's own restart.

A killed sandbox actor leaves its trials' roots mounted (the mounts live in the host's mount namespace, not in the
process), so the restarted actor can take them over by trial id instead of sweeping them. What the files of a
trial's directory say:

    mounts.json   the root's mountpoints (the trial's disk first), for the process that takes it over
    snapshot/     a copy of the trial's upper layer (all it changed) taken when its last command started
    running.json  the command running now ({"turn", "command"}); removed once its output is logged

A command that was running when the actor was killed may have changed the workspace with nobody knowing its
output: the workspace is rolled back to the snapshot taken when that command started (its overlay unmounted,
the upper layer replaced, the overlay mounted again), so the command can be run again as if for the first time.
Without a snapshot (``[sandbox.local] snapshots = false``) such a workspace cannot be recovered: it is lost.

The snapshot is ``cp -a --reflink=auto`` of the upper layer, into the trial's directory on the host's disk (not
the trial's own, whose budget it would halve): a reflink where the host's file system shares blocks (XFS, btrfs),
else a full copy of what the trial wrote so far, measured per command in ``snapshot_s``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from t1_actors.backends._sandbox.interface import SandboxInfraError
from t1_actors.backends._sandbox.layers import Layer, RootStack, mounts_under, unmount_all

MOUNTS = "mounts.json"
SNAPSHOT = "snapshot"
RUNNING = "running.json"


def record_mounts(directory: Path, mounted: list[str]) -> None:
    (directory / MOUNTS).write_text(json.dumps(mounted))


def take_snapshot(directory: Path, upper: Layer) -> float:
    """Copy the upper layer to ``directory/snapshot``, replacing the last one only once the copy is whole;
    returns the seconds it took. SandboxInfraError (with cp's words) when it cannot."""
    started = time.perf_counter()
    partial, old = directory / (SNAPSHOT + ".partial"), directory / (SNAPSHOT + ".old")
    shutil.rmtree(partial, ignore_errors=True)
    done = subprocess.run(["cp", "-a", "--reflink=auto", str(upper.path), str(partial)], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise SandboxInfraError(f"cannot snapshot the workspace before the command: {done.stderr.strip()[:300]}")
    snapshot = directory / SNAPSHOT
    if snapshot.exists():
        os.rename(snapshot, old)
    os.rename(partial, snapshot)
    shutil.rmtree(old, ignore_errors=True)
    return time.perf_counter() - started


def mark_running(directory: Path, turn: int, command: str) -> None:
    (directory / RUNNING).write_text(json.dumps({"turn": turn, "command": command}))


def mark_done(directory: Path) -> None:
    (directory / RUNNING).unlink(missing_ok=True)


@dataclass(frozen=True)
class Takeover:
    """A trial root taken over from a killed sandbox actor: its mountpoints, and what was done to its workspace
    (``"reattached"`` as it was, or ``"rolled_back"`` to before the command that was running, named in
    ``command``)."""

    mounted: list[str]
    outcome: str
    command: str = ""
    turn: int | None = None


def take_over(directory: Path, stack: RootStack, upper: Layer, merged: Path) -> Takeover:
    """Take over the trial root in ``directory`` whose owner is dead: still mounted as recorded, and rolled back
    to its snapshot if a command was running. SandboxInfraError (the workspace is lost) when it cannot be."""
    try:
        mounted = json.loads((directory / MOUNTS).read_text())
    except (OSError, ValueError) as exc:
        raise SandboxInfraError(f"its mountpoints were not recorded ({exc})") from exc
    present = set(mounts_under(directory))
    if missing := [m for m in mounted if m not in present]:
        raise SandboxInfraError(f"{len(missing)} of its {len(mounted)} mounts are gone (e.g. {missing[0]})")
    try:
        running = json.loads((directory / RUNNING).read_text())
    except FileNotFoundError:
        return Takeover(mounted, "reattached")
    except (OSError, ValueError) as exc:
        raise SandboxInfraError(f"its running-command record is unreadable ({exc})") from exc
    snapshot = directory / SNAPSHOT
    if not snapshot.is_dir():
        raise SandboxInfraError(f"command {running['command']!r} was running and no snapshot was taken before it")
    disk = [m for m in mounted if not m.startswith(str(merged))]  # the trial's own disk stays mounted
    unmount_all([m for m in mounted if m not in disk])
    shutil.rmtree(upper.path)
    done = subprocess.run(["cp", "-a", "--reflink=auto", str(snapshot), str(upper.path)], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SandboxInfraError(f"cannot restore the snapshot: {done.stderr.strip()[:300]}")
    work = upper.path.parent / "work"
    shutil.rmtree(work, ignore_errors=True)  # the overlays' scratch: made anew on mount
    remounted = disk + stack.mount(merged, upper, work)
    record_mounts(directory, remounted)
    mark_done(directory)
    return Takeover(remounted, "rolled_back", running["command"], running["turn"])
