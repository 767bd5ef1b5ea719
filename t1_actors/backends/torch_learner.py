"""Torch learner backend (the embedded default): PPO with R3 replay on the MoE policy, its critic,
weight publishing, exact-resume checkpoints and torch.distributed data parallel.

    learner = TorchLearner(policy, PPOConfig(), critic=TorchCritic.for_policy(policy, cfg))  # critic optional
    batch = collate(trajectories, critic_values, num_layers=L, top_k=k)    # from the log
    result = learner.step(batch)              # -> StepResult; result.event() is the LearnerStep
    published = learner.publish(weights_dir)  # -> PublishedWeights; .event() / .message()
    learner.save_checkpoint(path, cursor)     # cursor: the log reader's opaque position
    cursor = learner.load_checkpoint(path)    # a restarted learner continues exactly

The critic can live in its own actor instead: ``TorchCritic.values / critic_values`` value trajectories
for the log, ``update(batch)`` applies the clipped value loss after a learner step, ``warmup(batches)``
runs the one-epoch warm-up before any policy step and reports explained variance before and after.
Data parallel: call ``init_data_parallel()`` in each process (torchrun env), give each rank its
``shard(batch)``; ranks start from rank 0's weights (``broadcast_parameters``).
"""

from __future__ import annotations

import fnmatch
import io
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from schemas import CriticValues, CriticWarmup, LearnerStep, PolicyUpdate, TrajectoryAssembled, WeightsPublished

from .. import ppo
from ..policy.model import MoEPolicy
from ..layout import sha256_file, version_dirname  # noqa: F401  (re-exported: megatron_learner, tools)
from ..policy.value import ValueModel
from ._learner_batch import TrajectoryBatch, collate
from ._ppo_step import (Trainable, advantages_and_returns, monte_carlo_returns, run_ppo_step, run_value_updates,
                        world_size)

__all__ = ["TorchLearner", "TorchCritic", "StepResult", "PublishedWeights", "WarmupReport", "TrajectoryBatch",
           "collate", "version_dirname", "init_data_parallel", "shard", "broadcast_parameters", "sha256_file"]

CHECKPOINT_FORMAT = 1


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

@dataclass(frozen=True)
class StepResult:
    step: int
    policy_version: int  # the version this step produced
    trials: tuple[str, ...]
    metrics: dict[str, float]

    def event(self) -> LearnerStep:
        return LearnerStep(step=self.step, policy_version=self.policy_version, trials=list(self.trials),
                           metrics=self.metrics)


@dataclass(frozen=True)
class PublishedWeights:
    """A policy version on disk: a Hugging Face directory whose model.safetensors has this sha256."""

    version: int
    sha256: str
    location: str
    step: int

    def event(self) -> WeightsPublished:
        return WeightsPublished(version=self.version, sha256=self.sha256, location=self.location, step=self.step)

    def message(self) -> PolicyUpdate:
        return PolicyUpdate(version=self.version, location=self.location, sha256=self.sha256)


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




def cursor_tensor(cursor: bytes) -> torch.Tensor:
    """The opaque cursor blob as a uint8 tensor (checkpoints load with ``weights_only=True``)."""
    return torch.frombuffer(bytearray(cursor), dtype=torch.uint8) if cursor else torch.zeros(0, dtype=torch.uint8)


def cursor_bytes(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.cpu().numpy().tobytes())




# ---------------------------------------------------------------------------------------------- critic

class TorchCritic:
    """The value model with its optimiser (critic lr = 30x actor lr by default)."""

    def __init__(self, model: ValueModel, cfg: ppo.PPOConfig, *, version: int = 0, seed: int = 0, group=None):
        self.model, self.cfg, self.version, self.seed, self.group = model, cfg, version, seed, group
        self.optimizer = make_optimizer(model, cfg.effective_critic_lr, cfg)
        self.updates = 0

    @classmethod
    def for_policy(cls, policy: MoEPolicy, cfg: ppo.PPOConfig, **kwargs) -> "TorchCritic":
        model = ValueModel.from_policy(policy) if cfg.value_init_from_policy else ValueModel(policy.config)
        return cls(model, cfg, **kwargs)

    @property
    def trainable(self) -> Trainable:
        return Trainable(self.model, [p for p in self.model.parameters() if p.requires_grad], self.optimizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def values(self, batch: TrajectoryBatch) -> torch.Tensor:
        """V(x_<t) per token ``[B, T]`` (0 at t = 0 and on padding): the critic's output at t - 1."""
        out = torch.zeros(batch.token_ids.shape, dtype=torch.float32, device=batch.token_ids.device)
        out[:, 1:] = self.model(batch.inputs.to(self.device)).to(out.device)
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

class TorchLearner:
    """PPO on the MoE policy; the training forward replays the logged routing (R3) unless ``replay=False``."""

    def __init__(self, policy: MoEPolicy, cfg: ppo.PPOConfig, *, critic: TorchCritic | None = None,
                 policy_version: int = 0, replay: bool = True, fidelity_metrics: bool = True,
                 seed: int = 0, group=None):
        self.policy, self.cfg, self.critic = policy, cfg, critic
        self.replay, self.fidelity_metrics, self.seed, self.group = replay, fidelity_metrics, seed, group
        self.trained_params = freeze_all_but(policy, cfg.actor_params)
        self.optimizer = make_optimizer(policy, cfg.actor_lr, cfg, cfg.policy_optimizer)
        self.policy_version = policy_version
        self.step_count = 0

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    def _forward(self, inputs: torch.Tensor, routing: torch.Tensor | None, capture: bool):
        out = self.policy(inputs, routing_replay=routing, capture_routing=capture)
        return out.logits, out.routing

    @property
    def trainable(self) -> Trainable:
        return Trainable(self._forward, [p for p in self.policy.parameters() if p.requires_grad], self.optimizer)

    def step(self, batch: TrajectoryBatch) -> StepResult:
        """One PPO step (``epochs`` x ``minibatches`` updates) on this rank's share of a batch."""
        batch = batch.to(self.device)
        if batch.old_values is None:
            if self.critic is None:
                raise ValueError("the batch carries no critic values and this learner has no critic; collate "
                                 "with the log's CriticValues or give TorchLearner a critic")
            batch = batch.with_old_values(self.critic.values(batch))
        self.policy.train()
        metrics = run_ppo_step(self.trainable, batch, self.cfg,
                               critic=self.critic.trainable if self.critic is not None else None,
                               replay=self.replay, fidelity=self.fidelity_metrics,
                               seed=self.seed + self.step_count, group=self.group)
        self.step_count += 1
        self.policy_version += 1
        if self.critic is not None:
            self.critic.updates += 1
            self.critic.version += 1
        metrics["actor_lr"] = self.cfg.actor_lr
        return StepResult(step=self.step_count - 1, policy_version=self.policy_version, trials=batch.trials,
                          metrics=metrics)

    def publish(self, directory: str | Path) -> PublishedWeights:
        """Write the current policy as ``<directory>/v<version:05d>`` (HF Qwen3-MoE layout; the campaign's
        ``weights_dir`` naming), atomically: it appears under its final name only once complete."""
        directory = Path(directory)
        final = directory / version_dirname(self.policy_version)
        tmp = directory / f".{version_dirname(self.policy_version)}.tmp-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        self.policy.save(tmp)
        digest = sha256_file(tmp / "model.safetensors")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        return PublishedWeights(version=self.policy_version, sha256=digest, location=str(final),
                                step=max(self.step_count - 1, 0))

    # -- checkpoints: everything a restarted learner needs to continue exactly --------------------------

    def save_checkpoint(self, path: str | Path, cursor: bytes = b"") -> Path:
        """Policy, critic, optimiser states, counters, RNG and the log cursor (opaque bytes), atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "format": CHECKPOINT_FORMAT,
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "policy_version": self.policy_version,
            "step_count": self.step_count,
            "seed": self.seed,  # the minibatch shuffles follow (seed, step): a resumed run must keep it
            "cursor": cursor_tensor(cursor),
            "rng": torch.get_rng_state(),
            "config": self.cfg.model_dump_json(),
        }
        buffer = io.BytesIO()
        torch.save(state, buffer)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(buffer.getvalue())
        tmp.replace(path)
        return path

    def load_checkpoint(self, path: str | Path) -> bytes:
        """Restore a checkpoint written by ``save_checkpoint``; returns the cursor to resume the log from."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"learner checkpoint {path} not found")
        state = torch.load(path, map_location=self.device, weights_only=True)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: checkpoint format {state.get('format')} is not {CHECKPOINT_FORMAT}")
        if (state["critic"] is None) != (self.critic is None):
            raise ValueError(f"{path}: checkpoint {'has' if state['critic'] is not None else 'has no'} critic but this "
                             "learner was built " + ("without" if self.critic is None else "with") + " one")
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.policy_version, self.step_count = int(state["policy_version"]), int(state["step_count"])
        self.seed = int(state["seed"])
        torch.set_rng_state(state["rng"].cpu())
        return cursor_bytes(state["cursor"])


# -------------------------------------------------------------------------------------- data parallel

def init_data_parallel(backend: str | None = None, **kwargs) -> tuple[int, int]:
    """Join the process group from the torchrun environment (MASTER_ADDR/PORT, RANK, WORLD_SIZE):
    gloo on CPU, nccl on GPU. Returns (rank, world size)."""
    if not dist.is_initialized():
        needed = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
        missing = [k for k in needed if k not in os.environ and k not in kwargs]
        if missing and "init_method" not in kwargs:
            raise RuntimeError(f"data parallel needs {missing} in the environment (launch with torchrun)")
        dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"), **kwargs)
    return dist.get_rank(), dist.get_world_size()


def shard(batch: TrajectoryBatch, rank: int | None = None, world: int | None = None) -> TrajectoryBatch:
    """This rank's trajectories: rows rank, rank + world, ..."""
    world = world_size() if world is None else world
    rank = (dist.get_rank() if world > 1 else 0) if rank is None else rank
    rows = list(range(rank, len(batch), world))
    if not rows:
        raise ValueError(f"batch of {len(batch)} trajectories cannot feed {world} data-parallel ranks")
    return batch.select(rows)


def broadcast_parameters(module: torch.nn.Module, src: int = 0, group=None) -> None:
    """Make every rank start from rank ``src``'s weights."""
    if world_size(group) > 1:
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=src, group=group)
