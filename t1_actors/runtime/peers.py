"""Clients to other actors, by role (round-robin over its instances) or by instance name."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
import trio

from schemas import Record
from schemas.messages import ErrorReply
from t1_actors.runtime.auth import Opener, Sealer
from t1_actors.runtime.config import RuntimeConfig
from t1_actors.runtime.errors import DeadlineExceeded, NoSuchPeer, RemoteError, RequestCancelled
from t1_actors.runtime.transport import BulkOutbox, ControlClient, RejectLog


def raise_for_error(peer: str, op: str, reply: Record) -> Record:
    """An ErrorReply becomes a RemoteError (RequestCancelled when the handler was cancelled)."""
    if isinstance(reply, ErrorReply):
        cls = RequestCancelled if reply.error == "Cancelled" else RemoteError
        raise cls(peer, op, reply.error, reply.detail)
    return reply


class Peers:
    """Every peer of one endpoint (an actor, the supervisor, or an outside program such as the campaign).

    ``peers("sampler")`` is a ``PeerGroup`` over every sampler instance; ``peers("sampler-1")`` is the one
    named so. Sockets are opened on first use and dial in the background.
    """

    def __init__(self, config: RuntimeConfig, me: str, sealer: Sealer, opener: Opener,
                 logger: structlog.typing.FilteringBoundLogger):
        self.config, self.me = config, me
        self._sealer, self._opener, self._log = sealer, opener, logger
        self.rejects = RejectLog(logger, "replies")
        self._control: dict[str, ControlClient] = {}
        self._bulk: dict[str, BulkOutbox] = {}
        self._groups: dict[str, PeerGroup] = {}

    def __call__(self, role_or_name: str) -> PeerGroup:
        group = self._groups.get(role_or_name)
        if group is None:
            names = [s.name for s in self.config.actors_of(role_or_name)]
            if not names and any(s.name == role_or_name for s in self.config.actors):
                names = [role_or_name]
            if not names:
                roles = sorted({s.role for s in self.config.actors})
                raise NoSuchPeer(f"no actor with role or name {role_or_name!r} in the config "
                                 f"(roles: {', '.join(roles) or 'none'})")
            group = self._groups[role_or_name] = PeerGroup(self, role_or_name, names)
        return group

    def control(self, name: str) -> ControlClient:
        client = self._control.get(name)
        if client is None:
            address = (self.config.supervisor_address if name == "supervisor"
                       else self.config.control_address(self.config.actor(name)))
            client = self._control[name] = ControlClient(
                self.me, name, address, self._sealer, self._opener,
                max_bytes=self.config.transport.control_max_bytes, rejects=self.rejects,
                spin_s=self.config.transport.poll_spin_us * 1e-6)
        return client

    def bulk(self, name: str) -> BulkOutbox:
        outbox = self._bulk.get(name)
        if outbox is None:
            address = self.config.bulk_address(self.config.actor(name))
            outbox = self._bulk[name] = BulkOutbox(self.me, name, address, self._sealer)
        return outbox

    async def call(self, name: str, record: Record, deadline_s: float | None) -> Record:
        """One call to the instance ``name``; a typed error for a missed deadline or an ErrorReply."""
        try:
            reply = await self.control(name).call(record, deadline_s)
        except DeadlineExceeded as exc:
            self._log.warning("peer_unresponsive", peer=name, op=record.kind, deadline_s=exc.deadline_s)
            raise
        return raise_for_error(name, record.kind, reply)

    def close(self) -> None:
        for client in self._control.values():
            client.close()
        for outbox in self._bulk.values():
            outbox.close()
        self._control.clear()
        self._bulk.clear()


class PeerGroup:
    """The instances of one role (or one named instance)."""

    def __init__(self, peers: Peers, label: str, names: list[str]):
        self._peers, self.label, self.names = peers, label, names
        self._next = itertools.cycle(names)

    def pick(self, key: str | None = None) -> str:
        """An instance name: round-robin, or stable for ``key`` (e.g. a trial id, to keep its KV cache warm)."""
        if key is None:
            return next(self._next)
        return self.names[zlib.crc32(key.encode()) % len(self.names)]

    def _target(self, to: str | None) -> str:
        if to is None:
            return self.pick()
        if to not in self.names:
            raise NoSuchPeer(f"{to!r} is not one of {self.label!r}: {', '.join(self.names)}")
        return to

    async def call(self, record: Record, *, deadline_s: float | None = None, to: str | None = None) -> Record:
        """Control-plane call with a deadline (``deadline_s``, default ``[transport] control_deadline_s``).

        Raises DeadlineExceeded (naming the peer and op), RemoteError, or RequestCancelled."""
        deadline = self._peers.config.transport.control_deadline_s if deadline_s is None else deadline_s
        return await self._peers.call(self._target(to), record, deadline)

    async def call_bulk(self, record: Record, *, to: str | None = None) -> Record:
        """Request/reply without a deadline, for work that legitimately takes long (a learner step,
        a weights transfer). Cancel it with your own cancel scope."""
        return await self._peers.call(self._target(to), record, None)

    async def push(self, record: Record, *, to: str | None = None) -> None:
        """Bulk one-way delivery to the instance's inbox (its handler for the record's type); no deadline."""
        await self._peers.bulk(self._target(to)).push(record)

    async def broadcast(self, record: Record, *, deadline_s: float | None = None) -> dict[str, Record | Exception]:
        """The same call to every instance at once; each instance's reply or its error, by name."""
        results: dict[str, Record | Exception] = {}

        async def one(name: str) -> None:
            try:
                results[name] = await self.call(record, deadline_s=deadline_s, to=name)
            except (DeadlineExceeded, RemoteError) as exc:
                results[name] = exc

        async with trio.open_nursery() as nursery:
            for name in self.names:
                nursery.start_soon(one, name)
        return results


@asynccontextmanager
async def connect(config: RuntimeConfig, name: str = "client", *, key: bytes | None = None,
                  logger: structlog.typing.FilteringBoundLogger | None = None) -> AsyncIterator[Peers]:
    """Clients for a program that is not an actor (the campaign, a test, a tool)::

        async with connect(config, "campaign") as peers:
            pong = await peers("sampler").call(Ping())
    """
    key = config.hmac_key() if key is None else key
    peers = Peers(config, name, Sealer(key), Opener(key, config.transport.max_message_age_s),
                  logger or structlog.get_logger().bind(endpoint=name))
    try:
        yield peers
    finally:
        peers.close()
