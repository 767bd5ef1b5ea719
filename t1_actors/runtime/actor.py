"""The Actor base class: a role, request handlers, an optional background ``run``, and its context."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import structlog
import trio
from pydantic import BaseModel, ValidationError

from schemas import Record
from schemas.events import Event
from storage import SegmentWriter
from t1_actors.runtime.config import ActorSpec, ConfigError, RuntimeConfig, explain
from t1_actors.runtime.inflight import InFlight
from t1_actors.runtime.peers import PeerGroup, Peers

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def handles(*types: type[Record], graceful_cancel: bool = False) -> Callable[[F], F]:
    """Mark ``async def method(self, request) -> Record | None`` as the handler of these request types.

    The handler runs in its own task; when the request has a ``trial_id`` it runs in a cancel scope
    that a ``Cancel`` for that trial cancels (the caller then gets ``RequestCancelled``). With
    ``graceful_cancel=True`` the scope is left alone and the handler polls
    ``self.cancel_requested(trial_id)`` to stop early and return a partial result. Returning None
    replies ``Ack``; raising replies ``ErrorReply`` (the caller gets ``RemoteError``). The same
    handler serves the type when it arrives as a bulk push (its return value is then dropped).
    """
    if not types or not all(isinstance(t, type) and issubclass(t, Record) for t in types):
        raise TypeError("@handles takes one or more record types, e.g. @handles(GenerateRequest)")

    def mark(method: F) -> F:
        method.__t1_handles__ = (types, graceful_cancel)  # type: ignore[attr-defined]
        return method

    return mark


def on_event(*types: type[Record]) -> Callable[[F], F]:
    """Mark ``async def method(self, event)`` as the handler of these event types read from the log: the
    twin of ``@handles`` for actors that follow the log. ``self.followed_kinds()`` is the cursor's kinds
    filter; ``await self.on_logged(event)`` calls the handlers of the event's type in definition order."""
    if not types or not all(isinstance(t, type) and issubclass(t, Record) for t in types):
        raise TypeError("@on_event takes one or more event types, e.g. @on_event(LearnerStep)")

    def mark(method: F) -> F:
        method.__t1_on_event__ = types  # type: ignore[attr-defined]
        return method

    return mark


@dataclass
class ActorContext:
    """What the runtime gives an actor. Built by the host; ``Actor`` exposes each as an attribute."""

    name: str
    role: str
    config: RuntimeConfig
    spec: ActorSpec
    logger: structlog.typing.FilteringBoundLogger
    peers: Peers
    inflight: InFlight = field(default_factory=InFlight)
    writer: SegmentWriter | None = None  # opened by the host
    shutdown: trio.Event = field(default_factory=trio.Event)

    @property
    def run_id(self) -> str:
        return self.config.run.id

    @property
    def run_dir(self) -> Path:
        return self.config.run.dir


class Actor:
    """Base of every actor. See ``t1_actors.runtime`` for the whole API with an example."""

    role: ClassVar[str] = ""
    Options: ClassVar[type[BaseModel] | None] = None  # validates the [[actors]] entry's ``options``
    _handlers: ClassVar[dict[type[Record], tuple[str, bool]]] = {}
    _event_handlers: ClassVar[dict[type[Record], list[str]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[type[Record], tuple[str, bool]] = {}
        events: dict[type[Record], list[str]] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                marked = getattr(value, "__t1_handles__", None)
                if marked is not None:
                    types, graceful = marked
                    for t in types:
                        table[t] = (attr, graceful)
                for t in getattr(value, "__t1_on_event__", ()):
                    if attr not in events.setdefault(t, []):
                        events[t].append(attr)
        cls._handlers = table
        cls._event_handlers = events

    @classmethod
    def followed_kinds(cls) -> list[str]:
        """The event kinds this actor's ``@on_event`` handlers read (a cursor's ``kinds`` filter)."""
        return sorted({t.kind for t in cls._event_handlers})

    async def on_logged(self, event: Record) -> None:
        """Dispatch one event read from the log to its ``@on_event`` handlers (none: ignored)."""
        for attr in self._event_handlers.get(type(event), ()):
            await getattr(self, attr)(event)

    def __init__(self, ctx: ActorContext):
        self.ctx = ctx
        self.name, self.role_name = ctx.name, ctx.role
        self.config = ctx.config
        self.logger = ctx.logger
        self.options = self.validate_options(ctx.spec)

    @classmethod
    def validate_options(cls, spec: ActorSpec) -> Any:
        """``spec.options`` validated by ``cls.Options`` (a ConfigError naming the actor when wrong)."""
        if cls.Options is None:
            if spec.options:
                raise ConfigError(f"actor {spec.name!r}: role {spec.role!r} takes no options "
                                  f"(got {', '.join(spec.options)})")
            return None
        try:
            return cls.Options.model_validate(spec.options)
        except ValidationError as exc:
            raise ConfigError(f"actor {spec.name!r} options: {explain(exc)}") from None

    # ---- lifecycle hooks, overridden by subclasses ---------------------------------------------
    async def setup(self) -> None:
        """Before requests are served: load models, open backends."""

    async def run(self) -> None:
        """Background work for the actor's life (optional). Returning is fine; raising kills the actor."""

    async def teardown(self) -> None:
        """After serving stopped (also after a crash): close backends. The log writer is committed after this."""

    def status(self) -> dict[str, float]:
        """Numbers sent with each heartbeat (queue lengths, policy version ...)."""
        return {}

    # ---- services -------------------------------------------------------------------------------
    def peer(self, role_or_name: str) -> PeerGroup:
        """Clients to the instances of a role, or to one instance by name."""
        return self.ctx.peers(role_or_name)

    async def log(self, event: Event, *, commit: bool = True) -> str:
        """Append an event to this actor's segment of the run's log; committed (visible) unless commit=False."""
        writer = self.ctx.writer
        if writer is None:
            raise RuntimeError(f"actor {self.name!r} has no log writer (the host did not open the event log)")
        event_id = await writer.aappend(event)
        if commit:
            await writer.acommit()
        return event_id

    async def commit(self) -> None:
        """Make events appended with commit=False visible."""
        if self.ctx.writer is not None:
            await self.ctx.writer.acommit()

    def cancel_requested(self, trial_id: str) -> bool:
        """True once a Cancel for ``trial_id`` arrived (for graceful handlers)."""
        return self.ctx.inflight.cancel_requested(trial_id)

    async def wait_cancel(self, trial_id: str) -> None:
        """Return once a Cancel for ``trial_id`` arrives (for graceful handlers that stop work on it)."""
        await self.ctx.inflight.wait_cancelled(trial_id)

    def request_shutdown(self, reason: str = "") -> None:
        """Stop this actor cleanly (as a Shutdown message would)."""
        self.logger.info("shutdown_requested", reason=reason)
        self.ctx.shutdown.set()
