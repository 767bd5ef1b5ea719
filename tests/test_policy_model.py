"""MoEPolicy: equivalence with transformers' Qwen3-MoE, KV cache, padding, save/load."""

from __future__ import annotations

import pytest
import torch
from fixtures.models import tiny_model_config

from t1_actors.policy import ModelConfig, MoEPolicy, from_pretrained

torch.set_num_threads(1)

SMALL = tiny_model_config(vocab_size=97, num_experts=6, max_position=256)


def _hf_model(norm_topk_prob: bool, tie: bool = False):
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3MoeConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
        norm_topk_prob=norm_topk_prob, rope_theta=5000.0, tie_word_embeddings=tie)
    config.rope_parameters = {"rope_type": "default", "rope_theta": 5000.0}
    torch.manual_seed(1)
    model = transformers.Qwen3MoeForCausalLM(config).eval()
    with torch.no_grad():  # random router weights so that routing is not degenerate
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_from_pretrained_matches_transformers_logits_and_routing(tmp_path, norm_topk_prob):
    hf = _hf_model(norm_topk_prob)
    hf.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path).eval()
    assert ours.config.norm_topk_prob is norm_topk_prob and ours.config.rope_theta == 5000.0
    ids = torch.randint(0, 97, (3, 17), generator=torch.Generator().manual_seed(0))
    captured = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: captured.append(o[2].view(3, 17, -1)))
             for layer in hf.model.layers]
    with torch.no_grad():
        want = hf(ids).logits
        got = ours(ids, capture_routing=True)
    for h in hooks:
        h.remove()
    torch.testing.assert_close(got.logits, want, atol=1e-5, rtol=1e-4)
    assert torch.equal(got.routing, torch.stack(captured, dim=2))
    assert len(torch.unique(got.routing)) > 2  # the comparison exercised several experts


def test_save_roundtrip_and_transformers_loads_our_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = MoEPolicy(SMALL).eval()
    ours.save(tmp_path / "v1")
    again = MoEPolicy.load(tmp_path / "v1").eval()
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, again(ids).logits)
        hf = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path / "v1").eval()
        torch.testing.assert_close(hf(ids).logits, ours(ids).logits, atol=1e-5, rtol=1e-4)


def test_tied_embeddings_roundtrip(tmp_path):
    torch.manual_seed(0)
    config = SMALL.model_copy(update={"tie_word_embeddings": True})
    ours = MoEPolicy(config)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    ours.save(tmp_path)
    again = MoEPolicy.load(tmp_path)
    assert again.lm_head.weight is again.model.embed_tokens.weight
    assert torch.equal(again.lm_head.weight, ours.lm_head.weight)


def test_kv_cache_and_left_padding_give_the_same_logits():
    torch.manual_seed(0)
    model = MoEPolicy(SMALL).eval()
    long, short = torch.randint(0, 97, (1, 11)), torch.randint(0, 97, (1, 7))
    with torch.no_grad():
        full_long, full_short = model(long).logits, model(short).logits
        # incremental decoding through the cache
        first = model(long[:, :6], use_cache=True)
        rest = [model(long[:, i:i + 1], past_key_values=first.past_key_values, use_cache=True).logits
                for i in range(6, 11)]
        torch.testing.assert_close(torch.cat([first.logits, *rest], 1), full_long, atol=1e-5, rtol=1e-4)
        # both rows in one left-padded batch
        batch = torch.zeros(2, 11, dtype=torch.long)
        batch[0], batch[1, 4:] = long[0], short[0]
        mask = torch.ones(2, 11, dtype=torch.long)
        mask[1, :4] = 0
        out = model(batch, attention_mask=mask, capture_routing=True)
    torch.testing.assert_close(out.logits[0], full_long[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.logits[1, 4:], full_short[0], atol=1e-5, rtol=1e-4)


def test_right_padding_matches_unpadded():
    torch.manual_seed(0)
    model = MoEPolicy(SMALL).eval()
    ids = torch.randint(0, 97, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 6 + [0] * 3])
    with torch.no_grad():
        torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, :6], model(ids).logits,
                                   atol=1e-5, rtol=1e-4)


def test_bad_inputs_name_the_problem():
    model = MoEPolicy(SMALL)
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.tensor([[97]]))
    with pytest.raises(ValueError, match="routing_replay"):
        model(torch.tensor([[1, 2]]), routing_replay=torch.zeros(1, 2, 2, 3, dtype=torch.long))
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained("/nonexistent")


def test_default_config_is_the_tiny_model():
    model = MoEPolicy(ModelConfig())
    assert 5.0e6 < model.num_parameters() < 6.0e6
    assert model.num_parameters(active=True) < model.num_parameters() / 2
    assert isinstance(model.backbone, torch.nn.Module)
