"""Runs one actor in this process: its sockets, dispatch, heartbeats, log writer and clean shutdown."""

from __future__ import annotations

import os
import signal
import time

import structlog
import trio

from schemas import Record, SchemaError
from schemas.events import ActorLifecycle
from schemas.messages import Ack, Cancel, ErrorReply, Generic, Heartbeat, Ping, Pong, Shutdown
from storage import EventLog, SegmentWriter
from t1_actors.runtime.actor import Actor, ActorContext
from t1_actors.runtime.auth import Opener, Sealer
from t1_actors.runtime.config import RuntimeConfig
from t1_actors.runtime.errors import DeadlineExceeded, RemoteError
from t1_actors.runtime.logs import configure_logging
from t1_actors.runtime.memory import keep_freed_buffers
from t1_actors.runtime.peers import Peers
from t1_actors.runtime.process import wait_for_exit
from t1_actors.runtime.transport import BulkInbox, ControlServer, RejectLog
from t1_actors.runtime.wire import RawEnvelope

_DRAIN_S = 2.0  # how long in-flight replies get to go out after a shutdown


class ActorHost:
    """Owns the runtime side of one actor instance."""

    def __init__(self, actor_cls: type[Actor], config: RuntimeConfig, name: str, *, key: bytes | None = None,
                 logger: structlog.typing.FilteringBoundLogger | None = None):
        self.config = config
        self.spec = config.actor(name)
        self.actor_cls = actor_cls
        key = config.hmac_key() if key is None else key
        self.sealer = Sealer(key)
        self.opener = Opener(key, config.transport.max_message_age_s)
        self.logger = logger or structlog.get_logger().bind(actor=name, role=self.spec.role, run_id=config.run.id)
        self.peers = Peers(config, name, self.sealer, self.opener, self.logger)
        self.ctx = ActorContext(name=name, role=self.spec.role, config=config, spec=self.spec,
                                logger=self.logger, peers=self.peers)
        self.rejects = RejectLog(self.logger, "requests")
        self.actor: Actor | None = None

    # ---- dispatch -------------------------------------------------------------------------------
    async def _dispatch(self, env: RawEnvelope) -> Record:
        try:
            record = env.record()
        except SchemaError as exc:
            self.logger.warning("bad_request", peer=env.sender, op=env.op(), error=str(exc))
            return ErrorReply(error="SchemaError", detail=str(exc))
        return await self._handle(record, env.sender)

    async def _handle(self, record: Record, sender: str) -> Record:
        actor = self.actor
        assert actor is not None
        if isinstance(record, Ping):
            return Pong(actor=self.ctx.name, payload=record.payload)
        if isinstance(record, Generic) and record.op == "runtime.stats":
            return Generic(op="runtime.stats", args={"rejected": dict(self.rejects.counts), "pid": os.getpid(),
                                                     "in_flight": len(self.ctx.inflight)})
        if isinstance(record, Shutdown):
            self.logger.info("shutdown_received", peer=sender, reason=record.reason)
            self.ctx.shutdown.set()
            return Ack(detail="shutting down")
        if isinstance(record, Cancel):
            n = self.ctx.inflight.cancel(record.trial_id, record.reason or f"cancelled by {sender}")
            self.logger.info("cancel", trial_id=record.trial_id, peer=sender, requests=n)
        entry = type(actor)._handlers.get(type(record))
        if entry is None:
            if isinstance(record, Cancel):
                return Ack(detail=f"cancelled {n}")
            handled = ", ".join(sorted(t.kind for t in type(actor)._handlers)) or "nothing"
            return ErrorReply(error="NotHandled", detail=f"{self.ctx.name} ({self.ctx.role}) does not handle "
                                                         f"{record.kind!r}; it handles {handled}")
        method_name, graceful = entry
        trial_id = getattr(record, "trial_id", None)
        binds = {k: v for k, v in (("trial_id", trial_id),
                                   ("policy_version", getattr(record, "policy_version",
                                                              getattr(record, "policy_version_wanted", None))))
                 if v is not None}
        structlog.contextvars.bind_contextvars(**binds)  # this task's context only (trio copies per task)
        reply: Record | None = None
        tracked = None if isinstance(record, Cancel) else trial_id  # a Cancel's own handler must not be cancelled
        with self.ctx.inflight.track(tracked, graceful) as request:
            try:
                reply = await getattr(actor, method_name)(record)
            except Exception as exc:  # the handler failed: the caller gets a typed ErrorReply, we keep serving
                self.logger.exception("handler_failed", op=record.kind, peer=sender)
                return ErrorReply(error=type(exc).__name__, detail=str(exc) or repr(exc))
        if request.scope.cancelled_caught:
            return ErrorReply(error="Cancelled", detail=request.cancel_reason or "cancelled")
        if isinstance(record, Cancel) and reply is None:
            return Ack(detail=f"cancelled {n}")
        if reply is not None and not isinstance(reply, Record):
            return ErrorReply(error="BadReply", detail=f"handler {method_name} returned {type(reply).__name__}, "
                              "not a schemas record")
        return Ack() if reply is None else reply

    async def _dispatch_bulk(self, env: RawEnvelope) -> None:
        reply = await self._dispatch(env)
        if isinstance(reply, ErrorReply):
            self.logger.warning("bulk_failed", peer=env.sender, op=env.op(), error=reply.error, detail=reply.detail)

    # ---- background tasks -----------------------------------------------------------------------
    async def _heartbeats(self) -> None:
        transport = self.config.transport
        seq, silent = 0, False
        while True:
            beat = Heartbeat(actor=self.ctx.name, role=self.ctx.role, seq=seq, sent_at=time.time(),
                             status={k: float(v) for k, v in self._status().items()})
            try:
                await self.peers.call("supervisor", beat, transport.heartbeat_interval_s)
                if silent:
                    self.logger.info("supervisor_reachable_again")
                silent = False
            except (DeadlineExceeded, RemoteError) as exc:
                if not silent:
                    self.logger.warning("supervisor_unreachable", error=str(exc))
                silent = True
            seq += 1
            await trio.sleep(transport.heartbeat_interval_s)

    def _status(self) -> dict[str, float]:
        status = {"in_flight": float(len(self.ctx.inflight)), "rejected": float(sum(self.rejects.counts.values()))}
        try:
            status.update(self.actor.status() if self.actor else {})
        except Exception as exc:  # a broken status() must not stop heartbeats
            self.logger.warning("status_failed", error=repr(exc))
        return status

    async def _run_actor(self, actor: Actor) -> None:
        await actor.run()
        self.logger.info("run_returned")

    async def _watch_supervisor(self, pid: int) -> None:
        await wait_for_exit(pid)
        self.logger.warning("supervisor_gone", pid=pid, note="shutting down: no orphan actors")
        self.ctx.shutdown.set()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                self.logger.info("signal", signal=signal.Signals(signum).name)
                self.ctx.shutdown.set()

    # ---- the whole life -------------------------------------------------------------------------
    async def serve(self, *, handle_signals: bool = False, supervisor_pid: int | None = None,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the log, set the actor up, serve until Shutdown (or a signal), then stop cleanly."""
        self.ctx.writer = await _open_writer(self.config, self.ctx.name)
        try:
            self.actor = actor = self.actor_cls(self.ctx)
            await self.log_lifecycle("started", reason="serving")  # the supervisor logs the spawn: two facts
            async with trio.open_nursery() as nursery:
                if handle_signals:
                    nursery.start_soon(self._signals)
                if supervisor_pid is not None:
                    nursery.start_soon(self._watch_supervisor, supervisor_pid)
                await actor.setup()
                server = ControlServer(self.ctx.name, self.config.control_address(self.spec), self.sealer,
                                       self.opener, max_bytes=self.config.transport.control_max_bytes,
                                       rejects=self.rejects, spin_s=self.config.transport.poll_spin_us * 1e-6)
                inbox = BulkInbox(self.ctx.name, self.config.bulk_address(self.spec), self.opener,
                                  max_bytes=self.config.transport.bulk_max_bytes, rejects=self.rejects)
                serving = trio.CancelScope()
                server_done = trio.Event()

                async def run_server(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                    with serving:
                        await server.serve(self._dispatch, task_status=task_status)
                    server_done.set()

                work = trio.CancelScope()

                async def run_work() -> None:
                    with work:
                        async with trio.open_nursery() as inner:
                            await inner.start(inbox.serve, self._dispatch_bulk)
                            inner.start_soon(self._heartbeats)
                            inner.start_soon(self._run_actor, actor)

                await nursery.start(run_server)
                nursery.start_soon(run_work)
                self.logger.info("serving", control=server.address, bulk=inbox.address, pid=os.getpid())
                task_status.started()
                await self.ctx.shutdown.wait()
                # Stop background work, cancel handlers in flight, let their replies (and the Shutdown's Ack) out.
                work.cancel()
                self.ctx.inflight.cancel_all("actor shutting down")
                server.stop_accepting()
                with trio.move_on_after(_DRAIN_S):
                    await server_done.wait()
                nursery.cancel_scope.cancel()
            await self.log_lifecycle("stopped", reason="shutdown")
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await self.log_lifecycle("stopped", reason="cancelled by the enclosing program")
            raise
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await self.log_lifecycle("died", reason=_describe(exc))
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self._close()

    async def log_lifecycle(self, state: str, reason: str = "") -> None:
        if self.ctx.writer is None:
            return
        try:
            await self.ctx.writer.aappend(ActorLifecycle(actor=self.ctx.name, role=self.ctx.role, state=state,
                                                          reason=reason, pid=os.getpid()))
            await self.ctx.writer.acommit()
        except Exception as exc:  # never let bookkeeping mask the real outcome
            self.logger.error("lifecycle_log_failed", state=state, error=repr(exc))

    async def _close(self) -> None:
        try:
            if self.actor is not None:
                await self.actor.teardown()
        finally:
            self.peers.close()
            if self.ctx.writer is not None:
                await self.ctx.writer.aclose()  # commits the tail: no half-written event
                self.ctx.writer = None
            self.logger.info("stopped", rejected=dict(self.rejects.counts))


def _describe(exc: BaseException) -> str:
    """The leaf exceptions of a (nested) exception group, e.g. "RuntimeError: disk full"."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)[:500]
    return f"{type(exc).__name__}: {exc}"[:500]


async def _open_writer(config: RuntimeConfig, name: str) -> SegmentWriter:
    """This actor's segment writer of the run's event log (``RuntimeConfig.log_location``: RUN/log or
    ``[storage] url``), checking routing records against the run's shape (``RuntimeConfig.routing_shape``)."""
    shape = config.routing_shape()

    def open_sync() -> SegmentWriter:
        log = EventLog.open(config.log_location(), create=True, config=config.storage)
        if shape is None:
            return log.writer(name)
        layers, top_k, experts = shape
        return log.writer(name, routing_shape=(layers, top_k), num_experts=experts)

    return await trio.to_thread.run_sync(open_sync)


async def serve_actor(actor_cls: type[Actor], config: RuntimeConfig, name: str, *, key: bytes | None = None,
                      handle_signals: bool = False, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run actor ``name`` of ``config`` with class ``actor_cls`` inside the current trio program."""
    host = ActorHost(actor_cls, config, name, key=key)
    await host.serve(handle_signals=handle_signals, task_status=task_status)


def run_actor_process(actor_cls: type[Actor], config: RuntimeConfig, name: str, *,
                      supervisor_pid: int | None = None) -> int:
    """Entry point of an actor process: logging, signals, one trio loop. Returns the exit status.

    With ``supervisor_pid`` the actor shuts down cleanly when that process exits (no orphans)."""
    spec = config.actor(name)
    logger = configure_logging(actor=name, role=spec.role, run_id=config.run.id)
    keep_freed_buffers()  # bulk messages reuse freed buffers instead of page-faulting fresh ones (memory.py)
    host = ActorHost(actor_cls, config, name, logger=logger)
    try:
        trio.run(lambda: host.serve(handle_signals=True, supervisor_pid=supervisor_pid))
    except KeyboardInterrupt:
        return 130
    except Exception:
        logger.exception("actor_crashed")
        return 1
    return 0
