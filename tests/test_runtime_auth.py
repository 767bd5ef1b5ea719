"""Frame sealing: forged, replayed, stale, malformed and misrouted frames are refused with a reason."""

from __future__ import annotations

import hashlib
import hmac
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.messages import Ping
from t1_actors.runtime.auth import BULK, MAGIC, REPLY, REQUEST, Opener, Sealer
from t1_actors.runtime.errors import AuthError
from t1_actors.runtime.wire import pack_envelope, unpack_envelope

KEY = b"k" * 32
HI = Ping(payload=b"hi")


def frame(record=HI, key=KEY, channel=REQUEST):
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
    prefix = MAGIC + REQUEST + struct.pack(">Q", sent_ns) + b"n" * 16
    mac = hmac.new(KEY, prefix + body, hashlib.sha256).digest()
    return prefix + mac + body


def test_frames_of_another_wire_version_are_refused_by_name():
    """A peer running an older t1 (wire version 1 sealed bulk frames with HMAC too) is told apart from a forger."""
    old = b"T1\x01" + frame()[3:]
    with pytest.raises(AuthError, match="wire version 1 .* speaks version 2: run the same t1 release") as err:
        Opener(KEY, 60).open(REQUEST, old)
    assert err.value.reason == "version"


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


# ---- bulk frames: AES-256-GMAC -------------------------------------------------------------------
BIG = bytes(range(256)) * 4096 * 9  # 9 MiB: over OFFLOAD_BYTES, so the worker-thread path runs too


def _bulk_frame(body: bytes, key: bytes = KEY) -> bytes:
    return Sealer(key).seal(BULK, body)


def test_bulk_mac_is_aes256_gmac_of_prefix_and_body():
    """The documented construction, recomputed independently: GCM with no plaintext, the frame as
    associated data, the IV the nonce's first 12 bytes, the key HMAC-SHA256(run key, label)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    body = b"\x93\x01\x02\x03" * 100
    sealed = _bulk_frame(body)
    prefix, tag = sealed[:28], sealed[28:44]
    key = hmac.new(KEY, b"t1 bulk frame AES-256-GMAC key", hashlib.sha256).digest()
    assert AESGCM(key).encrypt(prefix[12:24], b"", prefix + body) == tag
    assert sealed[44:] == body
    assert bytes(Opener(KEY, 60).open(BULK, sealed)) == body


@pytest.mark.parametrize("where", [0, 2, 3, 5, 20, 30, 50, len(BIG) // 2, -1])
def test_bulk_frames_tampered_anywhere_are_refused(where):
    sealed = bytearray(_bulk_frame(BIG))
    sealed[where] ^= 0x01
    expected = {0: "unsigned", 2: "version", 3: "wrong_channel"}.get(where, "bad_mac")
    assert reason(lambda: Opener(KEY, 60).open(BULK, bytes(sealed))) == expected


def test_bulk_and_control_macs_do_not_stand_in_for_each_other():
    body = pack_envelope("a", "b", Ping(payload=b"hi"), b"12345678")
    control = Sealer(KEY).seal(REQUEST, body)
    as_bulk = MAGIC + BULK + control[4:]  # the HMAC'd frame relabelled as bulk
    assert reason(lambda: Opener(KEY, 60).open(BULK, as_bulk)) == "bad_mac"
    bulk = _bulk_frame(body)
    as_request = MAGIC + REQUEST + bulk[4:]
    assert reason(lambda: Opener(KEY, 60).open(REQUEST, as_request)) == "bad_mac"
    assert reason(lambda: Opener(b"x" * 32, 60).open(BULK, bulk)) == "bad_mac"  # another run's key


def test_large_bulk_frames_are_sealed_and_checked_in_a_worker_thread():
    import trio

    async def main():
        sealer, opener = Sealer(KEY), Opener(KEY, 60)
        header = await sealer.aheader(BULK, BIG[:1000], BIG[1000:])
        assert header == header[:28] + sealer._macs[BULK].digest(header[:28], BIG)  # same MAC as inline
        assert bytes(await opener.aopen(BULK, header + BIG)) == BIG
        tampered = bytearray(header + BIG)
        tampered[-1] ^= 1
        with pytest.raises(AuthError) as err:
            await opener.aopen(BULK, bytes(tampered))
        assert err.value.reason == "bad_mac"
        with pytest.raises(AuthError) as err:
            await opener.aopen(BULK, header + BIG)
        assert err.value.reason == "replayed"

    trio.run(main)
