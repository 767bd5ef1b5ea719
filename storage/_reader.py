"""SegmentReader: the committed view of one segment, caught up incrementally, every byte checksummed.

Header chunks are checked against the crcs in the commit records (read in cached blocks). The
payloads of consecutive events are read together, one read per array of up to ``read_block_bytes``
(the events' arrays are views of that block), and each event's are checked piece by piece against
the crcs its header carries (each piece lies in one chunk, so a mismatch names that chunk)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import zarr
from zarr.abc.store import Store

from schemas import SchemaError, unpack
from schemas.codec import from_wire
from schemas.events import Event
from storage._commits import commit_channel
from storage._format import HEADERS, ROUTING_ARRAYS, ROUTING_SETS, Commit, crc32c, segment_dir
from storage._packed import PackedStore
from storage._routing import CODEC_ATTR, SetCodec
from storage._rows import PackedRows, ZarrRows
from storage.config import StorageConfig
from storage.errors import CorruptionError

Pieces = Sequence[Sequence[int]]  # an array's checksum pieces in an event header: [(chunk, crc32c), ...]
Entry = tuple[str, str, int, list[int], Pieces, int]  # (field, array, first row, shape, pieces, rows)
Run = list[tuple[int, dict[str, Any], list[Entry]]]  # consecutive events (seq, header, entries)


class EventMeta(NamedTuple):
    """What readers index every event by; the full header is re-read from the header array on demand."""

    ts: float
    kind: str
    trial_id: str | None


class SegmentReader:
    """What the commit records of one segment say: events, their headers, and checked array reads."""

    def __init__(self, store: Store, writer_id: str, config: StorageConfig):
        self.writer_id = writer_id
        self._store = store
        self._config = config
        self.commit_count = 0
        self.ends: dict[str, int] = {}
        self._checksums: dict[str, dict[int, int]] = {}
        self._header_ends: list[int] = []
        self.meta: list[EventMeta] = []
        self._sources: dict[str, ZarrRows | PackedRows] = {}
        self.commits = commit_channel(store, writer_id)  # where the commit records are
        self._cache: OrderedDict[int, tuple[np.ndarray, int]] = OrderedDict()  # header chunk -> (rows from it, first row)
        self._set_codec: SetCodec | None = None  # of routing_sets, read from its attributes on first use

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
        for blob in self.commits.read_new():
            self._apply(self._decode_commit(blob))
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
            for chunk, crc in pairs:
                sums[chunk] = crc
                if name == HEADERS:
                    self._cache.pop(chunk, None)  # a rewritten tail chunk: drop the shorter cached copy
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
            header: dict[str, Any] = unpack(self.read_rows(HEADERS, start, end).tobytes())
            if header["s"] != seq:
                raise ValueError(f"header says event {header['s']}")
        except CorruptionError:
            raise
        except Exception as exc:
            chunk = start // self._source(HEADERS).chunk_rows
            raise CorruptionError(self.writer_id, HEADERS, chunk, f"header of event {seq} unreadable ({exc})") from None
        return header

    # -- reading -------------------------------------------------------------------------------

    def _source(self, name: str) -> ZarrRows | PackedRows:
        source = self._sources.get(name)
        if source is None:
            path = f"{segment_dir(self.writer_id)}/{name}"
            try:
                layout = self._store.pack_file(path) if isinstance(self._store, PackedStore) else None
                if layout is not None:
                    source = PackedRows(layout, self.writer_id, name)
                else:
                    source = ZarrRows(zarr.open_array(self._store, path=path, mode="r"), self.writer_id, name)
            except Exception as exc:
                raise CorruptionError(self.writer_id, name, None, f"array metadata unreadable ({exc})") from None
            self._sources[name] = source
        return source

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a committed array. Header rows are checked against the commit
        records' chunk crcs and come from cached blocks of ``readahead_chunks`` chunks (a view,
        not a copy); payload rows come back fresh and unchecked (``check_pieces`` checks them)."""
        end = self.ends.get(name, 0)
        if not 0 <= start <= stop <= end:
            raise CorruptionError(self.writer_id, name, None,
                                  f"rows [{start}, {stop}) asked, only {end} committed (a header points past the data)")
        source = self._source(name)
        if start == stop:
            return source.read(start, start)
        if name != HEADERS:
            return source.read(start, stop)
        rows = source.chunk_rows
        first, last = start // rows, (stop - 1) // rows
        hit = self._cache.get(first)
        if hit is None or hit[1] + len(hit[0]) < stop:
            hit = self._read_headers(first, max(last, first + self._config.readahead_chunks - 1), end)
        else:
            self._cache.move_to_end(first)
        block, block_start = hit
        return block[start - block_start: stop - block_start]

    def _read_headers(self, first: int, last: int, end: int) -> tuple[np.ndarray, int]:
        """Read header chunks [first, last] (clipped to the committed rows), check each, cache the block."""
        rows = self._source(HEADERS).chunk_rows
        last = min(last, (end - 1) // rows)
        lo, hi = first * rows, min((last + 1) * rows, end)
        block = self._source(HEADERS).read(lo, hi)
        for c in range(first, last + 1):
            self._check(HEADERS, c, block[c * rows - lo: min((c + 1) * rows, end) - lo])
        for c in range(first, last + 1):
            self._cache[c] = (block[c * rows - lo:], c * rows)  # each chunk: the block from that chunk on
            self._cache.move_to_end(c)
        while len(self._cache) > self._config.cache_chunks:
            self._cache.popitem(last=False)
        return block, lo

    def _check(self, name: str, chunk: int, rows: np.ndarray) -> None:
        expected = self._checksums.get(name, {}).get(chunk)
        if expected is None:
            raise CorruptionError(self.writer_id, name, chunk, "no commit record carries this chunk's checksum")
        actual = crc32c(rows)
        if actual != expected:
            raise CorruptionError(self.writer_id, name, chunk,
                                  f"checksum mismatch (crc32c {actual:08x}, committed {expected:08x})")

    def check_pieces(self, name: str, offset: int, rows: np.ndarray, pieces: Pieces) -> list[int]:
        """Check payload rows (starting at row ``offset``) against their header's per-chunk pieces;
        returns the chunks checked."""
        chunk_rows = self._source(name).chunk_rows
        lo, checked = 0, []
        for chunk, expected in pieces:
            hi = min(len(rows), (chunk + 1) * chunk_rows - offset)
            if chunk != (offset + lo) // chunk_rows or hi <= lo:
                raise CorruptionError(self.writer_id, name, chunk, "an event header's checksum pieces do not match "
                                      f"its rows [{offset}, {offset + len(rows)})")
            actual = crc32c(rows[lo:hi])
            if actual != expected:
                raise CorruptionError(self.writer_id, name, chunk,
                                      f"checksum mismatch (crc32c {actual:08x}, committed {expected:08x})")
            checked.append(chunk)
            lo = hi
        if lo != len(rows):
            raise CorruptionError(self.writer_id, name, (offset + lo) // chunk_rows,
                                  "an event header's checksum pieces do not cover its rows")
        return checked

    def _entries(self, seq: int, header: dict[str, Any]) -> list[Entry]:
        """An event's payloads as (field, array, first row, shape, pieces, rows)."""
        out: list[Entry] = []
        for fieldname, entry in header.get("a", {}).items():
            try:
                name, offset, shape, pieces = entry
                count = shape[0] if name in ROUTING_ARRAYS else int(np.prod(shape))  # routing rows are tokens
            except Exception:
                raise CorruptionError(self.writer_id, HEADERS, None,
                                      f"header of event {seq} has a malformed array entry {fieldname!r}") from None
            out.append((fieldname, name, offset, shape, pieces, count))
        return out

    def _read_run(self, run: Run) -> tuple[list[dict[str, np.ndarray]], dict[str, set[int]]]:
        """Checked payloads of a run of consecutive events ``(seq, header, entries)``: each array's rows
        for all of them in one read, each event's arrays views of that block. Also the chunks checked
        per array."""
        spans: dict[str, list[int]] = {}
        for _, _, entries in run:
            for _, name, offset, _, _, count in entries:
                span = spans.setdefault(name, [offset, offset + count])
                span[0], span[1] = min(span[0], offset), max(span[1], offset + count)
        blocks = {name: self.read_rows(name, lo, hi) for name, (lo, hi) in spans.items()}
        out: list[dict[str, np.ndarray]] = []
        checked: dict[str, set[int]] = {}
        for _, _, entries in run:
            arrays = {}
            for fieldname, name, offset, shape, pieces, count in entries:
                lo = offset - spans[name][0]
                rows = blocks[name][lo:lo + count]
                checked.setdefault(name, set()).update(self.check_pieces(name, offset, rows, pieces))
                arrays[fieldname] = self._decode_sets(rows, shape) if name == ROUTING_SETS else rows.reshape(shape)
            out.append(arrays)
        return out, checked

    def _decode_sets(self, rows: np.ndarray, shape: list[int]) -> np.ndarray:
        """Checked ``routing_sets`` rows -> the record ``[tokens, layers, k]``, each set sorted ascending."""
        if self._set_codec is None:
            path = f"{segment_dir(self.writer_id)}/{ROUTING_SETS}"
            try:
                attrs = zarr.open_array(self._store, path=path, mode="r").attrs.get(CODEC_ATTR)
                self._set_codec = SetCodec.from_attrs(attrs)
            except Exception as exc:
                raise CorruptionError(self.writer_id, ROUTING_SETS, None, f"routing codec unreadable ({exc})") from None
        codec = self._set_codec
        if list(shape[1:]) != [codec.layers, codec.k]:
            raise CorruptionError(self.writer_id, HEADERS, None, f"an event header says routing of shape {shape}, "
                                  f"the segment's sets are [tokens, {codec.layers}, {codec.k}]")
        return codec.decode(rows)

    def _runs(self, seqs: list[int]) -> Iterator[Run]:
        """``seqs`` as runs of consecutive events ``(seq, header, entries)`` of at most
        ``read_block_bytes`` of payload (each header decoded once)."""
        run: Run = []
        size = 0
        for seq in seqs:
            header = self.header(seq)
            entries = self._entries(seq, header)
            nbytes = sum(count * self._source(name).row_bytes for _, name, _, _, _, count in entries)
            if run and (seq != run[-1][0] + 1 or size + nbytes > self._config.read_block_bytes):
                yield run
                run, size = [], 0
            run.append((seq, header, entries))
            size += nbytes
        if run:
            yield run

    def load_many(self, seqs: list[int]) -> list[Event]:
        """Committed events ``seqs``, arrays bit-exact as appended (set-encoded routing: each
        selection sorted ascending, see ``_routing.py``). Consecutive events are read
        together, one read per array for up to ``read_block_bytes`` (their arrays share that block)."""
        records: list[Event] = []
        for run in self._runs(seqs):
            for (seq, header, _), arrays in zip(run, self._read_run(run)[0]):
                try:
                    record = from_wire({"t": header["t"], "v": header["v"], "f": {**header["f"], **arrays}})
                except SchemaError:
                    raise
                except Exception as exc:
                    raise CorruptionError(self.writer_id, HEADERS, None,
                                          f"event {seq} cannot be rebuilt ({exc})") from None
                if not isinstance(record, Event):  # the writer appends events only
                    raise CorruptionError(self.writer_id, HEADERS, None,
                                          f"event {seq} is a {type(record).__name__}, not an event")
                records.append(record)
        return records

    def load(self, seq: int) -> Event:
        """The committed event ``seq`` of this segment (arrays as ``load_many`` returns them)."""
        return self.load_many([seq])[0]

    def verify(self) -> dict[str, int]:
        """Read back and check every committed byte: header chunks against the commit records, each
        event's payloads against its header. Returns chunks checked per array."""
        checked: dict[str, set[int]] = {}
        end = self.ends.get(HEADERS, 0)
        if end:
            rows = self._source(HEADERS).chunk_rows
            step = self._config.readahead_chunks
            self._cache.clear()
            for chunk in range(0, (end + rows - 1) // rows, step):
                self._read_headers(chunk, chunk + step - 1, end)
            checked[HEADERS] = set(range((end + rows - 1) // rows))
        for run in self._runs(list(range(self.event_count))):
            for name, chunks in self._read_run(run)[1].items():
                checked.setdefault(name, set()).update(chunks)
        return {name: len(chunks) for name, chunks in checked.items()}
