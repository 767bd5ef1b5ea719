"""The narrow face every sandbox backend shows: open a trial's sandbox, exec tool calls, read/write files.

Sync on purpose: actors call it through ``trio.to_thread.run_sync``. A backend raises
``SandboxInfraError`` when its own machinery fails (a mount, a cgroup, an API call); a command that
fails, hangs, or blows a limit is a normal ``ExecResult`` and the task's business.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from t1_actors.tasks.model import Task


class SandboxInfraError(RuntimeError):
    """The sandbox infrastructure failed (not the task): never a task failure, never a reward of 0."""


@dataclass(frozen=True)
class ExecResult:
    """One tool call. ``killed_by`` names the limit that ended it: timeout, memory, cpu, pids, file_size, disk
    (the command failed with the trial's disk full)."""

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    killed_by: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class BuildReport:
    """What the environment replay did: the image it stood for and what it could not honour, by name."""

    base_image: str | None = None
    steps: int = 0
    unhonoured: list[str] = field(default_factory=list)
    cached: bool = False
    duration_s: float = 0.0


@runtime_checkable
class Sandbox(Protocol):
    trial_id: str
    build: BuildReport

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult: ...
    def read_file(self, path: str) -> bytes: ...
    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class SandboxBackend(Protocol):
    name: str

    def open(self, task: Task, trial_id: str) -> Sandbox: ...
    def close(self) -> None: ...
