"""Preallocated key/value cache for batched decoding, rows aligned on the right (left padding).

All rows share one column axis: column ``c`` of every layer holds the key/value of the token fed at
step ``c``. Rows with shorter prompts are left-padded; which columns are real is the caller's
attention mask. The buffers grow by doubling so that appending one decode column is O(1) amortised,
and rows can be dropped (a finished or cancelled sequence) or merged in (a newly admitted one) between
steps: that is what continuous batching in ``sampling.py`` needs.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of every attention layer, ``[batch, kv_heads, columns, head_dim]`` each."""

    def __init__(self, num_layers: int, batch: int, kv_heads: int, head_dim: int, *,
                 capacity: int = 64, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.num_layers = num_layers
        self.length = 0  # columns filled
        shape = (batch, kv_heads, max(capacity, 1), head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def update(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key``/``value`` ``[B, H, T, D]`` after the filled columns; return all columns so far.

        The fill level advances once per forward (``advance``), after every layer has written.
        """
        steps = key.shape[2]
        if key.shape[0] != self.batch:
            raise ValueError(f"cache holds {self.batch} rows, the forward has {key.shape[0]}; "
                             "select/merge rows of the cache to match the batch")
        self._reserve(self.length + steps)
        end = self.length + steps
        self.keys[layer][:, :, self.length:end] = key
        self.values[layer][:, :, self.length:end] = value
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, steps: int) -> None:
        self.length += steps

    def select(self, rows: torch.Tensor | list[int]) -> None:
        """Keep only ``rows`` (in that order): drop finished or cancelled sequences."""
        index = torch.as_tensor(rows, dtype=torch.long, device=self.keys[0].device)
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]

    def trim_left(self, columns: int) -> None:
        """Drop the first ``columns`` columns (padding no remaining row needs)."""
        if columns <= 0:
            return
        if columns > self.length:
            raise ValueError(f"cannot trim {columns} columns of a cache holding {self.length}")
        self.length -= columns
        self.keys = [k[:, :, columns:].contiguous() for k in self.keys]
        self.values = [v[:, :, columns:].contiguous() for v in self.values]

    def merge(self, other: KVCache) -> tuple[int, int]:
        """Append the rows of ``other`` below ours, right-aligning both (left-padding the shorter).

        Returns ``(pad_self, pad_other)``: the columns of padding put before our rows and before
        ``other``'s, so the caller can extend its attention mask the same way.
        """
        length = max(self.length, other.length)
        pad_self, pad_other = length - self.length, length - other.length
        capacity = max(length + 1, self.capacity, other.capacity)
        merged_k, merged_v = [], []
        for layer in range(self.num_layers):
            parts_k, parts_v = [], []
            for cache, pad in ((self, pad_self), (other, pad_other)):
                k, v = cache.keys[layer], cache.values[layer]
                buf_k = k.new_zeros((k.shape[0], k.shape[1], capacity, k.shape[3]))
                buf_v = v.new_zeros(buf_k.shape)
                buf_k[:, :, pad:pad + cache.length] = k[:, :, :cache.length]
                buf_v[:, :, pad:pad + cache.length] = v[:, :, :cache.length]
                parts_k.append(buf_k)
                parts_v.append(buf_v)
            merged_k.append(torch.cat(parts_k, 0))
            merged_v.append(torch.cat(parts_v, 0))
        self.keys, self.values, self.length = merged_k, merged_v, length
        return pad_self, pad_other

    def _reserve(self, columns: int) -> None:
        if columns <= self.capacity:
            return
        capacity = max(columns, 2 * self.capacity)
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                grown = t.new_zeros((t.shape[0], t.shape[1], capacity, t.shape[3]))
                grown[:, :, :self.length] = t[:, :, :self.length]
                store[i] = grown

    # -- prefix reuse (multi-turn sessions) --------------------------------------------------------
    def row_prefix(self, row: int, columns: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Keys and values ``[kv_heads, m, head_dim]`` per layer of ``row`` at the selected ``columns`` (bool)."""
        index = columns[:self.length].nonzero().squeeze(-1)
        return ([k[row].index_select(1, index) for k in self.keys],
                [v[row].index_select(1, index) for v in self.values])

    @classmethod
    def from_prefixes(cls, prefixes: list[tuple[list[torch.Tensor], list[torch.Tensor]] | None], *,
                      num_layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                      device: torch.device | str = "cpu") -> KVCache:
        """A cache whose row ``i`` holds ``prefixes[i]`` right-aligned (None: an empty row)."""
        length = max((p[0][0].shape[1] for p in prefixes if p is not None), default=0)
        cache = cls(num_layers, len(prefixes), kv_heads, head_dim, capacity=max(capacity, length + 1),
                    dtype=dtype, device=device)
        for row, prefix in enumerate(prefixes):
            if prefix is None:
                continue
            keys, values = prefix
            m = keys[0].shape[1]
            for layer in range(num_layers):
                cache.keys[layer][row, :, length - m:length] = keys[layer]
                cache.values[layer][row, :, length - m:length] = values[layer]
        cache.length = length
        return cache
