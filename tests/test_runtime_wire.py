"""The bulk encoder: ``pack_parts`` is ``pack`` without copying large values, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.codec import pack, pack_parts, unpack
from schemas.messages import Generic
from t1_actors.runtime.auth import BULK, Opener, Sealer
from t1_actors.runtime.wire import pack_envelope, pack_envelope_parts, unpack_envelope

RNG = np.random.default_rng(7)
BIG = 1 << 16


def joined(parts) -> bytes:
    return b"".join(bytes(memoryview(p)) for p in parts)


@pytest.mark.parametrize("value", [
    [b"small", 1, "s"],
    {"blob": RNG.bytes(BIG), "nested": [RNG.bytes(BIG + 1), {"deep": RNG.bytes(3 * BIG)}], "n": None},
    [RNG.integers(0, 1 << 20, size=(300, 70), dtype=np.int32), np.ones(BIG, dtype=bool)],
    [np.arange(2 * BIG, dtype=np.int64)[::2]],  # not contiguous: encoded from a contiguous copy
    [np.arange(BIG, dtype=">i4")],  # another byte order: no flat view, copied
    [np.zeros(BIG, dtype=np.float16), bytearray(BIG), memoryview(bytes(BIG))],
])
def test_parts_join_to_exactly_pack(value):
    parts = pack_parts(value)
    assert joined(parts) == pack([bytes(v) if isinstance(v, (bytearray, memoryview)) else v for v in value]
                                 if isinstance(value, list) else value)


def test_large_values_are_not_copied():
    blob = RNG.bytes(4 * BIG)
    arr = RNG.integers(0, 255, size=4 * BIG, dtype=np.uint8)
    parts = pack_parts({"blob": blob, "arr": arr})
    views = [p for p in parts if isinstance(p, memoryview) and p.nbytes >= 4 * BIG]
    assert len(views) == 2
    assert any(v.obj is blob for v in views)  # a view of the value itself
    assert any(np.shares_memory(np.asarray(v), arr) for v in views)
    decoded = unpack(joined(parts))
    assert decoded["blob"] == blob
    np.testing.assert_array_equal(decoded["arr"], arr)


def test_sealed_parts_open_as_one_frame():
    record = Generic(op="blob", args={"data": RNG.bytes(5 * BIG), "ids": np.arange(BIG, dtype=np.int32)})
    parts = pack_envelope_parts("a", "b", record, b"12345678")
    assert joined(parts) == pack_envelope("a", "b", record, b"12345678")
    frame = Sealer(b"k" * 16).header(BULK, *parts) + joined(parts)
    got = unpack_envelope(Opener(b"k" * 16, 60).open(BULK, frame)).record()
    assert got.args["data"] == record.args["data"]
    np.testing.assert_array_equal(got.args["ids"], record.args["ids"])
