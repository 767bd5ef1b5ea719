"""Embedded sampling backend: the torch MoE policy with continuous batching, under trio.

Concurrent ``generate`` calls feed one ``ContinuousBatcher``; an engine task steps it in a worker
thread (``trio.to_thread``) so the trio loop stays free, admitting new prompts between decode steps.
After idling, the engine waits ``batch_window_s`` so that requests arriving together share a prefill.
A new policy version is loaded between generations: admission pauses, the batch drains, the weights
swap, admission resumes. A ``generate`` that is cancelled (its caller's deadline, ``cancel``) ends its
sequences at the next token boundary instead of letting them run on. Requests carrying a
``session_id`` reuse the KV their session's previous turn left behind (a multi-turn rollout prefills
only its new tokens).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import torch
import trio

from t1_actors.backends.sampler_backend import EngineInfo, GenerateSpec, SamplerConfig
from t1_actors.policy import MoEPolicy
from t1_actors.policy.generation import Generation
from t1_actors.policy.sampling import ContinuousBatcher


@dataclass
class _Waiter:
    done: trio.Event = field(default_factory=trio.Event)
    result: Generation | None = None


@dataclass
class _Swap:
    path: str
    version: int
    done: trio.Event = field(default_factory=trio.Event)
    error: BaseException | None = None


class TorchSampler:
    """``SamplerBackend`` over an in-process ``MoEPolicy``. Create with ``async with TorchSampler.open(...)``."""

    def __init__(self, policy: MoEPolicy, *, config: SamplerConfig, version: int):
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype]
        self.config = config
        self.version = version
        self.engine = EngineInfo("torch", torch.__version__, uuid.uuid4().hex[:12])  # embedded: one start per open
        self._batcher = ContinuousBatcher(policy, capture_routing=config.capture_routing,
                                          max_batch=config.max_batch, dtype=dtype,
                                          prefix_cache_tokens=config.prefix_cache_tokens)
        self._waiters: dict[int, _Waiter] = {}
        self._keys: dict[str, list[int]] = {}  # request id -> batcher keys still running
        self._wake = trio.Event()
        self._swaps: list[_Swap] = []
        self._failure: BaseException | None = None

    @classmethod
    @asynccontextmanager
    async def open(cls, policy: MoEPolicy, *, config: SamplerConfig | None = None,
                   version: int = 0) -> AsyncIterator[TorchSampler]:
        config = config or SamplerConfig()
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        sampler = cls(policy, config=config, version=version)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sampler._engine)
            try:
                yield sampler
            finally:
                nursery.cancel_scope.cancel()

    @property
    def in_flight(self) -> int:
        return len(self._waiters)

    async def generate(self, requests: list[GenerateSpec]) -> list[Generation]:
        if self._failure is not None:
            raise RuntimeError(f"torch sampler engine failed earlier: {self._failure!r}") from self._failure
        keys: list[int] = []
        try:
            for spec in requests:
                key = self._batcher.add(spec.input_ids, spec.params, session=spec.session_id)
                self._waiters[key] = _Waiter()
                self._keys.setdefault(spec.request_id, []).append(key)
                keys.append(key)
        except ValueError:  # a bad prompt: withdraw the ones already queued, then say which
            for spec, key in zip(requests, keys):
                self._batcher.cancel(key)
                self._waiters.pop(key, None)
                self._forget(spec.request_id, key)
            raise
        self._wake.set()
        try:
            for key in keys:
                await self._waiters[key].done.wait()
        except BaseException:
            for key in keys:  # our caller gave up: stop spending compute on these sequences
                if self._waiters.pop(key).result is None:
                    self._batcher.cancel(key)
            raise
        finally:
            for spec, key in zip(requests, keys):
                self._forget(spec.request_id, key)
        if self._failure is not None:
            raise RuntimeError(f"torch sampler engine failed: {self._failure!r}") from self._failure
        return [self._waiters.pop(key).result for key in keys]

    async def cancel(self, request_id: str) -> None:
        for key in self._keys.get(request_id, []):
            self._batcher.cancel(key)
        self._wake.set()

    async def load_weights(self, path: str, version: int) -> None:
        """Load ``path`` (saved ``MoEPolicy`` / HF Qwen3-MoE dir) as ``version`` once in-flight rows finish."""
        swap = _Swap(str(path), version)
        self._swaps.append(swap)
        self._wake.set()
        await swap.done.wait()
        if swap.error is not None:
            raise swap.error

    # -- engine ---------------------------------------------------------------------------------
    async def _engine(self) -> None:
        while True:
            if not self._batcher.busy and not self._swaps:
                await self._wake.wait()
                self._wake = trio.Event()
                if self.config.batch_window_s and not self._swaps:
                    await trio.sleep(self.config.batch_window_s)  # let concurrent requests join one prefill
                continue
            if self._swaps and self._batcher.active == 0:
                await self._apply_swaps()
                continue
            try:
                finished = await trio.to_thread.run_sync(self._batcher.step, not self._swaps)
            except Exception as exc:  # a bug or out-of-memory: fail every waiter loudly, not silently hang
                self._failure = exc
                for waiter in self._waiters.values():
                    waiter.done.set()
                raise
            for key, generation in finished:
                generation.policy_version = self.version
                waiter = self._waiters.get(key)
                if waiter is not None:
                    waiter.result = generation
                    waiter.done.set()

    async def _apply_swaps(self) -> None:
        swaps, self._swaps = self._swaps, []
        latest = max(swaps, key=lambda s: s.version)
        try:
            policy = await trio.to_thread.run_sync(MoEPolicy.load, latest.path)
            self._batcher.set_model(policy)
            self.version = latest.version
        except Exception as exc:
            for swap in swaps:
                swap.error = ValueError(f"could not load policy version {latest.version} from {latest.path}: {exc}")
        for swap in swaps:
            swap.done.set()

    def _forget(self, request_id: str, key: int) -> None:
        keys = self._keys.get(request_id)
        if keys is not None and key in keys:
            keys.remove(key)
            if not keys:
                del self._keys[request_id]
