"""Deterministic events for the storage tests: the content of event ``seq`` is a function of ``seq``,
so any process can check what another one wrote."""

from __future__ import annotations

import numpy as np

from schemas import SamplerTurn, SandboxExec, TrajectoryAssembled, TrialIssued
from storage import StorageConfig, stored_routing

LAYERS, K, EXPERTS = 4, 2, 8
TINY_CHUNKS = StorageConfig(routing_chunk_bytes=1024, vector_chunk_bytes=1024, header_chunk_bytes=1024,
                            cache_chunks=4, readahead_chunks=3, read_block_bytes=4096,
                            reserve_min_bytes=128)  # writes of 128 B or more reserve blocks first: kills hit that too


def routing_sets(rng: np.random.Generator, tokens: int) -> np.ndarray:
    """A routing record of distinct ids per (token, layer), each set sorted: what the log reads back."""
    return np.sort(np.argsort(rng.random((tokens, LAYERS, EXPERTS)), axis=-1)[..., :K], axis=-1).astype(np.uint8)


def sampler_turn(seq: int, writer: str = "w") -> SamplerTurn:
    rng = np.random.default_rng([seq, len(writer)])
    p, n = int(rng.integers(0, 120)), int(rng.integers(1, 150))
    return SamplerTurn(
        trial_id=f"trial-{seq % 7}", turn=seq, prompt_ids=rng.integers(0, 50_000, p, dtype=np.int32),
        sampled_ids=rng.integers(0, 50_000, n, dtype=np.int32),
        sampler_logprobs=rng.standard_normal(n).astype(np.float32),
        routing=routing_sets(rng, p + n - 1), policy_version=seq // 10, finish_reason="stop", temperature=0.7,
        top_p=1.0, sampler_id=writer)


def trajectory(seq: int) -> TrajectoryAssembled:
    """Routing with repeated ids in most records: those are stored id by id (the log's other layout)."""
    rng = np.random.default_rng(seq + 1000)
    n = int(rng.integers(1, 300))
    return TrajectoryAssembled(
        trial_id=f"trial-{seq % 7}", chunk=0, task_id="task", token_ids=rng.integers(0, 9, n, dtype=np.int32),
        loss_mask=rng.integers(0, 2, n, dtype=np.uint8), sampler_logprobs=rng.standard_normal(n).astype(np.float32),
        routing=stored_routing(rng.integers(0, EXPERTS, (n, LAYERS, K), dtype=np.uint8)),
        token_versions=np.full(n, 3, np.int32),
        boundary_cases=["strict", "split"], reward=float(rng.random()), policy_version=3, turns=2)


def mixed_event(seq: int, writer: str = "w"):
    """Event ``seq`` of a writer: turns, trajectories, sandbox execs and trials, all deterministic."""
    match seq % 4:
        case 0:
            return sampler_turn(seq, writer)
        case 1:
            return trajectory(seq)
        case 2:
            return SandboxExec(trial_id=f"trial-{seq % 7}", turn=seq, command=f"echo {seq}", exit_code=seq % 3,
                               stdout="x" * (seq % 50), stderr="", duration_s=0.01)
        case _:
            return TrialIssued(trial_id=f"trial-{seq % 7}", task_id=f"task-{seq}", policy_version_wanted=seq)
