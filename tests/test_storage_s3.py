"""The event log on a real S3-API server (moto's server mode, loopback): one writer per segment without
``flock`` (a lease by conditional put), a killed writer's segment reopening (at once on its own machine), a stalled
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


def spawn_appender(url: str, seed: int, lease_s: float = SHORT_LEASE.lease_s) -> subprocess.Popen:
    """A fresh interpreter appending until killed (a forked child would inherit the parent's S3 client)."""
    code = f"from fixtures.s3_appender import append_forever; append_forever({url!r}, 'w', {seed}, {lease_s})"
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


def test_kill_9_loses_only_the_uncommitted_tail_and_the_segment_reopens(s3_url):
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
        fresh = cursor.poll()
        assert [eid for eid, _ in fresh] == [f"w:{i}" for i in range(committed, committed + len(fresh))]
        for event_id, event in fresh:  # whole, bit-exact events only
            assert event == mixed_event(int(event_id.split(":")[1]), "w"), event_id
        committed += len(fresh)
    assert committed > 6
    log = EventLog.open(s3_url, config=SHORT_LEASE)
    log.verify()
    assert [e for _, e in log.events()] == [mixed_event(i, "w") for i in range(committed)]
    with log.writer("w", **ROUTING) as writer:  # then the segment reopens and continues
        assert writer.append(mixed_event(committed, "w")) == f"w:{committed}"


def test_a_writer_killed_on_this_machine_frees_its_segment_at_once_a_stopped_one_does_not(s3_url):
    """A relaunch (or a supervisor's restart) takes over its own dead writers' segments without waiting out a
    60-s lease; a writer that is only stopped (SIGSTOP) still holds it."""
    long_lease = TINY_CHUNKS.model_copy(update={"lease_s": 60.0})
    reader = EventLog.open(s3_url, create=True, config=long_lease)
    child = spawn_appender(s3_url, 0, lease_s=60.0)
    deadline = time.monotonic() + 60
    while not reader.counts() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.1)
    child.send_signal(signal.SIGSTOP)
    with pytest.raises(WriterBusy, match=r"lease expires in \d+ s"):
        reader.writer("w", **ROUTING)
    child.send_signal(signal.SIGKILL)
    assert child.wait(10) == -signal.SIGKILL
    committed = sum(reader.counts().values())
    started = time.monotonic()
    with reader.writer("w", **ROUTING) as writer:
        assert writer.append(mixed_event(committed, "w")) == f"w:{committed}"
        writer.commit()
    assert time.monotonic() - started < 30.0  # the 2-s grace for its last requests, not the 60-s lease
    assert [e for _, e in EventLog.open(s3_url).events()] == [mixed_event(i, "w") for i in range(committed + 1)]


def test_a_lease_holder_is_known_dead_only_from_its_own_machine_and_namespace():
    from storage._lease import _holder_is_dead, _process_identity

    ours = _process_identity(os.getpid())
    assert _holder_is_dead({"pid": os.getpid(), "process": ours}, ours) is False  # alive
    boot, namespace, _, _ = ours.split("/")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_identity = f"{boot}/{namespace}/{gone.pid}/1"
    gone.wait()
    assert _holder_is_dead({"pid": gone.pid, "process": gone_identity}, ours) is True  # no such process
    assert _holder_is_dead({"pid": os.getpid(), "process": f"{boot}/{namespace}/{os.getpid()}/1"}, ours) is True  # reused
    assert _holder_is_dead({"pid": gone.pid, "process": f"other-boot/{namespace}/{gone.pid}/1"}, ours) is False
    assert _holder_is_dead({"pid": gone.pid, "process": f"{boot}/1/{gone.pid}/1"}, ours) is False  # another pid namespace
    assert _holder_is_dead({"pid": gone.pid}, ours) is False  # a lease written before the identity: expiry decides
    zombie = subprocess.Popen(["sleep", "60"])
    identity = _process_identity(zombie.pid)
    os.kill(zombie.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while "Z" not in open(f"/proc/{zombie.pid}/stat").read().rsplit(")", 1)[1].split()[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _holder_is_dead({"pid": zombie.pid, "process": identity}, ours) is True  # killed, not reaped yet
    zombie.wait()


def test_a_missing_bucket_and_an_unreachable_endpoint_are_named(s3_endpoint):
    with pytest.raises(LogError, match=r"s3://no-such-bucket-t1/x.*does not exist"):
        EventLog.open("s3://no-such-bucket-t1/x", create=True)
    code = ("from storage import EventLog\n"
            "try:\n    EventLog.open('s3://t1-tests/y', create=True)\nexcept Exception as e:\n    print(e)\n")
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1",
           "AWS_RETRY_MODE": "standard"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "s3://t1-tests/y" in out and "cannot reach" in out and "127.0.0.1:9" in out, out
