"""One PPO step on a ``TrajectoryBatch``, written once for every learner backend.

A backend hands in its policy as a ``Trainable``: a forward ``(inputs [B,T], routing_replay | None,
capture_routing) -> (logits [B,T,V], routing [B,T,L,k] | None)``, its parameters and its optimiser
(and, for a colocated critic, a value forward ``inputs -> V [B,T]``). The maths is ``t1_actors.train.ppo``.

Memory: with ``Trainable.max_tokens`` a minibatch runs as micro-batches of at most that many positions
(``t1_actors.train.segments``: rows grouped, a long row in segments with the earlier segments' K/V cached);
every loss is still divided by the minibatch's global loss-token count, so the update is the same.

Data parallel: each rank holds its own shard of the batch. Losses are token sums divided by the
*global* loss-token count of the minibatch, gradients are summed over ranks (one flat all-reduce), so
the update equals the single-process update on the whole batch. Metrics are reduced the same way.
With ``minibatches > 1`` each rank splits its own shard; a global minibatch is the union of the ranks'.
"""

from __future__ import annotations

import time
from dataclasses import fields

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from t1_actors.train import off_policy, ppo
from t1_actors.train.batch import TrajectoryBatch
from t1_actors.train.passes import (
    TokenSums,
    Trainable,
    logprob_gap_sum,
    policy_backward,
    policy_logprobs,
    sampler_learner_kl_sum,
    value_backward,
    value_estimates,
)

__all__ = ["Trainable", "TokenSums", "run_ppo_step", "run_value_updates", "value_estimates", "world_size",
           "all_reduce_sum", "advantages_and_returns", "monte_carlo_returns", "fidelity_without_replay"]



# ----------------------------------------------------------------------------------------- collectives

def world_size(group=None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def all_reduce_sum(values: torch.Tensor, group=None) -> torch.Tensor:
    """Sum of ``values`` over ranks (returned; metrics live on the CPU, nccl reduces on the GPU)."""
    if world_size(group) == 1:
        return values
    device = values.device
    if dist.get_backend(group) == "nccl":
        values = values.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
    return values.to(device)


def allreduce_gradients(parameters: list[torch.nn.Parameter], group=None) -> None:
    """Sum gradients over ranks in one flat buffer. An expert no token of this rank chose has no
    gradient here but may on another rank, so missing gradients join as zeros."""
    if world_size(group) == 1:
        return
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in parameters]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(synced)


def optimizer_step(model: Trainable, loss: torch.Tensor, max_grad_norm: float, group=None) -> float:
    model.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return apply_gradients(model, max_grad_norm, group)


def apply_gradients(model: Trainable, max_grad_norm: float, group=None) -> float:
    """Sum ``.grad`` over ranks, clip, step; returns the gradient norm before clipping."""
    allreduce_gradients(model.parameters, group)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters, max_grad_norm)
    model.optimizer.step()
    return float(grad_norm)


# ------------------------------------------------------------------------------------------ the targets

def advantages_and_returns(batch: TrajectoryBatch, cfg: ppo.PPOConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages (GAE, or the group baseline of ``advantage_estimator = "rloo"``) and the critic's value
    targets (GAE returns), aligned to actions (``[B, T-1]``), from the batch's old values."""
    if batch.old_values is None:
        raise ValueError("the batch has no old values V(s_j); attach the critic's values (CriticValues from "
                         "the log, or critic.values(batch)) before the PPO step")
    mask = batch.action_mask
    values = batch.old_values[:, 1:]
    rewards = ppo.terminal_rewards(batch.rewards, mask)
    advantages = ppo.gae_advantages(rewards, values, mask, cfg.gamma, cfg.lam)
    targets = ppo.returns(advantages, values)  # the critic learns the return whatever the policy's estimator
    if cfg.advantage_estimator == "rloo":
        if len(batch.task_ids) != len(batch):
            raise ValueError("advantage_estimator = 'rloo' needs each trajectory's task id in the batch "
                             "(collate() from TrajectoryAssembled events sets it)")
        baselines, has = ppo.leave_one_out_baselines(batch.rewards, batch.task_ids, batch.trial_ids)
        advantages = ppo.rloo_advantages(batch.rewards, baselines, has, mask, advantages)
    if cfg.positive_advantages_only:
        advantages = ppo.positive_part(advantages)
    return advantages, targets


def monte_carlo_returns(batch: TrajectoryBatch, cfg: ppo.PPOConfig) -> torch.Tensor:
    """Value targets with no critic yet (warm-up): GAE with V = 0 and lambda = 1 is the discounted return."""
    mask = batch.action_mask
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rewards = ppo.terminal_rewards(batch.rewards, mask)
    return ppo.returns(ppo.gae_advantages(rewards, zeros, mask, cfg.gamma, 1.0), zeros)


# -------------------------------------------------------------------------------------------- fidelity

def routing_mismatch_counts(live: torch.Tensor, record: torch.Tensor, valid: torch.Tensor) -> tuple[int, int]:
    """(recorded expert choices the live router did not make, all choices) over real positions.

    Compared as sets per (token, layer): the order of the k ids does not matter.
    """
    chosen = (record.unsqueeze(-1) == live.unsqueeze(-2)).any(-1)  # [B, T, L, k]
    choices = chosen[valid]
    return int((~choices).sum()), int(choices.numel())


@torch.no_grad()
def fidelity_without_replay(policy: Trainable, batch: TrajectoryBatch, temperature: float) -> torch.Tensor:
    """[gap sum, loss tokens, mismatched choices, choices] of a forward that routes live (no R3)."""
    logprobs, live = policy_logprobs(policy, batch, None, temperature, capture=batch.routing is not None)
    gap = logprob_gap_sum(logprobs, batch.sampler_logprobs[:, 1:], batch.action_mask)
    mismatched, choices = (0, 0)
    if batch.routing is not None:
        mismatched, choices = routing_mismatch_counts(live, batch.routing, batch.input_valid)
    return torch.tensor([float(gap), float(batch.action_mask.sum()), mismatched, choices], dtype=torch.float64)


# ------------------------------------------------------------------------------------ off-policy weights

def off_policy_weights(batch: TrajectoryBatch, prox_logprobs: torch.Tensor, cfg: ppo.PPOConfig, sums: TokenSums,
                       group=None) -> torch.Tensor | None:
    """The detached weights of ``[ppo] off_policy_correction`` for every row ``[B, T-1]`` (None for "none"),
    from the learner's pre-step logprobs and the sampler's; adds the weights' counts to ``sums`` whatever the
    mode (a run without the correction still reports what it would truncate or mask).

    Computed once over the whole batch before any minibatch or segment, so a trajectory's weight at the
    sequence levels covers all its chunks (rows of one trial id) and all its segments; with data parallel,
    a trial's chunks may sit on several ranks, whose per-trial totals are gathered and added first.
    """
    mask, behaviour = batch.action_mask, batch.sampler_logprobs[:, 1:]
    totals = None
    if cfg.off_policy_level != "token" and world_size(group) > 1:
        local = off_policy.trajectory_log_ratio_totals(prox_logprobs - behaviour, mask, batch.trial_ids)
        parts: list = [None] * world_size(group)
        dist.all_gather_object(parts, local, group=group)
        totals = off_policy.merge_totals(parts)
    w = off_policy.importance_weights(prox_logprobs, behaviour, mask, cfg.off_policy_level, batch.trial_ids, totals)
    weight, truncated, masked = off_policy.correction_counts(w, mask, cfg.off_policy_cap)
    sums.is_weight += weight
    sums.is_truncated += truncated
    sums.is_masked += masked
    if cfg.off_policy_correction == "truncate":
        return off_policy.truncated_importance_weights(w, cfg.off_policy_cap)
    if cfg.off_policy_correction == "mask":
        return off_policy.masked_importance_weights(w, cfg.off_policy_cap)
    return None


# ------------------------------------------------------------------------------------------- the loops

def minibatch_plan(batch_size: int, cfg: ppo.PPOConfig, seed: int) -> list[tuple[int, list[int]]]:
    """(epoch, rows) of every optimiser update: trajectories shuffled per epoch, split in ``minibatches``."""
    plan = []
    for epoch in range(cfg.epochs):
        order = torch.randperm(batch_size, generator=torch.Generator().manual_seed(seed * 1009 + epoch)).tolist() \
            if cfg.minibatches > 1 else list(range(batch_size))
        for m in range(cfg.minibatches):
            plan.append((epoch, order[m::cfg.minibatches]))
    return plan


def run_ppo_step(policy: Trainable, batch: TrajectoryBatch, cfg: ppo.PPOConfig, *,
                 critic: Trainable | None = None, replay: bool = True, fidelity: bool = True,
                 seed: int = 0, group=None) -> dict[str, float]:
    """Clipped-surrogate updates of the policy (and the colocated critic's clipped value loss).

    ``replay``: the training forward replays the batch's routing record (R3). ``fidelity``: also run
    one no-grad forward without replay, for the logprob gap and routing mismatch without R3.
    Returns the step's metrics (reduced over data-parallel ranks). The R3 logprob gap and the
    sampler-learner KL are measured on the policy as it was before this step's first update: the whole
    batch when ``old_logprobs`` is recomputed, else the first minibatch's training forward (all tokens
    when ``minibatches = 1``). With ``old_logprobs = "recompute"`` the policy loss carries the off-policy
    correction of ``off_policy_weights`` and the metrics its weights' mean and truncated / masked fractions.
    """
    started = time.perf_counter()
    if replay and batch.routing is None:
        raise ValueError("replay=True but the batch has no routing record; collate with routing or disable R3")
    if cfg.moe_aux_loss_coef != 0.0:
        raise ValueError("the torch learner applies no MoE load-balancing loss; the recipe sets "
                         "moe_aux_loss_coef = 0 (use the megatron backend for an auxiliary loss)")
    routing = batch.routing if replay else None
    mask = batch.action_mask
    advantages, returns = advantages_and_returns(batch, cfg)
    if cfg.normalize_advantages:
        advantages = ppo.whiten(advantages, mask)
    old_values = batch.old_values[:, 1:]
    sampler_logprobs = batch.sampler_logprobs[:, 1:]
    sums = TokenSums()
    weights = None
    if cfg.old_logprobs == "recompute":
        old_logprobs, _ = policy_logprobs(policy, batch, routing, cfg.temperature)
        sums.gap += float(logprob_gap_sum(old_logprobs, sampler_logprobs, mask))
        sums.gap_kl += sampler_learner_kl_sum(old_logprobs, sampler_logprobs, mask)
        sums.gap_tokens += float(mask.sum())
        weights = off_policy_weights(batch, old_logprobs, cfg, sums, group)
    else:
        old_logprobs = sampler_logprobs

    no_replay = fidelity_without_replay(policy, batch, cfg.temperature) if fidelity and replay else None

    policy_loss = value_loss = 0.0  # summed over updates, each already divided by the global token count
    grad_norms = []
    plan = minibatch_plan(len(batch), cfg, seed)
    for update, (_epoch, rows) in enumerate(plan):
        mb_mask = mask[rows]
        normalizer = all_reduce_sum(torch.tensor(float(mb_mask.sum())), group).clamp(min=1.0)
        if not rows:  # this rank's shard is smaller than the minibatch count: join the collectives with 0
            grad_norms.append(optimizer_step(policy, _zero_loss(policy), cfg.max_grad_norm, group))
            if critic is not None:
                optimizer_step(critic, _zero_loss(critic), cfg.max_grad_norm, group)
            continue
        measure_gap = update == 0 and cfg.old_logprobs == "sampler"  # the only forward before any update
        policy.optimizer.zero_grad(set_to_none=True)
        loss = policy_backward(policy, batch, rows, None if routing is None else routing[rows], old_logprobs[rows],
                                advantages[rows], normalizer, cfg, sums, measure_gap,
                                None if weights is None else weights[rows])
        policy_loss += loss
        grad_norms.append(apply_gradients(policy, cfg.max_grad_norm, group))
        if critic is not None:
            critic.optimizer.zero_grad(set_to_none=True)
            value_loss += value_backward(critic, batch, rows, returns[rows], old_values[rows], normalizer, cfg)
            apply_gradients(critic, cfg.max_grad_norm, group)

    sums = TokenSums(*all_reduce_sum(torch.tensor([getattr(sums, f.name) for f in fields(sums)],
                                                  dtype=torch.float64), group).tolist())
    policy_loss, value_loss = (all_reduce_sum(torch.tensor([policy_loss, value_loss], dtype=torch.float64), group)
                               / len(plan)).tolist()
    tokens = all_reduce_sum(torch.tensor([float(batch.num_tokens), float(batch.action_mask.sum()),
                                          float(batch.rewards.sum()), float(len(batch))], dtype=torch.float64), group)
    elapsed = time.perf_counter() - started
    metrics = {
        "policy_loss": policy_loss,
        "clip_fraction": sums.clip / max(sums.tokens, 1.0),
        "approx_kl": sums.kl / max(sums.tokens, 1.0),
        "entropy": sums.entropy / max(sums.tokens, 1.0),
        ("logprob_gap_r3" if replay else "logprob_gap_no_r3"): sums.gap / max(sums.gap_tokens, 1.0),
        "kl_sampler_learner": sums.gap_kl / max(sums.gap_tokens, 1.0),
        "explained_variance": _explained_variance(old_values, returns, mask, group),
        "grad_norm": sum(grad_norms) / len(grad_norms),
        "reward_mean": float(tokens[2] / tokens[3]),
        "loss_tokens": float(tokens[1]),
        "tokens": float(tokens[0]),
        "tokens_per_s": float(tokens[0]) / elapsed,
        "step_seconds": elapsed,
        "r3": float(replay),
    }
    if cfg.old_logprobs == "recompute":  # w = pi_prox / pi_behav over the same tokens as the gap (all)
        metrics["off_policy_weight_mean"] = sums.is_weight / max(sums.gap_tokens, 1.0)
        metrics["off_policy_truncated_fraction"] = sums.is_truncated / max(sums.gap_tokens, 1.0)
        metrics["off_policy_masked_fraction"] = sums.is_masked / max(sums.gap_tokens, 1.0)
    if critic is not None:
        metrics["value_loss"] = value_loss
    if no_replay is not None:
        no_replay = all_reduce_sum(no_replay, group)
        metrics["logprob_gap_no_r3"] = float(no_replay[0] / no_replay[1].clamp(min=1))
        metrics["routing_mismatch_no_r3"] = float(no_replay[2] / no_replay[3].clamp(min=1))
    return metrics


def run_value_updates(critic: Trainable, batch: TrajectoryBatch, returns: torch.Tensor, cfg: ppo.PPOConfig, *,
                      clipped: bool = True, epochs: int | None = None, seed: int = 0, group=None) -> dict[str, float]:
    """Critic updates toward ``returns`` (aligned to actions): the clipped value loss against the batch's
    old values, or (``clipped=False``, warm-up) the plain squared error."""
    mask = batch.action_mask
    if clipped and batch.old_values is None:
        raise ValueError("the clipped value loss needs the batch's old values V_old (the values used for GAE)")
    old_values = batch.old_values[:, 1:] if batch.old_values is not None else None
    plan = minibatch_plan(len(batch), cfg.model_copy(update={"epochs": epochs or cfg.epochs}), seed)
    total = 0.0
    for _, rows in plan:
        mb_mask = mask[rows]
        normalizer = all_reduce_sum(torch.tensor(float(mb_mask.sum())), group).clamp(min=1.0)
        if not rows:
            optimizer_step(critic, _zero_loss(critic), cfg.max_grad_norm, group)
            continue
        critic.optimizer.zero_grad(set_to_none=True)
        total += value_backward(critic, batch, rows, returns[rows], old_values[rows] if clipped else None,
                                 normalizer, cfg)
        apply_gradients(critic, cfg.max_grad_norm, group)
    return {"value_loss": float(all_reduce_sum(torch.tensor(total), group)) / len(plan)}


def _zero_loss(model: Trainable) -> torch.Tensor:
    """A loss of 0 with a (zero) gradient for every parameter, for a rank with no rows in a minibatch."""
    return sum(p.sum() * 0.0 for p in model.parameters)


def _explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, group=None) -> float:
    """EV over every rank's loss tokens (gathered: a few floats per token)."""
    m = mask.bool()
    if world_size(group) == 1:
        return ppo.explained_variance(values, returns, m)
    pairs = [None] * world_size(group)
    dist.all_gather_object(pairs, (values[m].detach().cpu(), returns[m].detach().cpu()), group=group)
    v = torch.cat([p[0] for p in pairs])
    r = torch.cat([p[1] for p in pairs])
    return ppo.explained_variance(v.unsqueeze(0), r.unsqueeze(0), torch.ones_like(v, dtype=torch.bool).unsqueeze(0))
