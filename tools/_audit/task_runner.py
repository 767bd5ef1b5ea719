"""Runs a task for the audit: commands as agent turns in a fresh local sandbox, then the task's verifier.

The same engines a training run uses: ``t1_actors.backends.local_sandbox`` (bubblewrap over a private
copy-on-write root, no network during the agent's turns) and ``t1_actors.verify.engine.Verifier``
(pristine, checksummed tests mounted read-only at verification time only).
"""

from __future__ import annotations

import itertools
import shlex

from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig, SandboxInfraError
from t1_actors.tasks.model import Task
from t1_actors.verify.engine import Verifier, VerifierConfig
from tools._audit.task_checks import RunOutcome


class LocalTrialRunner:
    """``TrialRunner`` on the local backend. Use as a context manager (closes sandboxes and the verifier)."""

    def __init__(self, sandbox: LocalSandboxConfig | None = None, verifier: VerifierConfig | None = None):
        self.backend = LocalSandboxBackend(sandbox)
        self.verifier = Verifier(verifier)
        self._serial = itertools.count()

    def run(self, task: Task, commands: list[str], *, probe: str | None = None) -> RunOutcome:
        trial_id = f"audit-{task.id}-{next(self._serial)}"
        try:
            sandbox = self.backend.open(task, trial_id)
        except SandboxInfraError as exc:
            return RunOutcome({}, 0, 0, error=f"environment: {exc}")
        try:
            for command in commands:
                sandbox.exec(_as_shell(command), task.limits.command_timeout_s)
            probe_output = ""
            if probe is not None:
                probe_output = sandbox.exec(probe, max(task.limits.command_timeout_s, 30.0)).stdout
            result = self.verifier.verify(task, sandbox.trial_root)
        except SandboxInfraError as exc:
            return RunOutcome({}, 0, 0, error=str(exc))
        finally:
            sandbox.close()
        return RunOutcome(dict(result.tests), result.passed, result.total, probe_output, result.infra_error)

    def close(self) -> None:
        self.backend.close()
        self.verifier.close()

    def __enter__(self) -> LocalTrialRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _as_shell(step: str) -> str:
    """A step as /bin/sh runs it; a whole script with a bash shebang goes through bash."""
    first = step.lstrip().splitlines()[0] if step.strip() else ""
    if first.startswith("#!") and "bash" in first:
        return f"bash -c {shlex.quote(step)}"
    return step
