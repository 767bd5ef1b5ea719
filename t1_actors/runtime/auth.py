"""Message authentication: a MAC over every frame, with a timestamp and a nonce against replays.

Frame layout (all of it but the MAC is covered by the MAC)::

    0:2      magic b"T1"
    2        wire version: 2 (1 sealed bulk frames with HMAC-SHA256 too)
    3        channel: b"Q" request, b"R" reply, b"B" bulk (a frame is valid on its own channel only)
    4:12     send time, ns since the epoch, big-endian
    12:28    nonce, 16 random bytes
    28:28+m  MAC(frame[0:28] + body), m bytes
    28+m:    body (the msgpack envelope)

Control frames (requests, replies: small) carry HMAC-SHA256 with the run key (m = 32). Bulk frames
(megabytes: weights, trajectories) carry AES-256-GMAC (m = 16) with a key derived from the run key:
it covers every byte like the HMAC but runs ~5x faster on AES-NI/PCLMUL hardware, and HMAC-SHA256
alone would cost as much CPU per bulk byte as nng moving it (bench/control_plane.py). Each channel has
exactly one MAC, so a frame cannot be downgraded to the other.

A receiver drops a frame that is too short, has the wrong magic, version or channel, a MAC that does not
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
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from t1_actors.runtime.errors import AuthError

WIRE_VERSION = 2
MAGIC = b"T1" + bytes([WIRE_VERSION])
REQUEST, REPLY, BULK = b"Q", b"R", b"B"
_PREFIX = 28
_MAX_NONCES = 4_000_000
OFFLOAD_BYTES = 8 << 20  # frames this large (a MAC of over ~1 ms) are MACed in a worker thread
BytesLike = bytes | bytearray | memoryview  # a frame or part of one, read in place


class _HmacSha256:
    """HMAC-SHA256 (RFC 2104) with the key's inner and outer pads hashed once: each MAC then costs two
    hash-state copies instead of the ``hmac`` module's Python-level object copy (the same digest)."""

    size = 32

    def __init__(self, key: bytes):
        if len(key) > 64:
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def digest(self, *parts: BytesLike) -> bytes:
        inner = self._inner.copy()
        for part in parts:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


class _AesGmac:
    """AES-256-GMAC (NIST SP 800-38D): AES-GCM with no plaintext and the frame as associated data; the
    16-byte tag is the MAC. The IV is the frame's first 12 nonce bytes (random per frame: a repeated IV
    under one key is a 2**-96 event per pair of frames); the key is HMAC-SHA256(run key, a label), so
    it is never the run key itself."""

    size = 16
    _LABEL = b"t1 bulk frame AES-256-GMAC key"

    def __init__(self, key: bytes):
        self._key = hmac.digest(key, self._LABEL, "sha256")

    def digest(self, prefix: BytesLike, *parts: BytesLike) -> bytes:
        encryptor = Cipher(algorithms.AES(self._key), modes.GCM(bytes(prefix[12:24]))).encryptor()
        encryptor.authenticate_additional_data(prefix)
        for part in parts:
            encryptor.authenticate_additional_data(part)
        encryptor.finalize()
        return encryptor.tag


def _macs(key: bytes) -> dict[bytes, _HmacSha256 | _AesGmac]:
    """The MAC of each channel."""
    if not key:
        raise ValueError("the message key is empty; set [run] hmac_key or T1_RUN_KEY")
    control = _HmacSha256(key)
    return {REQUEST: control, REPLY: control, BULK: _AesGmac(key)}


class Sealer:
    """Signs outgoing frames with the run key."""

    def __init__(self, key: bytes):
        self._macs = _macs(key)

    def seal(self, channel: bytes, body: bytes) -> bytes:
        """The whole frame: header and body."""
        return self.header(channel, body) + body

    def header(self, channel: bytes, *body: BytesLike) -> bytes:
        """The header (prefix and MAC) that seals the body given as consecutive buffers, for a sender that
        places header and body into one message itself instead of joining them (no copy of a large body)."""
        prefix = MAGIC + channel + struct.pack(">Q", time.time_ns()) + os.urandom(16)
        return prefix + self._macs[channel].digest(prefix, *body)

    async def aheader(self, channel: bytes, *body: BytesLike) -> bytes:
        """``header`` that MACs a large body in a worker thread (OpenSSL releases the GIL), keeping the
        event loop responsive."""
        if sum(memoryview(part).nbytes for part in body) < OFFLOAD_BYTES:
            return self.header(channel, *body)
        return await trio.to_thread.run_sync(self.header, channel, *body)


class Opener:
    """Checks incoming frames; remembers accepted nonces for ``max_age_s`` (replays inside the window)."""

    def __init__(self, key: bytes, max_age_s: float):
        self._macs = _macs(key)
        self._max_age_ns = int(max_age_s * 1e9)
        self._seen: set[bytes] = set()
        self._order: deque[tuple[int, bytes]] = deque()

    def open(self, channel: bytes, frame: BytesLike) -> memoryview:
        """The body of an authentic, fresh frame (any buffer: bytes, or a view of an nng message, read
        in place); AuthError(reason) otherwise."""
        self._check_mac(channel, frame)
        return self._check_fresh(channel, frame)

    async def aopen(self, channel: bytes, frame: BytesLike) -> memoryview:
        """``open`` that checks the MAC of a large frame in a worker thread (OpenSSL releases the GIL),
        so that verifying a bulk payload does not stall the event loop (heartbeats, pings)."""
        if len(frame) < OFFLOAD_BYTES:
            return self.open(channel, frame)
        await trio.to_thread.run_sync(self._check_mac, channel, frame)
        return self._check_fresh(channel, frame)  # the nonce book is only touched from the trio thread

    def _check_mac(self, channel: bytes, frame: BytesLike) -> None:
        view = memoryview(frame)
        mac = self._macs[channel]
        header = _PREFIX + mac.size
        if len(view) < header:
            raise AuthError("short", f"{len(view)} bytes, a {channel.decode()} frame has at least {header}")
        if view[:2] != MAGIC[:2]:
            raise AuthError("unsigned", "no t1 frame header")
        if (version := bytes(view[2:3])[0]) != WIRE_VERSION:  # whatever the buffer's item format
            raise AuthError("version", f"a wire version {version} frame; this runtime speaks version {WIRE_VERSION}: "
                            "run the same t1 release on every host")
        if view[3:4] != channel:
            raise AuthError("wrong_channel", f"{bytes(view[3:4])!r} frame on the {channel!r} channel")
        if not hmac.compare_digest(mac.digest(view[:_PREFIX], view[header:]), view[_PREFIX:header]):
            raise AuthError("bad_mac", "forged, corrupted or signed with another run's key")

    def _check_fresh(self, channel: bytes, frame: BytesLike) -> memoryview:
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
        return view[_PREFIX + self._macs[channel].size:]

    def _forget_before(self, horizon_ns: int) -> None:
        # Nonces are dropped by send time; a frame older than the horizon is rejected as stale anyway.
        order = self._order
        while order and order[0][0] < horizon_ns:
            self._seen.discard(order.popleft()[1])
