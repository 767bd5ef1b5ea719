"""t1's torch sampler against a real SGLang server on the CPU, on the same checkpoint and prompts.

One checkpoint (``MoEPolicy.save``, the HF layout SGLang loads) served by ``SGLangServer`` (the launcher the
campaign uses: CPU engine, routed-experts capture available) and loaded by t1 in this process. Each side
gets the same prompts, the same number of new tokens with EOS ignored (SGLang: ``ignore_eos``; t1: no stop
ids), T = 1, and the batch as one request (SGLang's ``/generate`` with a list of ``input_ids``: the server
batches it; t1: ``generate`` with ``max_batch`` = the batch). Rows with routing capture on both sides (what
a campaign runs) and off. Runs alternate (t1, SGLang, t1, ...) and each keeps its best wall time. SGLang's
time includes its HTTP round trip, as a user's sampler pays it. The server's CPU use (its process tree,
``cpu.tree_cpu``) is reported beside its figures: its CPU engine picks its own thread count, so the
cores it used are stated rather than assumed equal to t1's.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from bench.lib.cpu import tree_cpu
from bench.lib.hf_generate import SHAPES
from t1_actors.policy import MoEPolicy
from t1_actors.policy.sampling import SamplingParams, generate


def _t1(policy, prompts, new_tokens: int, capture: bool) -> tuple[float, int]:
    params = [SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i) for i in range(len(prompts))]
    t0 = time.perf_counter()
    out = generate(policy, prompts, params, capture_routing=capture, max_batch=len(prompts))
    return time.perf_counter() - t0, sum(len(g.output_ids) for g in out)


def _sglang(client, prompts, new_tokens: int, capture: bool) -> tuple[float, int]:
    body = {"input_ids": prompts, "return_routed_experts": capture,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 1.0, "top_p": 1.0, "ignore_eos": True}}
    t0 = time.perf_counter()
    reply = client.post("/generate", json=body).raise_for_status().json()
    seconds = time.perf_counter() - t0
    return seconds, sum(len(r["output_ids"]) for r in (reply if isinstance(reply, list) else [reply]))


def compare(shape: str, prompts: list[list[int]], *, batches=(1, 32), new_tokens: int = 64,
            repeats: int = 2) -> dict:
    """Tokens per wall second of both per (batch, capture), and their ratios (t1 / SGLang)."""
    import httpx

    from t1_actors.backends.sglang_server import SGLangServer, SGLangServerError, check_venv, sglang_venv

    try:
        check_venv(sglang_venv())
    except SGLangServerError as exc:
        return {"absent": str(exc)}
    torch.manual_seed(0)
    policy = MoEPolicy(SHAPES[shape]).eval()
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="t1-vs-sglang-") as tmp:
        policy.save(Path(tmp) / "policy")
        context = max(len(p) for p in prompts) + new_tokens + 8
        with SGLangServer.start(Path(tmp) / "policy", context_length=context, max_concurrent=max(batches),
                                log_path=Path(tmp) / "server.log") as server, \
                httpx.Client(base_url=server.url, timeout=600.0) as client:
            started_s = server.started_s
            for batch in batches:
                chosen = [prompts[i % len(prompts)] for i in range(batch)]
                _t1(policy, chosen[:1], 4, True), _sglang(client, chosen[:1], 4, True)  # warm-up
                for capture in (True, False):
                    best = {"t1": float("inf"), "sglang": float("inf")}
                    tokens, server_cores = {}, []
                    for _ in range(repeats):
                        best_t1, tokens["t1"] = _t1(policy, chosen, new_tokens, capture)
                        best["t1"] = min(best["t1"], best_t1)
                        cpu = tree_cpu(server.pid)["total"]
                        seconds, tokens["sglang"] = _sglang(client, chosen, new_tokens, capture)
                        server_cores.append((tree_cpu(server.pid)["total"] - cpu) / seconds)
                        best["sglang"] = min(best["sglang"], seconds)
                    rate = {side: tokens[side] / best[side] for side in best}
                    rows[f"b{batch}_{'capture' if capture else 'no_capture'}"] = {
                        "t1_tok_s": round(rate["t1"], 1), "sglang_tok_s": round(rate["sglang"], 1),
                        "ratio": round(rate["t1"] / rate["sglang"], 3),
                        "sglang_cores_used": round(max(server_cores), 2)}
    version = server.engine.version if server.engine else "unknown"
    return {"parameters_m": round(policy.num_parameters() / 1e6, 1), "sglang_version": version,
            "server_start_s": round(started_s, 1), "t1_threads": torch.get_num_threads(), "rows": rows,
            "vs_sglang_cpu": rows[f"b{max(batches)}_capture"]["ratio"]}
