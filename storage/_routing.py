"""Routing records as sets: each (token, layer) top-k selection stored as its combinatorial number.

R3 uses a routing record as a *set*: the learner takes which experts a token went to from the
record and the gate weights from its live logits, so the order of the k ids inside one selection
carries nothing the learner uses. A set of k distinct ids below E has C(E, k) values, so it fits in
``bits = ceil(log2 C(E, k))`` bits (49 at top-8 of 256, against 64 for eight one-byte ids). The
number is the combinadic of the ids sorted ascending, ``N = sum_i C(s_i, i)`` (i = 1..k), a
bijection between such sets and ``[0, C(E, k))``.

Row layout (one row per token, so rows still address tokens): the low ``bits // 8`` bytes of each
layer's number, little endian, layer after layer; then the remaining ``bits % 8`` high bits of every
layer, bit-packed (little-endian bit order) into whole bytes. At 48 x top-8 of 256: 288 + 6 = 294
bytes per token (the bound for uniform routing is 291). Reading returns the ids **sorted ascending
within each set**: that is the stored form; anything that compares routing must compare sets.

Only records whose every selection holds k distinct ids are sets; ``encode`` returns None for any
other record (the writer then stores it id by id, exactly as given). Everything is vectorized numpy:
a sorting network over the k columns, k table gathers and adds to encode; to decode, per id a
lookup on the number's float exponent and top mantissa bits, finished by exact integer steps.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.base import Record, routing_dtype

CODEC_ATTR = "t1_routing_codec"  # attribute of the array that holds set-encoded routing rows
CODEC_NAME = "combinadic-v1"
_NETWORK_MAX_K = 32  # above this np.sort (a comparator network grows as k log^2 k)


@functools.cache
def _sorting_network(n: int) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort comparators for ``n`` inputs (pairs (i, j), i < j: min to i).
    Built for the next power of two; comparators that touch a slot >= n are dropped, which is
    exact because those slots would hold +infinity and never move."""
    size = 1 << max(0, (n - 1).bit_length())
    pairs = []
    p = 1
    while p < size:
        k = p
        while k >= 1:
            for j in range(k % p, size - k, 2 * k):
                for i in range(min(k, size - j - k)):
                    a, b = i + j, i + j + k
                    if a // (2 * p) == b // (2 * p) and b < n:
                        pairs.append((a, b))
            k //= 2
        p *= 2
    return tuple(pairs)


def sort_columns(columns: np.ndarray) -> np.ndarray:
    """``columns [k, M]`` sorted along the first axis (each of the M sets ascending), in place when
    a comparator network is used; returns the sorted array."""
    k = columns.shape[0]
    if k > _NETWORK_MAX_K:
        return np.sort(columns, axis=0)
    low = np.empty_like(columns[0])
    for i, j in _sorting_network(k):
        np.minimum(columns[i], columns[j], out=low)
        np.maximum(columns[i], columns[j], out=columns[j])
        columns[i] = low
    return columns


@dataclass(frozen=True)
class SetCodec:
    """The combinadic codec of one routing shape: ``layers`` selections of ``k`` of ``num_experts``."""

    layers: int
    k: int
    num_experts: int

    @staticmethod
    def fits(k: int, num_experts: int) -> bool:
        """The set encoding applies: more than one possible set, and every number fits in 64 bits."""
        count = math.comb(num_experts, k)
        return 1 < count <= 1 << 64

    @functools.cached_property
    def bits(self) -> int:
        return (math.comb(self.num_experts, self.k) - 1).bit_length()

    @functools.cached_property
    def row_bytes(self) -> int:
        whole, rest = divmod(self.bits, 8)
        return self.layers * whole + -(-self.layers * rest // 8)

    @functools.cached_property
    def _binomials(self) -> np.ndarray:
        """``[k + 1, E]`` uint64: row i holds C(c, i) for c = 0..E-1 (non-decreasing in c)."""
        return np.array([[math.comb(c, i) for c in range(self.num_experts)] for i in range(self.k + 1)],
                        dtype=np.uint64)

    def to_attrs(self) -> dict[str, Any]:
        return {"name": CODEC_NAME, "layers": self.layers, "k": self.k, "num_experts": self.num_experts,
                "bits": self.bits, "row_bytes": self.row_bytes}

    @classmethod
    def from_attrs(cls, attrs: object) -> SetCodec:
        """The codec an array's attributes name; ValueError for another codec or inconsistent numbers."""
        if not isinstance(attrs, dict) or attrs.get("name") != CODEC_NAME:
            raise ValueError(f"routing codec {attrs!r} is not {CODEC_NAME!r} (written by a newer t1?)")
        codec = cls(int(attrs["layers"]), int(attrs["k"]), int(attrs["num_experts"]))
        if codec.bits != attrs.get("bits") or codec.row_bytes != attrs.get("row_bytes"):
            raise ValueError(f"routing codec attributes {attrs!r} are inconsistent")
        return codec

    # -- encoding ------------------------------------------------------------------------------

    def encode(self, routing: np.ndarray) -> np.ndarray | None:
        """``routing [T, layers, k]`` (ids below E, range-checked by the caller) -> uint8 rows
        ``[T, row_bytes]``; None if some selection repeats an id (not a set: store it as ids)."""
        tokens = routing.shape[0]
        # [k, T * layers]: one column per slot; a copy, as sort_columns sorts in place (and an empty or
        # already-transposed routing would otherwise be the caller's, possibly read-only, array)
        columns = routing.reshape(-1, self.k).T.copy()
        columns = sort_columns(columns)
        if self.k > 1 and (columns[1:] == columns[:-1]).any():
            return None
        table = self._binomials
        number = np.take(table[1], columns[0].astype(np.intp), mode="clip")
        for i in range(1, self.k):
            number += np.take(table[i + 1], columns[i].astype(np.intp), mode="clip")
        return self._pack(number.reshape(tokens, self.layers))

    def _pack(self, numbers: np.ndarray) -> np.ndarray:
        tokens = numbers.shape[0]
        whole, rest = divmod(self.bits, 8)
        as_bytes = numbers.astype("<u8", copy=False).view(np.uint8).reshape(tokens, self.layers, 8)
        rows = np.empty((tokens, self.row_bytes), np.uint8)
        rows[:, :self.layers * whole].reshape(tokens, self.layers, whole)[...] = as_bytes[..., :whole]
        if rest:  # the low ``rest`` bits of byte ``whole`` of every number, bit-packed per token
            bits = np.unpackbits(as_bytes[..., whole].reshape(-1), bitorder="little").reshape(tokens, self.layers, 8)
            rows[:, self.layers * whole:] = np.packbits(bits[..., :rest].reshape(tokens, self.layers * rest),
                                                        axis=-1, bitorder="little")
        return rows

    # -- decoding ------------------------------------------------------------------------------

    def decode(self, rows: np.ndarray) -> np.ndarray:
        """uint8 rows ``[T, row_bytes]`` -> ``[T, layers, k]`` expert ids (``routing_dtype(E)``),
        each selection sorted ascending. Numbers out of range (only a damaged row, which the
        checksums catch first) decode to some ids below E, never to an error."""
        tokens = rows.shape[0]
        numbers = self._unpack(rows).reshape(-1)
        out = np.empty((tokens * self.layers, self.k), routing_dtype(self.num_experts))
        for i in range(self.k, 1, -1):  # greedy: the largest id c with C(c, i) <= N, then N -= C(c, i)
            ids = self._largest_below(i, numbers)
            out[:, i - 1] = ids
            numbers -= np.take(self._binomials[i], ids, mode="clip")
        out[:, 0] = np.minimum(numbers, self.num_experts - 1)  # C(c, 1) = c
        return out.reshape(tokens, self.layers, self.k)

    def _largest_below(self, i: int, numbers: np.ndarray) -> np.ndarray:
        """For each N: the largest c < E with C(c, i) <= N. A table indexed by the top bits of
        float64(N) (exponent and ``_lookup_bits`` of mantissa) gives a c that never overshoots;
        exact integer steps up then finish (one or two: a bucket spans at most a few entries)."""
        lookup, mantissa_bits = self._lookups[i]
        signed = numbers.view(np.int64) if self.bits < 64 else numbers  # int64 -> float64 converts faster
        bucket = signed.astype(np.float64).view(np.int64) >> (52 - mantissa_bits)
        bucket -= (1023 << mantissa_bits) - 1  # N = 1 -> bucket 1; N = 0 (all bits zero) goes negative
        np.clip(bucket, 0, len(lookup) - 1, out=bucket)
        ids = np.take(lookup, bucket)
        column = self._padded[i]  # C(E, i) past the end: larger than every N, so ids stop at E - 1
        while True:
            step = np.take(column, ids + 1) <= numbers
            if not step.any():
                return ids
            ids += step

    @functools.cached_property
    def _padded(self) -> np.ndarray:
        """``_binomials`` with one more column, C(E, i) (saturated to 2^64 - 1)."""
        last = np.array([[min(math.comb(self.num_experts, i), (1 << 64) - 1)] for i in range(self.k + 1)], np.uint64)
        return np.concatenate([self._binomials, last], axis=1)

    @functools.cached_property
    def _lookups(self) -> dict[int, tuple[np.ndarray, int]]:
        """Level i -> (table, mantissa bits): table[b] = the largest c with C(c, i) below the lower
        end of float bucket b, with a margin that covers float64 rounding (so never too large)."""
        out = {}
        for i in range(2, self.k + 1):
            column = self._binomials[i]
            mantissa_bits = min(12, max(1, (self.num_experts // i).bit_length() + 1))
            top = int(column[-1]).bit_length() + 1  # exponents 0 .. top - 1 cover every N < 2^top
            buckets = np.arange(top << mantissa_bits, dtype=np.float64)
            low_ends = np.ldexp(1.0 + (buckets % (1 << mantissa_bits)) / (1 << mantissa_bits),
                                (buckets // (1 << mantissa_bits)).astype(np.int64))
            safe = low_ends * (1.0 - 2.0 ** -40)
            hints = np.searchsorted(column.astype(np.float64), safe, side="right") - 1
            table = np.empty(len(buckets) + 1, np.intp)
            table[0] = min(i - 1, self.num_experts - 1)  # N = 0: C(c, i) = 0 for c < i
            table[1:] = np.clip(hints, 0, self.num_experts - 1)
            out[i] = (table, mantissa_bits)
        return out

    def _unpack(self, rows: np.ndarray) -> np.ndarray:
        tokens = rows.shape[0]
        whole, rest = divmod(self.bits, 8)
        as_bytes = np.zeros((tokens, self.layers, 8), np.uint8)
        as_bytes[..., :whole] = rows[:, :self.layers * whole].reshape(tokens, self.layers, whole)
        if rest:
            bits = np.zeros((tokens, self.layers, 8), np.uint8)
            bits[..., :rest] = np.unpackbits(rows[:, self.layers * whole:], axis=-1, count=self.layers * rest,
                                             bitorder="little").reshape(tokens, self.layers, rest)
            as_bytes[..., whole] = np.packbits(bits.reshape(-1), bitorder="little").reshape(tokens, self.layers)
        return as_bytes.view("<u8").reshape(tokens, self.layers).astype(np.uint64, copy=False)


def stored_routing(routing: np.ndarray, num_experts: int | None = None) -> np.ndarray:
    """What a log that set-encodes routing (the default) returns for ``routing [..., k]``: each
    selection sorted ascending. Returned as given: a record in which some selection repeats an id
    (not a set, so stored id by id), and one whose shape the set encoding does not cover
    (``SetCodec.fits(k, num_experts)``, when ``num_experts`` is given)."""
    k = routing.shape[-1]
    if num_experts is not None and not SetCodec.fits(k, num_experts):
        return routing
    ordered = np.sort(routing, axis=-1)
    if k > 1 and (ordered[..., 1:] == ordered[..., :-1]).any():
        return routing
    return ordered


def as_stored(record: Record, num_experts: int | None = None) -> Record:
    """``record`` as a set-encoding log reads it back: its routing arrays (the rank-3 payloads) in
    ``stored_routing`` form, everything else unchanged. For comparing what was appended with what
    is read: ``log.get(event_id) == as_stored(event)``."""
    updates = {name: stored_routing(value, num_experts) for name, spec in type(record).array_fields().items()
               if spec.ndim == 3 and (value := getattr(record, name)) is not None}
    return type(record)(**{**record.__dict__, **updates}) if updates else record
