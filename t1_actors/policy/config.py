"""Model configuration of the MoE policy (Qwen3-MoE compatible field meanings)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelConfig(BaseModel):
    """Shape of the policy. The tiny default trains on 2 CPU cores (a few million parameters)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(1024, gt=0)
    hidden_size: int = Field(160, gt=0)
    num_layers: int = Field(4, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(2, gt=0)
    head_dim: int = Field(40, gt=0)
    num_experts: int = Field(8, gt=0)
    top_k: int = Field(2, gt=0)
    moe_intermediate_size: int = Field(320, gt=0)
    norm_topk_prob: bool = True
    rope_theta: float = Field(10000.0, gt=0)
    rms_norm_eps: float = Field(1e-6, gt=0)
    max_position: int = Field(2048, gt=0)
    tie_word_embeddings: bool = False

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        return self

    @property
    def moe_layers(self) -> int:
        return self.num_layers
