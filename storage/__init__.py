"""The t1 event log: append-only, immutable events on Zarr v3 — the run's source of truth.

Public face::

    log = EventLog.open(path_or_url_or_store, create=True)      # LocalStore dir, fsspec URL, any zarr Store
    with log.writer("sampler-0", routing_shape=(layers, k), num_experts=E) as w:
        event_id = w.append(event)   # "sampler-0:17"; validated, buffered (EventRejected: log unchanged)
        w.commit()                   # every appended event becomes visible at once
    log.get(event_id); log.by_trial(trial_id); log.events(kinds=None); log.fold(fn, init); log.counts()
    cur = log.cursor(saved_position, kinds=None); batch = cur.poll(); save(cur.position)  # exactly once
    log.verify()                     # every committed chunk against its checksum -> {segment: {array: chunks}}
    # trio: log = await EventLog.aopen(...); w = await log.awriter(...); await w.aappend(e) / w.acommit() /
    #       w.aclose(); await cur.apoll(); async for batch in cur.atail(): ...; await log.aget(...) / aby_trial /
    #       afold / acounts / averify   (all zarr I/O runs in worker threads, never on the trio loop)
    #       nursery.start_soon(w.acommit_periodically, 0.05)  # group commit: a commit costs a few store
    #       writes whatever its size, so batch events per commit (8 ms per-turn commits vs 0.5 ms at 16/commit)

Layout and guarantees (details in ``_format.py``): one segment per writer id (an actor instance),
each a Zarr group of chunked append-only arrays — msgpack headers as uint8 bytes; token ids, masks,
logprobs by dtype; routing as [tokens, layers, k] expert ids (uint8 when E <= 256). Writers keep the
unfinished chunk in memory and write whole chunks only; ``commit`` writes the padded tail chunk and
then a commit record carrying the crc32 of every chunk it (re)wrote. Readers trust commit records
only, so they never see half an event; a writer killed at any instant loses only its uncommitted
tail and a reopened writer resumes from the last commit. Needs a store that replaces keys atomically
(LocalStore, MemoryStore, object stores); on a LocalStore an flock enforces one live writer per
segment. By default commits survive a killed process, not a power cut; ``StorageConfig(fsync=True)``
fsyncs chunks and commit records on a LocalStore. Errors: ``EventRejected`` (bad event, log
unchanged), ``CorruptionError`` (.segment, .array, .chunk), ``WriterBusy``, ``LogNotFound``, all
``LogError``. Readers keep a small index per event (time, kind, trial id) and decode headers and
payloads on demand; events come back as fresh records owning their arrays.
"""

from ._cursor import Cursor
from ._log import EventLog, parse_event_id
from ._writer import SegmentWriter
from .config import StorageConfig
from .errors import CorruptionError, EventRejected, LogError, LogNotFound, WriterBusy

__all__ = ["EventLog", "SegmentWriter", "Cursor", "StorageConfig", "parse_event_id",
           "LogError", "LogNotFound", "WriterBusy", "EventRejected", "CorruptionError"]
