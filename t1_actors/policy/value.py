"""The value model: the policy's architecture with a scalar value head, with its own weights.

``V(x_<=p) = w . h_p + b``, ``h_p`` the final normed hidden state of the trunk at position ``p``.
The trunk can start from the policy's weights (the usual warm start: the critic then reads the
same features the policy learned) and is trained separately with its own optimiser.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from t1_actors.policy.config import ModelConfig
from t1_actors.policy.kv_cache import KVCache
from t1_actors.policy.model import MoEBackbone, MoEPolicy


class ValueModel(nn.Module):
    """``forward(input_ids [B,T]) -> values [B,T]`` (float32, float64 for a float64 model), one V per position."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = MoEBackbone(config)
        self.value_head = nn.Linear(config.hidden_size, 1)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Fresh random weights as the policy initialises them; the head starts at V = 0."""
        for name, param in self.model.named_parameters():
            param.fill_(1.0) if name.endswith("norm.weight") else param.normal_(0.0, std)
        self.value_head.weight.normal_(0.0, std)
        self.value_head.bias.zero_()

    @classmethod
    def from_policy(cls, policy: MoEPolicy) -> ValueModel:
        """A value model whose trunk is a copy of the policy's (its own weights from here on)."""
        value = cls(policy.config)
        value.model.load_state_dict(policy.backbone.state_dict())
        return value.to(next(policy.parameters()).device)

    def forward(self, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                past_key_values: KVCache | None = None) -> torch.Tensor:
        """V per position; ``past_key_values``: the K/V of earlier positions (a ``SegmentKV`` for a segment)."""
        hidden = self.model(input_ids, attention_mask=attention_mask, past_key_values=past_key_values).hidden_states
        values = self.value_head(hidden).squeeze(-1)
        return values.to(torch.promote_types(values.dtype, torch.float32))

    def save(self, path: str | Path) -> Path:
        """``config.json`` + ``value.safetensors`` in directory ``path`` (atomic file replace)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / "value.safetensors.tmp"
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, str(tmp))
        tmp.replace(path / "value.safetensors")
        (path / "config.json").write_text(self.config.model_dump_json(indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> ValueModel:
        path = Path(path)
        if not (path / "value.safetensors").is_file():
            raise FileNotFoundError(f"{path / 'value.safetensors'} not found; ValueModel.load wants a directory "
                                    "written by ValueModel.save")
        value = cls(ModelConfig(**json.loads((path / "config.json").read_text())))
        value.load_state_dict(load_file(str(path / "value.safetensors")))
        return value
