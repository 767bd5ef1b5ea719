"""The control plane's busy-poll (nngraw.py): bounded, deadline-aware, and fair to the other tasks."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pynng
import pytest
import trio

from t1_actors.runtime.nngraw import PolledReq, Spin


@pytest.fixture
def address():
    path = Path(tempfile.mkdtemp(prefix="t1poll-"))
    yield f"ipc://{path}/echo"
    shutil.rmtree(path, ignore_errors=True)


def echo_in_a_thread(address: str) -> tuple[pynng.Rep0, threading.Thread]:
    """A synchronous echo server in its own thread, so that it answers while the trio thread polls."""
    rep = pynng.Rep0(listen=address)

    def serve():
        try:
            while True:
                rep.send(rep.recv())
        except pynng.Closed:
            return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return rep, thread


def run_client(address: str, spin_s: float, client, rep: pynng.Rep0, thread: threading.Thread | None = None) -> None:
    """Run ``client(req)`` under trio with a PolledReq to ``address``; always close both ends."""
    async def main():
        req = PolledReq(address, max_bytes=0, spin_s=spin_s)
        try:
            await client(req)
        finally:
            req.close()

    try:
        trio.run(main)
    finally:
        rep.close()
        if thread is not None:
            thread.join(5)


@pytest.mark.parametrize("spin_s", [0.0, 0.05])
def test_replies_arrive_and_a_sleeping_task_still_wakes(address, spin_s):
    rep, thread = echo_in_a_thread(address)

    async def client(req):
        timer_fired = trio.Event()

        async def timer():  # not runnable while it sleeps: polling may go on, but must let it fire
            await trio.sleep(0.005)
            timer_fired.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(timer)
            for n in range(5000):  # back-to-back calls, each answered within the poll
                assert await req.request(b"ping %d" % n, trio.current_time() + 5) == b"ping %d" % n
                if timer_fired.is_set():
                    break
            # checked here, not after the nursery: leaving it waits for the timer, which then always fires
            assert timer_fired.is_set(), "the other task never ran during 5000 polled calls"

    run_client(address, spin_s, client, rep, thread)


@pytest.mark.parametrize("spin_s", [0.0, 10.0])
def test_a_missed_deadline_returns_none_and_bounds_the_poll(address, spin_s):
    """Nobody answers: the request gives up at its deadline, even with a poll far longer than it."""
    rep = pynng.Rep0(listen=address)  # takes requests, never replies

    async def client(req):
        with trio.fail_after(5):
            assert await req.request(b"hello", trio.current_time() + 0.2) is None
        with trio.move_on_after(0.2) as outer:  # an enclosing deadline bounds it too
            await req.request(b"hello", trio.current_time() + 60)
        assert outer.cancelled_caught

    run_client(address, spin_s, client, rep)


def test_spin_backs_off_while_polls_come_up_empty_and_recovers_on_a_hit():
    spin = Spin(0.001)
    assert spin.budget() == 0.001
    parked_at_once = []
    for _ in range(8):  # every poll comes up empty: the waits that park at once grow 1, 3, 7 ... 63
        spin.record(False)
        skipped = 0
        while spin.budget() == 0.0:
            skipped += 1
        parked_at_once.append(skipped)
    assert parked_at_once == [1, 3, 7, 15, 31, 63, 63, 63]
    spin.record(True)  # a hit: poll again at once, and a later miss starts the back-off afresh
    assert spin.budget() == 0.001
    spin.record(False)
    assert [spin.budget(), spin.budget()] == [0.0, 0.001]
    assert Spin(0.0).budget() == 0.0
