"""The log on a full disk (part 2, 2.): a small tmpfs filled until the writer's append or commit is refused.

``full_disk`` guarantees that ``enospc_lost_committed`` counts every event committed before the refusal that
did not read back; a machine where the tmpfs cannot be mounted (not root) gets ``not_tested``, never a 0.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from storage import EventLog, LogError
from storage.errors import DiskFull
from tools.chaos._events import ROUTING, event_for
from tools.chaos._log_layouts import LAYOUTS


def _mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a small tmpfs at ``where``; the reason it could not be, or None."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "mounting a small file system needs root (this process is not)"
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                            capture_output=True, text=True)
    return None if result.returncode == 0 else f"mount -t tmpfs failed: {result.stderr.strip()}"


def full_disk(work_dir: Path, *, seed: int, rounds: int = 6) -> dict[str, Any]:
    """Fill a 4 MiB tmpfs with the log ``rounds`` times (different slack each time, so the disk runs out
    in rows, in chunk files or in a commit record)."""
    mount = work_dir / "small-fs"
    reason = _mount_tmpfs(mount, "4m")
    if reason is not None:
        return {"not_tested": reason}
    rng = random.Random(seed)
    try:
        lost, errors, stages, outcomes = 0, Counter(), Counter(), []
        committed_total = 0
        for r in range(rounds):
            layout = "packed" if r % 2 == 0 else "chunked"
            config = LAYOUTS[layout]
            location = mount / f"log-{r}"
            filler = mount / "filler"
            free = shutil.disk_usage(mount).free
            filler.write_bytes(b"\0" * max(0, free - rng.randint(64 << 10, 1 << 20)))
            log = EventLog.open(location, create=True, config=config)
            writer = log.writer("w", **ROUTING)
            acked, error = 0, None
            try:
                while True:
                    for _ in range(rng.randint(1, 3)):
                        writer.append(event_for(writer.next_seq))
                    writer.commit()
                    acked = writer.next_seq
            except LogError as exc:
                error = exc
            errors[type(error).__name__] += 1
            if isinstance(error, DiskFull):
                stages[error.stage] += 1
            try:
                writer.append(event_for(writer.next_seq))
                refused_after = False
            except LogError as exc:
                refused_after = "failed earlier" in str(exc)
            writer.abandon()
            read_back = EventLog.open(location, config=config)
            events = [(i, e) for i, e in read_back.events()]
            intact = len(events) >= acked and all(e == event_for(int(i.rsplit(":", 1)[1])) for i, e in events)
            lost += max(0, acked - len(events))
            filler.unlink()
            with read_back.writer("w", **ROUTING) as again:
                resumed = again.next_seq == len(events)
                again.append(event_for(again.next_seq))
            read_back.verify()
            committed_total += acked
            outcomes.append({"layout": layout, "committed_before": acked, "error": str(error)[:200],
                             "later_append_refused": refused_after, "read_back_intact": intact,
                             "resumed_after_space_freed": resumed})
            shutil.rmtree(location)
        return {"enospc_rounds": rounds, "enospc_committed_checked": committed_total, "enospc_lost_committed": lost,
                "enospc_errors": dict(errors), "enospc_stages": dict(stages), "enospc_outcomes": outcomes}
    finally:  # lazily if a reader of this process still holds a file there: detached now, freed on close
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)
