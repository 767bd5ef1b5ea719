"""SegmentReader: the committed view of one segment, caught up incrementally, every chunk checksummed."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import zarr

from schemas import Record, SchemaError, unpack
from schemas.codec import from_wire

from . import _store
from ._format import COMMIT_BATCH, HEADERS, ROUTING, Commit, commit_key, crc32, segment_dir
from .config import StorageConfig
from .errors import CorruptionError


class SegmentReader:
    """What the commit records of one segment say: events, their headers, and checked array reads."""

    def __init__(self, store, writer_id: str, config: StorageConfig):
        self.writer_id = writer_id
        self._store = store
        self._config = config
        self.commit_count = 0
        self.ends: dict[str, int] = {}
        self._checksums: dict[str, dict[int, int]] = {}
        self._header_ends: list[int] = []
        self.headers: list[dict[str, Any]] = []
        self._arrays: dict[str, zarr.Array] = {}
        self._cache: dict[str, OrderedDict[int, np.ndarray]] = {}

    @property
    def event_count(self) -> int:
        return len(self.headers)

    @property
    def last_time(self) -> float:
        return self.headers[-1]["ts"] if self.headers else 0.0

    # -- catching up ---------------------------------------------------------------------------

    def refresh(self) -> int:
        """Read commit records written since the last call; returns how many events became visible."""
        before = self.event_count
        header_end = self.ends.get(HEADERS, 0)
        while True:
            keys = [commit_key(self.writer_id, self.commit_count + i) for i in range(COMMIT_BATCH)]
            blobs = _store.get_many(self._store, keys)
            for blob in blobs:
                if blob is None:
                    break
                self._apply(self._decode_commit(blob))
            if any(blob is None for blob in blobs):
                break
        new_end = self.ends.get(HEADERS, 0)
        if new_end > header_end:
            self._load_headers(header_end, new_end)
        return self.event_count - before

    def _decode_commit(self, blob: bytes) -> Commit:
        try:
            commit = Commit.decode(blob)
        except ValueError as exc:
            raise CorruptionError(self.writer_id, "commits", None, f"commit record {self.commit_count}: {exc}") from None
        expected_first = len(self._header_ends)
        if commit.seq != self.commit_count or commit.first_event != expected_first:
            raise CorruptionError(self.writer_id, "commits", None,
                                  f"commit record {self.commit_count} is out of sequence (says seq {commit.seq}, "
                                  f"first event {commit.first_event}; expected event {expected_first})")
        return commit

    def _apply(self, commit: Commit) -> None:
        for name, pairs in commit.checksums.items():
            sums = self._checksums.setdefault(name, {})
            cache = self._cache.get(name)
            for chunk, crc in pairs:
                sums[chunk] = crc
                if cache is not None:
                    cache.pop(chunk, None)  # a rewritten tail chunk: drop the shorter cached copy
        self.ends.update(commit.ends)
        self._header_ends.extend(commit.header_ends)
        self.commit_count += 1

    def _load_headers(self, start: int, stop: int) -> None:
        data = self.read_rows(HEADERS, start, stop).tobytes()
        first = len(self.headers)
        offset = start
        for seq in range(first, len(self._header_ends)):
            end = self._header_ends[seq]
            try:
                header = unpack(data[offset - start:end - start])
                if header["s"] != seq:
                    raise ValueError(f"header says event {header['s']}")
            except Exception as exc:
                chunk = offset // self._array(HEADERS).chunks[0]
                raise CorruptionError(self.writer_id, HEADERS, chunk, f"header of event {seq} unreadable ({exc})") from None
            self.headers.append(header)
            offset = end

    # -- reading -------------------------------------------------------------------------------

    def _array(self, name: str) -> zarr.Array:
        array = self._arrays.get(name)
        if array is None:
            try:
                array = zarr.open_array(self._store, path=f"{segment_dir(self.writer_id)}/{name}", mode="r")
            except Exception as exc:
                raise CorruptionError(self.writer_id, name, None, f"array metadata unreadable ({exc})") from None
            self._arrays[name] = array
        return array

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a committed array, every chunk they touch checked against its crc."""
        end = self.ends.get(name, 0)
        if not 0 <= start <= stop <= end:
            raise CorruptionError(self.writer_id, name, None,
                                  f"rows [{start}, {stop}) asked, only {end} committed (a header points past the data)")
        array = self._array(name)
        rows = array.chunks[0]
        if start == stop:
            return np.empty((0, *array.shape[1:]), array.dtype)
        first, last = start // rows, (stop - 1) // rows
        parts = [self._chunk(name, c, end) for c in range(first, last + 1)]
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return joined[start - first * rows: stop - first * rows]

    def _chunk(self, name: str, chunk: int, end: int) -> np.ndarray:
        cache = self._cache.setdefault(name, OrderedDict())
        hit = cache.get(chunk)
        if hit is not None:
            cache.move_to_end(chunk)
            return hit
        array = self._array(name)
        rows = array.chunks[0]
        last_chunk = (end - 1) // rows
        upto = min(last_chunk, chunk + self._config.readahead_chunks - 1)
        try:
            block = array[chunk * rows: min((upto + 1) * rows, end)]
        except Exception:
            block = None  # a damaged chunk in the batch: read one by one to name it
        for c in range(chunk, upto + 1):
            lo, hi = c * rows, min((c + 1) * rows, end)
            if block is not None:
                piece = block[lo - chunk * rows: hi - chunk * rows]
            else:
                try:
                    piece = array[lo:hi]
                except Exception as exc:
                    raise CorruptionError(self.writer_id, name, c, f"chunk cannot be decoded ({type(exc).__name__}: {exc})") from None
            self._check(name, c, piece)
            cache[c] = piece
            cache.move_to_end(c)
        while len(cache) > self._config.cache_chunks:
            cache.popitem(last=False)
        return cache[chunk]

    def _check(self, name: str, chunk: int, rows: np.ndarray) -> None:
        expected = self._checksums.get(name, {}).get(chunk)
        if expected is None:
            raise CorruptionError(self.writer_id, name, chunk, "no commit record carries this chunk's checksum")
        actual = crc32(rows)
        if actual != expected:
            raise CorruptionError(self.writer_id, name, chunk,
                                  f"checksum mismatch (crc32 {actual:08x}, committed {expected:08x})")

    def load(self, seq: int) -> Record:
        """The committed event ``seq`` of this segment, arrays bit-exact as appended."""
        header = self.headers[seq]
        fields = dict(header["f"])
        for fieldname, (name, offset, shape) in header.get("a", {}).items():
            count = shape[0] if name == ROUTING else int(np.prod(shape))  # routing rows are tokens
            rows = self.read_rows(name, offset, offset + count)
            fields[fieldname] = rows.reshape(shape)
        try:
            return from_wire({"t": header["t"], "v": header["v"], "f": fields})
        except SchemaError:
            raise
        except Exception as exc:
            raise CorruptionError(self.writer_id, HEADERS, None, f"event {seq} cannot be rebuilt ({exc})") from None

    def verify(self) -> dict[str, int]:
        """Read back and check every committed chunk; returns chunks checked per array."""
        checked = {}
        for name, end in self.ends.items():
            array = self._array(name)
            rows = array.chunks[0]
            self._cache.pop(name, None)
            count = 0
            for chunk in range(0, (end + rows - 1) // rows):
                self._chunk(name, chunk, end)
                count += 1
            checked[name] = count
            self._cache.pop(name, None)
        return checked
