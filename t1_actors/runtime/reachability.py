"""An actor's own view of whether its peers answer: pings each peer instance every heartbeat interval and
records in the log when one stops answering for longer than the heartbeat timeout, and when it answers again.

The supervisor sees heartbeats (actor -> supervisor); this sees the paths an actor's work takes (e.g. the
staleness controller -> a sampler on another host). Across hosts the two can differ: a cut link between two
hosts leaves both reachable from the supervisor's host, yet the trials between them stall. Calls without a
deadline (generations, verifications) wait through such a cut and resume when the link returns; this makes
the outage a fact in the log instead of a silent pause:

    ActorLifecycle(actor=PEER, state="unreachable", reason="staleness-0: no answer to pings for 3.2 s")
    ActorLifecycle(actor=PEER, state="reachable",   reason="staleness-0: answering again after 11.4 s")

``while_reachable`` bounds such a wait: the call is given up (``PeerGone``) once its peer has been unreachable
for longer than a wait of the caller's choosing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from schemas import Record
from schemas.events import ActorLifecycle, Event
from schemas.messages import Ping
from t1_actors.runtime.errors import DeadlineExceeded, PeerGone, RemoteError
from t1_actors.runtime.peers import PeerGroup


class PeerWatch:
    """Pings ``peers`` (name -> role) from ``me``; ``log(event)`` appends and commits to ``me``'s segment.

    Guarantee: one ``unreachable`` event per outage longer than ``timeout_s`` (measured from the last
    answered ping), followed by one ``reachable`` event when the peer answers again."""

    def __init__(self, me: str, peers: dict[str, str], call: Callable[[str, float], Awaitable[object]],
                 log: Callable[[Event], Awaitable[object]], *, interval_s: float, timeout_s: float):
        self.me, self.peers, self._call, self._log = me, dict(peers), call, log
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.last_answer: dict[str, float] = {}
        self.unreachable: dict[str, float] = {}  # peer -> when it was last answering

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for name in self.peers:
                nursery.start_soon(self._watch, name)

    async def _watch(self, name: str) -> None:
        while True:
            started = trio.current_time()
            try:
                await self._call(name, self.interval_s)
                answered = True
            except (DeadlineExceeded, RemoteError, OSError):
                answered = False
            now = trio.current_time()
            if answered:
                if name in self.unreachable:
                    silent = now - self.unreachable.pop(name)
                    await self._record(name, "reachable", f"{self.me}: answering again after {silent:.1f} s")
                self.last_answer[name] = now
            elif name in self.last_answer and name not in self.unreachable:
                silent = now - self.last_answer[name]
                if silent > self.timeout_s:
                    self.unreachable[name] = self.last_answer[name]
                    await self._record(name, "unreachable", f"{self.me}: no answer to pings for {silent:.1f} s")
            await trio.sleep(max(0.0, self.interval_s - (trio.current_time() - started)))

    async def _record(self, name: str, state: str, reason: str) -> None:
        await self._log(ActorLifecycle(actor=name, role=self.peers[name], state=state, reason=reason))


T = TypeVar("T")


async def while_reachable(watch: PeerWatch, name: str, op: str, wait_s: float, call: Callable[[], Awaitable[T]],
                          *, poll_s: float = 0.5) -> T:
    """``await call()`` (a call without a deadline to peer instance ``name``), given up with ``PeerGone`` once
    ``watch`` has seen ``name`` unreachable for longer than ``wait_s`` (counted from its last answered ping).

    A peer killed and restarted in the meantime answers the call itself: a request/reply socket resends a request
    whose pipe closed (``runtime.nngraw``), so the restarted peer serves the request in flight, once; a peer that
    is merely slow (pings answered) is waited for without limit."""
    result: list[T] = []
    async with trio.open_nursery() as nursery:
        async def answer() -> None:
            result.append(await call())
            nursery.cancel_scope.cancel()

        nursery.start_soon(answer)
        while True:
            since = watch.unreachable.get(name)
            if since is not None and trio.current_time() - since > wait_s:
                nursery.cancel_scope.cancel()
                break
            await trio.sleep(poll_s)
    if result:
        return result[0]
    raise PeerGone(name, op, trio.current_time() - watch.unreachable.get(name, trio.current_time()))


def ping_call(peer_group: Callable[[str], PeerGroup]) -> Callable[[str, float], Awaitable[Record]]:
    """``call(name, deadline_s)`` over an actor's ``peer(name)`` clients: one control-plane Ping."""
    async def call(name: str, deadline_s: float) -> Record:
        return await peer_group(name).call(Ping(), deadline_s=deadline_s)
    return call
