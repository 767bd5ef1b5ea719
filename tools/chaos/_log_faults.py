"""Issue 23 part 2, the log: the writer killed at injected points, a full disk, flipped bytes.

``log_faults(work_dir, seed=..., crash_points=200, bitflips=300)`` returns the report's keys:

1. **Crash points.** A writer process (forked) appends events of every kind (``_events.event_for``:
   event ``seq`` is a function of ``seq``), committing every 1-3, and SIGKILLs itself at an injected
   point of an append: before, halfway through or after the ``pwrite`` of rows, of a commit record
   (the frame cut in half), a block reservation (``fallocate``), a truncation of a dead writer's tail
   (recovery), or, on the compressed layout (one file per chunk), between the chunk files of one
   write. Where the drawn point is never reached the parent kills it at a drawn instant instead
   (``timer``). Each kill point is drawn from the seed. While it runs, the parent tails the log with a
   cursor: every event read must be the next of its segment and equal, bit for bit, to the event of
   that seq (``torn_reads`` counts those that are not, and reads that raise); every commit the writer
   acknowledged (``commit()`` returned) must still be there after the kill (``acked_lost``); at the
   end a fresh reader checks every chunk, sees exactly what the cursor saw (nothing read was
   uncommitted) and a reopened writer continues from there.
2. **Full disk.** The log on a small tmpfs mounted for the run (root only; otherwise ``not_tested``),
   a filler file taking most of it: append and commit until the disk refuses. The error must be a
   ``DiskFull`` naming the segment; every event committed before must read back; later appends are
   refused with the reason; once the filler is gone a reopened writer resumes from the last commit.
3. **Bit flips.** One bit flipped at a random byte of a committed file (every array's pack file,
   compressed chunk files, the commit records), then a fresh ``verify()``: each must raise
   ``CorruptionError`` naming the segment, the array and the chunk the byte lies in. One it misses is
   told apart by what a reader then gets: the events as written (``bitflips_undetected`` counts both;
   on the compressed layout a flip in the zero padding of a tail chunk, or in a codec header byte the
   decoder ignores, changes no committed row) or changed data (``bitflips_undetected_data_changed``).

Positive controls (the audit can fail): a reader that ignores commit records (it parses the header
file up to its end) sees events never committed or torn after the same kills; the same bit flips read
with the checksum checks switched off come back as wrong events, unnoticed.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack

import storage._commits
import storage._store
import storage._streams
from storage import CorruptionError, EventLog, LogError, StorageConfig
from storage.errors import DiskFull
from tools.chaos._events import EVENT_KINDS, ROUTING, event_for

FORK = multiprocessing.get_context("fork")  # a forked writer starts in milliseconds: 200 kills stay cheap
TINY = dict(routing_chunk_bytes=1024, vector_chunk_bytes=1024, header_chunk_bytes=1024, cache_chunks=4,
            readahead_chunks=3, read_block_bytes=4096, reserve_min_bytes=128)
LAYOUTS = {"packed": StorageConfig(**TINY), "chunked": StorageConfig(**TINY, codec="lz4")}

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


# ---- a full disk -----------------------------------------------------------------------------------

def _mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a small tmpfs at ``where``; the reason it could not be, or None."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "mounting a small file system needs root (this process is not)"
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                            capture_output=True, text=True)
    return None if result.returncode == 0 else f"mount -t tmpfs failed: {result.stderr.strip()}"


def full_disk(work_dir: Path, *, seed: int, rounds: int = 6) -> dict[str, Any]:
    """Fill a 4 MiB tmpfs with the log ``rounds`` times (different slack each time, so the disk runs out
    in rows, in chunk files or in a commit record)."""
    mount = work_dir / "small-fs"
    reason = _mount_tmpfs(mount, "4m")
    if reason is not None:
        return {"not_tested": reason}
    rng = random.Random(seed)
    try:
        lost, errors, stages, outcomes = 0, Counter(), Counter(), []
        committed_total = 0
        for r in range(rounds):
            layout = "packed" if r % 2 == 0 else "chunked"
            config = LAYOUTS[layout]
            location = mount / f"log-{r}"
            filler = mount / "filler"
            free = shutil.disk_usage(mount).free
            filler.write_bytes(b"\0" * max(0, free - rng.randint(64 << 10, 1 << 20)))
            log = EventLog.open(location, create=True, config=config)
            writer = log.writer("w", **ROUTING)
            acked, error = 0, None
            try:
                while True:
                    for _ in range(rng.randint(1, 3)):
                        writer.append(event_for(writer.next_seq))
                    writer.commit()
                    acked = writer.next_seq
            except LogError as exc:
                error = exc
            errors[type(error).__name__] += 1
            if isinstance(error, DiskFull):
                stages[error.stage] += 1
            try:
                writer.append(event_for(writer.next_seq))
                refused_after = False
            except LogError as exc:
                refused_after = "failed earlier" in str(exc)
            writer.abandon()
            read_back = EventLog.open(location, config=config)
            events = [(i, e) for i, e in read_back.events()]
            intact = len(events) >= acked and all(e == event_for(int(i.rsplit(":", 1)[1])) for i, e in events)
            lost += max(0, acked - len(events))
            filler.unlink()
            with read_back.writer("w", **ROUTING) as again:
                resumed = again.next_seq == len(events)
                again.append(event_for(again.next_seq))
            read_back.verify()
            committed_total += acked
            outcomes.append({"layout": layout, "committed_before": acked, "error": str(error)[:200],
                             "later_append_refused": refused_after, "read_back_intact": intact,
                             "resumed_after_space_freed": resumed})
            shutil.rmtree(location)
        return {"enospc_rounds": rounds, "enospc_committed_checked": committed_total, "enospc_lost_committed": lost,
                "enospc_errors": dict(errors), "enospc_stages": dict(stages), "enospc_outcomes": outcomes}
    finally:  # lazily if a reader of this process still holds a file there: detached now, freed on close
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)


# ---- bit flips -------------------------------------------------------------------------------------

def _committed_files(location: Path, config: StorageConfig) -> list[tuple[Path, str, Any]]:
    """(file, array, chunk or a function offset -> chunk) of every committed data file of segment w."""
    from storage._format import segment_dir

    seg = location / segment_dir("w")
    out: list[tuple[Path, str, Any]] = [(seg / "commits.log", "commits", None)]
    for array_dir in sorted(p for p in seg.iterdir() if p.is_dir()):
        packed = array_dir / "c" / "packed"
        if packed.exists():
            if not packed.stat().st_size:  # an array no event used yet (routing_sets when no record was a set)
                continue
            chunk_bytes = EventLog.open(location, config=config).store.pack_file(
                f"{segment_dir('w')}/{array_dir.name}").chunk_bytes
            out.append((packed, array_dir.name, lambda off, cb=chunk_bytes: off // cb))
        else:
            for chunk_file in sorted((array_dir / "c").rglob("*")):
                if chunk_file.is_file():
                    out.append((chunk_file, array_dir.name, int(chunk_file.relative_to(array_dir / "c").parts[0])))
    return out


def bit_flips(work_dir: Path, *, seed: int, flips: int, controls: int = 20) -> dict[str, Any]:
    """``flips`` single-bit flips in committed files, each checked by a fresh ``verify()``."""
    from storage._reader import SegmentReader

    rng = random.Random(seed)
    logs = {}
    for layout, config in LAYOUTS.items():
        location = work_dir / f"bits-{layout}"
        shutil.rmtree(location, ignore_errors=True)
        log = EventLog.open(location, create=True, config=config)
        with log.writer("w", **ROUTING) as writer:
            for seq in range(3 * len(EVENT_KINDS)):
                writer.append(event_for(seq))
                if seq % 2:
                    writer.commit()
        logs[layout] = (location, config, _committed_files(location, config))
    undetected, undetected_intact, misnamed, by_array = [], [], [], Counter()
    controls_tried = controls_unnoticed = 0
    for i in range(flips):
        layout = list(LAYOUTS)[i % len(LAYOUTS)]
        location, config, files = logs[layout]
        path, array, chunk_of = rng.choice(files)
        data = bytearray(path.read_bytes())
        offset = rng.randrange(len(data))
        data[offset] ^= 1 << rng.randrange(8)
        original = path.read_bytes()
        path.write_bytes(bytes(data))
        chunk = chunk_of(offset) if callable(chunk_of) else chunk_of
        where = f"{layout} {array} chunk {chunk} byte {offset}"
        by_array[f"{layout} {array}"] += 1
        try:
            try:
                fresh = EventLog.open(location, config=config)
                fresh.verify()
                intact = all(e == event_for(int(eid.rsplit(":", 1)[1])) for eid, e in fresh.events())
                (undetected_intact if intact else undetected).append(where)
            except CorruptionError as exc:
                if (exc.segment, exc.array) != ("w", array) or (array != "commits" and exc.chunk != chunk):
                    misnamed.append(f"{where}: named {exc.segment!r} {exc.array!r} chunk {exc.chunk}")
            if controls_tried < controls and layout == "packed" and array not in ("commits", "headers"):
                controls_tried += 1  # the same flip, read with the checks off: wrong events, no error
                checks = SegmentReader._check, SegmentReader.check_pieces
                SegmentReader._check = lambda *a, **k: None
                SegmentReader.check_pieces = lambda self, name, offset, rows, pieces: []
                try:
                    events = list(EventLog.open(location, config=config).events())
                    if any(e != event_for(int(eid.rsplit(":", 1)[1])) for eid, e in events):
                        controls_unnoticed += 1
                except Exception:
                    pass  # noticed after all (an unreadable value): the control did not succeed
                finally:
                    SegmentReader._check, SegmentReader.check_pieces = checks
        finally:
            path.write_bytes(original)
    for location, config, _ in logs.values():
        EventLog.open(location, config=config).verify()  # every flip was undone
    return {"bitflips_tried": flips, "bitflips_undetected": len(undetected) + len(undetected_intact),
            "bitflips_undetected_data_changed": len(undetected), "bitflips_misnamed": len(misnamed),
            "bitflips_undetected_by_layout": {layout: sum(w.startswith(layout + " ") for w in undetected + undetected_intact)
                                              for layout in LAYOUTS},
            "bitflips_by_array": dict(sorted(by_array.items())),
            "bitflip_examples": (undetected + misnamed + undetected_intact)[:6],
            "checksums_off": {"tried": controls_tried, "unnoticed": controls_unnoticed}}


def log_faults(work_dir: Path, *, seed: int = 0, crash_points: int = 200, bitflips: int = 300,
               say=lambda line: None) -> dict[str, Any]:
    """Part 2's report keys (``not_tested`` entries for what this machine cannot do)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    say(f"chaos log: {crash_points} writer crash points")
    crashes = crash_sweep(work_dir, seed=seed, points=crash_points)
    say("chaos log: a full disk")
    disk = full_disk(work_dir, seed=seed)
    say(f"chaos log: {bitflips} bit flips")
    flips = bit_flips(work_dir, seed=seed, flips=bitflips)
    not_tested = []
    if "not_tested" in disk:
        not_tested.append({"key": "enospc_lost_committed", "reason": disk.pop("not_tested")})
    controls = {"naive reader sees uncommitted or torn events": crashes["naive_reader"]["saw_uncommitted_or_torn"] > 0,
                "a flip read with checksums off goes unnoticed": flips["checksums_off"]["unnoticed"] > 0}
    return {**crashes, **disk, **flips, "log_positive_controls": controls, "log_not_tested": not_tested}
