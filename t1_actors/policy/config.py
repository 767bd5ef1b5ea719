"""Model configurations of the MoE policy: Qwen3-MoE (``ModelConfig``) and Qwen3.5-MoE (``Qwen35MoeConfig``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelConfig(BaseModel):
    """Shape of the policy. The tiny default trains on 2 CPU cores (a few million parameters)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(1024, gt=0, description="token ids of the embedding and the LM head; a campaign sets "
                                                    "it to its tokenizer's size ([campaign] tokenizer_vocab or "
                                                    "tokenizer)")
    hidden_size: int = Field(160, gt=0, description="width of the residual stream")
    num_layers: int = Field(4, gt=0, description="decoder layers; every one has an MoE MLP (and a routing record)")
    num_heads: int = Field(4, gt=0, description="attention (query) heads per layer")
    num_kv_heads: int = Field(2, gt=0, description="key/value heads per layer (grouped-query attention); num_heads "
                                                   "must be a multiple of it")
    head_dim: int = Field(40, gt=0, description="width of one attention head")
    num_experts: int = Field(8, gt=0, description="routed experts per MoE layer")
    top_k: int = Field(2, gt=0, description="experts each token is routed to per layer (at most num_experts)")
    moe_intermediate_size: int = Field(320, gt=0, description="hidden width of one expert's SwiGLU MLP")
    norm_topk_prob: bool = Field(True, description="renormalise the gate weights of the top_k selected experts to "
                                                   "sum to 1; false: their plain softmax probabilities")
    rope_theta: float = Field(10000.0, gt=0, description="base of the rotary position embedding (RoPE)")
    rms_norm_eps: float = Field(1e-6, gt=0, description="epsilon of the RMSNorm layers")
    max_position: int = Field(2048, gt=0, description="longest sequence the model is meant for: the checkpoint's "
                                                      "max_position_embeddings (SGLang's context length); [campaign] "
                                                      "max_context must not exceed it")
    tie_word_embeddings: bool = Field(False, description="the LM head shares the token embedding's weights")

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        return self

    @property
    def moe_layers(self) -> int:
        return self.num_layers


LayerType = Literal["linear_attention", "full_attention"]


class Qwen35MoeConfig(BaseModel):
    """Shape of a Qwen3.5-MoE policy (transformers' ``Qwen3_5MoeTextConfig`` field meanings).

    A hybrid stack: ``layer_types[i]`` says whether layer ``i`` mixes tokens with a Gated DeltaNet
    (``linear_attention``) or with gated softmax attention (``full_attention``); when not given it
    follows ``full_attention_interval`` (every n-th layer full), as transformers does. Every layer's
    MLP is a routed top-k MoE plus a sigmoid-gated shared expert; the router always renormalises the
    top-k probabilities (``norm_topk_prob`` is True by construction). At least one layer is full
    attention: the KV cache's column axis (positions, padding) lives on those layers.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(1024, gt=0)
    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(4, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    head_dim: int = Field(32, gt=0)
    partial_rotary_factor: float = Field(0.25, gt=0, le=1)
    num_experts: int = Field(8, gt=0)
    top_k: int = Field(2, gt=0)
    moe_intermediate_size: int = Field(128, gt=0)
    shared_expert_intermediate_size: int = Field(128, gt=0)
    linear_num_key_heads: int = Field(2, gt=0)
    linear_num_value_heads: int = Field(4, gt=0)
    linear_key_head_dim: int = Field(32, gt=0)
    linear_value_head_dim: int = Field(32, gt=0)
    linear_conv_kernel_dim: int = Field(4, gt=1)
    layer_types: tuple[LayerType, ...] = ()
    full_attention_interval: int = Field(4, gt=0)
    rope_theta: float = Field(10000.0, gt=0)
    rms_norm_eps: float = Field(1e-6, gt=0)
    max_position: int = Field(2048, gt=0)
    tie_word_embeddings: bool = False

    @model_validator(mode="before")
    @classmethod
    def _default_layer_types(cls, data):
        if isinstance(data, dict) and not data.get("layer_types"):
            n, every = data.get("num_layers", 4), data.get("full_attention_interval", 4)
            data = {**data, "layer_types": tuple("full_attention" if (i + 1) % every == 0 else "linear_attention"
                                                 for i in range(n))}
        return data

    @model_validator(mode="after")
    def _check(self) -> Qwen35MoeConfig:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                             f"linear_num_key_heads ({self.linear_num_key_heads})")
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        if "full_attention" not in self.layer_types:
            raise ValueError("at least one layer must be full_attention (the KV cache's positions live there)")
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ValueError(f"rotary dim int(head_dim * partial_rotary_factor) = {self.rotary_dim} must be even, >= 2")
        return self

    @property
    def norm_topk_prob(self) -> bool:
        return True

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def moe_layers(self) -> int:
        return self.num_layers
