"""`t1-audit capacity`: per-device memory of co-resident actor and critic (Proposition 7.1)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from t1_actors.policy._hf import config_from_hf
from t1_actors.policy.config import ModelConfig
from tools._audit import capacity_plan as cap
from tools._output import console, fail, print_json, styled


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capacity", help="per-device memory of weights, grads and optimiser state (Prop. 7.1)",
                       description=__doc__)
    p.add_argument("--model", default="paper",
                   help="'paper' (48 layers, 256 experts, top-8, 121.4 B), 'tiny' (the embedded default) "
                        "or a config.json with ModelConfig fields")
    p.add_argument("--total-params", type=float, help="take the parameter totals as inputs instead of a shape")
    p.add_argument("--expert-params", type=float, help="expert parameters (with --total-params)")
    p.add_argument("--devices", "-G", type=int, default=64)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--ep", type=int, default=None, help="expert parallel size (default: G / PP, experts on every device)")
    p.add_argument("--etp", type=int, default=1)
    p.add_argument("--no-distributed-optimizer", action="store_true",
                   help="optimiser state replicated over data-parallel ranks (no ZeRO-1)")
    p.add_argument("--no-critic", action="store_true", help="actor only (no co-resident critic)")
    p.add_argument("--weight-bytes", type=float, default=2.0)
    p.add_argument("--grad-bytes", type=float, default=4.0)
    p.add_argument("--master-bytes", type=float, default=4.0)
    p.add_argument("--moment-bytes", type=float, default=8.0, help="both Adam moments together")
    p.add_argument("--device-memory-gib", type=float, default=None, help="e.g. 80 (H100) or 141 (H200)")
    p.add_argument("--json", action="store_true")


def _model_config(spec: str) -> ModelConfig:
    if spec == "paper":
        return cap.PAPER_MODEL
    if spec == "tiny":
        return ModelConfig()
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--model {spec!r}: not 'paper', 'tiny' or an existing config.json")
    raw = json.loads(path.read_text())
    if "num_hidden_layers" in raw or "model_type" in raw:  # a Hugging Face (Qwen3-MoE) config.json

        return config_from_hf(raw)
    unknown = set(raw) - set(ModelConfig.model_fields)
    if unknown:
        raise ValueError(f"--model {spec}: unknown fields {sorted(unknown)}; give ModelConfig fields "
                         "or a Hugging Face Qwen3-MoE config.json")
    return ModelConfig(**raw)


def run(args: argparse.Namespace) -> int:
    try:
        if args.total_params is not None or args.expert_params is not None:
            if args.total_params is None or args.expert_params is None:
                return fail("--total-params and --expert-params go together")
            actor = cap.from_totals(args.total_params, args.expert_params)
            critic = None if args.no_critic else actor  # critic shares the actor's shape
            source = f"totals {args.total_params:.4g} / {args.expert_params:.4g}"
        else:
            config = _model_config(args.model)
            actor = cap.count_params(config, head="lm")
            critic = None if args.no_critic else cap.count_params(config, head="value")
            source = f"model {args.model}"
        ep = args.ep if args.ep is not None else args.devices // args.pp
        plan = cap.ParallelPlan(devices=args.devices, tp=args.tp, pp=args.pp, ep=ep, etp=args.etp,
                                distributed_optimizer=not args.no_distributed_optimizer)
        nbytes = cap.ByteAssumptions(weight=args.weight_bytes, grad=args.grad_bytes,
                                     master=args.master_bytes, moments=args.moment_bytes)
    except ValueError as exc:
        return fail(str(exc))
    report = cap.capacity(actor, plan, critic=critic, nbytes=nbytes, device_memory_gib=args.device_memory_gib)
    sweep = cap.expert_optimizer_by_plan(actor, args.devices, critic=critic, nbytes=nbytes,
                                         distributed_optimizer=plan.distributed_optimizer)
    values = list(sweep.values())
    invariant = bool(values) and max(values) - min(values) <= 1e-9 * max(values)
    out = report.to_json()
    out["source"] = source
    out["expert_optimizer_only_depends_on_G"] = invariant
    out["expert_optimizer_gib_by_plan"] = {"plans": len(sweep), "min": min(values), "max": max(values)}
    plans = cap.valid_plans(args.devices, distributed_optimizer=plan.distributed_optimizer)
    picks = plans[:: max(1, len(plans) // 8)][:8]
    out["plan_samples"] = [
        {"label": p.label(), "expert_optimizer_gib": r.total.expert_optimizer / cap.GIB,
         "expert_weights_grads_gib": (r.total.expert_weights + r.total.expert_grads) / cap.GIB,
         "total_gib": r.total.total / cap.GIB}
        for p in picks for r in [cap.capacity(actor, p, critic=critic, nbytes=nbytes)]]
    expert_params = actor.expert + (critic.expert if critic else 0)
    out["expert_optimizer_gib_formula"] = expert_params * nbytes.optimizer / args.devices / cap.GIB
    if args.json:
        print_json(out)
        return 0
    _render(out)
    return 0


def _render(out: dict) -> None:
    c = console()
    ap = out["actor_params"]
    c.print(styled(("Capacity (Prop. 7.1)", "bold"), f" {out['source']}: actor {_count(ap['total'])} parameters "
                   f"({_count(ap['expert'])} expert, {_count(ap['dense'])} dense); plan {out['plan']['label']} "
                   f"on G={out['plan']['devices']}"))
    b = out["bytes_per_param"]
    c.print(f"bytes/param: weights {b['weight']:g}, grads {b['grad']:g}, optimiser {b['optimizer']:g} "
            f"(master {b['master']:g} + moments {b['moments']:g}); distributed optimiser: "
            f"{out['plan']['distributed_optimizer']}; activations not modelled")
    table = Table("GiB / device", "actor", "critic", "total")
    rows = ["dense_weights", "dense_grads", "dense_optimizer", "expert_weights", "expert_grads",
            "expert_optimizer", "total"]
    per = out["per_device_gib"]
    for row in rows:
        cells = [f"{per[m][row]:.2f}" if per[m] else "-" for m in ("actor", "critic", "total")]
        table.add_row(row.replace("_", " "), *cells)
    c.print(table)
    sweep = out["expert_optimizer_gib_by_plan"]
    c.print(f"expert optimiser state per device over {sweep['plans']} valid plans on G={out['plan']['devices']}: "
            f"{sweep['min']:.3f}..{sweep['max']:.3f} GiB (X b_o / G = {out['expert_optimizer_gib_formula']:.3f}); "
            f"depends only on G: {out['expert_optimizer_only_depends_on_G']}")
    samples = Table("plan (same G)", "expert optimiser GiB", "expert weights+grads GiB", "total GiB")
    for sample in out["plan_samples"]:
        samples.add_row(sample["label"], f"{sample['expert_optimizer_gib']:.3f}",
                        f"{sample['expert_weights_grads_gib']:.2f}", f"{sample['total_gib']:.2f}")
    c.print(samples)
    if out["device_memory_gib"] is not None:
        verdict = "fits" if out["fits"] else "does NOT fit"
        c.print(f"device memory {out['device_memory_gib']:g} GiB: {verdict} (headroom {out['headroom_gib']:.1f} GiB "
                "before activations)")


def _count(n: float) -> str:
    return f"{n / 1e9:.1f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"
