"""SegmentReader: the committed view of one segment, caught up incrementally, every chunk checksummed."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
import zarr

from schemas import Record, SchemaError, unpack
from schemas.codec import from_wire

from . import _store
from ._format import COMMIT_BATCH, HEADERS, ROUTING, Commit, commit_key, crc32, segment_dir
from .config import StorageConfig
from .errors import CorruptionError


class EventMeta(NamedTuple):
    """What readers index every event by; the full header is re-read from the header array on demand."""

    ts: float
    kind: str
    trial_id: str | None


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
        self.meta: list[EventMeta] = []
        self._arrays: dict[str, zarr.Array] = {}
        self._cache: dict[str, OrderedDict[int, tuple[np.ndarray, int]]] = {}  # chunk -> (rows from it, first row)

    @property
    def event_count(self) -> int:
        return len(self.meta)

    @property
    def last_time(self) -> float:
        return self.meta[-1].ts if self.meta else 0.0

    # -- catching up ---------------------------------------------------------------------------

    def refresh(self) -> int:
        """Read commit records written since the last call; returns how many events became visible."""
        before = self.event_count
        batch = 1  # an idle segment costs one lookup per refresh; a busy one is fetched in batches
        while True:
            keys = [commit_key(self.writer_id, self.commit_count + i) for i in range(batch)]
            blobs = _store.get_many(self._store, keys)
            for blob in blobs:
                if blob is None:
                    break
                self._apply(self._decode_commit(blob))
            if any(blob is None for blob in blobs):
                break
            batch = COMMIT_BATCH
        self._index_new_events()
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

    def _index_new_events(self) -> None:
        for seq in range(len(self.meta), len(self._header_ends)):
            header = self.header(seq)
            trial = header["f"].get("trial_id")
            self.meta.append(EventMeta(float(header["ts"]), header["t"], trial if isinstance(trial, str) else None))

    def header(self, seq: int) -> dict[str, Any]:
        """The msgpack header of event ``seq``: kind, version, non-array fields, array locations."""
        start = self._header_ends[seq - 1] if seq else 0
        end = self._header_ends[seq]
        try:
            header = unpack(self.read_rows(HEADERS, start, end).tobytes())
            if header["s"] != seq:
                raise ValueError(f"header says event {header['s']}")
        except CorruptionError:
            raise
        except Exception as exc:
            chunk = start // self._array(HEADERS).chunks[0]
            raise CorruptionError(self.writer_id, HEADERS, chunk, f"header of event {seq} unreadable ({exc})") from None
        return header

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
        """Rows [start, stop) of a committed array, every chunk they touch checked against its crc.

        Chunks are fetched in blocks of ``readahead_chunks`` (zarr decodes them concurrently) and a
        range inside one cached block comes back as a view, without a copy."""
        end = self.ends.get(name, 0)
        if not 0 <= start <= stop <= end:
            raise CorruptionError(self.writer_id, name, None,
                                  f"rows [{start}, {stop}) asked, only {end} committed (a header points past the data)")
        array = self._array(name)
        if start == stop:
            return np.empty((0, *array.shape[1:]), array.dtype)
        rows = array.chunks[0]
        first, last = start // rows, (stop - 1) // rows
        cache = self._cache.setdefault(name, OrderedDict())
        hit = cache.get(first)
        if hit is None or hit[1] + len(hit[0]) < stop:
            hit = self._read_block(name, first, max(last, first + self._config.readahead_chunks - 1), end)
        elif first in cache:
            cache.move_to_end(first)
        block, block_start = hit
        return block[start - block_start: stop - block_start]

    def _read_block(self, name: str, first: int, last: int, end: int) -> tuple[np.ndarray, int]:
        """Read chunks [first, last] (clipped to the committed rows), check each, cache the block."""
        array = self._array(name)
        rows = array.chunks[0]
        last = min(last, (end - 1) // rows)
        lo, hi = first * rows, min((last + 1) * rows, end)
        try:
            block = array[lo:hi]
        except Exception:
            block = None  # a damaged chunk in the batch: decode one by one to name it
        if block is None:
            for c in range(first, last + 1):
                try:
                    array[c * rows: min((c + 1) * rows, end)]
                except Exception as exc:
                    raise CorruptionError(self.writer_id, name, c,
                                          f"chunk cannot be decoded ({type(exc).__name__}: {exc})") from None
            block = array[lo:hi]
        for c in range(first, last + 1):
            self._check(name, c, block[c * rows - lo: min((c + 1) * rows, end) - lo])
        cache = self._cache.setdefault(name, OrderedDict())
        for c in range(first, last + 1):
            cache[c] = (block[c * rows - lo:], c * rows)  # each chunk: the block from that chunk on
            cache.move_to_end(c)
        while len(cache) > self._config.cache_chunks:
            cache.popitem(last=False)
        return block, lo

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
        header = self.header(seq)
        fields = dict(header["f"])
        for fieldname, (name, offset, shape) in header.get("a", {}).items():
            count = shape[0] if name == ROUTING else int(np.prod(shape))  # routing rows are tokens
            rows = self.read_rows(name, offset, offset + count)
            fields[fieldname] = rows.reshape(shape).copy()  # own memory: a record must not pin a cached block
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
            step = self._config.readahead_chunks
            for chunk in range(0, (end + rows - 1) // rows, step):
                self._read_block(name, chunk, chunk + step - 1, end)
                count += min(step, (end + rows - 1) // rows - chunk)
            checked[name] = count
            self._cache.pop(name, None)
        return checked
