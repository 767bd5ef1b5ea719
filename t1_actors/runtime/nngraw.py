"""A raw-mode nng Rep0 socket driven through its pollable fds (pynng does not wrap raw sockets).

Raw mode lets one socket hold any number of requests at once: each request carries its routing
header (pipe id and request id) and the reply is sent with the same header. Receiving through the
socket's recv fd lets trio's epoll wake the server directly, without pynng's per-operation callback
thread hop; the reply send never blocks (a bounded send buffer, and a wait on the send fd when full).
"""

from __future__ import annotations

import pynng
import trio
from pynng._nng import ffi, lib

_NONBLOCK = lib.NNG_FLAG_NONBLOCK


def close_polled(sock: pynng.Socket, *fds: int) -> None:
    """Close a socket whose fds trio tasks may be waiting on: wake those tasks first."""
    for fd in fds:
        try:
            trio.lowlevel.notify_closing(fd)  # wake any task still waiting on it
        except RuntimeError:  # closed outside a trio run: nobody can be waiting
            pass
    sock.close()


class RawRep:
    def __init__(self, *, max_bytes: int, send_buffer: int = 256):
        self.sock = pynng.Rep0(opener=lib.nng_rep0_open_raw, recv_max_size=max_bytes,
                               send_buffer_size=send_buffer)
        self.recv_fd, self.send_fd = self.sock.recv_fd, self.sock.send_fd

    def listen(self, address: str) -> None:
        self.sock.listen(address)

    async def receive(self) -> tuple[bytes, bytes]:
        """The next request: (routing header, body)."""
        msg_p = ffi.new("nng_msg **")
        while True:
            rv = lib.nng_recvmsg(self.sock.socket, msg_p, _NONBLOCK)
            if rv == 0:
                break
            if rv != lib.NNG_EAGAIN:
                pynng.exceptions.check_err(rv)
            await trio.lowlevel.wait_readable(self.recv_fd)
        msg = msg_p[0]
        try:
            header = bytes(ffi.buffer(lib.nng_msg_header(msg), lib.nng_msg_header_len(msg)))
            body = bytes(ffi.buffer(lib.nng_msg_body(msg), lib.nng_msg_len(msg)))
        finally:
            lib.nng_msg_free(msg)
        return header, body

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
