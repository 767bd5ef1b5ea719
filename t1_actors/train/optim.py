"""The optimiser recipe shared by the policy, the critic and SFT's warm start, and the partial-policy switch."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

import torch

from t1_actors.train import ppo


def make_optimizer(module: torch.nn.Module, lr: float, cfg: ppo.PPOConfig,
                   kind: str = "adamw") -> torch.optim.Optimizer:
    """AdamW with the recipe's betas and weight decay on matrices; norms and biases are not decayed
    (decaying a norm's gain toward 0 only fights the normalisation).

    ``kind = "sgd"`` (``[ppo] policy_optimizer``): plain SGD, no momentum, no decay. With the gradient clipped
    to ``max_grad_norm`` every update is at most ``lr * max_grad_norm`` long, along the gradient. Why: on a
    near-deterministic policy most per-weight gradients are noise, which Adam scales up to full-size steps
    (see README, Measured: "The campaign")."""
    if kind == "sgd":
        return torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=lr)
    if kind != "adamw":
        raise ValueError(f"unknown optimizer {kind!r}; use 'adamw' or 'sgd'")
    decay = [p for p in module.parameters() if p.requires_grad and p.ndim >= 2]
    keep = [p for p in module.parameters() if p.requires_grad and p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": keep, "weight_decay": 0.0}],
                             lr=lr, betas=cfg.adam_betas, eps=cfg.adam_eps)


def freeze_all_but(module: torch.nn.Module, patterns: Iterable[str]) -> list[str]:
    """Leave ``requires_grad`` on only the parameters whose names match one of the glob ``patterns``
    (``[ppo] actor_params``); the names RL will update. Why train part of the policy: one batch's
    gradient over all 5.5 M weights is mostly noise on a near-deterministic policy, while a few shared
    tensors (the output norm's gains scale every logit: the policy's confidence) get a clean signal
    from every task (README, Measured: "The campaign"). The config decides every parameter: "*" = all."""
    patterns = list(patterns)
    params = dict(module.named_parameters())
    trained = [name for name in params if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)]
    unmatched = [pattern for pattern in patterns if not any(fnmatch.fnmatchcase(n, pattern) for n in trained)]
    if unmatched:
        names = list(params)
        raise ValueError(f"[ppo] actor_params {unmatched} match no policy tensor; the names are the checkpoint's, "
                         f"e.g. {names[:3]} ... {names[-2:]}")
    for name, param in params.items():
        param.requires_grad_(name in trained)
    return trained


# --------------------------------------------------------------------------------------------- results
