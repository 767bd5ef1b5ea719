"""Hugging Face checkpoints <-> policies: config.json fields and safetensors layout.

Two architectures: Qwen3-MoE (``MoEPolicy``) and Qwen3.5-MoE (``Qwen35MoePolicy``, from a text-only
``Qwen3_5MoeForCausalLM`` checkpoint or the text model of a multimodal
``Qwen3_5MoeForConditionalGeneration`` one, whose weights live under ``model.language_model.``; the
vision tower ``model.visual.*`` and the multi-token-prediction head ``mtp.*`` are not loaded).
On disk experts are stored per expert (``mlp.experts.{e}.{gate,up,down}_proj.weight``), the layout
transformers writes and SGLang loads; in memory they are 3D (``gate_up_proj``, ``down_proj``).
A checkpoint already in the 3D layout loads too; any other expert tensor is refused by name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from t1_actors.policy.config import ModelConfig, Qwen35MoeConfig
from t1_actors.policy.model import MoEPolicy
from t1_actors.policy.qwen35 import Qwen35MoePolicy

_EXPERT_KEY = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_EXPERT_KEY = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(gate_up_proj|down_proj)$")
_QWEN35_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
_SKIPPED_PREFIXES = ("model.visual.", "mtp.")  # multimodal vision tower, multi-token-prediction head


def config_from_hf(hf: dict) -> ModelConfig | Qwen35MoeConfig:
    """The config of a ``config.json`` dict (Qwen3-MoE or Qwen3.5-MoE); a clear error for what we do not implement."""
    model_type = hf.get("model_type")
    if model_type in _QWEN35_TYPES:
        return qwen35_config_from_hf(hf)
    if model_type not in (None, "qwen3_moe"):
        raise ValueError(f"config.json has model_type {model_type!r}; only 'qwen3_moe', 'qwen3_5_moe' and "
                         "'qwen3_5_moe_text' checkpoints load here")
    sparse_step = hf.get("decoder_sparse_step", 1)
    if sparse_step != 1 or hf.get("mlp_only_layers"):
        raise ValueError("checkpoint has dense MLP layers (decoder_sparse_step != 1 or mlp_only_layers); "
                         "MoEPolicy needs every layer to be MoE")
    if hf.get("use_sliding_window"):
        raise ValueError("checkpoint uses sliding-window attention, which MoEPolicy does not implement")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ValueError(f"rope type {rope.get('rope_type')!r} is not implemented (only default RoPE)")
    heads = hf["num_attention_heads"]
    return ModelConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        num_experts=hf.get("num_experts", hf.get("num_local_experts")),
        top_k=hf["num_experts_per_tok"], moe_intermediate_size=hf["moe_intermediate_size"],
        norm_topk_prob=hf.get("norm_topk_prob", False),
        rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6), max_position=hf.get("max_position_embeddings", 2048),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
    )


def qwen35_config_from_hf(hf: dict) -> Qwen35MoeConfig:
    """Qwen35MoeConfig from a ``qwen3_5_moe_text`` config, or the ``text_config`` of a multimodal ``qwen3_5_moe`` one."""
    top = hf
    if "text_config" in hf:
        hf = {"tie_word_embeddings": top.get("tie_word_embeddings", False), **hf["text_config"]}
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ValueError(f"rope type {rope.get('rope_type')!r} is not implemented (only default RoPE)")
    heads = hf["num_attention_heads"]
    fields = dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=heads, num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        partial_rotary_factor=rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)),
        num_experts=hf["num_experts"], top_k=hf["num_experts_per_tok"],
        moe_intermediate_size=hf["moe_intermediate_size"],
        shared_expert_intermediate_size=hf["shared_expert_intermediate_size"],
        linear_num_key_heads=hf["linear_num_key_heads"], linear_num_value_heads=hf["linear_num_value_heads"],
        linear_key_head_dim=hf["linear_key_head_dim"], linear_value_head_dim=hf["linear_value_head_dim"],
        linear_conv_kernel_dim=hf.get("linear_conv_kernel_dim", 4),
        layer_types=tuple(hf.get("layer_types") or ()), full_attention_interval=hf.get("full_attention_interval", 4),
        rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)), rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        max_position=hf.get("max_position_embeddings", 2048), tie_word_embeddings=hf.get("tie_word_embeddings", False))
    return Qwen35MoeConfig(**fields)


def qwen35_config_to_hf(config: Qwen35MoeConfig, dtype: torch.dtype) -> dict:
    """A ``config.json`` that transformers (>= 5.2) reads as ``Qwen3_5MoeForCausalLM``."""
    return {
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "num_experts": config.num_experts, "num_experts_per_tok": config.top_k,
        "moe_intermediate_size": config.moe_intermediate_size,
        "shared_expert_intermediate_size": config.shared_expert_intermediate_size,
        "linear_num_key_heads": config.linear_num_key_heads, "linear_num_value_heads": config.linear_num_value_heads,
        "linear_key_head_dim": config.linear_key_head_dim, "linear_value_head_dim": config.linear_value_head_dim,
        "linear_conv_kernel_dim": config.linear_conv_kernel_dim, "layer_types": list(config.layer_types),
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta,
                            "partial_rotary_factor": config.partial_rotary_factor},
        "rms_norm_eps": config.rms_norm_eps, "max_position_embeddings": config.max_position,
        "tie_word_embeddings": config.tie_word_embeddings, "hidden_act": "silu", "attention_bias": False,
        "router_aux_loss_coef": 0.0, "output_router_logits": False,
        "torch_dtype": str(dtype).removeprefix("torch."), "dtype": str(dtype).removeprefix("torch."),
    }


def config_to_hf(config: ModelConfig | Qwen35MoeConfig, dtype: torch.dtype) -> dict:
    """A ``config.json`` that transformers (4.x and 5.x) and SGLang read as Qwen3-MoE (or Qwen3.5-MoE)."""
    if isinstance(config, Qwen35MoeConfig):
        return qwen35_config_to_hf(config, dtype)
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.moe_intermediate_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "num_experts": config.num_experts,
        "num_experts_per_tok": config.top_k, "moe_intermediate_size": config.moe_intermediate_size,
        "norm_topk_prob": config.norm_topk_prob, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "rope_theta": config.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rms_norm_eps": config.rms_norm_eps, "max_position_embeddings": config.max_position,
        "tie_word_embeddings": config.tie_word_embeddings, "hidden_act": "silu", "attention_bias": False,
        "use_sliding_window": False, "router_aux_loss_coef": 0.0, "output_router_logits": False,
        "torch_dtype": str(dtype).removeprefix("torch."), "dtype": str(dtype).removeprefix("torch."),
    }


def to_hf_state_dict(state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """In-memory (3D experts) -> on-disk per-expert layout."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if tied and key == "lm_head.weight":
            continue
        if key.endswith("mlp.experts.gate_up_proj"):
            prefix = key.removesuffix(".gate_up_proj")
            for e, w in enumerate(tensor):
                gate, up = w.chunk(2, dim=0)
                out[f"{prefix}.{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{prefix}.{e}.up_proj.weight"] = up.contiguous()
        elif key.endswith("mlp.experts.down_proj"):
            prefix = key.removesuffix(".down_proj")
            for e, w in enumerate(tensor):
                out[f"{prefix}.{e}.down_proj.weight"] = w.contiguous()
        else:
            out[key] = tensor.contiguous()
    return out


def from_hf_state_dict(tensors: dict[str, torch.Tensor], config: ModelConfig | Qwen35MoeConfig
                       ) -> dict[str, torch.Tensor]:
    """On-disk per-expert layout (or already 3D) -> in-memory 3D experts; other expert tensors are refused."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for key, tensor in tensors.items():
        match = _EXPERT_KEY.match(key)
        if match:
            prefix, e, kind = match.group(1), int(match.group(2)), match.group(3)
            experts.setdefault(prefix, {}).setdefault(kind, {})[e] = tensor
        elif ".mlp.experts." in key and not _FUSED_EXPERT_KEY.match(key):
            raise ValueError(f"checkpoint tensor {key!r} has an unknown expert layout; known: per expert "
                             "'...mlp.experts.{e}.{gate,up,down}_proj.weight' or fused "
                             "'...mlp.experts.gate_up_proj [E, 2I, H]' / '...mlp.experts.down_proj [E, H, I]'")
        else:
            out[key] = tensor
    for prefix, kinds in experts.items():
        try:
            gate = [kinds["gate_proj"][e] for e in range(config.num_experts)]
            up = [kinds["up_proj"][e] for e in range(config.num_experts)]
            down = [kinds["down_proj"][e] for e in range(config.num_experts)]
        except KeyError as missing:
            raise ValueError(f"checkpoint lacks expert {missing} of {prefix} "
                             f"(config says {config.num_experts} experts)") from None
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat(pair) for pair in zip(gate, up)])
        out[f"{prefix}.down_proj"] = torch.stack(down)
    if config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def save_pretrained(policy, path: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (per-expert layout) into directory ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
    dtype = next(iter(state.values())).dtype
    tensors = to_hf_state_dict(state, policy.config.tie_word_embeddings)
    tmp = path / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path / "model.safetensors")  # readers never see a half-written file
    (path / "config.json").write_text(json.dumps(config_to_hf(policy.config, dtype), indent=2))
    return path


def _text_model_key(key: str) -> str | None:
    """The text model's name of a checkpoint tensor (multimodal prefix dropped); None: not loaded."""
    if key.startswith("model.language_model."):
        key = "model." + key.removeprefix("model.language_model.")
    return None if key.startswith(_SKIPPED_PREFIXES) else key


def from_pretrained(path: str | Path, *, dtype: torch.dtype | None = None):
    """The policy of a Hugging Face directory (config.json + one or more *.safetensors): ``MoEPolicy``
    for Qwen3-MoE, ``Qwen35MoePolicy`` for Qwen3.5-MoE (text-only or multimodal checkpoint).
    Raises ValueError naming the tensor when one is missing, unexpected or of another shape."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found; from_pretrained wants a Hugging Face model "
                                "directory (config.json + *.safetensors)")
    config = config_from_hf(json.loads(config_file.read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path} (only safetensors checkpoints load)")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                name = _text_model_key(key) if isinstance(config, Qwen35MoeConfig) else key
                if name is not None:
                    tensors[name] = f.get_tensor(key)
    state = from_hf_state_dict(tensors, config)
    policy = (Qwen35MoePolicy if isinstance(config, Qwen35MoeConfig) else MoEPolicy)(config)
    expected = policy.state_dict()
    for key, tensor in state.items():
        if key in expected and tuple(tensor.shape) != tuple(expected[key].shape):
            raise ValueError(f"checkpoint tensor {key!r} has shape {tuple(tensor.shape)}, the config implies "
                             f"{tuple(expected[key].shape)}: an unknown layout or a config.json of another model")
    missing, unexpected = policy.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match its config.json: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    if dtype is not None:
        policy = policy.to(dtype)
    elif tensors:
        policy = policy.to(next(iter(tensors.values())).dtype)
    return policy
