"""Sampler throughput with routing capture vs without: same model, same prompts, same seeds, one run.

    python bench/sampler.py [--batch 32] [--new-tokens 64] [--repeats 5] [--threads 1]

Also: a multi-turn rollout (each turn's prompt = the conversation so far + a tool response) with the
per-session prefix cache vs without (``prefix_cache_speedup``, generated tokens per CPU second).

Runs alternate (capture, no capture, capture, ...) so that machine noise hits both alike; each side's figure is its
best run, timed in process CPU seconds (robust on a shared machine; with one torch thread CPU time is the compute
time) and, for reference, in wall seconds. Prints a table, then one JSON line with ``capture_overhead`` (1 -
with/without) and ``routing_bytes_per_token`` (layers * k * bytes per id); and t1's sampler against transformers'
``generate`` on the same weights (``bench/lib/hf_generate.py``): ``vs_hf_generate_b1`` / ``_b32``, tokens per wall
second of t1 over transformers' at batch 1 and 32 (the lower of greedy and T = 1, over both model shapes; goals >= 1
and >= 2); and against a real SGLang server on the CPU (``bench/lib/sglang_side.py``, the SGLang venv of
``.ci/setup-sglang``): ``vs_sglang_cpu``, t1 over SGLang at batch 32 with routing capture on both (the lower over
both shapes; ``null`` with the reason when the venv is absent); and against a real vLLM server on the CPU
(``bench/lib/vllm_side.py``, the optional vLLM venv of ``.ci/setup-vllm``): ``vs_vllm_cpu``, t1 over vLLM at batch
32 with routing capture off on both (vLLM's CPU build cannot capture), the lower over the shapes vLLM served
(``vs_vllm_cpu_shapes``; vLLM's CPU attention has no kernel for the tiny shape's 40-wide heads, so that shape
reports ``absent`` with the server's error); ``null`` with the reason when the venv is absent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from schemas import routing_dtype
from t1_actors.policy import ModelConfig, MoEPolicy
from t1_actors.policy.sampling import ContinuousBatcher, SamplingParams, generate
from t1_actors.policy.tokenizer import default_tokenizer, generic_shell_chats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.lib import sglang_side, vllm_side
from bench.lib.hf_generate import compare


def _prompts(batch: int) -> list[list[int]]:
    tokenizer = default_tokenizer()
    chats = list(generic_shell_chats(batch, seed=1))
    # a prompt is a chat cut at a random point: lengths differ, as in a real rollout batch
    rng = np.random.default_rng(0)
    out = []
    for chat in chats:
        ids = tokenizer.encode(chat)
        out.append(ids[: int(rng.integers(len(ids) // 3, len(ids) + 1))])
    return out


def _run(model, prompts, params, capture: bool) -> tuple[float, float, int, list]:
    wall, cpu = time.perf_counter(), time.process_time()
    generations = generate(model, prompts, params, capture_routing=capture, max_batch=len(prompts))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu, wall, sum(len(g.output_ids) for g in generations), generations


def _multi_turn(model, prompts, params, prefix_cache_tokens: int, turns: int = 3) -> tuple[float, int]:
    """Every prompt is a session of ``turns`` turns; tool responses are fixed token runs."""
    batcher = ContinuousBatcher(model, max_batch=len(prompts), prefix_cache_tokens=prefix_cache_tokens)
    conversations = [list(p) for p in prompts]
    cpu, tokens = time.process_time(), 0
    for _ in range(turns):
        keys = [batcher.add(c, sp, session=str(i)) for i, (c, sp) in enumerate(zip(conversations, params))]
        results = {}
        while batcher.busy:
            results.update(batcher.step())
        for i, key in enumerate(keys):
            output = results[key].output_ids.tolist()
            tokens += len(output)
            conversations[i] += output + [7, 8, 9, 10, 11, 12, 13, 14]  # the tool's answer
    return time.process_time() - cpu, tokens


def _print_engine_rows(engine: str, key: str, results: dict[str, dict]) -> None:
    """One line per shape and row of a serving engine's comparison (``key``: its prefix in the row's figures)."""
    for shape, result in results.items():
        if "absent" in result:
            print(f"vs {engine}, {shape}: not measured: {result['absent'].splitlines()[0]}")
        for row, figures in result.get("rows", {}).items():
            print(f"vs {engine} {result[key + '_version']} (CPU), {shape} ({result['parameters_m']} M), {row}: t1 "
                  f"{figures['t1_tok_s']} tok/s, {engine} {figures[key + '_tok_s']} (on "
                  f"{figures[key + '_cores_used']} cores) -> x{figures['ratio']}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--vs-hf", nargs="*", default=["tiny", "100m"], choices=["tiny", "100m"],
                        help="model shapes to compare against transformers' generate (none: skip)")
    parser.add_argument("--hf-repeats", type=int, default=2)
    parser.add_argument("--vs-sglang", nargs="*", default=["tiny", "100m"], choices=["tiny", "100m"],
                        help="model shapes to compare against a real SGLang server (none: skip)")
    parser.add_argument("--vs-vllm", nargs="*", default=["tiny", "100m"], choices=["tiny", "100m"],
                        help="model shapes to compare against a real vLLM server (none: skip)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = ModelConfig()
    model = MoEPolicy(config).eval()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = model.to(dtype)
    prompts = _prompts(args.batch)
    params = [SamplingParams(max_new_tokens=args.new_tokens, seed=i) for i in range(args.batch)]
    _run(model, prompts[:4], params[:4], True)  # warm-up
    best = {True: float("inf"), False: float("inf")}
    best_wall = dict(best)
    tokens = {}
    outputs = {}
    for _ in range(args.repeats):
        for capture in (True, False):
            cpu, wall, n, generations = _run(model, prompts, params, capture)
            best[capture] = min(best[capture], cpu)
            best_wall[capture] = min(best_wall[capture], wall)
            tokens[capture] = n
            outputs[capture] = [g.output_ids for g in generations]
    multi = {True: float("inf"), False: float("inf")}
    turn_params = [p.model_copy(update={"max_new_tokens": 16}) for p in params]
    for _ in range(max(1, args.repeats // 2)):
        for cached in (True, False):
            cpu, multi_tokens = _multi_turn(model, prompts, turn_params, 1 << 20 if cached else 0)
            multi[cached] = min(multi[cached], cpu)
    prefix_speedup = multi[False] / multi[True]
    same = all(np.array_equal(a, b) for a, b in zip(outputs[True], outputs[False]))
    with_capture = tokens[True] / best[True]
    without = tokens[False] / best[False]
    overhead = 1.0 - with_capture / without
    bytes_per_token = config.num_layers * config.top_k * routing_dtype(config.num_experts).itemsize
    prompt_tokens = sum(len(p) for p in prompts)
    print(f"tiny MoE ({model.num_parameters() / 1e6:.2f} M params), batch {args.batch}, "
          f"{prompt_tokens} prompt tokens, {args.new_tokens} new tokens each, {args.threads} thread(s), {args.dtype}")
    print(f"{'':>18} {'tok/cpu-s':>10} {'best cpu s':>10} {'tok/wall-s':>10}")
    for label, capture in (("routing capture", True), ("no capture", False)):
        print(f"{label:>18} {tokens[capture] / best[capture]:>10.1f} {best[capture]:>10.3f} "
              f"{tokens[capture] / best_wall[capture]:>10.1f}")
    print(f"same sampled ids with and without capture: {same}")
    print(f"3-turn rollouts ({multi_tokens} generated tokens): prefix cache {multi[True]:.3f} cpu s, "
          f"without {multi[False]:.3f} cpu s -> x{prefix_speedup:.2f}")
    print(f"routing record: {config.num_layers} layers x k={config.top_k} x "
          f"{routing_dtype(config.num_experts).itemsize} B = {bytes_per_token} B per token")
    vs_hf = {shape: compare(shape, prompts, new_tokens=args.new_tokens, repeats=args.hf_repeats, dtype=dtype)
             for shape in args.vs_hf}
    for shape, result in vs_hf.items():
        for row, figures in result.get("rows", {}).items():
            print(f"vs transformers generate, {shape} ({result['parameters_m']} M), {row}: t1 {figures['t1_tok_s']} "
                  f"tok/s ({figures['t1_capture_tok_s']} with routing capture), transformers {figures['hf_tok_s']} "
                  f"-> x{figures['ratio']}")
    vs_sglang = {shape: sglang_side.compare(shape, prompts, new_tokens=args.new_tokens, repeats=args.hf_repeats)
                 for shape in args.vs_sglang}
    _print_engine_rows("SGLang", "sglang", vs_sglang)
    vs_vllm = {shape: vllm_side.compare(shape, prompts, new_tokens=args.new_tokens, repeats=args.hf_repeats)
               for shape in args.vs_vllm}
    _print_engine_rows("vLLM", "vllm", vs_vllm)
    measured = [r["vs_sglang_cpu"] for r in vs_sglang.values() if "vs_sglang_cpu" in r]
    absent = "; ".join(sorted({r["absent"] for r in vs_sglang.values() if "absent" in r})) or None
    vllm_measured = {shape: r["vs_vllm_cpu"] for shape, r in vs_vllm.items() if "vs_vllm_cpu" in r}
    vllm_absent = ("; ".join(sorted({r["absent"] for r in vs_vllm.values() if "absent" in r}))
                   or ("not run (--vs-vllm with no shape)" if not vs_vllm else None))
    ratios = {key: min(r[key] for r in vs_hf.values() if key in r)
              for key in ("vs_hf_generate_b1", "vs_hf_generate_b32") if any(key in r for r in vs_hf.values())}
    print(json.dumps({"capture_overhead": round(overhead, 4), "routing_bytes_per_token": bytes_per_token,
                      **{"vs_hf_generate_b1": None, "vs_hf_generate_b32": None}, **ratios, "vs_hf": vs_hf,
                      "vs_sglang_cpu": min(measured) if measured else None, "vs_sglang": vs_sglang,
                      "vs_vllm_cpu": min(vllm_measured.values()) if vllm_measured else None,
                      "vs_vllm_cpu_shapes": sorted(vllm_measured), "vs_vllm": vs_vllm,
                      "serving_engines_absent": {"sglang": absent if not measured else None,
                                                 "vllm": vllm_absent if not vllm_measured else None},
                      "tokens_per_s_with_capture": round(with_capture, 1),
                      "tokens_per_s_without_capture": round(without, 1), "timing": "process cpu seconds, best of repeats",
                      "batch": args.batch,
                      "new_tokens": args.new_tokens, "same_outputs": same,
                      "prefix_cache_speedup": round(prefix_speedup, 2)}))


if __name__ == "__main__":
    main()
