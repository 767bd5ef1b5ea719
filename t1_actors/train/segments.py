"""Memory bounded by a token budget: a minibatch run as micro-batches of at most ``max_tokens`` positions.

A minibatch of ``rows x width`` token slots that fits the budget runs as one pass, as it always did. One
that does not is split by rows (groups of whole rows, each trimmed to its longest row: right padding never
reaches a real token under causal attention) and a row longer than the budget by positions, into segments
of at most ``max_tokens``. A segmented row's backward:

1. a no-grad forward over every segment but the last fills a ``SegmentKV`` with their K/V;
2. from the last segment to the first: the segment's forward again, with grad, attending to the cached
   prefix; its loss; ``backward()``. The attention puts the prefix's K/V gradients in the cache's buffers,
   and a segment's own K/V take theirs from there when its turn comes (``policy/segment_kv.py``).

Recompute rather than keep the earlier segments' graphs: a K/V depends on every activation of its segment
below it, so keeping K/V "with their graph" keeps the whole sequence's activations, the memory this is
meant to bound. The price is one more forward of all but the last segment (about +1/3 of a step's compute).
Memory: one segment's activations plus the K/V of the row and their gradients (``kv_bytes``).

Every loss is a sum over tokens divided by a normaliser the caller computes over the whole minibatch, so the
segments' losses add up to the one-pass loss and their gradients to its gradient. R3: each segment replays
the routing rows of its own positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from t1_actors.policy.model import MoEBackbone
from t1_actors.policy.segment_kv import SegmentKV

# forward(inputs [r, s], routing [r, s, L, k] | None, cache | None) -> the model's output on those positions
SegmentForward = Callable[[torch.Tensor, "torch.Tensor | None", "SegmentKV | None"], object]
# on_segment(rows, start, end, output) -> the segment's loss (backward) or None (no-grad pass)
OnSegment = Callable[[torch.Tensor, int, int, object], "torch.Tensor | None"]


@dataclass(frozen=True)
class KVLayout:
    """Shape of a model's K/V per position: what a ``SegmentKV`` for it allocates."""

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, config, parameter: torch.Tensor) -> KVLayout:
        return cls(config.num_layers, config.num_kv_heads, config.head_dim, parameter.dtype, parameter.device)

    def bytes_per_position(self) -> int:
        """K and V of every layer: layers x 2 x kv_dim x element size (double it with their gradients)."""
        element = torch.empty(0, dtype=self.dtype).element_size()
        return self.num_layers * 2 * self.kv_heads * self.head_dim * element

    def cache(self, rows: int, width: int) -> SegmentKV:
        return SegmentKV(self.num_layers, rows, self.kv_heads, self.head_dim, width, dtype=self.dtype,
                         device=self.device)


def segment_layout(model: torch.nn.Module) -> KVLayout | None:
    """The K/V layout of a policy or value model whose trunk is ``MoEBackbone`` (the attention that reads a
    ``SegmentKV``); None for any other (Qwen3.5's hybrid trunk keeps recurrent state a segment cannot carry)."""
    trunk = model.model
    if type(trunk) is not MoEBackbone:
        return None
    return KVLayout.of(model.config, trunk.embed_tokens.weight)


@dataclass(frozen=True)
class Microbatch:
    """Rows of the minibatch (indices), the columns they use, and the segments ``[start, end)`` of those."""

    rows: torch.Tensor
    width: int
    segments: tuple[tuple[int, int], ...]


def plan(lengths: Sequence[int], width: int, max_tokens: int | None) -> list[Microbatch]:
    """Micro-batches of at most ``max_tokens`` positions covering ``lengths`` (real positions of each row).

    ``max_tokens`` None, or ``len(lengths) * width <= max_tokens``: one micro-batch, every row at the full
    ``width`` (bit for bit the single pass). Otherwise rows in order, grouped while the group's rows times
    its longest row fit; a row longer than ``max_tokens`` alone, in segments of ``max_tokens``.
    """
    every = torch.arange(len(lengths))
    if max_tokens is None or len(lengths) * width <= max_tokens:
        return [Microbatch(every, width, ((0, width),))]
    groups: list[list[int]] = []
    longest = 0
    for row, length in enumerate(lengths):
        length = max(int(length), 1)
        if groups and (len(groups[-1]) + 1) * max(longest, length) <= max_tokens:
            groups[-1].append(row)
            longest = max(longest, length)
        else:
            groups.append([row])
            longest = length
    out = []
    for group in groups:
        group_width = max(max(int(lengths[r]), 1) for r in group)
        segments = tuple((s, min(s + max_tokens, group_width)) for s in range(0, group_width, max_tokens))
        out.append(Microbatch(torch.tensor(group), group_width, segments))
    return out


def _pick(x: torch.Tensor | None, micro: Microbatch, start: int, end: int) -> torch.Tensor | None:
    if x is None:
        return None
    return x.index_select(0, micro.rows.to(x.device))[:, start:end]


@torch.no_grad()
def forward_no_grad(forward: SegmentForward, micro: Microbatch, inputs: torch.Tensor, routing: torch.Tensor | None,
                    layout: KVLayout | None, on_segment: OnSegment) -> None:
    """Every segment's output, in order, to ``on_segment`` (caches of earlier segments' K/V between them)."""
    if len(micro.segments) == 1:
        start, end = micro.segments[0]
        on_segment(micro.rows, start, end, forward(_pick(inputs, micro, start, end), _pick(routing, micro, start, end),
                                                   None))
        return
    cache = layout.cache(len(micro.rows), micro.width)
    for start, end in micro.segments:
        cache.length = start
        on_segment(micro.rows, start, end, forward(_pick(inputs, micro, start, end), _pick(routing, micro, start, end),
                                                   cache))


def backward(forward: SegmentForward, micro: Microbatch, inputs: torch.Tensor, routing: torch.Tensor | None,
             layout: KVLayout | None, segment_loss: OnSegment) -> None:
    """Accumulate into ``.grad`` the gradient of the sum of ``segment_loss`` over the micro-batch's segments."""
    if len(micro.segments) == 1:
        start, end = micro.segments[0]
        segment_loss(micro.rows, start, end,
                     forward(_pick(inputs, micro, start, end), _pick(routing, micro, start, end), None)).backward()
        return
    cache = layout.cache(len(micro.rows), micro.width)
    with torch.no_grad():  # the prefix K/V of every segment; the last one's own K/V nobody reads
        for start, end in micro.segments[:-1]:
            cache.length = start
            forward(_pick(inputs, micro, start, end), _pick(routing, micro, start, end), cache)
    for start, end in reversed(micro.segments):
        cache.length = start
        output = forward(_pick(inputs, micro, start, end), _pick(routing, micro, start, end), cache)
        segment_loss(micro.rows, start, end, output).backward()
