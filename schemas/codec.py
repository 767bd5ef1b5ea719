"""msgpack codec for records. Arrays travel as typed binary: (dtype, shape, raw bytes).

Wire form of a record: ``{"t": kind, "v": schema_version, "f": {field: value}}``. An array is a
msgpack extension (code 1) whose body is ``msgpack([dtype_str, shape]) + raw C-order bytes``.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import msgpack
import numpy as np

from schemas.base import Record, SchemaError
from schemas.registry import lookup

_ARRAY_EXT = 1
_ALLOWED_DTYPES = {
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "bool",
}


def _array_head(obj: np.ndarray) -> tuple[np.ndarray, bytes]:
    """The contiguous array and the head of its ext body, ``msgpack([dtype_str, shape])``."""
    if obj.dtype.name not in _ALLOWED_DTYPES:
        raise SchemaError("array", None, f"dtype {obj.dtype} cannot travel; use a numeric dtype")
    arr = np.ascontiguousarray(obj)
    return arr, msgpack.packb([arr.dtype.str, list(arr.shape)])


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr, head = _array_head(obj)
        return msgpack.ExtType(_ARRAY_EXT, head + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code != _ARRAY_EXT:
        raise SchemaError("array", None, f"unknown msgpack extension code {code}")
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    dtype_str, shape = unpacker.unpack()
    offset = unpacker.tell()
    dtype = np.dtype(dtype_str)
    if dtype.name not in _ALLOWED_DTYPES:
        raise SchemaError("array", None, f"dtype {dtype_str} not allowed on the wire")
    count = int(np.prod(shape)) if shape else 1
    if len(data) - offset != count * dtype.itemsize:
        raise SchemaError("array", None, f"{len(data) - offset} bytes for shape {shape} of {dtype.name}")
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
    return arr


def pack(value: Any) -> bytes:
    """msgpack with numpy arrays as typed binary."""
    packed: bytes = msgpack.packb(value, default=_default, use_bin_type=True)
    return packed


_SPLICE_BYTES = 1 << 16  # bytes and arrays this large are not copied by pack_parts


def _raw_bytes(arr: np.ndarray) -> memoryview:
    """The C-order bytes of a contiguous array, in place where the buffer protocol allows it."""
    try:
        return arr.data.cast("B")  # arr.data: memoryview(arr), typed
    except (TypeError, ValueError):  # e.g. a non-native byte order: no flat view, so copy
        return memoryview(arr.tobytes())


def pack_parts(value: Any) -> list[bytes | memoryview]:
    """``pack(value)`` as a list of buffers whose concatenation is exactly ``pack(value)``, without
    copying large bytes values and arrays: those appear in the list as views of their own memory.
    For a sender that copies the parts once, into a socket's message.

    How: each large value is packed as a 16-byte random token, and the token's encoding in the output
    is then replaced by the value's msgpack header (bin 32 / ext 32) and its memory.
    """
    spliced: dict[bytes, tuple[bytes, Any]] = {}

    def swap(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: swap(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [swap(v) for v in obj]
        if isinstance(obj, (bytes, bytearray, memoryview)) and len(obj) >= _SPLICE_BYTES:
            token = os.urandom(16)
            data = memoryview(obj).cast("B")
            spliced[token] = (b"\xc6" + struct.pack(">I", data.nbytes), data)
            return token
        if isinstance(obj, np.ndarray) and obj.nbytes >= _SPLICE_BYTES:
            arr, head = _array_head(obj)
            token = os.urandom(16)
            data = _raw_bytes(arr)
            spliced[token] = (b"\xc9" + struct.pack(">Ib", len(head) + data.nbytes, _ARRAY_EXT) + head, data)
            return token
        return obj

    packed = pack(swap(value))
    if not spliced:
        return [packed]
    parts: list[bytes | memoryview] = []
    start = 0
    view = memoryview(packed)
    for at, token in sorted((packed.index(b"\xc4\x10" + token), token) for token in spliced):
        header, data = spliced[token]
        parts += [view[start:at], header, data]
        start = at + 18
    parts.append(view[start:])
    return parts


def unpack(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def to_wire(record: Record) -> dict[str, Any]:
    fields = {name: getattr(record, name) for name in type(record).model_fields}
    return {"t": record.kind, "v": record.schema_version, "f": fields}


def from_wire(obj: Any) -> Record:
    if not isinstance(obj, dict) or set(obj) != {"t", "v", "f"}:
        raise SchemaError("record", None, "malformed envelope (expected a map with keys t, v, f)")
    kind, version, fields = obj["t"], obj["v"], obj["f"]
    if not isinstance(kind, str):
        raise SchemaError("record", "t", "record type must be a string")
    cls = lookup(kind)
    if not isinstance(version, int) or version < 1:
        raise SchemaError(cls.__name__, None, f"bad schema version {version!r}")
    if version > cls.schema_version:
        raise SchemaError(cls.__name__, None,
                          f"schema version {version} is newer than this t1 understands ({cls.schema_version}); upgrade t1")
    if not isinstance(fields, dict):
        raise SchemaError(cls.__name__, None, "fields must be a map")
    return cls(**fields)


def encode(record: Record) -> bytes:
    """Record -> bytes."""
    if not isinstance(record, Record):
        raise SchemaError(type(record).__name__, None, "only registered t1 records can be encoded")
    return pack(to_wire(record))


def decode(data: bytes) -> Record:
    """Bytes -> record; a clear SchemaError for anything malformed, unknown or too new."""
    try:
        obj = unpack(data)
    except SchemaError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types on garbage
        raise SchemaError("record", None, f"not a valid msgpack record ({type(exc).__name__}: {exc})") from None
    return from_wire(obj)
