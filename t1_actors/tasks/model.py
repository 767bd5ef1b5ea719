"""The task model: one pydantic ``Task`` whatever format it came from.

A task is an instruction for the agent, the environment it works in (a working directory, files laid
down at absolute paths, setup commands, env vars, and for Terminal-Bench / Harbor tasks the Dockerfile
to replay), an oracle solution (the whole script, and the same work as one shell command per agent
turn, which SFT warm start imitates), the task's own pytest tests with their dependencies, and limits.

Paths inside the sandbox are absolute (``/app/data.txt``), like Terminal-Bench. The tests are laid
down under ``TESTS_DIR`` by the verifier only, never during the agent's turns.
"""

from __future__ import annotations

import posixpath
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

TESTS_DIR = "/tests"  # where the verifier mounts a task's tests (Terminal-Bench's $TEST_DIR)
DEFAULT_WORKDIR = "/app"  # the t-bench base images' WORKDIR

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SourceFormat = Literal["t1", "terminal-bench", "harbor", "synthetic"]
Split = Literal["train", "eval"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _absolute(path: str, what: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{what} {path!r} must be an absolute path inside the sandbox, e.g. /app/{path}")
    normal = posixpath.normpath(path)
    if normal != path or "/../" in f"{path}/":
        raise ValueError(f"{what} {path!r} is not normalised; write it as {normal!r}")
    return path


def _relative(path: str, what: str) -> str:
    normal = posixpath.normpath(path)
    if path.startswith("/") or normal != path or normal.startswith(".."):
        raise ValueError(f"{what} {path!r} must be a plain relative path (no leading '/', no '..')")
    return path


class FileSpec(_Frozen):
    """A file laid down before the agent's first turn. Text or bytes; ``mode`` as an octal int."""

    content: str | bytes
    mode: int = Field(0o644, ge=0, le=0o7777)

    @property
    def data(self) -> bytes:
        return self.content.encode() if isinstance(self.content, str) else self.content


class Environment(_Frozen):
    """Where the agent works. Laid down in this order: Dockerfile replay, ``files``, ``setup``."""

    workdir: str = DEFAULT_WORKDIR
    files: dict[str, FileSpec] = {}  # absolute path -> file
    setup: list[str] = []  # shell commands run as root (through /bin/sh) after the files are down
    env: dict[str, str] = {}
    dockerfile: str | None = None  # Terminal-Bench / Harbor: the Dockerfile text to replay
    base_image: str | None = None  # its FROM, noted (the local sandbox cannot pull images)
    context_dir: str | None = None  # host directory COPY/ADD read from (the Docker build context)

    @field_validator("workdir")
    @classmethod
    def _workdir_absolute(cls, value: str) -> str:
        return _absolute(value, "workdir")

    @field_validator("files")
    @classmethod
    def _files_absolute(cls, value: dict[str, FileSpec]) -> dict[str, FileSpec]:
        for path in value:
            _absolute(path, "environment file")
        return value


class Oracle(_Frozen):
    """The reference solution: the script, and the same work as one shell command per agent turn."""

    script: str
    commands: list[str] = []  # empty for tasks whose solution is not split into turns (most TB tasks)
    # Harbor puts the whole solution/ directory at /solution (solve.sh may run `cp /solution/x.py ...`):
    # ``directory`` is that mount point, ``files`` the directory's other files (relative path -> content).
    directory: str | None = None
    files: dict[str, str | bytes] = {}

    @field_validator("commands")
    @classmethod
    def _no_empty_command(cls, value: list[str]) -> list[str]:
        for i, command in enumerate(value):
            if not command.strip():
                raise ValueError(f"oracle command {i} is empty; drop it or write the command")
        return value

    @field_validator("files")
    @classmethod
    def _relative_files(cls, value: dict[str, str | bytes]) -> dict[str, str | bytes]:
        for path in value:
            _relative(path, "solution file")
        return value

    def layout(self, default_script_path: str) -> tuple[str, dict[str, bytes]]:
        """(where the script goes in the sandbox, every file to write there: absolute path -> bytes).

        With a ``directory`` the script and its files land in it as the format's harness lays them
        (Harbor: ``/solution/solve.sh`` beside ``/solution/*``); without, the script alone at the default."""
        if self.directory is None:
            return default_script_path, {default_script_path: self.script.encode()}
        script_path = posixpath.join(self.directory, "solve.sh")
        files = {posixpath.join(self.directory, name): body.encode() if isinstance(body, str) else body
                 for name, body in self.files.items()}
        files[script_path] = self.script.encode()
        return script_path, files


class Tests(_Frozen):
    """The task's own pytest tests, laid down under ``TESTS_DIR`` at verification time only."""

    files: dict[str, str | bytes]  # path relative to TESTS_DIR -> content
    targets: list[str] = []  # files (relative to TESTS_DIR) pytest runs; empty: pytest's own discovery
    dependencies: list[str] = []  # pip requirements the tests import (installed in the verifier's env)
    env: dict[str, str] = {}
    script: str | None = None  # the format's own runner (run-tests.sh / test.sh), kept for reference

    @field_validator("files")
    @classmethod
    def _some_test_file(cls, value: dict[str, str | bytes]) -> dict[str, str | bytes]:
        if not value:
            raise ValueError("a task needs at least one test file (a pytest file such as test_outputs.py)")
        for path in value:
            _relative(path, "test file")
        return value

    @model_validator(mode="after")
    def _targets_exist(self) -> Tests:
        for target in self.targets:
            if target not in self.files:
                raise ValueError(f"test target {target!r} is not among the test files {sorted(self.files)}")
        return self

    @property
    def command(self) -> str:
        """The pytest command line, as it reads inside the sandbox."""
        paths = [posixpath.join(TESTS_DIR, t) for t in self.targets] or [TESTS_DIR]
        return " ".join(["pytest", "-rA", *paths])


class Limits(_Frozen):
    """Budgets of one trial. Defaults suit the tiny embedded run."""

    command_timeout_s: float = Field(10.0, gt=0)  # wall clock of one tool call
    max_turns: int = Field(8, gt=0)
    agent_timeout_s: float = Field(120.0, gt=0)  # the whole trial
    verifier_timeout_s: float = Field(60.0, gt=0)
    build_timeout_s: float = Field(600.0, gt=0)  # Dockerfile replay and setup
    memory_mb: int = Field(1024, gt=0)
    cpus: float = Field(1.0, gt=0)
    max_output_bytes: int = Field(64 * 1024, gt=0)  # per stream of one tool call, then truncated


class Task(_Frozen):
    """One task, in whatever format it was written."""

    id: str
    family: str  # synthetic family tag, or the source benchmark's category
    split: Split = "eval"
    instruction: str
    environment: Environment = Environment()
    oracle: Oracle | None = None  # Harbor makes the solution optional; SFT and `run-task --oracle` need it
    tests: Tests
    limits: Limits = Limits()
    source_format: SourceFormat = "t1"
    metadata: dict[str, str | int | float | bool | list[str]] = {}  # difficulty, tags, author, ...

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError(f"task id {value!r} must match {_ID.pattern} (letters, digits, '.', '_', '-')")
        return value

    @field_validator("instruction")
    @classmethod
    def _instruction_given(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("instruction is empty; say what the agent must do")
        return value

    @property
    def oracle_commands(self) -> list[str]:
        return list(self.oracle.commands) if self.oracle else []


def oracle_trajectory(task: Task) -> list[str]:
    """The oracle as one shell command per agent turn, for SFT warm start.

    Tasks without a split oracle get their whole script as a single turn.
    """
    if task.oracle is None:
        raise ValueError(f"task {task.id!r} has no oracle solution (Harbor: add solution/solve.sh)")
    if task.oracle.commands:
        return list(task.oracle.commands)
    return [task.oracle.script.strip()]
