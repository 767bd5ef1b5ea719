"""A padded batch of TITO trajectories for a PPO step, built from the log's records.

Alignment: entry ``t`` of every per-token array belongs to token ``x_t``. The model reads
``x_0 .. x_{T-2}`` (``inputs``) and its output at position ``t - 1`` scores token ``x_t`` (``targets``),
so the learner works on the shifted views ``[:, 1:]``. ``CriticValues.values[t] = V(x_<t)``, the critic's
output at position ``t - 1`` (``values[0]`` = 0, never a loss token). Routing row ``p`` is the experts
used while *reading* token ``x_p``; replaying the ``T - 1`` input positions needs rows ``0 .. T-2``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from schemas import CriticValues, Event, TrajectoryAssembled


@dataclass(frozen=True)
class TrajectoryBatch:
    """Right-padded tensors ``[B, T]`` (routing ``[B, T-1, L, k]``); ``valid`` marks real tokens."""

    token_ids: torch.Tensor        # int64 [B, T]
    valid: torch.Tensor            # bool  [B, T]
    loss_mask: torch.Tensor        # bool  [B, T], False on padding
    sampler_logprobs: torch.Tensor  # float32 [B, T]
    rewards: torch.Tensor          # float32 [B]
    routing: torch.Tensor | None   # int64 [B, T-1, L, k] or None
    old_values: torch.Tensor | None  # float32 [B, T] (V(x_<t)) or None
    trial_ids: tuple[str, ...]
    task_ids: tuple[str, ...] = ()  # the group of each row for a group baseline (rloo); () = unknown

    def __post_init__(self) -> None:
        B, T = self.token_ids.shape
        if T < 2:
            raise ValueError("a trajectory batch needs at least 2 tokens per row (a prompt and an action)")
        for name in ("valid", "loss_mask", "sampler_logprobs", "old_values"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (B, T):
                raise ValueError(f"TrajectoryBatch.{name} has shape {tuple(value.shape)}, expected {(B, T)}")
        if self.routing is not None and tuple(self.routing.shape[:2]) != (B, T - 1):
            raise ValueError(f"TrajectoryBatch.routing has shape {tuple(self.routing.shape)}, expected "
                             f"[B, T-1, layers, k] with B, T-1 = {B}, {T - 1}")
        if bool(self.loss_mask[:, 0].any()):
            raise ValueError("a loss token at position 0 has no state to condition on; TITO must start "
                             "every trajectory with a prompt")

    # shifted views: everything the PPO maths sees is aligned to targets (actions)
    @property
    def inputs(self) -> torch.Tensor:
        return self.token_ids[:, :-1]

    @property
    def targets(self) -> torch.Tensor:
        return self.token_ids[:, 1:]

    @property
    def action_mask(self) -> torch.Tensor:
        return self.loss_mask[:, 1:]

    @property
    def input_valid(self) -> torch.Tensor:
        return self.valid[:, :-1]

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def num_tokens(self) -> int:
        return int(self.valid.sum())

    def __len__(self) -> int:
        return self.token_ids.shape[0]

    @property
    def trials(self) -> tuple[str, ...]:
        """The batch's trials, each once, in row order (a trial that split at a TITO boundary has several rows)."""
        return tuple(dict.fromkeys(self.trial_ids))

    def select(self, rows: Sequence[int] | torch.Tensor) -> TrajectoryBatch:
        """A sub-batch of the given trajectory rows (minibatching, data-parallel sharding)."""
        index = torch.as_tensor(rows, dtype=torch.long)
        pick = lambda x: None if x is None else x.index_select(0, index)  # noqa: E731
        return TrajectoryBatch(
            token_ids=pick(self.token_ids), valid=pick(self.valid), loss_mask=pick(self.loss_mask),
            sampler_logprobs=pick(self.sampler_logprobs), rewards=pick(self.rewards), routing=pick(self.routing),
            old_values=pick(self.old_values), trial_ids=tuple(self.trial_ids[i] for i in index.tolist()),
            task_ids=tuple(self.task_ids[i] for i in index.tolist()) if self.task_ids else ())

    def with_old_values(self, values: torch.Tensor) -> TrajectoryBatch:
        return replace(self, old_values=values.detach().float())

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        move = lambda x: None if x is None else x.to(device)  # noqa: E731
        return replace(self, token_ids=move(self.token_ids), valid=move(self.valid), loss_mask=move(self.loss_mask),
                       sampler_logprobs=move(self.sampler_logprobs), rewards=move(self.rewards),
                       routing=move(self.routing), old_values=move(self.old_values))


def collate(trajectories: Sequence[TrajectoryAssembled],
            values: Mapping[tuple[str, int], CriticValues] | None = None, *,
            num_layers: int, top_k: int, require_routing: bool = True, pad_id: int = 0) -> TrajectoryBatch:
    """Pad trajectory chunks (and their critic values, keyed by ``(trial_id, chunk)``) into a batch.

    ``require_routing``: R3 needs every trajectory's routing record; a missing one is an error that
    names the trial (set it False to train without replay, e.g. a sampler that cannot capture routing).
    """
    if not trajectories:
        raise ValueError("collate() got no trajectories; a PPO step needs at least one")
    B, T = len(trajectories), max(len(t.token_ids) for t in trajectories)
    token_ids = torch.full((B, T), pad_id, dtype=torch.long)
    valid = torch.zeros(B, T, dtype=torch.bool)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    logprobs = torch.zeros(B, T, dtype=torch.float32)
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    has_routing = [t.routing is not None for t in trajectories]
    if require_routing and not all(has_routing):
        missing = [t.trial_id for t, ok in zip(trajectories, has_routing) if not ok]
        raise ValueError(f"trajectories {missing[:5]} have no routing record; R3 replay needs the sampler to "
                         "capture routing (or run the learner with replay disabled)")
    routing = None
    if all(has_routing):
        # padding rows route to experts 0..k-1: valid ids, and padding never reaches a real token (causal)
        routing = torch.arange(top_k, dtype=torch.long).expand(B, T - 1, num_layers, top_k).clone()
    old_values = torch.zeros(B, T, dtype=torch.float32) if values is not None else None
    for row, traj in enumerate(trajectories):
        n = len(traj.token_ids)
        token_ids[row, :n] = torch.from_numpy(traj.token_ids.astype(np.int64))
        valid[row, :n] = True
        loss_mask[row, :n] = torch.from_numpy(traj.loss_mask.astype(bool))
        logprobs[row, :n] = torch.from_numpy(np.array(traj.sampler_logprobs, dtype=np.float32))
        if routing is not None:
            record = traj.routing
            if record.shape[1:] != (num_layers, top_k):
                raise ValueError(f"trajectory {traj.trial_id}: routing record is [T, {record.shape[1]}, "
                                 f"{record.shape[2]}] but the model has {num_layers} MoE layers and k = {top_k}")
            routing[row, : n - 1] = torch.from_numpy(record[: n - 1].astype(np.int64))
        if old_values is not None:
            key = (traj.trial_id, traj.chunk)
            if key not in values:
                raise ValueError(f"no CriticValues for trajectory {traj.trial_id} chunk {traj.chunk}; the critic "
                                 "must value every admitted trajectory before the learner uses it")
            v = values[key].values
            if len(v) != n:
                raise ValueError(f"CriticValues of {traj.trial_id} chunk {traj.chunk} has {len(v)} values for "
                                 f"{n} tokens (one V(x_<t) per token expected)")
            old_values[row, :n] = torch.from_numpy(np.array(v, dtype=np.float32))
    return TrajectoryBatch(token_ids=token_ids, valid=valid, loss_mask=loss_mask, sampler_logprobs=logprobs,
                           rewards=rewards, routing=routing, old_values=old_values,
                           trial_ids=tuple(t.trial_id for t in trajectories),
                           task_ids=tuple(t.task_id for t in trajectories))


def trial_records(events: Iterable[Event]) -> tuple[list[TrajectoryAssembled], dict[tuple[str, int], CriticValues]]:
    """A trial's trajectory chunks (in chunk order) and the newest critic values of each, from its events
    (e.g. ``EventLog.by_trial``)."""
    chunks: dict[int, TrajectoryAssembled] = {}
    values: dict[tuple[str, int], CriticValues] = {}
    for event in events:
        if isinstance(event, TrajectoryAssembled):
            chunks[event.chunk] = event
        elif isinstance(event, CriticValues):
            key = (event.trial_id, event.chunk)
            if key not in values or event.critic_version >= values[key].critic_version:
                values[key] = event
    return [chunks[c] for c in sorted(chunks)], values
