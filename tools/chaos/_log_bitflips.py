"""Bit flips in the committed log (part 2, 3.): one bit of a committed file flipped, then a fresh ``verify()``.

``bit_flips`` guarantees that every flip is undone before it returns (the log verifies clean after), and
reports each flip ``verify()`` missed, split by whether a reader then got the events as written or changed
data; its positive control reads the same flips with the checksum checks switched off.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from storage import CorruptionError, EventLog, StorageConfig
from storage._format import segment_dir
from storage._reader import SegmentReader
from tools.chaos._events import EVENT_KINDS, ROUTING, event_for
from tools.chaos._log_layouts import LAYOUTS


def _committed_files(location: Path, config: StorageConfig) -> list[tuple[Path, str, Any]]:
    """(file, array, chunk or a function offset -> chunk) of every committed data file of segment w."""
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
