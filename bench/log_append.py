"""Event-log append and replay throughput against raw numpy.tofile / numpy.fromfile of the same bytes.

Realistic trajectories: 2k-token TITO chunks of a 48-layer top-8 MoE with 256 experts (routing as
uint8 expert ids, skewed expert popularity), int32 token ids, uint8 loss masks, float32 logprobs,
int32 token versions. Both sides write the same payload bytes to the same disk, interleaved over
several rounds (median taken) so that noise from other processes hits both. The main figures fsync
on neither side (a killed process loses nothing committed either way); the ``*_fsync`` figures fsync
both sides at every commit (survives a power cut). Targets from issue 2: append_ratio and
replay_ratio >= 0.8 (log MB/s over raw ``numpy.tofile`` / ``numpy.fromfile`` MB/s).

The log (default config, a directory) keeps each array's chunks in one pack file (``PackedStore``),
writes rows there as they are appended, checksums them (CRC-32C), validates every event, and
commits with a small record file. Two reference figures say where its speed comes from:
``chunk_files_append_ratio`` writes the same bytes as one file per chunk (temp name + rename, no
zarr, no codec), the ceiling of zarr's LocalStore layout that the log used before; and
``append_ratio_vs_reserved_raw`` compares with raw ``tofile`` that first reserves the blocks of each
large write (``fallocate``, as the log does on ext4), i.e. against an equally careful raw writer.

    python bench/log_append.py [--events 48] [--rounds 3] [--dir /tmp] [--scan]

Last line: one JSON object (append_ratio, replay_ratio, routing_bytes_per_token_raw/disk, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas import TrajectoryAssembled
from storage import EventLog, StorageConfig, as_stored
from storage._packed import reserve, reserve_pays

LAYERS, TOP_K, EXPERTS, TOKENS, VOCAB = 48, 8, 256, 2048, 151_936
FIELDS = ("token_ids", "loss_mask", "sampler_logprobs", "token_versions", "routing")


def make_trajectory(rng: np.random.Generator, index: int) -> TrajectoryAssembled:
    popularity = rng.gumbel(size=(LAYERS, EXPERTS)) * 0.5  # some experts are hot in each layer
    scores = rng.gumbel(size=(TOKENS, LAYERS, EXPERTS)).astype(np.float32) + popularity
    routing = np.argpartition(-scores, TOP_K, axis=-1)[..., :TOP_K].astype(np.uint8)
    loss = np.zeros(TOKENS, np.uint8)
    for start in range(300, TOKENS, 500):  # assistant turns between tool outputs
        loss[start:start + 250] = 1
    logprobs = np.where(loss == 1, -np.abs(rng.standard_normal(TOKENS) * 0.7), 0).astype(np.float32)
    return TrajectoryAssembled(
        trial_id=f"trial-{index}", chunk=0, task_id="bench", token_ids=rng.integers(0, VOCAB, TOKENS, dtype=np.int32),
        loss_mask=loss, sampler_logprobs=logprobs, routing=routing,
        token_versions=np.where(loss == 1, 7, 0).astype(np.int32), boundary_cases=["strict"] * 3,
        reward=0.35, policy_version=7, turns=4)


def payload_bytes(event: TrajectoryAssembled) -> int:
    return sum(getattr(event, f).nbytes for f in FIELDS)


def raw_append(events, directory: Path, commit_every: int, fsync: bool, reserve_min: int = 0) -> float:
    """``reserve_min``: reserve the blocks of writes of at least this many bytes first (0: never)."""
    directory.mkdir(parents=True)
    files = {f: open(directory / f"{f}.bin", "ab") for f in FIELDS}  # opened before the clock, like the log
    if reserve_min and not reserve_pays(files[FIELDS[0]].fileno()):
        reserve_min = 0
    start = time.perf_counter()
    for i, event in enumerate(events, 1):
        for f in FIELDS:
            array = getattr(event, f)
            if reserve_min and array.nbytes >= reserve_min:
                handle = files[f]
                reserve(handle.fileno(), handle.tell(), array.nbytes)
            array.tofile(files[f])
        if i % commit_every == 0 or i == len(events):
            for handle in files.values():
                handle.flush()
                if fsync:
                    os.fsync(handle.fileno())
    for handle in files.values():
        handle.close()
    return time.perf_counter() - start


def raw_replay(events, directory: Path) -> float:
    start = time.perf_counter()
    arrays = {f: np.fromfile(directory / f"{f}.bin", dtype=getattr(events[0], f).dtype) for f in FIELDS}
    offsets = dict.fromkeys(FIELDS, 0)
    out = []
    for event in events:  # slice back into per-event arrays, as a reader would
        parts = {}
        for f in FIELDS:
            shape = getattr(event, f).shape
            n = int(np.prod(shape))
            parts[f] = arrays[f][offsets[f]:offsets[f] + n].reshape(shape)
            offsets[f] += n
        out.append(parts)
    elapsed = time.perf_counter() - start
    assert all(np.array_equal(out[-1][f], getattr(events[-1], f)) for f in FIELDS)
    return elapsed


def chunk_file_append(events, directory: Path, chunk_bytes: int) -> float:
    """The ceiling of any one-file-per-chunk store (zarr's LocalStore layout): the same bytes as
    ``chunk_bytes`` files, each written to a temp name and renamed, no codec, no zarr."""
    directory.mkdir(parents=True)
    start = time.perf_counter()
    for f in FIELDS:
        stream = np.concatenate([getattr(e, f).reshape(-1).view(np.uint8) for e in events])
        for i, lo in enumerate(range(0, len(stream), chunk_bytes)):
            tmp = directory / f"{f}.{i}.partial"
            stream[lo:lo + chunk_bytes].tofile(tmp)
            tmp.replace(directory / f"{f}.{i}")
    return time.perf_counter() - start


def log_append(events, directory: Path, commit_every: int, config: StorageConfig) -> float:
    log = EventLog.open(directory, create=True, config=config)
    writer = log.writer("bench", routing_shape=(LAYERS, TOP_K), num_experts=EXPERTS)  # like opening the raw files
    start = time.perf_counter()
    for i, event in enumerate(events, 1):
        writer.append(event)
        if i % commit_every == 0:
            writer.commit()
    writer.close()
    return time.perf_counter() - start


def log_replay(events, directory: Path, config: StorageConfig) -> float:
    start = time.perf_counter()
    log = EventLog.open(directory, config=config)
    replayed = [event for _, event in log.events()]
    elapsed = time.perf_counter() - start
    expected = as_stored(events[-1]) if config.routing_encoding == "sets" else events[-1]  # sets read back sorted
    assert len(replayed) == len(events) and replayed[-1] == expected, "replay is not bit-exact"
    return elapsed


def du(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def measure(events, base: Path, rounds: int, commit_every: int, config: StorageConfig) -> dict:
    nbytes = sum(payload_bytes(e) for e in events)
    times = {"raw_append": [], "log_append": [], "raw_replay": [], "log_replay": [], "chunk_files_append": [],
             "raw_reserved_append": []}
    routing_disk = 0
    for r in range(rounds):
        raw_dir, log_dir = base / f"raw{r}", base / f"log{r}"
        pairs = [("raw", raw_dir), ("log", log_dir)]
        for side, d in (pairs if r % 2 == 0 else pairs[::-1]):  # alternate who goes first
            if side == "raw":
                times["raw_append"].append(raw_append(events, d, commit_every, config.fsync))
            else:
                times["log_append"].append(log_append(events, d, commit_every, config))
        for side, d in (pairs[::-1] if r % 2 == 0 else pairs):
            if side == "raw":
                times["raw_replay"].append(raw_replay(events, d))
            else:
                times["log_replay"].append(log_replay(events, d, config))
        routing_disk = du(log_dir / "segments" / "bench" / "routing")
        shutil.rmtree(raw_dir), shutil.rmtree(log_dir)
        times["chunk_files_append"].append(chunk_file_append(events, base / f"chunks{r}", config.routing_chunk_bytes))
        shutil.rmtree(base / f"chunks{r}")
        times["raw_reserved_append"].append(raw_append(events, base / f"reserved{r}", commit_every, config.fsync,
                                                       config.reserve_min_bytes or 0))
        shutil.rmtree(base / f"reserved{r}")
    mbps = {k: nbytes / statistics.median(v) / 1e6 for k, v in times.items()}
    tokens = TOKENS * len(events)
    return {
        "append_ratio": round(mbps["log_append"] / mbps["raw_append"], 3),
        "replay_ratio": round(mbps["log_replay"] / mbps["raw_replay"], 3),
        "log_append_MBps": round(mbps["log_append"]), "raw_append_MBps": round(mbps["raw_append"]),
        "log_replay_MBps": round(mbps["log_replay"]), "raw_replay_MBps": round(mbps["raw_replay"]),
        "chunk_files_append_ratio": round(mbps["chunk_files_append"] / mbps["raw_append"], 3),
        "append_ratio_vs_reserved_raw": round(mbps["log_append"] / mbps["raw_reserved_append"], 3),
        "raw_reserved_append_MBps": round(mbps["raw_reserved_append"]),
        "routing_bytes_per_token_raw": LAYERS * TOP_K * events[0].routing.itemsize,
        "routing_bytes_per_token_disk": round(routing_disk / tokens, 1),
        "payload_MB": round(nbytes / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=48, help="2k-token trajectories per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commit-every", type=int, default=8, help="events per commit (and raw flush)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--scan", action="store_true", help="also compare codec settings")
    parser.add_argument("--no-fsync-run", action="store_true", help="skip the durable (fsync per commit) comparison")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    pool = [make_trajectory(rng, i) for i in range(min(8, args.events))]
    events = [pool[i % len(pool)].model_copy(update={"trial_id": f"trial-{i}"}) for i in range(args.events)]
    base = Path(tempfile.mkdtemp(prefix="t1-bench-", dir=args.dir))
    try:
        if args.scan:
            for name, cfg in {
                "none, packed (default)": StorageConfig(),
                "none, packed, no block reservation": StorageConfig(reserve_min_bytes=0),
                "none, packed, 4 MiB routing chunks": StorageConfig(routing_chunk_bytes=4 << 20),
                "lz4 bitshuffle all (chunk files)": StorageConfig(codec="lz4", routing_shuffle="bitshuffle"),
                "lz4 bitshuffle, routing noshuffle": StorageConfig(codec="lz4"),
                "zstd1 bitshuffle, routing noshuffle": StorageConfig(codec="zstd"),
            }.items():
                print(f"{name:40s}", json.dumps(measure(events, base, args.rounds, args.commit_every, cfg)), flush=True)
        result = measure(events, base, args.rounds, args.commit_every, StorageConfig())
        if not args.no_fsync_run:  # both sides durable: fsync at every commit
            durable = measure(events, base, args.rounds, args.commit_every, StorageConfig(fsync=True))
            result.update(append_ratio_fsync=durable["append_ratio"], log_append_MBps_fsync=durable["log_append_MBps"],
                          raw_append_MBps_fsync=durable["raw_append_MBps"])
        each = measure(events, base, args.rounds, 1, StorageConfig())  # a commit (raw: a flush) per event
        result.update(append_ratio_commit_each=each["append_ratio"], log_append_MBps_commit_each=each["log_append_MBps"])
        result.update(events=args.events, rounds=args.rounds, tokens_per_event=TOKENS,
                      routing_shape=[LAYERS, TOP_K], num_experts=EXPERTS, cpus=os.cpu_count(),
                      load_average=round(os.getloadavg()[0], 1),
                      targets_met=result["append_ratio"] >= 0.8 and result["replay_ratio"] >= 0.8)
        print(json.dumps(result))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
