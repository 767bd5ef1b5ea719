"""Message authentication: HMAC-SHA256 over every frame, with a timestamp and a nonce against replays.

Frame layout (all of it but the MAC is covered by the MAC)::

    0:3    magic b"T1\\x01"
    3      channel: b"Q" request, b"R" reply, b"B" bulk (a frame is valid on its own channel only)
    4:12   send time, ns since the epoch, big-endian
    12:28  nonce, 16 random bytes
    28:60  HMAC-SHA256(key, frame[0:28] + body)
    60:    body (the msgpack envelope)

A receiver drops a frame that is too short, has the wrong magic or channel, a MAC that does not
match, a time outside ``max_age_s`` of its own clock, or a nonce it has already accepted.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
from collections import deque

from .errors import AuthError

MAGIC = b"T1\x01"
REQUEST, REPLY, BULK = b"Q", b"R", b"B"
_PREFIX = 28
_HEADER = 60
_MAX_NONCES = 4_000_000


class Sealer:
    """Signs outgoing frames with the run key."""

    def __init__(self, key: bytes):
        if not key:
            raise ValueError("the HMAC key is empty; set [run] hmac_key or T1_RUN_KEY")
        self._key = hmac.new(key, digestmod=hashlib.sha256)

    def seal(self, channel: bytes, body: bytes) -> bytes:
        prefix = MAGIC + channel + struct.pack(">Q", time.time_ns()) + os.urandom(16)
        mac = self._key.copy()
        mac.update(prefix)
        mac.update(body)
        return b"".join((prefix, mac.digest(), body))


class Opener:
    """Checks incoming frames; remembers accepted nonces for ``max_age_s`` (replays inside the window)."""

    def __init__(self, key: bytes, max_age_s: float):
        if not key:
            raise ValueError("the HMAC key is empty; set [run] hmac_key or T1_RUN_KEY")
        self._key = hmac.new(key, digestmod=hashlib.sha256)
        self._max_age_ns = int(max_age_s * 1e9)
        self._seen: set[bytes] = set()
        self._order: deque[tuple[int, bytes]] = deque()

    def open(self, channel: bytes, frame: bytes) -> memoryview:
        """The body of an authentic, fresh frame; AuthError(reason) otherwise."""
        if len(frame) < _HEADER:
            raise AuthError("short", f"{len(frame)} bytes, a frame has at least {_HEADER}")
        view = memoryview(frame)
        if frame[:3] != MAGIC:
            raise AuthError("unsigned", "no t1 frame header")
        if frame[3:4] != channel:
            raise AuthError("wrong_channel", f"{bytes(frame[3:4])!r} frame on the {channel!r} channel")
        mac = self._key.copy()
        mac.update(view[:_PREFIX])
        mac.update(view[_HEADER:])
        if not hmac.compare_digest(mac.digest(), frame[_PREFIX:_HEADER]):
            raise AuthError("bad_mac", "forged, corrupted or signed with another run's key")
        sent_ns = struct.unpack_from(">Q", frame, 4)[0]
        now = time.time_ns()
        if abs(now - sent_ns) > self._max_age_ns:
            raise AuthError("stale", f"sent {(now - sent_ns) / 1e9:+.1f}s ago, outside the replay window")
        nonce = bytes(frame[12:28])
        self._forget_before(now - self._max_age_ns)
        if nonce in self._seen:
            raise AuthError("replayed", "nonce already accepted")
        if len(self._seen) >= _MAX_NONCES:
            raise AuthError("flood", "too many fresh nonces in the replay window")
        self._seen.add(nonce)
        self._order.append((sent_ns, nonce))
        return view[_HEADER:]

    def _forget_before(self, horizon_ns: int) -> None:
        # Nonces are dropped by send time; a frame older than the horizon is rejected as stale anyway.
        order = self._order
        while order and order[0][0] < horizon_ns:
            self._seen.discard(order.popleft()[1])
