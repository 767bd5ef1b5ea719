"""EventLog: opens a log on any zarr store, hands out segment writers, and reads the merged segments."""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import trio
import zarr
from zarr.abc.store import Store

from schemas import known_kinds
from schemas.events import Event
from storage import _store
from storage._cursor import Cursor
from storage._format import LOG_FORMAT, LOG_FORMATS, RoutingShape
from storage._reader import SegmentReader
from storage._writer import SegmentWriter
from storage.config import StorageConfig
from storage.errors import LogError, LogNotFound

T = TypeVar("T")
_EVENTS_PER_READ = 64  # events() reads ahead this many (read_block_bytes bounds each read)
EventRef = tuple[float, str, int]  # (append time, writer id, seq): the merge order of segments


def parse_event_id(event_id: str) -> tuple[str, int]:
    writer, sep, seq = str(event_id).rpartition(":")
    if not sep or not writer or not seq.isdigit():
        raise KeyError(f"{event_id!r} is not an event id (expected '<writer>:<seq>', e.g. 'sampler-0:12')")
    return writer, int(seq)


def log_exists(location: Any) -> bool:
    """Does ``location`` (a directory, an fsspec URL, a store) hold a log already? On S3 the bucket is
    checked first: a missing bucket, refused credentials or an unreachable endpoint raise ``LogError``
    naming the URL, so a run can validate its log's root before it starts anything."""
    if isinstance(location, (str, os.PathLike)) and "://" not in os.fspath(location):
        return (Path(location) / "zarr.json").is_file()
    return _store.get_json(_store.open_store(location), "zarr.json") is not None


class EventLog:
    """An append-only event log: one segment per writer, merged by append time when read.

    Thread-safe for reading; each segment has exactly one ``SegmentWriter``.
    """

    def __init__(self, store: Store, config: StorageConfig):
        self.store = store
        self.config = config
        self._segments: dict[str, SegmentReader] = {}
        self._by_trial: dict[str, list[tuple[str, int]]] = {}
        self._lock = threading.RLock()

    @classmethod
    def open(cls, location: Any, *, create: bool = False, config: StorageConfig | None = None) -> EventLog:
        """Open the log at a directory, an fsspec URL or a zarr store; ``create`` makes it if absent."""
        store = _store.open_store(location)
        where = _store.describe(store)
        meta = _store.get_json(store, "zarr.json")  # the root group's metadata, read as a plain key
        if meta is not None and meta.get("node_type") != "group":
            raise LogNotFound(f"{where} holds a zarr {meta.get('node_type')} that is not a t1 event log; "
                              "pick another location")
        marker = None if meta is None else (meta.get("attributes") or {}).get("t1_event_log")
        if marker is None:
            if meta is not None:
                raise LogNotFound(f"{where} holds a zarr group that is not a t1 event log; pick another location")
            if not create:
                raise LogNotFound(f"no t1 event log at {where}; pass create=True to make one")
            try:  # the marker goes in with the group's only metadata write: no half-made log
                root = zarr.create_group(store, attributes={"t1_event_log": LOG_FORMAT})
            except zarr.errors.ContainsGroupError:  # another process made it first
                return cls.open(store, config=config)
            root.require_group("segments")
        elif int(marker) not in LOG_FORMATS:
            advice = "upgrade t1" if int(marker) > LOG_FORMAT else "read it with the t1 that wrote it"
            raise LogError(f"event log at {where} has format {marker}; this t1 reads formats "
                           f"{', '.join(map(str, LOG_FORMATS))} only ({advice})")
        return cls(store, config or StorageConfig())

    # -- writing -------------------------------------------------------------------------------

    def writer(self, writer_id: str, *, routing_shape: tuple[int, int] | None = None,
               num_experts: int | None = None) -> SegmentWriter:
        """The writer of segment ``writer_id`` (an actor instance name), resuming after its last commit.

        ``routing_shape=(layers, k)`` and ``num_experts`` come from the run's model config; routing
        records of any other shape are rejected.
        """
        routing = None
        if routing_shape is not None or num_experts is not None:
            if routing_shape is None or num_experts is None or len(tuple(routing_shape)) != 2:
                raise ValueError("give both routing_shape=(layers, k) and num_experts=E (from the model config), "
                                 "or neither for a writer that never logs routing")
            layers, k = (int(v) for v in routing_shape)
            if layers <= 0 or k <= 0 or not 0 < k <= num_experts:
                raise ValueError(f"bad routing shape (layers={layers}, k={k}, num_experts={num_experts}): "
                                 "need layers > 0 and 0 < k <= num_experts")
            routing = RoutingShape(layers, k, int(num_experts))
        return SegmentWriter(self.store, writer_id, routing=routing, config=self.config)

    # -- reading -------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Catch up with every segment's commits (new segments included)."""
        with self._lock:
            for name in _store.list_dir(self.store, "segments"):
                if name != "zarr.json" and _store.WRITER_ID.match(name) and name not in self._segments:
                    self._segments[name] = SegmentReader(self.store, name, self.config)
            for writer, reader in self._segments.items():
                before = reader.event_count
                reader.refresh()
                for seq in range(before, reader.event_count):
                    trial = reader.meta[seq].trial_id
                    if trial is not None:
                        self._by_trial.setdefault(trial, []).append((writer, seq))

    def segments(self) -> list[str]:
        self.refresh()
        return sorted(self._segments)

    def _refs(self, kinds: Iterable[str] | None = None) -> list[EventRef]:
        wanted = _kind_filter(kinds)
        refs = [(m.ts, writer, seq) for writer, reader in self._segments.items()
                for seq, m in enumerate(reader.meta) if wanted is None or m.kind in wanted]
        refs.sort()
        return refs

    def _load_many(self, refs: list[tuple[str, int]]) -> list[Event]:
        """Events ``(writer, seq)`` in the given order, consecutive ones of a segment read together."""
        out: list[Event] = []
        with self._lock:
            for writer, run in itertools.groupby(refs, key=lambda ref: ref[0]):
                out.extend(self._segments[writer].load_many([seq for _, seq in run]))
        return out

    def get(self, event_id: str) -> Event:
        """The committed event with this id; KeyError if there is none (yet)."""
        writer, seq = parse_event_id(event_id)
        with self._lock:
            reader = self._segments.get(writer)
            if reader is None or seq >= reader.event_count:
                self.refresh()
                reader = self._segments.get(writer)
            if reader is None or seq >= reader.event_count:
                raise KeyError(f"no committed event {event_id!r} in the log")
            return reader.load(seq)

    def by_trial(self, trial_id: str) -> list[tuple[str, Event]]:
        """Every committed event of a trial (records with a ``trial_id`` field), in merge order."""
        with self._lock:
            self.refresh()
            refs = [(w, s) for _, w, s in sorted((self._segments[w].meta[s].ts, w, s)
                                                  for w, s in self._by_trial.get(trial_id, []))]
            return [(f"{w}:{s}", event) for (w, s), event in zip(refs, self._load_many(refs))]

    def events(self, kinds: Iterable[str] | None = None) -> Iterator[tuple[str, Event]]:
        """Every committed event (optionally only some kinds), segments merged by append time."""
        with self._lock:
            self.refresh()
            refs = self._refs(kinds)
        for lo in range(0, len(refs), _EVENTS_PER_READ):
            batch = [(writer, seq) for _, writer, seq in refs[lo:lo + _EVENTS_PER_READ]]
            for (writer, seq), event in zip(batch, self._load_many(batch)):
                yield f"{writer}:{seq}", event

    def append_times(self, kinds: Iterable[str] | None = None) -> list[tuple[str, float]]:
        """(event id, append time in Unix seconds) of every committed event (optionally only some kinds),
        in merge order, without loading the events: where a run's wall time went, from the log alone."""
        with self._lock:
            self.refresh()
            return [(f"{writer}:{seq}", ts) for ts, writer, seq in self._refs(kinds)]

    def fold(self, fn: Callable[[T, Event], T], init: T, kinds: Iterable[str] | None = None) -> T:
        """Rebuild state: ``fn(state, event)`` over every committed event in merge order."""
        return functools.reduce(lambda state, item: fn(state, item[1]), self.events(kinds), init)

    def counts(self) -> dict[str, int]:
        """Committed events by kind (headers only; no payload is read)."""
        with self._lock:
            self.refresh()
            return dict(Counter(m.kind for r in self._segments.values() for m in r.meta))

    def verify(self) -> dict[str, dict[str, int]]:
        """Check every committed chunk of every segment against its checksum (CorruptionError names
        the segment, array and chunk). Returns chunks checked per segment and array."""
        with self._lock:
            self.refresh()
            return {writer: reader.verify() for writer, reader in sorted(self._segments.items())}

    def cursor(self, position: Mapping[str, int] | None = None, *, kinds: Iterable[str] | None = None) -> Cursor:
        """A cursor over committed events after ``position`` (a saved ``cursor.position``)."""
        return Cursor(self, position, kinds=_kind_filter(kinds))

    # -- trio ----------------------------------------------------------------------------------

    @classmethod
    async def aopen(cls, location: Any, *, create: bool = False, config: StorageConfig | None = None) -> EventLog:
        return await trio.to_thread.run_sync(functools.partial(cls.open, location, create=create, config=config))

    async def awriter(self, writer_id: str, *, routing_shape: tuple[int, int] | None = None,
                      num_experts: int | None = None) -> SegmentWriter:
        """``writer`` without blocking the loop (opening recovers from the commit records)."""
        return await trio.to_thread.run_sync(functools.partial(
            self.writer, writer_id, routing_shape=routing_shape, num_experts=num_experts))

    async def aget(self, event_id: str) -> Event:
        return await trio.to_thread.run_sync(self.get, event_id)

    async def aby_trial(self, trial_id: str) -> list[tuple[str, Event]]:
        return await trio.to_thread.run_sync(self.by_trial, trial_id)

    async def afold(self, fn: Callable[[T, Event], T], init: T, kinds: Iterable[str] | None = None) -> T:
        return await trio.to_thread.run_sync(functools.partial(self.fold, fn, init, kinds))

    async def acounts(self) -> dict[str, int]:
        return await trio.to_thread.run_sync(self.counts)

    async def averify(self) -> dict[str, dict[str, int]]:
        return await trio.to_thread.run_sync(self.verify)


def _kind_filter(kinds: Iterable[str] | None) -> frozenset[str] | None:
    if kinds is None:
        return None
    if isinstance(kinds, str):
        kinds = [kinds]
    chosen = frozenset(kinds)
    unknown = chosen - set(known_kinds())
    if unknown:
        raise ValueError(f"unknown event kinds {sorted(unknown)}; known: {', '.join(known_kinds())}")
    return chosen
