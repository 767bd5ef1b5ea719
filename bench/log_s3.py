"""The event log on an S3-API server against raw puts and gets of the same bytes through the same client.

A real S3-API server (moto's server mode) on a loopback port; the same 2k-token trajectories as
``bench/log_append.py`` (48 layers, top-8 of 256 experts: ~0.8 MB of routing each). Log side: append
``--events`` trajectories, committing every ``--per-commit``, then replay them all with a fresh reader.
Raw side: put each commit's payload bytes as one object per array per commit (what an S3 writer that
knew nothing of events, checksums, leases or commit records would do), then get them back, through the
same s3fs client and event loop. Sides interleaved over ``--rounds`` rounds, medians taken.

    python bench/log_s3.py [--events 24] [--per-commit 4] [--rounds 3]

Last line: one JSON object with ``s3_append_ratio`` and ``s3_replay_ratio`` (log MB/s over raw MB/s;
goal >= 0.8 each). On moto both sides share one Python process with the server, so the figures say what
the log costs over the bytes, not what S3 sustains.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from log_append import FIELDS, make_trajectory

BUCKET = "t1-bench"


def start_server() -> object:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    import boto3

    boto3.client("s3").create_bucket(Bucket=BUCKET)
    return server


def log_round(events, per_commit: int) -> tuple[float, float, int]:
    from storage import EventLog

    url = f"s3://{BUCKET}/{uuid.uuid4().hex}/log"
    log = EventLog.open(url, create=True)
    start = time.perf_counter()
    with log.writer("learner-0", routing_shape=(events[0].routing.shape[1], events[0].routing.shape[2]),
                    num_experts=256) as writer:
        for i, event in enumerate(events):
            writer.append(event)
            if (i + 1) % per_commit == 0:
                writer.commit()
    append_s = time.perf_counter() - start
    start = time.perf_counter()
    got = [e for _, e in EventLog.open(url).events()]
    replay_s = time.perf_counter() - start
    assert len(got) == len(events) and np.array_equal(got[-1].routing, events[-1].routing)
    return append_s, replay_s, len(got)


def raw_round(events, per_commit: int) -> tuple[float, float]:
    import zarr
    from zarr.core.sync import sync

    store = zarr.storage.FsspecStore.from_url(f"s3://{BUCKET}/{uuid.uuid4().hex}",
                                              storage_options={"use_listings_cache": False})
    fs, prefix = store.fs, store.path
    keys = []

    async def put_all(batch, n):
        await asyncio.gather(*(fs._pipe_file(f"{prefix}/{name}/{n}",
                                             np.concatenate([getattr(e, name).ravel() for e in batch]).tobytes())
                               for name in FIELDS))

    start = time.perf_counter()
    for n in range(0, len(events), per_commit):
        sync(put_all(events[n:n + per_commit], n))
        keys += [f"{prefix}/{name}/{n}" for name in FIELDS]
    append_s = time.perf_counter() - start

    async def get_all():
        return await asyncio.gather(*(fs._cat_file(key) for key in keys))

    start = time.perf_counter()
    blobs = sync(get_all())
    replay_s = time.perf_counter() - start
    assert sum(len(b) for b in blobs) > 0
    return append_s, replay_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=24)
    parser.add_argument("--per-commit", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        server = start_server()
    except ImportError as exc:
        print(json.dumps({"s3_append_ratio": None, "s3_replay_ratio": None, "reason": f"moto is missing: {exc}"}))
        return 0
    rng = np.random.default_rng(0)
    events = [make_trajectory(rng, i) for i in range(args.events)]
    payload = sum(getattr(e, name).nbytes for e in events for name in FIELDS)
    log_append, log_replay, raw_append, raw_replay = [], [], [], []
    try:
        for _ in range(args.rounds):
            a, r, _n = log_round(events, args.per_commit)
            log_append.append(a)
            log_replay.append(r)
            a, r = raw_round(events, args.per_commit)
            raw_append.append(a)
            raw_replay.append(r)
    finally:
        server.stop()
    mb = payload / 1e6
    result = {"bench": "log_s3", "server": "moto (ThreadedMotoServer, loopback)", "events": args.events,
              "per_commit": args.per_commit, "payload_mb": round(mb, 1),
              "log_append_mb_s": round(mb / statistics.median(log_append), 1),
              "raw_put_mb_s": round(mb / statistics.median(raw_append), 1),
              "log_replay_mb_s": round(mb / statistics.median(log_replay), 1),
              "raw_get_mb_s": round(mb / statistics.median(raw_replay), 1)}
    result["s3_append_ratio"] = round(result["log_append_mb_s"] / result["raw_put_mb_s"], 3)
    result["s3_replay_ratio"] = round(result["log_replay_mb_s"] / result["raw_get_mb_s"], 3)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
