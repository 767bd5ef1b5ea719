"""The MoE policy: model (routing capture, R3 replay), sampling, tokenizer and chat template."""

from .config import ModelConfig
from ._hf import from_pretrained
from .kv_cache import KVCache
from .model import MoEBackbone, MoEPolicy, PolicyOutput
from .routing import r3_gate, topk_gate

__all__ = ["ModelConfig", "MoEPolicy", "MoEBackbone", "PolicyOutput", "KVCache", "from_pretrained",
           "r3_gate", "topk_gate"]
