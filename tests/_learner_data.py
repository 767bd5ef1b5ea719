"""Small trajectories sampled from a tiny MoE policy, shaped as the log stores them (learner tests)."""

from __future__ import annotations

import numpy as np
import torch
from fixtures.models import tiny_model_config

from schemas import TrajectoryAssembled
from t1_actors.policy.config import ModelConfig
from t1_actors.policy.model import MoEPolicy
from t1_actors.policy.routing import routing_to_numpy

TINY = tiny_model_config(wide=True, vocab_size=64, hidden_size=32, head_dim=16, moe_intermediate_size=32, max_position=128)


def tiny_policy(seed: int = 0, config: ModelConfig = TINY) -> MoEPolicy:
    torch.manual_seed(seed)
    return MoEPolicy(config)


@torch.no_grad()
def _sample(policy: MoEPolicy, ids: torch.Tensor, steps: int, temperature: float, gen: torch.Generator) -> torch.Tensor:
    for _ in range(steps):
        logits = policy(ids).logits[:, -1].float() / temperature
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
        ids = torch.cat([ids, nxt], dim=1)
    return ids


@torch.no_grad()
def sample_trajectories(policy: MoEPolicy, n: int = 8, *, prompt: int = 5, turn: int = 6, tool: int = 3,
                        temperature: float = 1.0, seed: int = 0, sampler_dtype: torch.dtype | None = None,
                        version: int = 0) -> list[TrajectoryAssembled]:
    """Two-turn trajectories: prompt, sampled turn, tool output (not a loss region), sampled turn.

    The sampler's logprobs and routing come from ``policy`` cast to ``sampler_dtype`` (e.g. bf16), as a
    serving engine in another precision would give them. Reward: 0.5 * (first prompt token is even)
    + 0.05 * (number of even sampled tokens), so a critic can learn it and the policy can improve it.
    """
    gen = torch.Generator().manual_seed(seed)
    sampler = policy
    if sampler_dtype is not None:
        sampler = MoEPolicy(policy.config).to(sampler_dtype)
        sampler.load_state_dict(policy.state_dict())
    vocab = policy.config.vocab_size
    ids = torch.randint(0, vocab, (n, prompt), generator=gen)
    ids = _sample(sampler, ids, turn, temperature, gen)
    ids = torch.cat([ids, torch.randint(0, vocab, (n, tool), generator=gen)], dim=1)
    ids = _sample(sampler, ids, turn, temperature, gen)
    mask = torch.zeros_like(ids, dtype=torch.uint8)
    mask[:, prompt:prompt + turn] = 1
    mask[:, prompt + turn + tool:] = 1
    out = sampler(ids[:, :-1], capture_routing=True)
    logp = torch.log_softmax(out.logits.float() / temperature, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    logprobs = torch.cat([torch.zeros(n, 1), logp], dim=1) * mask
    trajectories = []
    for i in range(n):
        sampled = ids[i][mask[i].bool()]
        reward = 0.5 * float(ids[i, 0] % 2 == 0) + 0.05 * float((sampled % 2 == 0).sum())
        trajectories.append(TrajectoryAssembled(
            trial_id=f"trial-{seed}-{i}", chunk=0, task_id="task", token_ids=ids[i].numpy().astype(np.int32),
            loss_mask=mask[i].numpy(), sampler_logprobs=logprobs[i].numpy().astype(np.float32),
            routing=routing_to_numpy(out.routing[i], policy.config.num_experts),
            token_versions=(mask[i].numpy().astype(np.int32) * version), boundary_cases=["strict"],
            reward=reward, policy_version=version, turns=2))
    return trajectories
