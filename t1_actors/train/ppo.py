"""PPO maths of the T1 recipe, read top to bottom: reward (its equations in ``t1_actors.train.reward``), GAE,
returns, the three losses, diagnostics.

Pure functions on torch tensors; no model, no optimiser, no I/O. Every paper equation lives in exactly
one function named after it, with the equation in its docstring.

Token layout. A trajectory is a token stream ``x_0 .. x_{T-1}`` with a loss mask ``m_t`` (1 on tokens the
policy sampled). Each loss token is one action ``a_j = x_t`` taken in state ``s_j = x_{<t}``; the policy's
log-probability of it and the value ``V(s_j)`` both come from the model's output at position ``t - 1``.
The functions below take tensors ``[B, T]`` already aligned to the actions (entry ``t`` belongs to token
``x_t``) plus the mask; entries where ``m_t = 0`` are ignored (tool output, prompt, padding).

Loss aggregation over tokens: **token mean over the batch's loss tokens** (``sum_{b,t} m l / sum_{b,t} m``).
Every sampled token weighs the same whatever the length of its trajectory, so a long multi-turn episode
is not down-weighted against a short one (the sequence-mean alternative gives each *trajectory* equal
weight and shrinks the per-token gradient of long episodes), and it is the form that splits exactly over
data-parallel ranks: each rank sums its tokens and divides by the global loss-token count
(``normalizer``), then gradients are summed. There is no KL penalty and no entropy bonus by default
(``entropy_coef = 0``); the MoE load-balancing coefficient is 0.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from t1_actors.train.reward import REWARD_SCALE as REWARD_SCALE  # the rewards live in train/reward.py, read here too
from t1_actors.train.reward import RewardKind as RewardKind
from t1_actors.train.reward import binary_reward as binary_reward
from t1_actors.train.reward import reward as reward
from t1_actors.train.reward import task_reward as task_reward


class PPOConfig(BaseModel):
    """The ``[ppo]`` section of a run config. Defaults are the tiny embedded run (2 CPU cores)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    clip_eps: float = Field(0.2, gt=0, lt=1, description="actor clip range eps of the surrogate")
    value_clip_eps: float = Field(0.2, gt=0, description="critic clip range eps_v of the value loss")
    gamma: float = Field(1.0, ge=0, le=1, description="discount per action (token) of GAE and of the returns the "
                                                      "critic fits (recipe: 1)")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda: 1 = Monte Carlo return minus the value (no "
                                                    "bias from the critic, more variance); lower leans on the critic "
                                                    "(recipe: 1)")
    actor_lr: float = Field(1.5e-4, gt=0, description="the probe found 1e-4..2e-4 helps, 5e-4 hurts")
    critic_lr: float | None = Field(None, gt=0, description="None = critic_lr_ratio * actor_lr")
    critic_lr_ratio: float = Field(30.0, gt=0, description="paper: 1.5e-5 / 1.0e-6 = 15..30x; recipe 30x")
    adam_betas: tuple[float, float] = Field((0.9, 0.98), description="AdamW (beta1, beta2) of the actor and the "
                                                                     "critic, each in [0, 1)")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay of the weight matrices (norms and biases "
                                                       "are not decayed)")
    max_grad_norm: float = Field(1.0, gt=0, description="gradients of the actor and the critic are clipped to this "
                                                        "global L2 norm before each optimiser step")
    policy_optimizer: Literal["adamw", "sgd"] = Field(
        "adamw", description="the actor's optimiser (the critic keeps AdamW); sgd: each update is at most "
                             "actor_lr * max_grad_norm long, along the gradient")
    actor_params: tuple[str, ...] = Field(
        ("*",), min_length=1,
        description="glob patterns over the policy's checkpoint tensor names (model.safetensors, e.g. "
                    "'model.norm.weight', '*norm*'): RL updates the matching ones and freezes the rest; "
                    "('*',) = all. Each pattern must match a tensor")
    epochs: int = Field(1, ge=1, description="passes over each batch per PPO step")
    minibatches: int = Field(1, ge=1, description="optimiser steps per epoch (batch split by trajectory)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature the logprobs are taken at; in a run "
                                                       "config leave it unset: it is [sampler] temperature")
    old_logprobs: Literal["sampler", "recompute"] = Field(
        "sampler", description="pi_old of the ratio: the sampler's logprobs (TITO+R3 make them faithful) "
                               "or the learner's own, recomputed before the first epoch")
    off_policy_correction: Literal["none", "truncate", "mask"] = Field(
        "none", description="importance weight w = pi_prox / pi_behav (learner before the step / sampler) on each "
                            "token's clipped surrogate: none; truncate: min(w, C); mask: 1[1/C <= w <= C] (tokens "
                            "outside dropped). Needs old_logprobs = 'recompute' (docs/ppo.md)")
    off_policy_level: Literal["token", "sequence", "geometric"] = Field(
        "token", description="w per token, or one per trajectory (all its chunks): sequence = the product of its "
                             "token weights, geometric = their geometric mean (verl's levels)")
    off_policy_cap: float = Field(2.0, gt=1, le=1e6, description="C of the correction: truncate caps w at C, mask "
                                                                 "keeps [1/C, C]")
    normalize_advantages: bool = Field(False, description="whiten A over the batch's loss tokens")
    positive_advantages_only: bool = Field(False, description="train only on actions with A > 0 (A+ = max(A, 0)); "
                                                              "not the recipe: an experiment, see README")
    advantage_estimator: Literal["gae", "rloo"] = Field(
        "gae", description="gae: A_j = GAE over the critic's values (the recipe); rloo: A = R - the mean reward "
                           "of the other trials of the same task in the batch (needs [staleness] group_size > 1; "
                           "a trial alone in its group keeps its GAE advantage)")
    entropy_coef: float = Field(0.0, ge=0, description="weight of an entropy bonus in the policy loss (recipe: 0, "
                                                       "none; the entropy is still reported)")
    moe_aux_loss_coef: float = Field(0.0, ge=0, description="MoE load-balancing loss coefficient (recipe: 0)")
    critic_warmup_epochs: int = Field(1, ge=0, description="passes of the critic's warm-up over the warm-up trials' "
                                                           "trajectories, before it values any training trajectory "
                                                           "([critic] warmup_trajectories)")
    value_init_from_policy: bool = Field(True, description="start the critic trunk from the policy's weights")

    @model_validator(mode="after")
    def _check(self) -> PPOConfig:
        if not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"adam_betas must lie in [0, 1), got {self.adam_betas}")
        if self.policy_optimizer == "sgd" and self.critic_lr is None:
            raise ValueError("policy_optimizer = 'sgd' needs an explicit critic_lr: the critic keeps AdamW, and "
                             "critic_lr_ratio * an SGD learning rate is no AdamW rate; set [ppo] critic_lr "
                             "(e.g. 1.5e-3)")
        if self.trains_part_of_policy and self.critic_lr is None:
            raise ValueError(f"actor_params = {list(self.actor_params)} with no critic_lr: actor_lr is sized for the "
                             "tensors RL updates, and critic_lr_ratio * it is no rate for the whole critic; set "
                             "[ppo] critic_lr (e.g. 1.5e-3)")
        if self.off_policy_correction != "none" and self.old_logprobs != "recompute":
            raise ValueError(f"off_policy_correction = '{self.off_policy_correction}' with old_logprobs = "
                             f"'{self.old_logprobs}': the weight w = pi_prox / pi_behav needs the learner's own "
                             "logprobs before the step, and with the sampler's as pi_old pi_prox = pi_behav (w = 1); "
                             "set [ppo] old_logprobs = \"recompute\" (or off_policy_correction = \"none\")")
        if self.advantage_estimator == "rloo" and self.normalize_advantages:
            raise ValueError("normalize_advantages = true with advantage_estimator = 'rloo': whitening centres A "
                             "over the batch, which gives every group whose attempts all scored alike (A = 0) a "
                             "push (upward whenever the batch's token-weighted mean of A is below 0); set "
                             "normalize_advantages = false (Adam is scale-free, rloo's A is already centred)")
        return self

    @property
    def trains_part_of_policy(self) -> bool:
        return "*" not in self.actor_params

    @property
    def effective_critic_lr(self) -> float:
        return self.critic_lr if self.critic_lr is not None else self.critic_lr_ratio * self.actor_lr


# ----------------------------------------------------------------------------------------------- reward

def terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token rewards ``[B, T]``: each trajectory's reward on its last loss token, 0 elsewhere."""
    if rewards.ndim != 1 or mask.ndim != 2 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(f"rewards must be [B] and mask [B, T]; got {tuple(rewards.shape)} and {tuple(mask.shape)}")
    mask = mask.bool()
    has_tokens = mask.any(dim=1)
    if not bool(has_tokens.all()):
        empty = (~has_tokens).nonzero().flatten().tolist()
        raise ValueError(f"trajectories {empty} have no loss tokens; drop them before the PPO step")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    out[torch.arange(mask.shape[0], device=mask.device), last] = rewards
    return out


# ------------------------------------------------------------------------------------------------- GAE

def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                   gamma: float = 1.0, lam: float = 1.0) -> torch.Tensor:
    """Generalised advantage estimation over the loss tokens (actions) of each trajectory.

        delta_j = r_j + gamma * V(s_{j+1}) - V(s_j)          (V after the last action = 0)
        A_j     = sum_{l >= 0} (gamma * lam)^l * delta_{j+l}  = delta_j + gamma * lam * A_{j+1}

    Steps j run over tokens with mask 1 only: tool output and prompt tokens between two sampled
    tokens are the environment's move, not a step. With gamma = lam = 1 and a terminal reward R
    this is A_j = R - V(s_j). Returns ``[B, T]``, 0 where mask is 0.
    """
    if not (rewards.shape == values.shape == mask.shape) or rewards.ndim != 2:
        raise ValueError(f"rewards, values and mask must all be [B, T]; got {tuple(rewards.shape)}, "
                         f"{tuple(values.shape)}, {tuple(mask.shape)}")
    mask = mask.bool()
    rewards, values = rewards.float(), values.float()
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    for t in range(values.shape[1] - 1, -1, -1):
        step = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(step, advantage, 0.0)
        next_value = torch.where(step, values[:, t], next_value)
        next_advantage = torch.where(step, advantage, next_advantage)
    return advantages


def leave_one_out_baselines(rewards: torch.Tensor, groups: Sequence[Hashable],
                            trials: Sequence[Hashable]) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO baseline of each row: the mean reward of the *other* trials of its group (its task).

        b_i = (sum_{k in G(i), k != trial(i)} R_k) / (|G(i)| - 1)

    ``groups[i]`` is row i's group (task id) and ``trials[i]`` its trial: the chunks of one trial are one
    member, never each other's baseline. Returns (b [B], has_baseline [B] = |G(i)| >= 2); b = 0 where not.
    """
    if not (len(groups) == len(trials) == rewards.shape[0]) or rewards.ndim != 1:
        raise ValueError(f"rewards [B], groups and trials must have one entry per row; got {tuple(rewards.shape)}, "
                         f"{len(groups)} groups and {len(trials)} trials")
    members: dict[Hashable, dict[Hashable, float]] = {}
    for group, trial, r in zip(groups, trials, rewards.tolist()):
        members.setdefault(group, {})[trial] = r
    baselines = torch.zeros_like(rewards, dtype=torch.float32)
    has = torch.zeros(rewards.shape, dtype=torch.bool, device=rewards.device)
    for i, (group, trial) in enumerate(zip(groups, trials)):
        others = [r for t, r in members[group].items() if t != trial]
        if others:
            baselines[i], has[i] = sum(others) / len(others), True
    return baselines, has


def rloo_advantages(rewards: torch.Tensor, baselines: torch.Tensor, has_baseline: torch.Tensor,
                    mask: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Group (leave-one-out) advantage, the same for every action of a trajectory.

        A_j = R_i - b_i          for each loss token j of trajectory i with a baseline,
        A_j = fallback_j         (its GAE advantage) for a trajectory alone in its group.

    Why: with r = P / S a task's reward ceiling varies with its number of tests (S fixed), so R - V(s)
    mixes "how big is this task" (which a small critic learns slowly) with "did this attempt do well";
    comparing attempts at the same task removes the first.
    """
    per_row = torch.where(mask.bool(), (rewards - baselines).unsqueeze(1).to(fallback.dtype), 0.0)
    return torch.where(has_baseline.unsqueeze(1), per_row, fallback)


def positive_part(advantages: torch.Tensor) -> torch.Tensor:
    """Keep the better-than-baseline actions only (a RAFT-like filter; not the recipe).

        A+_j = max(A_j, 0)

    Why try it: pushing down the sampled tokens of a worse attempt spreads their mass over every other
    token, while pushing up a better attempt's tokens concentrates it (see README's campaign runs).
    """
    return advantages.clamp(min=0.0)


def returns(advantages: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Value targets (lambda-returns).

        R_j = A_j + V(s_j)
    """
    return advantages + values


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over this batch's loss tokens (only when ``PPOConfig.normalize_advantages``)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return torch.where(mask.bool(), (x - mean) * torch.rsqrt(var + 1e-8), 0.0)


# ------------------------------------------------------------------------------------------- aggregation

def masked_mean(x: torch.Tensor, mask: torch.Tensor, normalizer: float | torch.Tensor | None = None) -> torch.Tensor:
    """Token mean over loss tokens: sum(m * x) / N, N = sum(m) unless a (global) ``normalizer`` is given."""
    mask = mask.to(x.dtype)
    total = (x * mask).sum()
    count = mask.sum() if normalizer is None else normalizer
    return total / torch.clamp(torch.as_tensor(count, dtype=x.dtype, device=x.device), min=1.0)


# ------------------------------------------------------------------------------------------------ losses

def ppo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_eps: float = 0.2,
                    normalizer: float | torch.Tensor | None = None,
                    weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate objective (as a loss to minimise), token mean over loss tokens.

        rho_j = exp(log pi(a_j|s_j) - log pi_old(a_j|s_j))
        L^CLIP = - E_j[ w_j * min(rho_j * A_j, clip(rho_j, 1 - eps, 1 + eps) * A_j) ]

    Clipping acts at both ends: for A > 0 the gain stops at rho = 1 + eps, for A < 0 at rho = 1 - eps.
    ``weights`` w_j: the off-policy correction's detached weights (``t1_actors.train.off_policy``); None
    (w = 1) leaves the loss exactly as without. Returns (loss, clip fraction = share of loss tokens with
    |rho - 1| > eps).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    surrogate = -torch.minimum(unclipped, clipped)
    if weights is not None:
        surrogate = surrogate * weights.detach()
    loss = masked_mean(surrogate, mask, normalizer)
    with torch.no_grad():
        clip_fraction = masked_mean(((ratio - 1.0).abs() > clip_eps).to(logprobs.dtype), mask)
    return loss, clip_fraction


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, value_clip_eps: float = 0.2,
                       normalizer: float | torch.Tensor | None = None) -> torch.Tensor:
    """Clipped value loss, token mean over loss tokens.

        V_clip = V_old + clip(V - V_old, -eps_v, eps_v)
        L^V    = 1/2 * E_j[ max((V - R)^2, (V_clip - R)^2) ]
    """
    clipped = old_values + torch.clamp(values - old_values, -value_clip_eps, value_clip_eps)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return masked_mean(per_token, mask, normalizer)


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               normalizer: float | torch.Tensor | None = None) -> torch.Tensor:
    """Unclipped value loss (critic warm-up: there is no V_old to stay close to yet).

        L^V = 1/2 * E_j[ (V - R)^2 ]
    """
    return masked_mean(0.5 * (values - returns) ** 2, mask, normalizer)


# ------------------------------------------------------------------------------------------- diagnostics

def entropy(logits: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0,
            normalizer: float | torch.Tensor | None = None) -> torch.Tensor:
    """Mean policy entropy over loss tokens at the sampling temperature (``entropy_of`` of ``log_policy``)."""
    return entropy_of(log_policy(logits, temperature), mask, normalizer)


def entropy_of(log_pi: torch.Tensor, mask: torch.Tensor,
               normalizer: float | torch.Tensor | None = None) -> torch.Tensor:
    """Mean policy entropy over loss tokens, from ``log_pi = log_policy(logits, tau)`` ``[..., V]``:

        H_j = - sum_a pi(a|s_j) log pi(a|s_j)

    summed over the vocabulary at the loss tokens only (``mask`` > 0): elsewhere it would be multiplied by 0."""
    taken = mask > 0
    log_pi_taken = log_pi[taken]
    per_token = torch.zeros(mask.shape, dtype=log_pi.dtype, device=log_pi.device)
    per_token = per_token.masked_scatter(taken, -(log_pi_taken.exp() * log_pi_taken).sum(dim=-1))
    return masked_mean(per_token, mask, normalizer)


def approx_kl(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Schulman's low-variance estimator of KL(pi_old || pi) (reported, never penalised).

        k3 = E_j[ (rho_j - 1) - log rho_j ]
    """
    log_ratio = logprobs - old_logprobs
    return masked_mean(torch.expm1(log_ratio) - log_ratio, mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """How much of the return's variance the critic explains, over loss tokens.

        EV = 1 - Var[R - V] / Var[R]

    1 is perfect, 0 is no better than a constant, negative is worse (paper: -33.6 for a cold critic).
    NaN when the returns do not vary.
    """
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    if r.numel() < 2:
        return float("nan")
    var_r = r.var(unbiased=False)
    if float(var_r) == 0.0:
        return float("nan")
    return float(1.0 - (r - v).var(unbiased=False) / var_r)


def log_policy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log pi(. | x_<t) over the vocabulary at the sampling temperature: log_softmax(z / tau) (at tau = 1 the
    logits are not divided: one [.., V] pass less, forward and backward)."""
    z = _at_least_float32(logits)
    return torch.log_softmax(z if temperature == 1.0 else z / temperature, dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log pi(x_t | x_<t) of the taken tokens at the sampling temperature: log_softmax(z / tau)[x_t]."""
    return taken_logprobs(log_policy(logits, temperature), tokens)


def taken_logprobs(log_pi: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log_pi [..., V]`` (``log_policy``) at the taken tokens ``[...]``."""
    return log_pi.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 logits in float32 (the softmax's precision); float64 ones stay float64 (the exactness tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))
