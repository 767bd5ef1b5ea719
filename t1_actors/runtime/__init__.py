"""The actor runtime: one OS process and one trio loop per actor, pynng sockets, MAC-sealed msgpack (auth.py).

Writing an actor (``t1_actors/<role>.py``)::

    from pydantic import BaseModel, ConfigDict
    from schemas.messages import GenerateRequest, GenerateReply, PolicyUpdate
    from t1_actors.runtime import Actor, handles, DeadlineExceeded

    class SamplerActor(Actor):
        role = "sampler"

        class Options(BaseModel):                       # validates [[actors]] options = {...}; optional
            model_config = ConfigDict(extra="forbid")
            backend: str = "torch"

        async def setup(self):                          # before any request is served
            cfg = self.config.section(SamplerConfig)    # this actor's section, typed (RuntimeConfig.section)
            ...

        @handles(GenerateRequest, graceful_cancel=True)  # runs in its own task; several at once
        async def generate(self, req: GenerateRequest) -> GenerateReply:
            ...                                         # poll self.cancel_requested(req.trial_id) to stop early
            await self.log(SamplerTurn(...))            # append + commit to this actor's log segment
            return GenerateReply(...)

        @handles(PolicyUpdate)
        async def load(self, msg: PolicyUpdate) -> None:  # None replies Ack
            ...

        async def run(self):                            # optional background work for the actor's life
            ...

        async def teardown(self): ...                   # after serving stops (the log is committed after it)
        def status(self) -> dict[str, float]: ...       # numbers sent with every heartbeat

In an actor: ``self.name``, ``self.config`` (the validated run config), ``self.options``,
``self.logger`` (structlog, bound with actor/role/run_id; trial_id and policy_version are bound in
handlers), ``self.ctx.run_id``, ``self.ctx.run_dir``, ``await self.log(event, commit=True)``,
``await self.commit()``, ``self.cancel_requested(trial_id)``, ``self.request_shutdown(reason)``, and
peers by role or instance name::

    reply = await self.peer("sampler").call(req, deadline_s=5)     # control: DeadlineExceeded on a miss
    reply = await self.peer("sampler").call(req, to="sampler-1")   # one instance; default: round-robin
    name = self.peer("sampler").pick(trial_id)                     # stable instance per trial
    reply = await self.peer("learner").call_bulk(req)              # request/reply without deadline
    await self.peer("learner").push(trajectory)                    # bulk push to the peer's handler
    replies = await self.peer("sampler").broadcast(PolicyUpdate(...))  # name -> reply or exception

A call raises ``DeadlineExceeded`` (peer, op, deadline), ``RemoteError`` (the peer's handler raised or
refused: ``error``, ``detail``), ``RequestCancelled`` (a Cancel stopped it) or ``NoSuchPeer``.

Built in for every actor: ``Ping`` -> ``Pong``; ``Generic(op="runtime.stats")`` -> frames rejected by
reason; ``Shutdown`` -> Ack and a clean stop; ``Cancel(trial_id)`` cancels the handlers serving that
trial (``'*'``: all) and refuses later requests for it, then calls the actor's own ``@handles(Cancel)``
if it has one (e.g. to tear a sandbox down). Heartbeats go to the
supervisor every ``[transport] heartbeat_interval_s``.

Running: ``t1-actor <role> --config run.toml [--name NAME]`` (one actor), ``t1-actor launch --config
run.toml`` (every local actor under a supervisor). Inside a trio program (the campaign)::

    async with trio.open_nursery() as nursery:
        supervisor = Supervisor(config)
        await nursery.start(supervisor.run)             # started: every local actor sent its first heartbeat
        async with connect(config, "campaign") as peers:
            await peers("staleness").call(...)
        await supervisor.shutdown()                     # Shutdown, then SIGTERM, then SIGKILL

    await nursery.start(serve_actor, EchoActor, config, "echo-0")   # an actor in this very process (tests)
"""

from t1_actors.runtime.actor import Actor, ActorContext, handles, on_event
from t1_actors.runtime.errors import (
    AuthError,
    DeadlineExceeded,
    NoSuchPeer,
    RemoteError,
    RequestCancelled,
    RuntimeFault,
)
from t1_actors.runtime.host import ActorHost, run_actor_process, serve_actor
from t1_actors.runtime.logs import configure_logging
from t1_actors.runtime.peers import PeerGroup, Peers, connect
from t1_actors.runtime.roles import actor_class, resolve_role

__all__ = [
    "Actor", "ActorContext", "handles", "on_event",
    "AuthError", "DeadlineExceeded", "NoSuchPeer", "RemoteError", "RequestCancelled", "RuntimeFault",
    "ActorHost", "run_actor_process", "serve_actor", "configure_logging",
    "PeerGroup", "Peers", "connect", "actor_class", "resolve_role",
]
