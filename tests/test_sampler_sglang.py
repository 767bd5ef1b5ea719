"""SGLang client against a local HTTP stand-in (tests/sglang_standin.py, a TEST DOUBLE backed by the
torch policy), for wire details and faults: malformed answers, HTTP errors, a server without
/get_server_info. The same behaviours against the REAL SGLang server (ids, logprobs, routing, abort,
weight updates, a dead server): tests/test_sglang_real.py."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import torch
import trio
from _trio import trio_test
from fixtures.models import tiny_model_config
from sglang_standin import SGLangStandIn

from t1_actors.backends.sampler_backend import GenerateSpec, SamplerBackend, SamplerConfig, open_sampler_backend
from t1_actors.backends.sglang_sampler import SGLangError, SGLangSampler
from t1_actors.policy import MoEPolicy
from t1_actors.policy.sampling import SamplingParams, generate

torch.set_num_threads(1)

CONFIG = tiny_model_config(num_layers=3)



def _policy(seed: int) -> MoEPolicy:
    torch.manual_seed(seed)
    policy = MoEPolicy(CONFIG).eval()
    with torch.no_grad():
        policy.lm_head.weight.normal_(0, 0.3)
    return policy


def _prompt(i: int) -> list[int]:
    return np.random.default_rng(i).integers(0, 128, size=4 + 2 * i).tolist()


@trio_test
async def test_generate_parses_ids_logprobs_and_routing():
    policy = _policy(0)
    with SGLangStandIn(policy) as server:
        config = SamplerConfig(backend="sglang", sglang_url=server.url)
        async with open_sampler_backend(config, model=CONFIG) as backend:
            assert isinstance(backend, SamplerBackend)
            specs = [GenerateSpec(f"r{i}", _prompt(i), SamplingParams(max_new_tokens=5 + i, temperature=0.8,
                                                                       top_p=0.95, seed=i, stop_ids=(3,)))
                     for i in range(3)]
            results = await backend.generate(specs)
        body = server.requests[0]
    assert body["return_logprob"] is True and body["return_routed_experts"] is True
    assert body["routed_experts_start_len"] == 0 and body["sampling_params"]["stop_token_ids"] == [3]
    for i, g in enumerate(results):
        want = generate(policy, [_prompt(i)], specs[i].params)[0]
        assert np.array_equal(g.output_ids, want.output_ids)
        np.testing.assert_allclose(g.logprobs, want.logprobs, atol=1e-6)
        assert g.routing.dtype == np.uint8 and np.array_equal(g.routing, want.routing)
        assert g.routing.shape == (len(_prompt(i)) + len(g.output_ids) - 1, CONFIG.num_layers, CONFIG.top_k)
        assert g.finish_reason == want.finish_reason and g.policy_version == 0


@trio_test
async def test_abort_request_cancels_mid_generation():
    with SGLangStandIn(_policy(1)) as server:
        async with SGLangSampler.open(SamplerConfig(sglang_url=server.url), model=CONFIG) as sampler:
            out = {}

            async def ask() -> None:
                long_one = GenerateSpec("long", _prompt(1), SamplingParams(max_new_tokens=100000))
                [out["g"]] = await sampler.generate([long_one])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                started = server.started("long")
                with trio.fail_after(60):
                    await trio.to_thread.run_sync(started.wait)
                await sampler.cancel("long")
    g = out["g"]
    assert g.finish_reason == "cancelled" and 0 < len(g.output_ids) < 100000
    assert g.routing.shape[0] == len(_prompt(1)) + len(g.output_ids) - 1


@trio_test
async def test_update_weights_from_disk_switches_versions(tmp_path):
    old, new = _policy(2), _policy(3)
    new.save(tmp_path / "v4")
    params = SamplingParams(max_new_tokens=8, seed=9)
    with SGLangStandIn(old) as server:
        async with SGLangSampler.open(SamplerConfig(sglang_url=server.url), model=CONFIG) as sampler:
            [before] = await sampler.generate([GenerateSpec("a", _prompt(2), params)])
            await sampler.load_weights(str(tmp_path / "v4"), version=4)
            [after] = await sampler.generate([GenerateSpec("b", _prompt(2), params)])
            with pytest.raises(SGLangError, match="could not load policy version 5"):
                await sampler.load_weights(str(tmp_path / "nope"), version=5)
    assert sampler.version == 4
    assert before.policy_version == 0 and after.policy_version == 4
    assert np.array_equal(after.output_ids, generate(new, [_prompt(2)], params)[0].output_ids)


def test_malformed_answers_are_named():
    sampler = SGLangSampler(None, config=SamplerConfig(), model=CONFIG, version=0)  # type: ignore[arg-type]
    good_routing = base64.b64encode(np.zeros((3, 3, 2), "<i4").tobytes()).decode()
    meta = {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-1.0, 5, None], [-2.0, 6, None]],
            "routed_experts": good_routing}
    g = sampler.parse_reply({"meta_info": meta}, prompt_len=2, version=1)
    assert g.output_ids.tolist() == [5, 6] and g.routing.shape == (3, 3, 2)
    with pytest.raises(SGLangError, match="enable-return-routed-experts"):
        sampler.parse_reply({"meta_info": {**meta, "routed_experts": None}}, prompt_len=2, version=1)
    with pytest.raises(SGLangError, match="rows\\*layers\\*k"):
        sampler.parse_reply({"meta_info": meta}, prompt_len=5, version=1)
    bad_ids = base64.b64encode(np.full((3, 3, 2), 9, "<i4").tobytes()).decode()
    with pytest.raises(SGLangError, match="outside"):
        sampler.parse_reply({"meta_info": {**meta, "routed_experts": bad_ids}}, prompt_len=2, version=1)
    with pytest.raises(SGLangError, match="meta_info"):
        sampler.parse_reply({"text": "x"}, prompt_len=2, version=1)


@trio_test
async def test_http_errors_are_named():
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": "input_ids too long"})

    async with SGLangSampler.open(SamplerConfig(), model=CONFIG, transport=httpx.MockTransport(refuse)) as sampler:
        with pytest.raises(SGLangError, match="HTTP 400.*too long"):
            await sampler.generate([GenerateSpec("a", [1, 2], SamplingParams())])
