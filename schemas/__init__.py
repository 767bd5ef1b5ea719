"""t1 schemas: typed, immutable, versioned events and messages, and their msgpack codec."""

from .base import Array, ArraySpec, Record, RoutingArray, SchemaError, routing_dtype
from .codec import decode, encode, pack, unpack
from .events import (
    ActorLifecycle, CriticValues, CriticWarmup, EvalResult, Event, LearnerStep, SamplerTurn,
    SandboxExec, StalenessDecision, TrajectoryAssembled, TrialEnded, TrialIssued, VerifierResult, WeightsPublished,
)
from .messages import (
    Ack, Cancel, ErrorReply, ExecRequest, GenerateReply, GenerateRequest, Generic, Heartbeat, Message,
    Ping, PolicyUpdate, Pong, SandboxClose, SandboxOpen, Shutdown, VerifyRequest,
)
from .registry import known_kinds, lookup, register

__all__ = [name for name in dir() if not name.startswith("_")]
