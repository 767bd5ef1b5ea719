"""Commit-record frames on a log directory: a damaged frame header is corruption, never "not written yet".

Found by `t1-actor chaos`'s bit flips (issue 23 part 2): with frames of ``[u32 length][u32 crc][record]``,
one flipped bit that made the last frame's length run past the end of the file read as a frame still
being appended, so its commit (and with it every event it made visible) silently disappeared, and the
next writer truncated it away for good. The frame header now carries its own checksum.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_helpers import EXPERTS, LAYERS, TINY_CHUNKS, K, sampler_turn

from storage import CorruptionError, EventLog

ROUTING = dict(routing_shape=(LAYERS, K), num_experts=EXPERTS)


def _log_with_commits(location: Path, commits: int) -> Path:
    log = EventLog.open(location, create=True, config=TINY_CHUNKS)
    with log.writer("w", **ROUTING) as writer:
        for seq in range(commits):
            writer.append(sampler_turn(seq))
            writer.commit()
    return location / "segments" / "w" / "commits.log"


def _frame_starts(data: bytes) -> list[int]:
    """Where each frame starts: after the file's magic, ``[u32 length][u32 crc][u32 header crc][record]``."""
    from storage._commits import FRAME_HEADER, MAGIC

    assert data.startswith(MAGIC)
    starts, pos = [], len(MAGIC)
    while pos < len(data):
        starts.append(pos)
        pos += FRAME_HEADER + int.from_bytes(data[pos:pos + 4], "little")
    return starts


@pytest.mark.parametrize("which", ["last", "middle"])
@pytest.mark.parametrize("bit", [0, 7, 12, 20])
def test_a_flipped_length_bit_is_named_not_taken_for_a_frame_in_progress(tmp_path, which, bit):
    commits = _log_with_commits(tmp_path / "log", 4)
    data = bytearray(commits.read_bytes())
    start = _frame_starts(bytes(data))[-1 if which == "last" else 1]
    data[start + bit // 8] ^= 1 << (bit % 8)  # the length field: bits 0-31 of the frame
    commits.write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match=r"segment 'w', array 'commits'.*frame header checksum mismatch"):
        EventLog.open(tmp_path / "log", config=TINY_CHUNKS).counts()
    with pytest.raises(CorruptionError):  # nor does a writer take it for a dead writer's tail and cut it off
        EventLog.open(tmp_path / "log", config=TINY_CHUNKS).writer("w", **ROUTING)
    assert commits.read_bytes() == bytes(data)


def test_every_bit_of_the_commit_file_is_covered(tmp_path):
    """Any single flipped bit of the file (magic, frame headers, records) raises CorruptionError."""
    commits = _log_with_commits(tmp_path / "log", 3)
    original = commits.read_bytes()
    for byte in range(len(original)):
        for bit in (0, 5):
            data = bytearray(original)
            data[byte] ^= 1 << bit
            commits.write_bytes(bytes(data))
            with pytest.raises(CorruptionError):
                EventLog.open(tmp_path / "log", config=TINY_CHUNKS).counts()
    commits.write_bytes(original)
    assert sum(EventLog.open(tmp_path / "log", config=TINY_CHUNKS).counts().values()) == 3


def test_a_frame_cut_short_by_a_killed_writer_is_still_just_not_there(tmp_path):
    commits = _log_with_commits(tmp_path / "log", 3)
    data = commits.read_bytes()
    last = _frame_starts(data)[-1]
    for cut in (last + 1, last + 11, last + 12, len(data) - 1):  # inside the header, inside the record
        commits.write_bytes(data[:cut])
        log = EventLog.open(tmp_path / "log", config=TINY_CHUNKS)
        assert sum(log.counts().values()) == 2
    with EventLog.open(tmp_path / "log", config=TINY_CHUNKS).writer("w", **ROUTING) as writer:
        assert writer.next_seq == 2  # the torn frame is cut off and the writer goes on
        writer.append(sampler_turn(2))
    assert sum(EventLog.open(tmp_path / "log", config=TINY_CHUNKS).counts().values()) == 3


def test_a_commit_file_of_the_old_framing_still_reads(tmp_path):
    """Logs written before the header checksum (no magic, 8-byte frame headers) read as before."""
    import google_crc32c

    commits = _log_with_commits(tmp_path / "log", 3)
    data = commits.read_bytes()
    old = b""
    for start in _frame_starts(data):
        length = int.from_bytes(data[start:start + 4], "little")
        record = data[start + 12:start + 12 + length]
        old += length.to_bytes(4, "little") + google_crc32c.value(record).to_bytes(4, "little") + record
    commits.write_bytes(old)
    log = EventLog.open(tmp_path / "log", config=TINY_CHUNKS)
    assert [e for _, e in log.events()] == [sampler_turn(i) for i in range(3)]
    with log.writer("w", **ROUTING) as writer:  # and a writer goes on in the old framing
        writer.append(sampler_turn(3))
    assert not commits.read_bytes().startswith(b"T1")
    reopened = EventLog.open(tmp_path / "log", config=TINY_CHUNKS)
    assert [e for _, e in reopened.events()] == [sampler_turn(i) for i in range(4)]
