"""Torch learner backend (the embedded default): PPO with R3 replay on the MoE policy, its colocated
critic (``torch_critic``), weight publishing, exact-resume checkpoints and torch.distributed data parallel.

    learner = TorchLearner(policy, PPOConfig(), critic=TorchCritic.for_policy(policy, cfg))  # critic optional
    batch = collate(trajectories, critic_values, num_layers=L, top_k=k)    # from the log
    result = learner.step(batch)              # -> StepResult; result.event() is the LearnerStep
    published = learner.publish(weights_dir)  # -> PublishedWeights; .event() / .message()
    learner.save_checkpoint(path, cursor)     # cursor: the log reader's opaque position
    cursor = learner.load_checkpoint(path)    # a restarted learner continues exactly

The critic can live in its own actor instead: ``TorchCritic.values / critic_values`` value trajectories
for the log, ``update(batch)`` applies the clipped value loss after a learner step, ``warmup(batches)``
runs the one-epoch warm-up before any policy step and reports explained variance before and after.
Data parallel: run each process inside ``data_parallel_group()`` (torchrun env), give each rank its
``shard(batch)``; ranks start from rank 0's weights (``broadcast_parameters``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from schemas import LearnerStep, PolicyUpdate, WeightsPublished
from t1_actors.backends.torch_critic import TorchCritic, WarmupReport  # re-exported
from t1_actors.layout import sha256_file, version_dirname  # re-exported: megatron_learner, tools
from t1_actors.policy.model import MoEPolicy
from t1_actors.policy.segment_kv import SegmentKV
from t1_actors.train import ppo
from t1_actors.train.batch import TrajectoryBatch, collate
from t1_actors.train.optim import freeze_all_but, make_optimizer  # re-exported: megatron_learner, warmstart
from t1_actors.train.segments import segment_layout
from t1_actors.train.step import Trainable, run_ppo_step, world_size

__all__ = ["TorchLearner", "TorchCritic", "StepResult", "PublishedWeights", "WarmupReport", "TrajectoryBatch",
           "collate", "version_dirname", "init_data_parallel", "data_parallel_group", "shard", "broadcast_parameters",
           "sha256_file"]

CHECKPOINT_FORMAT = 1


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


def cursor_tensor(cursor: bytes) -> torch.Tensor:
    """The opaque cursor blob as a uint8 tensor (checkpoints load with ``weights_only=True``)."""
    return torch.frombuffer(bytearray(cursor), dtype=torch.uint8) if cursor else torch.zeros(0, dtype=torch.uint8)


def cursor_bytes(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.cpu().numpy().tobytes())




# ---------------------------------------------------------------------------------------------- critic

class TorchLearner:
    """PPO on the MoE policy; the training forward replays the logged routing (R3) unless ``replay=False``."""

    def __init__(self, policy: MoEPolicy, cfg: ppo.PPOConfig, *, critic: TorchCritic | None = None,
                 policy_version: int = 0, replay: bool = True, fidelity_metrics: bool = True,
                 seed: int = 0, group=None, max_tokens_per_microbatch: int | None = None):
        """``max_tokens_per_microbatch``: the most positions one forward/backward holds (None: a minibatch in
        one pass); a longer chunk runs in segments (``t1_actors.train.segments``), same loss and gradient."""
        self.policy, self.cfg, self.critic = policy, cfg, critic
        self.max_tokens_per_microbatch = max_tokens_per_microbatch
        self.replay, self.fidelity_metrics, self.seed, self.group = replay, fidelity_metrics, seed, group
        self.trained_params = freeze_all_but(policy, cfg.actor_params)
        self.optimizer = make_optimizer(policy, cfg.actor_lr, cfg, cfg.policy_optimizer)
        self.policy_version = policy_version
        self.step_count = 0

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    def _forward(self, inputs: torch.Tensor, routing: torch.Tensor | None, capture: bool, cache: SegmentKV | None = None):
        out = self.policy(inputs, routing_replay=routing, capture_routing=capture, past_key_values=cache)
        return out.logits, out.routing

    @property
    def trainable(self) -> Trainable:
        return Trainable(self._forward, [p for p in self.policy.parameters() if p.requires_grad], self.optimizer,
                         max_tokens=self.max_tokens_per_microbatch,
                         kv_layout=segment_layout(self.policy))

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
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)  # straight to the file: an in-memory copy first doubled the cost (200 -> 90 ms)
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


@contextlib.contextmanager
def data_parallel_group(backend: str | None = None, **kwargs) -> Iterator[tuple[int, int]]:
    """``init_data_parallel`` for the block, then leave the group. On a clean exit every rank first waits
    at a barrier: a rank that tears down its gloo pairs while a peer still holds them can abort that peer
    ("terminate called without an active exception", seen on a loaded CI machine). On an error it leaves
    at once, since a dead peer would never reach the barrier."""
    rank, world = init_data_parallel(backend, **kwargs)
    try:
        yield rank, world
    except BaseException:
        dist.destroy_process_group()
        raise
    if world > 1:
        dist.barrier()
    dist.destroy_process_group()


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
