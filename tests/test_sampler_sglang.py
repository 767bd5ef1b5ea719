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
from t1_actors.sampler import SamplerActor

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


@trio_test
async def test_the_sampler_actor_waits_out_a_server_restart_and_fails_a_lasting_outage_once(tmp_path):
    """Through the sampler actor: a turn sent while its server is gone waits for it and is answered once a new
    server serves the same URL (a supervised local server's restart): a real turn, not an error. A server gone for
    longer than ``sglang_server_wait_s`` makes the turn an infrastructure failure naming the URL, and the next turn
    fails without waiting again; once a server answers, turns are served again."""
    from schemas import GenerateRequest, SamplerTurn
    from storage import EventLog
    from t1_actors.job.config import parse_config
    from t1_actors.runtime.host import serve_actor
    from t1_actors.runtime.peers import connect

    wait_s = 8.0
    policy = _policy(0)
    first = SGLangStandIn(policy).__enter__()
    config = parse_config({
        "run": {"id": "outage", "dir": str(tmp_path / "run"), "hmac_key": "k" * 32}, "model": CONFIG.model_dump(),
        "campaign": {"max_context": CONFIG.max_position},
        "sampler": {"backend": "sglang", "sglang_url": first.url, "sglang_server_wait_s": wait_s},
        "actors": [{"name": "sampler-0", "role": "sampler", "actor_class": "t1_actors.sampler:SamplerActor"}]})

    def request(trial: str) -> GenerateRequest:
        return GenerateRequest(trial_id=trial, turn=0, input_ids=np.asarray(_prompt(2), np.int32), max_new_tokens=6,
                               temperature=1.0, top_p=1.0, seed=1)

    servers = [first]
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_actor, SamplerActor, config, "sampler-0")
            async with connect(config, "test") as peers:
                sampler = peers("sampler")
                served = await sampler.call(request("served"), deadline_s=60)  # the backend is open
                first.__exit__()  # gone before the next turn is sent; back on its URL 2 s into the turn's wait

                async def come_back_soon() -> None:
                    await trio.sleep(2.0)
                    servers.append(SGLangStandIn(policy, port=first.port).__enter__())

                nursery.start_soon(come_back_soon)
                restarted = await sampler.call(request("restart"), deadline_s=60)
                servers[-1].__exit__()  # gone for good this time
                start = trio.current_time()
                lost = await sampler.call(request("lost"), deadline_s=60)
                waited_s = trio.current_time() - start
                start = trio.current_time()
                after = await sampler.call(request("after"), deadline_s=60)
                after_s = trio.current_time() - start
                servers.append(SGLangStandIn(policy, port=first.port).__enter__())
                back = await sampler.call(request("back"), deadline_s=60)
            nursery.cancel_scope.cancel()
    servers[-1].__exit__()
    assert len(servers) == 3 and len(servers[1].requests) == 1 and len(servers[2].requests) == 1
    want = generate(policy, [_prompt(2)], SamplingParams(max_new_tokens=6, temperature=1.0, seed=1))[0]
    for reply in (served, restarted, back):
        assert reply.finish_reason == want.finish_reason and np.array_equal(reply.output_ids, want.output_ids)
    assert lost.finish_reason == after.finish_reason == "error" and first.url in lost.error
    assert waited_s >= wait_s - 5.0 and after_s < wait_s - 5.0  # the second turn of the outage did not wait
    turns = {turn.trial_id: turn for _, turn in EventLog.open(tmp_path / "run" / "log").events(kinds=["sampler_turn"])}
    assert isinstance(turns["restart"], SamplerTurn) and turns["restart"].finish_reason != "error"
    assert [turns[t].finish_reason for t in ("lost", "after")] == ["error", "error"]
