"""Messages between actors: control plane (deadline-bound) and bulk requests.

Control: heartbeat, cancel, shutdown, ping. Sampling, sandbox and verifier requests and replies.
A reply to a failed request is an ``ErrorReply`` naming what failed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas.base import Float32Array, Int32Array, Record, RoutingArray
from schemas.registry import register


class Message(Record):
    """Base of records exchanged between actors (not necessarily logged)."""


@register
class Heartbeat(Message):
    kind = "heartbeat"
    actor: str
    role: str
    seq: int = Field(ge=0)
    sent_at: float
    status: dict[str, float] = {}


@register
class Ping(Message):
    kind = "ping"
    payload: bytes = b""


@register
class Pong(Message):
    kind = "pong"
    actor: str
    payload: bytes = b""


@register
class Cancel(Message):
    """Cancel a trial (or every trial with ``trial_id='*'``): abort generation, tear down sandboxes."""

    kind = "cancel"
    trial_id: str
    reason: str = ""


@register
class Shutdown(Message):
    kind = "shutdown"
    reason: str = ""


@register
class Ack(Message):
    kind = "ack"
    detail: str = ""


@register
class ErrorReply(Message):
    """A request failed; ``error`` is a short type name, ``detail`` says what and how to fix it."""

    kind = "error_reply"
    error: str
    detail: str


@register
class GenerateRequest(Message):
    kind = "generate_request"
    trial_id: str
    turn: int = Field(ge=0)
    input_ids: Int32Array
    max_new_tokens: int = Field(gt=0)
    temperature: float = Field(gt=0)
    top_p: float = Field(gt=0, le=1)
    seed: int | None = None
    stop_ids: list[int] = []
    policy_version_wanted: int | None = None
    # what input_ids repeat of the trial's previous turn (its prompt ++ sampled ids): the first prefix_len ids, of
    # which the caller holds routing rows for the first prefix_rows, computed under prefix_version. The turn's
    # record and reply then carry only what is new (SamplerTurn's docstring).
    prefix_len: int = Field(0, ge=0)
    prefix_rows: int = Field(0, ge=0)
    prefix_version: int | None = None
    # False: the trial is played to be trained, so its assembled trajectory will store the routing rows; the turn's
    # record leaves them out (a fact stored once). The reply carries them either way.
    record_routing: bool = True


@register
class GenerateReply(Message):
    kind = "generate_reply"
    trial_id: str
    turn: int
    output_ids: Int32Array
    logprobs: Float32Array
    routing: RoutingArray | None = None
    routing_start: int = Field(0, ge=0)  # the first position ``routing`` covers; the rows before are the caller's
    policy_version: int
    finish_reason: Literal["stop", "length", "cancelled", "error"]
    error: str | None = None  # finish_reason 'error': why (the engine unreachable or dead); an infrastructure failure


@register
class ExecRequest(Message):
    kind = "exec_request"
    trial_id: str
    turn: int = Field(ge=0)
    command: str
    timeout_s: float = Field(gt=0)


@register
class SandboxOpen(Message):
    kind = "sandbox_open"
    trial_id: str
    task_id: str


@register
class SandboxClose(Message):
    kind = "sandbox_close"
    trial_id: str


@register
class VerifyRequest(Message):
    """Verify a trial's final root. ``trial_id`` names the result; ``sandbox_id`` is the sandbox holding the
    root when it is not the trial's own (a continuation plays on in its original's), None meaning the
    trial's own (and in messages written before the field existed)."""

    kind = "verify_request"
    schema_version = 2  # 2 adds sandbox_id
    trial_id: str
    task_id: str
    sandbox_id: str | None = None


@register
class PolicyUpdate(Message):
    """The learner published a version; samplers load it between generations."""

    kind = "policy_update"
    version: int = Field(ge=0)
    location: str
    sha256: str


@register
class Generic(Message):
    """Escape hatch for actor-specific small control calls: an op name and msgpack-able args."""

    kind = "generic"
    op: str
    args: dict[str, Any] = {}
