"""PPO maths against values computed by hand from the paper's equations."""

import math

import pytest
import torch
from pydantic import ValidationError

from t1_actors.train import ppo

torch.set_num_threads(1)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_reward_is_passed_over_fixed_scale_not_a_pass_ratio():
    assert ppo.reward(7) == pytest.approx(0.35)
    assert ppo.reward(7, scale=20) == ppo.reward(7)  # a 7/7 task and a 7/30 task pay the same
    assert ppo.reward(0) == 0.0
    assert ppo.reward(30) == pytest.approx(1.5)  # more checks can pay more than 1
    with pytest.raises(ValueError, match="passed"):
        ppo.reward(-1)
    with pytest.raises(ValueError, match="scale"):
        ppo.reward(1, scale=0)


def test_terminal_reward_lands_on_last_loss_token():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 0, 0, 0]])
    out = ppo.terminal_rewards(torch.tensor([0.5, 2.0]), mask)
    assert out.tolist() == [[0, 0, 0, 0, 0.5, 0], [0, 0, 2.0, 0, 0, 0]]
    with pytest.raises(ValueError, match="no loss tokens"):
        ppo.terminal_rewards(torch.tensor([1.0]), torch.zeros(1, 3))


def test_gae_with_gamma_lambda_one_and_terminal_reward_is_R_minus_V():
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0]])  # a tool output (positions 3-4) between two turns
    values = t([9.0, 0.1, 0.3, 7.0, 7.0, -0.2, 0.6, 9.0])
    R = 0.45
    adv = ppo.gae_advantages(ppo.terminal_rewards(torch.tensor([R]), mask), values, mask, 1.0, 1.0)
    expected = torch.where(mask.bool(), R - values, 0.0)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ppo.returns(adv, values)[mask.bool()], torch.full((4,), R))


def test_gae_general_case_by_hand():
    # three actions at positions 0, 2, 3 (position 1 is tool output); rewards r = (0.1, 0, 1.0) on the actions
    mask = torch.tensor([[1, 0, 1, 1]])
    values = t([0.5, 99.0, 0.2, 0.4])
    rewards = t([0.1, 5.0, 0.0, 1.0])  # the reward on a non-action token is not a step and is ignored
    g, lam = 0.9, 0.8
    d3 = 1.0 + g * 0.0 - 0.4
    d2 = 0.0 + g * 0.4 - 0.2
    d0 = 0.1 + g * 0.2 - 0.5
    a3 = d3
    a2 = d2 + g * lam * a3
    a0 = d0 + g * lam * a2
    adv = ppo.gae_advantages(rewards, values, mask, g, lam)
    torch.testing.assert_close(adv, t([a0, 0.0, a2, a3]))
    # lam = 0 is the one-step TD error
    torch.testing.assert_close(ppo.gae_advantages(rewards, values, mask, g, 0.0), t([d0, 0.0, d2, d3]))


def test_gae_rejects_ragged_inputs():
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        ppo.gae_advantages(torch.zeros(1, 3), torch.zeros(1, 4), torch.ones(1, 3))


def test_policy_loss_by_hand_and_clipping_at_both_ends():
    eps = 0.2
    ratios = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.1]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 2.0]])
    old = torch.zeros(1, 5)
    new = torch.log(ratios).requires_grad_(True)
    mask = torch.ones(1, 5)
    loss, clip_fraction = ppo.ppo_policy_loss(new, old, adv, mask, eps)
    # per token: -min(rho A, clip(rho) A)
    by_hand = [-min(1.5, 1.2), -min(-0.5, -0.8), -min(0.5, 0.8), -min(-1.5, -1.2), -min(2.2, 2.2)]
    assert float(loss.detach()) == pytest.approx(sum(by_hand) / 5, abs=1e-6)
    assert float(clip_fraction) == pytest.approx(4 / 5)
    loss.backward()
    g = new.grad[0]
    # upper end (rho > 1 + eps, A > 0) and lower end (rho < 1 - eps, A < 0): clipped, no gradient
    assert g[0] == 0 and g[1] == 0
    # outside the clip but on the pessimistic side: the unclipped term is the min, gradient flows
    assert float(g[2]) == pytest.approx(-0.5 * 1.0 / 5)  # d(-rho A)/dlogp = -rho A
    assert float(g[3]) == pytest.approx(-1.5 * -1.0 / 5)
    assert float(g[4]) == pytest.approx(-1.1 * 2.0 / 5)


def test_policy_loss_is_token_mean_over_loss_tokens_and_global_normalizer():
    new = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 1]])
    loss, _ = ppo.ppo_policy_loss(new, new, adv, mask)
    assert float(loss.detach()) == pytest.approx(-(1 + 2 + 6) / 3)
    loss_global, _ = ppo.ppo_policy_loss(new, new, adv, mask, normalizer=9)
    assert float(loss_global) == pytest.approx(-(1 + 2 + 6) / 9)


def test_clipped_value_loss_by_hand_both_ends():
    eps_v = 0.2
    values = torch.tensor([[1.0, 0.6, 0.3, -0.5]], requires_grad=True)
    old = torch.tensor([[0.5, 0.0, 0.2, 0.0]])
    ret = torch.tensor([[0.0, 1.0, 0.25, -1.0]])
    mask = torch.ones(1, 4)
    loss = ppo.clipped_value_loss(values, old, ret, mask, eps_v)
    # token 0: V moved up past V_old + eps -> V_clip 0.7; max((1-0)^2, (0.7-0)^2) = 1.0 (unclipped term, grad flows)
    # token 1: V_clip = 0.2; max((0.6-1)^2 = .16, (0.2-1)^2 = .64) = .64 (clipped term: no gradient)
    # token 2: inside the clip range: (0.3-0.25)^2
    # token 3: moved down past V_old - eps -> V_clip -0.2; max(.25, .64) = .64 (clipped, no gradient)
    by_hand = 0.5 * (1.0 + 0.64 + 0.05 ** 2 + 0.64) / 4
    assert float(loss.detach()) == pytest.approx(by_hand, abs=1e-6)
    loss.backward()
    g = values.grad[0]
    assert float(g[0]) == pytest.approx((1.0 - 0.0) / 4)
    assert g[1] == 0 and g[3] == 0
    assert float(g[2]) == pytest.approx((0.3 - 0.25) / 4, abs=1e-6)


def test_explained_variance_by_hand():
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    assert ppo.explained_variance(ret, ret, mask) == pytest.approx(1.0)
    const = torch.full_like(ret, 2.5)
    assert ppo.explained_variance(const, ret, mask) == pytest.approx(0.0)
    v = torch.tensor([[1.5, 2.0, 3.0, 3.5, 0.0]])
    # residuals (-.5, 0, 0, .5): var .125; var of returns 1.25
    assert ppo.explained_variance(v, ret, mask) == pytest.approx(1 - 0.125 / 1.25)
    assert math.isnan(ppo.explained_variance(v, torch.ones_like(ret), mask))


def test_approx_kl_entropy_and_token_logprobs_by_hand():
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[2.0, 0.5]]))
    kl = ppo.approx_kl(new, old, torch.ones(1, 2))
    assert float(kl) == pytest.approx(((2 - 1 - math.log(2)) + (0.5 - 1 - math.log(0.5))) / 2, abs=1e-6)
    logits = torch.zeros(1, 2, 8)
    assert float(ppo.entropy(logits, torch.ones(1, 2))) == pytest.approx(math.log(8), abs=1e-6)
    logits = torch.tensor([[[2.0, 0.0]]])
    lp = ppo.token_logprobs(logits, torch.tensor([[0]]), temperature=2.0)
    assert float(lp) == pytest.approx(1.0 - math.log(math.e + 1.0), abs=1e-6)


def test_config_defaults_follow_the_recipe_and_reject_unknown_keys():
    cfg = ppo.PPOConfig()
    assert (cfg.clip_eps, cfg.value_clip_eps, cfg.gamma, cfg.lam) == (0.2, 0.2, 1.0, 1.0)
    assert cfg.adam_betas == (0.9, 0.98) and cfg.weight_decay == 0.1
    assert cfg.moe_aux_loss_coef == 0.0 and cfg.entropy_coef == 0.0
    assert 1e-4 <= cfg.actor_lr <= 2e-4
    assert cfg.effective_critic_lr == pytest.approx(30 * cfg.actor_lr)
    assert ppo.PPOConfig(critic_lr=1e-3).effective_critic_lr == 1e-3
    with pytest.raises(ValidationError, match="kl_coef"):
        ppo.PPOConfig(kl_coef=0.1)


def test_leave_one_out_baseline_by_hand_chunks_are_one_member():
    rewards = torch.tensor([0.2, 0.4, 0.4, 0.9, 0.1])
    groups = ["a", "a", "a", "b", "c"]
    trials = ["t1", "t2", "t2", "t3", "t4"]  # t2 has two chunks: one member of group a, with one reward
    b, has = ppo.leave_one_out_baselines(rewards, groups, trials)
    assert has.tolist() == [True, True, True, False, False]
    assert b[:3].tolist() == pytest.approx([0.4, 0.2, 0.2])
    assert b[3:].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="one entry per row"):
        ppo.leave_one_out_baselines(rewards, groups[:2], trials)


def test_rloo_advantage_is_R_minus_b_on_loss_tokens_and_gae_where_alone():
    rewards = torch.tensor([1.0, 0.0, 0.5])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0], [0, 1, 1]])
    fallback = torch.tensor([[0.0, 9.0, 9.0], [9.0, 9.0, 0.0], [0.0, 0.3, 0.2]])
    b, has = ppo.leave_one_out_baselines(rewards, ["x", "x", "y"], ["1", "2", "3"])
    adv = ppo.rloo_advantages(rewards, b, has, mask, fallback)
    assert torch.allclose(adv, torch.tensor([[0.0, 1.0, 1.0], [-1.0, -1.0, 0.0], [0.0, 0.3, 0.2]]))
    # a group whose attempts all scored the same carries no signal
    b, has = ppo.leave_one_out_baselines(torch.tensor([0.5, 0.5]), ["x", "x"], ["1", "2"])
    assert ppo.rloo_advantages(torch.tensor([0.5, 0.5]), b, has, torch.ones(2, 2), torch.ones(2, 2)).abs().sum() == 0


def test_rloo_refuses_batch_whitening():
    with pytest.raises(ValidationError, match="normalize_advantages = false"):
        ppo.PPOConfig(advantage_estimator="rloo", normalize_advantages=True)


def test_positive_part_keeps_only_better_than_baseline_actions():
    adv = torch.tensor([[0.5, -0.25, 0.0], [-1.0, 2.0, -0.0]])
    assert ppo.positive_part(adv).tolist() == [[0.5, 0.0, 0.0], [0.0, 2.0, 0.0]]
