"""Warm start before RL: the tiny tokenizer and supervised fine-tuning on executed oracle trajectories.

SFT examples are real: every oracle command of a training task is run in the task's sandbox and its
actual output becomes the tool turn, so the chat the policy imitates is exactly the chat the rollout
harness (``t1_actors.rollout``) will later render. The whole training split is executed first (both
cores), then SFT draws random batches from it, with a fixed anchor batch every other step (see
``supervised_finetune`` for why and what it measured).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from t1_actors.policy.chat_template import render_chat
from t1_actors.policy.chat_tokenizer import as_chat_tokenizer
from t1_actors.rollout import first_messages, truncate_output
from t1_actors.tasks import oracle_trajectory

DONE_TEXT = "done"
Example = tuple[np.ndarray, np.ndarray]  # token ids, assistant-token mask


class OracleExample(tuple):
    """An SFT example ``(ids, mask)`` that keeps the executed oracle chat it renders (instruction, commands,
    outputs), so it can be rendered again under other names (``warmstart.rename``). An ``Example`` wherever one
    is read."""

    instruction: str
    commands: list[str]
    outputs: list[str]

    @classmethod
    def of(cls, example: Example, instruction: str, commands: list[str], outputs: list[str]) -> OracleExample:
        made = cls(example)
        made.instruction, made.commands, made.outputs = instruction, list(commands), list(outputs)
        return made


def oracle_messages(instruction: str, commands: list[str], outputs: list[str],
                    tool_output_chars: int) -> list[dict[str, Any]]:
    """The chat of an agent that runs the oracle: one command per turn, its output, then ``done``."""
    messages = first_messages(instruction)
    for command, output in zip(commands, outputs, strict=True):
        messages.append({"role": "assistant", "content": "",
                         "tool_calls": [{"name": "bash", "arguments": {"command": command}}]})
        messages.append({"role": "tool", "content": truncate_output(output, tool_output_chars)})
    messages.append({"role": "assistant", "content": DONE_TEXT})
    return messages


def assistant_spans(messages: list[dict[str, Any]], render: Callable[..., str] = render_chat) -> list[tuple[int, int]]:
    """Character spans of every assistant turn's body and its <|im_end|> in ``render(messages)``.

    Needs a template whose renders of a chat's prefixes are prefixes of the whole render (t1's is); raises
    ``ValueError`` where not (Qwen3's drops the reasoning of turns before a later user query)."""
    spans = []
    full = render(messages)
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            opened, closed = render(messages[:i], add_generation_prompt=True), render(messages[: i + 1])
            if not full.startswith(opened) or not full.startswith(closed.rstrip("\n")):
                raise ValueError(f"message {i}: the template renders this chat's prefix differently from the whole "
                                 "chat, so assistant spans are not defined")
            spans.append((len(opened), len(closed) - 1))  # keep <|im_end|>, not the newline after it
    return spans


def sft_example(messages: list[dict[str, Any]], tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of the rendered chat and a mask that is 1 on the assistant's tokens (what SFT learns)."""
    tokenizer = as_chat_tokenizer(tokenizer)
    text = tokenizer.apply_chat_template(messages)
    encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    ids = np.asarray(encoding.ids, dtype=np.int64)
    mask = np.zeros(len(ids), dtype=np.float32)
    spans = assistant_spans(messages, tokenizer.apply_chat_template)
    for j, (start, _end) in enumerate(encoding.offsets):
        if any(s <= start < e for s, e in spans):
            mask[j] = 1.0
    return ids, mask


def chat_corpus(tasks: Iterable, tool_output_chars: int = 240) -> list[str]:
    """Rendered oracle chats (outputs left empty) to train the tokenizer on the run's own vocabulary."""
    texts = []
    for task in tasks:
        commands = oracle_trajectory(task)
        texts.append(render_chat(oracle_messages(task.instruction, commands, [""] * len(commands), tool_output_chars)))
    return texts


def oracle_examples(task, outputs: list[str], tokenizer, *, tool_output_chars: int,
                    examples_of: Callable[[Any, list[str]], list[Example]] | None = None) -> list[Example]:
    """The SFT examples of one executed oracle: ``examples_of(task, outputs)``, or (None) the one ``sft_example``
    of its chat on t1's own template."""
    if examples_of is not None:
        return examples_of(task, outputs)
    commands = oracle_trajectory(task)
    messages = oracle_messages(task.instruction, commands, outputs, tool_output_chars)
    return [OracleExample.of(sft_example(messages, tokenizer), task.instruction, commands, outputs)]


def execute_oracle_pool(tasks: list, execute_oracle: Callable[[Any], list[str] | None], tokenizer, *,
                        tool_output_chars: int, max_len: int, workers: int = 2,
                        progress: Callable[[int, int], None] | None = None,
                        examples_of: Callable[[Any, list[str]], list[Example]] | None = None
                        ) -> tuple[list[Example], int]:
    """Run every task's oracle in its sandbox (``workers`` at a time) and render the SFT examples.

    ``examples_of(task, outputs)``: the examples of one executed oracle (None: ``sft_example`` of
    ``oracle_messages`` on t1's own template; ``t1_actors.warmstart.chats`` builds them for an HF template).

    Done before training rather than beside it: on 2 cores a producer thread halved SFT's throughput
    (2.4k vs 5.3k tok/s measured), and the whole pool of the tiny run takes ~3 min with both cores.
    Returns the examples (chats longer than ``max_len`` tokens left out) and the number of failed oracles.
    """
    examples: list[Example] = []
    failures = done = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="oracle") as pool:
        for task, outputs in zip(tasks, pool.map(execute_oracle, tasks)):
            done += 1
            if outputs is None:
                failures += 1
            else:
                rendered = oracle_examples(task, outputs, tokenizer, tool_output_chars=tool_output_chars,
                                           examples_of=examples_of)
                examples += [example for example in rendered if len(example[0]) <= max_len]
            if progress:
                progress(done, len(tasks))
    return examples, failures


def sft_loss(model, ids: torch.Tensor, mask: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on assistant tokens: mean over masked positions of -log p(T_j | T_<j).

    Logits are computed at the masked positions only (the trunk's hidden states there through ``lm_head``): the
    same loss, but with a 151k-id vocabulary (Qwen3's) the head is most of the step, and assistant tokens are a
    fraction of a chat."""
    hidden = model.model(ids[:, :-1], attention_mask=attention[:, :-1]).hidden_states
    weights = mask[:, 1:]
    taken = weights > 0
    logits = model.lm_head(hidden[taken]).float()
    nll = F.cross_entropy(logits, ids[:, 1:][taken], reduction="none")
    return (nll * weights[taken]).sum() / weights.sum().clamp(min=1.0)


def sft_learning_rate(peak: float, step: int, progress: float, warmup_steps: int = 20, floor: float = 0.1) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to ``floor * peak`` at the end of the
    budget (``progress`` = steps done / step budget, or elapsed / seconds under a time budget)."""
    warm = min(1.0, (step + 1) / warmup_steps)
    return peak * warm * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def pad_batch(examples: list[tuple[np.ndarray, np.ndarray]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width))
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (i, m) in enumerate(examples):
        ids[row, : len(i)] = torch.from_numpy(i)
        mask[row, : len(m)] = torch.from_numpy(m)
        attention[row, : len(i)] = 1
    return ids, mask, attention


def length_buckets(examples: list[Example], buckets: int) -> list[list[Example]]:
    """``examples`` sorted by token count and cut into ``buckets`` groups of (nearly) equal count.

    A batch drawn within one group pads to about its own length: a random batch of a mix of 200- and 800-token
    chats pads every row to ~800, so half its tokens are padding (long.toml's pool)."""
    ranked = sorted(examples, key=lambda example: len(example[0]))
    size = math.ceil(len(ranked) / max(1, min(buckets, len(ranked))))
    return [ranked[i: i + size] for i in range(0, len(ranked), size)]


def short_chats(examples: list[Example], buckets: int) -> list[Example]:
    """The shorter half of ``length_buckets(examples, buckets)`` (at least one bucket): on long.toml's pool, the
    single-turn families' chats."""
    return [example for bucket in length_buckets(examples, buckets)[: max(1, buckets // 2)] for example in bucket]


@dataclass
class SFTReport:
    steps: int
    examples_seen: int
    distinct_examples: int
    final_loss: float  # mean of the last 20 steps
    seconds: float
    losses: list[float]
    tokens: int  # the batches' real (non-padding) positions
    positions: int  # the batches' positions, padding included

    @property
    def epochs(self) -> float:
        return self.examples_seen / max(self.distinct_examples, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def padding(self) -> float:
        """Share of the batches' positions that were padding."""
        return 1 - self.tokens / max(self.positions, 1)


def supervised_finetune(model, examples: list[Example], *, seconds: float, batch_size: int, lr: float,
                        pad_id: int, seed: int = 0, anchor_every: int = 2, steps: int | None = None,
                        buckets: int = 0, rewrite: Callable[[Any, random.Random], Example] | None = None,
                        progress: Callable[[int, float], None] | None = None) -> SFTReport:
    """Train ``model`` on oracle chats for ``steps`` optimiser steps (``None``: until ``seconds`` of wall
    time); ``seconds`` always bounds the run, so a step budget on a slow machine still ends. With a step
    budget two runs of one seed take the same steps and give the same policy; the learning-rate schedule
    follows the steps then, the clock otherwise.

    Batches are drawn at random from ``examples``, except that every ``anchor_every``-th step (0: never)
    trains on one fixed *anchor* batch. Why: the tiny policy first learns a generic command per family
    (loss plateau ~0.29, 0 % resolved) and only later learns to copy the task's parameters from the
    instruction. Memorising a small repeated set pushes it to copy: measured on this machine, same
    pool, same seed, 150 steps: with the anchor held-out loss 0.233 and 3.7 % resolved (160 eval tasks,
    T = 0.5); without it 0.290 and 0.0 %; a slowly growing pool (4 or 16 new examples per step) did
    not copy either. Repetition favouring in-context copying is the effect of Chan et al. (2022).

    ``buckets`` > 0: every batch comes from one of ``length_buckets(examples, buckets)``, chosen at random in
    proportion to its size (fresh batches) or in turn (anchor steps: one fixed anchor batch per bucket), so a
    batch pads to about its own length. 0: batches drawn from the whole pool, as above.

    ``rewrite(example, rng)``: each example of a fresh batch is trained as ``rewrite`` returns it (the anchor batch
    as it is), e.g. under random names (``warmstart.rename.RenamedExamples``); ``rng`` is its own stream of ``seed``.

    ``progress(step, loss)`` after each step. ``two_phase_finetune`` runs this twice: short chats first.
    """
    if not examples:
        raise RuntimeError("SFT: no oracle example to train on (are the sandbox and the task corpus working?)")
    if anchor_every < 0:
        raise ValueError(f"anchor_every must be >= 0 (0 = no anchor batch), got {anchor_every}")
    if buckets < 0:
        raise ValueError(f"buckets must be >= 0 (0 = batches from the whole pool), got {buckets}")
    rng, rewrite_rng = random.Random(seed), random.Random(f"rewrite-{seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.1)
    pools = length_buckets(examples, buckets) if buckets else [examples]
    anchors = [rng.sample(pool, k=min(batch_size, len(pool))) for pool in pools]
    if steps is not None and steps <= 0:
        raise ValueError(f"steps must be > 0 (or None for a time budget), got {steps}")
    budget_steps, steps = steps, 0
    start, tokens, positions, losses, seen = time.monotonic(), 0, 0, [], 0
    model.train()
    while (elapsed := time.monotonic() - start) < seconds and (budget_steps is None or steps < budget_steps):
        done = steps / budget_steps if budget_steps is not None else elapsed / seconds
        for group in optimizer.param_groups:
            group["lr"] = sft_learning_rate(lr, steps, done)
        if anchor_every > 0 and steps % anchor_every == 0:
            batch = anchors[(steps // anchor_every) % len(pools)]
        else:
            pool = pools[0] if len(pools) == 1 else rng.choices(pools, weights=[len(p) for p in pools])[0]
            batch = rng.sample(pool, k=min(batch_size, len(pool)))
            if rewrite is not None:
                batch = [rewrite(example, rewrite_rng) for example in batch]
        ids, mask, attention = pad_batch(batch, pad_id)
        loss = sft_loss(model, ids, mask, attention)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps, seen, tokens = steps + 1, seen + len(batch), tokens + int(attention.sum())
        positions += attention.numel()
        losses.append(loss.item())
        if progress:
            progress(steps, losses[-1])
    elapsed = time.monotonic() - start
    model.eval()
    return SFTReport(steps, seen, len(examples), float(np.mean(losses[-20:])) if losses else float("nan"), elapsed,
                     losses, tokens, positions)


@dataclass(frozen=True)
class SFTPhase:
    """One SFT phase's own budget: ``steps`` optimiser steps (``None``: until the time left) of ``batch_size``
    chats, every ``anchor_every``-th one the fixed anchor batch (0: never); its own warm-up and cosine."""
    steps: int | None
    batch_size: int
    anchor_every: int


def two_phase_finetune(model, examples: list[Example], *, short: SFTPhase | None, main: SFTPhase, seconds: float,
                       lr: float, pad_id: int, seed: int = 0, buckets: int = 0,
                       short_rewrite: Callable[[Any, random.Random], Example] | None = None,
                       after_short: Callable[[SFTReport], None] | None = None,
                       progress: Callable[[int, float], None] | None = None) -> tuple[SFTReport, SFTReport | None]:
    """SFT in two phases: ``short`` on the shorter half of the length buckets alone (``short_chats``), then
    ``main`` on every chat, each a ``supervised_finetune`` with its own schedule (the second draws from its own
    random stream, ``seed + 1000``); ``short = None``: the main phase alone. ``seconds`` bounds the two phases'
    training together (``after_short`` is not counted).
    ``short_rewrite``: the short phase's ``rewrite`` (the main phase trains every chat as it is).
    Returns the whole run's report (steps, examples and time summed, the main phase's final loss) and the short
    phase's; ``after_short(report)`` is called between the two (e.g. to read the policy's imitation there).

    Why a phase of its own: on long.toml's pool, short chats drawn with the 550-800-token ones from the start
    never taught the 6-layer policy to copy a name, and a short *share* of one schedule at batch 16 did not
    either on 2 of 3 seeds (single-turn chats right at its end: 3-5 of 32); 600 steps of 32 on the short chats
    alone, then 600 of 16 on all with a fresh cosine, made the failing seed copy (77 % of the validation turns
    right, teacher-forced; docs/long_horizons.md).
    """
    if short is not None and buckets < 2:
        raise ValueError(f"a short phase draws from the shorter half of the length buckets: buckets must be >= 2, "
                         f"got {buckets}")
    first = None
    if short is not None:
        first = supervised_finetune(model, short_chats(examples, buckets), seconds=seconds, batch_size=short.batch_size,
                                    lr=lr, pad_id=pad_id, seed=seed, anchor_every=short.anchor_every,
                                    steps=short.steps, buckets=max(1, buckets // 2), rewrite=short_rewrite,
                                    progress=progress)
        if after_short is not None:
            after_short(first)
            model.train()
    offset = first.steps if first else 0
    second = supervised_finetune(
        model, examples, seconds=max(seconds - (first.seconds if first else 0.0), 1e-3), batch_size=main.batch_size, lr=lr,
        pad_id=pad_id, seed=seed + 1000 if first else seed, anchor_every=main.anchor_every, steps=main.steps,
        buckets=buckets, progress=(lambda step, loss: progress(offset + step, loss)) if progress else None)
    if first is None:
        return second, None
    whole = SFTReport(first.steps + second.steps, first.examples_seen + second.examples_seen, len(examples),
                      second.final_loss, first.seconds + second.seconds, first.losses + second.losses,
                      first.tokens + second.tokens, first.positions + second.positions)
    return whole, first
