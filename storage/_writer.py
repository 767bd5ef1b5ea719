"""SegmentWriter: the single writer of one segment. Buffers rows, writes whole chunks, commits atomically."""

from __future__ import annotations

import errno
import os
import threading
import time
from types import TracebackType
from typing import Any

import numpy as np
import trio
import zarr
from zarr.abc.store import Store

from schemas import SchemaError, known_kinds, lookup, pack
from schemas.events import Event
from storage import _store
from storage._format import (
    HEADERS,
    LOG_FORMAT,
    ROUTING,
    ROUTING_SETS,
    Commit,
    RoutingShape,
    crc32c,
    create_array,
    pieces,
    segment_dir,
    stream_name,
)
from storage._packed import PackedStore
from storage._reader import SegmentReader
from storage._streams import ChunkStream, PackedStream
from storage.config import StorageConfig
from storage.errors import DiskFull, EventRejected, LogError


class SegmentWriter:
    """Appends events to one segment. Not shared between processes (one writer per segment).

    ``append`` validates and buffers an event (returns its id ``"<writer>:<seq>"``), ``commit`` makes
    every appended event visible at once. A writer killed at any instant loses only what it had not
    committed; opening the same writer id again resumes after the last commit.
    """

    def __init__(self, store: Store, writer_id: str, *, routing: RoutingShape | None, config: StorageConfig):
        if not isinstance(writer_id, str) or not _store.WRITER_ID.match(writer_id) or writer_id == "zarr.json":
            raise ValueError(f"writer id {writer_id!r} is not valid: use 1-128 characters from "
                             "[A-Za-z0-9_.-], starting with a letter or digit (e.g. 'sampler-0')")
        self.writer_id = writer_id
        self._store = store
        self._config = config
        self._lock = threading.RLock()  # aappend/acommit run in worker threads
        self._broken: str | None = None
        self._fsync = _store.Fsync(store, config.fsync)
        self._holder: _store.WriterLock | None = _store.WriterLock(store, segment_dir(writer_id), writer_id,
                                                                   lease_s=config.lease_s)
        try:
            self._open(routing)
        except BaseException:
            self.abandon()
            raise

    # -- opening and recovery ------------------------------------------------------------------

    def _open(self, routing: RoutingShape | None) -> None:
        root = zarr.open_group(self._store, mode="a")
        path = segment_dir(self.writer_id)
        group = root.require_group(path)
        stored = RoutingShape.from_attrs(group.attrs.get("routing"))
        if stored is not None and routing is not None and stored != routing:
            raise LogError(
                f"segment {self.writer_id!r} holds routing records of shape (layers={stored.layers}, k={stored.k}, "
                f"num_experts={stored.num_experts}); this writer was opened with (layers={routing.layers}, "
                f"k={routing.k}, num_experts={routing.num_experts}); use a new log or writer id for a new model")
        self.routing = routing or stored
        stored_format = root.attrs.get("t1_event_log", LOG_FORMAT)
        log_format = stored_format if isinstance(stored_format, int) else LOG_FORMAT
        self._sets = (self.routing.set_codec if self.routing is not None and log_format >= 3
                      and self._config.routing_encoding == "sets" else None)  # None: routing stored as ids
        if group.attrs.get("writer_id") != self.writer_id or (routing and stored is None):
            group.attrs.update({"writer_id": self.writer_id, "t1_segment": 1,
                                "routing": self.routing.to_attrs() if self.routing else None})
        self._group = group
        _store.remove_partial_files(self._store, path)
        # recover: the committed state is whatever the commit records say, nothing more
        reader = SegmentReader(self._store, self.writer_id, self._config)
        reader.refresh()
        self._next_event = reader.event_count
        self._next_commit = reader.commit_count
        self._commits = reader.commits  # carries on where the reader stopped
        self._last_time = reader.last_time
        self._streams: dict[str, ChunkStream | PackedStream] = {}
        for name, end in reader.ends.items():
            self._streams[name] = self._open_stream(name, _array(group, name), end, reader)
        self._chunked = any(isinstance(s, ChunkStream) for s in self._streams.values())  # chunks to write
        for name, (dtype, inner) in self._expected_arrays().items():  # made now, not by the first append
            self._stream(name, dtype, inner)
        self._pending_headers: list[int] = []  # header-array end offset of each uncommitted event

    def _expected_arrays(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """The arrays events will go to: headers, routing (with a routing shape), and one per dtype
        of the events' 1-D payloads."""
        arrays: dict[str, tuple[np.dtype, tuple[int, ...]]] = {HEADERS: (np.dtype(np.uint8), ())}
        if self._sets is not None:
            arrays[ROUTING_SETS] = (np.dtype(np.uint8), (self._sets.row_bytes,))
        elif self.routing is not None:
            arrays[ROUTING] = (self.routing.dtype, (self.routing.layers, self.routing.k))
        for kind in known_kinds():
            record = lookup(kind)
            if issubclass(record, Event):
                for spec in record.array_fields().values():
                    if spec.ndim == 1 and len(spec.dtypes) == 1:
                        arrays.setdefault(stream_name(spec.dtypes[0]), (np.dtype(spec.dtypes[0]), ()))
        return arrays

    def _open_stream(self, name: str, array: zarr.Array[Any], end: int,
                     reader: SegmentReader | None) -> ChunkStream | PackedStream:
        """The stream of an array whose first ``end`` rows are committed (``reader`` reads them)."""
        chunk_rows = array.chunks[0]
        start = (end // chunk_rows) * chunk_rows
        tail = np.asarray(array[0:0])
        if end > start:
            assert reader is not None, "committed rows are read back through the segment's reader"
            tail = reader.read_rows(name, start, end)  # headers come back checked
        checksum = name == HEADERS  # payload pieces are checksummed in the event headers instead
        layout = self._store.pack_file(array.path) if isinstance(self._store, PackedStore) else None
        if layout is not None:
            return PackedStream(layout, end, crc32c(tail) if checksum and len(tail) else 0, checksum,
                                self._config.reserve_min_bytes)
        return ChunkStream(array, end, np.array(tail, copy=True), checksum)

    def _stream(self, name: str, dtype: np.dtype, inner: tuple[int, ...]) -> ChunkStream | PackedStream:
        stream = self._streams.get(name)
        if stream is None:
            array = (_array(self._group, name) if name in self._group
                     else create_array(self._group, name, dtype, inner, self._config,
                                       self._sets if name == ROUTING_SETS else None))
            stream = self._streams[name] = self._open_stream(name, array, 0, None)
            self._chunked = self._chunked or isinstance(stream, ChunkStream)
        return stream

    # -- appending -----------------------------------------------------------------------------

    def append(self, event: Event) -> str:
        """Validate and buffer one event; returns its id. On EventRejected nothing has changed."""
        with self._lock:
            self._check_usable()
            payloads, header = self._prepare(event)
            # where each payload goes and its checksums, then the header, all before anything is written
            header["a"] = {}  # field -> [array, first row, shape, [[chunk, crc32c], ...]]
            writes: list[tuple[ChunkStream | PackedStream, np.ndarray]] = []
            ends: dict[str, int] = {}
            for fieldname, (name, rows, shape) in payloads.items():
                stream = self._stream(name, rows.dtype, rows.shape[1:])
                offset = ends.get(name, stream.end)  # two payloads of one dtype follow each other
                ends[name] = offset + len(rows)
                header["a"][fieldname] = [name, offset, shape, pieces(rows, offset, stream.chunk_rows)]
                writes.append((stream, rows))
            try:
                header_bytes = np.frombuffer(pack(header), np.uint8)
            except Exception as exc:
                raise EventRejected(type(event).__name__, None, f"header cannot be encoded ({exc})") from None
            try:
                for stream, rows in writes:
                    stream.add(rows)
                headers = self._stream(HEADERS, np.dtype(np.uint8), ())
                headers.add(header_bytes)
                self._pending_headers.append(headers.end)
                self._next_event += 1
                self._last_time = header["ts"]
                if self._chunked:
                    _store.write_chunks([w for stream in self._streams.values() for w in stream.full_chunks()])
            except BaseException as exc:
                self._broken = f"{type(exc).__name__}: {exc}"
                self._raise_disk_full(exc, "append")
                raise
            return f"{self.writer_id}:{header['s']}"

    def _prepare(self, event: Any) -> tuple[dict[str, tuple[str, np.ndarray, list[int]]], dict[str, Any]]:
        """Validate the event: its payloads as (array, rows, shape) and its header (without array
        locations). Nothing is touched."""
        if not isinstance(event, Event):
            raise EventRejected(type(event).__name__, None,
                                "only events (schemas.events.Event subclasses) can be appended to the log")
        kind = type(event).__name__
        try:  # re-validate: a record built with model_construct or model_copy(update=) skipped its checks
            type(event)(**event.__dict__)  # a model's __dict__ holds exactly its fields
        except SchemaError as exc:
            raise EventRejected(kind, exc.field, exc.problem) from None
        payloads: dict[str, tuple[str, np.ndarray, list[int]]] = {}
        for fieldname, spec in type(event).array_fields().items():
            value = getattr(event, fieldname)
            if value is None:
                continue
            if spec.ndim == 3:  # the only rank-3 payload is a routing record [tokens, layers, k]
                routing = self._check_routing(kind, fieldname, value)
                sets = None if self._sets is None else self._sets.encode(routing)
                if sets is not None:  # stored as sets: reads back sorted within each (token, layer)
                    payloads[fieldname] = (ROUTING_SETS, sets, list(value.shape))
                else:  # ids layout, or a record that repeats an id in some selection: stored as given
                    payloads[fieldname] = (ROUTING, np.ascontiguousarray(routing), list(value.shape))
            else:
                if value.dtype.byteorder == ">":  # the arrays hold little-endian values
                    value = value.astype(value.dtype.newbyteorder("<"))
                payloads[fieldname] = (stream_name(value.dtype), np.ascontiguousarray(value).reshape(-1),
                                       list(value.shape))
        ts = max(time.time(), self._last_time)
        header = {"t": event.kind, "v": event.schema_version, "f": event.header(), "s": self._next_event, "ts": ts}
        return payloads, header

    def _check_routing(self, kind: str, fieldname: str, routing: np.ndarray) -> np.ndarray:
        shape = self.routing
        if shape is None:
            raise EventRejected(kind, fieldname, "this writer was opened without a routing shape; open it with "
                                "log.writer(id, routing_shape=(layers, k), num_experts=E)")
        if routing.shape[1:] != (shape.layers, shape.k):
            raise EventRejected(kind, fieldname, f"routing record shape {routing.shape} does not match the model: "
                                f"expected [tokens, {shape.layers}, {shape.k}] (layers, k)")
        if routing.dtype != shape.dtype:
            raise EventRejected(kind, fieldname, f"routing dtype {routing.dtype.name}, but a model with "
                                f"{shape.num_experts} experts records {shape.dtype.name} "
                                f"(convert with .astype(np.{shape.dtype.name}))")
        if shape.all_ids_valid:
            return routing
        if routing.size and int(routing.max()) >= shape.num_experts:
            raise EventRejected(kind, fieldname, f"expert id {int(routing.max())} out of range for "
                                f"{shape.num_experts} experts")
        if routing.size and routing.dtype.kind == "i" and int(routing.min()) < 0:
            raise EventRejected(kind, fieldname, f"negative expert id {int(routing.min())}")
        return routing

    # -- committing ----------------------------------------------------------------------------

    def commit(self) -> int:
        """Make every appended event visible at once; returns how many. Chunks first, record last."""
        with self._lock:
            holder = self._check_usable()
            if not self._pending_headers:
                return 0
            try:
                # S3: the lease still ours (renewed) before any chunk is written, else refused here, so a
                # writer that stalled past its lease cannot overwrite its successor's chunks
                holder.before_commit()
                streams = self._streams.values()
                _store.write_chunks([w for stream in streams for w in stream.commit_writes()])
                if self._config.fsync:
                    for stream in streams:
                        if isinstance(stream, PackedStream) and stream.touched:
                            stream.fsync()
                    self._fsync.files([key for s in streams if isinstance(s, ChunkStream) for key in s.written_keys()])
                record = Commit(
                    seq=self._next_commit, first_event=self._next_event - len(self._pending_headers),
                    header_ends=list(self._pending_headers),
                    ends={name: s.end for name, s in self._streams.items() if s.touched},
                    checksums={name: sorted(s.crcs.items()) for name, s in self._streams.items() if s.crcs},
                    time=time.time())
                keys = self._commits.append(record.encode())
                if self._config.fsync:
                    self._commits.fsync()
                    self._fsync.files(keys)
            except BaseException as exc:
                self._broken = f"{type(exc).__name__}: {exc}"
                self._raise_disk_full(exc, "commit")
                raise
            for stream in self._streams.values():
                stream.mark_committed()
            self._next_commit += 1
            count = len(self._pending_headers)
            self._pending_headers = []
            return count

    def _raise_disk_full(self, exc: BaseException, stage: str) -> None:
        """A full file system as ``DiskFull`` (naming the segment and what is intact), not a bare OSError."""
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC and not isinstance(exc, DiskFull):
            raise DiskFull(self.writer_id, stage, self._next_commit, os.strerror(errno.ENOSPC)) from exc

    @property
    def pending(self) -> int:
        """Events appended but not yet committed."""
        return len(self._pending_headers)

    @property
    def next_seq(self) -> int:
        return self._next_event

    def close(self) -> None:
        """Commit what is pending (unless the writer failed) and release the segment."""
        with self._lock:
            try:
                if self._broken is None and self._holder is not None and self._pending_headers:
                    self.commit()
            finally:
                self.abandon()

    def abandon(self) -> None:
        """Release the segment, dropping uncommitted events (what a crash would do)."""
        with self._lock:
            if self._holder is not None:
                for stream in getattr(self, "_streams", {}).values():
                    stream.close()
                if hasattr(self, "_commits"):
                    self._commits.close()
                self._holder.release()
                self._holder = None

    def _check_usable(self) -> _store.WriterLock:
        """The writer's lock, when it is open and has not failed; else LogError."""
        if self._holder is None:
            raise LogError(f"writer {self.writer_id!r} is closed; open a new one with log.writer(...)")
        if self._broken is not None:
            raise LogError(f"writer {self.writer_id!r} failed earlier ({self._broken}); close it and reopen "
                           "log.writer(...) to resume from the last commit")
        return self._holder

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()

    # -- trio ----------------------------------------------------------------------------------

    async def aappend(self, event: Event) -> str:
        return await trio.to_thread.run_sync(self.append, event)

    async def acommit(self) -> int:
        return await trio.to_thread.run_sync(self.commit)

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self.close)

    async def acommit_periodically(self, interval: float = 0.05) -> None:
        """Group commit: every ``interval`` seconds commit what is pending, until cancelled (then a
        last, shielded commit). Run it in the actor's nursery and just ``aappend``: a commit costs
        a few store writes whatever its size, so batching turns per commit is much cheaper."""
        try:
            while True:
                await trio.sleep(interval)
                if self.pending:
                    await self.acommit()
        finally:
            with trio.CancelScope(shield=True):
                if self.pending and self._broken is None and self._holder is not None:
                    await self.acommit()

    async def __aenter__(self) -> SegmentWriter:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc_type is None:
            await self.aclose()
        else:
            self.abandon()


def _array(group: zarr.Group, name: str) -> zarr.Array[Any]:
    """The segment's array ``name`` (a group there is a damaged segment)."""
    node = group[name]
    if not isinstance(node, zarr.Array):
        raise LogError(f"{group.path}/{name} is a group, not one of the segment's arrays")
    return node
