"""Model policies of `t1-actor eval`: where the weights, tokenizer, limits and sampler of each come from.

    run:RUN[@VERSION]   a t1 run: its weights (newest version by default), tokenizer, [model], [campaign]
                        limits and [sampler] temperature; served by t1's torch sampler
    hf:DIR              a Hugging Face directory: config.json + *.safetensors (Qwen3-MoE or Qwen3.5-MoE) and
                        its tokenizer with chat template (or ``--tokenizer``); served by t1's torch sampler
    sglang:URL          a model a running SGLang server serves (``t1-sglang-serve``): ``--tokenizer`` is
                        required (an HF tokenizer directory, a tokenizer.json, or a t1 run directory); the
                        model's shape (for the routing record) comes from the config.json of the server's
                        ``model_path`` or of ``--model-config``

Every problem is a ``ConfigError`` raised while the arguments are read, before a sandbox or a log exists.
Limits (turns, new tokens, context) default to the run's for ``run:`` and to ``[campaign]``'s defaults
otherwise; the ``--max-*`` flags override either.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import torch

from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.backends.sglang_sampler import SGLangSampler
from t1_actors.backends.torch_sampler import TorchSampler
from t1_actors.job.config import load_config
from t1_actors.layout import published_versions, tokenizer_path, weights_dir
from t1_actors.policy import MoEPolicy
from t1_actors.policy._hf import config_from_hf, from_pretrained
from t1_actors.policy.config import ModelConfig
from t1_actors.policy.tokenizer import load_tokenizer
from t1_actors.runtime.config import ConfigError
from t1_actors.schedule import CampaignConfig

__all__ = ["ModelSource", "model_source", "is_model_policy"]

PREFIXES = ("run:", "hf:", "sglang:")


def is_model_policy(spec: str) -> bool:
    return spec.startswith(PREFIXES)


@dataclass(frozen=True)
class ModelSource:
    """What a model policy needs to play: the sampler it opens, its tokenizer, shape, version and limits."""

    spec: str
    tokenizer: Path
    model: Any  # the policy's config: num_layers, top_k, num_experts (the log's routing record)
    version: int
    temperature: float
    campaign: CampaignConfig  # rollout limits and max_new_tokens
    weights: Path | None = None  # run:/hf: (t1's torch sampler)
    sglang_url: str | None = None  # sglang:

    @asynccontextmanager
    async def open_sampler(self, threads: int) -> AsyncIterator[Any]:
        """The sampler backend serving this policy (closed on exit)."""

        if self.sglang_url is not None:
            config = SamplerConfig(backend="sglang", sglang_url=self.sglang_url)
            async with SGLangSampler.open(config, model=self.model, version=self.version) as sampler:
                yield sampler
            return

        torch.set_num_threads(threads)
        policy = _load_weights(self.spec, self.weights)
        async with TorchSampler.open(policy, config=SamplerConfig(max_batch=64), version=self.version) as sampler:
            yield sampler

    def routing_shape(self) -> dict[str, Any]:
        return {"routing_shape": (self.model.num_layers, self.model.top_k), "num_experts": self.model.num_experts}


def model_source(spec: str, *, temperature: float | None = None, tokenizer: str | None = None,
                 model_config: str | None = None, limits: dict[str, int | str | None] | None = None) -> ModelSource:
    """Read a ``run:``, ``hf:`` or ``sglang:`` policy's parts, or raise ``ConfigError`` naming the fix."""
    if tokenizer is not None and spec.startswith("run:"):
        raise ConfigError("--tokenizer: a run: policy plays with its run's own tokenizer; drop --tokenizer")
    if spec.startswith("run:"):
        source = _run_source(spec, temperature)
    elif spec.startswith("hf:"):
        source = _hf_source(spec, temperature, tokenizer)
    elif spec.startswith("sglang:"):
        source = _sglang_source(spec, temperature, tokenizer, model_config)
    else:
        raise ConfigError(f"--policy {spec!r}: not a model policy ({', '.join(p + '...' for p in PREFIXES)})")
    wanted = {k: v for k, v in (limits or {}).items() if v is not None}
    if wanted:
        try:
            campaign = type(source.campaign).model_validate({**source.campaign.model_dump(), **wanted})
        except ValueError as exc:
            raise ConfigError(f"--max-turns / --max-new-tokens / --max-context / --context-strategy / "
                              f"--keep-last-turns / --tool-output-chars: {exc}") from None
        source = replace(source, campaign=campaign)
    return source


def _run_source(spec: str, temperature: float | None) -> ModelSource:
    run, _, version = spec[len("run:"):].partition("@")
    run_dir = Path(run)
    config_path = run_dir / "config.resolved.json"
    if not config_path.is_file():
        raise ConfigError(f"--policy {spec}: {config_path} not found; name a run directory t1-actor launch wrote")
    versions = published_versions(run_dir)
    if not versions:
        raise ConfigError(f"--policy {spec}: no weights under {run_dir / 'weights'}")
    try:
        chosen = versions[-1] if not version else int(version)
    except ValueError:
        raise ConfigError(f"--policy {spec}: @{version} is not a version number (e.g. run:{run}@0)") from None
    if chosen not in versions:
        raise ConfigError(f"--policy {spec}: no version {chosen} in {run_dir / 'weights'} (it has {versions})")
    config = load_config(config_path)
    return ModelSource(spec=spec, tokenizer=tokenizer_path(run_dir), model=config.section(ModelConfig), version=chosen,
                       temperature=config.section(SamplerConfig).temperature if temperature is None else temperature,
                       campaign=config.section(CampaignConfig), weights=weights_dir(run_dir, chosen))


def _hf_source(spec: str, temperature: float | None, tokenizer: str | None) -> ModelSource:

    directory = Path(spec[len("hf:"):])
    model = _hf_config(directory / "config.json", f"--policy {spec}")
    if not any(directory.glob("*.safetensors")):
        raise ConfigError(f"--policy {spec}: no *.safetensors in {directory} (only safetensors checkpoints load)")
    return ModelSource(spec=spec, tokenizer=_tokenizer(tokenizer or directory, spec), model=model, version=0,
                       temperature=1.0 if temperature is None else temperature, campaign=CampaignConfig(),
                       weights=directory)


def _sglang_source(spec: str, temperature: float | None, tokenizer: str | None,
                   model_config: str | None) -> ModelSource:
    url = spec[len("sglang:"):].rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--policy {spec}: write the server's URL, e.g. sglang:http://127.0.0.1:30000")
    if tokenizer is None:
        raise ConfigError(f"--policy {spec}: a served model needs --tokenizer (an HF tokenizer directory, a "
                          "tokenizer.json, or the t1 run directory whose policy the server serves)")
    try:
        info = httpx.get(f"{url}/get_server_info", timeout=30.0).raise_for_status().json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ConfigError(f"--policy {spec}: no SGLang server answers at {url} ({exc!r}); start one with "
                          "`t1-sglang-serve POLICY_DIR`") from None
    served = Path(str(info.get("model_path", "")))
    config_file = Path(model_config) / "config.json" if model_config else served / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"--policy {spec}: the server's model_path {served} is not readable here; pass "
                          "--model-config DIR (the served model's config.json is in DIR)")
    version = str(info.get("weight_version", "0"))
    return ModelSource(spec=spec, tokenizer=_tokenizer(tokenizer, spec),
                       model=_hf_config(config_file, f"--policy {spec}"),
                       version=int(version) if version.isdigit() else 0,
                       temperature=1.0 if temperature is None else temperature, campaign=CampaignConfig(),
                       sglang_url=url)


def _hf_config(path: Path, what: str):
    if not path.is_file():
        raise ConfigError(f"{what}: {path} not found; an HF model directory holds config.json + *.safetensors")
    try:
        return config_from_hf(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{what}: {path} is not a Qwen3-MoE / Qwen3.5-MoE config: {exc}") from None


def _tokenizer(source: str | Path, spec: str) -> Path:
    """A tokenizer path ``policy.load_tokenizer`` takes; a t1 run directory means its tokenizer."""
    path = Path(source)
    if (path / "config.resolved.json").is_file():
        path = tokenizer_path(path)
    try:
        load_tokenizer(path)
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"--policy {spec}: tokenizer {path}: {exc}") from None
    return path


def _load_weights(spec: str, weights: Path):
    if spec.startswith("hf:"):
        return from_pretrained(weights, dtype=None).float().eval()

    return MoEPolicy.load(weights)
