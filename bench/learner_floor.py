"""The learner's PPO step and the critic's update against their matmul floor: same threads, same process.

The floor of a step is the sum of ``torch.matmul`` times over the step's own GEMM shapes, each timed on random
tensors of that shape in this process just before the step: every linear layer's forward product and its two
backward products (input gradient, weight gradient), attention's QK^T and PV per (sequence, head) and their four
backward products, each expert at the token count the batch's routing sends it, the LM head (learner) or the value
head (critic). ratio = floor / step time, the optimiser step included: 1.0 would be a step that does nothing but
its matmuls at torch's own speed. Attention is counted at full T x T (a causal kernel may skip half of it).

Shapes: the campaign's policy (ModelConfig(), ~5.5 M parameters) and the ~100 M one of bench/lib/hf_generate.py,
each on one batch of ``--trajectories`` x ``--length`` tokens (the learner's default: one epoch, one minibatch).
Last line: one JSON object (learner_floor_ratio, critic_floor_ratio: the campaign's shape; *_100m: the large one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.learner import make_trajectories
from bench.lib.hf_generate import SHAPES
from t1_actors.backends.torch_critic import TorchCritic
from t1_actors.backends.torch_learner import TorchLearner, collate
from t1_actors.policy.config import ModelConfig
from t1_actors.policy.model import MoEPolicy
from t1_actors.train.ppo import PPOConfig

Gemm = tuple[int, int, int, int]  # (groups, m, k, n): groups x [m, k] @ [k, n]


def linear_gemms(m: int, k: int, n: int, backward: bool) -> list[Gemm]:
    """y = x W^T with x [m, k], W [n, k]: the forward [m, k] @ [k, n]; backward dx = dy W ([m, n] @ [n, k]) and
    dW = dy^T x ([n, m] @ [m, k])."""
    return [(1, m, k, n)] + ([(1, m, n, k), (1, n, m, k)] if backward else [])


def attention_gemms(groups: int, steps: int, head_dim: int, backward: bool) -> list[Gemm]:
    """S = Q K^T ([T, d] @ [d, T]) and O = P V ([T, T] @ [T, d]) per (sequence, head); backward dQ = dS K,
    dK = dS^T Q, dP = dO V^T, dV = P^T dO."""
    forward = [(groups, steps, head_dim, steps), (groups, steps, steps, head_dim)]
    if not backward:
        return forward
    return forward + [(groups, steps, steps, head_dim), (groups, steps, steps, head_dim),
                      (groups, steps, head_dim, steps), (groups, steps, steps, head_dim)]


def step_gemms(config: ModelConfig, batch: int, steps: int, expert_tokens: list[Counter], head_out: int,
               backward: bool) -> list[Gemm]:
    """Every matmul of one forward (and backward) of the trunk on ``batch`` x ``steps`` tokens, with
    ``expert_tokens[layer][expert]`` tokens per expert, then a head of ``head_out`` outputs."""
    tokens, hidden = batch * steps, config.hidden_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    gemms: list[Gemm] = []
    for layer in range(config.num_layers):
        for out in (q, kv, kv):
            gemms += linear_gemms(tokens, hidden, out, backward)
        gemms += attention_gemms(batch * config.num_heads, steps, config.head_dim, backward)
        gemms += linear_gemms(tokens, q, hidden, backward)
        gemms += linear_gemms(tokens, hidden, config.num_experts, backward)  # the router
        for count in expert_tokens[layer].values():
            gemms += linear_gemms(count, hidden, 2 * config.moe_intermediate_size, backward)
            gemms += linear_gemms(count, config.moe_intermediate_size, hidden, backward)
    return gemms + linear_gemms(tokens, hidden, head_out, backward)


def matmul_seconds(gemms: list[Gemm], repeats: int) -> float:
    """Sum over ``gemms`` of the median time of ``torch.matmul`` on random float32 tensors of each shape."""
    timed: dict[Gemm, float] = {}
    for shape in set(gemms):
        groups, m, k, n = shape
        a = torch.randn(groups, m, k) if groups > 1 else torch.randn(m, k)
        b = torch.randn(groups, k, n) if groups > 1 else torch.randn(k, n)
        torch.matmul(a, b)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.matmul(a, b)
            samples.append(time.perf_counter() - start)
        timed[shape] = statistics.median(samples)
    return sum(timed[shape] for shape in gemms)


def median_seconds(step, repeats: int) -> float:
    step()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(config: ModelConfig, trajectories: int, length: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    policy = MoEPolicy(config)
    records = make_trajectories(policy, trajectories, length, seed=1)
    batch = collate(records, None, num_layers=config.num_layers, top_k=config.top_k)
    batch = batch.with_old_values(torch.full(batch.token_ids.shape, float(batch.rewards.mean())))
    rows, steps = batch.token_ids.shape
    steps -= 1  # the step predicts tokens 1..T-1 from 0..T-2
    routing = batch.routing[:, :steps]  # [B, T, L, k], the replayed selection
    expert_tokens = [Counter(routing[:, :, layer].reshape(-1).tolist()) for layer in range(config.num_layers)]
    cfg = PPOConfig()
    learner = TorchLearner(policy, cfg, replay=True, fidelity_metrics=False)
    critic = TorchCritic.for_policy(MoEPolicy(config), cfg)
    # floors first (the matmuls alone), then the steps, then the floors again: the ratio uses their mean, so a
    # machine that got busier or quieter during the run moves both sides
    learner_gemms = step_gemms(config, rows, steps, expert_tokens, config.vocab_size, backward=True)
    critic_gemms = step_gemms(config, rows, steps, expert_tokens, 1, backward=True)
    floors = [(matmul_seconds(learner_gemms, repeats), matmul_seconds(critic_gemms, repeats))]
    learner_s = median_seconds(lambda: learner.step(batch), repeats)
    critic_s = median_seconds(lambda: critic.update(batch), repeats)
    floors.append((matmul_seconds(learner_gemms, repeats), matmul_seconds(critic_gemms, repeats)))
    learner_floor = statistics.mean(f[0] for f in floors)
    critic_floor = statistics.mean(f[1] for f in floors)
    flops = 2 * sum(g * m * k * n for g, m, k, n in learner_gemms)
    return {"learner_floor_ratio": learner_floor / learner_s, "critic_floor_ratio": critic_floor / critic_s,
            "learner_step_s": learner_s, "learner_floor_s": learner_floor, "critic_update_s": critic_s,
            "critic_floor_s": critic_floor, "learner_gflops_per_s": flops / learner_s / 1e9,
            "matmul_gflops_per_s": flops / learner_floor / 1e9, "tokens": rows * steps,
            "parameters": policy.num_parameters()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--length", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the learner's [learner] threads)")
    parser.add_argument("--shapes", default="tiny,100m", help="of bench/lib/hf_generate.py's SHAPES")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict[str, float] = {"threads": args.threads, "trajectories": args.trajectories, "length": args.length}
    for name in args.shapes.split(","):
        figures = measure(SHAPES[name], args.trajectories, args.length, args.repeats)
        suffix = "" if name == "tiny" else f"_{name}"
        print(f"{name}: {figures['parameters'] / 1e6:.1f} M parameters, {figures['tokens']} tokens a step")
        print(f"  learner step {figures['learner_step_s']:.3f} s, its matmuls {figures['learner_floor_s']:.3f} s: "
              f"ratio {figures['learner_floor_ratio']:.2f} ({figures['learner_gflops_per_s']:.1f} of "
              f"{figures['matmul_gflops_per_s']:.1f} GFLOP/s)")
        print(f"  critic update {figures['critic_update_s']:.3f} s, its matmuls {figures['critic_floor_s']:.3f} s: "
              f"ratio {figures['critic_floor_ratio']:.2f}")
        result.update({f"{key}{suffix}": value for key, value in figures.items()})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
