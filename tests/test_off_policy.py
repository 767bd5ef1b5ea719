"""Off-policy correction (``t1_actors.train.off_policy``, ``[ppo] off_policy_*``): the weights by hand, the
truncation and the mask, one weight per trajectory across its chunks and ranks, the config's refusal, and a
learner step that carries the correction and reports it."""

import math

import pytest
import torch
from _learner_data import TINY, sample_trajectories, tiny_policy
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from t1_actors.backends.torch_learner import TorchLearner, collate
from t1_actors.train import off_policy, ppo
from t1_actors.train.ppo import PPOConfig

torch.set_num_threads(1)

floats = st.floats(-6.0, 6.0, allow_nan=False, width=32)


def _tensors(rows, cols, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, cols, generator=gen) < 0.7
    mask[:, 0] = True  # every row has a loss token
    prox = -3.0 + torch.randn(rows, cols, generator=gen)
    behav = prox + 0.8 * torch.randn(rows, cols, generator=gen)
    return prox, behav, mask


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(0, 10**6), st.floats(0.05, 0.5))
def test_unit_weights_leave_the_policy_loss_and_its_gradient_bit_identical(rows, cols, seed, eps):
    gen = torch.Generator().manual_seed(seed)
    old = -2.0 + torch.randn(rows, cols, generator=gen)
    base = old + 0.3 * torch.randn(rows, cols, generator=gen)
    adv = torch.randn(rows, cols, generator=gen)
    mask = torch.rand(rows, cols, generator=gen) < 0.6
    results = []
    for weights in (None, torch.ones(rows, cols)):
        new = base.clone().requires_grad_(True)
        loss, clip = ppo.ppo_policy_loss(new, old, adv, mask, eps, 7.0, weights)
        loss.backward()
        results.append((loss.detach(), clip, new.grad))
    (l0, c0, g0), (l1, c1, g1) = results
    assert torch.equal(l0, l1) and torch.equal(c0, c1) and torch.equal(g0, g1)


def test_weighted_policy_loss_by_hand():
    new, old = torch.tensor([[0.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.0, 0.0]])  # rho = 1: surrogate = -A
    adv, mask = torch.tensor([[1.0, 2.0, 4.0]]), torch.tensor([[1, 1, 0]])
    loss, _ = ppo.ppo_policy_loss(new, old, adv, mask, 0.2, None, torch.tensor([[0.5, 0.0, 3.0]]))
    assert float(loss) == pytest.approx(-(0.5 * 1.0 + 0.0 * 2.0) / 2)  # a weight-0 token still counts in N


def test_importance_weights_by_hand_at_each_level():
    prox = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    behav = torch.tensor([[-1.5, -1.0, -9.0, -2.0]])
    mask = torch.tensor([[True, True, False, True]])
    log_w = [0.5, -1.0, -1.0]  # the loss tokens' log-ratios
    token = off_policy.importance_weights(prox, behav, mask, "token")
    torch.testing.assert_close(token, torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0, math.exp(-1.0)]]))
    sequence = off_policy.importance_weights(prox, behav, mask, "sequence")
    torch.testing.assert_close(sequence, torch.tensor([[math.exp(sum(log_w))] * 2 + [1.0, math.exp(sum(log_w))]]))
    geometric = off_policy.importance_weights(prox, behav, mask, "geometric")
    g = math.exp(sum(log_w) / 3)
    torch.testing.assert_close(geometric, torch.tensor([[g, g, 1.0, g]]))
    huge = off_policy.importance_weights(torch.zeros(1, 50), torch.full((1, 50), -1.0), torch.ones(1, 50), "sequence")
    assert torch.isfinite(huge).all() and float(huge[0, 0]) == pytest.approx(math.exp(20.0), rel=1e-5)  # clamped


@settings(max_examples=60, deadline=None)
@given(st.lists(floats, min_size=1, max_size=30), st.floats(1.01, 10.0))
def test_truncation_caps_the_weights_and_keeps_the_rest(log_ws, cap):
    w = torch.tensor(log_ws).exp()
    truncated = off_policy.truncated_importance_weights(w, cap)
    assert bool((truncated <= cap).all())
    assert torch.equal(truncated[w <= cap], w[w <= cap])
    assert bool((truncated[w > cap] == cap).all())


@settings(max_examples=60, deadline=None)
@given(st.lists(floats, min_size=1, max_size=30), st.floats(1.01, 10.0))
def test_mask_drops_exactly_the_tokens_outside_the_band(log_ws, cap):
    w = torch.tensor(log_ws).exp()
    kept = off_policy.masked_importance_weights(w, cap)
    assert set(kept.tolist()) <= {0.0, 1.0}
    for wi, ki in zip(w.tolist(), kept.tolist()):
        assert ki == float(1.0 / cap <= wi <= cap)
    mask = torch.ones(1, len(log_ws), dtype=torch.bool)
    weight, truncated, masked = off_policy.correction_counts(w[None], mask, cap)
    assert masked == float((kept == 0).sum()) and truncated == float((w > cap).sum())
    assert weight == pytest.approx(float(w.double().sum()), rel=1e-6)


def test_cap_must_exceed_one():
    with pytest.raises(ValueError, match="> 1"):
        off_policy.masked_importance_weights(torch.ones(3), 1.0)


@pytest.mark.parametrize("level", ["sequence", "geometric"])
def test_sequence_levels_give_one_weight_per_trajectory_over_all_its_chunks(level):
    prox, behav, mask = _tensors(5, 8, seed=3)
    trials = ("a", "b", "a", "c", "b")  # rows 0 and 2 are chunks of one trial, so are 1 and 4
    w = off_policy.importance_weights(prox, behav, mask, level, trials)
    for trial in set(trials):
        rows = [i for i, name in enumerate(trials) if name == trial]
        values = torch.cat([w[i][mask[i]] for i in rows])
        assert torch.equal(values, values[:1].expand_as(values))  # one weight for every loss token of the trial
        log_ratio = torch.cat([(prox - behav)[i][mask[i]] for i in rows]).double()
        expected = log_ratio.sum() if level == "sequence" else log_ratio.mean()
        assert float(values[0]) == pytest.approx(math.exp(float(expected.clamp(-20, 20))), rel=1e-5)
    assert bool((w[~mask] == 1.0).all())
    # each row on its own is another trajectory: chunks of one trial must not be weighed apart
    alone = off_policy.importance_weights(prox, behav, mask, level)
    assert not torch.equal(alone[0][mask[0]], w[0][mask[0]])


def test_shard_totals_merge_to_the_whole_batch_weights():
    prox, behav, mask = _tensors(6, 7, seed=4)
    trials = ("a", "b", "a", "c", "b", "a")
    whole = off_policy.importance_weights(prox, behav, mask, "geometric", trials)
    shards = [list(range(0, 6, 2)), list(range(1, 6, 2))]  # torch_learner.shard: rows rank, rank + world, ...
    parts = [off_policy.trajectory_log_ratio_totals((prox - behav)[rows], mask[rows], [trials[i] for i in rows])
             for rows in shards]
    totals = off_policy.merge_totals(parts)
    for rows in shards:
        w = off_policy.importance_weights(prox[rows], behav[rows], mask[rows], "geometric",
                                          [trials[i] for i in rows], totals)
        torch.testing.assert_close(w, whole[rows])
        own = off_policy.importance_weights(prox[rows], behav[rows], mask[rows], "geometric", [trials[i] for i in rows])
        assert not torch.allclose(own, whole[rows])  # without the gather a split trial gets a shard's weight


def test_config_refuses_a_correction_without_recomputed_logprobs():
    for mode in ("truncate", "mask"):
        with pytest.raises(ValidationError, match="off_policy_correction.*old_logprobs.*recompute"):
            PPOConfig(off_policy_correction=mode)
        cfg = PPOConfig(off_policy_correction=mode, old_logprobs="recompute")
        assert (cfg.off_policy_level, cfg.off_policy_cap) == ("token", 2.0)
    assert PPOConfig().off_policy_correction == "none"
    with pytest.raises(ValidationError, match="off_policy_cap"):
        PPOConfig(off_policy_cap=1.0)
    with pytest.raises(ValidationError, match="off_policy_level"):
        PPOConfig(off_policy_level="trajectory")


def _stale_batch():
    """Trajectories a different policy sampled (a stale sampler): w = pi_prox / pi_behav is far from 1."""
    return collate(sample_trajectories(tiny_policy(1), 8, seed=6), None, num_layers=TINY.num_layers, top_k=TINY.top_k)


def _step(cfg):
    policy, batch = tiny_policy(), _stale_batch()
    metrics = TorchLearner(policy, cfg, fidelity_metrics=False).step(
        batch.with_old_values(torch.zeros(batch.token_ids.shape))).metrics
    return metrics, torch.cat([p.detach().flatten() for p in policy.parameters()])


def test_learner_step_with_the_correction_reports_its_metrics_and_changes_the_update():
    none, params_none = _step(PPOConfig(old_logprobs="recompute"))
    masked, params_masked = _step(PPOConfig(old_logprobs="recompute", off_policy_correction="mask",
                                            off_policy_cap=1.1))
    truncated, _ = _step(PPOConfig(old_logprobs="recompute", off_policy_correction="truncate", off_policy_cap=1.1))
    geometric, _ = _step(PPOConfig(old_logprobs="recompute", off_policy_correction="mask",
                                   off_policy_level="geometric", off_policy_cap=1.02))
    assert 0 < geometric["off_policy_masked_fraction"] < 1
    for metrics in (none, masked, truncated):
        for key in ("off_policy_weight_mean", "off_policy_truncated_fraction", "off_policy_masked_fraction",
                    "kl_sampler_learner"):
            assert math.isfinite(metrics[key]), key
        assert metrics["kl_sampler_learner"] > 1e-3  # another policy sampled these tokens
    assert 0 < truncated["off_policy_truncated_fraction"] <= truncated["off_policy_masked_fraction"] < 1
    assert masked["off_policy_masked_fraction"] > 0
    assert none["off_policy_truncated_fraction"] == 0.0  # at the default C = 2 nothing is out of the band
    assert masked["off_policy_truncated_fraction"] == truncated["off_policy_truncated_fraction"]  # counted whatever
    assert masked["off_policy_masked_fraction"] == truncated["off_policy_masked_fraction"]  # the mode applied
    assert not torch.equal(params_none, params_masked)
    assert none["policy_loss"] != masked["policy_loss"] != truncated["policy_loss"]
    sampler_only, _ = _step(PPOConfig())
    assert "off_policy_weight_mean" not in sampler_only  # no pi_prox without the recompute
    assert sampler_only["kl_sampler_learner"] == pytest.approx(none["kl_sampler_learner"], rel=1e-5)


def test_a_band_that_holds_every_weight_leaves_the_step_bit_identical():
    params = [_step(PPOConfig(old_logprobs="recompute", **extra))[1]
              for extra in ({}, {"off_policy_correction": "mask", "off_policy_cap": 1e6})]
    assert torch.equal(params[0], params[1])
