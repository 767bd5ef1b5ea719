"""bench/control_plane.py runs end to end (tiny sizes) and reports every figure README quotes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_control_plane_bench_reports_its_figures():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "control_plane.py"), "--calls", "40", "--blocks", "2",
                          "--bulk-mb", "0.25", "--bulk-count", "4", "--bulk-rounds", "1"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    for key in ("rtt_p50_ratio", "rtt_p99_ms", "bulk_ratio", "rtt_bare_ratio", "rtt_floor_ratio", "rtt_work_us",
                "bulk_MBps", "raw_bulk_MBps", "rtt_over_floor", "vs_ray_rtt_p50", "vs_ray_bulk", "ray_bulk_MBps"):
        assert result[key] > 0, key
    assert result["mac_GBps"]["aes_gmac"] > 0 and result["mac_GBps"]["hmac_sha256"] > 0
    assert result["calls"] == 40 and result["bulk_count"] == 4
    assert isinstance(result["targets_met"], bool)
