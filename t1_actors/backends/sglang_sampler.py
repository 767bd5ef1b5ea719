"""SGLang sampling backend: an HTTP client (httpx) of SGLang's native API.

- ``POST /generate`` with ``rid``, ``input_ids``, ``sampling_params`` (temperature, top_p,
  max_new_tokens, stop_token_ids, sampling_seed), ``return_logprob``, ``return_routed_experts`` and
  ``routed_experts_start_len=0``. Output ids come from ``output_ids`` (else from the logprob
  entries), logprobs from ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` each),
  routing from ``meta_info.routed_experts``: base64 of int32 ``[rows, layers, k]``, rows covering
  positions ``[0, len(prompt) + len(output) - 1)`` (the last sampled token has no row).
- ``POST /abort_request {"rid"}`` cancels; ``POST /update_weights_from_disk {"model_path",
  "weight_version"}`` loads a published version (SGLang lets running requests finish first).

The server must run with ``--enable-return-routed-experts`` (routing) and WITHOUT
``SGLANG_RETURN_ORIGINAL_LOGPROB`` so that returned logprobs are at the request's temperature, the
quantity the learner compares against (see ``t1_actors.policy.sampling``). ``sglang_server`` starts such
a server on the CPU (``t1-sglang-serve``); tests/test_sglang_real.py runs this client against it.

Never a silent fallback: a server that is not there at ``open``, or stops answering mid-request, raises
``BackendUnavailable`` naming the URL (the sampler actor records that turn as an infrastructure failure).
``engine`` (name, version, start id from ``/get_server_info``) is recorded with every turn.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
import trio

from schemas import routing_dtype
from t1_actors.backends.sampler_backend import BackendUnavailable, EngineInfo, GenerateSpec, SamplerConfig
from t1_actors.backends.sglang_server import engine_from_server_info
from t1_actors.policy.config import ModelConfig
from t1_actors.policy.generation import FinishReason, Generation

_FINISH = {"stop": "stop", "length": "length", "abort": "cancelled"}
_ABORT_TRIES = 50
_ABORT_RETRY_S = 0.2


class SGLangError(RuntimeError):
    """The SGLang server refused a request or answered something this client cannot read."""


class SGLangSampler:
    """``SamplerBackend`` over an SGLang server. Create with ``async with SGLangSampler.open(...)``."""

    def __init__(self, client: httpx.AsyncClient, *, config: SamplerConfig, model: ModelConfig, version: int,
                 engine: EngineInfo | None = None):
        self.config = config
        self.model = model
        self.version = version
        self.engine = engine or EngineInfo("sglang", "unknown", "unknown")
        self._client = client
        self._cancelled: set[str] = set()
        self._in_flight: set[str] = set()
        self._server_lost = False  # a request failed in transport: ask who serves before the next one

    @classmethod
    @asynccontextmanager
    async def open(cls, config: SamplerConfig, *, model: ModelConfig | None = None, version: int = 0,
                   transport: httpx.AsyncBaseTransport | None = None) -> AsyncIterator[SGLangSampler]:
        """``model`` gives layers, k and expert count for the routing record (default: the tiny model)."""
        timeout = httpx.Timeout(config.request_timeout_s, connect=10.0)
        async with httpx.AsyncClient(base_url=config.sglang_url, timeout=timeout, transport=transport) as client:
            engine = await _engine(client, config.sglang_url)
            yield cls(client, config=config, model=model or ModelConfig(), version=version, engine=engine)

    async def generate(self, requests: list[GenerateSpec]) -> list[Generation]:
        """One HTTP request per spec, concurrently (the server batches them); the first failure is raised."""
        results: list[Generation | None] = [None] * len(requests)
        errors: list[Exception] = []

        async def one(i: int, spec: GenerateSpec, scope: trio.CancelScope) -> None:
            try:
                results[i] = await self._generate_one(spec)
            except (SGLangError, BackendUnavailable) as exc:
                errors.append(exc)
                scope.cancel()

        async with trio.open_nursery() as nursery:
            for i, spec in enumerate(requests):
                nursery.start_soon(one, i, spec, nursery.cancel_scope)
        if errors:
            raise errors[0]
        return results  # type: ignore[return-value]

    async def cancel(self, request_id: str) -> None:
        """``/abort_request``; while the request is in flight, sent again every ``_ABORT_RETRY_S`` (an abort
        that reaches the server before the request does is ignored by it). Not in flight: sent once."""
        if request_id in self._in_flight:
            self._cancelled.add(request_id)
        for _ in range(_ABORT_TRIES):
            try:
                response = await self._client.post("/abort_request", json={"rid": request_id}, timeout=30.0)
            except httpx.TransportError as exc:
                raise BackendUnavailable(f"SGLang server at {self.config.sglang_url} did not take /abort_request "
                                         f"for {request_id!r}: {exc!r}") from exc
            if response.status_code >= 400:
                raise SGLangError(f"/abort_request for {request_id!r} failed: HTTP {response.status_code} "
                                  f"{response.text[:200]}")
            if request_id not in self._in_flight:
                return
            await trio.sleep(_ABORT_RETRY_S)
            if request_id not in self._in_flight:
                return

    async def load_weights(self, path: str, version: int) -> None:
        body = {"model_path": str(path), "weight_version": str(version), "abort_all_requests": False}
        try:
            response = await self._client.post("/update_weights_from_disk", json=body,
                                               timeout=self.config.weight_update_timeout_s)
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"SGLang server at {self.config.sglang_url} did not take policy version "
                                     f"{version}: {exc!r}") from exc
        try:  # a refused load is HTTP 400 with {"success": false, "message"} (SGLang 0.5.23), or 200 with it
            reply = response.json()
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or "success" not in reply:
            reply = _json(response, "/update_weights_from_disk")
        if not reply.get("success", False):
            raise SGLangError(f"SGLang could not load policy version {version} from {path}: {reply.get('message')}")
        self.version = version

    # -- one request ----------------------------------------------------------------------------
    def request_body(self, spec: GenerateSpec) -> dict[str, Any]:
        params = spec.params
        sampling = {"temperature": params.temperature, "top_p": params.top_p,
                    "max_new_tokens": params.max_new_tokens, "skip_special_tokens": False, "no_stop_trim": True}
        if params.stop_ids:
            sampling["stop_token_ids"] = list(params.stop_ids)
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        return {"rid": spec.request_id, "input_ids": [int(t) for t in spec.input_ids], "sampling_params": sampling,
                "return_logprob": True, "return_routed_experts": self.config.capture_routing,
                "routed_experts_start_len": 0}

    async def _generate_one(self, spec: GenerateSpec) -> Generation:
        if self._server_lost:  # a supervised server comes back on the same URL: its turns name the new start
            self.engine = await _engine(self._client, self.config.sglang_url)
            self._server_lost = False
        version = self.version
        self._in_flight.add(spec.request_id)
        try:
            response = await self._client.post("/generate", json=self.request_body(spec))
        except httpx.TransportError as exc:  # refused, reset, timed out: the server is not serving
            self._server_lost = True
            raise BackendUnavailable(f"SGLang server at {self.config.sglang_url} (start {self.engine.start_id}) "
                                     f"failed during /generate for {spec.request_id!r}: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise SGLangError(f"/generate for {spec.request_id!r} at {self.config.sglang_url} failed: {exc!r}") from exc
        finally:
            self._in_flight.discard(spec.request_id)
        if response.status_code >= 400 and spec.request_id in self._cancelled:
            self._cancelled.discard(spec.request_id)
            return _empty(len(spec.input_ids), "cancelled", version)
        reply = _json(response, "/generate")
        self._cancelled.discard(spec.request_id)
        return self.parse_reply(reply, prompt_len=len(spec.input_ids), version=version)

    def parse_reply(self, reply: dict[str, Any], *, prompt_len: int, version: int) -> Generation:
        """A ``Generation`` from one ``/generate`` answer (SGLang's native response layout)."""
        meta = reply.get("meta_info")
        if not isinstance(meta, dict):
            raise SGLangError(f"/generate answer has no meta_info: {str(reply)[:200]}")
        entries = meta.get("output_token_logprobs")
        if entries is None:
            raise SGLangError("/generate answer lacks meta_info.output_token_logprobs (was return_logprob dropped?)")
        output_ids = reply.get("output_ids")
        if output_ids is None:
            output_ids = [int(e[1]) for e in entries]
        if len(output_ids) != len(entries):
            raise SGLangError(f"{len(output_ids)} output ids but {len(entries)} logprobs")
        logprobs = np.asarray([e[0] for e in entries], dtype=np.float32)
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else finish
        reason: FinishReason = _FINISH.get(kind, "error") if kind is not None else "error"
        routing = None
        if self.config.capture_routing and output_ids and not (reason == "cancelled" and "routed_experts" not in meta):
            routing = self._routing(meta, rows=prompt_len + len(output_ids) - 1)
        served = meta.get("weight_version")
        if served is not None and str(served).isdigit():
            version = int(served)
        return Generation(prompt_len, np.asarray(output_ids, dtype=np.int32), logprobs, routing, reason, version)

    def _routing(self, meta: dict[str, Any], rows: int) -> np.ndarray:
        encoded = meta.get("routed_experts")
        if encoded is None:
            raise SGLangError("/generate answer lacks meta_info.routed_experts; start the server with "
                              "--enable-return-routed-experts (or set capture_routing = false)")
        flat = np.frombuffer(base64.b64decode(encoded), dtype="<i4")
        layers, top_k = self.model.num_layers, self.model.top_k
        if flat.size != rows * layers * top_k:
            raise SGLangError(f"routed_experts holds {flat.size} ids, expected rows*layers*k = "
                              f"{rows}*{layers}*{top_k}; does the server run the model of ModelConfig?")
        if flat.size and (flat.min() < 0 or flat.max() >= self.model.num_experts):
            raise SGLangError(f"routed_experts names expert ids outside [0, {self.model.num_experts})")
        return flat.reshape(rows, layers, top_k).astype(routing_dtype(self.model.num_experts))


async def _engine(client: httpx.AsyncClient, url: str) -> EngineInfo:
    """The server's ``EngineInfo``; ``BackendUnavailable`` when nothing answers at ``url``."""
    try:
        response = await client.get("/get_server_info", timeout=30.0)
    except httpx.TransportError as exc:
        raise BackendUnavailable(f"no SGLang server answers at {url}: {exc!r} (start one with t1-sglang-serve, "
                                 "or set [sampler] sglang_server = \"local\")") from exc
    if response.status_code >= 400:  # a server without the endpoint still serves; its version is unknown
        return EngineInfo("sglang", "unknown", "unknown")
    return engine_from_server_info(_json(response, "/get_server_info"))


def _empty(prompt_len: int, reason: FinishReason, version: int) -> Generation:
    return Generation(prompt_len, np.zeros(0, np.int32), np.zeros(0, np.float32), None, reason, version)


def _json(response: httpx.Response, endpoint: str) -> dict[str, Any]:
    if response.status_code >= 400:
        raise SGLangError(f"{endpoint}: HTTP {response.status_code}: {response.text[:300]}")
    try:
        reply = response.json()
    except ValueError:
        raise SGLangError(f"{endpoint}: answer is not JSON: {response.text[:200]!r}") from None
    if isinstance(reply, list) and len(reply) == 1:
        reply = reply[0]
    if not isinstance(reply, dict):
        raise SGLangError(f"{endpoint}: expected a JSON object, got {type(reply).__name__}")
    return reply
