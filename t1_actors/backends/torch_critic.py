"""The value model with its optimiser, for a learner that colocates it or the critic actor that owns it.

    critic = TorchCritic.for_policy(policy, cfg)   # initialised from the policy's trunk ([ppo] value_init_from_policy)
    event = critic.critic_values(trajectory)       # V(x_<t) per token: the CriticValues the learner's GAE reads
    report = critic.warmup(batches)                # one epoch toward the returns before any policy step
    metrics = critic.update(batch)                 # the clipped value loss after a learner step
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from schemas import CriticValues, CriticWarmup, TrajectoryAssembled
from t1_actors.policy.model import MoEPolicy
from t1_actors.policy.value import ValueModel
from t1_actors.train import ppo
from t1_actors.train.batch import TrajectoryBatch, collate
from t1_actors.train.optim import make_optimizer
from t1_actors.train.segments import segment_layout
from t1_actors.train.step import (
    Trainable,
    advantages_and_returns,
    monte_carlo_returns,
    run_value_updates,
    value_estimates,
)

__all__ = ["TorchCritic", "WarmupReport"]


@dataclass(frozen=True)
class WarmupReport:
    epochs: int
    trajectories: int
    explained_variance_before: float
    explained_variance_after: float
    metrics: dict[str, float] = field(default_factory=dict)

    def event(self) -> CriticWarmup:
        return CriticWarmup(epochs=self.epochs, trajectories=self.trajectories,
                            explained_variance_before=self.explained_variance_before,
                            explained_variance_after=self.explained_variance_after, metrics=self.metrics)


class TorchCritic:
    """The value model with its optimiser (critic lr = 30x actor lr by default)."""

    def __init__(self, model: ValueModel, cfg: ppo.PPOConfig, *, version: int = 0, seed: int = 0, group=None,
                 max_tokens_per_microbatch: int | None = None):
        """``max_tokens_per_microbatch``: the most positions one forward/backward holds (None: a batch in one
        pass); a longer chunk runs in segments (``t1_actors.train.segments``), same values and gradient."""
        self.model, self.cfg, self.version, self.seed, self.group = model, cfg, version, seed, group
        self.max_tokens_per_microbatch = max_tokens_per_microbatch
        self.optimizer = make_optimizer(model, cfg.effective_critic_lr, cfg)
        self.updates = 0

    @classmethod
    def for_policy(cls, policy: MoEPolicy, cfg: ppo.PPOConfig, **kwargs) -> TorchCritic:
        model = ValueModel.from_policy(policy) if cfg.value_init_from_policy else ValueModel(policy.config)
        return cls(model, cfg, **kwargs)

    @property
    def trainable(self) -> Trainable:
        return Trainable(self.model, [p for p in self.model.parameters() if p.requires_grad], self.optimizer,
                         max_tokens=self.max_tokens_per_microbatch,
                         kv_layout=segment_layout(self.model))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def values(self, batch: TrajectoryBatch) -> torch.Tensor:
        """V(x_<t) per token ``[B, T]`` (0 at t = 0 and on padding): the critic's output at t - 1."""
        out = torch.zeros(batch.token_ids.shape, dtype=torch.float32, device=batch.token_ids.device)
        out[:, 1:] = value_estimates(self.trainable, batch.to(self.device)).to(out.device)
        return out * batch.valid

    def critic_values(self, trajectory: TrajectoryAssembled) -> CriticValues:
        """The CriticValues event of one trajectory chunk."""
        batch = collate([trajectory], None, num_layers=self.model.config.num_layers, top_k=self.model.config.top_k,
                        require_routing=False)
        values = self.values(batch)[0].cpu().numpy().astype(np.float32)
        return CriticValues(trial_id=trajectory.trial_id, chunk=trajectory.chunk, values=values,
                            critic_version=self.version)

    def update(self, batch: TrajectoryBatch) -> dict[str, float]:
        """After a learner step: the clipped value loss on that step's trajectories, whose old values
        are the ones this critic logged for them (and the learner used for GAE)."""
        batch = batch.to(self.device)
        _, returns = advantages_and_returns(batch, self.cfg)
        metrics = run_value_updates(self.trainable, batch, returns, self.cfg, seed=self.seed + self.updates,
                                    group=self.group)
        self.updates += 1
        self.version += 1
        return metrics

    def explained_variance(self, batches: Iterable[TrajectoryBatch]) -> float:
        """EV of the current critic against the discounted returns, over all loss tokens of ``batches``."""
        values, returns = [], []
        for batch in batches:
            batch = batch.to(self.device)
            m = batch.action_mask
            values.append(self.values(batch)[:, 1:][m])
            returns.append(monte_carlo_returns(batch, self.cfg)[m])
        v, r = torch.cat(values), torch.cat(returns)
        return ppo.explained_variance(v[None], r[None], torch.ones_like(v, dtype=torch.bool)[None])

    def warmup(self, batches: list[TrajectoryBatch], epochs: int | None = None) -> WarmupReport:
        """Fit the critic to offline trajectories before any policy step (plain squared error toward the
        discounted return; there is no V_old yet), reporting explained variance before and after."""
        epochs = self.cfg.critic_warmup_epochs if epochs is None else epochs
        before = self.explained_variance(batches)
        losses = []
        for epoch in range(epochs):
            for i, batch in enumerate(batches):
                batch = batch.to(self.device)
                metrics = run_value_updates(self.trainable, batch, monte_carlo_returns(batch, self.cfg), self.cfg,
                                            clipped=False, epochs=1, seed=self.seed + epoch * 7919 + i,
                                            group=self.group)
                losses.append(metrics["value_loss"])
        after = self.explained_variance(batches)
        self.version += 1
        return WarmupReport(epochs=epochs, trajectories=sum(len(b) for b in batches),
                            explained_variance_before=before, explained_variance_after=after,
                            metrics={"value_loss_first": losses[0] if losses else float("nan"),
                                     "value_loss_last": losses[-1] if losses else float("nan")})

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "version": self.version, "updates": self.updates, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.updates, self.seed = int(state["version"]), int(state["updates"]), int(state["seed"])


# --------------------------------------------------------------------------------------------- learner
