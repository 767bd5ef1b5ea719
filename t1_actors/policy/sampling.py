"""Batched, KV-cached sampling with temperature, top-p, stop ids and routing capture.

``ContinuousBatcher`` runs many sequences of different lengths in one batch and admits new ones
between decode steps (continuous batching): a newly added prompt is prefilled on its own, its cache
merged into the running batch, and finished or cancelled rows leave the batch at once, so throughput
does not wait for the slowest sequence. ``generate`` is the one-shot convenience on top.

The logprob stored for each sampled token is ``log pi_T(t_j | t_<j) = log_softmax(logits / T)[t_j]``:
the policy at the configured temperature ``T``, BEFORE top-p truncation (the learner recomputes exactly
this quantity). Sampling itself draws from the top-p truncated distribution.

Routing is recorded for every token fed to the model: all prompt positions and every sampled token
but the last (never fed back): ``[len(prompt) + len(output) - 1, layers, k]``, one byte per id for
<= 256 experts. A sequence added with a ``session`` (its trial) leaves its keys/values behind when it
finishes; the session's next turn, whose prompt extends them, prefills only the new tokens and reuses
the routing recorded for the kept ones (``_prefix_cache.py``); models whose cache holds recurrent
states (Qwen3.5's DeltaNet layers, ``supports_prefix_reuse = False``) always prefill the whole prompt.
Sampling is seedable per sequence (a per-sequence generator, so a sequence's draws do
not depend on what else is in the batch).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from schemas import routing_dtype
from t1_actors.policy._columns import Columns
from t1_actors.policy._prefix_cache import PrefixCache, Retained
from t1_actors.policy.generation import FinishReason, Generation
from t1_actors.policy.kv_cache import KVCache
from t1_actors.policy.model import MoEPolicy


class SamplingParams(BaseModel):
    """Per-request sampling parameters. ``temperature`` also defines the stored logprob (see module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(256, gt=0)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    stop_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class _Sequence:
    key: int
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator
    stop: frozenset[int]
    session: str | None = None
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def nucleus_mask(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-p: keep the smallest set of most likely tokens whose mass reaches ``top_p`` (per row)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    keep_sorted = mass_before < top_p.unsqueeze(-1)
    keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


class ContinuousBatcher:
    """Continuous batching over one policy. Not thread-safe except ``add``/``cancel`` (lock-guarded).

    ``add(prompt, params) -> key``; ``step() -> [(key, Generation)]`` finished in that step;
    ``cancel(key)`` finishes a sequence at the next step boundary with what it has sampled so far.
    """

    def __init__(self, model: MoEPolicy, *, capture_routing: bool = True, max_batch: int = 64,
                 dtype: torch.dtype | None = None, prefix_cache_tokens: int = 0):
        if dtype is not None and dtype != model.lm_head.weight.dtype:
            model = copy.deepcopy(model).to(dtype)
        self.model = model.eval()
        self.config = model.config
        self.capture_routing = capture_routing
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._pending: list[_Sequence] = []
        self._cancelled: set[int] = set()
        self._next_key = 0
        self._rows: list[_Sequence] = []  # active rows, in batch order
        self._cache = None
        self._columns: Columns | None = None
        self._last: torch.Tensor | None = None  # [B] last sampled token of each row
        self._seed_source = np.random.default_rng()
        self._id_dtype = routing_dtype(self.config.num_experts)
        # Prefix reuse keeps a finished row's KV columns and prefills the next turn's new tokens after
        # them, left-padded inside the batch. A recurrent (DeltaNet) state cannot be cut to columns nor
        # skip such a padding gap, so models without ``supports_prefix_reuse`` (Qwen3.5) always re-prefill.
        reuse = prefix_cache_tokens > 0 and model.supports_prefix_reuse
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if reuse else None
        self.reused_tokens = 0  # prompt tokens not prefilled thanks to the prefix cache (a counter)

    # -- public ---------------------------------------------------------------------------------
    def add(self, prompt: list[int] | np.ndarray, params: SamplingParams, session: str | None = None) -> int:
        """Queue a prompt; ``session`` (e.g. the trial id) lets its next turn reuse this turn's KV."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("empty prompt: a generation needs at least one input id")
        if max(prompt) >= self.config.vocab_size or min(prompt) < 0:
            raise ValueError(f"prompt ids outside [0, {self.config.vocab_size}); tokenizer and model disagree")
        seed = params.seed if params.seed is not None else int(self._seed_source.integers(2**62))
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._pending.append(_Sequence(key, prompt, params, torch.Generator().manual_seed(seed),
                                           frozenset(params.stop_ids), session))
        return key

    def cancel(self, key: int) -> None:
        with self._lock:
            self._cancelled.add(key)

    @property
    def busy(self) -> bool:
        return bool(self._rows or self._pending)

    @property
    def active(self) -> int:
        return len(self._rows)

    def set_model(self, model: MoEPolicy) -> None:
        """Serve another policy (a new version). Only between generations: no row may be in flight."""
        if self._rows:
            raise RuntimeError(f"{len(self._rows)} sequences are mid-generation; drain them (step(admit=False)) "
                               "before swapping the model, or one generation would mix two policies")
        if model.config != self.config:
            raise ValueError("the new policy has another shape (its config differs); start a new sampler")
        dtype = self.model.lm_head.weight.dtype
        self.model = (copy.deepcopy(model).to(dtype) if model.lm_head.weight.dtype != dtype else model).eval()
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # kept keys/values were computed by the old weights

    @torch.inference_mode()
    def step(self, admit: bool = True) -> list[tuple[int, Generation]]:
        """Admit waiting prompts (prefill + first token), else decode one token for every row.

        ``admit=False`` only decodes (drains the batch, e.g. before a weight swap).
        """
        finished = self._finish_cancelled()
        with self._lock:
            room = self.max_batch - len(self._rows) if admit else 0
            admitted, self._pending = self._pending[:room], self._pending[room:]
        if admitted:
            self._admit(admitted)
        elif self._rows:
            self._decode()
        return finished + self._finish_done()

    # -- internals ------------------------------------------------------------------------------
    def _admit(self, seqs: list[_Sequence]) -> None:
        """Prefill new sequences (those continuing a kept session apart: they feed only new tokens)."""
        kept = [self.prefix_cache.take(s.session, s.prompt) if self.prefix_cache and s.session else None
                for s in seqs]
        groups = [[(s, r) for s, r in zip(seqs, kept) if r is not None], [(s, r) for s, r in zip(seqs, kept) if r is None]]
        for group in groups:
            if group:
                self._merge(*self._prefill([s for s, _ in group], [r for _, r in group]))

    def _prefill(self, seqs: list[_Sequence], kept: list[Retained | None]):
        config = self.config
        weight = self.model.lm_head.weight
        if any(r is not None for r in kept):
            cache = KVCache.from_prefixes([(r.keys, r.values) if r else None for r in kept],
                                          num_layers=config.num_layers, kv_heads=config.num_kv_heads,
                                          head_dim=config.head_dim, capacity=64, dtype=weight.dtype)
        else:  # the model's own empty cache (a HybridCache for Qwen3.5 carries DeltaNet states)
            cache = self.model.new_cache(len(seqs), capacity=64)
        past = cache.length
        suffixes = [s.prompt[len(r.tokens):] if r else s.prompt for s, r in zip(seqs, kept)]
        width = max(len(x) for x in suffixes)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), past + width, dtype=torch.long)
        for i, (suffix, r) in enumerate(zip(suffixes, kept)):
            ids[i, width - len(suffix):] = torch.tensor(suffix)
            mask[i, past + width - len(suffix):] = 1
            if r is not None:
                mask[i, past - len(r.tokens):past] = 1
                self.reused_tokens += len(r.tokens)
        out = self.model(ids, attention_mask=mask, past_key_values=cache, use_cache=True,
                         capture_routing=self.capture_routing, logits_to_keep=1)
        routing = out.routing
        if self.capture_routing and past:
            routing = torch.cat([self._kept_routing(kept, past), routing.to(torch.int32)], 1)
        columns = Columns(self._column_payload(mask, routing))
        return seqs, cache, columns, self._sample(out.logits[:, -1], seqs)

    def _kept_routing(self, kept: list[Retained | None], past: int) -> torch.Tensor:
        layers, top_k = self.config.num_layers, self.config.top_k
        routing = torch.zeros(len(kept), past, layers, top_k, dtype=torch.int32)
        for i, r in enumerate(kept):
            if r is not None:
                routing[i, past - len(r.tokens):] = r.routing.to(torch.int32)
        return routing

    def _merge(self, seqs: list[_Sequence], cache: KVCache, columns: Columns, tokens: torch.Tensor) -> None:
        if self._cache is None:
            self._cache, self._columns, self._rows, self._last = cache, columns, list(seqs), tokens
        else:
            pad_self, pad_other = self._cache.merge(cache)
            self._columns.merge(columns, pad_self, pad_other)
            self._rows.extend(seqs)
            self._last = torch.cat([self._last, tokens])

    def _decode(self) -> None:
        ones = torch.ones(len(self._rows), 1, dtype=torch.long)
        mask = torch.cat([self._columns.t["mask"], ones], 1)
        out = self.model(self._last.unsqueeze(1), attention_mask=mask, past_key_values=self._cache,
                         use_cache=True, capture_routing=self.capture_routing)
        self._columns.append(self._column_payload(ones, out.routing))
        self._last = self._sample(out.logits[:, -1], self._rows)

    def _column_payload(self, mask: torch.Tensor, routing: torch.Tensor | None) -> dict[str, torch.Tensor]:
        payload = {"mask": mask}
        if self.capture_routing:
            # ids < 256 fit uint8; wider models keep int32 columns (converted at the end)
            payload["routing"] = routing.to(torch.uint8 if self._id_dtype == np.uint8 else torch.int32)
        return payload

    def _sample(self, logits: torch.Tensor, seqs: list[_Sequence]) -> torch.Tensor:
        """Draw one token per row; record ``log_softmax(logits / T)`` of it (before top-p)."""
        temperature = torch.tensor([s.params.temperature for s in seqs], dtype=torch.float32)
        logprobs = torch.log_softmax(logits.float() / temperature.unsqueeze(-1), dim=-1)
        probs = logprobs.exp()
        top_p = torch.tensor([s.params.top_p for s in seqs], dtype=torch.float32)
        if bool((top_p < 1).any()):
            probs = probs * nucleus_mask(probs, top_p)
        # exponential race: argmax p_i / E_i with E_i ~ Exp(1) draws i with probability p_i / sum p
        race = torch.stack([torch.empty(logits.shape[-1]).exponential_(generator=s.generator) for s in seqs])
        tokens = (probs / race).argmax(-1)
        chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).tolist()
        for s, token, logprob in zip(seqs, tokens.tolist(), chosen):
            s.output.append(token)
            s.logprobs.append(logprob)
        return tokens

    def _finish_done(self) -> list[tuple[int, Generation]]:
        done = []
        for i, s in enumerate(self._rows):
            if s.output and s.output[-1] in s.stop:
                done.append((i, "stop"))
            elif len(s.output) >= s.params.max_new_tokens:
                done.append((i, "length"))
        return self._remove(done)

    def _finish_cancelled(self) -> list[tuple[int, Generation]]:
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
            if not cancelled:
                return []
            waiting = [s for s in self._pending if s.key in cancelled]
            self._pending = [s for s in self._pending if s.key not in cancelled]
        results = [(s.key, self._generation(s, None, "cancelled")) for s in waiting]
        rows = [(i, "cancelled") for i, s in enumerate(self._rows) if s.key in cancelled]
        return results + self._remove(rows)

    def _remove(self, rows: list[tuple[int, FinishReason]]) -> list[tuple[int, Generation]]:
        if not rows:
            return []
        results = []
        for i, reason in rows:
            valid = self._columns.t["mask"][i].bool()
            routing = self._columns.t["routing"][i][valid] if self.capture_routing else None
            seq = self._rows[i]
            results.append((seq.key, self._generation(seq, routing, reason)))
            if self.prefix_cache is not None and seq.session is not None and reason != "cancelled":
                keys, values = self._cache.row_prefix(i, valid)
                self.prefix_cache.put(seq.session, Retained(seq.prompt + seq.output[:-1], keys, values, routing))
        gone = {i for i, _ in rows}
        keep = [i for i in range(len(self._rows)) if i not in gone]
        if not keep:
            self._rows, self._cache, self._columns, self._last = [], None, None, None
            return results
        index = torch.tensor(keep)
        self._rows = [self._rows[i] for i in keep]
        self._cache.select(index)
        self._columns.select(index)
        self._last = self._last.index_select(0, index)
        self._trim_padding()
        return results

    def _trim_padding(self) -> None:
        """Drop leading columns that are padding for every remaining row (rows that left held them)."""
        used = self._columns.t["mask"].any(0)
        first = int(used.to(torch.int8).argmax())
        if first >= 32:
            self._cache.trim_left(first)
            self._columns.trim_left(first)

    def _generation(self, s: _Sequence, routing: torch.Tensor | None, reason: FinishReason) -> Generation:
        record = None
        if routing is not None:
            record = routing.numpy().astype(self._id_dtype, copy=False)
            expected = len(s.prompt) + len(s.output) - 1
            assert record.shape[0] == expected, f"routing rows {record.shape[0]} != {expected}"  # invariant
        return Generation(len(s.prompt), np.asarray(s.output, dtype=np.int32),
                          np.asarray(s.logprobs, dtype=np.float32), record, reason)


def generate(model: MoEPolicy, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], *,
             capture_routing: bool = True, max_batch: int = 64, dtype: torch.dtype | None = None,
             should_stop: Callable[[], bool] | None = None) -> list[Generation]:
    """Generate for every prompt (batched); ``should_stop()`` is polled between tokens and cancels all."""
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    if len(params) != len(prompts):
        raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
    batcher = ContinuousBatcher(model, capture_routing=capture_routing, max_batch=max_batch, dtype=dtype)
    keys = [batcher.add(p, sp) for p, sp in zip(prompts, params)]
    results: dict[int, Generation] = {}
    while batcher.busy:
        if should_stop is not None and should_stop():
            for key in keys:
                if key not in results:
                    batcher.cancel(key)
        results.update(batcher.step())
    return [results[k] for k in keys]
