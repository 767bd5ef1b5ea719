"""Expert routing of one MoE layer: live top-k selection, and R3 replay of a recorded selection.

A routing record holds, per token and per MoE layer, the ids of the k experts the router selected
(the sampler reports them in the router's order, highest probability first; the event log stores the
set and reads it back sorted by id). The order does not matter here: the experts' outputs are
combined per expert (``Experts`` groups tokens by expert id) and the gates' normaliser is summed in
a canonical order (``set_sum``), so a permuted record replays bit for bit. The sampler captures it while generating; the
learner replays it (rollout routing replay, R3) so that the training forward uses the very experts
the behaviour policy used, while the gate weights still carry gradient from the live router.
"""

from __future__ import annotations

import numpy as np
import torch

from schemas import routing_dtype


def topk_gate(router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Live routing: ``p = softmax(z)``, ``S = TopK(p, k)``, ``g_i = p_i`` (``/ sum_{j in S} p_j`` if normalised).

    ``router_logits`` is ``[N, E]``; returns ``(gates [N, k] float32, experts [N, k] int64)``, experts
    sorted by descending probability (the order Qwen3-MoE and SGLang report).
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    gates, experts = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        gates = gates / set_sum(gates)
    return gates, experts


def set_sum(gates: torch.Tensor) -> torch.Tensor:
    """``sum(gates, -1)`` (keepdim) independent of the order of the k values: summed in ascending
    order. A float sum depends on its order; R3 takes its selection from a record that the log
    stores as a set (sorted by expert id, not by probability), so live routing and replay must
    normalise in one canonical order for a replayed forward to equal the live one bit for bit."""
    return torch.sort(gates, dim=-1).values.sum(dim=-1, keepdim=True)


def r3_gate(router_logits: torch.Tensor, recorded_experts: torch.Tensor, norm_topk_prob: bool) -> torch.Tensor:
    """R3 gate: selection from the record, normalisation from the live logits over the recorded experts.

    ``g_i = softmax(z)_i / sum_{j in S_rec} softmax(z)_j`` for ``i in S_rec`` (norm_topk_prob), else
    ``g_i = softmax(z)_i``; ``z`` = live router logits ``[N, E]``, ``S_rec`` = ``recorded_experts [N, k]``.
    Returns the gates ``[N, k]`` (float32), aligned with ``recorded_experts``; they carry the gradient
    of the live router.
    """
    num_experts = router_logits.shape[-1]
    if recorded_experts.shape[:-1] != router_logits.shape[:-1]:
        raise ValueError(f"routing record has {tuple(recorded_experts.shape[:-1])} tokens, "
                         f"the router saw {tuple(router_logits.shape[:-1])}; pass the record of this very sequence")
    recorded = recorded_experts.long()
    if recorded.numel() and (int(recorded.min()) < 0 or int(recorded.max()) >= num_experts):
        raise ValueError(f"routing record names expert ids outside [0, {num_experts}); "
                         "it was recorded with another model shape")
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    gates = probs.gather(-1, recorded)
    if norm_topk_prob:
        gates = gates / set_sum(gates)
    return gates


def routing_to_numpy(routing: torch.Tensor, num_experts: int) -> np.ndarray:
    """A routing record ``[..., layers, k]`` as numpy in the smallest id dtype (one byte for <= 256 experts)."""
    return routing.to("cpu").numpy().astype(routing_dtype(num_experts), copy=False)


def routing_from_numpy(record: np.ndarray) -> torch.Tensor:
    """A stored routing record (uint8/uint16/int32) as an int64 tensor for replay."""
    return torch.from_numpy(np.asarray(record).astype(np.int64))
