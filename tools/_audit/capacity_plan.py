"""Capacity model of co-resident actor and critic (the paper's Proposition 7.1).

Per device, each model (actor, critic) keeps three kinds of state for every parameter it owns:
weights (b_w bytes), gradients (b_g) and Adam optimiser state (b_o = fp32 master copy + first and
second moments). Parameters split into *dense* ones (embeddings, attention, norms, routers, heads)
and *expert* ones (the SwiGLU experts of every MoE layer); the two are sharded differently.

Parallel plan on G devices (Megatron's layout): G = TP x PP x DP for the dense part; the experts
are split EP x ETP ways inside a pipeline stage, and each expert shard is replicated over the
expert-data-parallel group EDP = G / (EP x ETP x PP). With the distributed optimiser (ZeRO-1) the
optimiser state of a replicated tensor is sharded over its replicas, so

    expert optimiser bytes / device = X b_o / (EP ETP PP EDP) = X b_o / G

whatever the plan: the experts (and their Adam state) are spread over all G devices, and the
per-device share depends only on G. Without the distributed optimiser this holds only for plans
with EDP = 1 (experts sharded over every device, EP x ETP x PP = G).

Byte assumptions (configurable, ``ByteAssumptions``): bf16 weights (2 B), fp32 gradients (4 B,
Megatron's fp32 main grads), Adam fp32 master + 2 fp32 moments (12 B). Activations, KV caches,
communication buffers and fragmentation are NOT modelled: the figures are the floor that the
parameters alone need, the part that Proposition 7.1 is about.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from t1_actors.policy.config import ModelConfig

GIB = 1024**3

# A Qwen3-MoE-shaped model that reproduces the paper's totals (48 layers, 256 experts, top-8,
# 121.4 B parameters, 116.0 B of them in experts). The paper gives the totals, not the full shape:
# hidden 4096 x expert width 768 gives 48 x 256 x 3 x 4096 x 768 = 115.96 B expert parameters;
# GQA attention (64 query heads, 16 KV heads, head dim 128), a 163,840-token vocabulary and an
# untied LM head bring the dense part to 5.42 B, total 121.38 B.
PAPER_MODEL = ModelConfig(
    vocab_size=163_840, hidden_size=4096, num_layers=48, num_heads=64, num_kv_heads=16, head_dim=128,
    num_experts=256, top_k=8, moe_intermediate_size=768, tie_word_embeddings=False, max_position=131_072,
)
PAPER_TOTAL_PARAMS = 121.4e9
PAPER_EXPERT_PARAMS = 116.0e9


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of one model, split by how they are sharded."""

    dense: int
    expert: int

    @property
    def total(self) -> int:
        return self.dense + self.expert


def count_params(config: ModelConfig, *, head: str = "lm") -> ParamCounts:
    """Parameters of a Qwen3-MoE model of this shape (every layer MoE, no biases, q/k RMSNorm).

    ``head='lm'`` is the actor (LM head, tied to the embedding if the config says so);
    ``head='value'`` is the critic: the same trunk with a scalar value head (H weights + 1 bias).
    """
    if head not in ("lm", "value"):
        raise ValueError(f"head must be 'lm' (actor) or 'value' (critic), got {head!r}")
    h, hd = config.hidden_size, config.head_dim
    attention = h * config.num_heads * hd * 2 + h * config.num_kv_heads * hd * 2  # q, o + k, v
    norms = 2 * h + 2 * hd  # input / post-attention RMSNorm, q_norm, k_norm
    router = h * config.num_experts
    per_layer_dense = attention + norms + router
    embedding = config.vocab_size * h
    if head == "lm":
        out_head = 0 if config.tie_word_embeddings else config.vocab_size * h
    else:
        out_head = h + 1
    dense = config.num_layers * per_layer_dense + embedding + h + out_head  # + final norm
    expert = config.num_layers * config.num_experts * 3 * h * config.moe_intermediate_size
    return ParamCounts(dense=dense, expert=expert)


class ByteAssumptions(BaseModel):
    """Bytes per parameter kept on device for training."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: float = Field(2, gt=0, description="training copy of the weights (bf16)")
    grad: float = Field(4, gt=0, description="gradient accumulation buffer (fp32 main grads)")
    master: float = Field(4, ge=0, description="optimiser fp32 master weights")
    moments: float = Field(8, ge=0, description="Adam first + second moment (2 x fp32)")

    @property
    def optimizer(self) -> float:
        return self.master + self.moments


class ParallelPlan(BaseModel):
    """A TP/PP/DP plan on G devices with EP x ETP expert sharding inside each pipeline stage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: int = Field(gt=0)
    tp: int = Field(1, gt=0)
    pp: int = Field(1, gt=0)
    ep: int = Field(1, gt=0)
    etp: int = Field(1, gt=0)
    distributed_optimizer: bool = True

    @model_validator(mode="after")
    def _check(self) -> ParallelPlan:
        if self.devices % (self.tp * self.pp):
            raise ValueError(f"devices ({self.devices}) must be a multiple of TP x PP ({self.tp} x {self.pp}); "
                             "pick TP and PP that divide the device count")
        if (self.tp * self.dp) % (self.ep * self.etp):
            raise ValueError(f"EP x ETP ({self.ep} x {self.etp}) must divide TP x DP ({self.tp} x {self.dp}) "
                             "(experts are laid out inside one pipeline stage); lower EP or ETP")
        return self

    @property
    def dp(self) -> int:
        return self.devices // (self.tp * self.pp)

    @property
    def edp(self) -> int:
        """Expert-data-parallel size: replicas of each expert shard."""
        return self.devices // (self.ep * self.etp * self.pp)

    def label(self) -> str:
        return f"TP{self.tp} PP{self.pp} DP{self.dp} EP{self.ep} ETP{self.etp} EDP{self.edp}"


@dataclass(frozen=True)
class DeviceBytes:
    """Bytes of one model's training state on one device."""

    dense_weights: float
    dense_grads: float
    dense_optimizer: float
    expert_weights: float
    expert_grads: float
    expert_optimizer: float

    @property
    def total(self) -> float:
        return sum(asdict(self).values())

    def __add__(self, other: DeviceBytes) -> DeviceBytes:
        a, b = asdict(self), asdict(other)
        return DeviceBytes(**{k: a[k] + b[k] for k in a})


def per_device_state(params: ParamCounts, plan: ParallelPlan, nbytes: ByteAssumptions) -> DeviceBytes:
    """Proposition 7.1, one model's share on one device:

        M = D (b_w + b_g) / (TP PP) + D b_o / (TP PP [DP])
          + X (b_w + b_g) / (EP ETP PP) + X b_o / (EP ETP PP [EDP])

    D dense and X expert parameters; the bracketed factors apply with the distributed optimiser.
    Since EP ETP PP EDP = G, the last term is X b_o / G: it depends only on the device count.
    Dense parameters are taken as spread evenly over pipeline stages (embedding and head sit on
    the first and last stage in practice, a difference of at most V H parameters).
    """
    dense_shards = plan.tp * plan.pp
    expert_shards = plan.ep * plan.etp * plan.pp
    dense_opt_shards = dense_shards * (plan.dp if plan.distributed_optimizer else 1)
    expert_opt_shards = expert_shards * (plan.edp if plan.distributed_optimizer else 1)
    return DeviceBytes(
        dense_weights=params.dense * nbytes.weight / dense_shards,
        dense_grads=params.dense * nbytes.grad / dense_shards,
        dense_optimizer=params.dense * nbytes.optimizer / dense_opt_shards,
        expert_weights=params.expert * nbytes.weight / expert_shards,
        expert_grads=params.expert * nbytes.grad / expert_shards,
        expert_optimizer=params.expert * nbytes.optimizer / expert_opt_shards,
    )


def valid_plans(devices: int, *, distributed_optimizer: bool = True, max_tp: int = 8) -> list[ParallelPlan]:
    """Every valid plan on ``devices``: TP and ETP up to ``max_tp``, any PP and EP that divide."""
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    plans = []
    for tp in (d for d in divisors if d <= max_tp):
        for pp in (d for d in divisors if (devices // tp) % d == 0):
            for ep in divisors:
                for etp in (d for d in divisors if d <= max_tp):
                    try:
                        plans.append(ParallelPlan(devices=devices, tp=tp, pp=pp, ep=ep, etp=etp,
                                                  distributed_optimizer=distributed_optimizer))
                    except ValueError:
                        continue
    return plans


@dataclass(frozen=True)
class CapacityReport:
    """Per-device memory of co-resident actor and critic under one plan."""

    plan: ParallelPlan
    bytes: ByteAssumptions
    actor_params: ParamCounts
    critic_params: ParamCounts | None
    actor: DeviceBytes
    critic: DeviceBytes | None
    device_memory_gib: float | None

    @property
    def total(self) -> DeviceBytes:
        return self.actor + self.critic if self.critic is not None else self.actor

    def to_json(self) -> dict:
        def gib(d: DeviceBytes | None) -> dict | None:
            if d is None:
                return None
            out = {k: v / GIB for k, v in asdict(d).items()}
            out["total"] = d.total / GIB
            return out

        total = self.total.total
        return {
            "plan": {**self.plan.model_dump(), "dp": self.plan.dp, "edp": self.plan.edp, "label": self.plan.label()},
            "bytes_per_param": {**self.bytes.model_dump(), "optimizer": self.bytes.optimizer},
            "actor_params": {"dense": self.actor_params.dense, "expert": self.actor_params.expert,
                             "total": self.actor_params.total},
            "critic_params": None if self.critic_params is None else {
                "dense": self.critic_params.dense, "expert": self.critic_params.expert,
                "total": self.critic_params.total},
            "per_device_gib": {"actor": gib(self.actor), "critic": gib(self.critic), "total": gib(self.total)},
            "expert_optimizer_gib_per_device": self.total.expert_optimizer / GIB,
            "device_memory_gib": self.device_memory_gib,
            "headroom_gib": None if self.device_memory_gib is None else self.device_memory_gib - total / GIB,
            "fits": None if self.device_memory_gib is None else total / GIB <= self.device_memory_gib,
        }


def capacity(actor: ParamCounts, plan: ParallelPlan, *, critic: ParamCounts | None = None,
             nbytes: ByteAssumptions | None = None, device_memory_gib: float | None = None) -> CapacityReport:
    """Per-device training state of the actor and (if given) a co-resident critic under ``plan``."""
    nbytes = nbytes or ByteAssumptions()
    return CapacityReport(
        plan=plan, bytes=nbytes, actor_params=actor, critic_params=critic,
        actor=per_device_state(actor, plan, nbytes),
        critic=None if critic is None else per_device_state(critic, plan, nbytes),
        device_memory_gib=device_memory_gib,
    )


def expert_optimizer_by_plan(actor: ParamCounts, devices: int, *, critic: ParamCounts | None = None,
                             nbytes: ByteAssumptions | None = None,
                             distributed_optimizer: bool = True) -> dict[str, float]:
    """Expert optimiser GiB per device for every valid plan on ``devices`` (the invariance check)."""
    out = {}
    for plan in valid_plans(devices, distributed_optimizer=distributed_optimizer):
        report = capacity(actor, plan, critic=critic, nbytes=nbytes)
        out[plan.label()] = report.total.expert_optimizer / GIB
    return out


def from_totals(total: float, expert: float) -> ParamCounts:
    """Parameter split given as totals (when the full shape is unknown)."""
    if not 0 <= expert <= total:
        raise ValueError(f"expert parameters ({expert:g}) must lie between 0 and the total ({total:g})")
    return ParamCounts(dense=int(round(total - expert)), expert=int(round(expert)))
