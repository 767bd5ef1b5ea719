"""The learner's engine interface: what the learner actor needs of a backend, and the one place that
builds one from ``[learner] backend``.

    engine = open_learner_backend("torch", policy, ppo_cfg, policy_version=0)
    result = engine.step(batch)               # one PPO step on a collated batch -> StepResult
    published = engine.publish(weights_root)  # RUN/weights/vNNNNN (safetensors + sha256) -> PublishedWeights
    engine.save_checkpoint(path, cursor)      # policy, optimiser, counters, RNG and the log cursor, atomically
    cursor = engine.load_checkpoint(path)     # restores all of it; returns the cursor blob

Backends: ``torch`` (``torch_learner.TorchLearner``, in-process, data parallel over gloo) and ``megatron``
(``megatron_learner.MegatronLearner``, megatron-core with RouterReplay). Both produce the same
``StepResult`` and ``PublishedWeights``, so the actor never branches on which one it has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

from t1_actors.backends.torch_learner import PublishedWeights, StepResult, TorchLearner
from t1_actors.policy.model import MoEPolicy
from t1_actors.train import ppo
from t1_actors.train.batch import TrajectoryBatch

Backend = Literal["torch", "megatron"]


class LearnerBackend(Protocol):
    policy_version: int  # the version the engine's weights are

    def step(self, batch: TrajectoryBatch) -> StepResult: ...

    def publish(self, directory: str | Path) -> PublishedWeights: ...

    def save_checkpoint(self, path: str | Path, cursor: bytes = b"") -> Path: ...

    def load_checkpoint(self, path: str | Path) -> bytes: ...


def open_learner_backend(backend: Backend, policy: MoEPolicy, cfg: ppo.PPOConfig, *, policy_version: int = 0,
                         replay: bool = True, fidelity_metrics: bool = True, seed: int = 0,
                         max_tokens_per_microbatch: int | None = None) -> LearnerBackend:
    """The engine ``backend`` names, holding ``policy`` at ``policy_version``. ``max_tokens_per_microbatch``
    bounds the torch backend's forward/backward (megatron sizes its own micro-batches)."""
    if backend == "megatron":
        from t1_actors.backends.megatron_learner import MegatronLearner  # noqa: PLC0415 - optional extra (megatron-core)

        engine = MegatronLearner(policy.config, cfg, policy_version=policy_version, replay=replay,
                                 fidelity_metrics=fidelity_metrics, seed=seed)
        engine.load_policy(policy)
        return engine
    if backend == "torch":
        return TorchLearner(policy, cfg, policy_version=policy_version, replay=replay,
                            fidelity_metrics=fidelity_metrics, seed=seed,
                            max_tokens_per_microbatch=max_tokens_per_microbatch)
    raise ValueError(f"[learner] backend = {backend!r}: use 'torch' or 'megatron'")
