"""The one error a malformed task raises: it names the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path


class TaskFormatError(ValueError):
    """A task directory could not be read. ``file`` and ``field`` say where; the message says the fix."""

    def __init__(self, file: str | Path, field: str | None, problem: str):
        self.file = str(file)
        self.field = field
        self.problem = problem
        where = f"{self.file}: field {field!r}" if field else self.file
        super().__init__(f"{where}: {problem}")
