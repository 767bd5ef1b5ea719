"""Playing (task, attempt) pairs: the policies, the ports that log every turn, exec and verification, the loop.

A policy acts in an open sandbox; the loop around it is the same for all of them: ``TrialIssued``, the
sandbox (a build failure is an infrastructure failure, recorded, never a 0), the policy within the task's
own agent timeout, ``TrialEnded``, the task's tests (``VerifierResult``), the sandbox closed whatever
happened (Ctrl-C included). A model policy is the campaign's agent loop (``trials.TrialRunner``) on its
weights, tokenizer and rollout limits (``_models``), each turn seeded by ``trials.eval_seed(task, turn, attempt)``
(mixed with ``--seed`` when it is not 0), so two evals of the same task set can be paired.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import trio

from schemas import SandboxExec, TrialEnded, TrialIssued
from t1_actors.backends._sandbox.interface import SandboxInfraError
from t1_actors.backends.sampler_backend import GenerateSpec
from t1_actors.policy.generation import NO_PREFIX, Generation, TurnPrefix
from t1_actors.rollout import ToolOutcome
from t1_actors.rollout.inprocess import InProcessPorts
from t1_actors.rollout.opens import SandboxUnavailable

ORACLE_PATH = "/tmp/t1-oracle/solve.sh"


def mixed_seed(seed: int, eval_seed: int) -> int:
    """``--seed`` 0 keeps the campaign's eval draws; any other value gives another common-random stream."""
    if seed == 0:
        return eval_seed
    digest = hashlib.blake2b(f"{seed}/{eval_seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


class EvalPorts(InProcessPorts):
    """``InProcessPorts`` that append every fact to the eval's log (one writer): each exec, turn and
    verification, and whatever the loop logs; ``--seed`` mixed into the eval seeds."""

    def __init__(self, *, tasks: dict, sandbox_backend, verifier, writer, sampler=None, params=None, seed: int = 0):
        super().__init__(sampler, tasks, params, sandbox_backend, verifier)
        self.writer, self.seed = writer, seed
        self._lock = trio.Lock()  # the writer is one thread's at a time

    async def log(self, *events) -> None:
        async with self._lock:
            def append() -> None:
                for event in events:
                    self.writer.append(event)
                self.writer.commit()
            await trio.to_thread.run_sync(append)

    async def execute(self, trial_id: str, turn: int, command: str, timeout_s: float) -> ToolOutcome:
        try:
            result = await trio.to_thread.run_sync(self.sandboxes[trial_id].exec, command, timeout_s)
        except SandboxInfraError as exc:
            await self.log(SandboxExec(trial_id=trial_id, turn=turn, command=command, exit_code=-1, stdout="",
                                       stderr="", duration_s=0.0, infra_error=str(exc)))
            return ToolOutcome(-1, "", str(exc))
        await self.log(SandboxExec(trial_id=trial_id, turn=turn, command=command, exit_code=result.exit_code,
                                   stdout=result.stdout, stderr=result.stderr, duration_s=result.duration_s,
                                   stdout_truncated=result.stdout_truncated, stderr_truncated=result.stderr_truncated,
                                   timed_out=result.timed_out))
        return ToolOutcome(result.exit_code, result.stdout + result.stderr)

    async def generate(self, trial_id: str, turn: int, prompt_ids: np.ndarray, seed: int | None = None,
                       temperature: float | None = None, prefix: TurnPrefix = NO_PREFIX,
                       record_routing: bool = True) -> Generation:
        update: dict[str, Any] = {"seed": None if seed is None else mixed_seed(self.seed, seed)}
        if temperature is not None:
            update["temperature"] = temperature
        params = self.params.model_copy(update=update)
        [g] = await self.sampler.generate([GenerateSpec(f"{trial_id}/{turn}", prompt_ids.tolist(), params)])
        await self.log(g.to_event(trial_id, turn, prompt_ids, temperature=params.temperature, top_p=params.top_p,
                                  sampler_id="eval", engine=self.sampler.engine, prefix=prefix,
                                  record_routing=record_routing))
        return g

    async def verify(self, trial_id: str, task_id: str, *, sandbox_id: str | None = None):
        verification = await trio.to_thread.run_sync(self.verifier.verify, self.tasks[task_id],
                                                     self.sandboxes[sandbox_id or trial_id].trial_root)
        event = verification.to_event().model_copy(update={"trial_id": trial_id})
        await self.log(event)
        return event


class Policy(Protocol):
    """What acts in a trial's open sandbox; returns how its loop ended (``TrialEnded.finish``), its assistant
    turns and the infrastructure error that ended it, if one did."""

    name: str
    temperature: float | None

    async def act(self, ports: EvalPorts, trial_id: str, task, attempt: int) -> tuple[str, int, str | None]: ...


@dataclass
class OraclePolicy:
    """The task's own solution, run once: checks the harness and the tasks (its failures are the harness's)."""

    name: str = "oracle"
    temperature: float | None = None

    async def act(self, ports, trial_id, task, attempt):
        if task.oracle is None:
            raise SandboxInfraError(f"task {task.id} has no oracle solution (Harbor: solution/solve.sh; "
                                    "Terminal-Bench: solution.sh)")
        sandbox = ports.sandboxes[trial_id]
        script, files = task.oracle.layout(ORACLE_PATH)
        for path, data in files.items():  # executable: a solve.sh may run its helpers directly
            await trio.to_thread.run_sync(sandbox.write_file, path, data, 0o755)
        outcome = await ports.execute(trial_id, 0, f"if command -v bash >/dev/null; then bash {script}; "
                                                   f"else sh {script}; fi", task.limits.agent_timeout_s)
        return ("infra_error" if outcome.infra_error else "answered"), 0, outcome.infra_error


@dataclass
class NoopPolicy:
    """Nothing at all: what passes by itself (a test that passes with no solution is a weak test)."""

    name: str = "noop"
    temperature: float | None = None

    async def act(self, ports, trial_id, task, attempt):
        return "answered", 0, None


@dataclass
class ModelPolicy:
    """A model (``run:``, ``hf:``, ``sglang:``; see ``_models``) through the campaign's agent loop."""

    name: str
    temperature: float
    runner: Any = None  # trials.TrialRunner on the model's sampler, tokenizer and limits

    async def act(self, ports, trial_id, task, attempt):
        rollout = await self.runner.play(trial_id, task.id, seeded=True, sample_index=attempt,
                                         temperature=self.temperature)
        return rollout.finish, len(rollout.turns), rollout.infra_error


@dataclass(frozen=True)
class AttemptOutcome:
    """How one attempt ended, as its events in the log say (for the progress line; the log is the record)."""

    finish: str
    infra_error: str | None = None
    passed: int = 0
    total: int = 0
    resolved: bool = False


async def play_attempt(ports: EvalPorts, policy: Policy, task, attempt: int, run_tag: str) -> AttemptOutcome:
    """One (task, attempt): issued, sandbox, the policy within the agent timeout, ended, verified, closed."""
    trial_id = f"{run_tag}-{task.id}-a{attempt}-{secrets.token_hex(3)}"
    await ports.log(TrialIssued(trial_id=trial_id, task_id=task.id, split="eval", label="eval", sample=attempt,
                                temperature=policy.temperature, policy_version_wanted=ports.version))
    start = time.monotonic()
    try:
        try:
            await ports.open_sandbox(trial_id, task.id)
        except (SandboxInfraError, SandboxUnavailable) as exc:  # the in-process ports raise the latter
            await ports.log(TrialEnded(trial_id=trial_id, finish="infra_error", infra_error=str(exc),
                                       duration_s=time.monotonic() - start))
            return AttemptOutcome("infra_error", str(exc))
        unhonoured = list(ports.sandboxes[trial_id].build.unhonoured)
        finish, turns, infra = "timeout", 0, None
        with trio.move_on_after(task.limits.agent_timeout_s):
            try:
                finish, turns, infra = await policy.act(ports, trial_id, task, attempt)
            except SandboxInfraError as exc:
                finish, infra = "infra_error", str(exc)
        await ports.log(TrialEnded(trial_id=trial_id, finish=finish, turns=turns, infra_error=infra,
                                   duration_s=time.monotonic() - start, unhonoured=unhonoured))
        if infra is not None:
            return AttemptOutcome(finish, infra)
        verification = await ports.verify(trial_id, task.id)
        return AttemptOutcome(finish, verification.infra_error, verification.passed, verification.total,
                              verification.resolved)
    finally:
        with trio.CancelScope(shield=True):
            await ports.close_sandbox(trial_id)
