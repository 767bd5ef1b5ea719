"""TITO (token in, token out): train on the exact token ids the sampler produced.

A harness renders the chat so far with the template and tokenizes it; that is p_i, the prompt the sampler saw
at turn i. The sampler answers with ids a_i (plus their logprobs and routing). Next turn the harness renders
the chat again, now containing the *decoded and parsed* text of a_i, and tokenizes it into p_{i+1}. Nothing
guarantees that p_{i+1} contains a_i as ids: BPE may merge across the assistant/template boundary, the harness
may strip whitespace or re-serialise a tool call, the template may drop past reasoning, and a sampled
tokenization need not be the canonical one. Re-tokenizing the transcript for training would then train the
policy on ids it never sampled (drift). TITO instead builds the training stream T from the sampler's own ids:

    T = p_0 ++ a_0 ++ p_1[k_1:] ++ a_1 ++ p_2[k_2:] ++ a_2 ...      loss mask m_j = 1 iff T_j was sampled

where p_{i+1}[:k_{i+1}] is the part of the next prompt that repeats what T already holds. Finding k at each
turn boundary is the *repair*, tried strongest first, each case in one function below:

1. ``strict``       p_i ++ a_i is a prefix of p_{i+1}: the stream is exactly what the sampler saw.
2. ``normalized``   true after dropping s <= 96 tokens from the end of p_i and u <= 16 from the end of a_i
                    (template suffixes, whitespace the harness normalised); the smallest s + u wins.
3. ``retokenized``  the text of a_i equals the text of a span p_{i+1}[b:e], located by offset mapping; the
                    stream keeps the sampled ids a_i in place of that span.
4. ``split``        none of the above: a new chunk starts at p_{i+1}, same trial, same reward.

In 2 and 3, s is where p_i and p_{i+1} part (``_prompt_drops``): a_i is never aligned with older history
that merely repeats it. Under 2 and 3 later turns train on a context that differs from the sampler's by the
repaired tokens (``Repair.context_mismatch``, counted in ``tito_metrics``); the loss tokens never differ. That is the invariant: inside the loss region the trained ids equal
the sampled ids, drift 0.0000 %. ``assemble`` checks it on every chunk and raises ``TitoDriftError`` if broken.

For PPO the context matters too: the ratio pi/pi_sampler of a token trained on another context than the
sampler's is not a ratio of one policy at one state (a campaign log showed logprob gaps up to 8.8 nats after
normalized boundaries). ``assemble(..., repairs=())`` therefore splits wherever a boundary is not strict;
the campaign does this by default (``[campaign] tito_repairs``), paying for a repeated prompt per split.

Routing (R3) is aligned to T as well; see ``_align_routing`` for which turn's row each position takes.

    chunks = tito.assemble([tito.Turn(p, a, logprobs, routing, version), ...], tokenizer, reward=r)
    events = [tito.to_event(chunk, trial_id=..., task_id=...) for chunk in chunks]   # TrajectoryAssembled
    metrics = tito.tito_metrics(chunks)   # case counts, retokenized_share, drift_tokens (0), ...
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Sequence

import numpy as np

from schemas import TrajectoryAssembled

MAX_PROMPT_DROP = 96  # s: prompt-side tokens the normalized case may drop (template suffixes)
MAX_SAMPLED_DROP = 16  # u: sampled tokens the normalized case may drop (whitespace the harness normalised)

Case = Literal["strict", "normalized", "retokenized", "split"]
CASES: tuple[Case, ...] = ("strict", "normalized", "retokenized", "split")


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
    """One training sequence of a trial. A trial is one chunk unless a boundary had to ``split``.

    ``boundary_cases`` lists, in order, the case of the boundary leading into each of the chunk's turns but
    the trial's first: chunk 0 has ``len(turns) - 1`` entries, a later chunk ``len(turns)``, the first being
    the ``"split"`` that opened it. Across a trial's chunks every boundary is recorded exactly once.
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


# ----------------------------------------------------------------------------------------------------------
# The four repair cases, strongest first.


def strict(prompt: np.ndarray, sampled: np.ndarray, next_prompt: np.ndarray) -> Repair | None:
    """Case 1, strict: p_i ++ a_i is a prefix of p_{i+1}; the new context is p_{i+1}[len(p_i) + len(a_i):].

    (The issue writes "T_i is a prefix of p_{i+1}"; T_i is read as the sampler's view after turn i, p_i ++ a_i,
    which equals the stream while every earlier boundary was strict.)
    """
    seen = np.concatenate([prompt, sampled])
    if len(seen) > len(next_prompt) or not np.array_equal(next_prompt[: len(seen)], seen):
        return None
    return Repair("strict", kept=len(seen), aligned=np.arange(len(seen), dtype=np.int64))


def normalized(prompt: np.ndarray, sampled: np.ndarray, next_prompt: np.ndarray) -> Repair | None:
    """Case 2, normalized: min s + u over s <= 96, u <= 16 such that
    p_i[:len(p_i) - s] ++ a_i[:len(a_i) - u] is a prefix of p_{i+1}; the new context is what follows it.

    s ranges over ``_prompt_drops`` (where the two prompts part); ties go to the smaller s. The s + u dropped
    tokens stay in the stream (a_i's context was p_i and all of a_i is trained), so later turns see them as
    extra context.
    """
    n_prompt, n_sampled = len(prompt), len(sampled)
    best: tuple[int, int] | None = None
    for s in _prompt_drops(prompt, next_prompt):
        start = n_prompt - s
        u = n_sampled - _common_prefix(sampled, next_prompt[start:])
        if u <= MAX_SAMPLED_DROP and s + u > 0 and (best is None or s + u < sum(best)):
            best = (s, u)
    if best is None:
        return None
    s, u = best
    aligned = np.concatenate([np.arange(n_prompt - s), n_prompt + np.arange(n_sampled - u)]).astype(np.int64)
    return Repair("normalized", kept=len(aligned), prompt_dropped=s, sampled_dropped=u, aligned=aligned,
                  context_mismatch=s + u)


def retokenized(prompt: np.ndarray, sampled: np.ndarray, next_prompt: np.ndarray, tokenizer: Any) -> Repair | None:
    r"""Case 3, retokenized: for the smallest s in ``_prompt_drops`` (s <= 96, p_{i+1}[:b] = p_i[:b] with
    b = len(p_i) - s), the decoded text of a_i equals the decoded text of a span p_{i+1}[b:e], where e is the
    token of p_{i+1} that starts where that text ends in its offset mapping. The new context is p_{i+1}[e:];
    the stream keeps the sampled ids a_i.

    The s prompt-side tokens are either dropped (a template suffix, as in ``normalized``) or re-tokenized with
    a_i: when BPE merged the template's last token with the assistant's first ("assistant\n" + "\n..." ->
    "\n\n"), no span starts where a_i's text starts, and the text of p_i[b:] ++ a_i is matched instead.
    """
    drops = _prompt_drops(prompt, next_prompt)
    sampled_text = _decode(tokenizer, sampled)
    if not drops or not sampled_text:
        return None
    n_prompt = len(prompt)
    starts = _token_starts(tokenizer, next_prompt, before=n_prompt - drops[-1])
    if starts is None:
        return None
    for s in drops:
        b = n_prompt - s
        if b not in starts.char_of:
            continue
        merged_text = _decode(tokenizer, np.concatenate([prompt[b:], sampled])) if s else sampled_text
        for text in dict.fromkeys((sampled_text, merged_text)):  # dropped tail first, then merged tail
            e = starts.token_at.get(starts.char_of[b] + len(text))
            if e is not None and e > b and _decode(tokenizer, next_prompt[b:e]) == text:
                aligned = np.concatenate([np.arange(b), np.full(e - b, -1)]).astype(np.int64)
                return Repair("retokenized", kept=e, prompt_dropped=s, span=(b, e), aligned=aligned,
                              context_mismatch=s + len(sampled))
    return None


def split() -> Repair:
    """Case 4, split: no repair holds; the next turn starts a new chunk (same trial, same reward) whose
    stream is p_{i+1} ++ a_{i+1}, exactly what the sampler saw."""
    return Repair("split")


REPAIRS: tuple[Case, ...] = ("normalized", "retokenized")


def repair_boundary(prev: TurnLike, next_prompt: np.ndarray, tokenizer: Any,
                    repairs: Sequence[Case] = REPAIRS) -> Repair:
    """The strongest case that holds for the boundary from turn ``prev`` to the prompt ``next_prompt``,
    trying only the repairs in ``repairs`` between strict and split."""
    p, a = prev.prompt_ids, prev.sampled_ids
    return (strict(p, a, next_prompt)
            or ("normalized" in repairs and normalized(p, a, next_prompt))
            or ("retokenized" in repairs and retokenized(p, a, next_prompt, tokenizer)) or split())


# ----------------------------------------------------------------------------------------------------------
# Assembly.


def assemble(turns: Sequence[TurnLike], tokenizer: Any, *, reward: float,
             repairs: Sequence[Case] = REPAIRS) -> list[TrajectoryChunk]:
    """Assemble a trial's turns into TITO chunks (one unless a boundary splits), each checked for drift.

    ``turns`` in order, each with the prompt ids the sampler saw, the ids it sampled, their logprobs, routing
    and policy version (``Turn`` or ``schemas.SamplerTurn``). ``tokenizer`` is what ``policy.load_tokenizer``
    returns, an HF ``tokenizers.Tokenizer`` or a transformers fast tokenizer (anything with a
    ``backend_tokenizer``); it is used only for the retokenized case. Every chunk carries ``reward``.

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
    turns = [_checked(turn, i) for i, turn in enumerate(turns)]
    _check_routing_shapes(turns)
    groups: list[list[int]] = [[0]]
    repairs: list[list[Repair]] = [[]]
    for i in range(1, len(turns)):
        repair = repair_boundary(turns[i - 1], turns[i].prompt_ids, tokenizer, allowed)
        if repair.case == "split":
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


def loss_region_drift(chunk: TrajectoryChunk) -> int:
    """Tokens where the stream breaks the invariant: a loss-region id differs from the sampled id, or the loss
    mask disagrees with where the sampled ids sit. 0 for every chunk ``assemble`` returns."""
    expected = np.zeros(len(chunk.token_ids), dtype=bool)
    drift = 0
    for span in chunk.loss_spans:
        end = span.start + len(span.sampled_ids)
        trained = chunk.token_ids[span.start:end]
        drift += int(np.count_nonzero(trained != span.sampled_ids)) + len(span.sampled_ids) - len(trained)
        expected[span.start:end] = True
    return drift + int(np.count_nonzero(expected != chunk.loss_mask.astype(bool)))


def to_event(chunk: TrajectoryChunk, *, trial_id: str, task_id: str) -> TrajectoryAssembled:
    """The ``TrajectoryAssembled`` event recording a chunk (rows no turn recorded carry their fill; see
    ``_align_routing``)."""
    return TrajectoryAssembled(
        trial_id=trial_id, chunk=chunk.index, task_id=task_id, token_ids=chunk.token_ids,
        loss_mask=chunk.loss_mask, sampler_logprobs=chunk.sampler_logprobs, routing=chunk.routing,
        token_versions=chunk.token_versions, boundary_cases=list(chunk.boundary_cases), reward=chunk.reward,
        policy_version=chunk.policy_version, turns=len(chunk.turns),
    )


def tito_metrics(chunks: Sequence[TrajectoryChunk]) -> dict[str, float]:
    """Run metrics over chunks: tokens, loss tokens, boundary cases, the share of loss tokens whose turn was
    repaired by retokenization (the paper's residual 2.6 %), drift (must be 0) and unrecorded routing rows."""
    cases = Counter(case for chunk in chunks for case in chunk.boundary_cases)
    loss = sum(int(chunk.loss_mask.sum()) for chunk in chunks)
    retok = sum(_retokenized_loss_tokens(chunk) for chunk in chunks)
    drift = sum(loss_region_drift(chunk) for chunk in chunks)
    return {
        "chunks": len(chunks),
        "turns": sum(len(chunk.turns) for chunk in chunks),
        "tokens": sum(len(chunk.token_ids) for chunk in chunks),
        "loss_tokens": loss,
        **{f"boundary_{case}": cases[case] for case in CASES},
        "retokenized_loss_tokens": retok,
        "retokenized_share": retok / loss if loss else 0.0,
        "context_mismatch_tokens": sum(r.context_mismatch for chunk in chunks for r in chunk.repairs),
        "drift_tokens": drift,
        "drift_rate": drift / loss if loss else 0.0,
        "routing_rows_unrecorded": sum(int((~chunk.routing_recorded).sum()) for chunk in chunks
                                       if chunk.routing_recorded is not None),
    }


# ----------------------------------------------------------------------------------------------------------
# Private helpers.


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
        sampled_versions = turn.token_versions if turn.token_versions is not None else np.full(len(sampled), turn.policy_version)
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


def _retokenized_loss_tokens(chunk: TrajectoryChunk) -> int:
    """Loss tokens of turns whose outgoing boundary was repaired by retokenization (their ids differ from the
    ids the next prompt holds for the same text)."""
    offset = 1 if chunk.index > 0 else 0  # the chunk's incoming split
    return sum(len(chunk.loss_spans[t].sampled_ids) for t in range(len(chunk.turns) - 1)
               if chunk.boundary_cases[t + offset] == "retokenized")


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


@dataclass(frozen=True)
class _TokenStarts:
    char_of: dict[int, int]  # token index -> char offset where it starts (tokens starting on a char boundary)
    token_at: dict[int, int]  # the inverse, plus the end of the text -> number of tokens


def _token_starts(tokenizer: Any, ids: np.ndarray, before: int) -> _TokenStarts | None:
    """Offset mapping of ``ids`` from the last added token (<|im_start|> ...) at or before index ``before``:
    re-encode the text of that tail and read the offsets, when that reproduces the ids (it does for a prompt
    the harness tokenized from rendered text; added tokens split the text, so the tail encodes on its own).
    Char offsets are relative to the tail's start. None when the ids cannot be reproduced."""
    backend = _backend(tokenizer)
    added = np.fromiter(backend.get_added_tokens_decoder(), dtype=np.int64)
    marks = np.flatnonzero(np.isin(ids[:before + 1], added))
    for since in dict.fromkeys((int(marks[-1]) if len(marks) else 0, 0)):  # the tail, else the whole prompt
        tail = [int(x) for x in ids[since:]]
        text = backend.decode(tail, skip_special_tokens=False)
        encoding = backend.encode(text, add_special_tokens=False)
        if encoding.ids != tail:
            continue
        char_of, token_at, reach = {}, {}, 0
        for j, (start, end) in enumerate(encoding.offsets):
            if start >= reach and start not in token_at:  # a token sharing a character with its predecessor is no boundary
                char_of[since + j], token_at[start] = start, since + j
            reach = max(reach, end)
        char_of[len(ids)], token_at[len(text)] = len(text), len(ids)
        return _TokenStarts(char_of, token_at)
    return None


def _decode(tokenizer: Any, ids: np.ndarray) -> str:
    return _backend(tokenizer).decode([int(x) for x in ids], skip_special_tokens=False)


def _backend(tokenizer: Any) -> Any:
    """The HF ``tokenizers.Tokenizer`` behind ``tokenizer`` (transformers fast tokenizers wrap one)."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not (hasattr(backend, "encode") and hasattr(backend, "decode")):
        raise TitoError(f"tokenizer {type(tokenizer).__name__} is not an HF tokenizers.Tokenizer "
                        "(load one with t1_actors.policy.load_tokenizer)")
    return backend


def _prompt_drops(prompt: np.ndarray, next_prompt: np.ndarray) -> range:
    """The values of s (prompt-side tokens dropped) cases 2 and 3 may try: s = len(p_i) - lcp(p_i, p_{i+1}),
    the prompt suffix the next render does not repeat (at most 96), or one more, when the sampled ids begin
    with the token the prompt ended on (a leading newline the harness stripped). a_i is laid where the two
    prompts part: laying it further back would align it with older history that merely repeats it (agent
    turns repeat the tool-call preamble), which is no repair but a spurious match."""
    suffix = len(prompt) - _common_prefix(prompt, next_prompt)
    return range(suffix, min(suffix + 1, MAX_PROMPT_DROP, len(prompt)) + 1)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _carry(previous: np.ndarray, repair: Repair, prev: TurnLike) -> np.ndarray:
    """Positions in turn i+1's sequence of the stream positions turn i held (``previous``), via the repair's
    alignment of p_{i+1}[:k] onto p_i ++ a_i; -1 where turn i+1 does not hold them."""
    size = len(prev.prompt_ids) + len(prev.sampled_ids)
    back = np.full(size + 1, -1, dtype=np.int64)  # the extra last slot answers previous == -1 with -1
    held = repair.aligned >= 0
    back[repair.aligned[held]] = np.flatnonzero(held)
    return back[previous]
