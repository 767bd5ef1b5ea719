"""t1's torch sampler against transformers' ``generate`` on the same Qwen3-MoE weights, side by side.

Both load one checkpoint (t1's ``save`` writes the HF layout; ``from_pretrained`` reads it into each), run
in this process with the same torch threads and dtype, on the same prompts (a mix of lengths; left-padded
for transformers), for the same number of new tokens with EOS ignored (transformers: ``min_new_tokens`` =
``max_new_tokens``; t1: no stop ids), KV cache on in both. Greedy and T = 1 (nucleus off). Runs alternate
(t1, transformers, t1, ...) and each side keeps its best wall time, so machine noise hits both alike.
t1 is timed with routing capture off (as transformers) and on (which transformers cannot do).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from t1_actors.policy import ModelConfig, MoEPolicy
from t1_actors.policy.sampling import SamplingParams, generate

# the ~100 M-parameter Qwen3-MoE shape (random weights): ratios depend on size, so both are measured
SHAPES = {
    "tiny": ModelConfig(),  # the campaign's policy, ~5.5 M parameters
    "100m": ModelConfig(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64, num_experts=16,
                        top_k=2, moe_intermediate_size=512, max_position=2048),
}


def _t1(model, prompts, new_tokens: int, temperature: float, capture: bool) -> tuple[float, int]:
    params = [SamplingParams(max_new_tokens=new_tokens, temperature=temperature if temperature > 0 else 1.0,
                             seed=i) for i in range(len(prompts))]
    if temperature == 0:  # greedy: a vanishing temperature makes the batcher's draw the argmax
        params = [p.model_copy(update={"temperature": 1e-6}) for p in params]
    t0 = time.perf_counter()
    out = generate(model, prompts, params, capture_routing=capture, max_batch=len(prompts))
    return time.perf_counter() - t0, sum(len(g.output_ids) for g in out)


def _hf(model, prompts, new_tokens: int, temperature: float) -> tuple[float, int]:
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):  # left padding, as generate wants for a decoder-only model
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
        dict(do_sample=False)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, use_cache=True, pad_token_id=0, **sampling)
    return time.perf_counter() - t0, int((out.shape[1] - width) * len(prompts))


def compare(shape: str, prompts: list[list[int]], *, batches=(1, 32), new_tokens: int = 64, repeats: int = 3,
            dtype: torch.dtype = torch.float32) -> dict:
    """Tokens per wall second of both engines per (batch, temperature), and their ratios (t1 / transformers)."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return {"absent": "transformers is not installed (it is in the dev extra)"}
    torch.manual_seed(0)
    policy = MoEPolicy(SHAPES[shape]).eval().to(dtype)
    with tempfile.TemporaryDirectory(prefix="t1-vs-hf-") as tmp:
        policy.save(Path(tmp))
        hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=dtype).eval()
    rows: dict[str, dict] = {"greedy_ids_agree": _greedy_agreement(policy, hf, prompts[0], new_tokens)}
    for batch in batches:
        chosen = [prompts[i % len(prompts)] for i in range(batch)]
        for temperature in (0.0, 1.0):
            best = {"t1": float("inf"), "t1_capture": float("inf"), "hf": float("inf")}
            tokens = {}
            _t1(policy, chosen[:1], 4, temperature, False), _hf(hf, chosen[:1], 4, temperature)  # warm-up
            for _ in range(repeats):
                for side in ("t1", "hf", "t1_capture"):
                    seconds, n = (_hf(hf, chosen, new_tokens, temperature) if side == "hf" else
                                  _t1(policy, chosen, new_tokens, temperature, side == "t1_capture"))
                    best[side], tokens[side] = min(best[side], seconds), n
            rate = {side: tokens[side] / best[side] for side in best}
            rows[f"b{batch}_{'greedy' if temperature == 0 else 't1'}"] = {
                "t1_tok_s": round(rate["t1"], 1), "t1_capture_tok_s": round(rate["t1_capture"], 1),
                "hf_tok_s": round(rate["hf"], 1), "ratio": round(rate["t1"] / rate["hf"], 3)}
    agree = rows.pop("greedy_ids_agree")
    return {"parameters_m": round(policy.num_parameters() / 1e6, 1), "greedy_ids_agree": agree, "rows": rows,
            **{f"vs_hf_generate_b{b}": round(min(rows[f"b{b}_greedy"]["ratio"], rows[f"b{b}_t1"]["ratio"]), 3)
               for b in batches}}


def _greedy_agreement(policy, hf, prompt: list[int], new_tokens: int) -> float:
    """Share of greedy tokens both engines agree on for one prompt (1.0: the same model was loaded)."""
    [ours] = generate(policy, [prompt], [SamplingParams(max_new_tokens=new_tokens, temperature=1e-6, seed=0)],
                      capture_routing=False)
    with torch.no_grad():
        theirs = hf.generate(input_ids=torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, use_cache=True, pad_token_id=0)[0, len(prompt):].tolist()
    first_miss = next((i for i, (a, b) in enumerate(zip(ours.output_ids.tolist(), theirs)) if a != b), new_tokens)
    return round(first_miss / new_tokens, 3)  # tokens agreed before the first difference
