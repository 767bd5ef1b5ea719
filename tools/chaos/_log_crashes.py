"""The log's crash points (part 2, 1.): a writer process killed at injected points of an append, a reader
tailing it meanwhile.

A forked writer appends events of every kind (``_events.event_for``: event ``seq`` is a function of ``seq``),
committing every 1-3, and SIGKILLs itself at the ``nth`` call of a hooked function (``STAGES``): before, halfway
through or after the ``pwrite`` of rows, of a commit record, a block reservation, the truncation of a dead
writer's tail, or, on the chunked layout, between the chunk files of one write. ``crash_sweep`` guarantees
that what it reports as ``torn_reads`` counts every event a committed reader saw that was not the next of its
segment or not equal, bit for bit, to the event of that seq, and ``acked_lost`` every acknowledged commit gone
after a kill; its positive control is ``_naive_reader_sees`` (a reader that ignores commit records).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack

import storage._commits
import storage._store
import storage._streams
from storage import EventLog, LogError, StorageConfig
from tools.chaos._events import EVENT_KINDS, ROUTING, event_for
from tools.chaos._log_layouts import LAYOUTS

FORK = multiprocessing.get_context("fork")  # a forked writer starts in milliseconds: 200 kills stay cheap

# stage -> (layout, module whose attribute is hooked, attribute, mode): where a writer kills itself
STAGES: dict[str, tuple[str, Any, str, str]] = {
    "rows: before pwrite": ("packed", storage._streams, "pwrite_all", "before"),
    "rows: half written": ("packed", storage._streams, "pwrite_all", "half"),
    "rows: after pwrite": ("packed", storage._streams, "pwrite_all", "after"),
    "block reservation: before": ("packed", storage._streams, "reserve", "before"),
    "block reservation: after": ("packed", storage._streams, "reserve", "after"),
    "commit record: before": ("packed", storage._commits, "pwrite_all", "before"),
    "commit record: half written": ("packed", storage._commits, "pwrite_all", "half"),
    "commit record: after": ("packed", storage._commits, "pwrite_all", "after"),
    "recovery: truncating a dead writer's tail": ("packed", os, "ftruncate", "before"),
    "chunk files: before": ("chunked", storage._store, "write_chunks", "before"),
    "chunk files: some written": ("chunked", storage._store, "write_chunks", "half"),
    "commit record (chunked layout): half written": ("chunked", storage._commits, "pwrite_all", "half"),
}
CHILD_LIMIT_S = 0.6  # a drawn point not reached by then: the parent kills the writer at a drawn instant
NTH = {"recovery: truncating a dead writer's tail": 2}  # calls are rare there: hook one of the first few


# ---- the writer process ----------------------------------------------------------------------------

def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(stage: str, nth: int) -> None:
    """Hook the stage's call so that its ``nth`` call kills this process (before, midway or after)."""
    _, module, attr, mode = STAGES[stage]
    original = getattr(module, attr)
    calls = [0]

    def hooked(*args, **kwargs):
        calls[0] += 1
        if calls[0] != nth:
            return original(*args, **kwargs)
        if mode == "before":
            _die()
        if mode == "half":
            if attr == "write_chunks":
                writes = args[0]
                original(writes[:max(1, len(writes) // 2)]) if len(writes) > 1 else None
            else:
                fd, data, offset = args
                view = memoryview(data).cast("B")
                os.pwrite(fd, view[:max(1, len(view) // 2)], offset)
            _die()
        result = original(*args, **kwargs)
        _die()
        return result

    setattr(module, attr, hooked)
    if attr == "reserve":  # reserve blocks on any file system here (the writer does so on ext4 only)
        storage._streams.reserve_pays = lambda fd: True


def _writer_child(location: str, layout: str, stage: str | None, nth: int, seed: int, pipe: int) -> None:
    if stage is not None:
        _arm(stage, nth)
    rng = random.Random(seed)
    log = EventLog.open(location, config=LAYOUTS[layout])
    writer = log.writer("w", **ROUTING)
    while True:
        for _ in range(rng.randint(1, 3)):
            os.write(pipe, b"A" + writer.next_seq.to_bytes(8, "little"))
            writer.append(event_for(writer.next_seq))
        writer.commit()
        os.write(pipe, b"C" + writer.next_seq.to_bytes(8, "little"))  # acknowledged: these must survive


# ---- the reader side -------------------------------------------------------------------------------

class _Tail:
    """A cursor over one segment that checks every event it reads against ``event_for``."""

    def __init__(self, location: str, config: StorageConfig):
        self.cursor = EventLog.open(location, config=config).cursor()
        self.next_seq = 0
        self.reads_checked = 0
        self.torn: list[str] = []

    def poll(self) -> None:
        try:
            batch = self.cursor.poll()
        except LogError as exc:  # a committed event that cannot be read back is a torn read
            self.torn.append(f"poll raised {exc}")
            return
        for event_id, event in batch:
            seq = int(event_id.rsplit(":", 1)[1])
            self.reads_checked += 1
            if seq != self.next_seq or event != event_for(seq):
                self.torn.append(f"{event_id}: expected seq {self.next_seq}, equal to event_for({seq})")
            self.next_seq = seq + 1


def _naive_reader_sees(location: str, committed: int) -> str | None:
    """The positive control: read the header pack file to its end, ignoring commit records. Returns what
    it sees that a committed reader must not (an event past the last commit, a header cut short)."""
    path = Path(location) / "segments" / "w" / "headers" / "c" / "packed"
    if not path.exists():
        return None
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(path.read_bytes())
    seen = -1
    try:
        for header in unpacker:
            seen = int(header["s"])
    except Exception as exc:  # garbage where a header was being written
        return f"a torn header after event {seen} ({type(exc).__name__})"
    if unpacker.tell() < path.stat().st_size:
        return f"a header cut short after event {seen}"
    if seen >= committed:
        return f"event {seen} though only {committed} are committed"
    return None


def crash_sweep(work_dir: Path, *, seed: int, points: int) -> dict[str, Any]:
    """``points`` kills of a writer at drawn stages; the committed reader's and the naive reader's view."""
    rng = random.Random(seed)
    stages = list(STAGES)
    order = [stages[i % len(stages)] for i in range(points)]  # every stage, then again, shuffled
    rng.shuffle(order)
    locations = {}
    for layout, config in LAYOUTS.items():
        locations[layout] = str(work_dir / f"crash-{layout}")
        shutil.rmtree(locations[layout], ignore_errors=True)
        EventLog.open(locations[layout], create=True, config=config)
    tails = {layout: _Tail(locations[layout], LAYOUTS[layout]) for layout in LAYOUTS}
    by_stage: Counter[str] = Counter()
    kinds_in_flight: Counter[str] = Counter()
    acked_lost, bad_exits, naive_saw = 0, [], []
    for i, stage in enumerate(order):
        layout = STAGES[stage][0]
        nth = rng.randint(1, NTH.get(stage, 12))
        limit = CHILD_LIMIT_S + rng.uniform(0, 0.3)
        read_fd, write_fd = os.pipe()
        child = FORK.Process(target=_writer_child, args=(locations[layout], layout, stage, nth, seed * 1000 + i,
                                                         write_fd), daemon=True)
        child.start()
        os.close(write_fd)
        started, hit = time.monotonic(), stage
        while child.is_alive():
            tails[layout].poll()  # the reader tails while the writer runs and dies
            if time.monotonic() - started > limit:
                hit = "timer (a drawn point not reached)"
                os.kill(child.pid, signal.SIGKILL)
            time.sleep(0.001)
        child.join(10)
        if child.exitcode != -signal.SIGKILL:
            bad_exits.append(f"{stage}: exit {child.exitcode}")
        announced, acked = None, 0
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
        for pos in range(0, len(data) - len(data) % 9, 9):
            value = int.from_bytes(data[pos + 1:pos + 9], "little")
            if data[pos:pos + 1] == b"A":
                announced = value
            else:
                acked = value
        if announced is not None:
            kinds_in_flight[EVENT_KINDS[announced % len(EVENT_KINDS)]] += 1
        by_stage[hit] += 1
        tails[layout].poll()
        if tails[layout].next_seq < acked:  # a commit that returned is gone
            acked_lost += acked - tails[layout].next_seq
        if layout == "packed" and (what := _naive_reader_sees(locations[layout], tails[layout].next_seq)):
            naive_saw.append(f"after '{hit}': {what}")
    recovered = {}
    for layout, location in locations.items():  # a fresh reader: every chunk checks, the same events
        log = EventLog.open(location, config=LAYOUTS[layout])
        log.verify()
        count = sum(log.counts().values())
        uncommitted_seen = max(0, tails[layout].next_seq - count)
        with log.writer("w", **ROUTING) as writer:  # the writer reopens by itself and continues
            resumed = writer.next_seq == count and writer.append(event_for(count)) == f"w:{count}"
        recovered[layout] = {"events": count, "uncommitted_seen": uncommitted_seen, "resumed": bool(resumed),
                             "equal": all(e == event_for(int(i.rsplit(":", 1)[1])) for i, e in log.events())}
    torn = [t for tail in tails.values() for t in tail.torn]
    return {
        "writer_crash_points": points,
        "crash_points_by_stage": dict(sorted(by_stage.items())),
        "crash_kinds_in_flight": dict(sorted(kinds_in_flight.items())),
        "event_kinds": len(EVENT_KINDS),
        "writer_bad_exits": bad_exits,
        "torn_reads": len(torn) + sum(r["uncommitted_seen"] for r in recovered.values()),
        "torn_examples": torn[:5],
        "reads_checked": sum(tail.reads_checked for tail in tails.values()),
        "acked_lost": acked_lost,
        "recovered": recovered,
        "naive_reader": {"crashes_checked": sum(1 for s in order if STAGES[s][0] == "packed"),
                         "saw_uncommitted_or_torn": len(naive_saw), "examples": naive_saw[:3]},
    }
