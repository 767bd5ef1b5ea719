"""Megatron-core learner backend: the same PPO step (``t1_actors.train.step`` + ``t1_actors.train.ppo``) on a megatron-core
``GPTModel`` with MoE, R3 through megatron's own ``RouterReplay``.

    learner = MegatronLearner(model_config, PPOConfig())           # tiny model: CPU works too
    learner.load_policy(policy)                                     # start from the torch policy's weights
    result = learner.step(batch)                                    # batch from collate(), with old values
    published = learner.publish(weights_dir)                        # HF Qwen3-MoE dir, like the torch backend

The GPTModel is built to be the policy's architecture parameter for parameter (RMSNorm, q/k norm, RoPE,
GQA, SwiGLU experts, softmax top-k router normalised over the selected experts), so routing records of
the torch/SGLang sampler replay into it and ``to_policy_state``/``from_policy_state`` convert weights.

CPU path (no CUDA, no Transformer Engine): megatron-core assumes a GPU in a few places. Only when CUDA
is absent, and only here, the backend (1) installs a CPU RNG tracker for the model-parallel RNG
(``tensor_parallel.random``), (2) maps ``torch.cuda.current_device()`` to ``"cpu"`` while its model
runs (the router moves its weights there), (3) sets ``moe_utils.te_general_gemm = None`` (the router
gemm then falls back to torch), and (4) passes an explicit causal mask (the default one is built on
"cuda"). It uses the allgather token dispatcher, tensor/pipeline/expert parallel size 1.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from t1_actors.backends.torch_learner import (
    CHECKPOINT_FORMAT,
    PublishedWeights,
    StepResult,
    TorchCritic,
    cursor_bytes,
    cursor_tensor,
    make_optimizer,
    sha256_file,
    version_dirname,
)
from t1_actors.policy.config import ModelConfig
from t1_actors.policy.model import MoEPolicy
from t1_actors.train import ppo
from t1_actors.train.batch import TrajectoryBatch
from t1_actors.train.step import Trainable, run_ppo_step

__all__ = ["MegatronLearner", "build_gpt_model", "to_policy_state", "from_policy_state"]

_CPU = not torch.cuda.is_available()


# ---------------------------------------------------------------------------------------- the CPU path

class _CpuRngTracker:
    """Named CPU RNG states with the interface of megatron's CUDA RNG tracker (dropout regions)."""

    def __init__(self):
        self.states_: dict[str, torch.Tensor] = {}

    def is_initialized(self) -> bool:
        return bool(self.states_)

    def reset(self) -> None:
        self.states_ = {}

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()


@contextlib.contextmanager
def _cpu_path():
    """While megatron code runs on CPU: ``torch.cuda.current_device()`` names the CPU."""
    if not _CPU:
        yield
        return
    original = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.current_device = original


def _prepare_megatron(seed: int) -> None:
    """Process group (1 rank of gloo if none), model-parallel state (all sizes 1), RNG, CPU patches."""
    from megatron.core import parallel_state  # noqa: PLC0415 - optional extra (megatron-core)
    from megatron.core.tensor_parallel import random as mp_random  # noqa: PLC0415 - optional extra (megatron-core)
    from megatron.core.transformer.moe import moe_utils  # noqa: PLC0415 - optional extra (megatron-core)

    if not dist.is_initialized():
        init = Path(tempfile.mkdtemp(prefix="t1-megatron-pg-")) / "init"
        dist.init_process_group("gloo" if _CPU else "nccl", init_method=f"file://{init}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    if _CPU:
        if not hasattr(moe_utils, "te_general_gemm"):
            moe_utils.te_general_gemm = None  # no Transformer Engine: the router gemm falls back to torch
        tracker = _CpuRngTracker()
        tracker.add(mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718)
        mp_random._CUDA_RNG_STATE_TRACKER = tracker
        mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    else:
        mp_random.model_parallel_cuda_manual_seed(seed)


# --------------------------------------------------------------------------------------------- the model

def build_gpt_model(config: ModelConfig, *, seed: int = 0, aux_loss_coef: float = 0.0):
    """A megatron-core GPTModel with the policy's architecture (see the module docstring)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": expected on CPU
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: PLC0415 - optional extra (megatron-core)
        from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: PLC0415 - optional extra (megatron-core)
        from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: PLC0415 - optional extra (megatron-core)
    _prepare_megatron(seed)
    torch.manual_seed(seed)
    tconfig = TransformerConfig(
        num_layers=config.num_layers, hidden_size=config.hidden_size, num_attention_heads=config.num_heads,
        num_query_groups=config.num_kv_heads, kv_channels=config.head_dim,
        ffn_hidden_size=config.moe_intermediate_size, moe_ffn_hidden_size=config.moe_intermediate_size,
        num_moe_experts=config.num_experts, moe_router_topk=config.top_k,
        # norm_topk_prob: softmax over the selected logits == softmax over all, renormalised over the top k
        moe_router_pre_softmax=not config.norm_topk_prob, moe_router_score_function="softmax",
        moe_token_dispatcher_type="allgather", moe_enable_routing_replay=True, moe_router_dtype="fp32",
        moe_router_load_balancing_type="aux_loss" if aux_loss_coef > 0 else "none", moe_aux_loss_coeff=aux_loss_coef,
        normalization="RMSNorm", layernorm_epsilon=config.rms_norm_eps, qk_layernorm=True,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, bf16=False, params_dtype=torch.float32,
        use_cpu_initialization=_CPU, init_method_std=0.02)
    spec = get_gpt_layer_local_spec(num_experts=config.num_experts, moe_grouped_gemm=False,
                                    qk_layernorm=True, normalization="RMSNorm")
    with _cpu_path():
        model = GPTModel(config=tconfig, transformer_layer_spec=spec, vocab_size=config.vocab_size,
                         max_sequence_length=config.max_position, position_embedding_type="rope",
                         rotary_base=int(config.rope_theta),
                         share_embeddings_and_output_weights=config.tie_word_embeddings)
    return model if _CPU else model.cuda()


def _qkv_rows(config: ModelConfig) -> tuple[int, int]:
    return config.num_heads // config.num_kv_heads * config.head_dim, config.head_dim


def to_policy_state(model, config: ModelConfig) -> dict[str, torch.Tensor]:
    """GPTModel parameters -> ``MoEPolicy.state_dict()`` names and layouts."""
    src = {k: v.detach() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    q_rows, kv_rows = _qkv_rows(config)
    out = {"model.embed_tokens.weight": src["embedding.word_embeddings.weight"],
           "model.norm.weight": src["decoder.final_layernorm.weight"],
           "lm_head.weight": src.get("output_layer.weight", src["embedding.word_embeddings.weight"])}
    for i in range(config.num_layers):
        m, p = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = src[m + "self_attention.linear_qkv.weight"].view(config.num_kv_heads, q_rows + 2 * kv_rows, -1)
        q, k, v = qkv.split([q_rows, kv_rows, kv_rows], dim=1)
        out.update({
            p + "input_layernorm.weight": src[m + "input_layernorm.weight"],
            p + "post_attention_layernorm.weight": src[m + "pre_mlp_layernorm.weight"],
            p + "self_attn.q_proj.weight": q.reshape(-1, q.shape[-1]),
            p + "self_attn.k_proj.weight": k.reshape(-1, k.shape[-1]),
            p + "self_attn.v_proj.weight": v.reshape(-1, v.shape[-1]),
            p + "self_attn.o_proj.weight": src[m + "self_attention.linear_proj.weight"],
            p + "self_attn.q_norm.weight": src[m + "self_attention.q_layernorm.weight"],
            p + "self_attn.k_norm.weight": src[m + "self_attention.k_layernorm.weight"],
            p + "mlp.gate.weight": src[m + "mlp.router.weight"],
            p + "mlp.experts.gate_up_proj": torch.stack(
                [src[f"{m}mlp.experts.local_experts.{e}.linear_fc1.weight"] for e in range(config.num_experts)]),
            p + "mlp.experts.down_proj": torch.stack(
                [src[f"{m}mlp.experts.local_experts.{e}.linear_fc2.weight"] for e in range(config.num_experts)]),
        })
    return {k: v.clone() for k, v in out.items()}


def from_policy_state(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """``MoEPolicy.state_dict()`` -> GPTModel parameter names and layouts (fused, group-interleaved QKV)."""
    q_rows, kv_rows = _qkv_rows(config)
    out = {"embedding.word_embeddings.weight": state["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": state["model.norm.weight"]}
    if not config.tie_word_embeddings:
        out["output_layer.weight"] = state["lm_head.weight"]
    for i in range(config.num_layers):
        m, p = f"decoder.layers.{i}.", f"model.layers.{i}."
        groups = config.num_kv_heads
        q = state[p + "self_attn.q_proj.weight"].view(groups, q_rows, -1)
        k = state[p + "self_attn.k_proj.weight"].view(groups, kv_rows, -1)
        v = state[p + "self_attn.v_proj.weight"].view(groups, kv_rows, -1)
        out.update({
            m + "input_layernorm.weight": state[p + "input_layernorm.weight"],
            m + "pre_mlp_layernorm.weight": state[p + "post_attention_layernorm.weight"],
            m + "self_attention.linear_qkv.weight": torch.cat([q, k, v], dim=1).reshape(-1, q.shape[-1]),
            m + "self_attention.linear_proj.weight": state[p + "self_attn.o_proj.weight"],
            m + "self_attention.q_layernorm.weight": state[p + "self_attn.q_norm.weight"],
            m + "self_attention.k_layernorm.weight": state[p + "self_attn.k_norm.weight"],
            m + "mlp.router.weight": state[p + "mlp.gate.weight"],
        })
        for e in range(config.num_experts):
            out[f"{m}mlp.experts.local_experts.{e}.linear_fc1.weight"] = state[p + "mlp.experts.gate_up_proj"][e]
            out[f"{m}mlp.experts.local_experts.{e}.linear_fc2.weight"] = state[p + "mlp.experts.down_proj"][e]
    return out


# --------------------------------------------------------------------------------------------- learner

class MegatronLearner:
    """PPO on a megatron-core GPTModel; R3 via ``RouterReplay`` (selection from the record, gate
    normalisation from live logits over the recorded experts: megatron gathers the live scores at the
    replayed indices, then softmaxes them)."""

    def __init__(self, config: ModelConfig, cfg: ppo.PPOConfig, *, critic: TorchCritic | None = None,
                 policy_version: int = 0, replay: bool = True, fidelity_metrics: bool = True, seed: int = 0,
                 group=None):
        if cfg.trains_part_of_policy:
            raise ValueError(f"[ppo] actor_params = {list(cfg.actor_params)}: the megatron learner trains the whole "
                             "policy only; use [learner] backend = 'torch' or actor_params = ['*']")
        self.config, self.cfg, self.critic = config, cfg, critic
        self.replay, self.fidelity_metrics, self.seed, self.group = replay, fidelity_metrics, seed, group
        self.model = build_gpt_model(config, seed=seed, aux_loss_coef=cfg.moe_aux_loss_coef)
        self.routers = [layer.mlp.router for layer in self.model.decoder.layers]
        self.replays = [router.router_replay for router in self.routers]
        from megatron.core.transformer.moe.router_replay import RouterReplay  # noqa: PLC0415 - optional extra (megatron-core)
        # this learner drives its own routers; megatron's global registry would mix models of a process
        for instance in self.replays:
            if instance in RouterReplay.global_router_replay_instances:
                RouterReplay.global_router_replay_instances.remove(instance)
        self.optimizer = make_optimizer(self.model, cfg.actor_lr, cfg, cfg.policy_optimizer)
        self.policy_version, self.step_count = policy_version, 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def load_policy(self, policy: MoEPolicy) -> None:
        """Take the torch policy's weights (the same architecture)."""
        if policy.config != self.config:
            raise ValueError("the policy's ModelConfig differs from this learner's; "
                             "build the learner with policy.config")
        state = from_policy_state(policy.state_dict(), self.config)
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise RuntimeError(f"weight conversion mismatch: missing {missing[:4]}, unexpected {unexpected[:4]}")

    def to_policy(self) -> MoEPolicy:
        policy = MoEPolicy(self.config)
        policy.load_state_dict(to_policy_state(self.model, self.config))
        return policy

    def forward(self, inputs: torch.Tensor, routing: torch.Tensor | None = None, capture: bool = False):
        """(logits [B,T,V] float32, routing [B,T,L,k] | None); ``routing`` given = R3 replay."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction  # noqa: PLC0415 - optional extra (megatron-core)

        batch, steps = inputs.shape
        positions = torch.arange(steps, device=inputs.device).expand(batch, steps)
        causal = torch.triu(torch.ones(steps, steps, dtype=torch.bool, device=inputs.device), 1)[None, None]
        used: list[torch.Tensor] = []
        hooks = [router.register_forward_hook(lambda _m, _i, out: used.append(out[1])) for router in self.routers]
        for layer, instance in enumerate(self.replays):
            instance.clear_indices()
            if routing is not None:  # megatron flattens tokens sequence-major: row = t * B + b
                instance.set_target_indices(routing[:, :, layer].transpose(0, 1).reshape(steps * batch, -1))
                instance.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            else:
                instance.set_router_replay_action(RouterReplayAction.RECORD)
        try:
            with _cpu_path():
                logits = self.model(inputs, positions, attention_mask=causal)
        finally:
            for hook in hooks:
                hook.remove()
            for instance in self.replays:
                instance.clear_router_replay_action()
                instance.clear_indices()
        selected = None
        if capture or routing is not None:
            # the experts each router really used (its routing map), back in [B, T, L, k], ascending ids
            per_layer = [m.view(steps, batch, -1).transpose(0, 1).nonzero()[:, 2].view(batch, steps, -1) for m in used]
            selected = torch.stack(per_layer, dim=2)
        return logits.float(), selected

    @property
    def trainable(self) -> Trainable:
        return Trainable(self.forward, [p for p in self.model.parameters() if p.requires_grad], self.optimizer)

    def step(self, batch: TrajectoryBatch) -> StepResult:
        batch = batch.to(self.device)
        if batch.old_values is None:
            if self.critic is None:
                raise ValueError("the batch carries no critic values and this learner has no critic")
            batch = batch.with_old_values(self.critic.values(batch))
        self.model.train()
        cfg = self.cfg.model_copy(update={"moe_aux_loss_coef": 0.0})  # megatron adds its aux loss itself
        metrics = run_ppo_step(self.trainable, batch, cfg,
                               critic=self.critic.trainable if self.critic is not None else None,
                               replay=self.replay, fidelity=self.fidelity_metrics,
                               seed=self.seed + self.step_count, group=self.group)
        self.step_count += 1
        self.policy_version += 1
        metrics["actor_lr"] = self.cfg.actor_lr
        return StepResult(self.step_count - 1, self.policy_version, batch.trials, metrics)

    def publish(self, directory: str | Path) -> PublishedWeights:
        """The policy as a HF Qwen3-MoE directory (what the samplers load), like the torch backend."""
        directory = Path(directory)
        final = directory / version_dirname(self.policy_version)
        tmp = directory / f".{version_dirname(self.policy_version)}.tmp-{os.getpid()}"
        self.to_policy().save(tmp)
        digest = sha256_file(tmp / "model.safetensors")
        tmp.rename(final)
        return PublishedWeights(self.policy_version, digest, str(final), max(self.step_count - 1, 0))

    def save_checkpoint(self, path: str | Path, cursor: bytes = b"") -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"format": CHECKPOINT_FORMAT, "model": self.model.state_dict(),
                 "optimizer": self.optimizer.state_dict(),
                 "critic": self.critic.state_dict() if self.critic is not None else None,
                 "policy_version": self.policy_version, "step_count": self.step_count, "seed": self.seed,
                 "cursor": cursor_tensor(cursor)}
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        tmp.replace(path)
        return path

    def load_checkpoint(self, path: str | Path) -> bytes:
        state = torch.load(Path(path), map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.critic is not None and state["critic"] is not None:
            self.critic.load_state_dict(state["critic"])
        self.policy_version, self.step_count = int(state["policy_version"]), int(state["step_count"])
        self.seed = int(state["seed"])
        return cursor_bytes(state["cursor"])
