"""The narrow interface every sampling engine stands behind, and the run config's [sampler] section.

    async with open_sampler_backend(config, policy=...) as backend:
        [gen] = await backend.generate([GenerateSpec("trial-1/0", prompt_ids, SamplingParams(...))])
        await backend.cancel("trial-1/0")             # from another task: ends it with what it has
        await backend.load_weights(path, version=3)   # between generations

Backends: ``torch`` (embedded, ``torch_sampler.TorchSampler``) and ``sglang`` (HTTP client of an SGLang
server, ``sglang_sampler.SGLangSampler``). Both return ``Generation`` records whose logprobs are
``log_softmax(logits / T)`` of the sampled tokens (before top-p) and whose routing covers every fed
position: ``[len(prompt) + len(output) - 1, layers, k]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from t1_actors.policy import MoEPolicy
from t1_actors.policy.config import ModelConfig
from t1_actors.policy.generation import Generation
from t1_actors.policy.sampling import SamplingParams


@dataclass(frozen=True)
class GenerateSpec:
    """One generation to run: a request id (for cancel), the input ids, the sampling parameters.

    ``session_id`` (the trial) lets a backend keep this turn's KV for the session's next turn.
    """

    request_id: str
    input_ids: Sequence[int]
    params: SamplingParams
    session_id: str | None = None


@dataclass(frozen=True)
class EngineInfo:
    """Which engine serves: name (torch, sglang), its version, and an id of this start of it (a restarted
    server, which has lost the weight versions it loaded, has another)."""

    name: str
    version: str
    start_id: str


class BackendUnavailable(RuntimeError):
    """The engine cannot serve at all (its server is gone, refuses connections): an infrastructure failure
    of the turn, never the policy's. The message names the engine's address."""


@runtime_checkable
class SamplerBackend(Protocol):
    version: int  # policy version now loaded
    engine: EngineInfo  # recorded with every turn it serves

    async def generate(self, requests: list[GenerateSpec]) -> list[Generation]:
        """Run the requests (batched with whatever else is in flight); results in request order."""
        ...

    async def cancel(self, request_id: str) -> None:
        """End an in-flight request; its ``generate`` returns it with ``finish_reason='cancelled'``."""
        ...

    async def load_weights(self, path: str, version: int) -> None:
        """Load a published policy (HF Qwen3-MoE directory); applies between generations."""
        ...


class SamplerConfig(BaseModel):
    """[sampler]: which engine serves the policy and how. Defaults: the tiny embedded run.

    ``temperature`` and ``top_p`` are the defaults of a request that does not set them; the logprob
    stored per sampled token is ``log pi_T = log_softmax(logits / temperature)`` before top-p.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["torch", "sglang"] = Field(
        "torch", description="torch: the policy in the sampler's own process, with continuous batching (the torch "
                             "keys below); sglang: an SGLang server over HTTP (the sglang keys below)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the training trials (eval "
                                                      "passes also try [eval] temperatures); the learner takes its "
                                                      "logprobs at it too ([ppo] temperature)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: draw from the smallest set of most likely "
                                                      "tokens whose probability reaches top_p (1: off); the stored "
                                                      "logprobs are taken before top-p")
    max_new_tokens: int = Field(256, gt=0, description="not read by a campaign: every request carries its own turn "
                                                       "budget, [campaign] max_new_tokens")
    capture_routing: bool = Field(True, description="return the experts every MoE layer chose for each token, "
                                                    "which the learner replays (R3); sglang needs a server started "
                                                    "with --enable-return-routed-experts")
    # torch backend
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="torch backend: dtype the sampler runs the "
                                                                        "policy in (bfloat16: half the memory, "
                                                                        "logprobs further from the learner's)")
    max_batch: int = Field(64, gt=0, description="torch backend: most sequences decoded together; more requests "
                                                 "wait for a free row")
    batch_window_s: float = Field(0.005, ge=0, description="torch backend: after idling, wait this long to gather "
                                                           "concurrent requests into one prefill (0: start at once)")
    prefix_cache_tokens: int = Field(65536, ge=0, description="torch backend: KV-cache tokens kept for sessions' "
                                                              "next turns, so a trial's next turn prefills only its "
                                                              "new tokens (0: off)")
    torch_threads: int = Field(0, ge=0, description="torch backend: torch threads of the sampler process (0: "
                                                    "leave torch's default)")
    # sglang backend
    sglang_server: Literal["external", "local"] = Field(
        "external", description="external: a running server at sglang_url; local: the campaign starts one on "
                                "this machine's CPU for the run's policy (t1-sglang-serve) and stops it at the end")
    sglang_url: str = Field("http://127.0.0.1:30000", description="sglang backend: the server's base URL (an "
                                                                   "external server; a local one's is set by the "
                                                                   "campaign)")
    sglang_venv: str | None = Field(None, description="the SGLang venv of a local server (None: $T1_SGLANG_VENV, "
                                                      "else .venv-sglang at the repository root; .ci/setup-sglang)")
    sglang_start_timeout_s: float = Field(300.0, gt=0, description="time a local server has to start and answer "
                                                                   "/health (each restart too)")
    sglang_restart_limit: int = Field(3, ge=0, description="a local server that dies is restarted (with the run's "
                                                           "latest published weights) at most this many times")
    sglang_restart_backoff_s: float = Field(2.0, ge=0, description="wait before a local server's restart, doubled "
                                                                   "per restart")
    sglang_server_wait_s: float = Field(360.0, ge=0, description="sglang backend: how long a turn (or a version "
                                                                 "load) whose server stopped answering waits for it "
                                                                 "to answer again on its URL, as a supervised local "
                                                                 "server does once restarted, then sends it again; "
                                                                 "past it the turn is an infrastructure failure, and "
                                                                 "later turns do not wait until the server answers "
                                                                 "(0: fail at once)")
    request_timeout_s: float = Field(600.0, gt=0, description="sglang backend: HTTP timeout of a request to the "
                                                              "server, a whole generation included (connecting: 10 s)")
    weight_update_timeout_s: float = Field(600.0, gt=0, description="sglang backend: time the server has to load a "
                                                                    "newly published policy version")


@asynccontextmanager
async def open_sampler_backend(config: SamplerConfig, *, policy=None, policy_path: str | None = None,
                               model: ModelConfig | None = None, version: int = 0) -> AsyncIterator[SamplerBackend]:
    """The configured backend, running for the duration of the block (torch: its engine task).

    torch: serves ``policy`` (an ``MoEPolicy``) or the one saved at ``policy_path``. sglang: ``model``
    (the served model's shape) sizes the routing record.
    """
    if config.backend == "torch":
        from t1_actors.backends.torch_sampler import TorchSampler  # noqa: PLC0415 - cycle: torch_sampler imports this module at load

        if policy is None:
            if policy_path is None:
                raise ValueError("the torch sampler needs a policy (an MoEPolicy or policy_path to a saved one)")
            policy = MoEPolicy.load(policy_path)
        async with TorchSampler.open(policy, config=config, version=version) as backend:
            yield backend
    else:
        from t1_actors.backends.sglang_sampler import SGLangSampler  # noqa: PLC0415 - cycle: sglang_sampler imports this module at load

        async with SGLangSampler.open(config, model=model, version=version) as backend:
            yield backend
