"""Routing on disk as sets (issue 32 item 6): bytes per token and what the set encoding costs appends and replays.

Trajectories of 2k tokens (``bench/log_append.py``'s: ids, mask, logprobs, versions, routing) at the paper's
shape (48 layers, top-8 of 256 experts, uniform routing) go through the log with its defaults (routing as
sets, ``storage/_routing.py``) and, side by side in the same rounds on the same disk, through raw
``numpy.tofile`` / ``numpy.fromfile`` of the very same payload bytes (ids one byte each) and through the log
with ``routing_encoding="ids"`` (the layout before). Rounds alternate who goes first; medians are taken.
Also: bytes per token for skewed routing (per layer a Zipf(1.0) popularity over experts, top-8 drawn by
Gumbel-top-k) and at the default campaign's shape (4 layers, top-2 of 8), with the codec alone timed, and
for reference what sorted-delta + zstd (numcodecs) would store (an entropy codec gains on skew, the
combinadic is fixed-width). Last line: one JSON object.

    python bench/routing_codec.py [--events 16] [--rounds 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numcodecs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from log_append import (
    FIELDS,
    TOKENS,
    du,
    log_append,
    log_replay,
    make_trajectory,
    payload_bytes,
    raw_append,
    raw_replay,
)

from storage import StorageConfig
from storage._routing import SetCodec

LAYERS, TOP_K, EXPERTS = 48, 8, 256
CAMPAIGN = (4, 2, 8)  # configs' default model: 4 layers, top-2 of 8 experts


def uniform_routing(rng, tokens, layers, k, experts) -> np.ndarray:
    return np.argsort(rng.random((tokens, layers, experts), dtype=np.float32), axis=-1)[..., :k].astype(np.uint8)


def zipf_routing(rng, tokens, layers, k, experts, s: float = 1.0) -> np.ndarray:
    """Per layer a Zipf(s) popularity over a random permutation of the experts; top-k by Gumbel-top-k."""
    logp = np.stack([-s * np.log1p(rng.permutation(experts)) for _ in range(layers)]).astype(np.float32)
    scores = logp + rng.gumbel(size=(tokens, layers, experts)).astype(np.float32)
    return np.argpartition(-scores, k, axis=-1)[..., :k].astype(np.uint8)


def routing_disk(directory: Path) -> int:
    segment = directory / "segments" / "bench"
    return sum(du(segment / name) for name in ("routing", "routing_sets") if (segment / name).exists())


def side_by_side(events, base: Path, rounds: int, commit_every: int) -> dict:
    sides = {"raw": None, "sets": StorageConfig(), "ids": StorageConfig(routing_encoding="ids")}
    append = {side: [] for side in sides}
    replay = {side: [] for side in sides}
    disk = {}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            d = base / f"{side}{r}"
            if sides[side] is None:
                append[side].append(raw_append(events, d, commit_every, fsync=False))
            else:
                append[side].append(log_append(events, d, commit_every, sides[side]))
        for side in order[::-1]:
            d = base / f"{side}{r}"
            replay[side].append(raw_replay(events, d) if sides[side] is None else log_replay(events, d, sides[side]))
            if sides[side] is not None:
                disk[side] = routing_disk(d)
            shutil.rmtree(d)
    nbytes = sum(payload_bytes(e) for e in events)
    a = {s: nbytes / statistics.median(v) / 1e6 for s, v in append.items()}
    p = {s: nbytes / statistics.median(v) / 1e6 for s, v in replay.items()}
    tokens = TOKENS * len(events)
    return {
        "routing_bytes_per_token_disk": round(disk["sets"] / tokens, 1),
        "routing_bytes_per_token_disk_ids": round(disk["ids"] / tokens, 1),
        "append_ratio": round(a["sets"] / a["raw"], 3), "replay_ratio": round(p["sets"] / p["raw"], 3),
        "append_ratio_ids": round(a["ids"] / a["raw"], 3), "replay_ratio_ids": round(p["ids"] / p["raw"], 3),
        "log_append_MBps": round(a["sets"]), "log_append_MBps_ids": round(a["ids"]), "raw_append_MBps": round(a["raw"]),
        "log_replay_MBps": round(p["sets"]), "log_replay_MBps_ids": round(p["ids"]), "raw_replay_MBps": round(p["raw"]),
    }


def codec_figures(routing: np.ndarray, experts: int, repeat: int = 5) -> dict:
    """The codec alone on one record: bytes per token, MB/s of id bytes in and out, and sorted-delta + zstd."""
    tokens, layers, k = routing.shape
    codec = SetCodec(layers, k, experts)
    rows = codec.encode(routing)
    assert np.array_equal(codec.decode(rows), np.sort(routing, axis=-1))
    timings = {"encode": [], "decode": []}
    for _ in range(repeat):
        t0 = time.perf_counter()
        codec.encode(routing)
        t1 = time.perf_counter()
        codec.decode(rows)
        timings["encode"].append(t1 - t0)
        timings["decode"].append(time.perf_counter() - t1)
    ordered = np.sort(routing, axis=-1)
    deltas = np.diff(ordered, axis=-1, prepend=0).astype(np.uint8)
    zstd = len(numcodecs.Zstd(level=3).encode(np.ascontiguousarray(deltas)))
    return {"bytes_per_token": round(rows.nbytes / tokens, 2),
            "encode_MBps": round(routing.nbytes / statistics.median(timings["encode"]) / 1e6),
            "decode_MBps": round(routing.nbytes / statistics.median(timings["decode"]) / 1e6),
            "zstd_sorted_delta_bytes_per_token": round(zstd / tokens, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=16, help="2k-token trajectories per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commit-every", type=int, default=8)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    pool = []
    for i in range(min(4, args.events)):
        base_event = make_trajectory(rng, i)
        pool.append(base_event.model_copy(update={"routing": uniform_routing(rng, TOKENS, LAYERS, TOP_K, EXPERTS)}))
    events = [pool[i % len(pool)].model_copy(update={"trial_id": f"trial-{i}"}) for i in range(args.events)]
    base = Path(tempfile.mkdtemp(prefix="t1-routing-", dir=args.dir))
    try:
        result = side_by_side(events, base, args.rounds, args.commit_every)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    uniform = codec_figures(events[0].routing, EXPERTS)
    skewed = codec_figures(zipf_routing(rng, TOKENS, LAYERS, TOP_K, EXPERTS), EXPERTS)
    campaign = codec_figures(uniform_routing(rng, TOKENS * 8, *CAMPAIGN), CAMPAIGN[2])
    result.update(
        routing_bytes_per_token_skewed=skewed["bytes_per_token"],
        routing_bytes_per_token_campaign=campaign["bytes_per_token"],
        routing_bytes_per_token_raw=LAYERS * TOP_K,
        routing_bytes_per_token_bound=round(math.log2(math.comb(EXPERTS, TOP_K)) / 8 * LAYERS, 1),  # 48.5 bits/set
        codec_uniform=uniform, codec_skewed=skewed, codec_campaign=campaign,
        events=args.events, rounds=args.rounds, tokens_per_event=TOKENS, fields=list(FIELDS),
        cpus=os.cpu_count(), load_average=round(os.getloadavg()[0], 1), seconds=round(time.perf_counter() - started),
        targets_met=result["routing_bytes_per_token_disk"] <= 300 and result["append_ratio"] >= 0.8
        and result["replay_ratio"] >= 0.8)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
