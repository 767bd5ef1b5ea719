"""Control plane and bulk over real pynng sockets, with the actors served in the test's own trio loop."""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
import trio
from _trio import trio_test
from plugin_actors import EchoActor, GracefulActor

from schemas.messages import Cancel, GenerateReply, GenerateRequest, Generic, Ping, Pong, Shutdown
from t1_actors.job.config import parse_config
from t1_actors.runtime import DeadlineExceeded, NoSuchPeer, RemoteError, RequestCancelled, connect, serve_actor

KEY = "test-key-0123456789abcdef"



@pytest.fixture
def run_dir():
    path = Path(tempfile.mkdtemp(prefix="t1rt-"))  # short: unix socket paths are limited to 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_config(run_dir, *actors, **sections):
    specs = [{"name": name, "role": role, "actor_class": f"plugin_actors:{cls.__name__}"}
             for name, role, cls in actors]
    return parse_config({"run": {"id": "rt", "dir": str(run_dir), "hmac_key": KEY},
                         "transport": {"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 1.0},
                         "actors": specs, **sections})


@asynccontextmanager
async def actors_running(config, classes):
    async with trio.open_nursery() as nursery:
        for spec in config.actors:
            await nursery.start(serve_actor, classes[spec.role], config, spec.name)
        async with connect(config, "tester") as peers:
            yield peers
        nursery.cancel_scope.cancel()


def gen_request(trial_id: str) -> GenerateRequest:
    return GenerateRequest(trial_id=trial_id, turn=0, input_ids=np.arange(4, dtype=np.int32), max_new_tokens=8,
                           temperature=1.0, top_p=1.0)


CLASSES = {"echo": EchoActor, "graceful": GracefulActor}


@trio_test
async def test_call_ping_and_errors(run_dir):
    config = make_config(run_dir, ("echo-0", "echo", EchoActor))
    async with actors_running(config, CLASSES) as peers:
        assert await peers("echo").call(Ping(payload=b"x")) == Pong(actor="echo-0", payload=b"x")
        reply = await peers("echo-0").call(Generic(op="echo", args={"n": [1, 2]}))
        assert reply.args == {"n": [1, 2]}
        with pytest.raises(RemoteError) as err:
            await peers("echo").call(Generic(op="fail"))
        assert (err.value.peer, err.value.error, err.value.detail) == ("echo-0", "ValueError", "asked to fail")
        with pytest.raises(RemoteError, match="does not handle 'verify_request'"):
            from schemas.messages import VerifyRequest
            await peers("echo").call(VerifyRequest(trial_id="t", task_id="x"))
        with pytest.raises(NoSuchPeer, match="roles: echo"):
            peers("sampler")


@trio_test
async def test_deadline_fires_and_is_handled(run_dir):
    config = make_config(run_dir, ("echo-0", "echo", EchoActor))
    async with actors_running(config, CLASSES) as peers:
        with pytest.raises(DeadlineExceeded) as err:
            await peers("echo").call(Generic(op="sleep", args={"s": 30}), deadline_s=0.2)
        assert (err.value.peer, err.value.op, err.value.deadline_s) == ("echo-0", "generic", 0.2)
        # the caller handled it and the actor is still fine
        assert isinstance(await peers("echo").call(Ping()), Pong)


@trio_test
async def test_a_call_after_an_abandoned_one_waits_without_spinning(run_dir, monkeypatch):
    """A reply that comes after its call's deadline leaves nng's receive fd raised on that socket: the
    next call on it would wake over and over with nothing to read, a busy loop for as long as the call
    takes (~10k wake-ups in 300 ms, measured). The abandoned socket is renewed instead."""
    from t1_actors.runtime import nngraw

    receive_times: list[float] = []
    real = nngraw._try_recv_body

    def counted(sock, msg_p):
        receive_times.append(time.perf_counter())
        return real(sock, msg_p)

    monkeypatch.setattr(nngraw, "_try_recv_body", counted)
    config = make_config(run_dir, ("echo-0", "echo", EchoActor))
    async with actors_running(config, CLASSES) as peers:
        for _ in range(3):
            with pytest.raises(DeadlineExceeded):
                await peers("echo").call(Generic(op="sleep", args={"s": 0.2}), deadline_s=0.02)
            await trio.sleep(0.4)  # the late reply arrives
            settled = time.perf_counter() + 0.1  # a new connection may wake its waiter a few times at first
            reply = await peers("echo").call(Generic(op="sleep", args={"s": 0.4}), deadline_s=5)
            assert reply.op == "slept"
            later = sum(t > settled for t in receive_times)
            assert later <= 2, f"{later} receive attempts in the last 0.3 s of one call: a busy loop on a raised fd"
            receive_times.clear()


@trio_test
async def test_deadline_when_nobody_listens(run_dir):
    config = make_config(run_dir, ("echo-0", "echo", EchoActor))
    async with connect(config, "tester") as peers:
        with pytest.raises(DeadlineExceeded, match="'echo-0'"):
            await peers("echo").call(Ping(), deadline_s=0.2)


@trio_test
async def test_slow_handlers_do_not_block_the_control_plane(run_dir):
    config = make_config(run_dir, ("echo-0", "echo", EchoActor))
    async with actors_running(config, CLASSES) as peers:
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(lambda: peers("echo").call_bulk(Generic(op="sleep", args={"s": 1.0})))
            await trio.sleep(0.1)
            with trio.fail_after(0.9):  # answered while 20 slow requests are in flight
                for _ in range(5):
                    assert isinstance(await peers("echo").call(Ping(), deadline_s=0.9), Pong)
            stats = await peers("echo").call(Generic(op="runtime.stats"))
            assert stats.args["in_flight"] >= 20  # all 20 slow requests are being served at once ...
        # ... and every slow call got its reply
        reply = await peers("echo").call(Generic(op="sleep", args={"s": 0}))
        assert reply.op == "slept"


@trio_test
async def test_cancel_reaches_the_trial_handler(run_dir):
    config = make_config(run_dir, ("echo-0", "echo", EchoActor))
    async with actors_running(config, CLASSES) as peers:
        outcome = {}

        async def generate():
            try:
                await peers("echo").call(gen_request("trial-1"), deadline_s=20)
            except RequestCancelled as exc:
                outcome["cancelled"] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate)
            while (await peers("echo").call(Generic(op="runtime.stats"))).args["in_flight"] < 1:
                await trio.sleep(0.01)
            ack = await peers("echo").call(Cancel(trial_id="trial-1", reason="batch full"))
            assert ack.detail == "cancelled 1"
        assert outcome["cancelled"].detail == "batch full"
        stored = await peers("echo").call(Generic(op="stored"))
        assert stored.args["cancelled"] == ["trial-1"]  # the actor's own Cancel handler ran too
        # a late request for a cancelled trial is refused at once
        with pytest.raises(RequestCancelled):
            await peers("echo").call(gen_request("trial-1"), deadline_s=5)


@trio_test
async def test_graceful_cancel_returns_partial_result(run_dir):
    config = make_config(run_dir, ("g-0", "graceful", GracefulActor))
    async with actors_running(config, CLASSES) as peers:
        replies = []

        async def generate():
            replies.append(await peers("graceful").call(gen_request("trial-2"), deadline_s=20))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate)
            await trio.sleep(0.2)
            await peers("graceful").call(Cancel(trial_id="trial-2"))
        reply = replies[0]
        assert isinstance(reply, GenerateReply)
        assert reply.finish_reason == "cancelled" and 0 < len(reply.output_ids) < 1000


@trio_test
async def test_round_robin_pick_and_broadcast(run_dir):
    config = make_config(run_dir, ("echo-0", "echo", EchoActor), ("echo-1", "echo", EchoActor))
    async with actors_running(config, CLASSES) as peers:
        seen = [(await peers("echo").call(Ping())).actor for _ in range(4)]
        assert sorted(seen) == ["echo-0", "echo-0", "echo-1", "echo-1"]
        group = peers("echo")
        assert group.pick("trial-x") == group.pick("trial-x")
        assert (await group.call(Ping(), to="echo-1")).actor == "echo-1"
        with pytest.raises(NoSuchPeer):
            await group.call(Ping(), to="echo-7")
        replies = await group.broadcast(Generic(op="echo", args={"v": 1}))
        assert set(replies) == {"echo-0", "echo-1"}
        # actor to actor
        via = await peers("echo-0").call(Generic(op="call_peer", args={"peer": "echo-1"}))
        assert via.args == {"via": "echo-0"}


@trio_test
async def test_bulk_push_arrives_in_order(run_dir):
    config = make_config(run_dir, ("echo-0", "echo", EchoActor))
    async with actors_running(config, CLASSES) as peers:
        blob = "x" * (3 << 20)  # bigger than nng's default 1 MiB receive limit
        for i in range(20):
            await peers("echo").push(Generic(op="store", args={"i": i, "blob": blob if i == 7 else ""}))
        with trio.fail_after(20):
            while len((await peers("echo").call(Generic(op="stored"))).args["items"]) < 20:
                await trio.sleep(0.02)
        items = (await peers("echo").call(Generic(op="stored"))).args["items"]
        assert [it["i"] for it in items] == list(range(20))
        assert len(items[7]["blob"]) == 3 << 20


@trio_test
async def test_bulk_payloads_arrive_intact_and_forged_bulk_frames_are_dropped(run_dir):
    """Large bytes and arrays are checked and decoded in nng's buffer, which is freed right after:
    what the handler keeps must own its data. Forged and misaddressed frames in between are dropped."""
    import pynng

    from t1_actors.runtime.auth import BULK, Sealer
    from t1_actors.runtime.wire import pack_envelope

    config = make_config(run_dir, ("echo-0", "echo", EchoActor))
    rng = np.random.default_rng(0)
    blobs = [rng.bytes(n) for n in (10, 3 << 20, 100_000)]
    arrays = [rng.integers(0, 1 << 30, size=n, dtype=np.int64) for n in (5, 1 << 19, 7)]
    async with actors_running(config, CLASSES) as peers:
        with pynng.Push0(dial=config.bulk_address(config.actor("echo-0"))) as forger:
            for i, (blob, arr) in enumerate(zip(blobs, arrays)):
                await peers("echo").push(Generic(op="store", args={"i": i, "blob": blob, "arr": arr}))
                good = Sealer(KEY.encode()).seal(BULK, pack_envelope("x", "echo-0", Generic(op="store", args={}),
                                                                      b"f%d" % i))
                forged = bytearray(good)
                forged[-1] ^= 1
                await forger.asend(bytes(forged))
                await forger.asend(Sealer(KEY.encode()).seal(BULK, pack_envelope(
                    "x", "echo-9", Generic(op="store", args={}), b"m%d" % i)))
            with trio.fail_after(20):  # every frame seen (two senders: in no particular order)
                while True:
                    stats = (await peers("echo").call(Generic(op="runtime.stats"))).args
                    items = (await peers("echo").call(Generic(op="stored"))).args["items"]
                    if sum(stats["rejected"].values()) >= 6 and len(items) >= 3:
                        break
                    await trio.sleep(0.02)
    assert [it["i"] for it in items] == [0, 1, 2]
    for item, blob, arr in zip(items, blobs, arrays):
        assert item["blob"] == blob
        np.testing.assert_array_equal(item["arr"], arr)
    assert stats["rejected"].get("bad_mac", 0) == 3 and stats["rejected"].get("misaddressed", 0) == 3


@trio_test
async def test_events_logged_and_shutdown_commits(run_dir):
    import storage

    config = make_config(run_dir, ("echo-0", "echo", EchoActor))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_actor, EchoActor, config, "echo-0")
        async with connect(config, "tester") as peers:
            reply = await peers("echo").call(Generic(op="log", args={"trial": "tr-1"}))
            assert await peers("echo").call(Shutdown(reason="test over")) is not None
        # serve_actor returns by itself after a Shutdown: the nursery closes without a cancel
    log = storage.EventLog.open(run_dir / "log")
    kinds = [(e.kind, getattr(e, "state", None)) for _, e in log.events()]
    assert ("trial_issued", None) in kinds
    assert kinds[0] == ("actor_lifecycle", "started") and kinds[-1] == ("actor_lifecycle", "stopped")
    assert log.get(reply.args["event_id"]).trial_id == "tr-1"
    log.verify()
