"""The verifier actor: ``VerifyRequest(trial_id, task_id, sandbox_id)`` -> the ``VerifierResult`` event
(appended to the log and sent back), from ``t1_actors.verify.engine``. It verifies the root of sandbox
``sandbox_id`` (None: the trial's own) and names the result by ``trial_id`` always, so a continuation
verified in its original's sandbox has a result of its own, and the original none of its continuation's.

The trial's final root is found on the shared disk: the sandbox actor's local backend records each open
trial's layers under ``[sandbox.local] base_dir`` (``locate_trial``), so the verifier runs on the
sandbox's host and is asked before ``SandboxClose``. An infrastructure failure (no such trial, a broken
verifier store, a missing test dependency) is a ``VerifierResult`` with ``infra_error`` set and reward 0:
the consumer drops it, never trains on it.

With ``[sandbox] backend = "daytona"`` the verifier attaches to the trial's Daytona sandbox by its stable
name and runs the tests inside it (``Verifier.verify_in_sandbox``; weaker trust, see remote_verify.py).
"""

from __future__ import annotations

import trio

from schemas import VerifierResult, VerifyRequest
from t1_actors.backends.daytona_sandbox import DaytonaSandboxBackend
from t1_actors.backends.local_sandbox import SandboxInfraError, locate_trial
from t1_actors.backends.sandbox_backend import SandboxConfig
from t1_actors.runtime.actor import Actor, handles
from t1_actors.tasks import build_task_sets
from t1_actors.tasks.config import TasksConfig
from t1_actors.train.reward import REWARD_SCALE
from t1_actors.verify.engine import Verifier, VerifierConfig


class VerifierActor(Actor):
    role = "verifier"

    async def setup(self) -> None:
        self.verifier_config: VerifierConfig = self.config.section(VerifierConfig)
        sandbox_config: SandboxConfig = self.config.section(SandboxConfig)
        self.sandbox_dir = sandbox_config.local.base_dir
        self.daytona = None
        if sandbox_config.backend == "daytona":
            self.daytona = await trio.to_thread.run_sync(DaytonaSandboxBackend, sandbox_config.daytona)
        self.tasks = await trio.to_thread.run_sync(build_task_sets, self.config.section(TasksConfig))
        self.verifier = Verifier(self.verifier_config)
        self._done = 0
        self._infra = 0

    def _verify_daytona(self, task, trial_id: str):
        sandbox = self.daytona.attach(task, trial_id)  # the sandbox actor owns it; we only attach
        try:
            return self.verifier.verify_in_sandbox(task, sandbox)
        finally:
            sandbox.close()

    async def teardown(self) -> None:
        verifier = getattr(self, "verifier", None)
        if verifier is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(verifier.close)

    def status(self) -> dict[str, float]:
        return {"verified": float(getattr(self, "_done", 0)), "infra_errors": float(getattr(self, "_infra", 0))}

    @handles(VerifyRequest)
    async def verify(self, request: VerifyRequest) -> VerifierResult:
        sandbox_id = request.sandbox_id or request.trial_id
        try:
            task = self.tasks.get(request.task_id)
            if self.daytona is not None:
                outcome = await trio.to_thread.run_sync(self._verify_daytona, task, sandbox_id)
            else:
                trial = locate_trial(self.sandbox_dir, sandbox_id)
                outcome = await trio.to_thread.run_sync(self.verifier.verify, task, trial)
            event = outcome.to_event().model_copy(update={"trial_id": request.trial_id})
        except (KeyError, SandboxInfraError) as exc:
            event = VerifierResult(trial_id=request.trial_id, task_id=request.task_id, tests={}, passed=0, total=0,
                                   reward=0.0, reward_scale=REWARD_SCALE, verifier_sha256="",
                                   infra_error=str(exc).strip("'\""), reward_kind=self.verifier_config.reward)
        self._done += 1
        self._infra += event.infra_error is not None
        await self.log(event)
        return event
