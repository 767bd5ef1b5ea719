"""keep_freed_buffers: a stream of multi-MiB buffers reuses freed memory instead of faulting in fresh pages."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Eight 4 MiB buffers alive at once (messages in flight), freed, again: page faults per buffer once warm.
_PROGRAM = """
import resource, sys
sys.path.insert(0, {root!r})
from t1_actors.runtime.memory import keep_freed_buffers
if {keep}:
    assert keep_freed_buffers()
def rounds(n):
    for _ in range(n):
        buffers = [bytearray(4 << 20) for _ in range(8)]
        for buffer in buffers:
            buffer[::4096] = bytes(len(buffer) // 4096)  # touch every page
        del buffers
rounds(2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(10)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 80)
"""


def faults_per_buffer(keep: bool) -> float:
    out = subprocess.run([sys.executable, "-c", _PROGRAM.format(root=str(ROOT), keep=keep)],
                         capture_output=True, text=True, check=True).stdout
    return float(out)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
def test_freed_buffers_are_reused_without_page_faults():
    default = faults_per_buffer(keep=False)
    if default < 50:  # e.g. transparent huge pages always on: a few faults per buffer either way
        pytest.skip(f"{default:.1f} page faults per 4 MiB buffer by default here: nothing for mallopt to remove")
    assert faults_per_buffer(keep=True) < 5
