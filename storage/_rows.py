"""Where a reader gets the rows of one array from: zarr (any store) or a pack file (``PackedStore``).
Both return a fresh array the caller owns; neither checks checksums (the reader does)."""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np
import zarr

from storage._packed import PackLayout, pread_into
from storage.errors import CorruptionError


class ZarrRows:
    """Rows through zarr's codec pipeline (chunks fetched and decoded concurrently)."""

    def __init__(self, array: zarr.Array[Any], segment: str, name: str):
        self.array, self.segment, self.name = array, segment, name
        self.chunk_rows = array.chunks[0]
        self.row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:]))

    def read(self, lo: int, hi: int) -> np.ndarray:
        try:
            return np.asarray(self.array[lo:hi])  # the array zarr returns, typed as one
        except Exception:
            pass  # a damaged chunk in the range: decode one by one to name it
        rows = self.chunk_rows
        for c in range(lo // rows, (hi - 1) // rows + 1):
            try:
                self.array[max(lo, c * rows): min(hi, (c + 1) * rows)]
            except Exception as exc:
                raise CorruptionError(self.segment, self.name, c,
                                      f"chunk cannot be decoded ({type(exc).__name__}: {exc})") from None
        return np.asarray(self.array[lo:hi])


class PackedRows:
    """Rows read with one ``preadv`` from the array's pack file, straight into the returned array."""

    def __init__(self, layout: PackLayout, segment: str, name: str):
        self.layout, self.segment, self.name = layout, segment, name
        self.chunk_rows = layout.chunk_rows
        self.row_bytes = layout.chunk_bytes // layout.chunk_rows
        self._fd: int | None = None

    def _file(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.layout.path, os.O_RDONLY)
            except FileNotFoundError:
                raise CorruptionError(self.segment, self.name, 0, f"pack file {self.layout.path} is missing") from None
            weakref.finalize(self, os.close, self._fd)
        return self._fd

    def read(self, lo: int, hi: int) -> np.ndarray:
        out = np.empty((hi - lo, *self.layout.inner), self.layout.dtype)
        got = pread_into(self._file(), out, lo * self.row_bytes)
        if got < out.nbytes:
            chunk = (lo * self.row_bytes + got) // self.layout.chunk_bytes
            raise CorruptionError(self.segment, self.name, chunk,
                                  f"pack file {self.layout.path} ends inside committed rows (truncated)")
        return out
