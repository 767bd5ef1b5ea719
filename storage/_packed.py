"""PackedStore: a zarr LocalStore that keeps each marked array's chunks in one file, back to back.

zarr's LocalStore writes one file per chunk (temp file + rename), which costs a file creation and a
rename per chunk: on the development machine the bytes of the event log then went to disk at about
half the speed of one ``numpy.tofile`` of the same bytes. Here an array whose metadata carries the
attribute ``t1_packed_chunks`` (and is uncompressed, chunked along its first axis only, fill value
zero) keeps chunk ``i`` at byte ``i * chunk_bytes`` of ``<array>/c/packed``: the file is the
array's raw little-endian bytes, a sparse image in which bytes never written read as zero (the fill
value). Every other key behaves exactly as in LocalStore, so the directory is still an ordinary
zarr hierarchy when opened through this store (``zarr.open_array(PackedStore(dir), path=...)``).

Chunk writes here replace bytes in place instead of renaming a file, so a concurrent reader of a
chunk being rewritten may see a mix. The event log never rewrites bytes a commit made visible, so
its readers are unaffected; other users of this store should not read a chunk while it is written.
The event log's writers bypass zarr's codec pipeline for packed arrays and ``pwrite`` rows straight
into the pack file (``pack_file`` says where), which is what makes appends as fast as a raw file.
"""

from __future__ import annotations

import asyncio
import builtins
import ctypes
import ctypes.util
import json
import os
import sys
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.storage import LocalStore

PACKED_ATTR = "t1_packed_chunks"
PACK_NAME = "packed"  # <array>/c/packed: inside the chunk directory zarr would otherwise fill


@dataclass(frozen=True)
class PackLayout:
    """Where an array's chunks live in its pack file."""

    path: Path
    chunk_bytes: int
    ndim: int
    dtype: np.dtype
    inner: tuple[int, ...]  # shape of one row (every axis but the first)
    chunk_rows: int


def packable(dtype: np.dtype) -> bool:
    """Rows of this dtype can be written to a pack file as they are in memory (little endian)."""
    dtype = np.dtype(dtype)
    return dtype.kind in "biuf" and (dtype.byteorder == "|" or dtype.byteorder == "<"
                                     or (dtype.byteorder == "=" and sys.byteorder == "little"))


class PackedStore(LocalStore):
    """LocalStore in which arrays marked ``t1_packed_chunks`` keep their chunks in one file."""

    def __init__(self, root: Path | str, *, read_only: bool = False) -> None:
        super().__init__(root, read_only=read_only)
        self._layouts: dict[str, PackLayout | None] = {}  # array path -> layout; None: not packed

    # -- which keys are packed -----------------------------------------------------------------

    def pack_file(self, array_path: str) -> PackLayout | None:
        """The pack layout of the array at ``array_path``, or None if it keeps one file per chunk."""
        array_path = array_path.strip("/")
        if array_path in self._layouts:
            return self._layouts[array_path]
        try:
            meta = json.loads((self.root / array_path / "zarr.json").read_bytes())
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None  # not (yet) an array: decide once its metadata exists
        layout = _layout(self.root / array_path, array_path, meta)
        self._layouts[array_path] = layout  # array metadata of a given path only changes on overwrite
        return layout

    def _chunk(self, key: str) -> tuple[PackLayout, int] | None:
        """(layout, chunk index) if ``key`` names a chunk of a packed array."""
        parts = key.split("/")
        for i in range(len(parts) - 2, 0, -1):
            if parts[i] != "c":
                continue
            layout = self.pack_file("/".join(parts[:i]))
            coords = parts[i + 1:]
            if layout is None or len(coords) != layout.ndim or not all(c.isdigit() for c in coords):
                continue
            if any(int(c) != 0 for c in coords[1:]):
                return None  # outside the chunk grid (one chunk along every inner axis)
            return layout, int(coords[0])
        return None

    # -- zarr Store interface ------------------------------------------------------------------

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        found = self._chunk(key)
        if found is None:
            return await super().get(key, prototype, byte_range)
        prototype = prototype or default_buffer_prototype()
        data = await asyncio.to_thread(_read_chunk, *found)
        return None if data is None else prototype.buffer.from_bytes(_slice(data, byte_range))

    def get_sync(self, key: str, *, prototype: BufferPrototype | None = None,
                 byte_range: ByteRequest | None = None) -> Buffer | None:
        found = self._chunk(key)
        if found is None:
            return super().get_sync(key, prototype=prototype, byte_range=byte_range)
        data = _read_chunk(*found)
        prototype = prototype or default_buffer_prototype()
        return None if data is None else prototype.buffer.from_bytes(_slice(data, byte_range))

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> builtins.list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def set(self, key: str, value: Buffer) -> None:
        await self._set(key, value)

    def set_sync(self, key: str, value: Buffer) -> None:
        self._forget(key)
        found = self._chunk(key)
        if found is None:
            return super().set_sync(key, value)
        self._check_writable()
        _write_chunk(*found, value.as_buffer_like())

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        if self._chunk(key) is None:
            return await super().set_if_not_exists(key, value)
        if not await self.exists(key):
            await self.set(key, value)

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        self._forget(key)
        found = self._chunk(key)
        if found is None:
            return await super()._set(key, value, exclusive)
        if not self._is_open:
            await self._open()
        self._check_writable()
        await asyncio.to_thread(_write_chunk, *found, value.as_buffer_like())

    async def delete(self, key: str) -> None:
        self._forget(key)
        found = self._chunk(key)
        if found is None:
            return await super().delete(key)
        self._check_writable()
        await asyncio.to_thread(_zero_chunk, *found)

    async def delete_dir(self, prefix: str) -> None:
        prefix = prefix.strip("/")
        for path in list(self._layouts):
            if path == prefix or path.startswith(prefix + "/") or not prefix:
                del self._layouts[path]
        await super().delete_dir(prefix)

    async def exists(self, key: str) -> bool:
        found = self._chunk(key)
        if found is None:
            return await super().exists(key)
        return _chunks_present(found[0]) > found[1]

    async def getsize(self, key: str) -> int:
        found = self._chunk(key)
        if found is None:
            return await super().getsize(key)
        if _chunks_present(found[0]) <= found[1]:
            raise FileNotFoundError(key)
        return found[0].chunk_bytes

    async def list(self) -> AsyncIterator[str]:
        async for key in super().list():
            for out in self._expand(key):
                yield out

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        async for key in super().list_prefix(prefix):
            for out in self._expand(key):
                yield out

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        parts = prefix.strip("/").split("/")
        layout = self.pack_file("/".join(parts[:-1])) if parts[-1] == "c" and len(parts) > 1 else None
        if layout is None:
            async for name in super().list_dir(prefix):
                yield name
            return
        for chunk in range(_chunks_present(layout)):  # the chunk directory lists chunk indices
            yield str(chunk)

    def _expand(self, key: str) -> builtins.list[str]:  # builtins: ``list`` here is the Store method
        """A listed file as zarr sees it: the pack file stands for the chunks it holds."""
        head, _, name = key.rpartition("/")
        if name != PACK_NAME or not head.endswith("/c"):
            return [key]
        layout = self.pack_file(head[:-2])
        if layout is None:
            return [key]
        tail = "/0" * (layout.ndim - 1)
        return [f"{head}/{chunk}{tail}" for chunk in range(_chunks_present(layout))]

    def _forget(self, key: str) -> None:
        if key == "zarr.json" or key.endswith("/zarr.json"):  # an array (re)defined: look again
            self._layouts.pop(key.rpartition("/")[0], None)


def _layout(directory: Path, array_path: str, meta: dict[str, Any]) -> PackLayout | None:
    if meta.get("node_type") != "array" or not (meta.get("attributes") or {}).get(PACKED_ATTR):
        return None
    shape = meta["shape"]
    chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
    codecs = meta.get("codecs", [])
    endian = (codecs[0].get("configuration") or {}).get("endian", "little") if len(codecs) == 1 else None
    dtype = np.dtype(meta["data_type"]) if isinstance(meta.get("data_type"), str) else None
    encoding = meta.get("chunk_key_encoding", {})
    if (meta["chunk_grid"].get("name") != "regular" or list(chunks[1:]) != list(shape[1:])
            or len(codecs) != 1 or codecs[0].get("name") != "bytes" or endian != "little"
            or dtype is None or not packable(dtype) or meta.get("fill_value") not in (0, 0.0, False)
            or encoding.get("name") != "default" or (encoding.get("configuration") or {}).get("separator") != "/"):
        raise ValueError(f"array {array_path!r} is marked {PACKED_ATTR} but its layout cannot be packed "
                         "(needs: regular chunks along the first axis only, the bytes codec alone, little "
                         "endian, fill value 0, default chunk keys); recreate it without the attribute")
    rows = int(chunks[0])
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    return PackLayout(directory / "c" / PACK_NAME, rows * row_bytes, len(shape), dtype,
                      tuple(int(s) for s in shape[1:]), rows)


def _chunks_present(layout: PackLayout) -> int:
    try:
        size = layout.path.stat().st_size
    except FileNotFoundError:
        return 0
    return -(-size // layout.chunk_bytes)


def _read_chunk(layout: PackLayout, chunk: int) -> bytes | None:
    """A chunk's bytes; past the end of the file a chunk is absent, a short last one is zero-padded."""
    try:
        fd = os.open(layout.path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = os.pread(fd, layout.chunk_bytes, chunk * layout.chunk_bytes)
    finally:
        os.close(fd)
    if not data:
        return None
    return data + bytes(layout.chunk_bytes - len(data)) if len(data) < layout.chunk_bytes else data


def _write_chunk(layout: PackLayout, chunk: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    if len(view) != layout.chunk_bytes:
        raise ValueError(f"chunk {chunk} of {layout.path.parent.parent}: {len(view)} bytes, "
                         f"expected {layout.chunk_bytes} (uncompressed whole chunk)")
    layout.path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(layout.path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        pwrite_all(fd, view, chunk * layout.chunk_bytes)
    finally:
        os.close(fd)


def _zero_chunk(layout: PackLayout, chunk: int) -> None:
    if _chunks_present(layout) > chunk:
        _write_chunk(layout, chunk, bytes(layout.chunk_bytes))


def _slice(data: bytes, byte_range: ByteRequest | None) -> bytes:
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start:byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset:]
    if isinstance(byte_range, SuffixByteRequest):
        return data[max(0, len(data) - byte_range.suffix):]
    raise TypeError(f"unexpected byte range {byte_range!r}")


def pwrite_all(fd: int, data: bytes | bytearray | memoryview | np.ndarray, offset: int) -> None:
    """``os.pwrite`` until every byte is written (a regular file may take fewer bytes per call).
    ``data``: bytes or a C-contiguous array."""
    buffer = data.data if isinstance(data, np.ndarray) else data  # an array's own memory: ndarray.data
    written = os.pwrite(fd, buffer, offset)
    if written < (data.nbytes if isinstance(data, np.ndarray) else len(data)):  # rare: go on byte-wise
        view = memoryview(buffer).cast("B")[written:]
        offset += written
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written


def pread_into(fd: int, out: np.ndarray, offset: int) -> int:
    """Fill the C-contiguous ``out`` from byte ``offset``; returns the bytes read (short at EOF)."""
    if out.nbytes == 0:  # an empty payload (memoryview cannot cast a shape with a zero)
        return 0
    view = out.data.cast("B")  # ndarray.data: memoryview(out)
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done


_FALLOC_FL_KEEP_SIZE = 1
_EXT4_MAGIC = 0xEF53
_libc: ctypes.CDLL | Literal[False] | None = None  # looked up on first use; False where there is none


def _lib() -> ctypes.CDLL | Literal[False]:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            _libc.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
        except (OSError, AttributeError):
            _libc = False
    return _libc


def reserve_pays(fd: int) -> bool:
    """Whether reserving blocks before a write speeds it up on the file system holding ``fd``: on
    ext4 (measured: writes ~1.35x faster, the block allocation done in one call instead of page by
    page); not on tmpfs, where a reservation allocates and zeroes memory the write then overwrites."""
    lib = _lib()
    if not lib or not sys.platform.startswith("linux"):
        return False
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first word
    if lib.fstatfs(fd, buf) != 0:
        return False
    return int.from_bytes(buf.raw[:ctypes.sizeof(ctypes.c_long)], sys.byteorder) == _EXT4_MAGIC


def reserve(fd: int, offset: int, length: int) -> bool:
    """Allocate the disk blocks of ``[offset, offset + length)`` without changing the file size
    (``fallocate(FALLOC_FL_KEEP_SIZE)``); False if that failed (the write then allocates as usual)."""
    lib = _lib()
    return lib is not False and lib.fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0
