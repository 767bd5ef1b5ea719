"""Torch learner backend: the PPO step with R3, the critic, weight publishing and exact-resume checkpoints."""

import math

import numpy as np
import pytest
import torch
from _learner_data import TINY, sample_trajectories, tiny_policy

from schemas import CriticValues, LearnerStep, PolicyUpdate, WeightsPublished, decode, encode
from t1_actors.backends.torch_learner import TorchCritic, TorchLearner, collate, sha256_file
from t1_actors.policy.model import MoEPolicy
from t1_actors.train.ppo import PPOConfig

torch.set_num_threads(1)
L, K = TINY.num_layers, TINY.top_k


def batch_of(trajectories, values=None, **kw):
    return collate(trajectories, values, num_layers=L, top_k=K, **kw)


def flat_params(module):
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_ppo_step_updates_policy_and_reports_every_metric():
    policy = tiny_policy()
    cfg = PPOConfig(minibatches=2, epochs=2)
    learner = TorchLearner(policy, cfg, critic=TorchCritic.for_policy(policy, cfg))
    batch = batch_of(sample_trajectories(policy, 8))
    before = flat_params(policy)
    result = learner.step(batch)
    assert not torch.equal(before, flat_params(policy))
    for name in ("policy_loss", "value_loss", "clip_fraction", "approx_kl", "entropy", "explained_variance",
                 "logprob_gap_r3", "logprob_gap_no_r3", "routing_mismatch_no_r3", "tokens_per_s", "grad_norm",
                 "kl_sampler_learner"):
        assert math.isfinite(result.metrics[name]), name
    assert result.metrics["loss_tokens"] == float(batch.num_loss_tokens)
    assert result.metrics["entropy"] > 0 and result.metrics["approx_kl"] >= 0
    # the sampler is this very policy in fp32: with R3 the first forward reproduces its logprobs
    assert result.metrics["logprob_gap_r3"] < 1e-4
    assert 0 <= result.metrics["kl_sampler_learner"] < 1e-6 and "off_policy_weight_mean" not in result.metrics
    assert (result.step, result.policy_version) == (0, 1)
    event = result.event()
    assert isinstance(event, LearnerStep) and decode(encode(event)) == event
    assert event.trials == [f"trial-0-{i}" for i in range(8)]


def test_ppo_raises_logprobs_of_positive_advantage_tokens_and_lowers_negative_ones():
    policy = tiny_policy(3)
    cfg = PPOConfig(actor_lr=1e-3, epochs=2)
    batch = batch_of(sample_trajectories(policy, 16, seed=3))
    baseline = float(batch.rewards.mean())  # V = mean reward: A = R - V has both signs
    batch = batch.with_old_values(torch.full(batch.token_ids.shape, baseline))
    advantage = (batch.rewards - baseline)[:, None].expand_as(batch.targets)
    learner = TorchLearner(policy, cfg, fidelity_metrics=False)

    def logprobs():
        with torch.no_grad():
            logits = policy(batch.inputs, routing_replay=batch.routing).logits
        return torch.log_softmax(logits, -1).gather(-1, batch.targets[..., None]).squeeze(-1)

    start = logprobs()
    for _ in range(3):
        metrics = learner.step(batch).metrics
    moved = logprobs() - start
    m = batch.action_mask
    assert float(moved[m & (advantage > 0)].mean()) > 0.01
    assert float(moved[m & (advantage < 0)].mean()) < -0.01
    assert metrics["approx_kl"] > 0 and "value_loss" not in metrics


def test_r3_gap_is_smaller_than_without_replay_with_bf16_sampler_and_fp32_learner():
    config = TINY.model_copy(update={"num_experts": 8})
    policy = tiny_policy(0, config)
    trajectories = sample_trajectories(policy, 32, seed=2, sampler_dtype=torch.bfloat16)
    batch = collate(trajectories, None, num_layers=config.num_layers, top_k=config.top_k)
    learner = TorchLearner(policy, PPOConfig(), critic=TorchCritic.for_policy(policy, PPOConfig()))
    metrics = learner.step(batch).metrics
    assert metrics["routing_mismatch_no_r3"] > 0  # bf16 rounding flipped some expert choices
    assert 0 < metrics["logprob_gap_r3"] < metrics["logprob_gap_no_r3"]


def test_training_forward_replays_the_record_even_after_the_router_moved():
    policy = tiny_policy()
    batch = batch_of(sample_trajectories(policy, 8))
    with torch.no_grad():
        for layer in policy.model.layers:
            layer.mlp.gate.weight.normal_(0, 1.0)  # the live router now disagrees with the record
        live = policy(batch.inputs, capture_routing=True).routing
        replayed = policy(batch.inputs, routing_replay=batch.routing).routing
    assert not torch.equal(live, batch.routing)
    assert torch.equal(replayed, batch.routing)
    metrics = TorchLearner(policy, PPOConfig(), critic=TorchCritic.for_policy(policy, PPOConfig())).step(batch).metrics
    assert metrics["routing_mismatch_no_r3"] > 0.1
    assert metrics["logprob_gap_r3"] < metrics["logprob_gap_no_r3"]


def test_critic_warmup_raises_explained_variance_on_a_fixed_dataset():
    policy = tiny_policy(1)
    dataset = [batch_of(sample_trajectories(policy, 32, seed=s)) for s in (10, 11)]
    critic = TorchCritic.for_policy(policy, PPOConfig(minibatches=4))
    report = critic.warmup(dataset)
    assert report.epochs == 1 and report.trajectories == 64
    assert report.explained_variance_after > report.explained_variance_before + 0.1
    assert critic.explained_variance(dataset) == pytest.approx(report.explained_variance_after)
    assert decode(encode(report.event())).explained_variance_after == report.explained_variance_after


def test_critic_values_event_and_clipped_update_after_a_learner_step():
    policy = tiny_policy()
    cfg = PPOConfig()
    critic = TorchCritic.for_policy(policy, cfg)
    trajectories = sample_trajectories(policy, 8)
    values = {(t.trial_id, t.chunk): critic.critic_values(t) for t in trajectories}
    event = values[("trial-0-0", 0)]
    assert isinstance(event, CriticValues) and len(event.values) == len(trajectories[0].token_ids)
    assert event.values[0] == 0.0 and decode(encode(event)) == event
    batch = batch_of(trajectories, values)
    torch.testing.assert_close(batch.old_values, critic.values(batch_of(trajectories)))
    learner = TorchLearner(policy, cfg)  # critic in its own actor: values come from the log
    learner.step(batch)
    first = critic.update(batch)["value_loss"]
    second = critic.update(batch)["value_loss"]
    assert second < first and critic.version == 2


def test_publish_writes_checksummed_safetensors_with_a_new_version(tmp_path):
    policy = tiny_policy()
    learner = TorchLearner(policy, PPOConfig(), critic=TorchCritic.for_policy(policy, PPOConfig()))
    learner.step(batch_of(sample_trajectories(policy, 4)))
    published = learner.publish(tmp_path)
    assert published.version == 1 and published.step == 0
    assert published.sha256 == sha256_file(f"{published.location}/model.safetensors")
    loaded = MoEPolicy.load(published.location)
    assert torch.equal(flat_params(loaded), flat_params(policy))
    assert isinstance(published.event(), WeightsPublished) and isinstance(published.message(), PolicyUpdate)
    assert decode(encode(published.message())).sha256 == published.sha256
    assert [p.name for p in tmp_path.iterdir()] == ["v00001"]  # no temporary left behind


def test_restarted_learner_resumes_exactly_from_its_checkpoint(tmp_path):
    cfg = PPOConfig(minibatches=2, epochs=2)
    policy = tiny_policy()
    first = batch_of(sample_trajectories(policy, 8, seed=1))
    second = batch_of(sample_trajectories(policy, 8, seed=2))
    learner = TorchLearner(policy, cfg, critic=TorchCritic.for_policy(policy, cfg))
    learner.step(first)
    learner.save_checkpoint(tmp_path / "ckpt.pt", cursor=b"\x00log-position-17\xff")
    expected = learner.step(second)

    other = tiny_policy(seed=99)  # a fresh process: different weights until it loads the checkpoint
    restarted = TorchLearner(other, cfg, critic=TorchCritic.for_policy(other, cfg, seed=5), seed=7)
    assert restarted.load_checkpoint(tmp_path / "ckpt.pt") == b"\x00log-position-17\xff"
    resumed = restarted.step(second)
    assert torch.equal(flat_params(other), flat_params(policy))
    assert torch.equal(flat_params(restarted.critic.model), flat_params(learner.critic.model))
    assert (resumed.step, resumed.policy_version) == (expected.step, expected.policy_version)
    assert resumed.metrics["policy_loss"] == expected.metrics["policy_loss"]


def test_bad_inputs_get_clear_errors():
    policy = tiny_policy()
    trajectories = sample_trajectories(policy, 2)
    bare = trajectories[0].model_copy(update={"routing": None})
    with pytest.raises(ValueError, match="no routing record"):
        batch_of([bare, trajectories[1]])
    only_first = CriticValues(trial_id="trial-0-0", chunk=0, critic_version=0,
                              values=np.zeros(len(trajectories[0].token_ids), np.float32))
    with pytest.raises(ValueError, match="no CriticValues for trajectory trial-0-1"):
        batch_of(trajectories, {("trial-0-0", 0): only_first})
    with pytest.raises(ValueError, match="MoE layers"):
        collate(trajectories, None, num_layers=3, top_k=K)
    learner = TorchLearner(policy, PPOConfig())
    with pytest.raises(ValueError, match="no critic"):
        learner.step(batch_of(trajectories))
    with pytest.raises(ValueError, match="load-balancing"):
        TorchLearner(policy, PPOConfig(moe_aux_loss_coef=0.01), critic=TorchCritic.for_policy(policy, PPOConfig())
                     ).step(batch_of(trajectories))


def test_a_shard_smaller_than_the_minibatch_count_still_steps():
    policy = tiny_policy()
    cfg = PPOConfig(minibatches=3)
    learner = TorchLearner(policy, cfg, critic=TorchCritic.for_policy(policy, cfg))
    before = flat_params(policy)
    metrics = learner.step(batch_of(sample_trajectories(policy, 2))).metrics
    assert math.isfinite(metrics["policy_loss"]) and not torch.equal(before, flat_params(policy))


def test_rloo_step_uses_the_group_baseline_and_the_critic_still_learns_returns():
    from t1_actors.train.step import advantages_and_returns

    policy = tiny_policy(5)
    trajectories = sample_trajectories(policy, 8, seed=5)
    trajectories = [t.model_copy(update={"task_id": f"task-{i // 4}"}) for i, t in enumerate(trajectories)]
    batch = batch_of(trajectories)
    batch = batch.with_old_values(torch.full(batch.token_ids.shape, 0.3))
    assert batch.task_ids == tuple(f"task-{i // 4}" for i in range(8))
    gae, returns = advantages_and_returns(batch, PPOConfig())
    rloo, rloo_returns = advantages_and_returns(batch, PPOConfig(advantage_estimator="rloo"))
    assert torch.equal(returns, rloo_returns)
    positive, _ = advantages_and_returns(batch, PPOConfig(advantage_estimator="rloo", positive_advantages_only=True))
    assert torch.equal(positive, rloo.clamp(min=0)) and bool((rloo < 0).any())
    m = batch.action_mask
    for i in range(8):
        group = batch.rewards[(i // 4) * 4:(i // 4) * 4 + 4]
        expected = float(batch.rewards[i] - (group.sum() - batch.rewards[i]) / 3)
        assert rloo[i][m[i]].tolist() == pytest.approx([expected] * int(m[i].sum()), abs=1e-6)
        assert float(gae[i][m[i]][0]) == pytest.approx(float(batch.rewards[i]) - 0.3, abs=1e-6)
    assert batch.select([0, 5]).task_ids == ("task-0", "task-1")
    learner = TorchLearner(policy, PPOConfig(advantage_estimator="rloo"),
                           critic=TorchCritic.for_policy(policy, PPOConfig()))
    assert math.isfinite(learner.step(batch).metrics["policy_loss"])


def test_a_trial_split_into_chunks_is_one_trial_of_the_step():
    policy = tiny_policy(6)
    trajectories = sample_trajectories(policy, 4, seed=6)
    trajectories[1] = trajectories[1].model_copy(update={"trial_id": trajectories[0].trial_id, "chunk": 1})
    batch = batch_of(trajectories)
    assert len(batch) == 4 and batch.trials == ("trial-6-0", "trial-6-2", "trial-6-3")
    learner = TorchLearner(policy, PPOConfig(), critic=TorchCritic.for_policy(policy, PPOConfig()))
    assert learner.step(batch).event().trials == ["trial-6-0", "trial-6-2", "trial-6-3"]


def test_sgd_policy_optimizer_moves_at_most_lr_times_max_grad_norm_along_the_gradient():
    policy = tiny_policy(3)
    cfg = PPOConfig(policy_optimizer="sgd", actor_lr=0.05, max_grad_norm=0.1, critic_lr=1e-3)
    batch = batch_of(sample_trajectories(policy, 8, seed=3))
    batch = batch.with_old_values(torch.full(batch.token_ids.shape, float(batch.rewards.mean())))
    learner = TorchLearner(policy, cfg, fidelity_metrics=False)
    assert isinstance(learner.optimizer, torch.optim.SGD)
    before = flat_params(policy)
    result = learner.step(batch)
    moved = float((flat_params(policy) - before).norm())
    assert 0 < moved <= 0.05 * 0.1 * (1 + 1e-4)
    if result.metrics["grad_norm"] >= 0.1:  # clipped: the step is exactly lr * max_grad_norm long
        assert moved == pytest.approx(0.005, rel=1e-3)


def test_sgd_policy_optimizer_needs_an_explicit_critic_lr():
    with pytest.raises(ValueError, match="policy_optimizer = 'sgd' needs an explicit critic_lr"):
        PPOConfig(policy_optimizer="sgd", actor_lr=1.0)


def test_actor_params_trains_the_matching_tensors_and_leaves_every_other_one_bit_identical():
    policy = tiny_policy(3)
    cfg = PPOConfig(actor_params=("model.norm.weight", "*.q_norm.weight"), actor_lr=1e-2, critic_lr=1e-3)
    batch = batch_of(sample_trajectories(policy, 8, seed=3))
    batch = batch.with_old_values(torch.full(batch.token_ids.shape, float(batch.rewards.mean())))
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    learner = TorchLearner(policy, cfg, fidelity_metrics=False)
    expected = ["model.norm.weight"] + [f"model.layers.{i}.self_attn.q_norm.weight" for i in range(L)]
    assert sorted(learner.trained_params) == sorted(expected)
    learner.step(batch)
    for name, p in policy.named_parameters():
        changed = not torch.equal(before[name], p.detach())
        assert changed == (name in expected), name


def test_actor_params_that_match_no_tensor_are_refused_by_name():
    with pytest.raises(ValueError, match=r"actor_params \['model.final_norm'\] match no policy tensor"):
        TorchLearner(tiny_policy(), PPOConfig(actor_params=("model.norm.weight", "model.final_norm"), critic_lr=1e-3))


def test_actor_params_for_part_of_the_policy_need_an_explicit_critic_lr():
    with pytest.raises(ValueError, match="actor_params = \\['model.norm.weight'\\] with no critic_lr"):
        PPOConfig(actor_params=("model.norm.weight",), actor_lr=2e-2)
    assert not PPOConfig(actor_params=("*",)).trains_part_of_policy
