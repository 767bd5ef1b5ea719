"""Off-policy correction of the PPO loss: importance weights from the sampler to the learner (``[ppo]
off_policy_correction``), after decoupled PPO (AReaL) with TIS / MIS (slime, miles) and verl's rollout IS.

Three policies meet in an asynchronous step. ``pi_behav`` sampled the tokens (the sampler's logprobs, up to
``max_staleness`` versions old, maybe in another precision); ``pi_prox`` is the learner before this step
(``old_logprobs = "recompute"``), the anchor of PPO's ratio and clip; ``pi_theta`` is the policy being
updated. PPO's ratio ``pi_theta / pi_prox`` keeps each update close to ``pi_prox``, but the tokens came from
``pi_behav``: the importance weight ``w = pi_prox / pi_behav`` of each loss token carries the expectation
from the one to the other. The correction multiplies each token's clipped surrogate by a bounded,
detached function of ``w`` (truncated: ``min(w, C)``; masked: ``1[1/C <= w <= C]``).

Pure functions on torch tensors, entries aligned to the actions like ``t1_actors.train.ppo``. Every weight
is computed from log-ratios (a trajectory's sum in float64, log w clamped to +-20) and is a constant of the
update: no gradient flows into it (it changes the measure, not the objective). The weight multiplies the
surrogate only; the loss is still divided by all the minibatch's loss tokens, so a masked token counts
as a 0 in the token mean (verl drops it from the denominator too: its gradient is this one divided by the
share of tokens kept). This keeps the data-parallel normaliser (the global loss-token count) unchanged.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Literal

import torch

Level = Literal["token", "sequence", "geometric"]
LOG_WEIGHT_BOUND = 20.0  # |log w| is clamped here (as verl): exp(+-20) stays finite over any trajectory length


def trajectory_log_ratio_totals(log_ratio: torch.Tensor, mask: torch.Tensor,
                                groups: Sequence[Hashable]) -> dict[Hashable, tuple[float, float]]:
    """(sum of log w_j, number of loss tokens) of each trajectory, its rows (chunks) summed.

        S_i = sum_{j in i, m_j = 1} (log pi_prox(a_j|s_j) - log pi_behav(a_j|s_j)),   n_i = sum_{j in i} m_j

    ``groups[b]`` names row b's trajectory (its trial id): a trial split in chunks is one trajectory. The
    totals of several data-parallel ranks add up (``merge_totals``) to those of the whole batch.
    """
    if log_ratio.ndim != 2 or log_ratio.shape != mask.shape or len(groups) != log_ratio.shape[0]:
        raise ValueError(f"log_ratio and mask must be [B, T] with one group per row; got {tuple(log_ratio.shape)}, "
                         f"{tuple(mask.shape)} and {len(groups)} groups")
    m = mask.bool()
    sums = torch.where(m, log_ratio.double(), 0.0).sum(dim=1).tolist()
    counts = m.sum(dim=1).tolist()
    totals: dict[Hashable, tuple[float, float]] = {}
    for group, s, n in zip(groups, sums, counts):
        before = totals.get(group, (0.0, 0.0))
        totals[group] = (before[0] + s, before[1] + float(n))
    return totals


def merge_totals(parts: Sequence[Mapping[Hashable, tuple[float, float]]]) -> dict[Hashable, tuple[float, float]]:
    """The per-trajectory totals of several shards (data-parallel ranks, in rank order) added up."""
    merged: dict[Hashable, tuple[float, float]] = {}
    for part in parts:
        for group, (s, n) in part.items():
            before = merged.get(group, (0.0, 0.0))
            merged[group] = (before[0] + s, before[1] + n)
    return merged


def importance_weights(prox_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                       level: Level = "token", groups: Sequence[Hashable] | None = None,
                       totals: Mapping[Hashable, tuple[float, float]] | None = None) -> torch.Tensor:
    """Importance weight of each loss token from the behaviour (sampler) policy to the proximal (learner) one.

        token:     w_j = pi_prox(a_j|s_j) / pi_behav(a_j|s_j) = exp(log pi_prox - log pi_behav)
        sequence:  w_i = prod_{j in i} w_j = exp(S_i)                  (verl's "sequence": the exact IS ratio
                                                                        of the trajectory; high variance)
        geometric: w_i = (prod_{j in i} w_j)^(1 / n_i) = exp(S_i / n_i)  (verl's / SkyRL's "geometric": the
                                                                        per-token ratio of the trajectory)

    with S_i and n_i of ``trajectory_log_ratio_totals``: at the two sequence levels every loss token of
    trajectory i (all its rows in ``groups``, default one trajectory per row; all its segments) carries the
    same w_i. ``totals`` (the whole batch's, merged over data-parallel ranks) replaces this shard's own when
    a trajectory's chunks sit on several ranks. log w is clamped to +-20. Returns ``[B, T]``, 1 off the mask.
    """
    if prox_logprobs.shape != behaviour_logprobs.shape or prox_logprobs.shape != mask.shape:
        raise ValueError(f"prox_logprobs, behaviour_logprobs and mask must share one shape; got "
                         f"{tuple(prox_logprobs.shape)}, {tuple(behaviour_logprobs.shape)}, {tuple(mask.shape)}")
    m = mask.bool()
    log_ratio = prox_logprobs.detach() - behaviour_logprobs.detach()
    if level == "token":
        log_w = log_ratio
    elif level in ("sequence", "geometric"):
        rows = list(range(log_ratio.shape[0])) if groups is None else list(groups)
        if totals is None:
            totals = trajectory_log_ratio_totals(log_ratio, m, rows)
        per_row = []
        for group in rows:
            s, n = totals[group]
            per_row.append(s if level == "sequence" else s / max(n, 1.0))
        log_w = torch.tensor(per_row, dtype=torch.float64, device=log_ratio.device)[:, None].expand_as(log_ratio)
    else:
        raise ValueError(f"unknown importance-weight level {level!r}: token, sequence or geometric")
    w = torch.exp(log_w.clamp(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND)).to(log_ratio.dtype)
    return torch.where(m, w, torch.ones_like(w))


def truncated_importance_weights(w: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling (TIS): the weight, capped from above.

        w^TIS_j = min(w_j, C)

    Low weights pass as they are (a token the learner finds less likely than the sampler did counts less).
    """
    _check_cap(cap)
    return w.clamp(max=cap)


def masked_importance_weights(w: torch.Tensor, cap: float) -> torch.Tensor:
    """Masked importance sampling (MIS, icepop-style rejection): keep a token only where the two policies agree.

        w^MIS_j = 1[1/C <= w_j <= C]

    A kept token weighs 1 (its weight is not applied), a dropped one 0.
    """
    _check_cap(cap)
    return ((w >= 1.0 / cap) & (w <= cap)).to(w.dtype)


def correction_counts(w: torch.Tensor, mask: torch.Tensor, cap: float) -> tuple[float, float, float]:
    """(sum of w, tokens with w > C, tokens with w outside [1/C, C]) over the loss tokens: the step divides
    them by its loss-token count for the mean weight and the truncated and masked fractions."""
    m = mask.bool()
    return (float(torch.where(m, w.double(), 0.0).sum()), float((m & (w > cap)).sum()),
            float((m & ((w < 1.0 / cap) | (w > cap))).sum()))


def _check_cap(cap: float) -> None:
    if not cap > 1.0:
        raise ValueError(f"the importance-weight cap C must be > 1 (the band [1/C, C] holds w = 1), got {cap}")
