"""Micro-batches and segments (``t1_actors.train.segments``): the same loss, gradient and outputs as one pass.

In float64 a 4k-token trajectory of a tiny MoE trained in segments of 1000 positions (a ragged last one)
must give the one-pass gradient to 1e-9 for the policy loss (with R3 replay and an entropy bonus) and the
critic's clipped value loss; the no-grad passes (logprobs, live routing, values) must agree too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures.models import tiny_model_config

from t1_actors.policy.config import ModelConfig
from t1_actors.policy.model import MoEPolicy
from t1_actors.policy.segment_kv import math_attention_backward, math_attention_with_lse, merge
from t1_actors.policy.value import ValueModel
from t1_actors.train import off_policy, ppo, segments
from t1_actors.train.batch import TrajectoryBatch
from t1_actors.train.passes import (
    TokenSums,
    Trainable,
    policy_backward,
    policy_logprobs,
    value_backward,
    value_estimates,
)
from t1_actors.train.segments import KVLayout

SMALL = tiny_model_config(vocab_size=96, num_experts=4, moe_intermediate_size=32, max_position=8192)


def _batch(lengths: list[int], config: ModelConfig, seed: int = 0) -> TrajectoryBatch:
    """Right-padded rows: alternating 'tool output' (no loss) and 'sampled turn' (loss) regions, a random
    routing record (R3 replays any valid record), sampler logprobs and old values near the model's scale."""
    gen = torch.Generator().manual_seed(seed)
    rows, width = len(lengths), max(lengths)
    token_ids = torch.randint(0, config.vocab_size, (rows, width), generator=gen)
    valid = torch.arange(width).expand(rows, width) < torch.tensor(lengths)[:, None]
    loss_mask = ((torch.arange(width) // 37) % 2 == 1).expand(rows, width) & valid
    loss_mask[:, 0] = False
    routing = torch.rand(rows, width - 1, config.num_layers, config.num_experts, generator=gen).argsort(-1)
    return TrajectoryBatch(
        token_ids=token_ids * valid, valid=valid, loss_mask=loss_mask,
        sampler_logprobs=(-4.6 + 0.3 * torch.randn(rows, width, generator=gen)) * loss_mask,
        rewards=torch.rand(rows, generator=gen), routing=routing[..., :config.top_k].contiguous(),
        old_values=0.1 * torch.randn(rows, width, generator=gen) * valid, trial_ids=tuple(f"t{i}" for i in range(rows)))


def _policy_trainable(policy: MoEPolicy, max_tokens: int | None) -> Trainable:
    def forward(inputs, routing, capture, cache=None):
        out = policy(inputs, routing_replay=routing, capture_routing=capture, past_key_values=cache)
        return out.logits, out.routing
    return Trainable(forward, list(policy.parameters()), torch.optim.SGD(policy.parameters(), lr=0.0),
                     max_tokens=max_tokens, kv_layout=KVLayout.of(policy.config, policy.model.embed_tokens.weight))


def _critic_trainable(model: ValueModel, max_tokens: int | None) -> Trainable:
    return Trainable(model, list(model.parameters()), torch.optim.SGD(model.parameters(), lr=0.0),
                     max_tokens=max_tokens, kv_layout=KVLayout.of(model.config, model.model.embed_tokens.weight))


def _grads(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype)
                      for p in module.parameters()])


def _policy_gradient(policy, batch, max_tokens, cfg, weights=None):
    policy.zero_grad(set_to_none=True)
    advantages = ppo.gae_advantages(ppo.terminal_rewards(batch.rewards, batch.action_mask), batch.old_values[:, 1:],
                                    batch.action_mask)
    rows = list(range(len(batch)))
    normalizer = batch.action_mask.sum().double().clamp(min=1)
    sums = TokenSums()
    loss = policy_backward(_policy_trainable(policy, max_tokens), batch, rows, batch.routing,
                           batch.sampler_logprobs[:, 1:] + 0.05, advantages, normalizer, cfg, sums, True, weights)
    return loss, _grads(policy), sums


@pytest.fixture(scope="module")
def long_batch() -> TrajectoryBatch:
    return _batch([4097], SMALL, seed=1)


def test_policy_gradient_in_segments_equals_one_pass_in_float64(long_batch):
    torch.manual_seed(0)
    policy = MoEPolicy(SMALL).double()
    cfg = ppo.PPOConfig(entropy_coef=0.01)
    loss_one, grad_one, sums_one = _policy_gradient(policy, long_batch, None, cfg)
    loss_seg, grad_seg, sums_seg = _policy_gradient(policy, long_batch, 1000, cfg)
    assert segments.plan([4096], 4096, 1000)[0].segments[-1] == (4000, 4096)  # five segments, a ragged last one
    assert grad_one.abs().max() > 1e-3  # a gradient worth comparing
    assert (grad_seg - grad_one).abs().max() <= 1e-9
    assert loss_seg == pytest.approx(loss_one, rel=1e-12, abs=1e-12)
    for name in ("clip", "kl", "entropy", "tokens", "gap", "gap_tokens"):
        assert getattr(sums_seg, name) == pytest.approx(getattr(sums_one, name), rel=1e-10, abs=1e-12)


def test_off_policy_weights_in_segments_equal_one_pass_and_one_weight_per_trajectory(long_batch):
    """A sequence-level weight is computed over the whole trajectory before segmenting: every segment of the
    row carries the same weight, and the segmented weighted gradient is the one-pass weighted gradient."""
    torch.manual_seed(0)
    policy = MoEPolicy(SMALL).double()
    cfg = ppo.PPOConfig(old_logprobs="recompute", off_policy_correction="truncate", off_policy_level="geometric",
                        off_policy_cap=1.05)
    mask = long_batch.action_mask
    prox = long_batch.sampler_logprobs[:, 1:].double() + 0.2 + 0.1 * torch.randn(mask.shape, dtype=torch.float64,
                                                                             generator=torch.Generator().manual_seed(3))
    w = off_policy.importance_weights(prox, long_batch.sampler_logprobs[:, 1:].double(), mask, "geometric")
    weights = off_policy.truncated_importance_weights(w, cfg.off_policy_cap)
    per_segment = {float(weights[0, start:end][mask[0, start:end]].unique().item())
                   for start, end in segments.plan([4096], 4096, 1000)[0].segments}
    assert per_segment == {1.05}  # exp(mean log w) ~ exp(0.2), truncated at C
    _, grad_plain, _ = _policy_gradient(policy, long_batch, None, cfg)
    loss_one, grad_one, _ = _policy_gradient(policy, long_batch, None, cfg, weights)
    loss_seg, grad_seg, _ = _policy_gradient(policy, long_batch, 1000, cfg, weights)
    assert (grad_one - 1.05 * grad_plain).abs().max() <= 1e-9  # one weight for the whole trajectory
    assert (grad_seg - grad_one).abs().max() <= 1e-9
    assert loss_seg == pytest.approx(loss_one, rel=1e-12, abs=1e-12)


def test_critic_value_gradient_in_segments_equals_one_pass_in_float64(long_batch):
    torch.manual_seed(1)
    model = ValueModel(SMALL).double()
    returns = torch.randn(long_batch.action_mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    normalizer = long_batch.action_mask.sum().double()
    cfg = ppo.PPOConfig()
    grads = []
    for max_tokens in (None, 1000):
        model.zero_grad(set_to_none=True)
        value_backward(_critic_trainable(model, max_tokens), long_batch, [0], returns, long_batch.old_values[:, 1:],
                       normalizer, cfg)
        grads.append(_grads(model))
    assert grads[0].abs().max() > 1e-3
    assert (grads[1] - grads[0]).abs().max() <= 1e-9


def test_no_grad_passes_in_segments_equal_one_pass(long_batch):
    torch.manual_seed(0)
    policy, critic = MoEPolicy(SMALL).double(), ValueModel(SMALL).double()
    (lp_one, live_one), (lp_seg, live_seg) = (
        policy_logprobs(_policy_trainable(policy, m), long_batch, None, 1.0, capture=True) for m in (None, 1000))
    assert (lp_seg - lp_one).abs().max() <= 1e-10
    assert torch.equal(live_seg, live_one)  # live routing: the same experts at every position and layer
    v_one, v_seg = (value_estimates(_critic_trainable(critic, m), long_batch) for m in (None, 1000))
    assert (v_seg - v_one).abs().max() <= 1e-10


def test_rows_grouped_and_segmented_give_the_one_pass_gradient():
    """Three rows of different lengths over a budget of 100: the long row in segments, the short ones grouped
    and trimmed to their own length (padding never reaches a real token)."""
    batch = _batch([300, 40, 50], SMALL, seed=3)
    plan = segments.plan(batch.input_valid.sum(1).tolist(), batch.inputs.shape[1], 100)
    assert [(m.rows.tolist(), m.width, len(m.segments)) for m in plan] == [([0], 299, 3), ([1, 2], 50, 1)]
    torch.manual_seed(0)
    policy = MoEPolicy(SMALL).double()
    cfg = ppo.PPOConfig()
    _, grad_one, _ = _policy_gradient(policy, batch, None, cfg)
    _, grad_seg, _ = _policy_gradient(policy, batch, 100, cfg)
    assert (grad_seg - grad_one).abs().max() <= 1e-10


def test_a_batch_within_the_budget_runs_as_one_pass_at_full_width():
    plan = segments.plan([10, 3], 12, 24)
    assert len(plan) == 1 and plan[0].width == 12 and plan[0].segments == ((0, 12),)
    assert segments.plan([10, 3], 12, None)[0].segments == ((0, 12),)


def test_math_attention_and_its_block_backward_match_sdpa():
    """The device-independent path (GPU fallback): two key blocks merged by log-sum-exp, each block's
    backward from the merged output, equal SDPA's forward and gradients with a bottom-right causal mask."""
    gen = torch.Generator().manual_seed(0)
    prefix, steps = 13, 9
    q = torch.randn(2, 4, steps, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, prefix + steps, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(2, 2, prefix + steps, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    allowed = torch.arange(prefix + steps)[None] <= torch.arange(prefix, prefix + steps)[:, None]
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    grad_out = torch.randn(reference.shape, dtype=torch.float64, generator=gen)
    dq, dk, dv = torch.autograd.grad(reference, (q, k, v), grad_out)
    with torch.no_grad():
        blocks = [(k[:, :, :prefix], v[:, :, :prefix], False), (k[:, :, prefix:], v[:, :, prefix:], True)]
        out, lse = merge(*(math_attention_with_lse(q, kb, vb, causal) for kb, vb, causal in blocks))
        assert (out - reference).abs().max() <= 1e-12
        parts = [math_attention_backward(grad_out, q, kb, vb, out, lse, causal) for kb, vb, causal in blocks]
    assert (parts[0][0] + parts[1][0] - dq).abs().max() <= 1e-12
    assert (torch.cat([parts[0][1], parts[1][1]], 2) - dk).abs().max() <= 1e-12
    assert (torch.cat([parts[0][2], parts[1][2]], 2) - dv).abs().max() <= 1e-12


def test_a_model_whose_attention_does_not_serve_segments_is_refused_by_name():
    from t1_actors.policy.segment_kv import SegmentKV
    cache = SegmentKV(1, 1, 1, 4, 8)
    with pytest.raises(TypeError, match="max_tokens_per_microbatch"):
        cache.update(0, torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))


def test_a_chunk_over_the_budget_of_a_model_without_segments_is_refused_by_name():
    """Qwen3.5's hybrid trunk carries recurrent state no SegmentKV holds: its budget groups rows only."""
    from t1_actors.policy.config import Qwen35MoeConfig
    from t1_actors.policy.qwen35 import Qwen35MoePolicy
    from t1_actors.train.segments import segment_layout

    hybrid = Qwen35MoePolicy(Qwen35MoeConfig(
        vocab_size=61, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4, top_k=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=24, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=("linear_attention", "full_attention")))
    assert segment_layout(hybrid) is None and segment_layout(MoEPolicy(SMALL)) is not None
    trainable = Trainable(hybrid, list(hybrid.parameters()), torch.optim.SGD(hybrid.parameters(), lr=0.0),
                          max_tokens=16, kv_layout=segment_layout(hybrid))
    assert [m.rows.tolist() for m in trainable.plan(torch.ones(4, 8, dtype=torch.bool))] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="chunk of 40 positions exceeds max_tokens_per_microbatch = 16"):
        trainable.plan(torch.ones(1, 40, dtype=torch.bool))
