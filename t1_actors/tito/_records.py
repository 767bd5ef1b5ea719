"""TITO's records: the turns it reads, the repairs it finds, the chunks it builds; its errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

MAX_PROMPT_DROP = 96  # s: prompt-side tokens the normalized case may drop (template suffixes)
MAX_SAMPLED_DROP = 16  # u: sampled tokens the normalized case may drop (whitespace the harness normalised)

Case = Literal["strict", "normalized", "retokenized", "split", "version"]
CASES: tuple[Case, ...] = ("strict", "normalized", "retokenized", "split", "version")


class TitoError(ValueError):
    """Bad input to TITO assembly; the message names the turn and the field."""


class TitoDriftError(RuntimeError):
    """The loss region of an assembled chunk holds ids the sampler did not sample (a TITO bug)."""


class TurnLike(Protocol):
    """One sampler turn. ``schemas.SamplerTurn`` events, the rollout's ``TurnRecord`` and ``Turn`` all fit."""

    prompt_ids: np.ndarray
    sampled_ids: np.ndarray
    sampler_logprobs: np.ndarray
    routing: np.ndarray | None
    policy_version: int
    token_versions: np.ndarray | None


@dataclass(frozen=True)
class Turn:
    """A turn as a custom harness hands it over.

    ``routing`` has one row per position of ``prompt_ids ++ sampled_ids`` except the last sampled token (never
    fed back): shape ``[len(prompt) + len(sampled) - 1, layers, k]``, or None when not captured.
    ``token_versions`` is the policy version per sampled token when a generation spanned versions.
    """

    prompt_ids: np.ndarray
    sampled_ids: np.ndarray
    sampler_logprobs: np.ndarray
    routing: np.ndarray | None = None
    policy_version: int = 0
    token_versions: np.ndarray | None = None


@dataclass(frozen=True)
class Repair:
    """How one turn boundary i -> i+1 was repaired.

    ``kept`` = k: p_{i+1}[:k] repeats what the stream already holds, p_{i+1}[k:] is new context.
    ``prompt_dropped`` = s and ``sampled_dropped`` = u (normalized); ``span`` = (b, e) (retokenized).
    ``context_mismatch``: stream tokens at this boundary that the next prompt does not hold as ids (s + u when
    normalized, s + len(a_i) when retokenized); later turns train on a context that differs by these.
    ``aligned[j]`` is the position in p_i ++ a_i holding the token p_{i+1}[j] for j < k, -1 where none does
    (the retokenized span); it lets routing rows of either turn land on the right stream position.
    """

    case: Case
    kept: int = 0
    prompt_dropped: int = 0
    sampled_dropped: int = 0
    span: tuple[int, int] | None = None
    aligned: np.ndarray | None = None
    context_mismatch: int = 0


@dataclass(frozen=True)
class LossSpan:
    """Where turn ``turn``'s sampled ids sit in the chunk's stream: T[start : start + len(sampled_ids)]."""

    turn: int
    start: int
    sampled_ids: np.ndarray


@dataclass(frozen=True)
class TrajectoryChunk:
    """One training sequence of a trial. A trial is one chunk unless a boundary had to ``split``, or the policy
    version changed between two turns that recorded routing (``version``: see ``assembly.assemble``).

    ``boundary_cases`` lists, in order, the case of the boundary leading into each of the chunk's turns but
    the trial's first: chunk 0 has ``len(turns) - 1`` entries, a later chunk ``len(turns)``, the first being
    the ``"split"`` or ``"version"`` boundary that opened it. Across a trial's chunks every boundary is recorded
    exactly once.
    ``routing`` has ``len(token_ids) - 1`` rows; ``routing_recorded[j]`` is False for the few rows no sampler
    turn ever computed (see ``_align_routing``).
    """

    index: int
    token_ids: np.ndarray  # int32 [n]
    loss_mask: np.ndarray  # uint8 [n]
    sampler_logprobs: np.ndarray  # float32 [n], 0 outside the loss region
    token_versions: np.ndarray  # int32 [n], 0 outside the loss region
    routing: np.ndarray | None  # [n - 1, layers, k]
    routing_recorded: np.ndarray | None  # bool [n - 1]
    boundary_cases: tuple[Case, ...]
    repairs: tuple[Repair, ...]
    turns: tuple[int, ...]
    loss_spans: tuple[LossSpan, ...]
    reward: float
    policy_version: int
