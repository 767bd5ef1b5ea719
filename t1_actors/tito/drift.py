"""The drift invariant and the run metrics: inside the loss region the trained ids equal the sampled ids."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from t1_actors.tito._records import CASES, TrajectoryChunk


def loss_region_drift(chunk: TrajectoryChunk) -> int:
    """Tokens where the stream breaks the invariant: a loss-region id differs from the sampled id, or the loss
    mask disagrees with where the sampled ids sit. 0 for every chunk ``assemble`` returns."""
    expected = np.zeros(len(chunk.token_ids), dtype=bool)
    drift = 0
    for span in chunk.loss_spans:
        end = span.start + len(span.sampled_ids)
        trained = chunk.token_ids[span.start:end]
        drift += int(np.count_nonzero(trained != span.sampled_ids)) + len(span.sampled_ids) - len(trained)
        expected[span.start:end] = True
    return drift + int(np.count_nonzero(expected != chunk.loss_mask.astype(bool)))


def tito_metrics(chunks: Sequence[TrajectoryChunk]) -> dict[str, float]:
    """Run metrics over chunks: tokens, loss tokens, boundary cases, the share of loss tokens whose turn was
    repaired by retokenization (the paper's residual 2.6 %), drift (must be 0) and unrecorded routing rows."""
    cases = Counter(case for chunk in chunks for case in chunk.boundary_cases)
    loss = sum(int(chunk.loss_mask.sum()) for chunk in chunks)
    retok = sum(_retokenized_loss_tokens(chunk) for chunk in chunks)
    drift = sum(loss_region_drift(chunk) for chunk in chunks)
    return {
        "chunks": len(chunks),
        "turns": sum(len(chunk.turns) for chunk in chunks),
        "tokens": sum(len(chunk.token_ids) for chunk in chunks),
        "loss_tokens": loss,
        **{f"boundary_{case}": cases[case] for case in CASES},
        "retokenized_loss_tokens": retok,
        "retokenized_share": retok / loss if loss else 0.0,
        "context_mismatch_tokens": sum(r.context_mismatch for chunk in chunks for r in chunk.repairs),
        "drift_tokens": drift,
        "drift_rate": drift / loss if loss else 0.0,
        "routing_rows_unrecorded": sum(int((~chunk.routing_recorded).sum()) for chunk in chunks
                                       if chunk.routing_recorded is not None),
    }


def _retokenized_loss_tokens(chunk: TrajectoryChunk) -> int:
    """Loss tokens of turns whose outgoing boundary was repaired by retokenization (their ids differ from the
    ids the next prompt holds for the same text)."""
    offset = 1 if chunk.index > 0 else 0  # the chunk's incoming split
    return sum(len(chunk.loss_spans[t].sampled_ids) for t in range(len(chunk.turns) - 1)
               if chunk.boundary_cases[t + offset] == "retokenized")
