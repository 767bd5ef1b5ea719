"""A segment writer's append-only arrays: rows go to the store as whole chunks (any zarr store), or
straight into a pack file (``PackedStore``). Both keep, for the arrays that need it (the headers),
the CRC-32C of each chunk's rows written since the last commit."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import zarr

from storage._format import crc32c
from storage._packed import PackLayout, pwrite_all, reserve, reserve_pays
from storage._store import fsync_path


class ChunkStream:
    """One array written through zarr: rows [start, end) are held in memory, where ``start`` is
    chunk-aligned, so every store write is a whole chunk (the tail chunk padded)."""

    def __init__(self, array: zarr.Array[Any], end: int, held: np.ndarray, checksum: bool):
        self.array = array
        self.chunk_rows = array.chunks[0]
        self.start = (end // self.chunk_rows) * self.chunk_rows
        self.end = end
        self.stored = end  # rows already in the store (as of the last commit or chunk write)
        self.pieces: list[np.ndarray] = [held] if len(held) else []
        self.checksum = checksum
        self.crcs: dict[int, int] = {}  # chunk -> crc of its rows, for chunks written since the last commit
        self.written: set[int] = set()  # chunks written since the last commit
        self.touched = False  # rows added since the last commit

    def add(self, rows: np.ndarray) -> int:
        offset = self.end
        self.pieces.append(np.array(rows, copy=True))  # the caller may still hold a writable base
        self.end += len(rows)
        self.touched = True
        return offset

    def _held(self) -> np.ndarray:
        if len(self.pieces) != 1:
            self.pieces = [np.concatenate(self.pieces)] if self.pieces else []
        return self.pieces[0] if self.pieces else np.empty((0, *self.array.shape[1:]), self.array.dtype)

    def full_chunks(self) -> list[tuple[zarr.Array[Any], int, np.ndarray]]:
        """Take every whole chunk held (as writes for ``_store.write_chunks``)."""
        full = (self.end - self.start) // self.chunk_rows * self.chunk_rows
        if full == 0:
            return []
        held = self._held()
        writes = []
        for lo in range(0, full, self.chunk_rows):
            rows = held[lo:lo + self.chunk_rows]
            chunk = (self.start + lo) // self.chunk_rows
            if self.checksum:
                self.crcs[chunk] = crc32c(rows)
            self.written.add(chunk)
            writes.append((self.array, self.start + lo, rows))
        rest = held[full:]
        self.pieces = [rest.copy()] if len(rest) else []  # copy: the written block may go once stored
        self.start += full
        self.stored = max(self.stored, self.start)
        return writes

    def commit_writes(self) -> list[tuple[zarr.Array[Any], int, np.ndarray]]:
        """What a commit writes: the whole chunks held, then the partial last chunk padded to a whole
        chunk if it has rows not yet stored (a commit rewrites it as it fills; the committed rows in
        it never change)."""
        writes = self.full_chunks()
        if self.end in (self.start, self.stored):
            return writes
        held = self._held()
        padded = np.zeros((self.chunk_rows, *held.shape[1:]), held.dtype)
        padded[:len(held)] = held
        if self.checksum:
            self.crcs[self.start // self.chunk_rows] = crc32c(held)
        self.written.add(self.start // self.chunk_rows)
        self.stored = self.end
        return writes + [(self.array, self.start, padded)]

    def written_keys(self) -> list[str]:
        """Store keys of the chunks this commit wrote (to fsync)."""
        tail = (0,) * (self.array.ndim - 1)
        return [f"{self.array.path}/{self.array.metadata.encode_chunk_key((c, *tail))}" for c in sorted(self.written)]

    def mark_committed(self) -> None:
        self.crcs.clear()
        self.written.clear()
        self.touched = False

    def close(self) -> None:
        pass


class PackedStream:
    """One array of a ``PackedStore``: rows are written to the pack file as they are appended, at
    their final place (nothing is held, copied or padded). Rows past the last commit are invisible
    to readers and are overwritten when a reopened writer continues from that commit."""

    def __init__(self, layout: PackLayout, end: int, tail_crc: int, checksum: bool, reserve_min_bytes: int):
        """``tail_crc``: crc of the committed rows of the partly filled last chunk (checksummed arrays);
        writes of ``reserve_min_bytes`` or more reserve their blocks first where that pays (0: never)."""
        self.layout = layout
        self.chunk_rows = layout.chunk_rows
        self.row_bytes = layout.chunk_bytes // layout.chunk_rows
        self.end = end
        self.checksum = checksum
        self.crcs: dict[int, int] = {}  # chunk -> crc of its rows, for chunks written since the last commit
        self._last_crc = tail_crc  # crc of the rows of the last chunk written to (rows always come in order)
        self.touched = False
        self._committed = end
        self._dir_synced = False
        layout.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(layout.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:  # drop an uncommitted tail a dead writer left (only then: on ext4 a truncation to
            # zero makes close() start writeback of everything written since, a 10 ms stall)
            if os.fstat(self._fd).st_size != end * self.row_bytes:
                os.ftruncate(self._fd, end * self.row_bytes)
        except BaseException:
            os.close(self._fd)
            raise
        self._reserve_min = reserve_min_bytes if reserve_min_bytes and reserve_pays(self._fd) else 0

    def add(self, rows: np.ndarray) -> int:
        """Write C-contiguous rows of the array's dtype and row shape (the writer checked them)."""
        offset = self.end
        if self._reserve_min and rows.nbytes >= self._reserve_min:  # large writes: routing records
            if not reserve(self._fd, offset * self.row_bytes, rows.nbytes):
                self._reserve_min = 0  # not possible here after all: let writes allocate
        pwrite_all(self._fd, rows, offset * self.row_bytes)
        if self.checksum:
            lo = 0
            while lo < len(rows):
                chunk = (offset + lo) // self.chunk_rows
                hi = min(len(rows), (chunk + 1) * self.chunk_rows - offset)
                continued = self._last_crc if (offset + lo) % self.chunk_rows else 0
                self._last_crc = self.crcs[chunk] = crc32c(rows[lo:hi], continued)
                lo = hi
        self.end += len(rows)
        self.touched = True
        return offset

    def full_chunks(self) -> list[tuple[zarr.Array[Any], int, np.ndarray]]:
        return []  # every row is in the file already

    def commit_writes(self) -> list[tuple[zarr.Array[Any], int, np.ndarray]]:
        return []

    def fsync(self) -> None:
        os.fsync(self._fd)
        if not self._dir_synced:  # the pack file's directory entry, once
            fsync_path(self.layout.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            self._dir_synced = True

    def mark_committed(self) -> None:
        self.crcs.clear()
        self.touched = False
        self._committed = self.end

    def close(self) -> None:
        """Release the file, dropping rows never committed (what a reopened writer would do)."""
        if self._fd >= 0:
            try:
                size = self._committed * self.row_bytes
                if os.fstat(self._fd).st_size != size:
                    os.ftruncate(self._fd, size)
            finally:
                os.close(self._fd)
                self._fd = -1  # closed
