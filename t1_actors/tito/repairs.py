"""The four repair cases of a turn boundary i -> i+1, strongest first, each in one function.

Each takes p_i (``prompt``), a_i (``sampled``) and p_{i+1} (``next_prompt``) and returns the ``Repair`` that
holds, or None; ``repair_boundary`` tries them in order. See the package's docstring for the equations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from t1_actors.tito._records import MAX_PROMPT_DROP, MAX_SAMPLED_DROP, Case, Repair, TitoError, TurnLike


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


def version_split() -> Repair:
    """The policy version changed between two turns that recorded routing: the next turn's prompt was prefilled
    under the new weights and routed differently from the rows the stream holds for the same positions. One
    routing row per position cannot serve both forwards, so the next turn starts a new chunk whose stream is
    p_{i+1} ++ a_{i+1} with p_{i+1}'s own routing: every loss token is replayed with the routing of the forward
    that produced it (R3 exact across versions), at the cost of training the prefix once more."""
    return Repair("version")


REPAIRS: tuple[Case, ...] = ("normalized", "retokenized")


def repair_boundary(prev: TurnLike, next_prompt: np.ndarray, tokenizer: Any,
                    repairs: Sequence[Case] = REPAIRS) -> Repair:
    """The strongest case that holds for the boundary from turn ``prev`` to the prompt ``next_prompt``,
    trying only the repairs in ``repairs`` between strict and split."""
    p, a = prev.prompt_ids, prev.sampled_ids
    return (strict(p, a, next_prompt)
            or ("normalized" in repairs and normalized(p, a, next_prompt))
            or ("retokenized" in repairs and retokenized(p, a, next_prompt, tokenizer)) or split())


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
