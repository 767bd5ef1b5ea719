"""Tiny actors used by the runtime tests (no tests here). Actor processes that the tests start load them by
name, ``actor_class = "plugin_actors:EchoActor"`` (the tests put this directory on PYTHONPATH)."""

from __future__ import annotations

import os
import time

import numpy as np
import trio
import trio.testing
from pydantic import BaseModel, ConfigDict

from schemas.events import TrialIssued
from schemas.messages import Cancel, GenerateReply, GenerateRequest, Generic
from t1_actors.runtime import Actor, handles


class EchoActor(Actor):
    role = "echo"

    async def setup(self) -> None:
        self.stored: list[dict] = []
        self.cancelled: list[str] = []

    @handles(Generic)
    async def generic(self, req: Generic) -> Generic | None:
        if req.op == "echo":
            return Generic(op="echo", args=req.args)
        if req.op == "sleep":
            await trio.sleep(req.args["s"])
            return Generic(op="slept", args=req.args)
        if req.op == "fail":
            raise ValueError("asked to fail")
        if req.op == "store":
            self.stored.append(req.args)
            return None
        if req.op == "stored":
            return Generic(op="stored", args={"items": self.stored, "cancelled": self.cancelled})
        if req.op == "freeze":  # blocks the whole trio loop: heartbeats stop, as in a hung actor
            time.sleep(req.args["s"])
            return None
        if req.op == "pid":
            return Generic(op="pid", args={"pid": os.getpid()})
        if req.op == "log":
            event_id = await self.log(TrialIssued(trial_id=req.args["trial"], task_id="t", policy_version_wanted=0))
            return Generic(op="logged", args={"event_id": event_id})
        if req.op == "call_peer":
            reply = await self.peer(req.args["peer"]).call(Generic(op="echo", args={"via": self.name}),
                                                          deadline_s=req.args.get("deadline_s", 2.0))
            return reply
        raise KeyError(f"unknown op {req.op!r}")

    @handles(GenerateRequest)
    async def generate(self, req: GenerateRequest) -> GenerateReply:
        await trio.sleep_forever()  # only a Cancel ends it

    @handles(Cancel)
    async def on_cancel(self, req: Cancel) -> None:
        self.cancelled.append(req.trial_id)


class GracefulActor(Actor):
    role = "graceful"

    @handles(GenerateRequest, graceful_cancel=True)
    async def generate(self, req: GenerateRequest) -> GenerateReply:
        produced = 0
        while not self.cancel_requested(req.trial_id) and produced < 1000:
            produced += 1
            await trio.sleep(0.005)
        reason = "cancelled" if self.cancel_requested(req.trial_id) else "length"
        return GenerateReply(trial_id=req.trial_id, turn=req.turn, output_ids=np.zeros(produced, np.int32),
                             logprobs=np.zeros(produced, np.float32), policy_version=0, finish_reason=reason)


class CrashingActor(Actor):
    """Dies in setup() (before it serves or sends a heartbeat) on its first start, or on every start
    with ``always``; lives otherwise."""

    role = "crasher"

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        always: bool = False

    async def setup(self) -> None:
        marker = self.ctx.run_dir / f"{self.name}.started"
        if self.options.always or not marker.exists():
            marker.write_text("1")
            raise RuntimeError("crashing on first start, as designed")
