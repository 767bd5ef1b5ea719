"""What a run must not leave behind, found by name: a process of its tree, a trial root, a mount, a cgroup.

Matched against the run's own trial ids and directories (other runs sharing a sandbox directory are not
this run's leftovers); a pid counts as the same process only with the same start time.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from t1_actors.backends._sandbox.owner import alive
from t1_actors.backends._sandbox.trial_root import trial_dir_prefix

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _tree(root: int) -> dict[int, str]:
    """``root`` and its descendants now: pid -> start time (a pid is only the same process with both)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    children: dict[int, list[int]] = {}
    for pid, ppid in zip(map(int, out[0::2]), map(int, out[1::2])):
        children.setdefault(ppid, []).append(pid)
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        start = _start_time(pid)
        if start is not None:
            found[pid] = start
        frontier.extend(children.get(pid, []))
    return found


@dataclass
class Orphans:
    processes_tracked: int = 0  # every process seen in the campaign's tree while it ran
    trials_checked: int = 0  # trial ids whose root, mounts and cgroups were looked for
    mounts_scanned: int = 0
    cgroup_hierarchies_scanned: int = 0
    # seen while the campaign ran, by the same matching: the checks look where the run's things are
    trial_roots_seen: int = 0
    mounts_seen: int = 0
    cgroups_seen: int = 0
    left: list[str] = field(default_factory=list)


def leftovers(trial_ids: list[str], seen_pids: dict[int, str], run_dir: Path, sandbox_dir: Path,
              found: Orphans | None = None) -> dict[str, list[str]]:
    """The run's trial roots, mounts and cgroups present now: a trial root under the sandbox's ``trials/``,
    a mount of a trial root or inside the run directory, a command cgroup of a trial
    (``t1-sandbox/<trial dir>-<pid>-<n>``) or of one of the run's verify servers (``verify-<pid>-<n>``)."""
    prefixes = tuple(trial_dir_prefix(t) for t in trial_ids)
    verify = tuple(f"verify-{pid}-" for pid in seen_pids)
    trials = sandbox_dir / "trials"
    out: dict[str, list[str]] = {"trial roots": [], "mounts": [], "cgroups": []}
    if trials.is_dir() and prefixes:
        out["trial roots"] = [str(d) for d in trials.iterdir() if d.name.startswith(prefixes)]
    mounts = Path("/proc/mounts").read_text().splitlines()
    for line in mounts:
        point = line.split()[1] if len(line.split()) > 1 else ""
        inside = Path(point).relative_to(trials).parts if Path(point).is_relative_to(trials) else ()
        if Path(point).is_relative_to(run_dir) or (inside and prefixes and inside[0].startswith(prefixes)):
            out["mounts"].append(point)
    hierarchies = [_CGROUP_ROOT / c / "t1-sandbox" for c in ("memory", "pids", "unified")]
    hierarchies = [h for h in hierarchies if h.is_dir()]
    for base in hierarchies:
        out["cgroups"] += [str(g) for g in base.iterdir() if g.is_dir() and (prefixes or verify)
                           and g.name.startswith(prefixes + verify)]
    if found is not None:
        found.mounts_scanned, found.cgroup_hierarchies_scanned = len(mounts), len(hierarchies)
    return out


def find_orphans(seen: dict[int, str], trial_ids: list[str], run_dir: Path, sandbox_dir: Path,
                 found: Orphans | None = None) -> Orphans:
    """What the run left behind: a process of its tree still alive (same pid and start time), any other
    t1_actors process naming the run directory (not this command nor its callers), and ``leftovers``."""
    found = found or Orphans()
    found.processes_tracked, found.trials_checked = len(seen), len(trial_ids)
    mine = _ancestors(os.getpid())
    for pid, start in seen.items():
        if pid not in mine and _start_time(pid) == start and alive(pid):
            found.left.append(f"process {pid}: {_cmdline(pid)}")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in mine and int(entry.name) not in seen:
            line = _cmdline(int(entry.name))
            if str(run_dir) in line and "t1_actors" in line and alive(int(entry.name)):
                found.left.append(f"process {entry.name}: {line}")
    for what, items in leftovers(trial_ids, seen, run_dir, sandbox_dir, found).items():
        found.left += [f"{what[:-1]} {item}" for item in items]
    return found


def _ancestors(pid: int) -> set[int]:
    """``pid`` and the processes above it (this command, and a wrapper such as flock or timeout)."""
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
