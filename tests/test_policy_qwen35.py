"""Qwen35MoePolicy: logits parity with transformers' Qwen3.5-MoE, checkpoint layouts, R3, cached sampling."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from t1_actors.policy import HybridCache, Qwen35MoeConfig, Qwen35MoePolicy, from_pretrained
from t1_actors.policy.sampling import ContinuousBatcher, SamplingParams, generate

torch.set_num_threads(1)
transformers = pytest.importorskip("transformers")

LIN, FULL = "linear_attention", "full_attention"
SMALL = Qwen35MoeConfig(vocab_size=61, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
                        num_experts=8, top_k=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                        linear_value_head_dim=8, layer_types=(LIN, FULL, LIN))


def _hf_config(num_experts: int, top_k: int, layer_types: list[str], tie: bool = False):
    return transformers.Qwen3_5MoeTextConfig(
        vocab_size=61, hidden_size=32, num_hidden_layers=len(layer_types), num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, num_experts=num_experts, num_experts_per_tok=top_k,
        layer_types=layer_types, tie_word_embeddings=tie,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5})


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Weights far from the init (norms, decays, routers) so that every term of the maths matters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = 1.0 if name.endswith("mlp.gate.weight") else 0.3 if "norm" in name or "A_log" in name else 0.2
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def _hf_model(seed: int, num_experts: int = 8, top_k: int = 2, layer_types=(LIN, FULL, LIN), tie: bool = False):
    model = transformers.Qwen3_5MoeForCausalLM(_hf_config(num_experts, top_k, list(layer_types), tie)).eval()
    _randomise(model, seed)
    return model


def _hf_logits_and_routing(hf, ids):
    captured = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: captured.append(o[2].view(*ids.shape, -1)))
             for layer in hf.model.layers]
    with torch.no_grad():
        logits = hf(ids).logits
    for h in hooks:
        h.remove()
    return logits, torch.stack(captured, dim=2)


PARITY = [  # seed, experts, top_k, layer types
    (0, 8, 2, (LIN, FULL, LIN)),
    (1, 16, 4, (FULL, LIN, LIN, FULL)),
    (2, 12, 3, (LIN, LIN, LIN, FULL)),
    (3, 6, 1, (FULL, FULL, LIN)),
]


@pytest.mark.parametrize("seed,num_experts,top_k,layer_types", PARITY)
def test_logits_and_routing_match_transformers(tmp_path, seed, num_experts, top_k, layer_types):
    hf = _hf_model(seed, num_experts, top_k, layer_types)
    hf.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path).eval()
    assert isinstance(ours, Qwen35MoePolicy) and ours.config.layer_types == layer_types
    assert ours.config.rotary_dim == 8 and ours.config.rope_theta == 5000.0
    ids = torch.randint(0, 61, (2, 19), generator=torch.Generator().manual_seed(seed))
    want, want_routing = _hf_logits_and_routing(hf, ids)
    with torch.no_grad():
        got = ours(ids, capture_routing=True)
    dlogit = (got.logits - want).abs().max().item()
    print(f"seed={seed} E={num_experts} k={top_k} layers={layer_types}: max|dlogit|={dlogit:.2e} "
          f"(max|logit|={want.abs().max().item():.2f})")
    assert dlogit < 1e-3
    assert torch.equal(got.routing, want_routing)
    assert len(torch.unique(got.routing)) > min(num_experts - 1, 3)  # several experts exercised


def test_save_roundtrip_and_transformers_loads_our_checkpoint(tmp_path):
    torch.manual_seed(0)
    ours = Qwen35MoePolicy(SMALL).eval()
    _randomise(ours, 5)
    ours.save(tmp_path)
    again = from_pretrained(tmp_path).eval()
    assert again.config == SMALL
    ids = torch.randint(0, 61, (2, 9))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == "Qwen3_5MoeForCausalLM"
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, again(ids).logits)
        assert (hf(ids).logits - ours(ids).logits).abs().max() < 1e-3


def test_fused_and_multimodal_layouts_load_and_unknown_ones_are_refused(tmp_path):
    hf = _hf_model(7, tie=True)
    ids = torch.randint(0, 61, (1, 12), generator=torch.Generator().manual_seed(1))
    want, _ = _hf_logits_and_routing(hf, ids)
    hf.save_pretrained(tmp_path / "text")
    config = json.loads((tmp_path / "text" / "config.json").read_text())
    ours = from_pretrained(tmp_path / "text").eval()
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    # fused: the 3D expert tensors as transformers holds them in memory
    fused = tmp_path / "fused"
    fused.mkdir()
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    save_file(state, str(fused / "model.safetensors"))
    (fused / "config.json").write_text(json.dumps(config))
    # multimodal: text weights under model.language_model., a vision tower and an MTP head beside them
    multi = tmp_path / "multi"
    multi.mkdir()
    prefixed = {k.replace("model.", "model.language_model.", 1): v for k, v in state.items()}
    prefixed["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    prefixed["mtp.fc.weight"] = torch.zeros(2, 2)
    save_file(prefixed, str(multi / "model.safetensors"))
    (multi / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "tie_word_embeddings": True,
                                                   "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                                                   "text_config": config, "vision_config": {"depth": 1}}))
    with torch.no_grad():
        for path in ("text", "fused", "multi"):
            assert (from_pretrained(tmp_path / path).eval()(ids).logits - want).abs().max() < 1e-3, path
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(config))
    odd = dict(state, **{"model.layers.0.mlp.experts.gate_proj": torch.zeros(8, 16, 32)})
    save_file(odd, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts\.gate_proj"):
        from_pretrained(bad)
    transposed = dict(state, **{"model.layers.1.mlp.experts.down_proj":  # [E, I, H] instead of [E, H, I]
                                state["model.layers.1.mlp.experts.down_proj"].transpose(1, 2).contiguous()})
    save_file(transposed, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts\.down_proj"):
        from_pretrained(bad)


def _model(seed: int = 0) -> Qwen35MoePolicy:
    torch.manual_seed(seed)
    model = Qwen35MoePolicy(SMALL).eval()
    _randomise(model, seed)
    return model


def test_replay_reproduces_live_forward_and_keeps_recorded_experts_after_perturbation():
    model = _model()
    ids = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        live = model(ids, capture_routing=True)
        replayed = model(ids, routing_replay=live.routing)
        assert torch.equal(replayed.logits, live.logits) and torch.equal(replayed.routing, live.routing)
        for layer in model.model.layers:  # the policy moved on: perturb every router
            layer.mlp.gate.weight.add_(torch.randn_like(layer.mlp.gate.weight))
        moved = model(ids, capture_routing=True)
        replay_moved = model(ids, routing_replay=live.routing)
    assert not torch.equal(moved.routing, live.routing), "perturbation should change the live routing"
    assert torch.equal(replay_moved.routing, live.routing)
    assert not torch.allclose(replay_moved.logits, moved.logits)
    record = model(ids, routing_replay=live.routing)  # the live router still gets the gradient
    record.logits.logsumexp(-1).sum().backward()
    assert all(layer.mlp.gate.weight.grad.abs().sum() > 0 for layer in model.model.layers)


def test_cache_and_left_padding_give_the_logits_of_a_full_forward():
    model = _model(1)
    long, short = torch.randint(0, 61, (1, 11)), torch.randint(0, 61, (1, 5))
    with torch.no_grad():
        full_long, full_short = model(long).logits, model(short).logits
        first = model(long[:, :6], use_cache=True)
        assert isinstance(first.past_key_values, HybridCache)
        rest = [model(long[:, i:i + 1], past_key_values=first.past_key_values, use_cache=True).logits
                for i in range(6, 11)]
        torch.testing.assert_close(torch.cat([first.logits, *rest], 1), full_long, atol=1e-5, rtol=1e-4)
        batch = torch.zeros(2, 11, dtype=torch.long)
        batch[0], batch[1, 6:] = long[0], short[0]
        mask = torch.ones(2, 11, dtype=torch.long)
        mask[1, :6] = 0
        out = model(batch, attention_mask=mask)
        torch.testing.assert_close(out.logits[0], full_long[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(out.logits[1, 6:], full_short[0], atol=1e-5, rtol=1e-4)
        cache = model(long[:, :4], use_cache=True).past_key_values
        with pytest.raises(ValueError, match="padding after a cached prefix"):
            model(long[:, 4:6], attention_mask=torch.tensor([[1, 1, 1, 1, 0, 1]]), past_key_values=cache,
                  use_cache=True)


def _uncached_sample(model, prompt: list[int], params: SamplingParams) -> list[int]:
    """The sampler's draw (exponential race, same generator) recomputing the whole sequence each step."""
    gen = torch.Generator().manual_seed(params.seed)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(params.max_new_tokens):
            logits = model(torch.tensor([seq])).logits[0, -1]
            probs = torch.log_softmax(logits / params.temperature, -1).exp()
            seq.append(int((probs / torch.empty(logits.shape[-1]).exponential_(generator=gen)).argmax()))
    return seq[len(prompt):]


def test_sampled_ids_with_cache_equal_ids_without_cache():
    model = _model(2)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 61, size=n).tolist() for n in (3, 9, 6)]
    with torch.no_grad():  # greedy: argmax through the cache vs argmax of full forwards
        seq = torch.tensor([prompts[1]])
        out = model(seq, use_cache=True)
        cached = [int(out.logits[0, -1].argmax())]
        for _ in range(7):
            out = model(torch.tensor([[cached[-1]]]), past_key_values=out.past_key_values, use_cache=True)
            cached.append(int(out.logits[0, -1].argmax()))
        full = list(prompts[1])
        for _ in range(8):
            full.append(int(model(torch.tensor([full])).logits[0, -1].argmax()))
    assert cached == full[len(prompts[1]):]
    # seeded, batched, with a late admission merged into the running batch (HybridCache.merge/select)
    params = [SamplingParams(max_new_tokens=n, temperature=0.8, seed=10 + i) for i, n in enumerate((8, 5, 7))]
    batcher = ContinuousBatcher(model, prefix_cache_tokens=1000)
    assert batcher.prefix_cache is None  # prefix reuse is off for recurrent states
    keys = [batcher.add(prompts[0], params[0], session="s"), batcher.add(prompts[1], params[1])]
    results = dict(batcher.step())
    keys.append(batcher.add(prompts[2], params[2]))
    while batcher.busy:
        results.update(batcher.step())
    for key, prompt, p in zip(keys, prompts, params):
        assert results[key].output_ids.tolist() == _uncached_sample(model, prompt, p)
    again = generate(model, prompts, params)
    assert [g.output_ids.tolist() for g in again] == [results[k].output_ids.tolist() for k in keys]
    assert again[0].routing.shape == (len(prompts[0]) + 8 - 1, SMALL.num_layers, SMALL.top_k)
