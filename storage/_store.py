"""A thin synchronous face over any zarr v3 store: raw keys for commit records, one-writer locks.

Stores must replace a key atomically (a reader sees the old or the new value, never a torn one):
LocalStore (temp file + rename), MemoryStore and object stores (S3, GCS, ...) do. A directory
opens as a ``PackedStore`` (a LocalStore that packs the log's uncompressed arrays into one file
each; chunks are never rewritten once committed, so in-place chunk writes are safe for the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import zarr
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from storage._lease import S3Lease, check_bucket, is_s3
from storage._packed import PackedStore
from storage.errors import WriterBusy

WRITER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def open_store(location: Any) -> Store:
    """A zarr store for a directory path, an fsspec URL (``s3://...``, ``memory://...``) or a store."""
    if type(location) is zarr.storage.LocalStore:  # the same directory, its log arrays packed
        return PackedStore(location.root, read_only=location.read_only)
    if isinstance(location, Store):
        return location
    if isinstance(location, (str, os.PathLike)):
        text = os.fspath(location)
        if "://" in text and not text.startswith("file://"):
            options: dict[str, Any] | None = None
            if text.startswith(("s3://", "s3a://")):
                # a log is read while it grows: fsspec's cached directory listings would hide new segments
                options = {"use_listings_cache": False}
                endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
                if endpoint:  # in s3fs's instance-cache key: after the endpoint changes, a new client, not the old
                    options["endpoint_url"] = endpoint
            store = zarr.storage.FsspecStore.from_url(text, storage_options=options)
            if is_s3(store):
                check_bucket(store, text)
            return store
        return PackedStore(text.removeprefix("file://"))
    raise TypeError(f"cannot open an event log on {type(location).__name__}; "
                    "pass a directory path, an fsspec URL or a zarr Store")


def describe(store: Store) -> str:
    return str(getattr(store, "root", None) or store)


def get(store: Store, key: str) -> bytes | None:
    """The bytes at a plain key (commit records, metadata), or None."""
    if isinstance(store, zarr.storage.LocalStore):  # plain file I/O: no event-loop hop, no Buffer
        try:
            fd = os.open(os.path.join(store.root, key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            parts = []
            while chunk := os.read(fd, max(65536, os.fstat(fd).st_size)):
                parts.append(chunk)
            return b"".join(parts)
        except IsADirectoryError:
            return None
        finally:
            os.close(fd)
    buf = sync(store.get(key, default_buffer_prototype()))
    return None if buf is None else buf.to_bytes()


def get_json(store: Store, key: str) -> dict[str, Any] | None:
    """A JSON document (zarr metadata) at ``key``, or None if there is none."""
    data = get(store, key)
    if data is None:
        return None
    try:
        document: dict[str, Any] = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"{describe(store)}/{key} is not valid JSON ({exc})") from None
    return document


def get_many(store: Store, keys: list[str]) -> list[bytes | None]:
    """Fetch several keys concurrently (one round trip's latency on object stores)."""
    if isinstance(store, zarr.storage.LocalStore):
        return [get(store, key) for key in keys]

    async def fetch_all() -> list[bytes | None]:
        bufs = await asyncio.gather(*(store.get(k, default_buffer_prototype()) for k in keys))
        return [None if b is None else b.to_bytes() for b in bufs]
    return sync(fetch_all())


_temp_names = itertools.count()


def put(store: Store, key: str, data: bytes) -> None:
    """Store a plain key atomically (readers see the old value or the new one, never a torn one)."""
    if isinstance(store, zarr.storage.LocalStore):  # what LocalStore does (temp file + rename), at a
        store._check_writable()                     # fifth of its cost: a commit record per commit
        path = os.path.join(store.root, key)
        temp = f"{path}.{os.getpid()}-{next(_temp_names)}.partial"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        return
    sync(store.set(key, default_buffer_prototype().buffer.from_bytes(data)))


def write_chunks(writes: list[tuple[zarr.Array[Any], int, Any]]) -> None:
    """Write whole chunks ``(array, first row, rows of exactly one chunk)``, all concurrently in one
    round trip. Each is an exact-chunk write, so zarr encodes the given rows as they are (a
    multi-chunk write would first copy every chunk into a fill-value buffer)."""
    if not writes:
        return

    async def write_all() -> None:
        await asyncio.gather(*(array.async_array.setitem(slice(row, row + len(rows)), rows)
                               for array, row, rows in writes))
    sync(write_all())


def list_dir(store: Store, prefix: str) -> list[str]:
    """Names under ``prefix`` (on a directory: its subdirectories)."""
    if isinstance(store, zarr.storage.LocalStore):  # no hop through zarr's event loop thread
        try:  # directories only: a file here is metadata or a temp file being renamed into place
            with os.scandir(Path(store.root) / prefix) as entries:
                return [entry.name for entry in entries if entry.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            return []

    async def collect() -> list[str]:
        return [name async for name in store.list_dir(prefix)]
    return sync(collect())


class WriterLock:
    """Holds a segment for one writer. On a LocalStore an ``flock`` (freed by the kernel when the
    process dies, so a killed writer's segment reopens without manual steps); on S3 a lease object
    (``_lease.S3Lease``: conditional puts, a killed writer's lease expires); in every store a
    per-process registry so one process cannot open the same segment twice."""

    _held: set[tuple[int, str]] = set()
    _guard = threading.Lock()

    def __init__(self, store: Store, segment_dir: str, writer_id: str, *, lease_s: float = 30.0):
        self._key = (id(store), writer_id)
        self._fd: int | None = None
        self._lease = None
        with self._guard:
            if self._key in self._held:
                raise WriterBusy(f"segment {writer_id!r} already has an open writer in this process; "
                                 "close it first (one writer per segment)")
            self._held.add(self._key)
        root = getattr(store, "root", None)
        if isinstance(store, zarr.storage.LocalStore) and root is not None:
            path = Path(root) / segment_dir / "writer.lock"
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self._release_registry()
                raise WriterBusy(f"segment {writer_id!r} at {path.parent} is held by another live process; "
                                 "give each actor instance its own writer id") from None
            self._fd = fd
        elif is_s3(store):  # no flock on an object store: a lease taken by conditional put (_lease.py)
            try:
                self._lease = S3Lease(store, segment_dir, writer_id, lease_s)
            except BaseException:
                self._release_registry()
                raise

    def before_commit(self) -> None:
        """Called before each commit record: on S3 the lease is renewed, or the commit refused."""
        if self._lease is not None:
            self._lease.renew()

    def _release_registry(self) -> None:
        with self._guard:
            self._held.discard(self._key)

    def release(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._release_registry()


def remove_partial_files(store: Store, segment_dir: str) -> int:
    """Delete temp files a killed LocalStore write left behind (they are never read; this is tidying)."""
    root = getattr(store, "root", None)
    if not isinstance(store, zarr.storage.LocalStore) or root is None:
        return 0
    removed = 0
    for path in (Path(root) / segment_dir).rglob("*.partial"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


class Fsync:
    """Makes commits survive a power cut on a LocalStore: fsync each chunk a commit wrote, then the
    commit record, and their directories (renames are durable only once the directory is synced).
    Object stores are durable when a put returns; there this does nothing."""

    def __init__(self, store: Store, enabled: bool):
        root = getattr(store, "root", None)
        self.root = Path(root) if enabled and isinstance(store, zarr.storage.LocalStore) and root else None

    def files(self, keys: list[str]) -> None:
        if self.root is None:
            return
        dirs = set()
        for key in keys:
            path = self.root / key
            fsync_path(path, os.O_RDONLY)
            dirs.add(path.parent)
        for directory in dirs:
            fsync_path(directory, os.O_RDONLY | os.O_DIRECTORY)


def fsync_path(path: str | os.PathLike[str], flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
