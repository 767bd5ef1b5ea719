"""The event log in one process: round trips, lookups, cursor, bad input, corruption, trio wrappers."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
import trio
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import EXPERTS, LAYERS, TINY_CHUNKS, K, mixed_event, sampler_turn, trajectory

from schemas import Heartbeat, SamplerTurn, TrialIssued
from storage import CorruptionError, EventLog, EventRejected, LogError, LogNotFound, StorageConfig, WriterBusy

ROUTING = dict(routing_shape=(LAYERS, K), num_experts=EXPERTS)


@pytest.fixture(params=["local", "memory", "fsspec", "local-fsync", "s3"])
def log(request, tmp_path) -> EventLog:
    """The same log API on a directory, an in-memory zarr store, an fsspec URL, with fsync on, and on a
    real S3-API server (moto's server mode on a loopback port)."""
    if request.param == "s3":
        return EventLog.open(request.getfixturevalue("s3_url"), create=True, config=TINY_CHUNKS)
    location = {"local": tmp_path / "log", "local-fsync": tmp_path / "log", "memory": zarr.storage.MemoryStore(),
                "fsspec": f"memory://t1-tests/{uuid.uuid4().hex}"}[request.param]
    config = TINY_CHUNKS.model_copy(update={"fsync": request.param == "local-fsync"})
    return EventLog.open(location, create=True, config=config)


def snapshot(location: Path) -> dict[str, bytes]:
    return {str(p.relative_to(location)): p.read_bytes() for p in sorted(location.rglob("*")) if p.is_file()}


def test_round_trip_is_bit_exact_across_commits_and_chunks(log):
    written = {}
    with log.writer("w", **ROUTING) as writer:
        for seq in range(40):
            event = mixed_event(seq)
            written[writer.append(event)] = event
            if seq % 3 == 2:
                writer.commit()
    assert list(written) == [f"w:{i}" for i in range(40)]
    for event_id, event in written.items():
        got = log.get(event_id)
        assert got == event
        for name, array in event.arrays().items():
            assert getattr(got, name).dtype == array.dtype
            assert getattr(got, name).tobytes() == array.tobytes()
    assert [e for _, e in log.events()] == list(written.values())
    assert log.counts() == {"sampler_turn": 10, "trajectory": 10, "sandbox_exec": 10, "trial_issued": 10}
    assert sum(log.verify()["w"].values()) > 10  # many tiny chunks, every one checked


def test_append_times_follow_the_merge_order_of_events(log):
    import time

    before = time.time()
    with log.writer("a", **ROUTING) as a, log.writer("b", **ROUTING) as b:
        for seq in range(6):
            (a if seq % 2 else b).append(mixed_event(seq))
            a.commit()
            b.commit()
    times = log.append_times()
    assert [event_id for event_id, _ in times] == [event_id for event_id, _ in log.events()]
    stamps = [ts for _, ts in times]
    assert stamps == sorted(stamps) and before <= stamps[0] <= stamps[-1] <= time.time()
    kinds = {mixed_event(seq).kind for seq in range(6)}
    one = sorted(kinds)[0]
    assert [i for i, _ in log.append_times(kinds=[one])] == [i for i, _ in log.events(kinds=[one])]


@settings(max_examples=25, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 400), st.booleans()), min_size=1, max_size=25))
def test_any_append_commit_pattern_replays_exactly(plan):
    log = EventLog.open(zarr.storage.MemoryStore(), create=True, config=TINY_CHUNKS)
    expected = []
    writer = log.writer("w", **ROUTING)
    for seq, commit in plan:
        event = mixed_event(seq)
        writer.append(event)
        expected.append(event)
        if commit:
            writer.commit()
            assert [e for _, e in log.events()] == expected  # a live reader sees exactly the commits so far
    writer.close()
    assert [e for _, e in log.events()] == expected
    log.verify()


def test_uncommitted_tail_is_lost_and_writer_resumes(log):
    writer = log.writer("w", **ROUTING)
    for seq in range(5):
        writer.append(mixed_event(seq))
    writer.commit()
    writer.append(mixed_event(5))
    assert writer.pending == 1
    writer.abandon()  # what a crash does
    assert log.counts() == {"sampler_turn": 2, "trajectory": 1, "sandbox_exec": 1, "trial_issued": 1}
    with log.writer("w", **ROUTING) as again:
        assert again.next_seq == 5
        assert again.append(mixed_event(5)) == "w:5"
    assert [e for _, e in log.events()] == [mixed_event(i) for i in range(6)]


def test_lookup_by_trial_fold_and_kinds(log):
    with log.writer("a", **ROUTING) as a, log.writer("b", **ROUTING) as b:
        for seq in range(14):
            (a if seq % 2 else b).append(mixed_event(seq))
    trial = log.by_trial("trial-3")
    assert [e.trial_id for _, e in trial] == ["trial-3"] * 2
    assert {eid for eid, _ in trial} == {"a:1", "b:5"}  # seq 3 is a's 2nd event, seq 10 b's 6th
    assert log.get("b:5") == mixed_event(10)
    tokens = log.fold(lambda n, e: n + len(e.token_ids), 0, kinds=["trajectory"])
    assert tokens == sum(len(trajectory(s).token_ids) for s in range(14) if s % 4 == 1)
    assert all(isinstance(e, TrialIssued) for _, e in log.events(kinds="trial_issued"))
    with pytest.raises(ValueError, match="unknown event kinds"):
        list(log.events(kinds=["nope"]))
    with pytest.raises(KeyError, match="not an event id"):
        log.get("b5")
    with pytest.raises(KeyError, match="no committed event 'b:99'"):
        log.get("b:99")
    assert log.segments() == ["a", "b"]


def test_cursor_is_exactly_once_and_resumes_from_saved_position(log):
    writer = log.writer("w", **ROUTING)
    cursor = log.cursor()
    assert cursor.poll() == []
    for seq in range(6):
        writer.append(mixed_event(seq))
    assert cursor.poll() == []  # nothing committed yet
    writer.commit()
    first = cursor.poll(max_events=4)
    saved = json.dumps(cursor.position)
    rest = cursor.poll()
    assert [eid for eid, _ in first + rest] == [f"w:{i}" for i in range(6)]
    resumed = log.cursor(json.loads(saved))
    assert [eid for eid, _ in resumed.poll()] == [eid for eid, _ in rest]
    assert cursor.poll() == [] and resumed.poll() == []
    only_turns = log.cursor(kinds=["sampler_turn"])
    assert [eid for eid, _ in only_turns.poll(max_events=1)] == ["w:0"]
    assert [eid for eid, _ in only_turns.poll()] == ["w:4"]
    assert only_turns.position == {"w": 6}
    with pytest.raises(ValueError, match="bad cursor position"):
        log.cursor({"w": -1})
    writer.close()


def tampered(record, **changes):
    copy = record.model_copy()
    copy.__dict__.update(changes)
    return copy


def test_bad_inputs_are_rejected_and_leave_the_log_unchanged(tmp_path):
    location = tmp_path / "log"
    log = EventLog.open(location, create=True, config=TINY_CHUNKS)
    writer = log.writer("w", **ROUTING)
    writer.append(sampler_turn(0))
    writer.commit()
    writer.append(sampler_turn(1))  # pending, must survive the rejections below
    before = snapshot(location)
    good = sampler_turn(2)
    fields = {name: getattr(good, name) for name in SamplerTurn.model_fields}
    n = len(good.sampled_ids)
    bad_cases = {  # records whose checks were bypassed after construction (frozen models can be forced)
        "sampler_logprobs": tampered(good, sampler_logprobs=np.zeros(n + 1, np.float32)),
        "prompt_ids": tampered(good, prompt_ids=good.prompt_ids.astype(np.int64)),
        "routing": tampered(good, routing=good.routing[:, :, :1]),
    }
    for field, event in bad_cases.items():
        with pytest.raises(EventRejected, match=rf"log unchanged: SamplerTurn\.{field}"):
            writer.append(event)
    wrong_layers = SamplerTurn(**{**fields, "routing": np.zeros((len(good.routing), LAYERS + 1, K), np.uint8)})
    with pytest.raises(EventRejected, match=r"routing record shape .* expected \[tokens, 4, 2\]"):
        writer.append(wrong_layers)
    wide = SamplerTurn(**{**fields, "routing": good.routing.astype(np.uint16)})
    with pytest.raises(EventRejected, match=r"routing dtype uint16, but a model with 8 experts records uint8"):
        writer.append(wide)
    out_of_range = SamplerTurn(**{**fields, "routing": np.full_like(good.routing, EXPERTS)})
    with pytest.raises(EventRejected, match=r"expert id 8 out of range for 8 experts"):
        writer.append(out_of_range)
    with pytest.raises(EventRejected, match=r"Heartbeat: only events"):
        writer.append(Heartbeat(actor="x", role="y", seq=0, sent_at=0.0))
    assert snapshot(location) == before and writer.pending == 1
    writer.close()
    assert [e for _, e in log.events()] == [sampler_turn(0), sampler_turn(1)]
    with log.writer("plain") as plain:
        with pytest.raises(EventRejected, match="opened without a routing shape"):
            plain.append(good)


def test_writer_arguments_and_opening_errors(tmp_path):
    with pytest.raises(LogNotFound, match="pass create=True"):
        EventLog.open(tmp_path / "missing")
    zarr.open_group(zarr.storage.LocalStore(tmp_path / "other"), mode="a")
    for create in (False, True):
        with pytest.raises(LogNotFound, match="not a t1 event log"):
            EventLog.open(tmp_path / "other", create=create)
    log = EventLog.open(tmp_path / "log", create=True)
    with pytest.raises(ValueError, match="writer id"):
        log.writer("bad/id")
    with pytest.raises(ValueError, match="give both"):
        log.writer("w", routing_shape=(4, 2))
    with log.writer("w", **ROUTING):
        with pytest.raises(WriterBusy, match="already has an open writer"):
            log.writer("w", **ROUTING)
    with pytest.raises(LogError, match="holds routing records of shape"):
        log.writer("w", routing_shape=(48, 8), num_experts=256)
    closed = log.writer("w", **ROUTING)
    closed.close()
    with pytest.raises(LogError, match="is closed"):
        closed.append(sampler_turn(0))


def test_wide_routing_for_many_experts(tmp_path):
    log = EventLog.open(tmp_path / "log", create=True)
    turn = sampler_turn(3)
    wide = SamplerTurn(**{**{n: getattr(turn, n) for n in SamplerTurn.model_fields},
                          "routing": (turn.routing.astype(np.uint16) * 100)})
    with log.writer("w", routing_shape=(LAYERS, K), num_experts=1000) as writer:
        writer.append(wide)
    got = log.get("w:0").routing
    assert got.dtype == np.uint16 and got.tobytes() == wide.routing.tobytes()


def _chunk_files(location: Path, array: str) -> set[Path]:
    return {p for p in (location / "segments" / "w" / array / "c").rglob("*") if p.is_file()}


def _pack_file(location: Path, array: str) -> Path:
    return location / "segments" / "w" / array / "c" / "packed"


def test_corrupted_chunk_is_named(tmp_path):
    location = tmp_path / "log"
    config = StorageConfig(codec="none", routing_chunk_bytes=1024, routing_encoding="ids")
    log = EventLog.open(location, create=True, config=config)
    with log.writer("w", **ROUTING) as writer:
        for seq in range(6):
            writer.append(sampler_turn(seq))
    assert not _chunk_files(location, "routing") - {_pack_file(location, "routing")}  # one file, no chunk files
    victim, chunk = _pack_file(location, "routing"), 2  # routing chunks: 1024 bytes each, back to back
    data = bytearray(victim.read_bytes())
    data[chunk * 1024 + 10] ^= 0xFF
    victim.write_bytes(bytes(data))
    fresh = EventLog.open(location)
    with pytest.raises(CorruptionError, match=rf"segment 'w', array 'routing', chunk {chunk}: checksum mismatch"):
        fresh.verify()
    with pytest.raises(CorruptionError) as info:
        [e for _, e in fresh.events()]
    assert (info.value.segment, info.value.array, info.value.chunk) == ("w", "routing", chunk)


def test_damaged_compressed_chunk_and_commit_record_are_named(tmp_path):
    location = tmp_path / "log"
    log = EventLog.open(location, create=True, config=TINY_CHUNKS.model_copy(update={"codec": "lz4"}))
    with log.writer("w", **ROUTING) as writer:
        for seq in range(4):
            writer.append(sampler_turn(seq))
            writer.commit()
    assert _pack_file(location, "int32") not in _chunk_files(location, "int32")  # compressed: a file per chunk
    victim = sorted(_chunk_files(location, "int32"))[1]
    victim.write_bytes(victim.read_bytes()[:20])  # truncated blosc frame
    with pytest.raises(CorruptionError, match=r"segment 'w', array 'int32', chunk 1"):
        EventLog.open(location).verify()
    sorted(_chunk_files(location, "headers"))[0].unlink()  # a lost chunk reads back as fill value: caught too
    with pytest.raises(CorruptionError, match=r"segment 'w', array 'headers', chunk 0: checksum mismatch"):
        EventLog.open(location).counts()
    from storage._commits import FRAME_HEADER, MAGIC

    commits = location / "segments" / "w" / "commits.log"  # MAGIC, then [length][crc32c][header crc][record]
    data = bytearray(commits.read_bytes())
    start = len(MAGIC)
    for _ in range(2):
        start += FRAME_HEADER + int.from_bytes(data[start:start + 4], "little")
    data[start + FRAME_HEADER + 4] ^= 0xFF  # inside commit record 2
    commits.write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match=r"segment 'w', array 'commits'.*commit record 2"):
        EventLog.open(location).counts()


def test_damaged_commit_record_key_is_named():
    store = zarr.storage.MemoryStore()  # stores without a directory keep a key per commit record
    log = EventLog.open(store, create=True, config=TINY_CHUNKS)
    with log.writer("w", **ROUTING) as writer:
        for seq in range(3):
            writer.append(sampler_turn(seq))
            writer.commit()
    key = "segments/w/commits/000000000001"
    record = zarr.core.sync.sync(store.get(key, zarr.core.buffer.default_buffer_prototype())).to_bytes()
    zarr.core.sync.sync(store.set(key, zarr.core.buffer.cpu.Buffer.from_bytes(record[:-3] + b"\x00\x00\x00")))
    with pytest.raises(CorruptionError, match=r"segment 'w', array 'commits'.*commit record 1"):
        EventLog.open(store, config=TINY_CHUNKS).counts()


def test_trio_wrappers_do_not_block_and_tail(tmp_path):
    log = EventLog.open(tmp_path / "log", create=True, config=TINY_CHUNKS)
    seen = []

    async def produce():
        log_here = await EventLog.aopen(tmp_path / "log", config=TINY_CHUNKS)
        async with await log_here.awriter("w", **ROUTING) as writer:
            for seq in range(12):
                await writer.aappend(mixed_event(seq))
                if seq % 4 == 3:
                    await writer.acommit()
                    await trio.sleep(0.01)

    async def consume(cursor):
        with trio.move_on_after(30):
            async for batch in cursor.atail(interval=0.005):
                seen.extend(eid for eid, _ in batch)
                if len(seen) == 12:
                    return

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, log.cursor())
            nursery.start_soon(produce)
        assert (await log.aget("w:3")) == mixed_event(3)
        assert len(await log.aby_trial("trial-1")) == 2
        assert await log.acounts() == log.counts()
        assert await log.afold(lambda n, _: n + 1, 0) == 12
        await log.averify()

    trio.run(main)
    assert seen == [f"w:{i}" for i in range(12)]


def test_group_commit_task_commits_pending_events_and_on_cancel(tmp_path):
    log = EventLog.open(tmp_path / "log", create=True, config=TINY_CHUNKS)

    async def main():
        writer = await log.awriter("w", **ROUTING)
        cursor = log.cursor()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.acommit_periodically, 0.01)
            for seq in range(5):
                await writer.aappend(mixed_event(seq))
            seen = []
            with trio.fail_after(30):
                while len(seen) < 5:  # nobody called commit: the committer did
                    seen += [eid for eid, _ in await cursor.apoll()]
                    await trio.sleep(0.005)
            nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.acommit_periodically, 3600)  # would never fire by itself
            await writer.aappend(mixed_event(5))
            nursery.cancel_scope.cancel()  # the shielded final commit takes the last event
        assert writer.pending == 0
        assert [eid for eid, _ in await cursor.apoll()] == ["w:5"]
        await writer.aclose()

    trio.run(main)
