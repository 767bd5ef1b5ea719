"""A campaign's whole config: ``RunConfig``, one typed field per section, validated with every rule across
sections before any process starts (``t1-actor launch``, ``check`` and every ``t1-actor ROLE`` refuse the same
configs).

Each section's model lives with the code that reads it (``[learner]`` in ``t1_actors.learner``, ``[campaign]`` in
``t1_actors.schedule`` ...); code below the job reads its section with ``config.section(Model)``. A rule across
sections is a model validator here and raises ``ValueError`` naming both keys and the fix; a value one key sets
for two sections is filled in before validation, never written into the frozen model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.backends.sandbox_backend import SandboxConfig
from t1_actors.critic import CriticConfig
from t1_actors.eval.protocol import EvalConfig
from t1_actors.job.slurm.config import SlurmConfig
from t1_actors.learner import LearnerConfig
from t1_actors.policy.config import ModelConfig
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.runtime import config as runtime_config
from t1_actors.runtime.config import RuntimeConfig
from t1_actors.schedule import CampaignConfig
from t1_actors.tasks.config import TasksConfig
from t1_actors.train.ppo import PPOConfig
from t1_actors.verify.engine import VerifierConfig


class RunConfig(RuntimeConfig):
    """A campaign: the runtime's sections (``[run]``, ``[transport]``, ``[supervisor]``, ``[[actors]]``,
    ``[storage]``) and one field per section of the recipe."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)
    campaign: CampaignConfig = Field(default_factory=CampaignConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)

    def routing_shape(self) -> tuple[int, int, int]:
        return (self.model.num_layers, self.model.top_k, self.model.num_experts)

    # ---- one key for two sections ---------------------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _learner_temperature(cls, data: Any) -> Any:
        """``[ppo] temperature`` left unset is ``[sampler] temperature``: the logprobs the sampler stores are at
        its temperature, so the learner's must be too (``_temperatures_agree``)."""
        if isinstance(data, dict) and "temperature" not in (data.get("ppo") or {}):
            sampler = data.get("sampler") or {}
            if isinstance(sampler, SamplerConfig):
                temperature = sampler.temperature
            else:
                temperature = sampler.get("temperature", SamplerConfig.model_fields["temperature"].default)
            ppo = data.get("ppo") or {}
            ppo = ppo.model_dump(exclude_unset=True) if isinstance(ppo, PPOConfig) else dict(ppo)
            data = {**data, "ppo": {**ppo, "temperature": temperature}}
        return data

    # ---- rules across sections ------------------------------------------------------------------
    @model_validator(mode="after")
    def _temperatures_agree(self) -> RunConfig:
        """PPO's ratio is only right when the learner takes logprobs at the temperature the sampler stored."""
        sampled, trained = self.sampler.temperature, self.ppo.temperature
        if sampled != trained:
            raise ValueError(f"[sampler] temperature = {sampled} but [ppo] temperature = {trained}; leave [ppo] "
                             "temperature unset (it follows [sampler] temperature) or set both to the same value "
                             "(the sampler stores logprobs at its temperature)")
        return self

    @model_validator(mode="after")
    def _groups_for_a_group_baseline(self) -> RunConfig:
        """A group baseline needs groups: with one trial per task every trajectory would fall back to GAE."""
        estimator, size = self.ppo.advantage_estimator, self.staleness.group_size
        if estimator == "rloo" and size < 2:
            raise ValueError(f"[ppo] advantage_estimator = 'rloo' but [staleness] group_size = {size}; set "
                             "group_size >= 2 (trials per task) or advantage_estimator = 'gae'")
        return self

    @model_validator(mode="after")
    def _part_of_policy_needs_torch(self) -> RunConfig:
        """Training part of the policy is the torch learner's: refused before any process starts otherwise."""
        if self.ppo.trains_part_of_policy and self.learner.backend != "torch":
            raise ValueError(f"[ppo] actor_params = {list(self.ppo.actor_params)} but [learner] backend = "
                             f"{self.learner.backend!r}, which trains the whole policy only; use backend = 'torch' "
                             "or actor_params = ['*']")
        return self

    @model_validator(mode="after")
    def _context_fits_the_model(self) -> RunConfig:
        """A trial's context is positions 0 .. max_context - 1 of the model: past ``max_position`` the served model
        (SGLang's context length, HF's config) refuses it or runs positions it was never trained at."""
        context, positions = self.campaign.max_context, self.model.max_position
        if context > positions:
            raise ValueError(f"[campaign] max_context = {context} is above [model] max_position = {positions}; lower "
                             f"max_context to at most {positions} or raise max_position to at least {context}")
        return self

    @model_validator(mode="after")
    def _sft_passes_have_a_source(self) -> RunConfig:
        """SFT passes read from elsewhere need an elsewhere: the run the SFT policy itself comes from."""
        if self.eval.sft_passes == "warm_start" and self.campaign.warm_start_from is None:
            raise ValueError("[eval] sft_passes = 'warm_start' but [campaign] warm_start_from is not set; name the "
                             "run whose SFT policy (and its eval passes) this run starts from, or set "
                             "sft_passes = 'run'")
        return self

    @model_validator(mode="after")
    def _probe_fits_the_run(self) -> RunConfig:
        """The validation probe needs validation tasks, at most as many as the split holds, and an RL phase long
        enough for a probe before its last step (that step's policy is the final eval's)."""
        every, size = self.eval.probe_every, self.eval.probe_tasks
        if not every:
            return self
        tasks = self.tasks
        split = tasks.validation_size + tasks.composite_validation + tasks.recovery_validation
        if split == 0:
            raise ValueError(f"[eval] probe_every = {every} but the validation split is empty ([tasks] "
                             "validation_size, composite_validation and recovery_validation are 0); give it tasks "
                             "or set probe_every = 0")
        if size is not None and size > split:
            raise ValueError(f"[eval] probe_tasks = {size} but the validation split holds {split} tasks ([tasks] "
                             "validation_size + composite_validation + recovery_validation); lower probe_tasks to at "
                             f"most {split}, or leave it unset for the whole split")
        steps = self.campaign.rl_steps
        if steps is not None and every >= steps:
            raise ValueError(f"[eval] probe_every = {every} but [campaign] rl_steps = {steps}: no probe would be "
                             f"played (none after RL's last step, the final eval's); set probe_every below {steps}, "
                             "or 0 for no probe")
        return self

    @model_validator(mode="after")
    def _slurm_hosts_are_config_hosts(self) -> RunConfig:
        """``[slurm.hosts.NAME]`` and ``control_host`` name hosts some actor runs on: a misspelt one would leave that
        host on the defaults (or no host to run the job) without a word."""
        hosts = sorted({spec.host for spec in self.actors})
        named = [(f"[slurm.hosts.{name}]", name) for name in self.slurm.hosts]
        if self.slurm.control_host is not None:
            named.append((f"[slurm] control_host = {self.slurm.control_host!r}", self.slurm.control_host))
        for key, name in named:
            if name not in hosts:
                raise ValueError(f"{key}: no [[actors]] entry has host = {name!r} (hosts: {', '.join(hosts)}); "
                                 "name one of them, or give an actor that host")
        return self

    @model_validator(mode="after")
    def _tokenizer_is_whole(self) -> RunConfig:
        """An HF tokenizer directory must be there, whole, before the run starts: the SFT chats, every prompt,
        the stop id and the model's vocabulary all come from it."""
        campaign = self.campaign
        if campaign.tokenizer is None:
            return self
        if campaign.warm_start_from is not None:
            raise ValueError(f"[campaign] tokenizer = {campaign.tokenizer!r} but warm_start_from is set, which reuses "
                             "that run's tokenizer (and the policy trained with it); drop one of the two keys")
        directory = Path(campaign.tokenizer)
        missing = [name for name in ("tokenizer.json", "tokenizer_config.json") if not (directory / name).is_file()]
        if missing:
            fetch = " (Qwen3's: run `bash .ci/fetch-qwen3-tokenizer`)" if "qwen3" in directory.name.lower() else ""
            raise ValueError(f"[campaign] tokenizer = {campaign.tokenizer!r}: no {' or '.join(missing)} in "
                             f"{directory.absolute()}; point it at an HF tokenizer directory with both files{fetch}, "
                             "or remove the key to train t1's own BPE")
        return self


def parse_config(data: dict[str, Any], source: str = "<config>") -> RunConfig:
    """Validate a mapping as a campaign's config: every section, then every rule across sections."""
    return runtime_config.parse_config(data, source, RunConfig)


def load_config(path: str | os.PathLike[str], *, quick: bool = False,
                run_dir: str | os.PathLike[str] | None = None) -> RunConfig:
    """Read and validate a campaign's config file (``[quick.*]`` applied with ``quick``; ``run_dir`` replaces
    ``[run] dir``)."""
    return runtime_config.load_config(path, quick=quick, run_dir=run_dir, model=RunConfig)
