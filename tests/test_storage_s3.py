"""The event log on a real S3-API server (moto's server mode, loopback): one writer per segment without
``flock`` (a lease by conditional put), a killed writer's segment reopening after its lease, a stalled
writer fenced off, kill -9 losing only the uncommitted tail, and clear errors naming the URL. The log API's
own round trips run on S3 too (test_storage_log.py, the ``s3`` parameter)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from fixtures.s3_appender import ROUTING, SHORT_LEASE
from storage_helpers import TINY_CHUNKS, mixed_event

from storage import EventLog, LogError, WriterBusy

TESTS = os.path.dirname(os.path.abspath(__file__))


def spawn_appender(url: str, seed: int) -> subprocess.Popen:
    """A fresh interpreter appending until killed (a forked child would inherit the parent's S3 client)."""
    code = f"from fixtures.s3_appender import append_forever; append_forever({url!r}, 'w', {seed})"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL)


def test_a_second_live_writer_is_refused_naming_the_holder(s3_url):
    log = EventLog.open(s3_url, create=True, config=TINY_CHUNKS)
    other = EventLog.open(s3_url, config=TINY_CHUNKS)  # another client: the in-process registry cannot see it
    with log.writer("w", **ROUTING) as writer:
        writer.append(mixed_event(0))
        writer.commit()
        with pytest.raises(WriterBusy, match="lease expires"):
            other.writer("w", **ROUTING)
    with other.writer("w", **ROUTING) as writer:  # released on close: free at once
        assert writer.append(mixed_event(1)) == "w:1"
    assert [e for _, e in EventLog.open(s3_url).events()] == [mixed_event(0), mixed_event(1)]


def test_a_stalled_writer_whose_lease_was_taken_over_cannot_commit(s3_url):
    log = EventLog.open(s3_url, create=True, config=SHORT_LEASE)
    stalled = log.writer("w", **ROUTING)
    stalled.append(mixed_event(0))
    stalled.commit()
    stalled.append(mixed_event(1, "late"))
    time.sleep(1.3)  # past its lease: as if the process had been paused (SIGSTOP, a long GC, a swap storm)
    with EventLog.open(s3_url, config=SHORT_LEASE).writer("w", **ROUTING) as successor:
        assert successor.append(mixed_event(1)) == "w:1"
        successor.commit()
        with pytest.raises(WriterBusy, match="taken over"):
            stalled.commit()
    assert [e for _, e in EventLog.open(s3_url).events()] == [mixed_event(0), mixed_event(1)]


def test_kill_9_loses_only_the_uncommitted_tail_and_the_segment_reopens_after_the_lease(s3_url):
    EventLog.open(s3_url, create=True, config=SHORT_LEASE)
    reader = EventLog.open(s3_url, config=SHORT_LEASE)
    cursor = reader.cursor()
    rng = random.Random(7)
    committed = 0
    for round_ in range(6):
        child = spawn_appender(s3_url, round_)
        deadline = time.monotonic() + 60
        while sum(reader.counts().values()) <= committed and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.1)  # until the child has committed something this round
        time.sleep(rng.uniform(0.0, 0.6))  # then anywhere in appends, chunk writes, lease renewals, commits
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
        if round_ == 0:  # its lease outlives it (1 s here): nobody else may write the segment meanwhile
            with pytest.raises(WriterBusy, match="lease expires"):
                reader.writer("w", **ROUTING)
        fresh = cursor.poll()
        assert [eid for eid, _ in fresh] == [f"w:{i}" for i in range(committed, committed + len(fresh))]
        for event_id, event in fresh:  # whole, bit-exact events only
            assert event == mixed_event(int(event_id.split(":")[1]), "w"), event_id
        committed += len(fresh)
    assert committed > 6
    log = EventLog.open(s3_url, config=SHORT_LEASE)
    log.verify()
    assert [e for _, e in log.events()] == [mixed_event(i, "w") for i in range(committed)]
    time.sleep(1.1)
    with log.writer("w", **ROUTING) as writer:  # then the segment reopens by itself and continues
        assert writer.append(mixed_event(committed, "w")) == f"w:{committed}"


def test_a_missing_bucket_and_an_unreachable_endpoint_are_named(s3_endpoint):
    with pytest.raises(LogError, match=r"s3://no-such-bucket-t1/x.*does not exist"):
        EventLog.open("s3://no-such-bucket-t1/x", create=True)
    code = ("from storage import EventLog\n"
            "try:\n    EventLog.open('s3://t1-tests/y', create=True)\nexcept Exception as e:\n    print(e)\n")
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1",
           "AWS_RETRY_MODE": "standard"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "s3://t1-tests/y" in out and "cannot reach" in out and "127.0.0.1:9" in out, out
