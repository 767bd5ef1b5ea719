"""Learner memory is bounded by the micro-batch budget, not by the trajectory: peak RSS of a learner step in a
fresh process at 4x the tokens grows by no more than the earlier segments' K/V and their gradients plus a slack.

Each size runs in its own process (bench/learner_memory.py's child), its peak RSS reset just before the step
(so that a transient before it does not count) and glibc's mmap threshold fixed so that RSS measures live
memory rather than heap holes. The model is small but wide in
vocabulary and experts, so one pass over 4x the tokens would need far more than the slack (checked too).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # three child processes, ~1 min on an idle 2-core machine

BENCH = Path(__file__).resolve().parent.parent / "bench" / "learner_memory.py"
MODEL = {"vocab_size": 2048, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
         "num_experts": 4, "top_k": 2, "moe_intermediate_size": 256}
BUDGET = 1024
SLACK = 24 * 2**20  # allocator and interpreter noise between two processes (measured spread: a few MB)


def _bench():
    spec = importlib.util.spec_from_file_location("learner_memory", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs():
    bench = _bench()
    sizes = (("one", BUDGET, BUDGET), ("four", 4 * BUDGET, BUDGET), ("four_one_pass", 4 * BUDGET, None))
    return {name: bench.measure("learner", tokens, budget, model=MODEL) for name, tokens, budget in sizes}


def _growth(run: dict) -> int:
    return run["peak_rss_bytes"] - run["rss_before_step_bytes"]


def test_peak_memory_at_4x_the_tokens_grows_only_by_the_earlier_segments_kv(runs):
    one, four = runs["one"], runs["four"]
    assert one["segments"] == 1 and four["segments"] == 4
    # layers x 2 x 3072 earlier positions x kv_dim 32 x 4 B, and as much again for their gradients
    assert four["kv_allowed_bytes"] == 2 * (2 * 2 * 3072 * 32 * 4)
    assert _growth(four) - _growth(one) <= four["kv_allowed_bytes"] + SLACK, (runs, "MB", _growth(four) >> 20)


def test_one_pass_over_4x_the_tokens_would_not_fit_that_bound(runs):
    """The bound above can fail: without a budget the same step's memory grows with the trajectory."""
    one, whole = runs["one"], runs["four_one_pass"]
    assert _growth(whole) - _growth(one) > runs["four"]["kv_allowed_bytes"] + 2 * SLACK
