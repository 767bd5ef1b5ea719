"""A sampler process SIGKILLed mid-turn: the turn in flight is answered by the restarted sampler (and only that turn
is sampled again), and a sampler that stays away ends the wait after ``sampler_restart_wait_s``."""

from __future__ import annotations

import multiprocessing
import os
import signal

import numpy as np
import pytest
import trio
from fixtures.models import NARROW

pytest.importorskip("t1_actors.runtime.host")

from _trio import trio_test

from schemas import GenerateReply, GenerateRequest, SamplerTurn
from storage import EventLog
from t1_actors.runtime.errors import PeerGone
from t1_actors.runtime.host import run_actor_process
from t1_actors.runtime.peers import connect
from t1_actors.runtime.reachability import PeerWatch, ping_call, while_reachable
from t1_actors.sampler import SamplerActor

LONG = 1500  # new tokens: a turn long enough to be in flight when the kill lands


def _config(actor_config):
    return actor_config({"name": "sampler-0", "role": "sampler", "actor_class": "t1_actors.sampler:SamplerActor",
                         "options": {"seed": 3}}, run_id="restart-test", model=NARROW, sampler={"batch_window_s": 0.001})


def _start(config) -> multiprocessing.Process:
    process = multiprocessing.get_context("spawn").Process(target=run_actor_process,
                                                           args=(SamplerActor, config, "sampler-0"), daemon=True)
    process.start()
    return process


def _kill(process: multiprocessing.Process) -> None:
    assert process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)


def _request(trial: str, n: int) -> GenerateRequest:
    return GenerateRequest(trial_id=trial, turn=0, input_ids=np.arange(1, 9, dtype=np.int32), max_new_tokens=n,
                           temperature=1.0, top_p=1.0, seed=5)


def _turns(config, trial_id: str) -> list[SamplerTurn]:
    log = EventLog.open(config.run.dir / "log")
    return [e for _, e in log.by_trial(trial_id) if isinstance(e, SamplerTurn)]


@trio_test
async def test_a_sampler_killed_mid_turn_answers_the_turn_in_flight_once_restarted(actor_config):
    config = _config(actor_config)
    first = _start(config)
    second = None
    try:
        async with connect(config, "test") as peers:
            sampler = peers("sampler")
            with trio.fail_after(120):  # the first process is up and serving
                warm = await sampler.call(_request("warm", 4), deadline_s=120)
            assert isinstance(warm, GenerateReply)
            first_start = _turns(config, "warm")[0].engine_start_id
            replies: list[GenerateReply] = []
            with trio.fail_after(240):
                async with trio.open_nursery() as nursery:
                    async def in_flight() -> None:
                        replies.append(await sampler.call_bulk(_request("long", LONG)))

                    nursery.start_soon(in_flight)
                    await trio.sleep(0.3)
                    assert not replies and not _turns(config, "long"), "the turn was not in flight at the kill"
                    _kill(first)  # SIGKILL: nothing of the turn reaches the log or the caller
                    second = _start(config)  # what the supervisor does
        [reply] = replies
        assert reply.finish_reason == "length" and len(reply.output_ids) == LONG
        [turn] = _turns(config, "long")  # sampled once, by the restarted sampler
        assert turn.engine_start_id != first_start and np.array_equal(turn.sampled_ids, reply.output_ids)
    finally:
        for process in (first, second):
            if process is not None and process.is_alive():
                _kill(process)


@pytest.mark.alone  # times pings at 0.2 s: beside another test's campaign a busy sampler missed them for 1 s (CI)
@trio_test
async def test_a_turn_waits_for_a_slow_sampler_but_not_for_one_that_stays_away(actor_config):
    config = _config(actor_config)
    process = _start(config)
    lifecycle: list = []

    async def log(event) -> None:
        lifecycle.append(event)

    try:
        async with connect(config, "test") as peers:
            sampler = peers("sampler")
            with trio.fail_after(120):
                await sampler.call(_request("warm", 4), deadline_s=120)
            watch = PeerWatch("test", {"sampler-0": "sampler"}, ping_call(peers), log, interval_s=0.2, timeout_s=0.6)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch.run)
                started = trio.current_time()
                reply = await while_reachable(watch, "sampler-0", "generate", 0.5,
                                              lambda: sampler.call_bulk(_request("slow", LONG)), poll_s=0.05)
                assert len(reply.output_ids) == LONG and trio.current_time() - started > 0.5  # slower than the wait
                _kill(process)
                with trio.fail_after(30), pytest.raises(PeerGone, match="sampler-0"):
                    await while_reachable(watch, "sampler-0", "generate", 0.5,
                                          lambda: sampler.call_bulk(_request("lost", 4)), poll_s=0.05)
                nursery.cancel_scope.cancel()
        assert [e.state for e in lifecycle] == ["unreachable"]
    finally:
        if process.is_alive():
            _kill(process)
