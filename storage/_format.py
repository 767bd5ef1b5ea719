"""On-store format of a segment: key names, array layout, commit records and event headers.

    <root>/zarr.json                          group, attributes {"t1_event_log": LOG_FORMAT}
    <root>/segments/<writer>/zarr.json        group, attributes: writer id, routing shape
    <root>/segments/<writer>/headers          uint8 [bytes]           msgpack event headers, back to back
    <root>/segments/<writer>/<dtype>          <dtype> [elements]      1-D numeric payloads (int32 ids, ...)
    <root>/segments/<writer>/routing_sets     uint8 [tokens, bytes]   each (token, layer) top-k set as its
                                                                      combinatorial number, bit-packed (``_routing.py``)
    <root>/segments/<writer>/routing          uint8 [tokens, L, k]    expert ids as given (wider dtype when E > 256):
                                                                      format-2 logs, ``routing_encoding="ids"``, and
                                                                      records that are not sets (an id repeated)
    <root>/segments/<writer>/commits/<seq>    commit record (raw key, msgpack), or on a directory:
    <root>/segments/<writer>/commits.log      every commit record, framed, appended (``_commits.py``)

Arrays have a huge fixed shape; only the commit records say how much of each is valid. A commit
record is written after every chunk it covers, and a store replaces keys atomically, so a batch
becomes visible all at once. Checksums are CRC-32C (hardware-accelerated, ~20 GB/s, so checking
costs little next to the I/O): a commit record carries the checksum of the committed bytes of each
header chunk it (re)wrote; an event's header carries, for each of its payloads, the checksum of
each piece of it that lies in one chunk, so one event is read and checked on its own and a
mismatch still names the chunk. On a directory (``PackedStore``) uncompressed arrays keep their
chunks back to back in one file per array (``<array>/c/packed``); see ``_packed.py``.

Log formats (the root's ``t1_event_log`` attribute): 2 stored routing id by id only; 3 (new logs)
set-encodes it. Each event header names the array its routing lives in, so a reader needs no
format switch: ``routing`` rows read back as written, ``routing_sets`` rows decode (each set sorted
ascending) with the codec the array's attributes name. A writer on a format-2 log keeps writing ids,
so a t1 that reads format 2 only still reads that log.
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass
from typing import Any

import google_crc32c
import msgpack
import numpy as np
import zarr
from zarr.codecs import BloscCodec

from schemas import routing_dtype
from schemas.base import dtype_name
from storage._packed import PACKED_ATTR, PackedStore, packable
from storage._routing import CODEC_ATTR, SetCodec
from storage.config import StorageConfig

FORMAT = 2  # commit records: 2: CRC-32C, per-piece payload checksums in event headers, packed chunks
LOG_FORMAT = 3  # the log (root marker) new logs get: 3: routing set-encoded in ``routing_sets``
LOG_FORMATS = (2, 3)  # log formats this t1 reads (and appends to, each in its own routing layout)
HEADERS = "headers"
ROUTING = "routing"
ROUTING_SETS = "routing_sets"
ROUTING_ARRAYS = (ROUTING, ROUTING_SETS)  # arrays whose rows are tokens (an entry's shape[0] rows)
MAX_ROWS = 1 << 44  # logical length of every array; the commit records bound what is valid
COMMIT_BATCH = 32  # commit records fetched per round trip when catching up


def segment_dir(writer_id: str) -> str:
    return f"segments/{writer_id}"


def commit_key(writer_id: str, seq: int) -> str:
    return f"segments/{writer_id}/commits/{seq:012d}"


def crc32c(rows: np.ndarray, crc: int = 0) -> int:
    """CRC-32C of the rows' bytes, continuing from ``crc`` (the checksum of the bytes before them)."""
    extended: int = google_crc32c.extend(crc, np.ascontiguousarray(rows))
    return extended


def pieces(rows: np.ndarray, first_row: int, chunk_rows: int) -> list[list[int]]:
    """``[[chunk, crc32c], ...]`` of the parts of the C-contiguous ``rows`` (starting at row
    ``first_row`` of their array) that lie in one chunk each."""
    n = len(rows)
    chunk = first_row // chunk_rows
    if first_row + n <= (chunk + 1) * chunk_rows:  # the common case: all in one chunk
        return [[chunk, google_crc32c.value(rows)]] if n else []
    out = []
    lo = 0
    while lo < n:
        chunk = (first_row + lo) // chunk_rows
        hi = min(n, (chunk + 1) * chunk_rows - first_row)
        out.append([chunk, google_crc32c.value(rows[lo:hi])])
        lo = hi
    return out


@dataclass(frozen=True)
class RoutingShape:
    """Per-token routing record shape of the run's model: [layers, k] expert ids below num_experts."""

    layers: int
    k: int
    num_experts: int

    @functools.cached_property
    def dtype(self) -> np.dtype:
        return routing_dtype(self.num_experts)

    @functools.cached_property
    def set_codec(self) -> SetCodec | None:
        """The set encoding of this shape, or None where it does not apply (``SetCodec.fits``)."""
        return SetCodec(self.layers, self.k, self.num_experts) if SetCodec.fits(self.k, self.num_experts) else None

    @functools.cached_property
    def all_ids_valid(self) -> bool:
        """Every value of the dtype is an expert id (uint8 with 256 experts): no range check needed."""
        info = np.iinfo(self.dtype)
        return info.min >= 0 and info.max < self.num_experts

    def to_attrs(self) -> dict[str, Any]:
        return {"layers": self.layers, "k": self.k, "num_experts": self.num_experts, "dtype": self.dtype.name}

    @classmethod
    def from_attrs(cls, attrs: object) -> RoutingShape | None:
        """The shape a segment's ``routing`` attribute holds (JSON as zarr reads it); None when it holds none."""
        if not attrs:
            return None
        if not isinstance(attrs, dict):
            raise ValueError(f"a segment's routing attribute is {attrs!r}, not a table")
        return cls(int(attrs["layers"]), int(attrs["k"]), int(attrs["num_experts"]))


@dataclass
class Commit:
    """A commit record: events [first_event, first_event + len(header_ends)) become visible."""

    seq: int
    first_event: int
    header_ends: list[int]  # end offset in the header array of each event of this batch
    ends: dict[str, int]  # array -> committed rows after this commit (arrays not named: unchanged)
    checksums: dict[str, list[tuple[int, int]]]  # header chunks: array -> [(chunk, crc32c of its committed rows)]
    time: float

    def encode(self) -> bytes:
        body = msgpack.packb({
            "seq": self.seq, "first_event": self.first_event, "header_ends": self.header_ends,
            "ends": self.ends, "checksums": {k: [list(p) for p in v] for k, v in self.checksums.items()},
            "time": self.time, "format": FORMAT,
        }, use_bin_type=True)
        record: bytes = msgpack.packb([FORMAT, body, zlib.crc32(body)], use_bin_type=True)
        return record

    @classmethod
    def decode(cls, data: bytes) -> Commit:
        """Parse a commit record; ValueError if it is damaged or of an unknown format."""
        try:
            fmt, body, crc = msgpack.unpackb(data, raw=False)
        except Exception as exc:
            raise ValueError(f"unreadable commit record ({type(exc).__name__})") from None
        if not isinstance(fmt, int):
            raise ValueError("unreadable commit record (no format number)")
        if fmt != FORMAT:
            raise ValueError(f"commit record format {fmt}, this t1 reads format {FORMAT} only "
                             f"({'upgrade t1' if fmt > FORMAT else 'replay the log with the t1 that wrote it'})")
        if zlib.crc32(body) != crc:
            raise ValueError("commit record checksum mismatch")
        obj = msgpack.unpackb(body, raw=False, strict_map_key=False)
        return cls(seq=obj["seq"], first_event=obj["first_event"], header_ends=list(obj["header_ends"]),
                   ends=dict(obj["ends"]), time=obj["time"],
                   checksums={k: [(int(c), int(s)) for c, s in v] for k, v in obj["checksums"].items()})


def stream_name(dtype: np.dtype | str) -> str:
    """The array that holds 1-D payloads of this dtype."""
    return dtype_name(dtype if isinstance(dtype, np.dtype) else np.dtype(dtype))


def rows_per_chunk(chunk_bytes: int, row_bytes: int) -> int:
    return max(1, chunk_bytes // max(1, row_bytes))


def create_array(group: zarr.Group, name: str, dtype: np.dtype, inner: tuple[int, ...],
                 config: StorageConfig, set_codec: SetCodec | None = None) -> zarr.Array[Any]:
    """A fresh append-only array of a segment, chunked along its first axis. ``routing_sets``
    (``set_codec`` given) is never compressed: its bytes are already at the sets' entropy."""
    dtype = np.dtype(dtype)
    row_bytes = dtype.itemsize * math.prod(inner)
    target = config.vector_chunk_bytes
    if name == HEADERS:
        target = config.header_chunk_bytes
    elif name in ROUTING_ARRAYS:
        target = config.routing_chunk_bytes
    rows = rows_per_chunk(target, row_bytes)
    shuffle = config.routing_shuffle if name == ROUTING else config.numeric_shuffle
    compressors = None if config.codec == "none" or name == ROUTING_SETS else [
        BloscCodec(cname=config.codec, clevel=config.clevel, shuffle=shuffle)]
    packed = compressors is None and isinstance(group.store, PackedStore) and packable(dtype)
    attributes: dict[str, Any] = {PACKED_ATTR: True} if packed else {}
    if name == ROUTING_SETS:
        if set_codec is None:
            raise ValueError(f"{ROUTING_SETS} needs the set codec of the segment's routing shape")
        attributes[CODEC_ATTR] = set_codec.to_attrs()
    return group.create_array(
        name, shape=(MAX_ROWS, *inner), chunks=(rows, *inner), dtype=dtype, fill_value=0,
        compressors=compressors, attributes=attributes or None,
        config={"write_empty_chunks": True}, overwrite=True)  # only ever called when absent
