"""The event log across real processes: kill -9 of a writer at random instants, several writer
processes with a tailing reader, one live writer per segment."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time

import pytest
from storage_helpers import EXPERTS, LAYERS, TINY_CHUNKS, K, mixed_event

from storage import EventLog, WriterBusy

ROUTING = dict(routing_shape=(LAYERS, K), num_experts=EXPERTS)
FORK = multiprocessing.get_context("fork")  # a forked child starts in milliseconds, so 50 kills stay cheap


def append_forever(location: str, writer_id: str, seed: int) -> None:
    """Child: append deterministic events, committing every 1-3, until killed."""
    rng = random.Random(seed)
    log = EventLog.open(location, config=TINY_CHUNKS)
    writer = log.writer(writer_id, **ROUTING)
    while True:
        for _ in range(rng.randint(1, 3)):
            writer.append(mixed_event(writer.next_seq, writer_id))
        writer.commit()


def append_n(location: str, writer_id: str, count: int, seed: int) -> None:
    rng = random.Random(seed)
    log = EventLog.open(location, config=TINY_CHUNKS)
    with log.writer(writer_id, **ROUTING) as writer:
        while writer.next_seq < count:
            writer.append(mixed_event(writer.next_seq, writer_id))
            if rng.random() < 0.4:
                writer.commit()
                time.sleep(rng.random() * 0.004)


def test_kill_9_at_random_points_loses_only_the_uncommitted_tail(tmp_path):
    location = str(tmp_path / "log")
    EventLog.open(location, create=True, config=TINY_CHUNKS)
    rng = random.Random(1234)
    reader = EventLog.open(location, config=TINY_CHUNKS)
    cursor = reader.cursor()
    committed = 0
    for round_ in range(50):
        child = FORK.Process(target=append_forever, args=(location, "w", round_), daemon=True)
        child.start()
        time.sleep(rng.uniform(0.0, 0.3))  # lands in open/recovery, appends, chunk writes or commits
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
        fresh = cursor.poll()
        assert [eid for eid, _ in fresh] == [f"w:{i}" for i in range(committed, committed + len(fresh))]
        for event_id, event in fresh:  # whole, bit-exact events only
            assert event == mixed_event(int(event_id.split(":")[1]), "w"), event_id
        committed += len(fresh)
        assert sum(EventLog.open(location).counts().values()) == committed  # a fresh reader agrees
    assert committed > 25, "the writer hardly ever got to commit; the kill window is too short"
    log = EventLog.open(location, config=TINY_CHUNKS)
    log.verify()
    assert [e for _, e in log.events()] == [mixed_event(i, "w") for i in range(committed)]
    with log.writer("w", **ROUTING) as writer:  # the writer reopens by itself and continues
        assert writer.append(mixed_event(committed, "w")) == f"w:{committed}"
    assert log.get(f"w:{committed}") == mixed_event(committed, "w")
    log.verify()


def test_writers_in_several_processes_and_a_tailing_reader_lose_and_duplicate_nothing(tmp_path):
    location = str(tmp_path / "log")
    log = EventLog.open(location, create=True, config=TINY_CHUNKS)
    writers = {f"sampler-{i}": 60 for i in range(3)}
    children = [FORK.Process(target=append_n, args=(location, w, n, i), daemon=True)
                for i, (w, n) in enumerate(writers.items())]
    for child in children:
        child.start()
    seen: list[str] = []
    cursor = log.cursor()
    deadline = time.monotonic() + 120
    restarted = False
    while len(seen) < sum(writers.values()) and time.monotonic() < deadline:
        batch = cursor.poll(max_events=25)
        for event_id, event in batch:
            writer, seq = event_id.rsplit(":", 1)
            assert event == mixed_event(int(seq), writer), event_id
        seen.extend(eid for eid, _ in batch)
        if not restarted and len(seen) > 40:  # a consumer restart halfway: resume from the saved position
            cursor = EventLog.open(location, config=TINY_CHUNKS).cursor(json.loads(json.dumps(cursor.position)))
            restarted = True
        if not batch:
            time.sleep(0.005)
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    assert restarted
    assert cursor.poll() == []
    assert len(seen) == len(set(seen)) == sum(writers.values())
    for writer, count in writers.items():
        mine = [int(eid.rsplit(":", 1)[1]) for eid in seen if eid.startswith(writer + ":")]
        assert mine == list(range(count)), f"{writer}: per-writer order broken or events missing"
    log.verify()


def test_one_live_writer_per_segment_across_processes(tmp_path):
    location = str(tmp_path / "log")
    log = EventLog.open(location, create=True, config=TINY_CHUNKS)
    child = FORK.Process(target=append_forever, args=(location, "w", 0), daemon=True)
    child.start()
    deadline = time.monotonic() + 30
    while log.counts().get("sampler_turn", 0) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # wait until the child holds the segment
    with pytest.raises(WriterBusy, match="held by another live process"):
        log.writer("w", **ROUTING)
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    with log.writer("w", **ROUTING) as writer:  # the kernel freed the dead writer's lock
        assert writer.next_seq == sum(log.counts().values())
