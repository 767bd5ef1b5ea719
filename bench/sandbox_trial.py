"""What a whole trial costs in the local sandbox under each hardening option, side by side.

One trial = open a sandbox for a task, run its oracle's commands one by one, close it: what the campaign's
oracle pool does 6,400 times before SFT and what every trial pays besides its model turns. Variants, each its
own ``LocalSandboxBackend``: ``defaults`` (seccomp filter, a snapshot of the upper layer at each command start,
the trial's own loop-mounted ext4 disk image), each of the three switched off alone, and ``bare`` (all three
off). Per task every variant runs once, the order rotating task by task, so all see the same load. The last
line is one JSON object: median seconds per trial per variant, and each variant's median over ``bare``'s.

Usage: python bench/sandbox_trial.py [--tasks 60]. Needs root (cgroups, mounts, loop devices) and bubblewrap.
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
from t1_actors.tasks.model import oracle_trajectory
from t1_actors.tasks.synthetic import generate

VARIANTS = {
    "defaults": {},
    "no_seccomp": {"seccomp": False},
    "no_snapshots": {"snapshots": False},
    "no_disk_image": {"disk_mb": 0},
    "bare": {"seccomp": False, "snapshots": False, "disk_mb": 0},
}


def trial_seconds(backend: LocalSandboxBackend, task, trial_id: str) -> float:
    start = time.perf_counter()
    with backend.open(task, trial_id) as sandbox:
        for command in oracle_trajectory(task):
            sandbox.exec(command)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=60, help="synthetic train tasks (every family in turn)")
    args = parser.parse_args()
    tasks = generate("train", args.tasks, seed=0)
    names = list(VARIANTS)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="t1-bench-trial-") as base:
        backends = {name: LocalSandboxBackend(LocalSandboxConfig(base_dir=f"{base}/{name}", **change))
                    for name, change in VARIANTS.items()}
        try:
            for name, backend in backends.items():  # warm: image build, filter compile, page-ins
                trial_seconds(backend, tasks[0], f"warm-{name}")
            for i, task in enumerate(tasks):
                for name in names[i % len(names):] + names[: i % len(names)]:
                    seconds[name].append(trial_seconds(backends[name], task, f"{name}-{i}"))
        finally:
            for backend in backends.values():
                backend.close()
    median = {name: statistics.median(values) for name, values in seconds.items()}
    commands = statistics.mean(len(oracle_trajectory(t)) for t in tasks)
    print(json.dumps({"bench": "sandbox_trial", "tasks": len(tasks), "commands_per_trial": round(commands, 2),
                      "median_trial_s": {k: round(v, 4) for k, v in median.items()},
                      "ratio_vs_bare": {k: round(v / median["bare"], 3) for k, v in median.items()},
                      "load_1min": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
