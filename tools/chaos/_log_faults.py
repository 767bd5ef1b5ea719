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

from pathlib import Path
from typing import Any

from tools.chaos._log_bitflips import bit_flips
from tools.chaos._log_crashes import crash_sweep
from tools.chaos._log_disk import full_disk


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
