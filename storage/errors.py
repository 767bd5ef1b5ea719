"""Errors of the event log. Each names the segment (writer id), the array and the chunk it concerns."""

from __future__ import annotations


class LogError(Exception):
    """Base of every event-log error."""


class LogNotFound(LogError):
    """No event log at the given location (and ``create`` was not asked)."""


class WriterBusy(LogError):
    """Another live writer holds this segment (one writer per segment; a dead one frees it)."""


class EventRejected(LogError, ValueError):
    """An event could not be appended; the log is unchanged. Names the event type and field."""

    def __init__(self, kind: str, field: str | None, problem: str):
        self.kind = kind
        self.field = field
        self.problem = problem
        where = f"{kind}.{field}" if field else kind
        super().__init__(f"event rejected, log unchanged: {where}: {problem}")


class CorruptionError(LogError):
    """Committed bytes no longer match their checksum (or a commit record is unreadable)."""

    def __init__(self, segment: str, array: str, chunk: int | None, problem: str):
        self.segment = segment
        self.array = array
        self.chunk = chunk
        self.problem = problem
        where = f"segment {segment!r}, array {array!r}" + (f", chunk {chunk}" if chunk is not None else "")
        super().__init__(f"corrupt event log: {where}: {problem}")


class DiskFull(LogError, OSError):
    """The log's file system refused a write (ENOSPC). Nothing committed is touched: a commit record is
    written last, and a reader ignores a cut-short frame. The writer stops (every later call is refused);
    once there is room, a reopened writer resumes from the last commit. Names the segment and the stage
    (``"append"``: rows or chunks; ``"commit"``: the commit's chunks or its record)."""

    def __init__(self, segment: str, stage: str, commits: int, problem: str):
        self.segment = segment
        self.stage = stage
        self.message = (f"event log full: segment {segment!r}, during {stage}: {problem}; the {commits} commits "
                        f"before are intact; this writer stops: free space, then reopen log.writer({segment!r}) "
                        "to resume from the last commit")
        OSError.__init__(self, 28, self.message)

    def __str__(self) -> str:
        return self.message
