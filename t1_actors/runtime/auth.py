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

import trio

from .errors import AuthError

MAGIC = b"T1\x01"
REQUEST, REPLY, BULK = b"Q", b"R", b"B"
_PREFIX = 28
_HEADER = 60
_MAX_NONCES = 4_000_000
OFFLOAD_BYTES = 1 << 20  # frames this large are MACed in a worker thread


class _HmacSha256:
    """HMAC-SHA256 (RFC 2104) with the key's inner and outer pads hashed once: each MAC then costs two
    hash-state copies instead of the ``hmac`` module's Python-level object copy (the same digest)."""

    def __init__(self, key: bytes):
        if not key:
            raise ValueError("the HMAC key is empty; set [run] hmac_key or T1_RUN_KEY")
        if len(key) > 64:
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def digest(self, *parts) -> bytes:
        inner = self._inner.copy()
        for part in parts:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


class Sealer:
    """Signs outgoing frames with the run key."""

    def __init__(self, key: bytes):
        self._mac = _HmacSha256(key)

    def seal(self, channel: bytes, body: bytes) -> bytes:
        """The whole frame: header and body."""
        return self.header(channel, body) + body

    def header(self, channel: bytes, *body) -> bytes:
        """The 60-byte header that seals the body given as consecutive buffers, for a sender that
        places header and body into one message itself instead of joining them (no copy of a large body)."""
        prefix = MAGIC + channel + struct.pack(">Q", time.time_ns()) + os.urandom(16)
        return prefix + self._mac.digest(prefix, *body)

    async def aheader(self, channel: bytes, *body) -> bytes:
        """``header`` that MACs a large body in a worker thread (hashlib releases the GIL), keeping the
        event loop responsive."""
        if sum(memoryview(part).nbytes for part in body) < OFFLOAD_BYTES:
            return self.header(channel, *body)
        return await trio.to_thread.run_sync(self.header, channel, *body)


class Opener:
    """Checks incoming frames; remembers accepted nonces for ``max_age_s`` (replays inside the window)."""

    def __init__(self, key: bytes, max_age_s: float):
        self._mac = _HmacSha256(key)
        self._max_age_ns = int(max_age_s * 1e9)
        self._seen: set[bytes] = set()
        self._order: deque[tuple[int, bytes]] = deque()

    def open(self, channel: bytes, frame) -> memoryview:
        """The body of an authentic, fresh frame (any buffer: bytes, or a view of an nng message, read
        in place); AuthError(reason) otherwise."""
        self._check_mac(channel, frame)
        return self._check_fresh(frame)

    async def aopen(self, channel: bytes, frame) -> memoryview:
        """``open`` that checks the MAC of a large frame in a worker thread (hashlib releases the GIL),
        so that verifying a bulk payload does not stall the event loop (heartbeats, pings)."""
        if len(frame) < OFFLOAD_BYTES:
            return self.open(channel, frame)
        await trio.to_thread.run_sync(self._check_mac, channel, frame)
        return self._check_fresh(frame)  # the nonce book is only touched from the trio thread

    def _check_mac(self, channel: bytes, frame) -> None:
        view = memoryview(frame)
        if len(view) < _HEADER:
            raise AuthError("short", f"{len(view)} bytes, a frame has at least {_HEADER}")
        if view[:3] != MAGIC:
            raise AuthError("unsigned", "no t1 frame header")
        if view[3:4] != channel:
            raise AuthError("wrong_channel", f"{bytes(view[3:4])!r} frame on the {channel!r} channel")
        if not hmac.compare_digest(self._mac.digest(view[:_PREFIX], view[_HEADER:]), view[_PREFIX:_HEADER]):
            raise AuthError("bad_mac", "forged, corrupted or signed with another run's key")

    def _check_fresh(self, frame) -> memoryview:
        view = memoryview(frame)
        sent_ns = struct.unpack_from(">Q", view, 4)[0]
        now = time.time_ns()
        if abs(now - sent_ns) > self._max_age_ns:
            raise AuthError("stale", f"sent {(now - sent_ns) / 1e9:+.1f}s ago, outside the replay window")
        nonce = bytes(view[12:28])
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
