"""Byte-level alignment of a TITO token stream with its re-rendered (re-tokenized) twin.

Without TITO a trainer re-tokenizes the conversation's text; the sampled ids may then be
segmented differently. To compare the two streams we give every token its byte span in the
decoded text and cut the text at the byte offsets where *both* streams have a token boundary.
Each piece (a "segment") holds one or more tokens of each stream; a segment whose two sides are
one identical token is aligned token for token, any other segment is where the streams drifted.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from tokenizers import Tokenizer


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the alphabet byte-level BPE spells raw bytes with."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    codes, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, codes)}


class UnknownTokenError(ValueError):
    """A token id the tokenizer does not have (the model's vocabulary is larger than the tokenizer's)."""


def token_bytes(tokenizer: Tokenizer, ids: np.ndarray) -> list[bytes]:
    """The bytes each token stands for (special tokens: their text)."""
    added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
    if type(tokenizer.decoder).__name__ == "ByteLevel":
        table = _unicode_to_byte()
        out = []
        for i in ids.tolist():
            if i in added:
                out.append(added[i].encode())
                continue
            piece = tokenizer.id_to_token(i)
            if piece is None:
                raise UnknownTokenError(f"token id {i} is not in the tokenizer's vocabulary "
                                        f"({tokenizer.get_vocab_size()} ids)")
            out.append(bytes(table[ch] for ch in piece))
        return out
    # any other tokenizer: grow the decoded prefix one token at a time
    out, previous = [], b""
    for j in range(len(ids)):
        current = tokenizer.decode(ids[: j + 1].tolist(), skip_special_tokens=False).encode()
        out.append(current[len(previous):] if current.startswith(previous) else current)
        previous = current
    return out


def spans(pieces: list[bytes]) -> np.ndarray:
    """Byte span [start, end) of each token, shape [n, 2]."""
    ends = np.cumsum([len(p) for p in pieces], dtype=np.int64)
    starts = np.concatenate([[0], ends[:-1]]) if len(ends) else np.zeros(0, np.int64)
    return np.stack([starts, ends], axis=1) if len(ends) else np.zeros((0, 2), np.int64)


@dataclass(frozen=True)
class Rerendered:
    """The re-rendered twin of a token stream and how the two line up."""

    ids: np.ndarray  # int32 re-tokenized ids
    sampled_spans: np.ndarray  # [n, 2] byte spans of the original tokens
    rerendered_spans: np.ndarray  # [m, 2] byte spans of the re-tokenized ones
    segments: list[tuple[list[int], list[int]]]  # (original token indices, re-rendered indices) per segment
    decodable: bool  # False when the sampled bytes are not valid UTF-8 (text cannot be re-rendered)


def rerender(tokenizer: Tokenizer, ids: np.ndarray) -> Rerendered:
    """Decode ``ids`` to text, re-tokenize it, and cut both streams into common-boundary segments."""
    pieces = token_bytes(tokenizer, ids)
    raw = b"".join(pieces)
    try:
        text = raw.decode("utf-8")
        decodable = True
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        decodable = False
    new_ids = np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int32)
    a, b = spans(pieces), spans(token_bytes(tokenizer, new_ids))
    if decodable and (b[-1, 1] if len(b) else 0) != len(raw):
        decodable = False  # the tokenizer normalised the text: bytes differ, the streams cannot line up
    return Rerendered(new_ids, a, b, _segments(a, b) if decodable else [], decodable)


def _segments(a: np.ndarray, b: np.ndarray) -> list[tuple[list[int], list[int]]]:
    """Group tokens of two segmentations of the same bytes by their common boundaries."""
    segments, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        seg_a, seg_b = [i], [j]
        end_a, end_b = a[i, 1], b[j, 1]
        while end_a != end_b:
            if end_a < end_b:
                i += 1
                seg_a.append(i)
                end_a = a[i, 1]
            else:
                j += 1
                seg_b.append(j)
                end_b = b[j, 1]
        segments.append((seg_a, seg_b))
        i, j = i + 1, j + 1
    return segments
