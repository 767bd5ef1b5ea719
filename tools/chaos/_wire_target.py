"""The actor the wire's faults attack (``WireTarget``, role ``wire``), the transport settings it runs under, and
how a peer asks it what it saw.

``WireTarget`` counts every record it handles by op: a forged record (``Generic(op="forged")``) that reaches a
handler shows up in ``actor_counts(target)["handled"]["forged"]``, which must stay 0; ``rejections(target)``
reads the runtime's own counts of the frames it dropped, by reason.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import trio

from schemas.messages import Generic
from t1_actors.runtime import Actor, handles

PING_EVERY_S = 0.2
HEARTBEAT_INTERVAL_S, HEARTBEAT_TIMEOUT_S, MAX_AGE_S = 0.5, 3.0, 20.0


class WireTarget(Actor):
    """The actor under attack: counts what it handles (``forged`` must stay 0), stores bulk pushes."""

    role = "wire"

    async def setup(self) -> None:
        self.handled: Counter[str] = Counter()
        self.stored = 0

    @handles(Generic)
    async def generic(self, req: Generic) -> Generic | None:
        if req.op in ("forged", "legit"):
            self.handled[req.op] += 1
            return Generic(op="handled", args={"op": req.op})
        if req.op == "store":
            self.stored += 1
            return None
        if req.op == "sleep":
            await trio.sleep(float(req.args["s"]))
            return Generic(op="slept")
        if req.op == "count":
            return Generic(op="count", args={"handled": dict(self.handled), "stored": self.stored, "pid": os.getpid()})
        raise KeyError(f"unknown op {req.op!r}")


async def actor_counts(target) -> dict[str, Any]:
    return (await target.call(Generic(op="count"), deadline_s=10)).args


async def rejections(target) -> Counter[str]:
    return Counter((await target.call(Generic(op="runtime.stats"), deadline_s=10)).args["rejected"])
