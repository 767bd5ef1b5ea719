"""Batched KV-cached sampling: logprobs at temperature, routing of all fed tokens, seeds, stops, cancel."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures.models import tiny_model_config

from schemas import routing_dtype
from t1_actors.policy import MoEPolicy
from t1_actors.policy.sampling import ContinuousBatcher, SamplingParams, generate, nucleus_mask

torch.set_num_threads(1)

CONFIG = tiny_model_config()


@pytest.fixture(scope="module")
def model() -> MoEPolicy:
    torch.manual_seed(0)
    m = MoEPolicy(CONFIG).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.mlp.gate.weight.normal_(0, 1.0)
        m.lm_head.weight.normal_(0, 0.3)  # a peaked distribution, so top-p matters
    return m


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 128, size=int(rng.integers(3, 30))).tolist() for _ in range(n)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_routing_match_a_full_forward(model, temperature):
    prompts = _prompts(5)
    params = [SamplingParams(max_new_tokens=12, temperature=temperature, top_p=0.9, seed=i) for i in range(5)]
    for prompt, g in zip(prompts, generate(model, prompts, params)):
        seq = torch.tensor([prompt + g.output_ids.tolist()])
        with torch.no_grad():
            out = model(seq, capture_routing=True)
        logprobs = torch.log_softmax(out.logits[0, len(prompt) - 1:-1] / temperature, -1)
        want = logprobs.gather(-1, torch.as_tensor(g.output_ids, dtype=torch.long)[:, None]).squeeze(-1)
        np.testing.assert_allclose(g.logprobs, want.numpy(), atol=2e-5)
        assert g.routing.dtype == routing_dtype(CONFIG.num_experts)
        assert g.routing.shape == (len(prompt) + len(g.output_ids) - 1, CONFIG.num_layers, CONFIG.top_k)
        assert np.array_equal(g.routing, out.routing[0, :-1].numpy())
        assert g.finish_reason == "length" and len(g.output_ids) == 12


def test_seeded_sequences_do_not_depend_on_batch_company(model):
    prompts = _prompts(6, seed=1)
    params = [SamplingParams(max_new_tokens=10, seed=100 + i) for i in range(6)]
    batched = generate(model, prompts, params)
    alone = generate(model, [prompts[2]], params[2])[0]
    assert np.array_equal(batched[2].output_ids, alone.output_ids)
    again = generate(model, prompts, params)
    assert all(np.array_equal(a.output_ids, b.output_ids) for a, b in zip(batched, again))
    other_seed = generate(model, [prompts[2]], params[2].model_copy(update={"seed": 7}))[0]
    assert not np.array_equal(other_seed.output_ids, alone.output_ids)


def test_stop_ids_end_a_sequence_and_others_go_on(model):
    prompts = _prompts(4, seed=2)
    free = generate(model, prompts, SamplingParams(max_new_tokens=15, seed=3))
    stop = int(free[0].output_ids[4])
    first_hit = int(np.argmax(free[0].output_ids == stop))
    stopped = generate(model, prompts, SamplingParams(max_new_tokens=15, seed=3, stop_ids=(stop,)))
    assert stopped[0].finish_reason == "stop" and len(stopped[0].output_ids) == first_hit + 1
    assert stopped[0].output_ids[-1] == stop
    assert stopped[0].routing.shape[0] == len(prompts[0]) + first_hit
    assert np.array_equal(stopped[0].output_ids, free[0].output_ids[:first_hit + 1])


def test_top_p_restricts_draws_to_the_nucleus(model):
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert nucleus_mask(probs, torch.tensor([0.7])).tolist() == [[True, True, False, False]]
    assert nucleus_mask(probs, torch.tensor([0.01])).tolist() == [[True, False, False, False]]
    # with a tiny top_p the draw is the argmax, whatever the seed
    prompt = _prompts(1, seed=4)
    greedy = [generate(model, prompt, SamplingParams(max_new_tokens=6, top_p=1e-6, seed=s))[0].output_ids
              for s in range(3)]
    assert all(np.array_equal(greedy[0], g) for g in greedy)
    seq = torch.tensor([prompt[0]])
    with torch.no_grad():
        for token in greedy[0]:
            assert int(model(seq).logits[0, -1].argmax()) == int(token)
            seq = torch.cat([seq, torch.tensor([[int(token)]])], 1)


def test_continuous_batching_admits_between_steps_and_cancels_one(model):
    batcher = ContinuousBatcher(model, max_batch=4)
    prompts = _prompts(5, seed=5)
    keys = [batcher.add(p, SamplingParams(max_new_tokens=8, seed=i)) for i, p in enumerate(prompts[:2])]
    results = dict(batcher.step())  # prefill of the first two
    late = batcher.add(prompts[2], SamplingParams(max_new_tokens=8, seed=2))
    victim = batcher.add(prompts[3], SamplingParams(max_new_tokens=50, seed=3))
    queued = batcher.add(prompts[4], SamplingParams(max_new_tokens=4, seed=4))  # batch full: waits
    for _ in range(3):
        results.update(batcher.step())
    assert batcher.active == 4 and batcher.busy
    batcher.cancel(victim)
    while batcher.busy:
        results.update(batcher.step())
    assert results[victim].finish_reason == "cancelled"
    assert 0 < len(results[victim].output_ids) < 50
    assert results[victim].routing.shape[0] == len(prompts[3]) + len(results[victim].output_ids) - 1
    # every sequence, whenever it joined, equals its solo generation
    for key, prompt, seed, n in [(keys[0], prompts[0], 0, 8), (keys[1], prompts[1], 1, 8),
                                 (late, prompts[2], 2, 8), (queued, prompts[4], 4, 4)]:
        solo = generate(model, [prompt], SamplingParams(max_new_tokens=n, seed=seed))[0]
        assert np.array_equal(results[key].output_ids, solo.output_ids)
        np.testing.assert_allclose(results[key].logprobs, solo.logprobs, atol=2e-5)
        assert np.array_equal(results[key].routing, solo.routing)


def test_should_stop_cancels_everything_between_tokens(model):
    calls = []
    out = generate(model, _prompts(3), SamplingParams(max_new_tokens=100, seed=0),
                   should_stop=lambda: calls.append(1) or len(calls) > 4)
    assert all(g.finish_reason == "cancelled" and len(g.output_ids) < 100 for g in out)


def test_bfloat16_sampling_stays_close_to_float32(model):
    prompts = _prompts(3, seed=6)
    params = SamplingParams(max_new_tokens=8, seed=1)
    half = generate(model, prompts, params, dtype=torch.bfloat16)
    for prompt, g in zip(prompts, half):
        seq = torch.tensor([prompt + g.output_ids.tolist()])
        with torch.no_grad():
            logits = model(seq).logits[0, len(prompt) - 1:-1]
        want = torch.log_softmax(logits, -1).gather(-1, torch.as_tensor(g.output_ids, dtype=torch.long)[:, None])
        assert np.abs(g.logprobs - want.squeeze(-1).numpy()).mean() < 0.05
    assert model.lm_head.weight.dtype == torch.float32  # the caller's model is untouched


def test_bad_prompts_are_refused(model):
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, [[]], SamplingParams())
    with pytest.raises(ValueError, match="outside"):
        generate(model, [[5000]], SamplingParams())


def test_padding_left_by_a_finished_long_prompt_is_trimmed(model):
    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, 128, size=100).tolist(), rng.integers(0, 128, size=5).tolist(),
               rng.integers(0, 128, size=6).tolist()]
    params = [SamplingParams(max_new_tokens=n, seed=i) for i, n in enumerate((1, 12, 12))]
    batcher = ContinuousBatcher(model, max_batch=3)
    keys = [batcher.add(p, sp) for p, sp in zip(prompts, params)]
    results = dict(batcher.step())  # prefill; the long prompt is done after its first token
    assert keys[0] in results and batcher._cache.length < 20  # its padding columns are gone
    while batcher.busy:
        results.update(batcher.step())
    for key, prompt, sp in zip(keys, prompts, params):
        solo = generate(model, [prompt], sp)[0]
        assert np.array_equal(results[key].output_ids, solo.output_ids)
        assert np.array_equal(results[key].routing, solo.routing)


def _run(batcher: ContinuousBatcher, items) -> dict:
    keys = [batcher.add(p, sp, session=session) for p, sp, session in items]
    results = {}
    while batcher.busy:
        results.update(batcher.step())
    return [results[k] for k in keys]


def test_a_sessions_next_turn_reuses_its_kept_prefix(model):
    rng = np.random.default_rng(9)
    first_prompts = [rng.integers(0, 128, size=n).tolist() for n in (20, 9)]
    params = [SamplingParams(max_new_tokens=6, seed=s) for s in (1, 2)]
    cached = ContinuousBatcher(model, prefix_cache_tokens=10_000)
    first = _run(cached, [(p, sp, f"trial-{i}") for i, (p, sp) in enumerate(zip(first_prompts, params))])
    assert len(cached.prefix_cache) == 2
    # turn 2: the whole conversation so far plus a tool response; a fresh session joins the same admission
    second_prompts = [p + g.output_ids.tolist() + rng.integers(0, 128, size=5).tolist()
                      for p, g in zip(first_prompts, first)]
    newcomer = rng.integers(0, 128, size=12).tolist()
    items = [(second_prompts[0], params[0], "trial-0"), (newcomer, params[1], "trial-9"),
             (second_prompts[1], params[1], "trial-1")]
    reused = _run(cached, items)
    assert cached.reused_tokens == sum(len(p) + len(g.output_ids) - 1 for p, g in zip(first_prompts, first))
    fresh = _run(ContinuousBatcher(model), items)
    for a, b, (prompt, _, _) in zip(reused, fresh, items):
        assert np.array_equal(a.output_ids, b.output_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5)
        assert a.routing.shape == (len(prompt) + len(a.output_ids) - 1, CONFIG.num_layers, CONFIG.top_k)
        assert np.array_equal(a.routing, b.routing)


def test_prefix_cache_is_dropped_on_divergence_and_on_a_new_policy(model):
    batcher = ContinuousBatcher(model, prefix_cache_tokens=10_000)
    prompt = list(range(1, 15))
    [g] = _run(batcher, [(prompt, SamplingParams(max_new_tokens=3, seed=0), "t")])
    edited = [99] + prompt[1:] + g.output_ids.tolist() + [5]  # TITO could not keep the prefix: full prefill
    _run(batcher, [(edited, SamplingParams(max_new_tokens=3, seed=0), "t")])
    assert batcher.reused_tokens == 0 and len(batcher.prefix_cache) == 1
    batcher.set_model(model)
    assert len(batcher.prefix_cache) == 0
    small = ContinuousBatcher(model, prefix_cache_tokens=10)
    _run(small, [(prompt, SamplingParams(max_new_tokens=3, seed=0), "t")])
    assert len(small.prefix_cache) == 0  # 16 kept tokens exceed the budget of 10
