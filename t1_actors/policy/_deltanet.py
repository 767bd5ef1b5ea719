"""Gated DeltaNet, the linear-attention token mixer of Qwen3.5 (transformers' ``Qwen3_5MoeGatedDeltaNet``).

Per layer and token ``t`` (heads independent, ``S`` the ``[d_k, d_v]`` state of a head):

    [q; k; v]_t = silu(causal_conv1d(W_qkv x)_t)        depthwise, kernel K, over the last K inputs
    q_t, k_t    = q_t / (|q_t| sqrt(d_k)), k_t / |k_t|   (L2 norm, eps 1e-6; query also / sqrt(d_k))
    beta_t      = sigmoid(W_b x_t)                       write strength in (0, 1)
    g_t         = -exp(A_log) * softplus(W_a x_t + dt_bias)   log decay, <= 0
    S_t         = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T     (gated delta rule)
    o_t         = S_t^T q_t
    y_t         = W_out [ RMSNorm(o_t) * silu(W_z x_t) ]  (per value head, weight w, not zero-centred)

that is ``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``. Query/key heads are shared
by ``H_v / H_k`` consecutive value heads. Parameter names follow transformers, so state dicts map one to one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence of the module doc, in plain recurrent form, in float32.

    ``q, k [B, H, T, d_k]`` (already normalised and scaled), ``v [B, H, T, d_v]``, ``g, beta [B, H, T]``,
    ``state [B, H, d_k, d_v]`` (S_0). Returns ``(o [B, H, T, d_v], S_T)``. Time O(T H d_k d_v), memory
    O(H d_k d_v) per row beside the outputs; sequential in T (a chunked form would parallelise it; this
    one is the readable reference and is exact up to float rounding of the same sums). Differentiable.
    """
    outputs = []
    for t in range(q.shape[2]):
        state = state * g[:, :, t].exp()[..., None, None]
        predicted = torch.einsum("bhkv,bhk->bhv", state, k[:, :, t])
        delta = beta[:, :, t, None] * (v[:, :, t] - predicted)
        state = state + k[:, :, t, :, None] * delta[:, :, None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, :, t]))
    return torch.stack(outputs, dim=2), state


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedRMSNorm(nn.Module):
    """``y = (w * x / sqrt(mean(x^2) + eps)) * silu(z)``, in float32, cast back to x's dtype."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return ((self.weight * x32.to(dtype)) * F.silu(z.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """One linear-attention layer. ``slot`` is its index among the linear layers (its cache state)."""

    def __init__(self, config, slot: int):
        super().__init__()
        self.slot = slot
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel = config.linear_conv_kernel_dim
        hidden = config.hidden_size
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False,
                                padding=self.kernel - 1)  # the weight only: forward runs its own causal conv
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, hidden, bias=False)
        self.in_proj_qkv = nn.Linear(hidden, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, self.num_v_heads, bias=False)

    def forward(self, x: torch.Tensor, row_mask: torch.Tensor | None, cache=None) -> torch.Tensor:
        """``x [B, T, H]`` -> ``[B, T, H]``; with ``cache`` it starts from and leaves the layer's state.

        ``row_mask [B, T]`` (1 = real token) zeroes padded inputs: from a zero state, leading padding
        leaves the state zero (``k = v = 0``) and feeds the conv zeros (its causal padding), so a
        left-padded row gets exactly the outputs it gets alone; trailing padding never reaches earlier
        tokens. Padding after real tokens of the same row would decay the state: callers never do that
        (``Qwen35MoeBackbone`` refuses it).
        """
        batch, steps, _ = x.shape
        if row_mask is not None:
            x = x * row_mask[..., None].to(x.dtype)
        qkv = self.in_proj_qkv(x).transpose(1, 2)  # [B, C, T]
        if cache is not None:
            conv_state = cache.conv_states[self.slot]
        else:
            conv_state = qkv.new_zeros(batch, self.conv_dim, self.kernel - 1)
        window = torch.cat([conv_state.to(qkv.dtype), qkv], dim=-1)  # the last K-1 inputs, then these
        qkv = F.silu(F.conv1d(window, self.conv1d.weight, groups=self.conv_dim)).transpose(1, 2)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(batch, steps, self.num_k_heads, self.head_k_dim).transpose(1, 2).float()
        k = k.reshape(batch, steps, self.num_k_heads, self.head_k_dim).transpose(1, 2).float()
        v = v.reshape(batch, steps, self.num_v_heads, self.head_v_dim).transpose(1, 2).float()
        group = self.num_v_heads // self.num_k_heads
        q = _l2norm(q).repeat_interleave(group, dim=1) * self.head_k_dim ** -0.5
        k = _l2norm(k).repeat_interleave(group, dim=1)
        beta = torch.sigmoid(self.in_proj_b(x)).float().transpose(1, 2)
        g = (-self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)).transpose(1, 2)
        if cache is not None:
            state = cache.recurrent_states[self.slot]
        else:
            state = q.new_zeros(batch, self.num_v_heads, self.head_k_dim, self.head_v_dim)
        out, state = gated_delta_rule(q, k, v, g, beta, state.float())
        if cache is not None:
            cache.conv_states[self.slot] = window[:, :, window.shape[-1] - (self.kernel - 1):].detach()
            cache.recurrent_states[self.slot] = state.detach()
        z = self.in_proj_z(x).view(batch, steps, self.num_v_heads, self.head_v_dim)
        out = self.norm(out.transpose(1, 2).to(x.dtype), z)
        return self.out_proj(out.reshape(batch, steps, self.value_dim))
