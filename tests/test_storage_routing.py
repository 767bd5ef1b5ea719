"""Routing records stored as sets (``storage/_routing.py``): exact round trips at several shapes, the
edge sets, the read-back form (sorted within each set), the layouts that keep ids, an old-format log,
and damage that is still named."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import SamplerTurn, routing_dtype
from storage import CorruptionError, EventLog, StorageConfig, as_stored, stored_routing
from storage._packed import pread_into
from storage._routing import SetCodec, _sorting_network

OLD_LOG = Path(__file__).parent / "data" / "log_format2"  # written by t1 at 00477d9, before routing sets
SMALL = StorageConfig(routing_chunk_bytes=1024, vector_chunk_bytes=1024, header_chunk_bytes=1024)


def random_sets(rng: np.random.Generator, tokens: int, layers: int, k: int, experts: int) -> np.ndarray:
    """Distinct ids per (token, layer), in random (router-like, unsorted) order."""
    scores = rng.random((tokens, layers, experts))
    return np.argsort(scores, axis=-1)[..., :k].astype(routing_dtype(experts))


def turn(routing: np.ndarray, seq: int = 0) -> SamplerTurn:
    n = 3
    p = len(routing) - n + 1
    return SamplerTurn(trial_id=f"t{seq}", turn=seq, prompt_ids=np.arange(p, dtype=np.int32),
                       sampled_ids=np.arange(n, dtype=np.int32), sampler_logprobs=np.zeros(n, np.float32),
                       routing=routing, policy_version=0, finish_reason="stop", temperature=1.0, top_p=1.0,
                       sampler_id="w")


def old_turn(seq: int) -> SamplerTurn:
    """Event ``seq`` of the format-2 fixture (tests/data/log_format2 was written from this very function)."""
    rng = np.random.default_rng(seq + 7)
    p, n = 5 + seq, 3 + seq
    routing = np.argsort(rng.random((p + n - 1, 3, 8)), axis=-1)[..., :2].astype(np.uint8)
    return SamplerTurn(trial_id=f"trial-{seq}", turn=seq, prompt_ids=np.arange(p, dtype=np.int32),
                       sampled_ids=np.arange(n, dtype=np.int32) + 100, sampler_logprobs=np.full(n, -0.5, np.float32),
                       routing=routing, policy_version=1, finish_reason="stop", temperature=1.0, top_p=1.0,
                       sampler_id="old")


SHAPES = [(k, e) for k in (1, 2, 8) for e in (8, 64, 256) if k < e]


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from(SHAPES), layers=st.integers(1, 6), tokens=st.integers(0, 40), seed=st.integers(0, 2**32 - 1))
def test_random_sets_round_trip_sorted(shape, layers, tokens, seed):
    k, experts = shape
    codec = SetCodec(layers, k, experts)
    routing = random_sets(np.random.default_rng(seed), tokens, layers, k, experts)
    rows = codec.encode(routing)
    assert rows.shape == (tokens, codec.row_bytes) and rows.dtype == np.uint8
    back = codec.decode(rows)
    assert back.dtype == routing_dtype(experts) and np.array_equal(back, np.sort(routing, axis=-1))
    assert np.array_equal(back, stored_routing(routing, experts))


@pytest.mark.parametrize("k,experts", SHAPES + [(10, 384), (3, 70_000), (63, 64)])
def test_edge_sets_are_the_first_and_last_numbers(k, experts):
    codec = SetCodec(2, k, experts)
    first, last = np.arange(k), np.arange(experts - k, experts)
    routing = np.stack([np.stack([first, last]), np.stack([last[::-1], first[::-1]])]).astype(routing_dtype(experts))
    assert np.array_equal(codec.decode(codec.encode(routing)), np.sort(routing, axis=-1))
    numbers = codec._unpack(codec.encode(routing))
    assert numbers[0, 0] == 0 and int(numbers[0, 1]) == math.comb(experts, k) - 1  # the ends of [0, C(E, k))


def test_bits_per_token_at_the_papers_shape_and_the_campaigns():
    paper = SetCodec(48, 8, 256)
    assert paper.bits == 49 and paper.row_bytes == 48 * 6 + 6 == 294  # <= 300; the bound is 291 (48.5 bits)
    assert SetCodec(4, 2, 8).row_bytes == 3  # C(8, 2) = 28 -> 5 bits x 4 layers, against 8 bytes of ids
    assert not SetCodec.fits(10, 512) and not SetCodec.fits(8, 8) and SetCodec.fits(8, 384)


def test_sorting_networks_sort_every_zero_one_input():  # the 0-1 principle: then they sort everything
    for n in range(1, 11):
        for pattern in range(1 << n):
            values = [(pattern >> i) & 1 for i in range(n)]
            for i, j in _sorting_network(n):
                if values[i] > values[j]:
                    values[i], values[j] = values[j], values[i]
            assert values == sorted(values), (n, pattern)


@pytest.mark.parametrize("where", ["directory", "memory"])
def test_the_log_returns_sets_sorted_and_repeated_ids_as_given(tmp_path, where):
    location = tmp_path / "log" if where == "directory" else zarr.storage.MemoryStore()
    log = EventLog.open(location, create=True, config=SMALL)
    rng = np.random.default_rng(3)
    sets = [turn(random_sets(rng, 40 + 30 * i, 4, 2, 8), i) for i in range(4)]
    repeated = rng.integers(0, 8, (25, 4, 2), dtype=np.uint8)
    repeated[0, 0] = [5, 5]  # not a set: stored id by id
    with log.writer("w", routing_shape=(4, 2), num_experts=8) as writer:
        ids = [writer.append(e) for e in sets[:2]] + [writer.append(turn(repeated, 9))]
        ids += [writer.append(e) for e in sets[2:]]
    got = [log.get(i) for i in ids]
    assert got[2].routing.tobytes() == repeated.tobytes()
    for event, back in zip(sets[:2] + sets[2:], got[:2] + got[3:]):
        assert not np.array_equal(back.routing, event.routing)  # the router's order is not kept ...
        assert back == as_stored(event)  # ... each set is, sorted ascending; every other field bit-exact
    assert log.verify()["w"].keys() >= {"routing", "routing_sets", "headers"}


def test_ids_encoding_and_shapes_beyond_64_bits_keep_the_order(tmp_path):
    rng = np.random.default_rng(4)
    log = EventLog.open(tmp_path / "a", create=True, config=SMALL.model_copy(update={"routing_encoding": "ids"}))
    event = turn(random_sets(rng, 30, 2, 2, 8))
    with log.writer("w", routing_shape=(2, 2), num_experts=8) as writer:
        writer.append(event)
    assert log.get("w:0") == event and (tmp_path / "a" / "segments" / "w" / "routing").is_dir()
    wide = EventLog.open(tmp_path / "b", create=True, config=SMALL)
    event = turn(random_sets(rng, 12, 2, 10, 512))  # C(512, 10) > 2^64: no set encoding
    with wide.writer("w", routing_shape=(2, 10), num_experts=512) as writer:
        writer.append(event)
    assert wide.get("w:0") == event == as_stored(event, num_experts=512)


def test_an_old_format_log_reads_as_before_and_keeps_ids_when_appended_to(tmp_path):
    location = tmp_path / "old"
    shutil.copytree(OLD_LOG, location)
    log = EventLog.open(location)
    events = [e for _, e in log.events()]
    assert events == [old_turn(seq) for seq in range(3)]  # bit-exact, the router's order included
    assert not all(np.array_equal(e.routing, np.sort(e.routing, -1)) for e in events)
    assert log.verify()["old"]["routing"] >= 1
    with log.writer("old", routing_shape=(3, 2), num_experts=8) as writer:  # format 2: ids, so old t1 still reads it
        writer.append(old_turn(3))
    assert EventLog.open(location).get("old:3") == old_turn(3)
    assert not (location / "segments" / "old" / "routing_sets").exists()


def _sets_log(tmp_path) -> tuple[Path, list]:
    location = tmp_path / "log"
    log = EventLog.open(location, create=True, config=SMALL)
    rng = np.random.default_rng(5)
    events = [turn(random_sets(rng, 300, 8, 8, 256), i) for i in range(3)]  # 300 x 49 B of sets each
    with log.writer("w", routing_shape=(8, 8), num_experts=256) as writer:
        for event in events:
            writer.append(event)
    return location, events


def test_a_corrupted_sets_chunk_is_named(tmp_path):
    location, events = _sets_log(tmp_path)
    assert EventLog.open(location).get("w:1") == as_stored(events[1])
    pack = location / "segments" / "w" / "routing_sets" / "c" / "packed"
    rows_per_chunk = 1024 // SetCodec(8, 8, 256).row_bytes
    data = bytearray(pack.read_bytes())
    at = 300 * 49 + 7  # inside event 1's rows
    data[at] ^= 0x40
    pack.write_bytes(bytes(data))
    chunk = at // (rows_per_chunk * 49)
    with pytest.raises(CorruptionError, match=rf"segment 'w', array 'routing_sets', chunk {chunk}: checksum mismatch"):
        EventLog.open(location).get("w:1")
    assert EventLog.open(location).get("w:0") == as_stored(events[0])  # the others still read


def test_a_torn_sets_pack_file_is_named(tmp_path):
    location, _ = _sets_log(tmp_path)
    pack = location / "segments" / "w" / "routing_sets" / "c" / "packed"
    pack.write_bytes(pack.read_bytes()[:2 * 300 * 49 + 100])
    with pytest.raises(CorruptionError, match=r"array 'routing_sets', chunk \d+: pack file .* ends inside committed rows"):
        EventLog.open(location).verify()


def test_an_empty_read_only_routing_encodes_to_no_rows(tmp_path):
    """Events freeze their arrays; an empty one is its own transpose, so encoding must not sort it in place
    (was: ValueError 'output array is read-only' on the first empty routing a log met)."""
    empty = np.zeros((0, 4, 2), np.uint8)
    empty.flags.writeable = False
    assert SetCodec(4, 2, 8).encode(empty).shape == (0, SetCodec(4, 2, 8).row_bytes)
    (tmp_path / "f").write_bytes(b"x")
    with open(tmp_path / "f", "rb") as f:
        assert pread_into(f.fileno(), np.zeros(0, np.uint8), 0) == 0  # an empty payload reads as nothing
