"""Qwen3.5-MoE policy: hybrid Gated DeltaNet / gated-attention decoder with routed + shared experts.

``Qwen35MoePolicy(Qwen35MoeConfig(...))`` has the interface of ``MoEPolicy`` (routing capture, R3
replay, KV cache, save/load) and transformers' ``Qwen3_5MoeForCausalLM`` parameter names. Layer ``i``:

    h += mixer_i(norm(h))         mixer = GatedDeltaNet (``_deltanet.py``) or GatedAttention
    h += moe(norm(h))             moe(x) = sum_{e in TopK} g_e expert_e(x) + sigmoid(w_s . x) shared(x)

Norms here are zero-centred, ``y = (1 + w) * x / sqrt(mean(x^2) + eps)`` (weights start at 0).
GatedAttention: ``o = softmax(q k^T / sqrt(d)) v * sigmoid(gate)`` with the gate a second half of
``q_proj`` per head, RMS-normed q/k, RoPE on the first ``rotary_dim`` channels of each head only
(text positions: transformers' mRoPE sections all carry the same position, so this is plain RoPE).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from t1_actors.policy._deltanet import GatedDeltaNet
from t1_actors.policy._layers import Experts, RotaryEmbedding, Router, apply_rope
from t1_actors.policy.config import Qwen35MoeConfig
from t1_actors.policy.kv_cache import KVCache
from t1_actors.policy.model import BackboneOutput, MoEPolicy, _attention_bias, _positions, check_inputs
from t1_actors.policy.routing import r3_gate, topk_gate


class ZeroCenteredRMSNorm(nn.Module):
    """``y = (1 + w) * x / sqrt(mean(x^2) + eps)`` in float32, cast back to x's dtype."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).type_as(x)


class GatedAttention(nn.Module):
    """Causal GQA attention with an output gate and partial RoPE. ``slot``: index among attention layers."""

    def __init__(self, config: Qwen35MoeConfig, slot: int):
        super().__init__()
        self.slot = slot
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, 2 * config.num_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.hidden_size, bias=False)
        self.q_norm = ZeroCenteredRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(config.head_dim, config.rms_norm_eps)

    def forward(self, x, rope, mask, cache: KVCache | None) -> torch.Tensor:
        batch, steps, _ = x.shape
        q, gate = self.q_proj(x).view(batch, steps, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, steps, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, steps, self.num_kv_heads, self.head_dim).transpose(1, 2)
        rot = rope[0].shape[-1]
        q = torch.cat([apply_rope(q[..., :rot], *rope), q[..., rot:]], dim=-1)
        k = torch.cat([apply_rope(k[..., :rot], *rope), k[..., rot:]], dim=-1)
        if cache is not None:
            k, v = cache.update(self.slot, k, v)
        causal = mask is None and k.shape[2] == steps and steps > 1
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             enable_gqa=self.num_heads != self.num_kv_heads)
        out = out.transpose(1, 2).reshape(batch, steps, -1) * torch.sigmoid(gate.reshape(batch, steps, -1))
        return self.o_proj(out)


class SharedExpert(nn.Module):
    """Dense SwiGLU MLP ``down(silu(gate x) * up x)``."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SharedExpertMoE(nn.Module):
    """``sum_{e in S} g_e expert_e(x) + sigmoid(w_s . x) shared(x)``; S live top-k or replayed (R3)."""

    def __init__(self, config: Qwen35MoeConfig):
        super().__init__()
        self.top_k = config.top_k
        self.gate = Router(config)
        self.experts = Experts(config)
        self.shared_expert = SharedExpert(config.hidden_size, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor, replay: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        batch, steps, hidden = x.shape
        flat = x.reshape(-1, hidden)
        logits = self.gate(flat)
        if replay is None:
            gates, experts = topk_gate(logits, self.top_k, True)
        else:
            experts = replay.reshape(-1, replay.shape[-1]).long()
            gates = r3_gate(logits, experts, True)
        out = self.experts(flat, experts, gates)
        out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.view(batch, steps, hidden), experts.view(batch, steps, -1)


class HybridDecoderLayer(nn.Module):
    def __init__(self, config: Qwen35MoeConfig, layer: int):
        super().__init__()
        self.layer_type = config.layer_types[layer]
        slot = config.layer_types[:layer].count(self.layer_type)
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(config, slot)
        else:
            self.self_attn = GatedAttention(config, slot)
        self.mlp = SharedExpertMoE(config)
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h, rope, mask, row_mask, cache, replay) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.input_layernorm(h)
        if self.layer_type == "linear_attention":
            h = h + self.linear_attn(x, row_mask, cache)
        else:
            h = h + self.self_attn(x, rope, mask, cache)
        moe_out, experts = self.mlp(self.post_attention_layernorm(h), replay)
        return h + moe_out, experts


class HybridCache(KVCache):
    """KV of the attention layers (columns, as ``KVCache``) plus, per DeltaNet layer, its conv state
    ``[B, conv_dim, K-1]`` (the last K-1 projected inputs) and recurrent state ``[B, H_v, d_k, d_v]``
    (float32). Zero states are the empty prefix, so a fresh cache prefills exactly like no cache.
    Row operations (``select``, ``merge``) carry the states with their rows; ``trim_left`` drops
    padding columns, which states do not have. Per-row prefix export (``row_prefix``) is not offered:
    a state is the whole prefix and cannot be cut to selected columns.
    """

    def __init__(self, config: Qwen35MoeConfig, batch: int, *, capacity: int = 64,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        super().__init__(config.layer_types.count("full_attention"), batch, config.num_kv_heads,
                         config.head_dim, capacity=capacity, dtype=dtype, device=device)
        linear = config.layer_types.count("linear_attention")
        conv_dim = 2 * config.linear_num_key_heads * config.linear_key_head_dim + \
            config.linear_num_value_heads * config.linear_value_head_dim
        self.conv_states = [torch.zeros(batch, conv_dim, config.linear_conv_kernel_dim - 1, dtype=dtype,
                                        device=device) for _ in range(linear)]
        self.recurrent_states = [torch.zeros(batch, config.linear_num_value_heads, config.linear_key_head_dim,
                                             config.linear_value_head_dim, device=device) for _ in range(linear)]

    def select(self, rows) -> None:
        super().select(rows)
        index = torch.as_tensor(rows, dtype=torch.long, device=self.keys[0].device)
        self.conv_states = [s.index_select(0, index) for s in self.conv_states]
        self.recurrent_states = [s.index_select(0, index) for s in self.recurrent_states]

    def merge(self, other: HybridCache) -> tuple[int, int]:
        pads = super().merge(other)
        self.conv_states = [torch.cat(p, 0) for p in zip(self.conv_states, other.conv_states)]
        self.recurrent_states = [torch.cat(p, 0) for p in zip(self.recurrent_states, other.recurrent_states)]
        return pads

    def row_prefix(self, row, columns):
        raise NotImplementedError("a recurrent state is not a per-column prefix; prefix reuse is off for Qwen3.5")


class Qwen35MoeBackbone(nn.Module):
    """Embedding, hybrid decoder layers and final norm (transformers' ``Qwen3_5MoeTextModel``)."""

    def __init__(self, config: Qwen35MoeConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HybridDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta)

    def forward(self, input_ids: torch.Tensor, *, routing_replay: torch.Tensor | None = None,
                capture_routing: bool = False, attention_mask: torch.Tensor | None = None,
                past_key_values: HybridCache | None = None, use_cache: bool = False) -> BackboneOutput:
        """As ``MoEBackbone.forward``. Padding must lead each row (before its first real token) or trail it:
        a DeltaNet state cannot skip a gap, so new padded columns after a cached prefix are refused."""
        batch, steps = input_ids.shape
        check_inputs(input_ids, routing_replay, self.config)
        cache = past_key_values
        if use_cache and cache is None:
            cache = HybridCache(self.config, batch, capacity=steps + 64, dtype=self.embed_tokens.weight.dtype,
                                device=input_ids.device)
        past = cache.length if cache is not None else 0
        device = input_ids.device
        row_mask = None
        if attention_mask is not None:
            attention_mask = attention_mask.to(device)
            row_mask = attention_mask[:, -steps:]
            if past and not bool(row_mask.bool().all()):
                raise ValueError("padding after a cached prefix: DeltaNet states cannot skip it; "
                                 "left-pad only the first forward of a row")
        h = self.embed_tokens(input_ids)
        rope = self.rotary_emb(_positions(attention_mask, batch, steps, past, device), h.dtype)
        mask = _attention_bias(attention_mask, steps, past, device)
        selected = []
        for i, layer in enumerate(self.layers):
            replay = routing_replay[:, :, i] if routing_replay is not None else None
            h, experts = layer(h, rope, mask, row_mask, cache, replay)
            selected.append(experts)
        if cache is not None:
            cache.advance(steps)
        routing = torch.stack(selected, dim=2) if capture_routing or routing_replay is not None else None
        return BackboneOutput(self.norm(h), routing, cache if use_cache else None)


class Qwen35MoePolicy(MoEPolicy):
    """Causal LM over ``Qwen35MoeBackbone`` (transformers' ``Qwen3_5MoeForCausalLM``, parameter for parameter).

    Forward, routing capture/replay and ``num_parameters`` are ``MoEPolicy``'s; the cache is a
    ``HybridCache``. ``supports_prefix_reuse`` is False: see ``HybridCache``.
    """

    supports_prefix_reuse = False

    def __init__(self, config: Qwen35MoeConfig):
        nn.Module.__init__(self)
        self.config = config
        self.model = Qwen35MoeBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Fresh weights as transformers initialises Qwen3.5-MoE: matrices normal(0, std), zero-centred
        norms 0, the DeltaNet output norm 1, ``dt_bias`` 1, ``A_log = log(U(1, 16))``."""
        for name, param in self.named_parameters():
            if name.endswith("linear_attn.norm.weight") or name.endswith("dt_bias"):
                param.fill_(1.0)
            elif name.endswith("norm.weight"):
                param.zero_()
            elif name.endswith("A_log"):
                param.uniform_(1.0, 16.0).log_()
            else:
                param.normal_(0.0, std)

    def new_cache(self, batch: int, capacity: int = 64) -> HybridCache:
        """An empty hybrid cache for ``batch`` rows, in the model's dtype and device."""
        weight = self.model.embed_tokens.weight
        return HybridCache(self.config, batch, capacity=capacity, dtype=weight.dtype, device=weight.device)
