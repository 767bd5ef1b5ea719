"""Typed failures of the runtime. Every one names the peer and the operation."""

from __future__ import annotations


class RuntimeFault(Exception):
    """Base of runtime errors."""


class DeadlineExceeded(RuntimeFault):
    """A control-plane call got no (authentic) reply within its deadline."""

    def __init__(self, peer: str, op: str, deadline_s: float):
        self.peer, self.op, self.deadline_s = peer, op, deadline_s
        super().__init__(f"{op} to {peer!r} missed its {deadline_s:g}s deadline "
                         "(peer down, overloaded or unreachable; the call was abandoned)")


class RemoteError(RuntimeFault):
    """The peer answered with an ErrorReply: its handler failed or refused the request."""

    def __init__(self, peer: str, op: str, error: str, detail: str):
        self.peer, self.op, self.error, self.detail = peer, op, error, detail
        super().__init__(f"{op} on {peer!r} failed: {error}: {detail}")


class RequestCancelled(RemoteError):
    """The peer cancelled the handler serving this request (a Cancel for its trial)."""


class PeerGone(RuntimeFault):
    """A call was given up: its peer stopped answering pings and did not come back within the wait."""

    def __init__(self, peer: str, op: str, silent_s: float):
        self.peer, self.op, self.silent_s = peer, op, silent_s
        super().__init__(f"{op} to {peer!r} given up: the peer has not answered pings for {silent_s:.0f} s "
                         "(killed and not restarted, or cut off)")


class NoSuchPeer(RuntimeFault):
    """No actor of that role or name is configured."""


class AuthError(RuntimeFault):
    """A frame failed authentication (unsigned, forged, replayed, stale, malformed). ``reason`` is a short tag."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
