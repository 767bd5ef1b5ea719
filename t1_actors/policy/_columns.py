"""Per-row, per-column buffers that grow by doubling, aligned with the sampler's KV cache."""

from __future__ import annotations

import torch


class Columns:
    """Per-row, per-column payload aligned with the KV cache (the attention mask and the routing).

    Buffers are preallocated and grow by doubling, so appending a decode column costs O(batch).
    """

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.length = next(iter(tensors.values())).shape[1]
        self._buf = {k: self._grown(v, max(2 * self.length, 64)) for k, v in tensors.items()}

    @property
    def t(self) -> dict[str, torch.Tensor]:
        """The filled columns, ``name -> [B, length, ...]`` (views)."""
        return {k: v[:, :self.length] for k, v in self._buf.items()}

    def append(self, columns: dict[str, torch.Tensor]) -> None:
        steps = next(iter(columns.values())).shape[1]
        if self.length + steps > next(iter(self._buf.values())).shape[1]:
            self._buf = {k: self._grown(v[:, :self.length], 2 * (self.length + steps)) for k, v in self._buf.items()}
        for k, v in columns.items():
            self._buf[k][:, self.length:self.length + steps] = v
        self.length += steps

    def select(self, rows: torch.Tensor) -> None:
        self._buf = {k: v.index_select(0, rows) for k, v in self._buf.items()}

    def trim_left(self, columns: int) -> None:
        self._buf = {k: v[:, columns:].contiguous() for k, v in self._buf.items()}
        self.length -= columns

    def merge(self, other: Columns, pad_self: int, pad_other: int) -> None:
        length = self.length + pad_self
        capacity = max(2 * length, 64)
        merged = {}
        for k, v in self._buf.items():
            parts = []
            for buf, filled, pad in ((v, self.length, pad_self), (other._buf[k], other.length, pad_other)):
                part = buf.new_zeros((buf.shape[0], capacity, *buf.shape[2:]))
                part[:, pad:pad + filled] = buf[:, :filled]
                parts.append(part)
            merged[k] = torch.cat(parts, 0)
        self._buf, self.length = merged, length

    @staticmethod
    def _grown(v: torch.Tensor, capacity: int) -> torch.Tensor:
        out = v.new_zeros((v.shape[0], capacity, *v.shape[2:]))
        out[:, :v.shape[1]] = v
        return out
