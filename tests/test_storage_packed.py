"""The packed chunk layout of a log directory: still a real zarr hierarchy, reservations released,
other stores and old formats handled."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from storage_helpers import EXPERTS, LAYERS, TINY_CHUNKS, K, sampler_turn

from schemas import SamplerTurn
from storage import EventLog, LogError, StorageConfig
from storage._packed import PACKED_ATTR, PackedStore, reserve, reserve_pays
from storage._routing import SetCodec

ROUTING = dict(routing_shape=(LAYERS, K), num_experts=EXPERTS)


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


@pytest.mark.filterwarnings("ignore:Object at .* is not recognized")  # commit records, writer.lock
def test_log_arrays_are_zarr_arrays_in_one_file_each(tmp_path):
    location = tmp_path / "log"
    log = EventLog.open(location, create=True, config=TINY_CHUNKS)
    turns = [sampler_turn(seq) for seq in range(5)]
    with log.writer("w", **ROUTING) as writer:
        for turn in turns:
            writer.append(turn)
    segment = location / "segments" / "w"
    assert files_under(segment / "routing_sets") == ["c/packed", "zarr.json"]
    assert files_under(segment / "int32") == ["c/packed", "zarr.json"]
    # zarr itself reads the rows back through the store, chunk by chunk
    routing = zarr.open_array(PackedStore(location), path="segments/w/routing_sets", mode="r")
    codec = SetCodec(LAYERS, K, EXPERTS)
    expected = np.concatenate([codec.encode(t.routing) for t in turns])
    assert routing.chunks[0] == 1024 // codec.row_bytes  # many chunks, one file
    assert np.array_equal(routing[:len(expected)], expected)
    assert not routing[len(expected):len(expected) + 10].any()  # past the data: fill value
    group = zarr.open_group(PackedStore(location), path="segments/w", mode="r")
    assert {"routing_sets", "int32", "float32", "headers"} <= set(group.array_keys())


def test_packed_store_through_the_zarr_api(tmp_path):
    store = PackedStore(tmp_path / "z")
    data = np.arange(35 * 3, dtype=np.int32).reshape(35, 3)
    packed = zarr.create_array(store, name="p", shape=(100, 3), chunks=(16, 3), dtype="int32", fill_value=0,
                               compressors=None, attributes={PACKED_ATTR: True})
    packed[5:40] = data
    plain = zarr.create_array(store, name="q", shape=(100, 3), chunks=(16, 3), dtype="int32", fill_value=0,
                              compressors=None)
    plain[5:40] = data
    assert files_under(tmp_path / "z" / "p") == ["c/packed", "zarr.json"]
    assert files_under(tmp_path / "z" / "q") == ["c/0/0", "c/1/0", "c/2/0", "zarr.json"]  # unmarked: LocalStore
    again = zarr.open_array(PackedStore(tmp_path / "z"), path="p", mode="a")
    expected = np.zeros((100, 3), np.int32)
    expected[5:40] = data
    assert np.array_equal(again[:], expected)

    async def listing():
        return sorted([k async for k in store.list_prefix("p")]), sorted([k async for k in store.list_dir("p/c")])
    assert zarr.core.sync.sync(listing()) == (["p/c/0/0", "p/c/1/0", "p/c/2/0", "p/zarr.json"], ["0", "1", "2"])
    assert zarr.core.sync.sync(store.exists("p/c/2/0")) and not zarr.core.sync.sync(store.exists("p/c/3/0"))
    zarr.core.sync.sync(store.delete("p/c/1/0"))
    expected[16:32] = 0
    assert np.array_equal(again[:], expected)
    with pytest.raises(ValueError, match=r"array 'r' is marked t1_packed_chunks but its layout cannot be packed"):
        bad = zarr.create_array(store, name="r", shape=(10,), chunks=(4,), dtype="int32",
                                attributes={PACKED_ATTR: True})  # compressed by default
        bad[:] = 1


def long_turn(seq: int, tokens: int = 1200) -> SamplerTurn:
    rng = np.random.default_rng(seq)
    return SamplerTurn(
        trial_id="t", turn=seq, prompt_ids=np.zeros(1, np.int32), sampled_ids=np.arange(tokens, dtype=np.int32),
        sampler_logprobs=np.zeros(tokens, np.float32),
        routing=rng.integers(0, EXPERTS, (tokens, LAYERS, K), dtype=np.uint8),
        policy_version=0, finish_reason="stop", temperature=1.0, top_p=1.0, sampler_id="w")


def test_an_abandoned_tail_is_dropped_with_its_reserved_blocks(tmp_path):
    location = tmp_path / "log"
    log = EventLog.open(location, create=True, config=TINY_CHUNKS.model_copy(update={"reserve_min_bytes": 4096}))
    turns = [long_turn(seq) for seq in range(4)]  # 9600 B of routing each: reserved before written
    pack = location / "segments" / "w" / "routing" / "c" / "packed"
    writer = log.writer("w", **ROUTING)
    for turn in turns[:2]:
        writer.append(turn)
    writer.commit()
    writer.append(turns[2])
    assert pack.stat().st_size == 3 * 9600  # written at once, not yet visible
    writer.abandon()
    assert pack.stat().st_size == 2 * 9600 and pack.stat().st_blocks * 512 <= 2 * 9600 + 4096
    assert [e for _, e in log.events()] == turns[:2]
    with log.writer("w", **ROUTING) as writer:  # a reopened writer continues after the last commit
        writer.append(turns[3])
    assert [e for _, e in log.events()] == [turns[0], turns[1], turns[3]]


def test_blocks_are_reserved_on_ext4_only(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        on_ext4 = reserve_pays(fd)
        if not on_ext4:
            pytest.skip("the temporary directory is not on ext4")
        assert reserve(fd, 0, 1 << 20) and os.fstat(fd).st_size == 0 and os.fstat(fd).st_blocks * 512 >= 1 << 20
    finally:
        os.close(fd)
    if Path("/dev/shm").is_dir():  # tmpfs: a reservation would allocate and zero memory for nothing
        shm = os.open("/dev/shm", os.O_RDONLY)
        try:
            assert not reserve_pays(shm)
        finally:
            os.close(shm)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_big_endian_payloads_read_back_equal(tmp_path, where):
    location = tmp_path / "log" if where == "local" else zarr.storage.MemoryStore()
    log = EventLog.open(location, create=True, config=TINY_CHUNKS)
    turn = sampler_turn(1)
    swapped = SamplerTurn(**{**{n: getattr(turn, n) for n in SamplerTurn.model_fields},
                             "sampled_ids": turn.sampled_ids.astype(">i4")})
    with log.writer("w", **ROUTING) as writer:
        writer.append(swapped)
    got = log.get("w:0")
    assert got.sampled_ids.dtype == np.dtype("int32") and np.array_equal(got.sampled_ids, turn.sampled_ids)


def test_a_local_store_passed_in_opens_packed_and_old_formats_are_named(tmp_path):
    log = EventLog.open(zarr.storage.LocalStore(tmp_path / "log"), create=True)
    assert isinstance(log.store, PackedStore)
    with log.writer("w", **ROUTING) as writer:
        writer.append(sampler_turn(0))
    assert EventLog.open(tmp_path / "log").get("w:0") == sampler_turn(0)
    zarr.create_group(zarr.storage.LocalStore(tmp_path / "old"), attributes={"t1_event_log": 1})
    with pytest.raises(LogError, match=r"format 1; this t1 reads formats 2, 3 only \(read it with the t1 that wrote it\)"):
        EventLog.open(tmp_path / "old")


def test_truncated_pack_file_is_named(tmp_path):
    location = tmp_path / "log"
    config = StorageConfig(routing_chunk_bytes=1024, routing_encoding="ids")  # routing_sets: test_storage_routing
    log = EventLog.open(location, create=True, config=config)
    with log.writer("w", **ROUTING) as writer:
        for seq in range(4):
            writer.append(sampler_turn(seq))
    pack = location / "segments" / "w" / "routing" / "c" / "packed"
    os.truncate(pack, 2500)
    with pytest.raises(LogError, match=r"segment 'w', array 'routing', chunk 2: pack file .* ends inside committed rows"):
        EventLog.open(location).verify()
