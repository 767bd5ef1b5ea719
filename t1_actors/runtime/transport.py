"""pynng sockets under trio: control request/reply with deadlines, bulk push/pull without.

Control plane: each actor listens on a raw-mode Rep0 socket (nngraw.py) and serves every request in
its own trio task, so a slow handler never holds up a heartbeat or a ping. A caller keeps a small pool
of Req0 sockets per peer, one per call in flight; the call runs under a deadline and a miss raises
``DeadlineExceeded`` (the request is abandoned, nothing hangs, and its socket is renewed before its next
call: nngraw.PolledReq). Both sides first busy-poll for a moment (``[transport] poll_spin_us``, bounded
by the deadline, backing off when it does not pay) and then wait on nng's pollable fds in trio's own
epoll, never through pynng's callback thread: each park-and-wake through the fds costs about a raw round
trip on a small machine (nngraw.py).

Bulk: each actor also listens on a Pull0 socket; senders Push0 to it. A push waits for the receiver
as long as it takes (weights, trajectories: no control-plane deadline) and the receiver handles bulk
messages one at a time, in order, which back-pressures the sender. Large payloads are copied once on
each side (into nng's message; out of it by the decoder), and MACed in a worker thread. Nothing here
uses pub/sub.

Every frame is sealed (auth.py); frames that fail are dropped and counted by ``RejectLog``.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pynng
import structlog
import trio

from schemas import Record
from schemas.messages import ErrorReply
from t1_actors.runtime.auth import BULK, REPLY, REQUEST, Opener, Sealer
from t1_actors.runtime.errors import AuthError, DeadlineExceeded
from t1_actors.runtime.nngraw import PolledPull, PolledPush, PolledReq, RawRep
from t1_actors.runtime.wire import RawEnvelope, pack_envelope, pack_envelope_parts, unpack_envelope

Handler = Callable[[RawEnvelope], Awaitable[Record]]
BulkHandler = Callable[[RawEnvelope], Awaitable[None]]

_BULK_QUEUE = 8  # bulk messages queued on each side, so sealing, moving and checking overlap


class RejectLog:
    """Counts dropped frames by reason; logs the first few of each reason, then every 1000th."""

    def __init__(self, log: structlog.typing.FilteringBoundLogger, where: str):
        self.counts: Counter[str] = Counter()
        self._log = log
        self._where = where

    def note(self, exc: AuthError, peer: str | None = None) -> None:
        self.counts[exc.reason] += 1
        n = self.counts[exc.reason]
        if n <= 5 or n % 1000 == 0:
            self._log.warning("frame_rejected", where=self._where, reason=exc.reason, detail=str(exc),
                              count=n, peer=peer)


def _prepare_listen(address: str) -> None:
    if address.startswith("ipc://"):
        Path(address[len("ipc://"):]).parent.mkdir(mode=0o700, parents=True, exist_ok=True)


def _listen(sock: pynng.Socket, address: str, what: str) -> None:
    _prepare_listen(address)
    try:
        sock.listen(address)
    except pynng.AddressInUse:
        sock.close()
        raise OSError(f"{what}: address {address} is already in use (another actor or a stale process); "
                      "stop it or pick another address") from None


class ControlServer:
    """Serves authenticated requests addressed to ``name``; each in its own task and nng context."""

    def __init__(self, name: str, address: str, sealer: Sealer, opener: Opener, *, max_bytes: int,
                 rejects: RejectLog, spin_s: float = 0.0):
        self.name, self.address = name, address
        self._sealer, self._opener, self._max_bytes, self.rejects = sealer, opener, max_bytes, rejects
        self._spin_s = spin_s
        self._unstarted = 0  # handlers spawned that have not run yet
        self._accepting = trio.CancelScope()

    async def serve(self, handle: Handler, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until ``stop_accepting()``; then return once every request in flight has been answered."""
        sock = RawRep(max_bytes=self._max_bytes, spin_s=self._spin_s)
        _listen(sock.sock, self.address, f"actor {self.name!r} control")
        try:
            async with trio.open_nursery() as handlers:
                task_status.started()
                with self._accepting:
                    while True:
                        header, frame = await sock.receive()
                        self._unstarted += 1
                        handlers.start_soon(self._serve_one, sock, header, frame, handle)
                        # Let the handler take its first step before polling for the next request: a
                        # quick one has replied by then, and a poll must not hold up the handler.
                        while self._unstarted:
                            await trio.lowlevel.checkpoint()
        finally:
            sock.close()

    def stop_accepting(self) -> None:
        self._accepting.cancel()

    async def _serve_one(self, sock: RawRep, header: bytes, frame: bytes, handle: Handler) -> None:
        self._unstarted -= 1
        try:
            env = unpack_envelope(self._opener.open(REQUEST, frame))
            if env.dest != self.name:
                raise AuthError("misaddressed", f"for {env.dest!r}, this is {self.name!r}")
        except AuthError as exc:
            self.rejects.note(exc)
            return  # dropped without a reply: the caller's deadline covers it
        reply = await handle(env)
        body = pack_envelope(self.name, env.sender, reply, os.urandom(8), env.msg_id)
        frame = self._sealer.seal(REPLY, body)
        if not sock.try_reply(header, frame):  # the send buffer is full: wait for room, but never hang
            with trio.move_on_after(30):
                await sock.reply(header, frame)


class ControlClient:
    """Calls one peer. Safe to share between tasks: each call in flight uses its own socket from a
    pool (one connection each); idle sockets are kept for the next call."""

    def __init__(self, me: str, peer: str, address: str, sealer: Sealer, opener: Opener, *, max_bytes: int,
                 rejects: RejectLog, spin_s: float = 0.0):
        self.me, self.peer, self.address = me, peer, address
        self._sealer, self._opener, self.rejects, self._max_bytes = sealer, opener, rejects, max_bytes
        self._spin_s = spin_s
        self._idle: list[PolledReq] = [self._new_socket()]  # start connecting now
        self._busy: set[PolledReq] = set()
        self._closed = False

    async def call(self, record: Record, deadline_s: float | None) -> Record:
        """Send ``record``, return the peer's reply record. ``deadline_s=None``: wait as long as it takes."""
        if self._closed:
            raise RuntimeError(f"client to {self.peer!r} is closed")
        op = record.kind
        msg_id = os.urandom(8)
        frame = self._sealer.seal(REQUEST, pack_envelope(self.me, self.peer, record, msg_id))
        sock = self._idle.pop() if self._idle else self._new_socket()
        self._busy.add(sock)
        try:
            limit = math.inf if deadline_s is None else deadline_s
            reply = await sock.request(frame, trio.current_time() + limit)
            if reply is None:
                raise DeadlineExceeded(self.peer, op, limit)
            try:
                env = unpack_envelope(self._opener.open(REPLY, reply))
                if env.reply_to != msg_id or env.dest != self.me or env.sender != self.peer:
                    raise AuthError("mismatched_reply", f"reply to another request or from {env.sender!r}")
                return env.record()
            except AuthError as exc:
                self.rejects.note(exc, self.peer)
                return ErrorReply(error="ReplyRejected", detail=f"reply from {self.peer!r} rejected: {exc}")
        finally:
            self._busy.discard(sock)
            if self._closed:
                sock.close()
            else:
                self._idle.append(sock)

    def _new_socket(self) -> PolledReq:
        return PolledReq(self.address, self._max_bytes, self._spin_s)

    def close(self) -> None:
        self._closed = True
        for sock in [*self._idle, *self._busy]:
            sock.close()
        self._idle.clear()


class BulkInbox:
    """Receives bulk messages addressed to ``name`` and hands them to ``handle`` one at a time, in order.
    A message is checked and decoded in place, in nng's buffer (no copy of it into Python first)."""

    def __init__(self, name: str, address: str, opener: Opener, *, max_bytes: int, rejects: RejectLog):
        self.name, self.address = name, address
        self._opener, self._max_bytes, self.rejects = opener, max_bytes, rejects

    async def serve(self, handle: BulkHandler, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = PolledPull(max_bytes=self._max_bytes, recv_buffer=_BULK_QUEUE)
        _listen(sock.sock, self.address, f"actor {self.name!r} bulk")
        try:
            task_status.started()
            while True:
                env = await self._next(sock)
                if env is not None:
                    await handle(env)
        finally:
            sock.close()

    async def _next(self, sock: PolledPull) -> RawEnvelope | None:
        """The next authentic envelope addressed here (its record decoded into Python objects that own
        their data), or None for a rejected frame. The nng message is freed before returning."""
        msg = await sock.receive()
        try:
            env = unpack_envelope(await self._opener.aopen(BULK, msg.body))
            if env.dest != self.name:
                raise AuthError("misaddressed", f"for {env.dest!r}, this is {self.name!r}")
            return env
        except AuthError as exc:
            self.rejects.note(exc)
            return None
        finally:
            msg.free()


class BulkOutbox:
    """Pushes bulk messages to one peer's inbox; a push waits until nng has taken the message. Large
    bytes and arrays are not copied by encoding: each is copied once, from the record into the nng
    message, behind the sealed header."""

    def __init__(self, me: str, peer: str, address: str, sealer: Sealer):
        self.me, self.peer, self.address = me, peer, address
        self._sealer = sealer
        self._sock = PolledPush(address, send_buffer=_BULK_QUEUE)

    async def push(self, record: Record) -> None:
        body = pack_envelope_parts(self.me, self.peer, record, os.urandom(8))
        await self._sock.send(await self._sealer.aheader(BULK, *body), *body)

    def close(self) -> None:
        self._sock.close()
