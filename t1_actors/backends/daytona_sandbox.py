"""The Daytona sandbox backend: one Daytona sandbox per trial, through the Daytona SDK's sync client.

A sandbox is created from a snapshot (``snapshot``) or an image (the task's Dockerfile when it has one,
else ``image``) with ``network_block_all`` so the agent's turns have no network; the task's files are
uploaded and its setup commands run; each tool call is ``process.exec`` with a timeout; files go up and
down through the toolbox API; the sandbox is deleted on close, and on any failure while opening.

Daytona's ``process.exec`` returns one merged output stream: it comes back as ``stdout`` (``stderr`` is
empty), truncated at the task's output cap with the flag set. Errors of the Daytona API or transport are
``SandboxInfraError``; a command that times out is a normal result with ``timed_out``.
The API key is read from the environment variable named by ``api_key_env``, never from the config.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shlex
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from t1_actors.backends._sandbox.interface import BuildReport, ExecResult, SandboxInfraError
from t1_actors.backends._sandbox.remote_verify import ENV_READY_MARKER

if TYPE_CHECKING:
    from t1_actors.tasks.model import Task

__all__ = ["DaytonaSandboxConfig", "DaytonaSandboxBackend", "DaytonaSandbox"]


class DaytonaSandboxConfig(BaseModel):
    """The ``[sandbox.daytona]`` section of the run config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_url: str | None = Field(None, description="Daytona API URL (None: the SDK's default / DAYTONA_API_URL)")
    api_key_env: str = Field("DAYTONA_API_KEY", description="environment variable holding the API key")
    target: str | None = Field(None, description="Daytona region")
    snapshot: str | None = Field(None, description="create every sandbox from this snapshot (fastest)")
    image: str = Field("python:3.12-slim", description="image for tasks without a Dockerfile")
    create_timeout_s: float = Field(180.0, gt=0, description="time Daytona has to create a trial's sandbox; past it "
                                                            "the trial fails as an infrastructure error")
    delete_timeout_s: float = Field(60.0, gt=0, description="time Daytona has to delete a sandbox (on close, or "
                                                           "after a failed create)")
    auto_stop_minutes: int = Field(15, ge=0, description="Daytona stops a forgotten sandbox after this idle time")
    name_prefix: str = Field("t1-", description="sandbox names are prefix + trial id (make it unique per run)")
    state_by_polling: bool = Field(False, description="observe sandbox state by polling instead of the event stream")


class DaytonaSandboxBackend:
    name = "daytona"

    def __init__(self, config: DaytonaSandboxConfig | None = None):
        from daytona import Daytona, DaytonaConfig  # noqa: PLC0415 - optional extra (daytona)

        self.config = config or DaytonaSandboxConfig()
        api_key = os.environ.get(self.config.api_key_env)
        if not api_key:
            raise SandboxInfraError(f"the Daytona backend needs an API key in ${self.config.api_key_env}")
        try:
            self.client = Daytona(DaytonaConfig(api_key=api_key, api_url=self.config.api_url, target=self.config.target,
                                                use_deprecated_polling=self.config.state_by_polling or None))
        except Exception as exc:  # the SDK raises many kinds
            raise SandboxInfraError(f"cannot reach Daytona at {self.config.api_url or 'its default URL'}: {exc}") from exc
        self._open: dict[str, DaytonaSandbox] = {}
        self._lock = threading.Lock()

    def _params(self, task: Task, name: str) -> Any:
        from daytona import CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, Image, Resources  # noqa: PLC0415 - optional extra (daytona)

        common: dict[str, Any] = dict(name=name, network_block_all=True, env_vars=dict(task.environment.env),
                                      labels={"t1.task": task.id}, auto_stop_interval=self.config.auto_stop_minutes,
                                      auto_delete_interval=0)
        if self.config.snapshot:
            return CreateSandboxFromSnapshotParams(snapshot=self.config.snapshot, **common)
        image: Any = self.config.image
        environment = task.environment
        if environment.dockerfile is not None:
            context = Path(environment.context_dir) if environment.context_dir else None
            if context is not None and (context / "Dockerfile").is_file() \
                    and (context / "Dockerfile").read_text() == environment.dockerfile:
                image = Image.from_dockerfile(context / "Dockerfile")
            else:
                image = environment.base_image or self.config.image
        resources = Resources(cpu=max(1, math.ceil(task.limits.cpus)),
                              memory=max(1, math.ceil(task.limits.memory_mb / 1024)))
        return CreateSandboxFromImageParams(image=image, resources=resources, **common)

    def sandbox_name(self, trial_id: str) -> str:
        """The Daytona name of a trial's sandbox: stable, so another process (the verifier) can attach."""
        digest = hashlib.sha256(trial_id.encode()).hexdigest()[:10]
        return f"{self.config.name_prefix}{re.sub(r'[^a-z0-9-]', '-', trial_id.lower())[:40]}-{digest}"

    def attach(self, task: Task, trial_id: str) -> DaytonaSandbox:
        """The open sandbox of ``trial_id`` (created by any process); closing it detaches, never deletes."""
        try:
            remote = self.client.get(self.sandbox_name(trial_id))
        except Exception as exc:
            raise SandboxInfraError(f"no Daytona sandbox for trial {trial_id}: {exc}") from exc
        return DaytonaSandbox(self, task, trial_id, remote, BuildReport(task.environment.base_image), owned=False)

    def open(self, task: Task, trial_id: str) -> DaytonaSandbox:
        name = self.sandbox_name(trial_id)
        start = time.monotonic()
        try:
            remote = self.client.create(self._params(task, name), timeout=self.config.create_timeout_s)
        except Exception as exc:
            self._delete_by_name(name)
            raise SandboxInfraError(f"Daytona could not create the sandbox of trial {trial_id}: {exc}") from exc
        unhonoured = [] if task.environment.dockerfile is None or self.config.snapshot is None else [
            f"Dockerfile (the sandbox comes from snapshot {self.config.snapshot})"]
        sandbox = DaytonaSandbox(self, task, trial_id, remote,
                                 BuildReport(task.environment.base_image, 0, unhonoured, False, 0.0))
        try:
            sandbox.lay_down_environment()
        except BaseException:
            sandbox.close()
            raise
        sandbox.build = BuildReport(sandbox.build.base_image, len(task.environment.setup), unhonoured, False,
                                    time.monotonic() - start)
        with self._lock:
            self._open[name] = sandbox
        return sandbox

    def _delete_by_name(self, name: str) -> None:
        try:
            self.client.delete(self.client.get(name), timeout=self.config.delete_timeout_s)
        except Exception:  # nothing was created, or it is already gone
            pass

    def _forget(self, sandbox: DaytonaSandbox) -> None:
        with self._lock:
            self._open.pop(sandbox.remote.name, None)

    def close(self) -> None:
        with self._lock:
            sandboxes = list(self._open.values())
        for sandbox in sandboxes:
            sandbox.close()


class DaytonaSandbox:
    def __init__(self, backend: DaytonaSandboxBackend, task: Task, trial_id: str, remote: Any, build: BuildReport,
                 owned: bool = True):
        self.owned = owned  # False when attached: close() detaches and leaves the sandbox to its owner
        self.backend = backend
        self.task = task
        self.trial_id = trial_id
        self.remote = remote
        self.build = build
        self.workdir = task.environment.workdir
        self._closed = False

    def lay_down_environment(self) -> None:
        from daytona import FileUpload  # noqa: PLC0415 - optional extra (daytona)

        environment = self.task.environment
        self._call("mkdir", lambda: self.remote.process.exec(f"mkdir -p {shlex.quote(self.workdir)}", timeout=60))
        if environment.files:
            uploads = [FileUpload(source=spec.data, destination=path) for path, spec in environment.files.items()]
            self._call("upload", lambda: self.remote.fs.upload_files(uploads))
            modes = " && ".join(f"chmod {spec.mode:o} {shlex.quote(path)}" for path, spec in environment.files.items())
            self._checked(modes, "file modes")
        for i, command in enumerate(environment.setup):
            self._checked(command, f"setup command {i}", timeout_s=self.task.limits.build_timeout_s)
        self._checked(f"touch {ENV_READY_MARKER}", "environment marker")  # tamper scans look past it

    def _checked(self, command: str, what: str, timeout_s: float = 60) -> None:
        result = self.exec(command, timeout_s)
        if result.exit_code != 0:
            raise SandboxInfraError(f"task {self.task.id}: {what} exited {result.exit_code}: {result.stdout[-500:]}")

    def _call(self, what: str, fn):
        if self._closed:
            raise SandboxInfraError(f"sandbox of trial {self.trial_id} is closed")
        try:
            return fn()
        except Exception as exc:  # any API or transport failure is infrastructure
            raise SandboxInfraError(f"Daytona {what} failed for trial {self.trial_id}: {exc}") from exc

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        from daytona import DaytonaTimeoutError  # noqa: PLC0415 - optional extra (daytona)

        timeout = timeout_s or self.task.limits.command_timeout_s
        env = {k: v for k, v in self.task.environment.env.items()}
        start = time.monotonic()
        try:
            response = self._call("exec", lambda: self.remote.process.exec(
                command, cwd=self.workdir, env=env or None, timeout=max(1, math.ceil(timeout))))
        except SandboxInfraError as exc:
            if isinstance(exc.__cause__, DaytonaTimeoutError):
                return ExecResult(124, "", "", time.monotonic() - start, timed_out=True, killed_by="timeout")
            raise
        output = response.result or ""
        cap = self.task.limits.max_output_bytes
        data = output.encode("utf-8", "replace")
        truncated = len(data) > cap
        code = int(response.exit_code if response.exit_code is not None else -1)
        timed_out = code in (124, -1) and time.monotonic() - start >= timeout
        return ExecResult(code, data[:cap].decode("utf-8", "replace"), "", time.monotonic() - start,
                          stdout_truncated=truncated, timed_out=timed_out, killed_by="timeout" if timed_out else None)

    def read_file(self, path: str) -> bytes:
        return self._call("download", lambda: self.remote.fs.download_file(path))

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        from daytona import FileUpload  # noqa: PLC0415 - optional extra (daytona)

        self._call("upload", lambda: self.remote.fs.upload_files([FileUpload(source=data, destination=path)]))
        self._checked(f"chmod {mode:o} {shlex.quote(path)}", "chmod")

    def close(self) -> None:
        """Delete the remote sandbox (idempotent). A failed delete is an infra error, after marking closed."""
        if self._closed:
            return
        self._closed = True
        self.backend._forget(self)
        if not self.owned:
            return
        try:
            self.backend.client.delete(self.remote, timeout=self.backend.config.delete_timeout_s)
        except Exception as exc:
            raise SandboxInfraError(f"Daytona could not delete sandbox {self.remote.id} of trial {self.trial_id}: "
                                    f"{exc}; auto-stop ({self.backend.config.auto_stop_minutes} min) will") from exc

    def __enter__(self) -> DaytonaSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
