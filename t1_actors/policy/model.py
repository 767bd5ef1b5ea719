"""The MoE policy: a Qwen3-MoE compatible decoder that records its routing and can replay a record.

``MoEPolicy(config)(input_ids, ...)`` returns a ``PolicyOutput`` with float32 logits (float64 for a float64 model), the final
normed hidden states (for a value head) and, when asked, the expert ids every MoE layer selected.
``MoEBackbone`` is the trunk without the LM head, for a critic that brings its own head.
Weights are saved as a Hugging Face Qwen3-MoE directory (config.json + model.safetensors), which
transformers and SGLang load as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from t1_actors.policy._layers import DecoderLayer, RMSNorm, RotaryEmbedding
from t1_actors.policy.config import ModelConfig
from t1_actors.policy.kv_cache import KVCache
from t1_actors.policy.segment_kv import SegmentKV


@dataclass
class PolicyOutput:
    """``logits [B,T,V]`` (at least float32), ``routing [B,T,L,k]`` (int64 expert ids, or None),
    ``hidden_states [B,T,H]`` (final normed), ``past_key_values`` (a ``KVCache`` when use_cache)."""

    logits: torch.Tensor | None
    routing: torch.Tensor | None
    hidden_states: torch.Tensor
    past_key_values: KVCache | None = None


@dataclass
class BackboneOutput:
    hidden_states: torch.Tensor
    routing: torch.Tensor | None
    past_key_values: KVCache | None


def _attention_bias(attention_mask: torch.Tensor | None, steps: int, past: int, device: torch.device
                    ) -> torch.Tensor | None:
    """Boolean mask ``[B,1,T,past+T]``: causal and padding. None when plain causal attention suffices.

    A padding query may attend to itself only, so that no softmax row is empty (its output is unused).
    """
    if attention_mask is None and (past == 0 or steps == 1):
        return None  # plain causal (prefill) or a single new column that sees everything
    total = past + steps
    query_col = torch.arange(past, total, device=device).view(steps, 1)
    key_col = torch.arange(total, device=device).view(1, total)
    allowed = (key_col <= query_col).unsqueeze(0)  # [1, T, S]
    if attention_mask is not None:
        if attention_mask.shape[-1] != total:
            raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} columns, expected past ({past}) "
                             f"+ new ({steps}) = {total}; pass the mask of the whole cached sequence")
        allowed = allowed & attention_mask.bool().unsqueeze(1)
        allowed = allowed | (key_col == query_col).unsqueeze(0)
    return allowed.unsqueeze(1)


def _positions(attention_mask: torch.Tensor | None, batch: int, steps: int, past: int,
               device: torch.device) -> torch.Tensor:
    """Position of each new token: its index among the real tokens of its row (left padding ignored)."""
    if attention_mask is None:
        return torch.arange(past, past + steps, device=device).expand(batch, steps)
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -steps:]


def check_inputs(input_ids: torch.Tensor, routing_replay: torch.Tensor | None, config) -> None:
    """A backbone's input checks: the replayed routing's shape [batch, tokens, layers, k], ids in the vocabulary."""
    batch, steps = input_ids.shape
    expected = (batch, steps, config.num_layers, config.top_k)
    if routing_replay is not None and tuple(routing_replay.shape) != expected:
        raise ValueError(f"routing_replay has shape {tuple(routing_replay.shape)}, expected "
                         f"[batch, tokens, layers, k] = {expected}")
    if int(input_ids.max()) >= config.vocab_size or int(input_ids.min()) < 0:
        raise ValueError(f"input_ids outside [0, {config.vocab_size}); the tokenizer and "
                         f"{type(config).__name__}.vocab_size disagree")


class MoEBackbone(nn.Module):
    """Embedding, decoder layers and final norm (transformers' ``Qwen3MoeModel``)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)

    def forward(self, input_ids: torch.Tensor, *, routing_replay: torch.Tensor | None = None,
                capture_routing: bool = False, attention_mask: torch.Tensor | None = None,
                past_key_values: KVCache | None = None, use_cache: bool = False) -> BackboneOutput:
        batch, steps = input_ids.shape
        layers = self.config.num_layers
        check_inputs(input_ids, routing_replay, self.config)
        cache = past_key_values
        if use_cache and cache is None:
            cache = KVCache(layers, batch, self.config.num_kv_heads, self.config.head_dim,
                            capacity=steps + 64, dtype=self.embed_tokens.weight.dtype,
                            device=input_ids.device)
        past = cache.length if cache is not None else 0
        h = self.embed_tokens(input_ids)
        device = input_ids.device
        if attention_mask is not None:
            attention_mask = attention_mask.to(device)
        rope = self.rotary_emb(_positions(attention_mask, batch, steps, past, device), h.dtype)
        # a SegmentKV applies the causal rule itself (no [T, past + T] mask for a long prefix)
        mask = None if isinstance(cache, SegmentKV) else _attention_bias(attention_mask, steps, past, device)
        selected = []
        for i, layer in enumerate(self.layers):
            replay = routing_replay[:, :, i] if routing_replay is not None else None
            h, experts = layer(h, rope, mask, cache, replay)
            selected.append(experts)
        if cache is not None:
            cache.advance(steps)
        routing = None
        if capture_routing or routing_replay is not None:
            routing = torch.stack(selected, dim=2)  # [B, T, L, k]
        return BackboneOutput(self.norm(h), routing, cache if use_cache else None)


class MoEPolicy(nn.Module):
    """Causal LM over ``MoEBackbone`` (transformers' ``Qwen3MoeForCausalLM``, parameter for parameter)."""

    supports_prefix_reuse = True  # the sampler may keep a finished turn's KV columns for the next turn

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = MoEBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Fresh random weights (normal(0, std), norms at one), as transformers initialises Qwen3-MoE."""
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, std)

    @property
    def backbone(self) -> MoEBackbone:
        """The trunk (embeddings, layers, final norm) for a critic with its own head."""
        return self.model

    def forward(self, input_ids: torch.Tensor, *, routing_replay: torch.Tensor | None = None,
                capture_routing: bool = False, attention_mask: torch.Tensor | None = None,
                past_key_values: KVCache | None = None, use_cache: bool = False,
                logits_to_keep: int = 0) -> PolicyOutput:
        """Logits for ``input_ids [B,T]``.

        ``routing_replay [B,T,L,k]``: R3 replay, expert selection taken from the record (``.routing``
        then equals it). ``capture_routing``: return the live selection as ``.routing``.
        ``attention_mask [B, past+T]``: 1 = real token, for left or right padding.
        ``logits_to_keep``: if > 0 compute logits of the last that many positions only (decoding).
        """
        out = self.model(input_ids, routing_replay=routing_replay, capture_routing=capture_routing,
                         attention_mask=attention_mask, past_key_values=past_key_values, use_cache=use_cache)
        hidden = out.hidden_states[:, -logits_to_keep:] if logits_to_keep > 0 else out.hidden_states
        logits = self.lm_head(hidden)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> float32; float64 stays
        return PolicyOutput(logits, out.routing, out.hidden_states, out.past_key_values)

    def num_parameters(self, active: bool = False) -> int:
        """Parameter count; ``active=True`` counts only the k of E experts a token uses."""
        total = sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
        if not active:
            return total
        per_expert = sum(layer.mlp.experts.gate_up_proj[0].numel() + layer.mlp.experts.down_proj[0].numel()
                         for layer in self.model.layers)
        return total - per_expert * (self.config.num_experts - self.config.top_k)

    def new_cache(self, batch: int, capacity: int = 64) -> KVCache:
        """An empty KV cache for ``batch`` rows, in the model's dtype and device."""
        weight = self.model.embed_tokens.weight
        return KVCache(self.config.num_layers, batch, self.config.num_kv_heads, self.config.head_dim,
                       capacity=capacity, dtype=weight.dtype, device=weight.device)

    def save(self, path: str | Path) -> Path:
        """Write a Hugging Face Qwen3-MoE directory (config.json + model.safetensors) at ``path``."""
        from t1_actors.policy._hf import save_pretrained  # noqa: PLC0415 - cycle: _hf imports policy.model at load
        return save_pretrained(self, path)

    @classmethod
    def load(cls, path: str | Path, *, dtype: torch.dtype | None = None) -> MoEPolicy:
        """Load a directory written by ``save`` (or any HF Qwen3-MoE checkpoint)."""
        from t1_actors.policy._hf import from_pretrained  # noqa: PLC0415 - cycle: _hf imports policy.model at load
        return from_pretrained(path, dtype=dtype)
