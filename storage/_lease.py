"""One writer per segment on an object store, without ``flock``: a lease object taken by conditional put.

S3 has no locks and no rename, but it has conditional writes: ``PutObject`` with ``If-None-Match: *``
creates a key only if it is absent, ``If-Match: ETAG`` replaces it only if nobody replaced it since.
A writer therefore holds ``segments/<writer>/writer.lease`` ({holder, pid, host, process, expires_at}):

- **acquire**: create the lease (``If-None-Match``). If one exists and has expired (its writer died or
  stalled past ``lease_s``), take it over with ``If-Match`` on the expired lease's ETag, so two writers
  racing for one stale lease cannot both win. A live lease refuses the writer (``WriterBusy``, naming the
  holder and when the lease expires). One exception: a holder that ran on this very machine and process
  namespace (the lease's ``process``: boot id, pid namespace, the pid's start time) and is gone (no such
  process, a zombie, or the pid now another process's) is dead for sure, and its lease is taken over the same
  way ``DEAD_HOLDER_GRACE_S`` after it was seen gone (requests it sent before dying may still be landing): a
  campaign killed whole and relaunched (``t1-actor launch --resume``) or an actor restarted
  by its supervisor does not wait ``lease_s`` for its own dead writers.
- **renew**: at the start of each commit, before any chunk is written, the writer replaces its lease with
  ``If-Match`` on its own last ETag and a new expiry. If that fails, another writer took the segment over
  (this one had stalled past its lease): the commit is refused (``WriterBusy``) and nothing of it is
  written, so the old writer's late events never become visible and its chunks never overwrite its
  successor's. Commit records are also created with ``If-None-Match``: two writers can never both commit
  record n.
- **release**: delete the lease (if still ours).

Guarantee: with clocks within ``lease_s / 3`` of each other, at most one writer's commits become visible
for each commit number, and a writer killed with ``kill -9`` frees its segment for its own machine within
``DEAD_HOLDER_GRACE_S``, ``lease_s`` later for any other. The
one window left: a writer that stalls for more than ``lease_s`` between its renewal and its chunk writes
of the same commit (microseconds apart) could overwrite a successor's chunk; the commit records'
checksums then name the damaged chunk (S3 has no fencing token that would refuse the write itself).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any, TypeGuard

from zarr.abc.store import Store
from zarr.core.sync import sync
from zarr.storage import FsspecStore

from storage.errors import LogError, WriterBusy

LEASE_FILE = "writer.lease"
DEFAULT_LEASE_S = 30.0
DEAD_HOLDER_GRACE_S = 2.0  # a dead holder's last PUTs, sent before it died, land within this (loopback: ms)


def is_s3(store: Store) -> TypeGuard[FsspecStore]:
    """An fsspec store over S3 (s3fs): where conditional puts replace the directory's ``flock``."""
    fs = getattr(store, "fs", None)
    protocol = getattr(fs, "protocol", ())
    return "s3" in (protocol if isinstance(protocol, (tuple, list)) else (protocol,))


def _bucket_key(store: FsspecStore, key: str) -> tuple[str, str]:
    path = f"{store.path.rstrip('/')}/{key}"
    bucket, _, rest = path.partition("/")
    return bucket, rest


def conditional_put(store: FsspecStore, key: str, data: bytes, *, if_match: str | None = None) -> str:
    """Put ``key`` only if absent (or, with ``if_match``, only if its ETag is that one); the new ETag.
    ``FileExistsError`` / ``PermissionError`` when the precondition does not hold."""
    bucket, name = _bucket_key(store, key)
    condition = {"IfMatch": if_match} if if_match else {"IfNoneMatch": "*"}
    try:
        reply = sync(store.fs._call_s3("put_object", Bucket=bucket, Key=name, Body=data, **condition))
    except FileExistsError:
        raise
    except OSError as exc:
        if "pre-condition" in str(exc).lower() or "precondition" in str(exc).lower():
            raise PermissionError(f"s3://{bucket}/{name} changed since ETag {if_match}") from None
        raise
    etag: str = reply["ETag"]
    return etag


def _process_identity(pid: int) -> str | None:
    """``boot id/pid namespace/pid/start time`` of a process of this machine, or None where it cannot be read
    (no /proc): the identity under which a lease's holder can be known dead from here."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
        fields = _stat_fields(pid)
    except OSError:
        return None
    return f"{boot}/{namespace}/{pid}/{fields[19]}"


def _stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name: state first, start time at index 19."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _holder_is_dead(lease: dict[str, Any], ours: str | None) -> bool:
    """The lease's writer ran in this machine's boot and pid namespace (those of ``ours``, this process's
    ``_process_identity``) and that process is gone: its pid names no process, a zombie (killed, not reaped
    yet) or a process started since (the pid reused)."""
    recorded, pid = lease.get("process"), lease.get("pid")
    if not isinstance(recorded, str) or not isinstance(pid, int):
        return False
    if ours is None or recorded.split("/")[:2] != ours.split("/")[:2]:
        return False  # another machine or namespace (or a boot ago, where the pid is surely gone: expiry decides)
    try:
        fields = _stat_fields(pid)  # read once: its state and start time
    except FileNotFoundError:
        return True
    except OSError:
        return False
    # boot and namespace match (above): the rest of the identity is the pid and its start time
    return fields[0] in ("Z", "X") or recorded.split("/")[2:] != [str(pid), fields[19]]


def _read(store: FsspecStore, key: str) -> tuple[dict[str, Any] | None, str | None]:
    bucket, name = _bucket_key(store, key)
    try:
        reply = sync(store.fs._call_s3("get_object", Bucket=bucket, Key=name))
        body = sync(reply["Body"].read())
    except FileNotFoundError:
        return None, None
    try:
        return json.loads(body), reply["ETag"]
    except ValueError:
        return {}, reply["ETag"]  # a torn or foreign object: treated as expired


class S3Lease:
    """The lease of one segment (see the module docstring)."""

    def __init__(self, store: FsspecStore, segment_dir: str, writer_id: str, lease_s: float = DEFAULT_LEASE_S):
        self.store, self.writer_id, self.lease_s = store, writer_id, lease_s
        self.key = f"{segment_dir}/{LEASE_FILE}"
        self.holder = uuid.uuid4().hex
        self.process = _process_identity(os.getpid())  # read once: the lease is rewritten at every commit
        self.etag: str | None = None
        self.renewed_at = 0.0
        self._acquire()

    def _body(self) -> bytes:
        now = time.time()
        return json.dumps({"holder": self.holder, "pid": os.getpid(), "host": socket.gethostname(),
                           "process": self.process, "expires_at": now + self.lease_s,
                           "renewed_at": now}).encode()

    def _acquire(self) -> None:
        try:
            self.etag = conditional_put(self.store, self.key, self._body())
        except FileExistsError:
            current, etag = _read(self.store, self.key)
            expires = float((current or {}).get("expires_at", 0.0))
            dead = current is not None and _holder_is_dead(current, self.process)
            if current is not None and expires > time.time() and not dead:
                raise WriterBusy(
                    f"segment {self.writer_id!r} is held by {current.get('host')}:{current.get('pid')} until its "
                    f"lease expires in {expires - time.time():.0f} s ({self.key}); give each actor instance its "
                    "own writer id, or wait for a killed writer's lease to expire") from None
            if dead and expires > time.time():
                time.sleep(max(0.0, min(DEAD_HOLDER_GRACE_S, expires - time.time())))
            try:  # expired, its holder dead, or vanished meanwhile: take it over, at most one of us wins
                self.etag = (conditional_put(self.store, self.key, self._body(), if_match=etag) if etag
                             else conditional_put(self.store, self.key, self._body()))
            except (FileExistsError, PermissionError):
                raise WriterBusy(f"segment {self.writer_id!r}: another writer took over its expired lease at "
                                 "the same moment; retry, or give each actor instance its own writer id") from None
        self.renewed_at = time.time()

    def renew(self) -> None:
        """Before a commit record: still ours, good for another ``lease_s``. Refuses when taken over."""
        try:
            self.etag = conditional_put(self.store, self.key, self._body(), if_match=self.etag)
        except (FileExistsError, PermissionError, FileNotFoundError):
            raise WriterBusy(f"segment {self.writer_id!r}: this writer's lease was taken over (it stalled past "
                             f"{self.lease_s:.0f} s); its uncommitted events are not visible; reopen the "
                             "writer") from None
        self.renewed_at = time.time()

    def release(self) -> None:
        current, etag = _read(self.store, self.key)
        if current is not None and current.get("holder") == self.holder:
            bucket, name = _bucket_key(self.store, self.key)
            try:
                sync(self.store.fs._call_s3("delete_object", Bucket=bucket, Key=name, IfMatch=etag))
            except OSError:
                pass  # replaced meanwhile: the new holder's now


def check_bucket(store: FsspecStore, url: str) -> None:
    """A clear error for a missing bucket, bad credentials or an unreachable endpoint, naming the URL."""
    bucket, _ = _bucket_key(store, "")
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or "AWS's default"
    try:
        sync(store.fs._call_s3("head_bucket", Bucket=bucket))
    except FileNotFoundError:
        raise LogError(f"{url}: bucket {bucket!r} does not exist at {endpoint}; create it first "
                       f"(e.g. aws s3 mb s3://{bucket})") from None
    except PermissionError as exc:
        raise LogError(f"{url}: access to bucket {bucket!r} at {endpoint} was refused ({exc}); check "
                       "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY") from None
    except Exception as exc:  # botocore's EndpointConnectionError, timeouts, ...: not OSErrors
        raise LogError(f"{url}: cannot reach the S3 endpoint {endpoint} ({type(exc).__name__}: {exc}); "
                       "check AWS_ENDPOINT_URL") from None
