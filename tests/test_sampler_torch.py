"""Torch sampling backend under trio: batching of concurrent requests, cancel, weight swaps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import trio
from _trio import trio_test
from fixtures.models import tiny_model_config

from t1_actors.backends.sampler_backend import GenerateSpec, SamplerBackend, SamplerConfig, open_sampler_backend
from t1_actors.backends.torch_sampler import TorchSampler
from t1_actors.policy import MoEPolicy
from t1_actors.policy.sampling import SamplingParams, generate

torch.set_num_threads(1)

CONFIG = tiny_model_config()


def _policy(seed: int) -> MoEPolicy:
    torch.manual_seed(seed)
    policy = MoEPolicy(CONFIG).eval()
    with torch.no_grad():
        policy.lm_head.weight.normal_(0, 0.3)
    return policy


def _prompt(i: int) -> list[int]:
    return np.random.default_rng(i).integers(0, 128, size=5 + 3 * i).tolist()



async def _until(predicate, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.001)


@trio_test
async def test_concurrent_requests_share_batches_and_match_solo_generation():
    policy = _policy(0)
    sampler_config = SamplerConfig(batch_window_s=0.01)
    results = {}
    async with TorchSampler.open(policy, config=sampler_config) as sampler:
        assert isinstance(sampler, SamplerBackend)
        widths = []
        step = sampler._batcher.step
        sampler._batcher.step = lambda admit=True: (widths.append(sampler._batcher.active), step(admit))[1]

        async def ask(i: int) -> None:
            spec = GenerateSpec(f"r{i}", _prompt(i), SamplingParams(max_new_tokens=6 + i, seed=i))
            [results[i]] = await sampler.generate([spec])

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(ask, i)
    assert max(widths) >= 2, "concurrent requests should decode in one batch"
    for i in range(6):
        solo = generate(policy, [_prompt(i)], SamplingParams(max_new_tokens=6 + i, seed=i))[0]
        assert np.array_equal(results[i].output_ids, solo.output_ids)
        assert np.array_equal(results[i].routing, solo.routing)
        np.testing.assert_allclose(results[i].logprobs, solo.logprobs, atol=2e-5)
        assert results[i].policy_version == 0 and results[i].finish_reason == "length"


@trio_test
async def test_cancel_one_request_mid_generation():
    async with TorchSampler.open(_policy(1)) as sampler:
        out = {}

        async def ask(name: str, n: int) -> None:
            [out[name]] = await sampler.generate([GenerateSpec(name, _prompt(2), SamplingParams(max_new_tokens=n, seed=1))])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "long", 5000)
            nursery.start_soon(ask, "short", 20)
            await _until(lambda: any(len(s.output) >= 3 for s in sampler._batcher._rows))
            await sampler.cancel("long")
        assert out["long"].finish_reason == "cancelled" and 3 <= len(out["long"].output_ids) < 5000
        assert out["long"].routing.shape[0] == len(_prompt(2)) + len(out["long"].output_ids) - 1
        assert out["short"].finish_reason == "length" and len(out["short"].output_ids) == 20


@trio_test
async def test_a_caller_that_gives_up_frees_the_batch():
    async with TorchSampler.open(_policy(2)) as sampler:
        with trio.move_on_after(0.05):
            await sampler.generate([GenerateSpec("x", _prompt(3), SamplingParams(max_new_tokens=100000))])
        await _until(lambda: not sampler._batcher.busy)
        assert sampler.in_flight == 0


@trio_test
async def test_load_weights_waits_for_in_flight_generations(tmp_path):
    old, new = _policy(3), _policy(4)
    new.save(tmp_path / "v1")
    params = SamplingParams(max_new_tokens=40, seed=5)
    async with TorchSampler.open(old) as sampler:
        out = {}

        async def ask(name: str) -> None:
            [out[name]] = await sampler.generate([GenerateSpec(name, _prompt(4), params)])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "before")
            await _until(lambda: sampler._batcher.active == 1)
            await sampler.load_weights(str(tmp_path / "v1"), version=1)
        assert sampler.version == 1
        await ask("after")
        with pytest.raises(ValueError, match="could not load policy version 2"):
            await sampler.load_weights(str(tmp_path / "missing"), version=2)
        assert sampler.version == 1
    assert out["before"].policy_version == 0 and out["after"].policy_version == 1
    assert np.array_equal(out["before"].output_ids, generate(old, [_prompt(4)], params)[0].output_ids)
    assert np.array_equal(out["after"].output_ids, generate(new, [_prompt(4)], params)[0].output_ids)


@trio_test
async def test_open_sampler_backend_builds_the_configured_engine(tmp_path):
    _policy(5).save(tmp_path)
    config = SamplerConfig(dtype="bfloat16", capture_routing=False)
    async with open_sampler_backend(config, policy_path=str(tmp_path), version=7) as backend:
        [g] = await backend.generate([GenerateSpec("a", [1, 2, 3], SamplingParams(max_new_tokens=4, seed=0))])
    assert g.routing is None and len(g.output_ids) == 4 and g.policy_version == 7
    with pytest.raises(ValueError, match="needs a policy"):
        async with open_sampler_backend(SamplerConfig()):
            pass


@trio_test
async def test_a_bad_prompt_in_a_batch_is_refused_and_nothing_leaks():
    async with TorchSampler.open(_policy(6)) as sampler:
        good = GenerateSpec("good", [1, 2, 3], SamplingParams(max_new_tokens=3))
        with pytest.raises(ValueError, match="empty prompt"):
            await sampler.generate([good, GenerateSpec("bad", [], SamplingParams())])
        await _until(lambda: not sampler._batcher.busy)
        assert sampler.in_flight == 0 and not sampler._keys
        [g] = await sampler.generate([good])
    assert len(g.output_ids) == 3


@trio_test
async def test_sessions_reuse_their_previous_turn():
    policy = _policy(7)
    params = SamplingParams(max_new_tokens=5, seed=3)
    async with TorchSampler.open(policy) as sampler:
        [first] = await sampler.generate([GenerateSpec("t/0", _prompt(5), params, session_id="t")])
        follow_up = _prompt(5) + first.output_ids.tolist() + [7, 8, 9]
        [second] = await sampler.generate([GenerateSpec("t/1", follow_up, params, session_id="t")])
        assert sampler._batcher.reused_tokens == len(_prompt(5)) + len(first.output_ids) - 1
    solo = generate(policy, [follow_up], params)[0]
    assert np.array_equal(second.output_ids, solo.output_ids)
    assert np.array_equal(second.routing, solo.routing)
