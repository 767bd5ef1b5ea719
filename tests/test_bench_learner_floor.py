"""bench/learner_floor.py runs end to end (tiny sizes) and reports the figures issue 35 asks for: the learner's PPO
step and the critic's update against the matmul floor of their own GEMM shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_learner_floor_bench_reports_both_ratios():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "learner_floor.py"), "--shapes", "tiny",
                          "--trajectories", "2", "--length", "64", "--repeats", "1"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["trajectories"] == 2 and result["length"] == 64 and result["tokens"] == 2 * 63
    for key in ("learner_floor_ratio", "critic_floor_ratio"):
        assert 0 < result[key] < 10, key  # a floor is a share of its step (noise may lift a tiny one past 1)
    for key in ("learner_step_s", "learner_floor_s", "critic_update_s", "critic_floor_s", "matmul_gflops_per_s"):
        assert result[key] > 0, key
