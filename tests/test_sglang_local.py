"""The SGLang pieces that need no server: the launcher's refusals, a campaign's local-server sizing and
config, the engine summary from a log, and a sampler error ending a trial as an infrastructure failure.
The real server itself: tests/test_sglang_real.py."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import trio
from fixtures.models import tiny_model_config

from schemas import SamplerTurn
from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.backends.sglang_server import SGLangServer, SGLangServerError, server_args
from t1_actors.job.config import parse_config
from t1_actors.job.local_sglang import sampler_engine, server_sizes, wants_local_server, with_sampler_url
from t1_actors.policy import MoEPolicy
from t1_actors.policy.generation import Generation
from t1_actors.rollout import RolloutLimits, run_trial
from t1_actors.schedule import CampaignConfig

SMALL = tiny_model_config(wide=True, vocab_size=64, hidden_size=16, num_layers=1, head_dim=8, moe_intermediate_size=8)


def _config(tmp_path, **sampler):
    return parse_config({"run": {"id": "x", "dir": str(tmp_path / "run")}, "sampler": sampler,
                         "campaign": {"max_context": 1024, "eval_concurrency": 8},
                         "staleness": {"batch_size": 4, "max_in_flight": 12}})


def test_a_missing_sglang_venv_is_named_with_the_setup_command(tmp_path):
    MoEPolicy(SMALL).save(tmp_path / "policy")
    with pytest.raises(SGLangServerError, match=r"no SGLang venv at .*nowhere.*\.ci/setup-sglang"):
        SGLangServer.start(tmp_path / "policy", venv=tmp_path / "nowhere")
    with pytest.raises(SGLangServerError, match="not a policy directory"):
        SGLangServer.start(tmp_path, venv=tmp_path / "nowhere")


def test_server_flags_are_the_cpu_engine_and_sized_from_the_arguments(tmp_path):
    args = server_args(tmp_path, port=1234, context_length=768, max_concurrent=16, dtype="float32", weight_version=3)
    for flag in ("--disable-cuda-graph", "--enable-return-routed-experts", "--skip-tokenizer-init"):
        assert flag in args
    valued = {a: args[i + 1] for i, a in enumerate(args) if a in ("--device", "--attention-backend", "--dtype",
              "--context-length", "--max-total-tokens", "--max-running-requests", "--weight-version", "--host")}
    assert valued == {"--device": "cpu", "--attention-backend": "torch_native", "--dtype": "float32",
                      "--context-length": "768", "--max-total-tokens": str(768 * 16), "--max-running-requests": "16",
                      "--weight-version": "3", "--host": "127.0.0.1"}


def test_a_local_server_run_is_sized_from_the_config_and_gets_its_url(tmp_path):
    local = _config(tmp_path, backend="sglang", sglang_server="local")
    assert wants_local_server(local) and not wants_local_server(_config(tmp_path, backend="sglang"))
    assert not wants_local_server(_config(tmp_path))
    assert server_sizes(local) == (1024, 12)  # [campaign] max_context; the most trials at once
    moved = with_sampler_url(local, "http://127.0.0.1:4321")
    assert moved.section(SamplerConfig).sglang_url == "http://127.0.0.1:4321"
    assert moved.section(SamplerConfig).sglang_server == "local" and moved.section(CampaignConfig).max_context == 1024


class _Log:
    def __init__(self, turns):
        self.turns = turns

    def events(self, kinds):
        assert kinds == ["sampler_turn"]
        return list(enumerate(self.turns))


def _turn(engine=None, version=None, start=None) -> SamplerTurn:
    return SamplerTurn(trial_id="t", turn=0, prompt_ids=np.arange(3, dtype=np.int32), sampled_ids=np.zeros(0, np.int32),
                       sampler_logprobs=np.zeros(0, np.float32), policy_version=0, finish_reason="length",
                       temperature=1.0, top_p=1.0, engine=engine, engine_version=version, engine_start_id=start)


def test_the_summary_names_the_engine_and_a_restart():
    assert sampler_engine(_Log([_turn()])) is None  # a log from before turns named their engine
    assert sampler_engine(_Log([_turn("sglang", "0.5.23", "a"), _turn("sglang", "0.5.23", "a")])) == \
        {"name": "sglang", "version": "0.5.23"}
    assert sampler_engine(_Log([_turn("sglang", "0.5.23", "a"), _turn("sglang", "0.5.23", "b")]))["start_ids"] == \
        ["a", "b"]


def test_a_sampler_error_ends_the_trial_as_an_infrastructure_failure():
    async def sample(prompt_ids, turn):
        return Generation(len(prompt_ids), np.zeros(0, np.int32), np.zeros(0, np.float32), None, "error", 0,
                          error="SGLang server at http://127.0.0.1:9 failed during /generate")

    async def execute(command, turn):
        raise AssertionError("nothing runs after a failed turn")

    rollout = trio.run(functools.partial(run_trial, "task", sample=sample, execute=execute, encode=lambda _: [1, 2],
                                         decode=lambda _: "", limits=RolloutLimits()))
    assert rollout.finish == "sampler_error" and rollout.turns == []
    assert rollout.infra_error == "sampler: SGLang server at http://127.0.0.1:9 failed during /generate"
