"""Frame sealing: forged, replayed, stale, malformed and misrouted frames are refused with a reason."""

from __future__ import annotations

import hashlib
import hmac
import struct
import time

import pytest
from hypothesis import given, settings, strategies as st

from schemas.messages import Ping
from t1_actors.runtime.auth import BULK, REPLY, REQUEST, Opener, Sealer
from t1_actors.runtime.errors import AuthError
from t1_actors.runtime.wire import pack_envelope, unpack_envelope

KEY = b"k" * 32


def frame(record=Ping(payload=b"hi"), key=KEY, channel=REQUEST):
    return Sealer(key).seal(channel, pack_envelope("a", "b", record, b"12345678"))


def reason(fn) -> str:
    with pytest.raises(AuthError) as err:
        fn()
    return err.value.reason


def test_roundtrip():
    env = unpack_envelope(Opener(KEY, 60).open(REQUEST, frame()))
    assert (env.sender, env.dest, env.msg_id) == ("a", "b", b"12345678")
    assert env.record() == Ping(payload=b"hi")


def test_rejections_have_reasons():
    opener = Opener(KEY, 60)
    good = frame()
    opener.open(REQUEST, good)
    assert reason(lambda: opener.open(REQUEST, good)) == "replayed"
    assert reason(lambda: opener.open(REQUEST, frame(key=b"x" * 32))) == "bad_mac"
    assert reason(lambda: opener.open(REQUEST, frame(channel=REPLY))) == "wrong_channel"
    assert reason(lambda: opener.open(BULK, frame())) == "wrong_channel"
    assert reason(lambda: opener.open(REQUEST, b"short")) == "short"
    assert reason(lambda: opener.open(REQUEST, b"\x00" * 100)) == "unsigned"
    tampered = bytearray(frame())
    tampered[-1] ^= 1
    assert reason(lambda: opener.open(REQUEST, bytes(tampered))) == "bad_mac"


def _sealed_at(sent_ns: int, body: bytes = b"\x80") -> bytes:
    prefix = b"T1\x01" + REQUEST + struct.pack(">Q", sent_ns) + b"n" * 16
    mac = hmac.new(KEY, prefix + body, hashlib.sha256).digest()
    return prefix + mac + body


def test_stale_and_future_frames():
    opener = Opener(KEY, 60)
    assert reason(lambda: opener.open(REQUEST, _sealed_at(time.time_ns() - 3600 * 10**9))) == "stale"
    assert reason(lambda: opener.open(REQUEST, _sealed_at(time.time_ns() + 3600 * 10**9))) == "stale"


def test_authentic_but_malformed_body():
    body = Opener(KEY, 60).open(REQUEST, _sealed_at(time.time_ns(), b"\xc1garbage"))
    with pytest.raises(AuthError, match="malformed"):
        unpack_envelope(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 80), st.binary(min_size=1, max_size=4))
def test_fuzzed_frames_never_pass(garbage, cut, patch):
    opener = Opener(KEY, 60)
    with pytest.raises(AuthError):
        opener.open(REQUEST, garbage)
    real = frame()
    mutated = real[:cut] + patch + real[cut + len(patch):]
    if mutated != real:
        with pytest.raises(AuthError):
            opener.open(REQUEST, mutated)
