"""The model passes of a PPO step, micro-batch by micro-batch (``t1_actors.train.segments``).

``policy_logprobs`` and ``value_estimates`` run no-grad forwards; ``policy_backward`` and ``value_backward``
put a minibatch's loss gradient into ``.grad``. Each divides its token sums by the normaliser it is given
(the minibatch's global loss-token count), so how the minibatch is cut never changes the loss or the update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from t1_actors.train import ppo, segments
from t1_actors.train.batch import TrajectoryBatch
from t1_actors.train.segments import KVLayout, Microbatch


@dataclass
class Trainable:
    """What the step needs of a model: how to run it, what to update, and the optimiser doing it.

    ``max_tokens``: the micro-batch budget in positions (None: a minibatch in one pass). Cutting a chunk into
    segments needs ``kv_layout`` (the model's K/V shape) and a ``forward`` that takes a ``cache=`` keyword (a
    ``SegmentKV``); without them the budget only groups rows, and a chunk longer than it is refused.
    """

    forward: Callable
    parameters: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    max_tokens: int | None = None
    kv_layout: KVLayout | None = None

    def plan(self, valid: torch.Tensor) -> list[Microbatch]:
        """Micro-batches of the rows of ``valid [r, T]`` (real input positions) within ``max_tokens``."""
        micro = segments.plan(valid.sum(1).tolist(), valid.shape[1], self.max_tokens)
        if self.kv_layout is None and any(len(m.segments) > 1 for m in micro):
            longest = int(valid.sum(1).max())
            raise ValueError(f"a chunk of {longest} positions exceeds max_tokens_per_microbatch = {self.max_tokens} "
                             "and this model cannot run in segments (only MoEBackbone's attention reads a "
                             f"SegmentKV); raise max_tokens_per_microbatch to at least {longest}")
        return micro


def _policy_forward(policy: Trainable, capture: bool) -> segments.SegmentForward:
    """The policy's ``(inputs, routing, cache) -> (logits, routing)``; no cache keyword for a single pass."""
    def run(inputs, routing, cache):
        if cache is None:
            return policy.forward(inputs, routing, capture)
        return policy.forward(inputs, routing, capture, cache=cache)
    return run


def _value_forward(critic: Trainable) -> segments.SegmentForward:
    """The value model's ``(inputs, _, cache) -> values``."""
    def run(inputs, routing, cache):
        return critic.forward(inputs) if cache is None else critic.forward(inputs, past_key_values=cache)
    return run


@dataclass
class TokenSums:
    """The step's per-token metrics as sums over this rank's loss tokens (the step sums them over
    data-parallel ranks): clip fraction, approx KL and entropy, each weighted by a minibatch's loss tokens
    (``tokens``); the |sampler - learner| logprob gap and the sampler-learner KL (k3 of the learner's
    logprobs against the sampler's) over the tokens they were measured on (``gap_tokens``); with
    ``old_logprobs = "recompute"``, over the same tokens, the importance weights w = pi_prox / pi_behav
    (``off_policy.correction_counts``: their sum, how many exceed C, how many lie outside [1/C, C])."""

    clip: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    tokens: float = 0.0
    gap: float = 0.0
    gap_tokens: float = 0.0
    gap_kl: float = 0.0
    is_weight: float = 0.0
    is_truncated: float = 0.0
    is_masked: float = 0.0


def logprob_gap_sum(logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum over loss tokens of |train logprob - sampler logprob| (divide by the token count for the mean)."""
    return ((logprobs.detach() - sampler_logprobs).abs() * mask).sum()


def sampler_learner_kl_sum(logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """Sum over loss tokens of Schulman's k3 between the sampler and the learner (divide by the token count):

        k3_j = (w_j - 1) - log w_j,   w_j = pi_learner(a_j|s_j) / pi_sampler(a_j|s_j)

    The tokens were drawn from the sampler, so the mean estimates KL(pi_sampler || pi_learner) (>= 0 per token)."""
    m = mask.bool()
    log_w = torch.where(m, logprobs.detach().double() - sampler_logprobs.double(), 0.0)
    return float((torch.expm1(log_w) - log_w).sum())


@torch.no_grad()
def policy_logprobs(policy: Trainable, batch: TrajectoryBatch, routing: torch.Tensor | None, temperature: float,
                    capture: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(x_t | x_<t) of every target ``[B, T-1]`` (and the live routing ``[B, T-1, L, k]`` when
    ``capture``), micro-batch by micro-batch: no ``[B, T, V]`` logits beyond one micro-batch's."""
    logprobs = live = None

    def keep(rows, start, end, output):
        nonlocal logprobs, live
        logits, routed = output
        part = ppo.token_logprobs(logits, batch.targets[rows, start:end], temperature)
        if logprobs is None:
            logprobs = part.new_zeros(batch.targets.shape)
        logprobs[rows, start:end] = part
        if capture:
            if live is None:
                live = routed.new_zeros((*batch.targets.shape, *routed.shape[2:]))
            live[rows, start:end] = routed

    for micro in policy.plan(batch.input_valid):
        segments.forward_no_grad(_policy_forward(policy, capture), micro, batch.inputs, routing, policy.kv_layout, keep)
    return logprobs, live


def policy_backward(policy: Trainable, batch: TrajectoryBatch, rows: list[int], routing: torch.Tensor | None,
                     old_logprobs: torch.Tensor, advantages: torch.Tensor, normalizer: torch.Tensor,
                     cfg: ppo.PPOConfig, sums: TokenSums, measure_gap: bool,
                     weights: torch.Tensor | None = None) -> float:
    """The clipped surrogate (and entropy bonus) of minibatch ``rows`` into ``.grad``, micro-batch by
    micro-batch; each part's token sums divided by the minibatch's ``normalizer``. ``weights`` (the rows'
    off-policy weights, computed over whole trajectories before any segmenting) multiply each token's
    surrogate; None: none. Adds the per-token metrics to ``sums``; returns the loss."""
    inputs, targets, mask = batch.inputs[rows], batch.targets[rows], batch.action_mask[rows]
    sampler_logprobs = batch.sampler_logprobs[rows, 1:]
    total = 0.0

    def segment_loss(part, start, end, output):
        nonlocal total
        pick = lambda x: x[part, start:end]  # noqa: E731
        m = pick(mask)
        log_pi = ppo.log_policy(output[0], cfg.temperature)  # once: the ratio's logprobs and the entropy read it
        logprobs = ppo.taken_logprobs(log_pi, pick(targets))
        loss, clip_fraction = ppo.ppo_policy_loss(logprobs, pick(old_logprobs), pick(advantages), m, cfg.clip_eps,
                                                  normalizer, None if weights is None else pick(weights))
        count = float(m.sum())
        if cfg.entropy_coef > 0:
            ent = ppo.entropy_of(log_pi, m)
            loss = loss - cfg.entropy_coef * ent * count / normalizer
        else:
            with torch.no_grad():
                ent = ppo.entropy_of(log_pi.detach(), m)
        with torch.no_grad():
            kl = ppo.approx_kl(logprobs.detach(), pick(old_logprobs), m)
            sums.clip += float(clip_fraction) * count
            sums.kl += float(kl) * count
            sums.entropy += float(ent) * count
            sums.tokens += count
            if measure_gap:
                sums.gap += float(logprob_gap_sum(logprobs, pick(sampler_logprobs), m))
                sums.gap_kl += sampler_learner_kl_sum(logprobs, pick(sampler_logprobs), m)
                sums.gap_tokens += count
        total += float(loss.detach())
        return loss

    for micro in policy.plan(batch.input_valid[rows]):
        segments.backward(_policy_forward(policy, False), micro, inputs, routing, policy.kv_layout, segment_loss)
    return total


def value_backward(critic: Trainable, batch: TrajectoryBatch, rows: list[int], returns: torch.Tensor,
                    old_values: torch.Tensor | None, normalizer: torch.Tensor, cfg: ppo.PPOConfig) -> float:
    """The value loss of minibatch ``rows`` into ``.grad``: clipped against ``old_values``, or plain (None)."""
    inputs, mask = batch.inputs[rows], batch.action_mask[rows]
    total = 0.0

    def segment_loss(part, start, end, values):
        nonlocal total
        pick = lambda x: x[part, start:end]  # noqa: E731
        if old_values is not None:
            loss = ppo.clipped_value_loss(values, pick(old_values), pick(returns), pick(mask), cfg.value_clip_eps,
                                          normalizer)
        else:
            loss = ppo.value_loss(values, pick(returns), pick(mask), normalizer)
        total += float(loss.detach())
        return loss

    for micro in critic.plan(batch.input_valid[rows]):
        segments.backward(_value_forward(critic), micro, inputs, None, critic.kv_layout, segment_loss)
    return total


@torch.no_grad()
def value_estimates(critic: Trainable, batch: TrajectoryBatch) -> torch.Tensor:
    """The value model's output at every input position ``[B, T-1]``, micro-batch by micro-batch."""
    out = None

    def keep(rows, start, end, values):
        nonlocal out
        if out is None:
            out = values.new_zeros(batch.inputs.shape)
        out[rows, start:end] = values

    for micro in critic.plan(batch.input_valid):
        segments.forward_no_grad(_value_forward(critic), micro, batch.inputs, None, critic.kv_layout, keep)
    return out
