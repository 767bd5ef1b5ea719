"""bench/sandbox_exec.py runs end to end (tiny sizes) and reports what docs/chaos.md quotes: a tool call with and
without the seccomp filter, and a trial's open + close."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_sandbox_bench_reports_the_filters_and_a_trials_own_cost():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "sandbox_exec.py"), "--calls", "3", "--opens", "2"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["calls"] == 3 and result["opens"] == 2
    for key in ("seccomp_s_per_call", "no_seccomp_s_per_call", "open_close_s"):
        assert 0 < result[key]["median"] < 60 and 0 < result[key]["mean"] < 60, key
    assert result["seccomp_ratio"] > 0
