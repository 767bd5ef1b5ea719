"""configs/scale_cluster.toml, the deployment of docs/scale.md, passes ``t1-actor check`` and says what the
guide says: SGLang samplers returning routed experts, one per host; the megatron learner replaying them; Daytona
sandboxes; the log on S3; every actor on tcp://."""

from __future__ import annotations

from pathlib import Path

from storage.config import StorageConfig
from t1_actors import cli
from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.backends.sandbox_backend import SandboxConfig
from t1_actors.job.config import load_config
from t1_actors.learner import LearnerConfig
from t1_actors.policy.config import ModelConfig

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "scale_cluster.toml"


def test_the_scale_config_passes_check(capsys):
    assert cli.main(["check", "--config", str(CONFIG)]) == 0
    assert "9 actors" in capsys.readouterr().out


def test_the_scale_config_is_the_deployment_the_guide_describes():
    config = load_config(CONFIG)
    assert config.section(StorageConfig).url.startswith("s3://")
    sampler = config.section(SamplerConfig)
    assert sampler.backend == "sglang" and sampler.capture_routing
    assert sampler.sglang_url.startswith("http://127.0.0.1:")  # each sampler drives its own host's replica
    assert config.section(LearnerConfig).backend == "megatron" and config.section(LearnerConfig).replay
    assert config.section(SandboxConfig).backend == "daytona"
    samplers = config.actors_of("sampler")
    assert len({s.host for s in samplers}) == len(samplers) == 4
    assert all(config.control_address(s).startswith("tcp://") for s in config.actors)
    model = config.section(ModelConfig)
    assert (model.num_layers, model.num_experts, model.top_k) == (48, 128, 8)
