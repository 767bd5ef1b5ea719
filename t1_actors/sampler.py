"""The sampler actor: serves the behaviour policy over the runtime and logs every turn it samples.

- ``GenerateRequest`` -> ``GenerateReply`` (output ids, logprobs at the request's temperature, routing
  of every fed position, the policy version used, finish reason), and a ``SamplerTurn`` event in the log.
- ``Cancel`` for a trial ends its generation at the next token: the reply (and the event) carry what
  was sampled so far with ``finish_reason='cancelled'``, so a partial rollout is never lost.
- A backend that cannot serve (``BackendUnavailable``: an SGLang server gone mid-rollout) is asked again
  until it answers, for at most ``[sampler] sglang_server_wait_s`` (a supervised local server restarts on
  the same URL): the turn in flight is sampled again by the new start and the trial goes on. Past the wait
  the turn ends with ``finish_reason='error'`` and the reason, in the reply and the event: the trial is an
  infrastructure failure, never a reward of 0. Every turn's event names the engine that served it.
- ``PolicyUpdate`` is acknowledged once the checksum is verified; the version is then loaded between
  generations (new admissions wait while in-flight ones finish; the backend never mixes two versions
  inside one generation). Each reply says which version produced it.

Config: the run's ``[sampler]`` section (``SamplerConfig``: backend torch/sglang, default temperature,
top-p, dtype, batching) and ``[model]``; options of the ``[[actors]]`` entry: ``SamplerOptions``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import trio
from pydantic import BaseModel, ConfigDict, Field

from schemas import Ack, GenerateReply, GenerateRequest, PolicyUpdate
from t1_actors.backends.sampler_backend import (
    BackendUnavailable,
    GenerateSpec,
    SamplerBackend,
    SamplerConfig,
    open_sampler_backend,
)
from t1_actors.layout import sha256_file
from t1_actors.policy import ModelConfig, MoEPolicy
from t1_actors.policy.generation import Generation, TurnPrefix
from t1_actors.policy.sampling import SamplingParams
from t1_actors.runtime.actor import Actor, handles

T = TypeVar("T")


class _CancelledInOutage(Exception):
    """The trial was cancelled while its turn waited for the backend to come back."""


class SamplerOptions(BaseModel):
    """``[[actors]] options`` of a sampler: where its first policy comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy_path: str | None = Field(None, description="a saved policy (HF Qwen3-MoE dir) to serve first; None: "
                                                      "fresh weights from [model] and seed (torch backend). The "
                                                      "campaign sets it to the SFT policy")
    initial_version: int = Field(0, ge=0, description="the policy version the first policy is served (and its turns "
                                                      "logged) as; later versions come from the learner")
    seed: int = Field(0, description="seed of the fresh weights when policy_path is None (torch backend)")
    ready_timeout_s: float = Field(300.0, gt=0, description="how long a request waits for the backend to come up")
    version_wait_s: float = Field(5.0, ge=0, description="how long a request that wants a newer policy version than "
                                                         "the loaded one waits for it to load (then the loaded one "
                                                         "serves it, and that version is not waited for again)")




class SamplerActor(Actor):
    role = "sampler"
    Options = SamplerOptions

    async def setup(self) -> None:
        self.sampler_config: SamplerConfig = self.config.section(SamplerConfig)
        self.model_config: ModelConfig = self.config.section(ModelConfig)
        self.backend: SamplerBackend | None = None
        self._ready = trio.Event()
        self._turns = 0
        self._version_loaded = trio.Event()  # set (and replaced) at each load
        self._gave_up_on = -1  # the newest wanted version a wait for timed out: not waited for again
        self._server_gone = False  # a wait for the backend ran out: later turns fail at once until it answers
        self._updates_in, self._updates_out = trio.open_memory_channel[PolicyUpdate](math.inf)

    async def run(self) -> None:
        """Hold the backend open for the actor's life (the torch engine task lives in here)."""
        policy = None
        if self.sampler_config.backend == "torch" and self.options.policy_path is None:
            torch.manual_seed(self.options.seed)
            policy = MoEPolicy(self.model_config)
        async with open_sampler_backend(self.sampler_config, policy=policy, policy_path=self.options.policy_path,
                                        model=self.model_config, version=self.options.initial_version) as backend:
            self.backend = backend
            self._ready.set()
            self.logger.info("sampler_ready", backend=self.sampler_config.backend, policy_version=backend.version)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._load_updates, backend)
                await self.ctx.shutdown.wait()
                nursery.cancel_scope.cancel()

    async def _load_updates(self, backend: SamplerBackend) -> None:
        """Load announced versions one after the other, skipping any a newer one already overtook."""
        async for update in self._updates_out:
            while True:  # several announced while the last one loaded: go straight to the newest
                try:
                    newer = self._updates_out.receive_nowait()
                except trio.WouldBlock:
                    break
                update = newer if newer.version > update.version else update
            if update.version <= backend.version:
                continue
            try:
                await self._through_outage(partial(backend.load_weights, update.location, update.version),
                                           what=f"policy version {update.version}")
            except Exception as exc:  # keep serving the loaded version; the next announcement may succeed
                self.logger.error("policy_load_failed", policy_version=update.version, location=update.location,
                                  error=str(exc))
                continue
            self.logger.info("policy_loaded", policy_version=update.version, location=update.location)
            self._version_loaded.set()
            self._version_loaded = trio.Event()

    def status(self) -> dict[str, float]:
        return {"policy_version": float(self.backend.version if self.backend else -1), "turns": float(self._turns)}

    async def _backend(self) -> SamplerBackend:
        with trio.fail_after(self.options.ready_timeout_s):
            await self._ready.wait()
        assert self.backend is not None
        return self.backend

    async def _reach(self, backend: SamplerBackend, wanted: int | None) -> None:
        """Wait (at most ``version_wait_s``) until the version a request wants is loaded; a version whose wait
        timed out once (a restarted sampler asked for one it will not be sent) is not waited for again.

        The controller reads a new version from the log as soon as the learner has published it, before the
        sampler has received or loaded it: without this wait the first turns it issues right after (a
        validation probe, the eval after RL) could be sampled by the version before."""
        if wanted is None or backend.version >= wanted or wanted <= self._gave_up_on:
            return
        with trio.move_on_after(self.options.version_wait_s):
            while backend.version < wanted:
                await self._version_loaded.wait()
        if backend.version < wanted and wanted > self._gave_up_on:
            self._gave_up_on = wanted
            self.logger.warning("wanted_version_not_loaded", wanted=wanted, policy_version=backend.version)

    @handles(GenerateRequest, graceful_cancel=True)
    async def generate(self, request: GenerateRequest) -> GenerateReply:
        backend = await self._backend()
        await self._reach(backend, request.policy_version_wanted)
        request_id = f"{request.trial_id}/{request.turn}"
        params = SamplingParams(max_new_tokens=request.max_new_tokens, temperature=request.temperature,
                                top_p=request.top_p, stop_ids=tuple(request.stop_ids), seed=request.seed)
        generation: Generation | None = None
        error: str | None = None
        spec = GenerateSpec(request_id, request.input_ids.tolist(), params, session_id=request.trial_id)
        cancelled = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._cancel_when_asked, backend, request.trial_id, request_id, cancelled)
                [generation] = await self._through_outage(lambda: backend.generate([spec]), what=request_id,
                                                          cancelled=cancelled)
                nursery.cancel_scope.cancel()
        except* _CancelledInOutage:
            generation = Generation(len(request.input_ids), np.zeros(0, np.int32), np.zeros(0, np.float32), None,
                                    "cancelled", backend.version)
        except* BackendUnavailable as group:
            error = "; ".join(str(exc) for exc in group.exceptions)
            self.logger.error("sampler_backend_unavailable", trial_id=request.trial_id, turn=request.turn, error=error)
            generation = Generation(len(request.input_ids), np.zeros(0, np.int32), np.zeros(0, np.float32), None,
                                    "error", backend.version, error=error)
        self._turns += 1
        prefix = TurnPrefix(request.prefix_len, request.prefix_rows, request.prefix_version)
        await self.log(generation.to_event(request.trial_id, request.turn, request.input_ids,
                                           temperature=request.temperature, top_p=request.top_p, sampler_id=self.name,
                                           engine=backend.engine, prefix=prefix,
                                           record_routing=request.record_routing))
        return generation.to_reply(request.trial_id, request.turn, prefix)

    async def _cancel_when_asked(self, backend: SamplerBackend, trial_id: str, request_id: str,
                                 cancelled: trio.Event) -> None:
        await self.wait_cancel(trial_id)
        cancelled.set()
        try:
            await backend.cancel(request_id)
        except BackendUnavailable:  # a server that is gone runs nothing to abort; the outage wait ends the turn
            pass

    async def _through_outage(self, call: Callable[[], Awaitable[T]], *, what: str,
                              cancelled: trio.Event | None = None) -> T:
        """``call()``, called again while it raises ``BackendUnavailable``, every 0.5-5 s for at most
        ``sglang_server_wait_s``; then the error is raised, and later calls do not wait until one succeeds.
        ``_CancelledInOutage`` once ``cancelled`` is set during a wait."""
        wait_s = 0.0 if self._server_gone else self.sampler_config.sglang_server_wait_s
        deadline, pause, tries = trio.current_time() + wait_s, 0.5, 0
        while True:
            try:
                result = await call()
            except BackendUnavailable as exc:
                if trio.current_time() + pause > deadline:
                    self._server_gone = True
                    raise
                if tries == 0:
                    self.logger.warning("sampler_backend_away", what=what, wait_s=wait_s, error=str(exc))
                tries += 1
                with trio.move_on_after(pause):
                    await (cancelled.wait() if cancelled is not None else trio.sleep_forever())
                if cancelled is not None and cancelled.is_set():
                    raise _CancelledInOutage(what) from exc
                pause = min(2 * pause, 5.0)
                continue
            if tries:
                self.logger.info("sampler_backend_back", what=what, tries=tries)
            self._server_gone = False
            return result

    @handles(PolicyUpdate)
    async def policy_update(self, update: PolicyUpdate) -> Ack:
        """Verify the checksum, queue the load (it happens between generations), acknowledge."""
        backend = await self._backend()
        if update.version <= backend.version:
            return Ack(detail=f"already at version {backend.version}")
        if self.sampler_config.backend == "torch":  # a remote SGLang host checks its own disk
            weights = Path(update.location) / "model.safetensors"
            digest = await trio.to_thread.run_sync(sha256_file, weights)
            if update.sha256 and digest != update.sha256:
                raise ValueError(f"policy version {update.version} at {weights}: sha256 {digest[:12]}... "
                                 f"!= published {update.sha256[:12]}...; the file is corrupt or still being written")
        self._updates_in.send_nowait(update)
        return Ack(detail=f"version {update.version} loads after the generations in flight")
