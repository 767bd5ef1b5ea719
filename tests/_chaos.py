"""`t1-actor chaos ... --json` as the tests run it: its exit status and its report (the last stdout line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_chaos_cli(*args: str, timeout: float) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "t1_actors.cli", "chaos", *args, "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-4000:]
    return done.returncode, json.loads(lines[-1])
