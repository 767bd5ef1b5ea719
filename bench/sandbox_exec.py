"""The sandbox's own cost per trial: a tool call with and without the seccomp filter, and a trial's open + close.

Two backends (``[sandbox.local] seccomp = true`` and ``= false``), one trial each of the same task; ``--calls``
``true`` commands, alternating call by call so both see the same load. Then ``--opens`` trials opened and
closed one after the other on the default backend (seccomp on, disk budget on): what a trial pays before its
first command and after its last (its root with the synthesized /etc, its disk, its cgroup), an upper bound of
the new root's share. The last line is one JSON object: the median and mean seconds per call each way,
``seccomp_ratio`` (median with / median without) and ``open_close_s`` (median and mean per trial).

Usage: python bench/sandbox_exec.py [--calls 50] [--opens 10]. Needs root (cgroups, mounts) and bubblewrap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig
from t1_actors.tasks.model import Task
from t1_actors.tasks.model import Tests as TaskTests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--opens", type=int, default=10)
    args = parser.parse_args()
    tests = TaskTests(files={"test_x.py": "def test_x(): pass\n"})
    task = Task(id="bench-exec", family="bench", instruction="-", tests=tests)
    with tempfile.TemporaryDirectory(prefix="t1-bench-exec-") as base:
        backends = {on: LocalSandboxBackend(LocalSandboxConfig(base_dir=f"{base}/{on}", seccomp=on, disk_mb=0))
                    for on in (True, False)}
        try:
            sandboxes = {on: backend.open(task, f"bench-{on}") for on, backend in backends.items()}
            for sandbox in sandboxes.values():  # warm: the first call pays the filter's compile and page-ins
                assert sandbox.exec("true").exit_code == 0
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.calls):
                for on, sandbox in sandboxes.items():
                    start = time.perf_counter()
                    result = sandbox.exec("true")
                    times[on].append(time.perf_counter() - start)
                    assert result.exit_code == 0, result
            for sandbox in sandboxes.values():
                sandbox.close()
        finally:
            for backend in backends.values():
                backend.close()
        opens = []
        backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=f"{base}/opens"))
        try:
            for i in range(args.opens):
                start = time.perf_counter()
                backend.open(task, f"bench-open-{i}").close()
                opens.append(time.perf_counter() - start)
        finally:
            backend.close()
    median = {on: statistics.median(t) for on, t in times.items()}
    print(json.dumps({
        "calls": args.calls, "command": "true",
        "seccomp_s_per_call": {"median": round(median[True], 5), "mean": round(statistics.fmean(times[True]), 5)},
        "no_seccomp_s_per_call": {"median": round(median[False], 5), "mean": round(statistics.fmean(times[False]), 5)},
        "seccomp_ratio": round(median[True] / median[False], 3),
        "opens": args.opens,
        "open_close_s": {"median": round(statistics.median(opens), 4), "mean": round(statistics.fmean(opens), 4)},
        "loadavg_1m": os.getloadavg()[0],
    }))


if __name__ == "__main__":
    main()
