"""pynng sockets driven through their pollable fds, with a short busy-poll before parking.

Waiting: an operation is first tried without blocking; if nothing is there yet and no other task of
this trio run is runnable, it is retried for up to ``spin_s`` (the thread yields the CPU between tries,
so nng's own threads, which deliver the message, run first), and only then parked on the socket's fd
in trio's epoll. Parking and waking through nng's pollable fd costs about as much as the whole
synchronous round trip on a small machine, and a control-plane reply usually arrives within a few
hundred microseconds, so the poll pays for itself; the spin is bounded (and by the caller's
deadline), backs off while polls come up empty (``Spin``), and with ``spin_s=0`` every wait parks at once.

``RawRep``: a raw-mode Rep0 socket (pynng does not wrap raw sockets). Raw mode lets one socket hold
any number of requests at once: each request carries its routing header (pipe id and request id) and
the reply is sent with the same header. ``PolledReq``: a cooked Req0 socket, one request at a time.
``PolledPull`` / ``PolledPush``: bulk sockets that read a message in place in nng's buffer and build one
from parts with a single copy (they never poll: bulk waits park at once).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pynng
import trio
from pynng._nng import ffi, lib

_NONBLOCK = lib.NNG_FLAG_NONBLOCK
_NO_RESEND_MS = 24 * 3600 * 1000  # nng would otherwise resend after 60 s: a duplicate we reject as a replay

T = TypeVar("T")


def close_polled(sock: pynng.Socket, *fds: int) -> None:
    """Close a socket whose fds trio tasks may be waiting on: wake those tasks first."""
    for fd in fds:
        try:
            trio.lowlevel.notify_closing(fd)  # wake any task still waiting on it
        except RuntimeError:  # closed outside a trio run: nobody can be waiting
            pass
    sock.close()


_FAIRNESS_S = 0.001  # a task whose waits are all answered by polling still yields this often


class _Yields:
    last = 0.0  # perf_counter of the last time a wait here let the rest of the trio run go first


class Spin:
    """How long a wait may busy-poll. It backs off while polls come up empty: after n empty polls in a
    row the next 2**n - 1 waits (at most 63) park at once. On a machine whose cores are all busy a
    yield hands the CPU to another process for a whole time slice, so polling loses there; and an
    idle server stops polling for requests that do not come."""

    _MAX_MISSES = 6

    def __init__(self, spin_s: float):
        self.spin_s = max(0.0, spin_s)
        self._misses = 0
        self._skip = 0

    def budget(self) -> float:
        if self._skip:
            self._skip -= 1
            return 0.0
        return self.spin_s

    def record(self, hit: bool) -> None:
        if hit:
            self._misses = 0
        else:
            self._misses = min(self._misses + 1, self._MAX_MISSES)
            self._skip = (1 << self._misses) - 1


def poll(attempt: Callable[[], T | None], spin: Spin, limit_s: float = math.inf) -> T | None:
    """``attempt()`` at once, then busy-polled for up to the spin's budget (and ``limit_s``) while no
    other task of this trio run is runnable (the CPU is yielded between tries); None when nothing came."""
    result = attempt()
    if result is not None:
        return result
    spin_s = min(spin.budget(), limit_s)
    if spin_s <= 0 or trio.lowlevel.current_statistics().tasks_runnable:
        return None
    end = time.perf_counter() + spin_s
    while result is None and time.perf_counter() < end:
        os.sched_yield()  # let the threads that bring the message (nng's, the peer's) run
        result = attempt()
    spin.record(result is not None)
    return result


async def wait_for(attempt: Callable[[], T | None], fd: int) -> T:
    """``attempt()`` each time ``fd`` turns readable, until it returns a value."""
    while True:
        await trio.lowlevel.wait_readable(fd)
        _Yields.last = time.perf_counter()
        result = attempt()
        if result is not None:
            return result


async def poll_then_wait(attempt: Callable[[], T | None], fd: int, spin: Spin) -> T:
    """``poll``, then ``wait_for``; the caller's deadline bounds the poll, and a task answered by
    polling still lets the others run at least every millisecond (timers, I/O, cancellation)."""
    result = poll(attempt, spin, trio.current_effective_deadline() - trio.current_time())
    if result is None:
        return await wait_for(attempt, fd)
    await fair_share()
    return result


async def fair_share() -> None:
    """A schedule point, at most every millisecond: for waits that polling answered without one."""
    now = time.perf_counter()
    if now - _Yields.last > _FAIRNESS_S:
        _Yields.last = now
        await trio.lowlevel.checkpoint()


def _try_recvmsg(sock: pynng.Socket, msg_p: Any) -> Any:  # cffi pointers: nng_msg **, nng_msg * or None
    """The next nng message (the caller frees it), or None when there is none yet (no exception on the
    hot path)."""
    rv = lib.nng_recvmsg(sock.socket, msg_p, _NONBLOCK)
    if rv != 0:
        if rv != lib.NNG_EAGAIN:
            pynng.exceptions.check_err(rv)
        return None
    return msg_p[0]


def _try_recv_body(sock: pynng.Socket, msg_p: Any) -> bytes | None:
    """The body of the next message, or None when there is none yet."""
    if (msg := _try_recvmsg(sock, msg_p)) is None:
        return None
    try:
        body: bytes = ffi.buffer(lib.nng_msg_body(msg), lib.nng_msg_len(msg))[:]
        return body
    finally:
        lib.nng_msg_free(msg)


class RawRep:
    def __init__(self, *, max_bytes: int, send_buffer: int = 256, spin_s: float = 0.0):
        self.sock = pynng.Rep0(opener=lib.nng_rep0_open_raw, recv_max_size=max_bytes,
                               send_buffer_size=send_buffer)
        self.recv_fd, self.send_fd = self.sock.recv_fd, self.sock.send_fd
        self._spin = Spin(spin_s)
        self._msg_p = ffi.new("nng_msg **")

    def listen(self, address: str) -> None:
        self.sock.listen(address)

    def _try_receive(self) -> tuple[bytes, bytes] | None:
        if (msg := _try_recvmsg(self.sock, self._msg_p)) is None:
            return None
        try:
            header = ffi.buffer(lib.nng_msg_header(msg), lib.nng_msg_header_len(msg))[:]
            body = ffi.buffer(lib.nng_msg_body(msg), lib.nng_msg_len(msg))[:]
        finally:
            lib.nng_msg_free(msg)
        return header, body

    async def receive(self) -> tuple[bytes, bytes]:
        """The next request: (routing header, body)."""
        return await poll_then_wait(self._try_receive, self.recv_fd, self._spin)

    def try_reply(self, header: bytes, body: bytes) -> bool:
        """Send the reply routed by ``header`` if the send buffer has room (nng drops it if the caller
        has gone); False when it is full."""
        msg_p = ffi.new("nng_msg **")
        pynng.exceptions.check_err(lib.nng_msg_alloc(msg_p, 0))
        msg = msg_p[0]
        rv = lib.nng_msg_header_append(msg, header, len(header)) or lib.nng_msg_append(msg, body, len(body))
        if rv == 0:
            rv = lib.nng_sendmsg(self.sock.socket, msg, _NONBLOCK)
            if rv == 0:
                return True  # nng owns the message now
        lib.nng_msg_free(msg)
        if rv != lib.NNG_EAGAIN:
            pynng.exceptions.check_err(rv)
        return False

    async def reply(self, header: bytes, body: bytes) -> None:
        """``try_reply``, waiting for room in the send buffer as long as it takes."""
        while not self.try_reply(header, body):
            await trio.lowlevel.wait_readable(self.send_fd)

    def close(self) -> None:
        close_polled(self.sock, self.recv_fd, self.send_fd)


class PolledReq:
    """One cooked Req0 socket: one request at a time, woken through trio's epoll (not pynng's
    callback thread, whose hop doubles a round trip).

    A request that ends without its reply (deadline, cancellation) leaves the socket unfit for reuse:
    nng stashes the late reply and raises the receive fd, and the next request's reset frees that reply
    but leaves the fd raised (req0_ctx_reset does not clear it), so each wait of the next request would
    wake at once with nothing to read, a busy loop for as long as that request takes (11,574 wake-ups in
    300 ms, measured). The next request therefore opens a new socket first."""

    def __init__(self, address: str, max_bytes: int, spin_s: float = 0.0):
        self._address, self._max_bytes = address, max_bytes
        self._spin = Spin(spin_s)
        self._msg_p = ffi.new("nng_msg **")
        self._open()

    def _open(self) -> None:
        self.sock = pynng.Req0(recv_max_size=self._max_bytes, resend_time=_NO_RESEND_MS)
        self.sock.dial(self._address, block=False)  # connects (and reconnects) in the background
        self.recv_fd, self.send_fd = self.sock.recv_fd, self.sock.send_fd
        self._abandoned = False

    def _try_send(self, frame: bytes) -> bool | None:
        try:
            self.sock.send(frame, block=False)
            return True
        except pynng.TryAgain:  # not connected yet, or the pipe is busy
            return None

    def _try_recv(self) -> bytes | None:
        return _try_recv_body(self.sock, self._msg_p)

    async def request(self, frame: bytes, deadline: float) -> bytes | None:
        """Send ``frame`` and return the reply; None once ``deadline`` (trio's clock) has passed. A reply
        that comes while polling costs no cancel scope (the deadline bounds the poll instead)."""
        if self._abandoned:
            self.close()
            self._open()
        self._abandoned = True  # until the reply is in hand
        if self._try_send(frame) is None:
            with trio.move_on_at(deadline) as sending:
                await wait_for(lambda: self._try_send(frame), self.send_fd)
            if sending.cancelled_caught:
                return None
        now = trio.current_time()
        reply = poll(self._try_recv, self._spin, min(deadline, trio.current_effective_deadline()) - now)
        if reply is not None:
            self._abandoned = False
            await fair_share()
            return reply
        with trio.move_on_at(deadline):
            reply = await wait_for(self._try_recv, self.recv_fd)
            self._abandoned = False
            return reply
        return None

    def close(self) -> None:
        close_polled(self.sock, self.recv_fd, self.send_fd)


_NO_SPIN = Spin(0.0)


class NngMessage:
    """A received nng message, read in place: ``body`` is a view of nng's own buffer (no copy into
    Python), valid until ``free()``; nothing that refers to it may outlive that call."""

    __slots__ = ("_msg", "body")

    def __init__(self, msg: Any) -> None:  # a cffi nng_msg *
        self._msg = msg
        self.body = ffi.buffer(lib.nng_msg_body(msg), lib.nng_msg_len(msg))

    def free(self) -> None:
        if self._msg is not None:
            self.body = None
            lib.nng_msg_free(self._msg)
            self._msg = None


class PolledPull:
    """A Pull0 socket whose messages are taken without a copy (``NngMessage``), woken through trio's epoll."""

    def __init__(self, *, max_bytes: int, recv_buffer: int):
        self.sock = pynng.Pull0(recv_max_size=max_bytes, recv_buffer_size=recv_buffer)
        self.recv_fd = self.sock.recv_fd
        self._msg_p = ffi.new("nng_msg **")

    def _try_receive(self) -> NngMessage | None:
        msg = _try_recvmsg(self.sock, self._msg_p)
        return None if msg is None else NngMessage(msg)

    async def receive(self) -> NngMessage:
        """The next message; the caller frees it."""
        return await poll_then_wait(self._try_receive, self.recv_fd, _NO_SPIN)

    def close(self) -> None:
        close_polled(self.sock, self.recv_fd)


class PolledPush:
    """A Push0 socket that sends a message assembled from parts with one copy (into nng's message),
    waiting through trio's epoll while the receiver's queue is full (as long as it takes)."""

    def __init__(self, address: str, *, send_buffer: int):
        self.sock = pynng.Push0(send_buffer_size=send_buffer)
        self.sock.dial(address, block=False)  # connects (and reconnects) in the background
        self.send_fd = self.sock.send_fd

    async def send(self, *parts: bytes | bytearray | memoryview) -> None:
        msg_p = ffi.new("nng_msg **")
        sizes = [memoryview(part).nbytes for part in parts]
        pynng.exceptions.check_err(lib.nng_msg_alloc(msg_p, sum(sizes)))
        msg = msg_p[0]
        try:
            at = ffi.cast("char *", lib.nng_msg_body(msg))
            for part, size in zip(parts, sizes):
                ffi.memmove(at, part, size)
                at += size
            while True:
                rv = lib.nng_sendmsg(self.sock.socket, msg, _NONBLOCK)
                if rv == 0:
                    msg = None  # nng owns it now
                    return
                if rv != lib.NNG_EAGAIN:
                    pynng.exceptions.check_err(rv)
                await trio.lowlevel.wait_readable(self.send_fd)
        finally:
            if msg is not None:
                lib.nng_msg_free(msg)

    def close(self) -> None:
        close_polled(self.sock, self.send_fd)
