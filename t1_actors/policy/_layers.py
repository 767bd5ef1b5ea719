"""Building blocks of the Qwen3-MoE decoder: RMSNorm, RoPE, GQA attention with q/k norm, sparse MoE.

Parameter names and shapes follow transformers' in-memory ``Qwen3MoeForCausalLM`` (experts as 3D
tensors ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``) so that a state dict maps one to one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from t1_actors.policy.config import ModelConfig
from t1_actors.policy.kv_cache import KVCache
from t1_actors.policy.routing import r3_gate, topk_gate
from t1_actors.policy.segment_kv import SegmentKV


class RMSNorm(nn.Module):
    """``y = w * x / sqrt(mean(x^2) + eps)``, computed in float32 whatever the weights' dtype."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (default RoPE, rotate-half layout)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[B, T, head_dim]`` for integer ``positions [B, T]``."""
        freqs = positions[..., None].float() * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [B, H, T, D]`` rotated by the angles of its positions."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """Causal self-attention with grouped KV heads and RMS-normed queries/keys (per head)."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.num_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None,
                cache: KVCache | None) -> torch.Tensor:
        batch, steps, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, steps, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, steps, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, steps, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if isinstance(cache, SegmentKV):  # a segment of a long sequence: causal over the cached prefix and itself
            return self.o_proj(cache.attend(self.layer, q, k, v).transpose(1, 2).reshape(batch, steps, -1))
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        causal = mask is None and k.shape[2] == steps and steps > 1
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(batch, steps, -1))


class Router(nn.Module):
    """Linear router ``z = W h`` over the experts (Qwen3-MoE ``mlp.gate``)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Experts(nn.Module):
    """E SwiGLU experts ``down(silu(gate x) * up x)``, stored as 3D tensors, computed grouped by expert.

    Tokens are sorted by expert and each expert runs one matmul over all of its tokens (a loop over
    the E experts, never over tokens); the weighted outputs are scattered back with ``index_add_``.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_experts = config.num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(config.num_experts, 2 * config.moe_intermediate_size,
                                                     config.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(config.num_experts, config.hidden_size,
                                                  config.moe_intermediate_size))

    def forward(self, x: torch.Tensor, experts: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """``x [N, H]``, ``experts``/``gates [N, k]`` -> ``sum_i gates_i * expert_i(x)`` ``[N, H]``."""
        top_k = experts.shape[-1]
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // top_k
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        inputs = x.index_select(0, token).split(counts)
        outputs = []
        for expert, chunk in enumerate(inputs):
            if chunk.shape[0] == 0:
                continue
            gate, up = F.linear(chunk, self.gate_up_proj[expert]).chunk(2, dim=-1)
            outputs.append(F.linear(F.silu(gate) * up, self.down_proj[expert]))
        weighted = torch.cat(outputs) * gates.reshape(-1)[order, None].to(x.dtype)
        return torch.zeros_like(x).index_add_(0, token, weighted)


class SparseMoE(nn.Module):
    """Top-k routed experts; returns the output and the expert ids used (captured or replayed)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.top_k, self.norm_topk_prob = config.top_k, config.norm_topk_prob
        self.gate = Router(config)
        self.experts = Experts(config)

    def forward(self, x: torch.Tensor, replay: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        batch, steps, hidden = x.shape
        flat = x.reshape(-1, hidden)
        logits = self.gate(flat)
        if replay is None:
            gates, experts = topk_gate(logits, self.top_k, self.norm_topk_prob)
        else:
            experts = replay.reshape(-1, replay.shape[-1]).long()
            gates = r3_gate(logits, experts, self.norm_topk_prob)
        out = self.experts(flat, experts, gates)
        return out.view(batch, steps, hidden), experts.view(batch, steps, -1)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h))``; ``h += moe(norm(h))``."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(config, layer)
        self.mlp = SparseMoE(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, rope, mask, cache, replay) -> tuple[torch.Tensor, torch.Tensor]:
        h = h + self.self_attn(self.input_layernorm(h), rope, mask, cache)
        moe_out, experts = self.mlp(self.post_attention_layernorm(h), replay)
        return h + moe_out, experts
