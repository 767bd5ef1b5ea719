"""The envelope inside a sealed frame: who sent it, to whom, in reply to what, and the record."""

from __future__ import annotations

from dataclasses import dataclass

from schemas import Record
from schemas.codec import from_wire, pack, pack_parts, to_wire, unpack
from t1_actors.runtime.errors import AuthError


def pack_envelope(sender: str, dest: str, record: Record, msg_id: bytes, reply_to: bytes = b"") -> bytes:
    """msgpack ``[sender, dest, msg_id, reply_to, record]`` (an array: cheaper to pack and parse than a map)."""
    return pack([sender, dest, msg_id, reply_to, to_wire(record)])


def pack_envelope_parts(sender: str, dest: str, record: Record, msg_id: bytes) -> list[bytes | memoryview]:
    """``pack_envelope`` as buffers that leave large bytes and arrays where they are (bulk: the parts are
    copied once, into the nng message)."""
    return pack_parts([sender, dest, msg_id, b"", to_wire(record)])


@dataclass(frozen=True, slots=True)
class RawEnvelope:
    """An authentic envelope whose record is not decoded yet (decoding may fail on its own)."""

    sender: str
    dest: str
    reply_to: bytes
    msg_id: bytes
    wire: object

    def record(self) -> Record:
        return from_wire(self.wire)

    def op(self) -> str:
        kind = self.wire.get("t") if isinstance(self.wire, dict) else None
        return kind if isinstance(kind, str) else "?"


def unpack_envelope(body: memoryview | bytes) -> RawEnvelope:
    """Parse an authenticated body; AuthError('malformed') when it is not an envelope."""
    try:
        obj = unpack(body)  # msgpack reads the memoryview in place: no copy of a bulk payload
    except Exception as exc:  # msgpack raises many types on garbage
        raise AuthError("malformed", f"body is not msgpack ({type(exc).__name__})") from None
    if type(obj) is not list or len(obj) != 5:
        raise AuthError("malformed", "body is not a t1 envelope")
    sender, dest, msg_id, reply_to, wire = obj
    if not (isinstance(sender, str) and isinstance(dest, str) and isinstance(msg_id, bytes)
            and isinstance(reply_to, bytes)):
        raise AuthError("malformed", "envelope fields have the wrong types")
    return RawEnvelope(sender, dest, reply_to, msg_id, wire)
