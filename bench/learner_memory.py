"""Learner and critic memory against a chunk's length: peak RSS at 4k, 16k and 32k tokens.

    python bench/learner_memory.py [--sizes 4096 16384 32768] [--budget 4096] [--one-pass]

Each (engine, size) runs in a fresh process, its peak RSS reset just before the step: a small model (configs/tiny.toml's
[model] shape), one trajectory of ``size`` tokens (alternating 37-token sampled and tool regions, a random
routing record for R3, sampler logprobs and old values near the model's scale), and

- learner: one ``TorchLearner.step`` (PPO with R3 replay and the no-replay fidelity pass, AdamW),
- critic: ``TorchCritic.values`` then ``update`` (the critic actor's valuing and its clipped value update),

both with ``max_tokens_per_microbatch = --budget``, so the smallest size is one micro-batch. The children run
with glibc's mmap threshold fixed at 64 KiB (``measure``; ``--glibc-default`` leaves it, and RSS then counts
heap fragmentation as growth). The K/V the
segments may keep: ``kv_allowed_bytes`` = layers x 2 x kv_dim x 4 B x the positions before the last segment,
twice (the K/V and their gradients; ``kv_only_bytes`` once, the issue's formula). Last line: one JSON object
with the peak RSS of each size (MB), ``learner_peak_rss_growth`` and ``critic_peak_rss_growth`` = (peak RSS at
the largest size - kv_allowed_bytes) / peak RSS at one micro-batch (goal <= 1.25), the same with the K/V counted
once (``*_kv_once``), and seconds per step. ``--one-pass``: also each engine at the largest size with no budget
(today's single forward/backward), ``*_one_pass_peak_rss_mb``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(kind: str, tokens: int, budget: int | None, model: dict | None = None) -> dict:
    """One engine on one trajectory of ``tokens`` tokens in this process; peak RSS and the K/V allowance.
    ``model``: ModelConfig fields (default: the tiny campaign's shape)."""
    import torch

    from t1_actors.backends.torch_critic import TorchCritic
    from t1_actors.backends.torch_learner import TorchLearner
    from t1_actors.policy.config import ModelConfig
    from t1_actors.policy.model import MoEPolicy
    from t1_actors.policy.value import ValueModel
    from t1_actors.train.batch import TrajectoryBatch
    from t1_actors.train.ppo import PPOConfig
    from t1_actors.train.segments import KVLayout, plan

    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = ModelConfig(**{"max_position": max(tokens, 2048), **(model or {})})
    gen = torch.Generator().manual_seed(0)
    loss_mask = (torch.arange(tokens) // 37) % 2 == 1
    routing = torch.rand(1, tokens - 1, config.num_layers, config.num_experts, generator=gen).argsort(-1)
    batch = TrajectoryBatch(
        token_ids=torch.randint(0, config.vocab_size, (1, tokens), generator=gen),
        valid=torch.ones(1, tokens, dtype=torch.bool), loss_mask=loss_mask[None],
        sampler_logprobs=(-6.9 + 0.3 * torch.randn(1, tokens, generator=gen)) * loss_mask,
        rewards=torch.tensor([0.5]), routing=routing[..., :config.top_k].contiguous(),
        old_values=0.1 * torch.randn(1, tokens, generator=gen), trial_ids=("t0",))
    cfg = PPOConfig()
    if kind == "learner":
        model = MoEPolicy(config)
        engine = TorchLearner(model, cfg, max_tokens_per_microbatch=budget)
    else:
        model = ValueModel(config)
        engine = TorchCritic(model, cfg, max_tokens_per_microbatch=budget)
    _reset_peak_rss()
    rss_before = _rss_bytes()
    started = time.perf_counter()
    if kind == "learner":
        engine.step(batch)
    else:
        engine.update(batch.with_old_values(engine.values(batch)))
    seconds = time.perf_counter() - started
    layout = KVLayout.of(config, model.model.embed_tokens.weight)
    micro = plan([tokens - 1], tokens - 1, budget)[0]
    earlier = micro.segments[-1][0]  # positions before the last segment: the K/V a segment may find cached
    return {"kind": kind, "tokens": tokens, "budget": budget, "segments": len(micro.segments),
            "peak_rss_bytes": _peak_rss_bytes(),
            "rss_before_step_bytes": rss_before, "kv_only_bytes": layout.bytes_per_position() * earlier,
            "kv_allowed_bytes": 2 * layout.bytes_per_position() * earlier, "seconds": round(seconds, 2)}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> None:
    """Start the peak (VmHWM) afresh at the current RSS, so that it measures the step alone. Without it the peak
    is the process's, and a transient before the step counts: on a busy machine the libraries' file pages
    touched at import were resident then and reclaimed since, and the step seemed to grow by ~600 MB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss_bytes() -> int:
    """VmHWM: the peak RSS since ``_reset_peak_rss``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(kind: str, tokens: int, budget: int | None, fixed_mmap_threshold: bool = True,
            model: dict | None = None) -> dict:
    """One child process. ``fixed_mmap_threshold``: glibc serves blocks >= 64 KiB with mmap and unmaps them on
    free. By default its threshold rises to the largest block freed so far (up to 32 MiB), after which a
    segment's activations come from the heap, and segments of several sizes fragment it: RSS then measures
    the allocator's holes (8k tokens, critic: +224 MB over 4k with the default, +68 MB with 64 KiB)."""
    args = [sys.executable, str(Path(__file__).resolve()), "--child", kind, str(tokens), str(budget or 0),
            "--model", json.dumps(model or {})]
    env = dict(os.environ)
    if fixed_mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} at {tokens} tokens failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 32768])
    parser.add_argument("--budget", type=int, default=4096, help="max_tokens_per_microbatch (the smallest size's)")
    parser.add_argument("--one-pass", action="store_true", help="also the largest size with no budget (before)")
    parser.add_argument("--glibc-default", action="store_true",
                        help="leave glibc's dynamic mmap threshold (see measure()): fragmentation counted as growth")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "TOKENS", "BUDGET"), help=argparse.SUPPRESS)
    parser.add_argument("--model", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, tokens, budget = args.child
        print(json.dumps(child(kind, int(tokens), int(budget) or None, json.loads(args.model))))
        return
    mb = 1 / 2**20
    summary: dict = {"budget": args.budget, "sizes": args.sizes, "goal": 1.25,
                     "malloc_mmap_threshold": "glibc default" if args.glibc_default else 64 * 1024}
    for kind in ("learner", "critic"):
        runs = [measure(kind, tokens, args.budget, not args.glibc_default) for tokens in args.sizes]
        for run in runs:
            print(f"{kind} {run['tokens']:>6} tokens, {run['segments']} segments: peak RSS "
                  f"{run['peak_rss_bytes'] * mb:.0f} MB (before the step {run['rss_before_step_bytes'] * mb:.0f}), "
                  f"K/V allowed {run['kv_allowed_bytes'] * mb:.0f} MB, {run['seconds']} s", flush=True)
        first, last = runs[0], runs[-1]
        summary[f"{kind}_peak_rss_mb"] = {r["tokens"]: round(r["peak_rss_bytes"] * mb, 1) for r in runs}
        summary[f"{kind}_kv_allowed_mb"] = {r["tokens"]: round(r["kv_allowed_bytes"] * mb, 1) for r in runs}
        summary[f"{kind}_seconds"] = {r["tokens"]: r["seconds"] for r in runs}
        summary[f"{kind}_peak_rss_growth"] = round(
            (last["peak_rss_bytes"] - last["kv_allowed_bytes"]) / first["peak_rss_bytes"], 3)
        summary[f"{kind}_peak_rss_growth_kv_once"] = round(
            (last["peak_rss_bytes"] - last["kv_only_bytes"]) / first["peak_rss_bytes"], 3)
        if args.one_pass:
            whole = measure(kind, args.sizes[-1], None, not args.glibc_default)
            print(f"{kind} {whole['tokens']:>6} tokens in one pass: peak RSS {whole['peak_rss_bytes'] * mb:.0f} MB, "
                  f"{whole['seconds']} s", flush=True)
            summary[f"{kind}_one_pass_peak_rss_mb"] = round(whole["peak_rss_bytes"] * mb, 1)
            summary[f"{kind}_one_pass_seconds"] = whole["seconds"]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
