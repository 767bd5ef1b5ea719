"""Forged frames: what a peer without the run's key (or with a stale, replayed or damaged frame) can send, each
with the reason the receiver must give when it drops it. Shared by the chaos wire section and
tests/test_runtime_fuzz.py."""

from __future__ import annotations

import os
import random
import struct
import time

from schemas.messages import Ping
from t1_actors.runtime.auth import MAGIC, REQUEST, Sealer
from t1_actors.runtime.wire import pack_envelope


def sealed_at(key: bytes, sent_ns: int, body: bytes, channel: bytes = REQUEST) -> bytes:
    """A frame sealed with ``key`` as a sender whose clock reads ``sent_ns`` would seal it."""
    prefix = MAGIC + channel + struct.pack(">Q", sent_ns) + os.urandom(16)
    return prefix + Sealer(key)._macs[channel].digest(prefix, body) + body


def authentic_garbage(key: bytes, rng: random.Random) -> bytes:
    body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
    return sealed_at(key, time.time_ns(), body)


def forged_frames(n: int, key: bytes, replay: bytes, rng: random.Random, *, dest: str = "echo-0",
                  record=None) -> list[tuple[str, bytes]]:
    """``n`` control frames the receiver must drop, each with the reason it must give (``"x"``: a flipped
    bit hit the magic or channel, so the reason is whatever the frame became)."""
    record = Ping() if record is None else record
    good = Sealer(key)
    out = []
    for i in range(n):
        kind = i % 9
        if kind == 0:
            out.append(("short", os.urandom(rng.randint(0, 59))))
        elif kind == 1:
            out.append(("unsigned", b"X" + os.urandom(rng.randint(60, 400))))
        elif kind == 2:  # right layout, made-up MAC
            out.append(("bad_mac", MAGIC + b"Q" + struct.pack(">Q", time.time_ns()) + os.urandom(rng.randint(56, 300))))
        elif kind == 3:  # sealed with another run's key
            out.append(("bad_mac", Sealer(b"other-run-key-xxxxxxxx").seal(REQUEST, pack_envelope("x", dest, record, b"1"))))
        elif kind == 4:  # a real frame with one bit flipped
            frame = bytearray(good.seal(REQUEST, pack_envelope("x", dest, record, b"1")))
            frame[rng.randrange(4, len(frame))] ^= 1 << rng.randrange(8)
            out.append(("bad_mac" if frame[:4] == MAGIC + b"Q" else "x", bytes(frame)))
        elif kind == 5:
            out.append(("replayed", replay))
        elif kind == 6:
            out.append(("stale", sealed_at(key, time.time_ns() - 3600 * 10**9, pack_envelope("x", dest, record, b"1"))))
        elif kind == 7:
            out.append(("malformed", authentic_garbage(key, rng)))
        else:
            out.append(("misaddressed", good.seal(REQUEST, pack_envelope("x", dest + "-9", record, b"1"))))
    return out
