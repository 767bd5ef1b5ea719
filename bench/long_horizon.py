"""What a long trajectory costs: scripted trials of 10, 30, 100 and 300 turns (to >= 128k tokens) through the real
harness path (t1's chat template and tokenizer, ``rollout.prompt.IncrementalTokens``, the sampler's turn records
(``Generation.to_event`` with ``TurnPrefix``), the event log, TITO), with synthetic routing at the paper's shape
(48 layers x top-8 of 256 experts); and R3 on a real (tiny) policy across a weight update.

    python bench/long_horizon.py [--turns 10 30 100 300] [--whole-up-to 30] [--skip-memory]

Keys (a dict keyed by turns where it says so):
- ``log_bytes_per_token`` {turns: bytes}, ``log_bytes_over_distinct`` {turns: ratio}: the log's bytes for a trained
  trial (its turn records and its assembled trajectory) over the bytes of its distinct positions (ids, logprobs,
  masks and routing rows once each, routing at its on-disk row size); ``*_whole`` the same trial stored the old way
  (a whole prompt and every routing row per turn, and the trajectory), measured up to ``--whole-up-to`` turns (it
  grows as N/2); ``*_eval_30_turns`` an eval trial (turn records only, routing in them);
  ``*_3_versions_30_turns`` a trained trial across two weight updates (a chunk per version);
  ``*_resumable_30_turns`` a trained trial whose turn records keep their routing rows too (``[staleness]
  resume_after_restart``, off by default: a restarted controller resumes it from them, R3 exact).
- ``max_tokens``: the longest trial's tokens.
- ``harness_cpu_last_over_first``: the harness's CPU per turn (render, tokenize, the turn's record) in the last
  decile of turns over the first, at the most turns; ``*_full_tokenize`` the same with every prompt rendered and
  tokenized whole (the harness before ``rollout.prompt``).
- ``loss_region_drift`` (0) and ``tito_case_shares`` over the longest trial's boundaries.
- ``routing_bytes_per_token_disk``, ``append_ratio``, ``replay_ratio``: bench/routing_codec.py's side-by-side run.
- ``r3_gap_single_version``, ``r3_gap_multi_version``: mean |learner - sampler| logprob on loss tokens of
  two-turn trajectories sampled by a tiny policy within one version, and across a weight update (assembled with a
  version boundary: each chunk replayed with its own forward's routing); ``r3_gap_multi_version_one_chunk``: the
  same multi-version trajectories trained as one chunk (the earlier assembly), the defect measured.
- ``learner_peak_rss_growth``, ``critic_peak_rss_growth``: from bench/learner_memory.py (skipped when absent).

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from log_append import make_trajectory  # noqa: E402
from routing_codec import side_by_side  # noqa: E402

from storage import EventLog, StorageConfig  # noqa: E402
from storage._routing import SetCodec  # noqa: E402
from t1_actors import tito  # noqa: E402
from t1_actors.policy import MoEPolicy, load_tokenizer  # noqa: E402
from t1_actors.policy.chat_template import IM_END, render_chat, render_tool_call  # noqa: E402
from t1_actors.policy.config import ModelConfig  # noqa: E402
from t1_actors.policy.generation import NO_PREFIX, Generation, TurnPrefix  # noqa: E402
from t1_actors.policy.sampling import SamplingParams, generate  # noqa: E402
from t1_actors.rollout import first_messages  # noqa: E402
from t1_actors.rollout.prompt import IncrementalPrompt  # noqa: E402
from tools._replay.drift import token_logprobs  # noqa: E402

LAYERS, TOP_K, EXPERTS = 48, 8, 256
OUTPUT_CHARS = 1500  # a tool output per turn: 300 turns reach ~128k tokens with t1's BPE
WORDS = ["alpha", "beta", "gamma", "delta", "src/", "main.py", "error:", "line", "42", "ok", "FAILED", "->", "\n"]


def routing_rows(rng: np.random.Generator, positions: int) -> np.ndarray:
    """[positions, 48, 8] uint8 top-8 sets of 256 (drawn from 4096 random sets per layer: the codec's bytes do not
    depend on which sets)."""
    base = np.sort(np.argsort(rng.random((4096, EXPERTS), dtype=np.float32), axis=-1)[:, :TOP_K], axis=-1)
    return base[rng.integers(0, len(base), (positions, LAYERS))].astype(np.uint8)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def scripted_trial(turns: int, tokenizer, table: dict[int, np.ndarray], *, whole: bool, full_tokenize: bool,
                   log_dir: Path | None, versions_every: int | None = None, trained: bool = True,
                   routing_in_turns: bool = False) -> dict:
    """Play ``turns`` scripted turns through the harness path; append each turn's record to a fresh log at
    ``log_dir``, and for a ``trained`` trial its assembled trajectory (which then stores the routing rows, the
    turns' records none, as the trial runner asks the sampler). ``whole``: records as before (a whole prompt and
    every routing row per turn, and the trajectory besides). ``routing_in_turns``: a trained trial's records keep
    their routing rows too (``[staleness] resume_after_restart``: what a restarted controller resumes it from).
    Returns the trial's figures."""
    encode = tokenizer.encode
    prompt_of = IncrementalPrompt(render_chat if tokenizer.chat_template is None else tokenizer.apply_chat_template,
                                  encode)
    rng = np.random.default_rng(turns)
    messages = first_messages("Follow the chain of files from /data/start.txt to its end and fix what it names.")
    log = EventLog.open(log_dir, create=True, config=StorageConfig()) if log_dir is not None else None
    writer = log.writer("sampler-0", routing_shape=(LAYERS, TOP_K), num_experts=EXPERTS) if log else None
    cpu, records, previous, previous_prompt = [], [], None, np.zeros(0, np.int32)
    for turn in range(turns):
        version = turn // versions_every if versions_every else 0
        started = time.process_time()
        if full_tokenize:
            prompt = np.asarray(encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)), np.int32)
        else:
            prompt = prompt_of(messages)
        call = {"name": "bash", "arguments": {"command": f"cat /data/step{turn}.txt"}}
        sampled = np.asarray(encode(render_tool_call(call) + IM_END), np.int32)
        fed = len(prompt) + len(sampled) - 1
        generation = Generation(len(prompt), sampled, np.full(len(sampled), -0.25, np.float32),
                                table[version % 2][:fed], "stop", version)
        prefix = NO_PREFIX if whole or previous is None else TurnPrefix.after(  # the harness's own arrays, as
            previous_prompt, previous.sampled_ids, previous.routing, previous.policy_version, prompt)  # in rollout
        event = generation.to_event("trial-0", turn, prompt, temperature=1.0, top_p=1.0, sampler_id="sampler-0",
                                    prefix=prefix, record_routing=whole or not trained or routing_in_turns)
        cpu.append(time.process_time() - started)
        if writer is not None:
            writer.append(event)
            writer.commit()
        previous_prompt = prompt
        previous = tito.Turn(prompt.astype(np.int64), sampled.astype(np.int64), generation.logprobs,
                             generation.routing, version)
        records.append(previous)
        output = " ".join(rng.choice(WORDS, OUTPUT_CHARS // 5))[:OUTPUT_CHARS]
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": output}]
    chunks = tito.assemble(records, tokenizer.backend_tokenizer, reward=0.5, repairs=())
    if writer is not None:
        if trained:
            for chunk in chunks:
                writer.append(tito.to_event(chunk, trial_id="trial-0", task_id="chain"))
            writer.commit()
        writer.close()
    stream = len(records[-1].prompt_ids) + len(records[-1].sampled_ids)
    decile = max(1, turns // 10)
    return {"tokens": stream, "cpu": cpu, "last_over_first": float(np.mean(cpu[-decile:]) / np.mean(cpu[:decile])),
            "log_bytes": du(log_dir) if log_dir is not None else None, "metrics": tito.tito_metrics(chunks)}


def distinct_bytes(tokens: int) -> int:
    """Each position once: id (4 B), logprob (4 B), mask (1 B), and a routing row at its on-disk size."""
    return tokens * (4 + 4 + 1) + (tokens - 1) * SetCodec(LAYERS, TOP_K, EXPERTS).row_bytes


def r3_gaps(pairs: int = 12) -> dict:
    """Two-turn trajectories of a tiny policy: turn 2 within the version of turn 1, or after a weight update."""
    torch.manual_seed(0)
    config = ModelConfig()
    before = MoEPolicy(config).eval()
    after = MoEPolicy(config).eval()
    after.load_state_dict({k: v + 0.02 * torch.randn_like(v) for k, v in before.state_dict().items()})
    models = {0: before, 1: after}
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=1)
    rng = np.random.default_rng(0)
    gaps: dict[str, list[float]] = {"single": [], "multi": [], "multi_one_chunk": []}
    for i in range(pairs):
        prompt = rng.integers(5, config.vocab_size, 48).tolist()
        [first] = generate(before, [prompt], params.model_copy(update={"seed": i}))
        tool = rng.integers(5, config.vocab_size, 24).tolist()
        second_prompt = prompt + first.output_ids.tolist() + tool
        for kind, version in (("single", 0), ("multi", 1)):
            [second] = generate(models[version], [second_prompt], params.model_copy(update={"seed": 100 + i}))
            turns = [tito.Turn(np.asarray(prompt, np.int64), first.output_ids.astype(np.int64), first.logprobs,
                               first.routing, 0),
                     tito.Turn(np.asarray(second_prompt, np.int64), second.output_ids.astype(np.int64),
                               second.logprobs, second.routing, version)]
            variants = [(kind, tito.assemble(turns, None, reward=0.0, repairs=()))]
            if kind == "multi":  # the earlier assembly: one chunk, one routing row per position
                same = [turns[0], tito.Turn(**{**turns[1].__dict__, "policy_version": 0})]
                [one] = tito.assemble(same, None, reward=0.0, repairs=())
                one = tito.TrajectoryChunk(**{**one.__dict__, "token_versions": np.where(
                    np.arange(len(one.token_ids)) >= len(second_prompt), 1, 0).astype(np.int32) * one.loss_mask})
                variants.append(("multi_one_chunk", [one]))
            for name, chunks in variants:
                for chunk in chunks:
                    loss = np.flatnonzero(chunk.loss_mask)
                    for v in sorted({int(x) for x in chunk.token_versions[loss]}):
                        at = loss[chunk.token_versions[loss] == v]
                        lp, _ = token_logprobs(models[v], chunk.token_ids.astype(np.int64),
                                               routing_replay=chunk.routing, temperature=1.0)
                        gaps[name] += np.abs(lp[at] - chunk.sampler_logprobs[at]).tolist()
    return {f"r3_gap_{'single_version' if k == 'single' else k.replace('multi', 'multi_version')}":
            float(np.mean(v)) for k, v in gaps.items()}


def learner_memory() -> dict:
    script = ROOT / "bench" / "learner_memory.py"
    if not script.exists():
        return {"learner_memory": "absent (bench/learner_memory.py)"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    try:
        figures = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"learner_memory": f"failed: {out.stderr[-300:]}"}
    return {key: figures[key] for key in ("learner_peak_rss_growth", "critic_peak_rss_growth") if key in figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[10, 30, 100, 300])
    parser.add_argument("--whole-up-to", type=int, default=30, help="store whole records up to this many turns")
    parser.add_argument("--skip-memory", action="store_true", help="leave out bench/learner_memory.py's keys")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.monotonic()
    tokenizer = load_tokenizer(ROOT / "t1_actors" / "assets" / "tokenizer.json")
    rng = np.random.default_rng(0)
    positions = 200_000
    table = {0: routing_rows(rng, positions), 1: routing_rows(rng, positions)}
    out: dict = {"bench": "long_horizon", "log_bytes_per_token": {}, "log_bytes_over_distinct": {},
                 "log_bytes_over_distinct_whole": {}, "harness_cpu_per_turn_ms": {}}
    base = Path(tempfile.mkdtemp(prefix="t1-long-"))
    try:
        longest = None
        for turns in args.turns:
            trial = scripted_trial(turns, tokenizer, table, whole=False, full_tokenize=False, log_dir=base / f"d{turns}")
            out["log_bytes_per_token"][turns] = round(trial["log_bytes"] / trial["tokens"], 1)
            out["log_bytes_over_distinct"][turns] = round(trial["log_bytes"] / distinct_bytes(trial["tokens"]), 3)
            out["harness_cpu_per_turn_ms"][turns] = round(1e3 * float(np.mean(trial["cpu"])), 3)
            if turns <= args.whole_up_to:
                whole = scripted_trial(turns, tokenizer, table, whole=True, full_tokenize=False, log_dir=base / f"w{turns}")
                out["log_bytes_over_distinct_whole"][turns] = round(whole["log_bytes"] / distinct_bytes(whole["tokens"]), 3)
            shutil.rmtree(base, ignore_errors=True)
            base.mkdir()
            longest = (turns, trial)
        turns, trial = longest
        out["max_tokens"] = trial["tokens"]
        out["harness_cpu_last_over_first"] = round(trial["last_over_first"], 3)
        full = scripted_trial(turns, tokenizer, table, whole=False, full_tokenize=True, log_dir=None)
        out["harness_cpu_last_over_first_full_tokenize"] = round(full["last_over_first"], 3)
        metrics = trial["metrics"]
        boundaries = sum(metrics[f"boundary_{case}"] for case in tito.CASES)
        out["loss_region_drift"] = metrics["drift_tokens"]
        out["tito_case_shares"] = {case: round(metrics[f"boundary_{case}"] / boundaries, 4) if boundaries else None
                                   for case in tito.CASES}
        versioned = scripted_trial(30, tokenizer, table, whole=False, full_tokenize=False, log_dir=base / "v",
                                   versions_every=10)  # a weight update every 10 turns: a chunk per version
        evaluated = scripted_trial(30, tokenizer, table, whole=False, full_tokenize=False, log_dir=base / "e",
                                   trained=False)  # an eval trial: its turns' records hold the routing
        out["log_bytes_over_distinct_eval_30_turns"] = round(evaluated["log_bytes"]
                                                             / distinct_bytes(evaluated["tokens"]), 3)
        out["log_bytes_over_distinct_3_versions_30_turns"] = round(versioned["log_bytes"]
                                                                   / distinct_bytes(versioned["tokens"]), 3)
        resumable = scripted_trial(30, tokenizer, table, whole=False, full_tokenize=False, log_dir=base / "r",
                                   routing_in_turns=True)  # the default: resumable after a controller's restart
        out["log_bytes_over_distinct_resumable_30_turns"] = round(resumable["log_bytes"]
                                                                  / distinct_bytes(resumable["tokens"]), 3)
        events = [make_trajectory(np.random.default_rng(seed), seed) for seed in range(12)]
        codec = side_by_side(events, base / "codec", rounds=3, commit_every=4)
        out.update({key: codec[key] for key in ("routing_bytes_per_token_disk", "append_ratio", "replay_ratio",
                                                "append_ratio_ids", "replay_ratio_ids")})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out.update({key: round(value, 9) for key, value in r3_gaps().items()})
    if not args.skip_memory:
        out.update(learner_memory())
    out["goals"] = {"log_bytes_over_distinct <= 1.2": max(out["log_bytes_over_distinct"].values()) <= 1.2,
                    "max_tokens >= 128000": out["max_tokens"] >= 128_000,
                    "harness_cpu_last_over_first <= 1.5": out["harness_cpu_last_over_first"] <= 1.5,
                    "routing_bytes_per_token_disk <= 300": out["routing_bytes_per_token_disk"] <= 300,
                    "append/replay_ratio >= 0.8": min(out["append_ratio"], out["replay_ratio"]) >= 0.8,
                    "loss_region_drift == 0": out["loss_region_drift"] == 0,
                    "r3_gap_multi <= 2 x single": out["r3_gap_multi_version"] <= 2 * out["r3_gap_single_version"]}
    out["seconds"] = round(time.monotonic() - started, 1)
    out["cpus"], out["load_average"] = os.cpu_count(), round(os.getloadavg()[0], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
