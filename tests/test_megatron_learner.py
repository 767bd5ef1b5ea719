"""Megatron-core backend on CPU: a tiny GPTModel with MoE, the same PPO step, R3 via RouterReplay."""

import math
import warnings

import pytest
import torch
from _learner_data import TINY, sample_trajectories, tiny_policy

from t1_actors.backends.torch_learner import TorchLearner, collate
from t1_actors.policy.model import MoEPolicy
from t1_actors.train.ppo import PPOConfig

pytest.importorskip("megatron.core")
warnings.filterwarnings("ignore", message=".*Transformer Engine.*")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def megatron():
    from t1_actors.backends import megatron_learner
    yield megatron_learner
    from megatron.core import parallel_state
    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # leave no process group behind for other tests


def batch_for(policy, n=8, seed=0, baseline=0.3):
    batch = collate(sample_trajectories(policy, n, seed=seed), None, num_layers=TINY.num_layers, top_k=TINY.top_k)
    return batch.with_old_values(torch.full(batch.token_ids.shape, baseline))


def test_gpt_model_is_the_policy_architecture(megatron):
    policy = tiny_policy()
    learner = megatron.MegatronLearner(TINY, PPOConfig())
    learner.load_policy(policy)
    batch = batch_for(policy)
    with torch.no_grad():
        logits, routing = learner.forward(batch.inputs, None, True)
        reference = policy(batch.inputs, capture_routing=True)
    torch.testing.assert_close(logits, reference.logits, atol=1e-5, rtol=1e-4)
    assert torch.equal(routing.sort(-1).values, reference.routing.sort(-1).values)
    back = learner.to_policy().state_dict()
    for name, tensor in policy.state_dict().items():
        assert torch.equal(back[name], tensor), name


def test_megatron_ppo_step_runs_and_matches_the_torch_step(megatron):
    policy = tiny_policy()
    batch = batch_for(policy)
    cfg = PPOConfig(actor_lr=1e-3)
    learner = megatron.MegatronLearner(TINY, cfg)
    learner.load_policy(policy)
    before = learner.to_policy().state_dict()
    result = learner.step(batch)
    assert math.isfinite(result.metrics["policy_loss"]) and result.policy_version == 1
    reference = TorchLearner(policy, cfg).step(batch)
    assert result.metrics["policy_loss"] == pytest.approx(reference.metrics["policy_loss"], rel=1e-5)
    assert result.metrics["grad_norm"] == pytest.approx(reference.metrics["grad_norm"], rel=1e-3)
    after = learner.to_policy().state_dict()
    moved = [name for name in before if not torch.equal(before[name], after[name])]
    assert moved, "the megatron step changed no weight"
    for name, tensor in policy.state_dict().items():  # same update as the torch backend, up to fp rounding
        torch.testing.assert_close(after[name], tensor, atol=5e-5, rtol=1e-3)


def test_router_replay_makes_routing_equal_the_record(megatron):
    policy = tiny_policy()
    batch = batch_for(policy)
    learner = megatron.MegatronLearner(TINY, PPOConfig())
    learner.load_policy(policy)
    with torch.no_grad():
        for router in learner.routers:
            router.weight.normal_(0.0, 1.0)  # the live router now disagrees with the record
        _, live = learner.forward(batch.inputs, None, True)
        _, replayed = learner.forward(batch.inputs, batch.routing, True)
    record = batch.routing.sort(-1).values
    assert not torch.equal(live, record)
    assert torch.equal(replayed, record)
    metrics = learner.step(batch).metrics
    assert metrics["routing_mismatch_no_r3"] > 0.1
    assert metrics["logprob_gap_r3"] < metrics["logprob_gap_no_r3"]


def test_megatron_publishes_a_policy_the_samplers_load(megatron, tmp_path):
    policy = tiny_policy()
    learner = megatron.MegatronLearner(TINY, PPOConfig())
    learner.load_policy(policy)
    learner.step(batch_for(policy))
    published = learner.publish(tmp_path)
    loaded = MoEPolicy.load(published.location)
    expected = learner.to_policy().state_dict()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in expected.items())
    assert published.version == 1 and len(published.sha256) == 64


def test_megatron_learner_resumes_exactly_from_its_checkpoint(megatron, tmp_path):
    policy = tiny_policy()
    cfg = PPOConfig(minibatches=2)
    first, second = batch_for(policy, seed=1), batch_for(policy, seed=2)
    learner = megatron.MegatronLearner(TINY, cfg)
    learner.load_policy(policy)
    learner.step(first)
    learner.save_checkpoint(tmp_path / "ckpt.pt", cursor=b"cursor-7")
    expected = learner.step(second)
    restarted = megatron.MegatronLearner(TINY, cfg, seed=5)
    assert restarted.load_checkpoint(tmp_path / "ckpt.pt") == b"cursor-7"
    resumed = restarted.step(second)
    assert resumed.policy_version == expected.policy_version == 2
    assert resumed.metrics["policy_loss"] == expected.metrics["policy_loss"]
    for (name, a), b in zip(learner.model.state_dict().items(), restarted.model.state_dict().values()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), name
