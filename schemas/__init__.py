"""t1 schemas: typed, immutable, versioned events and messages, and their msgpack codec."""

from schemas.base import (
    Array,
    ArraySpec,
    Float32Array,
    Int32Array,
    Record,
    RoutingArray,
    SchemaError,
    UInt8Array,
    routing_dtype,
)
from schemas.codec import decode, encode, pack, unpack
from schemas.events import (
    ActorLifecycle,
    ContextEdited,
    CriticValues,
    CriticWarmup,
    EvalResult,
    Event,
    LearnerStep,
    SamplerTurn,
    SandboxExec,
    StalenessDecision,
    TrajectoryAssembled,
    TrialEnded,
    TrialIssued,
    VerifierResult,
    WeightsPublished,
    WorkspaceRecovered,
)
from schemas.messages import (
    Ack,
    Cancel,
    ErrorReply,
    ExecRequest,
    GenerateReply,
    GenerateRequest,
    Generic,
    Heartbeat,
    Message,
    Ping,
    PolicyUpdate,
    Pong,
    SandboxClose,
    SandboxOpen,
    Shutdown,
    VerifyRequest,
)
from schemas.registry import known_kinds, lookup, register

__all__ = [name for name in dir() if not name.startswith("_")]
