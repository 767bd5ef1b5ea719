"""Assembly: a trial's turns -> TITO chunks (the stream T, its loss mask, logprobs, versions and routing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from schemas import SamplerTurn, TrajectoryAssembled
from t1_actors.tito._records import LossSpan, Repair, TitoDriftError, TitoError, TrajectoryChunk, Turn, TurnLike
from t1_actors.tito.drift import loss_region_drift
from t1_actors.tito.repairs import REPAIRS, Case, repair_boundary, version_split
from t1_actors.tito.turns import expand_turns


def assemble(turns: Sequence[TurnLike], tokenizer: Any, *, reward: float,
             repairs: Sequence[Case] = REPAIRS) -> list[TrajectoryChunk]:
    """Assemble a trial's turns into TITO chunks (one unless a boundary splits), each checked for drift.

    ``turns`` in order, each with the prompt ids the sampler saw, the ids it sampled, their logprobs, routing
    and policy version (``Turn`` or ``schemas.SamplerTurn``). ``tokenizer`` is what ``policy.load_tokenizer``
    returns, an HF ``tokenizers.Tokenizer`` or a transformers fast tokenizer (anything with a
    ``backend_tokenizer``); it is used only for the retokenized case. Every chunk carries ``reward``.

    A boundary where the policy version changed between two turns that recorded routing opens a new chunk
    (case ``version``, ``repairs.version_split``): R3 then replays every loss token with its own forward's routing.

    ``repairs``: the cases tried between strict and split. With none (``()``) every loss token is trained on
    exactly the context the sampler saw, so a PPO ratio against the sampler's logprobs is exact; a repaired
    boundary saves the repeated prefix but later turns see a context that differs from the sampler's by the
    repaired tokens (their logprobs moved by up to ~9 nats in a campaign log: see README).
    """
    allowed, unknown = tuple(repairs), set(repairs) - set(REPAIRS)
    if unknown:
        raise TitoError(f"assemble: unknown repair cases {sorted(unknown)}; choose from {list(REPAIRS)}")
    if not turns:
        raise TitoError("assemble: no turns; a trajectory needs at least one sampler turn")
    if any(isinstance(turn, SamplerTurn) for turn in turns):  # the log's records store only what is new
        turns = expand_turns(turns)
    turns = [_checked(turn, i) for i, turn in enumerate(turns)]
    _check_routing_shapes(turns)
    groups: list[list[int]] = [[0]]
    repairs: list[list[Repair]] = [[]]
    for i in range(1, len(turns)):
        if _reprefilled_under_a_new_version(turns[i - 1], turns[i]):
            repair = version_split()
        else:
            repair = repair_boundary(turns[i - 1], turns[i].prompt_ids, tokenizer, allowed)
        if repair.case in ("split", "version"):
            groups.append([])
            repairs.append([])
        groups[-1].append(i)
        repairs[-1].append(repair)
    chunks = [_build_chunk(c, [turns[i] for i in g], g, r, reward) for c, (g, r) in enumerate(zip(groups, repairs))]
    for chunk in chunks:
        drift = loss_region_drift(chunk)
        if drift:
            raise TitoDriftError(f"chunk {chunk.index}: {drift} loss-region tokens differ from the sampled ids")
    return chunks


def to_event(chunk: TrajectoryChunk, *, trial_id: str, task_id: str) -> TrajectoryAssembled:
    """The ``TrajectoryAssembled`` event recording a chunk (rows no turn recorded carry their fill; see
    ``_align_routing``)."""
    return TrajectoryAssembled(
        trial_id=trial_id, chunk=chunk.index, task_id=task_id, token_ids=chunk.token_ids,
        loss_mask=chunk.loss_mask, sampler_logprobs=chunk.sampler_logprobs, routing=chunk.routing,
        token_versions=chunk.token_versions, boundary_cases=list(chunk.boundary_cases), reward=chunk.reward,
        policy_version=chunk.policy_version, turns=len(chunk.turns),
    )


def _build_chunk(index: int, turns: list[TurnLike], numbers: list[int], repairs: list[Repair],
                 reward: float) -> TrajectoryChunk:
    """Concatenate each turn's new context p_t[k_t:] and sampled ids a_t into the stream."""
    inner = repairs[1:] if index > 0 else repairs  # a later chunk's repairs[0] is the split that opened it
    kept = [0] + [r.kept for r in inner]
    total = sum(len(turn.prompt_ids) - k + len(turn.sampled_ids) for turn, k in zip(turns, kept))
    positions = np.full((len(turns), total), -1, dtype=np.int32)  # [turn, stream position] -> position in p_t ++ a_t
    pieces, mask, logprobs, versions, spans = [], [], [], [], []
    length = 0
    for t, turn in enumerate(turns):
        context, sampled = turn.prompt_ids[kept[t]:], turn.sampled_ids
        new = len(context) + len(sampled)
        if t:
            positions[t, :length] = _carry(positions[t - 1, :length], inner[t - 1], turns[t - 1])
        positions[t, length:length + new] = np.arange(kept[t], kept[t] + new)
        spans.append(LossSpan(numbers[t], length + len(context), sampled))
        pieces += [context, sampled]
        mask += [np.zeros(len(context), np.uint8), np.ones(len(sampled), np.uint8)]
        logprobs += [np.zeros(len(context), np.float32), turn.sampler_logprobs]
        sampled_versions = (turn.token_versions if turn.token_versions is not None
                            else np.full(len(sampled), turn.policy_version))
        versions += [np.zeros(len(context), np.int32), sampled_versions.astype(np.int32)]
        length += new
    loss_versions = np.concatenate(versions)[np.concatenate(mask).astype(bool)]
    routing, recorded = _align_routing(turns, positions, spans, length)
    return TrajectoryChunk(
        index=index,
        token_ids=np.concatenate(pieces).astype(np.int32),
        loss_mask=np.concatenate(mask),
        sampler_logprobs=np.concatenate(logprobs),
        token_versions=np.concatenate(versions),
        routing=routing,
        routing_recorded=recorded,
        boundary_cases=tuple(r.case for r in repairs),
        repairs=tuple(repairs),
        turns=tuple(numbers),
        loss_spans=tuple(spans),
        reward=float(reward),
        policy_version=int(loss_versions.min()) if len(loss_versions) else min(t.policy_version for t in turns),
    )


def _align_routing(turns: list[TurnLike], positions: np.ndarray, spans: list[LossSpan],
                   length: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Routing rows for stream positions 0 .. n-2 (the last token is never fed), chosen as:

    - a sampled token keeps the row of the turn that sampled it (the routing its successors were sampled under);
    - any other position (prompt side, or a turn's last sampled token, which its own turn never fed back) takes
      the row of the *latest* turn that fed it. A prompt position is re-read by every later turn: under a
      prefix-caching sampler (SGLang's radix cache) those rows are one record, under a recomputing one the latest
      turn ran the newest policy version, closest to the learner that replays it.
    - A row no turn computed exists only right after a normalized (u > 0) or retokenized boundary: the last
      sampled token of that turn, which the next prompt does not contain as an id (or where only turns without
      a routing record fed a position). It gets the row before it (``routing_recorded`` False, counted in
      ``tito_metrics``); only later turns read it, and their context already differs from the sampler's there.
    """
    if length < 2 or all(turn.routing is None for turn in turns):
        return None, None
    recorded_by_some_turn = next(turn.routing for turn in turns if turn.routing is not None)
    rows = length - 1
    routing = np.zeros((rows, *recorded_by_some_turn.shape[1:]), dtype=recorded_by_some_turn.dtype)
    filled = np.zeros(rows, dtype=bool)
    for t, (turn, span) in enumerate(zip(turns, spans)):
        if turn.routing is None or len(span.sampled_ids) < 2:
            continue
        stream = np.arange(span.start, span.start + len(span.sampled_ids) - 1)
        routing[stream] = turn.routing[positions[t][stream]]
        filled[stream] = True
    for t in reversed(range(len(turns))):
        if turns[t].routing is None:
            continue
        source = positions[t][:rows]
        take = ~filled & (source >= 0) & (source < len(turns[t].routing))
        routing[take] = turns[t].routing[source[take]]
        filled |= take
    recorded = filled.copy()
    if not filled.any():
        return None, None
    last = np.maximum.accumulate(np.where(filled, np.arange(rows), -1))
    first = int(np.argmax(filled))
    routing[~filled] = routing[np.where(last >= 0, last, first)[~filled]]
    return routing, recorded


def _reprefilled_under_a_new_version(prev: TurnLike, turn: TurnLike) -> bool:
    """Did ``turn``'s forward run other weights than the ones that produced ``prev``'s routing rows? Only turns
    that recorded routing need their own chunk: without a record the learner routes live and every row is its
    own forward's anyway."""
    if prev.routing is None or turn.routing is None:
        return False
    versions = prev.token_versions
    last = int(versions[-1]) if versions is not None and len(versions) else prev.policy_version
    return turn.policy_version != last


def _checked(turn: TurnLike, i: int) -> TurnLike:
    """Validate one turn's arrays; clear errors naming the turn and the field."""
    for name in ("prompt_ids", "sampled_ids", "sampler_logprobs", "policy_version"):
        if not hasattr(turn, name):
            raise TitoError(f"turn {i}: missing field {name!r} (pass t1_actors.tito.Turn or schemas.SamplerTurn)")
    prompt = np.asarray(turn.prompt_ids)
    sampled = np.asarray(turn.sampled_ids)
    logprobs = np.asarray(turn.sampler_logprobs)
    for name, arr in (("prompt_ids", prompt), ("sampled_ids", sampled)):
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TitoError(f"turn {i}: {name} must be a 1-d integer array, got {arr.dtype} of shape {arr.shape}")
    if len(prompt) == 0:
        raise TitoError(f"turn {i}: prompt_ids is empty; the sampler always sees at least one token")
    if logprobs.shape != sampled.shape:
        raise TitoError(f"turn {i}: sampler_logprobs has shape {logprobs.shape}, sampled_ids {sampled.shape} "
                        "(one logprob per sampled token)")
    routing = getattr(turn, "routing", None)
    if routing is not None:
        rows = len(prompt) + len(sampled) - 1
        if routing.ndim != 3 or len(routing) != rows:
            raise TitoError(f"turn {i}: routing has shape {routing.shape}, expected [{rows}, layers, k] "
                            "(one row per prompt and sampled position except the last sampled token)")
    versions = getattr(turn, "token_versions", None)
    if versions is not None and len(versions) != len(sampled):
        raise TitoError(f"turn {i}: token_versions has {len(versions)} entries for {len(sampled)} sampled tokens")
    return Turn(prompt.astype(np.int64), sampled.astype(np.int64), logprobs.astype(np.float32), routing,
                int(turn.policy_version), None if versions is None else np.asarray(versions, dtype=np.int32))


def _check_routing_shapes(turns: list[TurnLike]) -> None:
    """All routing records of a trial share one row shape [layers, k] and dtype."""
    recorded = [(i, t.routing) for i, t in enumerate(turns) if t.routing is not None]
    for i, routing in recorded[1:]:
        first, ref = recorded[0]
        if routing.shape[1:] != ref.shape[1:] or routing.dtype != ref.dtype:
            raise TitoError(f"turn {i}: routing rows are {routing.dtype} {routing.shape[1:]}, turn {first}'s are "
                            f"{ref.dtype} {ref.shape[1:]} (one model shape per trial; record with schemas.routing_dtype)")


def _carry(previous: np.ndarray, repair: Repair, prev: TurnLike) -> np.ndarray:
    """Positions in turn i+1's sequence of the stream positions turn i held (``previous``), via the repair's
    alignment of p_{i+1}[:k] onto p_i ++ a_i; -1 where turn i+1 does not hold them."""
    size = len(prev.prompt_ids) + len(prev.sampled_ids)
    back = np.full(size + 1, -1, dtype=np.int64)  # the extra last slot answers previous == -1 with -1
    held = repair.aligned >= 0
    back[repair.aligned[held]] = np.flatnonzero(held)
    return back[previous]
