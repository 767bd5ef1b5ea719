"""Data parallel: two gloo ranks, each with its share of the batch, give the single-process gradients."""

import datetime
import os
import sys
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp
from _learner_data import TINY, sample_trajectories, tiny_policy

from t1_actors.backends.torch_learner import TorchCritic, TorchLearner, collate, data_parallel_group, shard
from t1_actors.train.ppo import PPOConfig

CFG = PPOConfig(max_grad_norm=1e6)  # no clipping: compare raw gradients
# one weight per trial over its chunks, which sit on both ranks: the per-trial log-ratio sums are gathered
OFF_POLICY = CFG.model_copy(update={"old_logprobs": "recompute", "off_policy_correction": "truncate",
                                    "off_policy_level": "sequence", "off_policy_cap": 1.5})


def _first_step_gradients(learner: TorchLearner, batch) -> dict[str, list[torch.Tensor]]:
    """Gradients each optimiser sees at its first step (after the all-reduce), and the metrics."""
    seen: dict[str, list[torch.Tensor]] = {}

    def recorder(name, params):
        def hook(optimizer, args, kwargs):
            seen.setdefault(name, [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                                   for p in params])
        return hook

    learner.optimizer.register_step_pre_hook(recorder("policy", list(learner.policy.parameters())))
    learner.critic.optimizer.register_step_pre_hook(recorder("critic", list(learner.critic.model.parameters())))
    metrics = learner.step(batch).metrics
    return {**seen, "metrics": metrics}


def _batch(cfg: PPOConfig = CFG):
    if cfg.off_policy_correction == "none":
        return collate(sample_trajectories(tiny_policy(), 7, seed=5), None, num_layers=TINY.num_layers,
                       top_k=TINY.top_k)
    # another policy sampled them (w far from 1); rows 2k and 2k + 1, one trial's two chunks, go to two ranks
    batch = collate(sample_trajectories(tiny_policy(1), 7, seed=5), None, num_layers=TINY.num_layers,
                    top_k=TINY.top_k)
    return replace(batch, trial_ids=("a", "a", "b", "b", "c", "c", "d"))


def _rank(rank: int, world: int, init_file: str, out: str, cfg: PPOConfig) -> None:
    torch.set_num_threads(1)
    with data_parallel_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                             timeout=datetime.timedelta(seconds=120)):
        policy = tiny_policy()
        learner = TorchLearner(policy, cfg, critic=TorchCritic.for_policy(policy, cfg))
        result = _first_step_gradients(learner, shard(_batch(cfg)))
        if rank == 0:
            torch.save(result, out)


@pytest.mark.parametrize("cfg", [CFG, OFF_POLICY], ids=["recipe", "sequence_off_policy_correction"])
def test_two_gloo_ranks_match_single_process_gradients(tmp_path, cfg):
    torch.set_num_threads(1)
    out = tmp_path / "rank0.pt"
    os.environ["PYTHONPATH"] = os.pathsep.join(sys.path)
    mp.start_processes(_rank, args=(2, str(tmp_path / "pg"), str(out), cfg), nprocs=2, join=True,
                       start_method="spawn")
    distributed = torch.load(out, weights_only=False)

    policy = tiny_policy()
    single = _first_step_gradients(TorchLearner(policy, cfg, critic=TorchCritic.for_policy(policy, cfg)),
                                   _batch(cfg))
    for name in ("policy", "critic"):
        assert len(distributed[name]) == len(single[name])
        for g_dp, g_one in zip(distributed[name], single[name]):
            torch.testing.assert_close(g_dp, g_one, rtol=1e-4, atol=1e-7)
    metrics = ["policy_loss", "value_loss", "clip_fraction", "entropy", "loss_tokens", "logprob_gap_no_r3",
               "explained_variance", "kl_sampler_learner"]
    if cfg.off_policy_correction != "none":
        metrics += ["off_policy_weight_mean", "off_policy_truncated_fraction", "off_policy_masked_fraction"]
        assert 0 < single["metrics"]["off_policy_truncated_fraction"] < 1
    for metric in metrics:
        assert distributed["metrics"][metric] == pytest.approx(single["metrics"][metric], rel=1e-4, abs=1e-6), metric
