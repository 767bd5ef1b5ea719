"""``t1-actor launch --join``: the supervisor of a host that joins a run whose job runs on another host.

One host runs the job and its supervisor (the heartbeat address every actor reports to); each other host runs a
``JoinedSupervisor``, which:

- waits, up to ``[supervisor] join_timeout_s``, until the job's supervisor answers a ping at ``[supervisor]
  address`` (``wait_for_supervisor``): the job builds its corpus, tokenizer and SFT policy first, and its
  supervisor writes ``RUN/config.resolved.json`` (the config its actors run with) before it serves;
- starts this host's actors from that file, one process each, and restarts a dead one exactly as the job's
  supervisor does (backoff, ``restart_limit`` in ``restart_window_s``, ``gave_up``), each start, death and
  restart an ``ActorLifecycle`` event in its own log segment, ``supervisor-<host>``;
- knows its actors are alive by pinging them every heartbeat interval (their heartbeats go to the job's
  supervisor, which watches them as remote actors): no answer for ``heartbeat_timeout_s`` is ``unreachable``,
  and with ``restart_unresponsive`` a kill and a restart;
- on SIGTERM or SIGINT (a Slurm step's end, ``scancel``) stops them as the job's supervisor stops its own:
  ``Shutdown``, then SIGTERM after ``shutdown_grace_s``, then SIGKILL. Its actors also stop by themselves when
  it is gone (they watch its pid).
"""

from __future__ import annotations

import re
from pathlib import Path

import structlog
import trio

from schemas.messages import Ping, Pong
from t1_actors.runtime.auth import Opener, Sealer
from t1_actors.runtime.config import RuntimeConfig
from t1_actors.runtime.errors import DeadlineExceeded, RemoteError
from t1_actors.runtime.peers import Peers
from t1_actors.runtime.supervisor import Supervisor, SupervisorError, _Managed


class JoinedSupervisor(Supervisor):
    """The supervisor of host ``host``'s actors in a run supervised from another host (module docstring)."""

    def __init__(self, config: RuntimeConfig, config_path: Path, *, host: str, **kwargs: object) -> None:
        super().__init__(config, hosts={host}, **kwargs)  # type: ignore[arg-type]
        self.host = host
        self.name = "supervisor-" + re.sub(r"[^A-Za-z0-9_.-]", "_", host)
        self._given_config = config_path
        if not any(m.local for m in self.actors.values()):
            raise SupervisorError(f"no actor of {config_path} runs on host {host!r}")

    def _actor_config(self) -> Path:
        return self._given_config  # the job's supervisor wrote it; rewriting it here would race its readers

    async def _listen(self, nursery: trio.Nursery, peers: Peers) -> None:
        nursery.start_soon(self._probe, peers)  # the heartbeat address is the job's supervisor's, not this one's

    async def _probe(self, peers: Peers) -> None:
        interval = self.config.transport.heartbeat_interval_s

        async def ping(m: _Managed) -> None:
            try:
                reply = await peers.control(m.spec.name).call(Ping(), interval)
            except (DeadlineExceeded, RemoteError):
                return
            if isinstance(reply, Pong) and self._heard(m, m.status):
                await self._event(m, "reachable", reason=f"{self.name}: answers pings again")

        while True:
            async with trio.open_nursery() as nursery:
                for m in self.actors.values():
                    if m.local and m.state == "running" and m.process is not None and m.process.returncode is None:
                        nursery.start_soon(ping, m)
            await trio.sleep(interval)


async def wait_for_supervisor(config: RuntimeConfig, key: bytes, timeout_s: float) -> float:
    """Wait until the supervisor at ``[supervisor] address`` answers a ping (sealed with ``key``); the seconds
    waited. ``SupervisorError`` after ``timeout_s``."""
    started = trio.current_time()
    peers = Peers(config, "join", Sealer(key), Opener(key, config.transport.max_message_age_s),
                  structlog.get_logger().bind(actor="join"))
    interval = config.transport.heartbeat_interval_s
    try:
        with trio.move_on_after(timeout_s):
            while True:
                try:
                    if isinstance(await peers.control("supervisor").call(Ping(), max(interval, 1.0)), Pong):
                        return trio.current_time() - started
                except (DeadlineExceeded, RemoteError):
                    pass
                await trio.sleep(interval)
    finally:
        peers.close()
    raise SupervisorError(f"the supervisor at {config.supervisor_address} did not answer within {timeout_s:g} s "
                          "([supervisor] join_timeout_s); is the job's host up?")
