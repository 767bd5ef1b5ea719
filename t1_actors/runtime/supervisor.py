"""The supervisor: starts every local actor as a process, watches heartbeats, restarts the dead, stops all.

``t1-actor launch`` runs it as a program; the campaign runs it inside its own trio program::

    supervisor = Supervisor(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)      # returns once every local actor sent a heartbeat
        ...
        await supervisor.shutdown("done")        # run() returns when every process is gone

A dead actor is restarted after a backoff that doubles per restart (``restart_backoff_s`` up to
``restart_backoff_max_s``); after ``restart_limit`` restarts inside ``restart_window_s`` the supervisor
gives up on it (logged, ``ActorLifecycle(state='gave_up')``). An actor whose heartbeats stop for
``heartbeat_timeout_s`` is reported by name and logged (``ActorLifecycle(state='unreachable')``, then
``'reachable'`` when its heartbeats resume) and, with ``restart_unresponsive``, killed and restarted.
Shutdown: a ``Shutdown`` message to each, then SIGTERM after ``shutdown_grace_s``, then SIGKILL.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import trio

from schemas import Record
from schemas.events import ActorLifecycle
from schemas.messages import Ack, ErrorReply, Heartbeat, Ping, Pong, Shutdown
from storage import SegmentWriter
from t1_actors.runtime.auth import Opener, Sealer
from t1_actors.runtime.config import RUN_KEY_ENV, ActorSpec, ConfigError, RuntimeConfig, write_resolved
from t1_actors.runtime.errors import DeadlineExceeded, RemoteError
from t1_actors.runtime.host import _open_writer
from t1_actors.runtime.peers import Peers
from t1_actors.runtime.transport import ControlServer, RejectLog
from t1_actors.runtime.wire import RawEnvelope

SUPERVISOR_PID_ENV = "T1_SUPERVISOR_PID"
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()}


class SupervisorError(RuntimeError):
    """The run could not be brought up (an actor never became ready, or was given up on)."""


@dataclass(eq=False)
class _Managed:
    spec: ActorSpec
    local: bool
    process: trio.Process | None = None
    ready: trio.Event = field(default_factory=trio.Event)
    started_at: float = 0.0
    last_heartbeat: float | None = None
    status: dict[str, float] = field(default_factory=dict)
    restarts: deque[float] = field(default_factory=deque)
    state: str = "pending"  # pending, running, restarting, gave_up, stopped, remote
    kill_reason: str | None = None
    silent_reported: bool = False


class Supervisor:
    def __init__(self, config: RuntimeConfig, *, hosts: set[str] | None = None, key: bytes | None = None,
                 env: dict[str, str] | None = None, python: str = sys.executable,
                 logger: structlog.typing.FilteringBoundLogger | None = None):
        self.config = config
        self.logger = logger or structlog.get_logger().bind(actor="supervisor", role="supervisor",
                                                            run_id=config.run.id)
        if key is None:
            try:
                key = config.hmac_key()
            except ConfigError:
                key = secrets.token_hex(32).encode()
                self.logger.info("run_key_generated", note=f"fresh per-run key handed to actors via ${RUN_KEY_ENV}")
        self._key = key
        self._env = dict(os.environ if env is None else env)
        self._python = python
        hosts = LOCAL_HOSTS if hosts is None else hosts
        self.actors = {s.name: _Managed(s, local=s.host in hosts) for s in config.actors}
        for managed in self.actors.values():
            if not managed.local:
                managed.state = "remote"
        self._sealer, self._opener = Sealer(key), Opener(key, config.transport.max_message_age_s)
        self._stopping = False
        self._stop_requested = trio.Event()
        self._stop_reason = "shutdown requested"
        self._stopped = trio.Event()
        self._writer: SegmentWriter | None = None
        self._config_path: Path | None = None

    # ---- public face ----------------------------------------------------------------------------
    async def run(self, *, handle_signals: bool = False,
                  task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every local actor, report ready (``task_status.started(self)``), supervise until shutdown."""
        cfg = self.config
        self._config_path = self._actor_config()
        self._writer = await _open_writer(cfg, self.name)
        peers = Peers(cfg, self.name, self._sealer, self._opener, self.logger)
        try:
            async with trio.open_nursery() as nursery:
                await self._listen(nursery, peers)
                if handle_signals:
                    nursery.start_soon(self._signals)
                for managed in self.actors.values():
                    if managed.local:
                        nursery.start_soon(self._keep_alive, managed)
                nursery.start_soon(self._watchdog)
                failure: SupervisorError | None = None
                async with trio.open_nursery() as startup:  # a stop request may come before readiness
                    async def stop_waiting() -> None:
                        await self._stop_requested.wait()
                        startup.cancel_scope.cancel()
                    startup.start_soon(stop_waiting)
                    try:
                        await self._wait_all_ready()
                    except SupervisorError as exc:
                        failure = exc
                    startup.cancel_scope.cancel()
                if failure is not None:
                    self.logger.error("run_failed", error=str(failure))
                    await self._stop_all(peers, "an actor did not come up")
                    nursery.cancel_scope.cancel()
                else:
                    if not self._stop_requested.is_set():
                        local = sorted(n for n, m in self.actors.items() if m.local)
                        self.logger.info("run_ready", actors=local)
                        task_status.started(self)
                    await self._stop_requested.wait()
                    await self._stop_all(peers, self._stop_reason)
                    nursery.cancel_scope.cancel()
            if failure is not None:
                raise failure  # plain, not wrapped in a nursery's exception group
        finally:
            peers.close()
            with trio.CancelScope(shield=True):
                await self._kill_leftovers()
                if self._writer is not None:
                    await self._writer.aclose()
            self._stopped.set()
            self.logger.info("supervisor_stopped")

    name = "supervisor"  # its log segment and the sender of its requests

    def _actor_config(self) -> Path:
        """The config file its actors are started with: the validated config (minus the key), written for them."""
        return write_resolved(self.config, self.config.run.dir / "config.resolved.json")

    async def _listen(self, nursery: trio.Nursery, peers: Peers) -> None:
        """Serve the heartbeat address: every actor's heartbeats (local ones and those of other hosts)."""
        cfg = self.config
        server = ControlServer("supervisor", cfg.supervisor_address, self._sealer, self._opener,
                               max_bytes=cfg.transport.control_max_bytes, rejects=RejectLog(self.logger, "heartbeats"))
        await nursery.start(server.serve, self._on_message)

    def _heard(self, managed: _Managed, status: dict[str, float]) -> bool:
        """An actor is alive (a heartbeat, or an answered ping): its clock, status, readiness; True when it was
        reported silent (the caller logs it ``reachable`` again)."""
        managed.last_heartbeat = time.monotonic()
        managed.status = dict(status)
        again = managed.silent_reported
        if again:
            self.logger.info("actor_responsive_again", peer=managed.spec.name)
            managed.silent_reported = False
        if not managed.ready.is_set():
            managed.ready.set()
            self.logger.info("actor_ready", peer=managed.spec.name)
        return again

    async def shutdown(self, reason: str = "shutdown requested") -> None:
        """Stop every actor cleanly and wait until ``run`` has finished."""
        self.request_stop(reason)
        await self._stopped.wait()

    def request_stop(self, reason: str = "shutdown requested") -> None:
        if not self._stop_requested.is_set():
            self._stop_reason = reason
            self._stop_requested.set()

    async def wait_ready(self, name: str, timeout_s: float | None = None) -> None:
        """Wait until actor ``name`` sent a heartbeat since its last (re)start."""
        managed = self.actors[name]
        with trio.fail_after(timeout_s if timeout_s is not None else self.config.supervisor.ready_timeout_s):
            await self._await_ready(managed)
        if managed.state == "gave_up":
            raise SupervisorError(f"actor {name!r} was given up on")

    @staticmethod
    async def _await_ready(m: _Managed) -> None:
        # A (re)start swaps in a fresh event and sets the old one, so waiters wake and look again.
        while True:
            await m.ready.wait()
            if m.state == "gave_up" or (m.ready.is_set() and m.last_heartbeat is not None):
                return

    def pid(self, name: str) -> int | None:
        process = self.actors[name].process
        return None if process is None or process.returncode is not None else process.pid

    def state(self) -> dict[str, dict[str, Any]]:
        """Per actor: state, pid, restarts, seconds since its last heartbeat, last status."""
        now = time.monotonic()
        return {name: {"state": m.state, "pid": self.pid(name), "restarts": len(m.restarts),
                       "heartbeat_age_s": None if m.last_heartbeat is None else now - m.last_heartbeat,
                       "status": dict(m.status)}
                for name, m in self.actors.items()}

    # ---- heartbeats -----------------------------------------------------------------------------
    async def _on_message(self, env: RawEnvelope) -> Record:
        try:
            record = env.record()
        except Exception as exc:
            return ErrorReply(error="SchemaError", detail=str(exc))
        if isinstance(record, Heartbeat):
            managed = self.actors.get(record.actor)
            if managed is None or managed.spec.role != record.role or env.sender != record.actor:
                return ErrorReply(error="UnknownActor", detail=f"{record.actor!r} is not a configured actor")
            if self._heard(managed, dict(record.status)):
                await self._event(managed, "reachable", reason="supervisor: heartbeats again")
            return Ack()
        if isinstance(record, Ping):
            return Pong(actor="supervisor", payload=record.payload)
        return ErrorReply(error="NotHandled", detail=f"the supervisor does not handle {record.kind!r}")

    async def _watchdog(self) -> None:
        transport, sup = self.config.transport, self.config.supervisor
        while True:
            await trio.sleep(transport.heartbeat_interval_s)
            now = time.monotonic()
            for name, m in self.actors.items():
                if self._stopping or m.state not in ("running", "remote"):
                    continue
                if m.last_heartbeat is None:
                    if m.local and now - m.started_at > sup.ready_timeout_s and m.kill_reason is None:
                        self.logger.error("actor_not_ready", peer=name, waited_s=round(now - m.started_at, 1))
                        self._kill(m, f"no heartbeat within ready_timeout_s={sup.ready_timeout_s}")
                    continue
                silent = now - m.last_heartbeat
                if silent > transport.heartbeat_timeout_s and not m.silent_reported:
                    m.silent_reported = True
                    self.logger.error("actor_unresponsive", peer=name, silent_s=round(silent, 2))
                    await self._event(m, "unreachable", reason=f"supervisor: no heartbeat for {silent:.1f} s")
                    if m.local and sup.restart_unresponsive:
                        self._kill(m, f"no heartbeat for {silent:.1f}s")

    # ---- processes ------------------------------------------------------------------------------
    def _command(self, spec: ActorSpec) -> list[str]:
        return [self._python, "-m", "t1_actors.cli", spec.role, "--config", str(self._config_path),
                "--name", spec.name]

    def _child_env(self) -> dict[str, str]:
        env = dict(self._env)
        env[RUN_KEY_ENV] = self._key.decode()
        env[SUPERVISOR_PID_ENV] = str(os.getpid())
        return env

    async def _keep_alive(self, m: _Managed) -> None:
        sup = self.config.supervisor
        first = True
        while not self._stopping:
            # Wait for this start's first heartbeat anew; waiters on the old event wake and look again.
            stale, m.ready = m.ready, trio.Event()
            stale.set()
            m.last_heartbeat, m.kill_reason, m.silent_reported = None, None, False
            m.started_at = time.monotonic()
            m.process = await trio.lowlevel.open_process(self._command(m.spec), env=self._child_env(),
                                                         start_new_session=True, stdin=subprocess.DEVNULL)
            m.state = "running"
            state = "started" if first else "restarted"
            first = False
            self.logger.info(f"actor_{state}", peer=m.spec.name, pid=m.process.pid)
            # "process spawned": the actor logs its own start ("serving"); two facts, two contents
            await self._event(m, state, reason="process spawned" if state == "started" else "", pid=m.process.pid)
            code = await m.process.wait()
            if self._stopping:
                break
            reason = m.kill_reason or _describe_exit(code)
            self.logger.error("actor_died", peer=m.spec.name, reason=reason, pid=m.process.pid)
            await self._event(m, "died", reason=reason, pid=m.process.pid)
            now = time.monotonic()
            while m.restarts and now - m.restarts[0] > sup.restart_window_s:
                m.restarts.popleft()
            if len(m.restarts) >= sup.restart_limit:
                m.state = "gave_up"
                detail = f"{len(m.restarts)} restarts within {sup.restart_window_s:g}s; last: {reason}"
                self.logger.error("actor_gave_up", peer=m.spec.name, reason=detail)
                await self._event(m, "gave_up", reason=detail)
                m.ready.set()  # wake readiness waiters; _wait_all_ready checks the state
                return
            m.state = "restarting"
            backoff = min(sup.restart_backoff_max_s, sup.restart_backoff_s * 2 ** len(m.restarts))
            m.restarts.append(now)
            self.logger.info("actor_restart_scheduled", peer=m.spec.name, backoff_s=backoff,
                             restarts=len(m.restarts))
            await trio.sleep(backoff)
        m.state = "stopped"

    def _kill(self, m: _Managed, reason: str) -> None:
        if m.process is not None and m.process.returncode is None:
            m.kill_reason = reason
            m.process.kill()

    async def _wait_all_ready(self) -> None:
        timeout = self.config.supervisor.ready_timeout_s
        for name, m in self.actors.items():
            if not m.local:
                continue
            with trio.move_on_after(timeout) as scope:
                await self._await_ready(m)
            if m.state == "gave_up":
                raise SupervisorError(f"actor {name!r} was given up on before it became ready "
                                      "(see its actor_died log lines)")
            if scope.cancelled_caught:
                raise SupervisorError(f"actor {name!r} sent no heartbeat within {timeout:g}s")

    async def _stop_all(self, peers: Peers, reason: str) -> None:
        """Shutdown message to each live actor, then SIGTERM, then SIGKILL, each after the grace period."""
        self._stopping = True
        grace = self.config.supervisor.shutdown_grace_s
        live = [(m, m.process) for m in self.actors.values()
                if m.local and m.process is not None and m.process.returncode is None]
        processes = [process for _, process in live]
        self.logger.info("stopping_actors", reason=reason, actors=[m.spec.name for m, _ in live])

        async def ask(m: _Managed, process: trio.Process) -> None:
            # An actor that exits meanwhile (SIGTERM from elsewhere too: a Slurm step cancelled) answers no more:
            # its call is abandoned then, not waited out to the deadline.
            async with trio.open_nursery() as call:
                async def exited() -> None:
                    await process.wait()
                    call.cancel_scope.cancel()

                call.start_soon(exited)
                try:
                    await peers.call(m.spec.name, Shutdown(reason=reason), self.config.transport.control_deadline_s)
                except (DeadlineExceeded, RemoteError) as exc:
                    self.logger.warning("shutdown_unanswered", peer=m.spec.name, error=str(exc))
                call.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for m, process in live:
                nursery.start_soon(ask, m, process)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if await self._all_exited(processes, grace):
                break
            for m, process in live:
                if process.returncode is None:
                    self.logger.warning("actor_signalled", peer=m.spec.name, signal=sig.name)
                    process.send_signal(sig)
        await self._all_exited(processes, grace)
        for m, process in live:
            await self._event(m, "stopped", reason=reason, pid=process.pid)

    async def _all_exited(self, processes: list[trio.Process], within_s: float) -> bool:
        with trio.move_on_after(within_s):
            for process in processes:
                await process.wait()
            return True
        return False

    async def _kill_leftovers(self) -> None:
        for m in self.actors.values():
            if m.process is not None and m.process.returncode is None:
                self.logger.warning("actor_killed_on_exit", peer=m.spec.name, pid=m.process.pid)
                m.process.kill()
                await m.process.wait()

    async def _signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                self.logger.info("signal", signal=name)
                self.request_stop(f"supervisor got {name}")

    async def _event(self, m: _Managed, state: str, *, reason: str = "", pid: int = 0) -> None:
        if self._writer is None:
            return
        try:
            await self._writer.aappend(ActorLifecycle(actor=m.spec.name, role=m.spec.role, state=state,
                                                      reason=reason, pid=pid))
            await self._writer.acommit()
        except Exception as exc:
            self.logger.error("lifecycle_log_failed", peer=m.spec.name, error=repr(exc))


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
