"""Real engines wired in one process: the torch sampler, the local sandbox and the verifier, no transport.

``TrialPorts`` (t1_actors.rollout.trials) for the synchronous probe (``t1-probe``) and the tests of the trial
orchestration; the actors wire the same ports over pynng. Events are kept in ``events``, not logged.
"""

from __future__ import annotations

import trio

from t1_actors.backends.local_sandbox import LocalSandboxBackend, SandboxInfraError
from t1_actors.backends.sampler_backend import GenerateSpec
from t1_actors.policy.sampling import SamplingParams
from t1_actors.rollout.loop import ToolOutcome
from t1_actors.rollout.opens import SandboxUnavailable
from t1_actors.verify.engine import Verifier


class InProcessPorts:
    """Each call goes straight to the engine; blocking sandbox and verifier calls run in worker threads."""

    def __init__(self, sampler, tasks: dict, params: SamplingParams, sandbox: LocalSandboxBackend, verifier: Verifier):
        self.sampler, self.tasks, self.params = sampler, tasks, params
        self.sandbox_backend, self.verifier = sandbox, verifier
        self.sandboxes: dict = {}
        self.events: list = []
        self.version = 0

    async def open_sandbox(self, trial_id, task_id):
        try:
            self.sandboxes[trial_id] = await trio.to_thread.run_sync(self.sandbox_backend.open, self.tasks[task_id],
                                                                     trial_id)
        except SandboxInfraError as error:  # as the sandbox actor marks it: the trial ends as an infra failure
            raise SandboxUnavailable(f"{type(error).__name__}: {error}") from error

    async def execute(self, trial_id, turn, command, timeout_s):
        result = await trio.to_thread.run_sync(self.sandboxes[trial_id].exec, command, timeout_s)
        return ToolOutcome(result.exit_code, result.stdout + result.stderr)

    async def close_sandbox(self, trial_id):
        sandbox = self.sandboxes.pop(trial_id, None)
        if sandbox is not None:
            await trio.to_thread.run_sync(sandbox.close)

    async def generate(self, trial_id, turn, prompt_ids, seed=None, temperature=None, prefix=None,
                       record_routing=True):
        """The whole generation (every routing row): nothing is logged here, so ``prefix`` changes nothing."""
        update = {k: v for k, v in (("seed", seed), ("temperature", temperature)) if v is not None}
        params = self.params.model_copy(update=update) if update else self.params
        # the trial is the session, as the sampler actor makes it: a turn prefills only its new tokens
        [g] = await self.sampler.generate([GenerateSpec(f"{trial_id}/{turn}", prompt_ids.tolist(), params,
                                                        session_id=trial_id)])
        return g

    async def cancel(self, trial_id, *, sandbox_id=None):
        for turn in range(64):
            await self.sampler.cancel(f"{trial_id}/{turn}")

    async def verify(self, trial_id, task_id, *, sandbox_id=None):
        sandbox = self.sandboxes[sandbox_id or trial_id]
        verification = await trio.to_thread.run_sync(self.verifier.verify, self.tasks[task_id], sandbox.trial_root)
        event = verification.to_event().model_copy(update={"trial_id": trial_id})  # named by the trial, as the actor does
        self.events.append(event)
        return event

    async def log(self, *events):
        self.events.extend(events)

    def learner_version(self):
        return self.version
