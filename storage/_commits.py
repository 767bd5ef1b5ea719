"""Where a segment's commit records live: one key per record (any zarr store), or one append-only
file per segment on a log directory (``PackedStore``).

A key per record relies on the store replacing keys atomically. On a directory that costs a file
creation and a rename per commit (~0.1-0.3 ms, more than the rest of a commit); appending the record
to one file costs one ``pwrite``. It is just as atomic for readers: the file starts with ``MAGIC`` and
each record is framed as ``[u32 length][u32 crc32c(record)][u32 crc32c(the 8 bytes before)][record]``;
readers take only whole frames before the end of the file. A buffered append becomes visible page by
page, each page's bytes before the file size that covers them, so a reader sees a prefix of the file,
never a torn frame inside it; a frame cut short (a writer killed mid-append) is simply not there yet,
and the next writer cuts it off. A whole frame whose checksum fails is corruption, and is named as such.

The frame header's own checksum is what tells a frame cut short from a damaged one: without it a
flipped bit that lengthens a frame past the end of the file reads as a frame still being written, its
commit and every later one silently vanish, and the next writer cuts them off for good (found by
``t1-actor chaos``'s bit flips). Files written before it (no magic, ``[u32 length][u32 crc32c]``
frames) are read and appended to in their own framing; there a length past ``MAX_RECORD`` is named
as damage, a smaller one cannot be told from a frame in progress.
"""

from __future__ import annotations

import os
import weakref

import google_crc32c
from zarr.abc.store import Store

from storage import _store
from storage._format import COMMIT_BATCH, commit_key, segment_dir
from storage._lease import conditional_put, is_s3
from storage._packed import PackedStore, pwrite_all
from storage.errors import CorruptionError, WriterBusy

COMMIT_FILE = "commits.log"
MAGIC = b"T1cmts\x02\n"  # the file's first bytes: frames with a header checksum (framing 2)
FRAME_HEADER = 12  # u32 length, u32 crc32c of the record, u32 crc32c of those 8 bytes; little endian
_OLD_FRAME = 8  # framing 1 (no magic): u32 length, u32 crc32c
MAX_RECORD = 1 << 26  # a commit record is a few KB: a longer frame is a damaged length


class KeyCommits:
    """Commit records as ``segments/<writer>/commits/<seq>`` keys, fetched in batches."""

    def __init__(self, store: Store, writer_id: str):
        self._store, self.writer_id = store, writer_id
        self.count = 0  # records read (reader) or present (writer)

    def read_new(self) -> list[bytes]:
        """Records written since the last call (in order)."""
        found: list[bytes] = []
        batch = 1  # an idle segment costs one lookup per refresh; a busy one is fetched in batches
        while True:
            keys = [commit_key(self.writer_id, self.count + len(found) + i) for i in range(batch)]
            blobs = _store.get_many(self._store, keys)
            for blob in blobs:
                if blob is None:
                    self.count += len(found)
                    return found
                found.append(blob)
            batch = COMMIT_BATCH

    def append(self, record: bytes) -> list[str]:
        """Write the next record; returns the keys to fsync. On S3 the record is created only if absent:
        two writers of one segment can never both commit record n."""
        key = commit_key(self.writer_id, self.count)
        if is_s3(self._store):
            try:
                conditional_put(self._store, key, record)
            except FileExistsError:
                raise WriterBusy(f"segment {self.writer_id!r}: commit record {self.count} was written by another "
                                 "writer of this segment; this writer stops (one writer per segment)") from None
        else:
            _store.put(self._store, key, record)
        self.count += 1
        return [key]

    def fsync(self) -> None:
        pass  # the keys append returned are synced by the writer

    def close(self) -> None:
        pass


class FileCommits:
    """Commit records appended to ``segments/<writer>/commits.log`` (a ``PackedStore`` directory)."""

    def __init__(self, store: PackedStore, writer_id: str):
        self.writer_id = writer_id
        self.path = os.path.join(store.root, segment_dir(writer_id), COMMIT_FILE)
        self.count = 0
        self.offset = 0  # end of the last whole frame read (or of the magic)
        self.framing: int | None = None  # 2: MAGIC and header checksums; 1: the file predates them
        self._fd: int | None = None
        self._writable = False
        self._dir_synced = False

    def _open(self, write: bool) -> int | None:
        if self._fd is not None and (self._writable or not write):
            return self._fd
        if write:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT if write else os.O_RDONLY, 0o644)
        except (FileNotFoundError, NotADirectoryError):
            if write:
                raise
            return None  # no commit yet
        self.close()
        self._fd, self._writable = fd, write
        self._closer = weakref.finalize(self, os.close, fd)
        return fd

    def read_new(self) -> list[bytes]:
        fd = self._open(False) if self._fd is None else self._fd
        if fd is None:
            return []
        size = os.fstat(fd).st_size
        data = os.pread(fd, size - self.offset, self.offset) if size > self.offset else b""
        pos = 0
        if self.framing is None:
            if data[:len(MAGIC)] == MAGIC:
                self.framing, pos = 2, len(MAGIC)
            elif MAGIC.startswith(data):
                return []  # empty, or the first append under way
            else:
                self.framing = 1
        header = FRAME_HEADER if self.framing == 2 else _OLD_FRAME
        found: list[bytes] = []
        while pos + header <= len(data):
            length = int.from_bytes(data[pos:pos + 4], "little")
            where = f"commit record {self.count + len(found)}: frame at byte {self.offset + pos} of {self.path}"
            if self.framing == 2 and (google_crc32c.value(data[pos:pos + 8])
                                      != int.from_bytes(data[pos + 8:pos + 12], "little")):
                raise CorruptionError(self.writer_id, "commits", None, f"{where}: frame header checksum mismatch")
            if length > MAX_RECORD:
                raise CorruptionError(self.writer_id, "commits", None, f"{where}: length {length} is no commit "
                                      "record's (a damaged frame header)")
            if pos + header + length > len(data):
                break  # being appended (or cut short by a killed writer): not committed yet
            record = data[pos + header:pos + header + length]
            if google_crc32c.value(record) != int.from_bytes(data[pos + 4:pos + 8], "little"):
                raise CorruptionError(self.writer_id, "commits", None, f"{where}: frame checksum mismatch")
            found.append(record)
            pos += header + length
        self.offset += pos
        self.count += len(found)
        return found

    def append(self, record: bytes) -> list[str]:
        fd = self._open(True)
        assert fd is not None  # opening to write creates the file or raises
        if self.offset == 0:
            self.framing = 2  # nothing whole in the file yet: it starts (again) in the current framing
        if os.fstat(fd).st_size != self.offset:
            os.ftruncate(fd, self.offset)  # a frame a killed writer left half-written
        crc = len(record).to_bytes(4, "little") + google_crc32c.value(record).to_bytes(4, "little")
        if self.framing == 2:
            frame = (MAGIC if self.offset == 0 else b"") + crc + google_crc32c.value(crc).to_bytes(4, "little") + record
        else:
            frame = crc + record
        pwrite_all(fd, frame, self.offset)
        self.offset += len(frame)
        self.count += 1
        return []

    def fsync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            if not self._dir_synced:  # the file's directory entry, once
                _store.fsync_path(os.path.dirname(self.path), os.O_RDONLY | os.O_DIRECTORY)
                self._dir_synced = True

    def close(self) -> None:
        if self._fd is not None:
            self._closer()
            self._fd = None


def commit_channel(store: Store, writer_id: str) -> KeyCommits | FileCommits:
    return FileCommits(store, writer_id) if isinstance(store, PackedStore) else KeyCommits(store, writer_id)
