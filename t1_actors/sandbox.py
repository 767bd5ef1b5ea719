"""The sandbox actor: one isolated workspace per trial, one logged ``SandboxExec`` per tool call.

- ``SandboxOpen(trial_id, task_id)`` -> Ack with the build report (the task comes from the run's
  ``[tasks]`` sets); a failure of the sandbox's infrastructure is an ``ErrorReply(error="SandboxInfraError",
  detail="<its type>: <what>")``, never a task failure: an environment that cannot be built
  (``SandboxBuildError``), a trial whose disk does not fit the local backend's ``[sandbox.local] disk_total_mb``
  (``DiskBudgetExceeded``; ``disk_reserved_mb`` in the status). The controller ends such a trial as an
  infrastructure failure (``rollout.opens``); any other error (an unknown task) is the handler's usual ErrorReply.
- ``ExecRequest(trial_id, turn, command, timeout_s)`` -> the ``SandboxExec`` event (also appended to the
  log): exit code, capped stdout/stderr with truncation flags, duration, timeout; a failure of the
  sandbox machinery itself comes back as ``infra_error`` on the event (exit code -1).
- ``SandboxClose(trial_id)`` -> Ack; the trial's root is torn down.
- ``Cancel(trial_id | '*')``: the running command is killed and the sandbox closed.
- ``Generic(op="open_sandboxes", args={"trial_ids": [...]})`` -> Ack whose detail is the JSON list of those it
  holds open (a restarted staleness controller asks before resuming a trial in its sandbox).

A restarted sandbox actor takes over the sandboxes of the trials the log shows open, by trial id, before it
serves (local backend: ``LocalSandboxBackend.adopt``); each is a ``WorkspaceRecovered`` event: reattached as it
was, rolled back to the snapshot taken when the command running at the kill started (the controller's request,
resent by its socket, then runs it again), or lost (an infrastructure failure). Each command is bracketed by
``begin_command`` (snapshot, "running") and ``end_command`` (once its ``SandboxExec`` is logged).

Backends (``[sandbox] backend``): ``local`` (bubblewrap over overlayfs, default) or ``daytona``. The
verifier actor reads a local trial's final root from the shared disk (``[sandbox.local] base_dir``,
same host, before ``SandboxClose``).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import trio

from schemas import (
    Ack,
    Cancel,
    ErrorReply,
    ExecRequest,
    Generic,
    SandboxClose,
    SandboxExec,
    SandboxOpen,
    TrialIssued,
    WorkspaceRecovered,
)
from storage import EventLog
from storage.config import StorageConfig
from t1_actors.backends.local_sandbox import SandboxInfraError
from t1_actors.backends.sandbox_backend import SandboxConfig, open_backend
from t1_actors.rollout.recovery import open_trials
from t1_actors.runtime.actor import Actor, handles
from t1_actors.tasks import build_task_sets
from t1_actors.tasks.config import TasksConfig


class SandboxActor(Actor):
    role = "sandbox"

    async def setup(self) -> None:
        self.sandbox_config: SandboxConfig = self.config.section(SandboxConfig)
        self.tasks = await trio.to_thread.run_sync(build_task_sets, self.config.section(TasksConfig))
        self.backend = await trio.to_thread.run_sync(partial(open_backend, self.sandbox_config, sweep=False))
        self.sandboxes: dict[str, Any] = {}
        self._execs = 0
        self.snapshot_s = 0.0  # spent snapshotting workspaces before commands (status)
        self.taken_over: set[str] = set()  # sandboxes taken over and not yet asked for by a SandboxOpen
        await self._take_over()
        sweep = getattr(self.backend, "sweep_stale", None)
        if sweep is not None:
            await trio.to_thread.run_sync(sweep)
        self.logger.info("sandbox_ready", backend=self.sandbox_config.backend, tasks=len(self.tasks.by_id))

    async def _take_over(self) -> None:
        """Take over the sandboxes of the trials the log shows open (a killed predecessor's), one fact each."""
        adopt = getattr(self.backend, "adopt", None)
        if adopt is None:
            return
        kinds = ["trial_issued", "staleness_decision", "trial_ended", "verifier_result"]
        reader = EventLog.open(self.config.log_location(), config=self.config.section(StorageConfig))
        events = await trio.to_thread.run_sync(lambda: [e for _, e in reader.events(kinds=kinds)])
        issued = {e.trial_id: e for e in events if isinstance(e, TrialIssued)}
        for sandbox_id in dict.fromkeys(t.sandbox_id for t in open_trials(events)):
            task = self.tasks.get(issued[sandbox_id].task_id)
            try:
                taken = await trio.to_thread.run_sync(adopt, task, sandbox_id)
            except SandboxInfraError as error:
                await self.log(WorkspaceRecovered(trial_id=sandbox_id, outcome="lost", reason=str(error)))
                continue
            if taken is not None:
                sandbox, takeover = taken
                self.sandboxes[sandbox_id] = sandbox
                self.taken_over.add(sandbox_id)
                await self.log(WorkspaceRecovered(trial_id=sandbox_id, outcome=takeover.outcome, turn=takeover.turn,
                                                  command=takeover.command))
        if self.sandboxes:
            self.logger.warning("sandboxes_taken_over", n=len(self.sandboxes))

    async def teardown(self) -> None:
        backend = getattr(self, "backend", None)
        if backend is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(backend.close)

    def status(self) -> dict[str, float]:
        budget = getattr(getattr(self, "backend", None), "disk_budget", None)  # local backend: the trials' disks
        return {"open_sandboxes": float(len(getattr(self, "sandboxes", {}))), "execs": float(getattr(self, "_execs", 0)),
                "snapshot_s": float(getattr(self, "snapshot_s", 0.0)),
                "disk_reserved_mb": float(budget.held_mb()) if budget is not None else 0.0}

    @handles(SandboxOpen)
    async def open(self, request: SandboxOpen) -> Ack | ErrorReply:
        if request.trial_id in self.taken_over and request.trial_id in self.sandboxes:
            sandbox = self.sandboxes[request.trial_id]  # its open was resent to us: the predecessor had opened it
        elif request.trial_id in self.sandboxes:
            raise SandboxInfraError(f"trial {request.trial_id} already has an open sandbox; close it first")
        else:
            task = self.tasks.get(request.task_id)
            try:
                sandbox = await trio.to_thread.run_sync(self.backend.open, task, request.trial_id)
            except SandboxInfraError as error:  # marked as the infrastructure's, whatever its subclass
                detail = f"{type(error).__name__}: {error}"
                self.logger.warning("sandbox_open_failed", trial_id=request.trial_id, task_id=request.task_id,
                                    error=detail)
                return ErrorReply(error=SandboxInfraError.__name__, detail=detail)
            self.sandboxes[request.trial_id] = sandbox
        self.taken_over.discard(request.trial_id)
        build = sandbox.build
        return Ack(detail=json.dumps({"base_image": build.base_image, "unhonoured": build.unhonoured,
                                      "cached": build.cached, "build_s": round(build.duration_s, 3)}))

    @handles(ExecRequest)
    async def execute(self, request: ExecRequest) -> SandboxExec:
        sandbox = self.sandboxes.get(request.trial_id)
        fields: dict[str, Any] = dict(trial_id=request.trial_id, turn=request.turn, command=request.command)
        if sandbox is None:
            event = SandboxExec(**fields, exit_code=-1, stdout="", stderr="", duration_s=0.0,
                                infra_error=f"no open sandbox for trial {request.trial_id}; send SandboxOpen first")
        else:
            try:
                begin = getattr(sandbox, "begin_command", None)
                if begin is not None:  # the workspace as the command finds it, for a kill before it is logged
                    self.snapshot_s += await trio.to_thread.run_sync(begin, request.turn, request.command)
                # a cancelled caller abandons the thread; Cancel kills the command itself (see cancel())
                result = await trio.to_thread.run_sync(sandbox.exec, request.command, request.timeout_s,
                                                       abandon_on_cancel=True)
                event = SandboxExec(**fields, exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr,
                                    stdout_truncated=result.stdout_truncated, stderr_truncated=result.stderr_truncated,
                                    duration_s=result.duration_s, timed_out=result.timed_out)
            except SandboxInfraError as exc:
                event = SandboxExec(**fields, exit_code=-1, stdout="", stderr="", duration_s=0.0, infra_error=str(exc))
        self._execs += 1
        await self.log(event)
        end = getattr(sandbox, "end_command", None)
        if end is not None:
            await trio.to_thread.run_sync(end)
        return event

    @handles(SandboxClose)
    async def close(self, request: SandboxClose) -> Ack:
        sandbox = self.sandboxes.pop(request.trial_id, None)
        if sandbox is None:
            return Ack(detail="already closed")
        await trio.to_thread.run_sync(sandbox.close)
        return Ack(detail="closed")

    @handles(Generic)
    async def generic(self, request: Generic) -> Ack:
        if request.op != "open_sandboxes":
            raise ValueError(f"the sandbox actor has no op {request.op!r} (it knows open_sandboxes)")
        wanted = request.args.get("trial_ids", [])
        return Ack(detail=json.dumps([t for t in wanted if t in self.sandboxes]))

    @handles(Cancel)
    async def cancel(self, request: Cancel) -> Ack:
        trial_ids = list(self.sandboxes) if request.trial_id == "*" else [request.trial_id]
        closed = 0
        for trial_id in trial_ids:
            sandbox = self.sandboxes.pop(trial_id, None)
            if sandbox is None:
                continue
            interrupt = getattr(sandbox, "interrupt", None)
            if interrupt is not None:
                await trio.to_thread.run_sync(interrupt)
            await trio.to_thread.run_sync(sandbox.close)
            closed += 1
        return Ack(detail=f"closed {closed} sandbox(es)")
