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
    #       nursery.start_soon(w.acommit_periodically, 0.05)  # group commit: off a directory a commit costs
    #       a few store writes whatever its size, so batch events per commit (on a directory: one pwrite)

Layout and guarantees (details in ``_format.py``): one segment per writer id (an actor instance),
each a Zarr group of chunked append-only arrays — msgpack headers as uint8 bytes; token ids, masks,
logprobs by dtype; routing records ([tokens, layers, k] expert ids) as sets: each (token, layer)
selection stored as its combinatorial number in log2 C(E, k) bits and **read back sorted ascending
within the set** (``stored_routing``/``as_stored`` give that form; compare routing as sets). Logs of
format 2, ``routing_encoding="ids"`` and records that repeat an id keep one id per value, as given
(uint8 when E <= 256). Every other array reads back bit-exact as appended. On a directory
the store is a ``PackedStore`` (a zarr LocalStore that keeps each uncompressed array's chunks back to
back in one file, ``<array>/c/packed``): writers ``pwrite`` rows there as they are appended and
append commit records to one framed file per segment, which runs at raw-file speed. On any other
store (fsspec, memory) writers keep the unfinished chunk in memory, write whole chunks only, the
padded tail chunk at commit, and a commit record per key. Either way the commit record is written
last and readers trust commit records only, so they never see half an event; a writer killed at
any instant loses only its uncommitted tail and a reopened writer resumes from the last commit.
Checksums are CRC-32C: commit records carry those of the header chunks, each event header those of
its payloads (one per chunk a payload touches), so a mismatch names segment, array and chunk.
On a LocalStore an flock enforces one live writer per segment. By default commits survive a killed
process, not a power cut; ``StorageConfig(fsync=True)`` fsyncs data and commit records on a
directory. Errors: ``EventRejected`` (bad event, log unchanged), ``CorruptionError`` (.segment,
.array, .chunk), ``WriterBusy``, ``LogNotFound``, ``DiskFull`` (ENOSPC: the writer stops, what
is committed is intact), all ``LogError``. Readers keep a small index per
event (time, kind, trial id) and decode headers and payloads on demand; consecutive events are read
together (one read per array, up to ``read_block_bytes``) and their arrays share that block.
"""

from storage._cursor import Cursor
from storage._log import EventLog, log_exists, parse_event_id
from storage._routing import as_stored, stored_routing
from storage._writer import SegmentWriter
from storage.config import StorageConfig
from storage.errors import CorruptionError, DiskFull, EventRejected, LogError, LogNotFound, WriterBusy

__all__ = ["EventLog", "SegmentWriter", "Cursor", "StorageConfig", "parse_event_id", "log_exists",
           "as_stored", "stored_routing",
           "LogError", "LogNotFound", "WriterBusy", "EventRejected", "CorruptionError", "DiskFull"]
