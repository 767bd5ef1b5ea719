"""PPO step with R3 replay vs without, same batch, same run, interleaved; tokens/s.

The model is the embedded default (ModelConfig()); the batch is trajectories whose sampler logprobs
and routing come from the same weights in bf16 (a serving engine in another precision), so the
fidelity figures (logprob gap with / without R3, routing mismatch) are measured too.
Last line: one JSON object with r3_step_ratio (target <= 1.05) and tokens_per_s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas import TrajectoryAssembled
from t1_actors.backends.torch_learner import TorchLearner, collate
from t1_actors.policy.config import ModelConfig
from t1_actors.policy.model import MoEPolicy
from t1_actors.policy.routing import routing_to_numpy
from t1_actors.train.ppo import PPOConfig


@torch.no_grad()
def make_trajectories(policy: MoEPolicy, n: int, length: int, seed: int) -> list[TrajectoryAssembled]:
    """Prompt quarter, then alternating sampled / tool-output eighths; logprobs + routing from bf16."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, policy.config.vocab_size, (n, length), generator=gen)
    mask = torch.zeros(n, length, dtype=torch.uint8)
    for start in range(length // 4, length, length // 4):
        mask[:, start:start + length // 8] = 1
    sampler = MoEPolicy(policy.config).to(torch.bfloat16)
    sampler.load_state_dict(policy.state_dict())
    out = sampler(ids[:, :-1], capture_routing=True)
    logp = torch.log_softmax(out.logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    logprobs = torch.cat([torch.zeros(n, 1), logp], 1) * mask
    rewards = torch.randint(0, 21, (n,), generator=gen).float() / 20
    return [TrajectoryAssembled(
        trial_id=f"bench-{i}", chunk=0, task_id="bench", token_ids=ids[i].numpy().astype(np.int32),
        loss_mask=mask[i].numpy(), sampler_logprobs=logprobs[i].numpy().astype(np.float32),
        routing=routing_to_numpy(out.routing[i], policy.config.num_experts),
        token_versions=np.zeros(length, np.int32), boundary_cases=["strict"], reward=float(rewards[i]),
        policy_version=0, turns=2) for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = ModelConfig()
    torch.manual_seed(0)
    policy = MoEPolicy(config)
    batch = collate(make_trajectories(policy, args.trajectories, args.length, seed=1), None,
                    num_layers=config.num_layers, top_k=config.top_k)
    batch = batch.with_old_values(torch.full(batch.token_ids.shape, float(batch.rewards.mean())))
    cfg = PPOConfig()

    # one learner per arm, from the same weights; steps interleaved so both see the same machine state
    arms = {}
    for name, replay in (("r3", True), ("no_r3", False)):
        copy = MoEPolicy(config)
        copy.load_state_dict(policy.state_dict())
        arms[name] = TorchLearner(copy, cfg, replay=replay, fidelity_metrics=False)
    fidelity = TorchLearner(policy, cfg, replay=True, fidelity_metrics=True).step(batch).metrics
    for learner in arms.values():
        learner.step(batch)  # warm-up
    # CPU seconds of this process (robust to other processes on a shared machine) and wall seconds;
    # arms alternate ABBA so drift and ordering cancel; the ratio is the median of paired ratios
    cpu = {name: [] for name in arms}
    wall = {name: [] for name in arms}
    for i in range(args.repeats):
        for name in (("r3", "no_r3") if i % 2 == 0 else ("no_r3", "r3")):
            start = time.process_time()
            wall[name].append(arms[name].step(batch).metrics["step_seconds"])
            cpu[name].append(time.process_time() - start)
    paired = lambda t: statistics.median(a / b for a, b in zip(t["r3"], t["no_r3"]))  # noqa: E731
    median = {name: statistics.median(s) for name, s in wall.items()}
    median_cpu = {name: statistics.median(s) for name, s in cpu.items()}
    tokens = batch.num_tokens
    result = {
        "r3_step_ratio": paired(cpu),
        "r3_step_ratio_wall": paired(wall),
        "tokens_per_s": tokens / median["r3"],
        "tokens_per_s_no_r3": tokens / median["no_r3"],
        "step_seconds_r3": median["r3"],
        "step_seconds_no_r3": median["no_r3"],
        "step_cpu_seconds_r3": median_cpu["r3"],
        "step_cpu_seconds_no_r3": median_cpu["no_r3"],
        "logprob_gap_r3": fidelity["logprob_gap_r3"],
        "logprob_gap_no_r3": fidelity["logprob_gap_no_r3"],
        "routing_mismatch_no_r3": fidelity["routing_mismatch_no_r3"],
        "tokens_per_step": tokens,
        "loss_tokens_per_step": batch.num_loss_tokens,
        "parameters": policy.num_parameters(),
        "threads": args.threads,
    }
    print(f"PPO step, {args.trajectories} x {args.length} tokens, {result['parameters'] / 1e6:.1f} M params, "
          f"{args.threads} threads, wall medians of {args.repeats}")
    print(f"  with R3    {median['r3'] * 1e3:8.1f} ms  {result['tokens_per_s']:8.0f} tok/s")
    print(f"  without R3 {median['no_r3'] * 1e3:8.1f} ms  {result['tokens_per_s_no_r3']:8.0f} tok/s")
    print(f"  ratio      {result['r3_step_ratio']:.3f} CPU time, {result['r3_step_ratio_wall']:.3f} wall "
          f"(median of {args.repeats} paired steps; target <= 1.05)")
    print(f"  bf16 sampler vs fp32 learner: |logprob gap| {result['logprob_gap_r3']:.5f} with R3, "
          f"{result['logprob_gap_no_r3']:.5f} without; routing choices differing without R3 "
          f"{100 * result['routing_mismatch_no_r3']:.2f} %")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
