"""Test harnesses for TITO: the project's tokenizer and chat template, and chat loops that behave the way the
issue lists (re-rendering, whitespace normalising, reasoning stripping, truncating, token-appending).

The "sampler" here is scripted: it emits the ids of a chosen assistant text, either the canonical tokenization
or a random valid but non-canonical segmentation of the same text (what a real policy may sample). Routing
rows are traceable records, not model output: each row names the turn that produced it, the position in that
turn's sequence and the token id at that position, so tests can check where every stream row came from.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers

from t1_actors.policy.chat_template import GENERATION_PROMPT, IM_END, render_chat, render_tool_call
from t1_actors.policy.tokenizer import SPECIAL_TOKENS, generic_shell_chats, train_tokenizer
from t1_actors.rollout import assistant_message, truncate_output
from t1_actors.tito import Turn

THINK_GENERATION_PROMPT = GENERATION_PROMPT + "<think>\n\n</think>\n\n"  # Qwen3 with thinking disabled


@functools.lru_cache(maxsize=1)
def project_tokenizer(*, path_components: bool = False) -> Tokenizer:
    """The project's byte-level BPE, trained (as the campaign does) on rendered chats, here including
    thoughts, blank lines and reasoning so that merges such as "\\n\\n" exist."""
    rng = random.Random(7)
    extra = []
    for _ in range(300):
        thought = rng.choice(["Let me look.", "Checking the file.", "Now count.", "First, list it."])
        chat = [{"role": "user", "content": "Task: count words.\n\nThen report."},
                {"role": "assistant", "content": f"<think>\nI should {thought.lower()}\n</think>\n\n{thought}",
                 "tool_calls": [{"name": "bash", "arguments": {"command": "wc -w notes.txt"}}]},
                {"role": "tool", "content": "12 notes.txt\n\n"},
                {"role": "assistant", "content": "\n\nDone. The file has 12 words."}]
        extra.append(render_chat(chat))
    return train_tokenizer([*generic_shell_chats(400), *extra], vocab_size=1024, path_components=path_components)


def encode(tok: Tokenizer, text: str) -> np.ndarray:
    return np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)


def decode(tok: Tokenizer, ids: np.ndarray) -> str:
    return tok.decode([int(i) for i in ids], skip_special_tokens=False)


_SPECIAL = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")
_BYTES = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


def segment(tok: Tokenizer, text: str, rng: random.Random) -> np.ndarray:
    """A random valid segmentation of ``text``: vocabulary pieces that decode to exactly ``text``, special
    tokens kept whole, usually not the canonical tokenization."""
    vocab = tok.get_vocab()
    longest = max(len(t) for t in vocab)
    ids: list[int] = []
    for piece in _SPECIAL.split(text):
        if not piece:
            continue
        if piece in SPECIAL_TOKENS:
            ids.append(vocab[piece])
            continue
        chars = "".join(s for s, _ in _BYTES.pre_tokenize_str(piece))
        at = 0
        while at < len(chars):
            options = [n for n in range(1, min(longest, len(chars) - at) + 1) if chars[at:at + n] in vocab]
            n = rng.choice(options)
            ids.append(vocab[chars[at:at + n]])
            at += n
    out = np.asarray(ids, dtype=np.int32)
    assert decode(tok, out) == text
    return out


def noncanonical(tok: Tokenizer, text: str, rng: random.Random) -> np.ndarray:
    """A segmentation of ``text`` guaranteed to differ from the canonical ids (raises if the text has none)."""
    canonical = encode(tok, text)
    for _ in range(20):
        ids = segment(tok, text, rng)
        if not np.array_equal(ids, canonical):
            return ids
    raise AssertionError(f"no non-canonical segmentation found for {text!r}")


def traceable_routing(turn: int, ids: np.ndarray) -> np.ndarray:
    """Rows for positions 0..n-2 of ``ids``: layer 0 = (turn, position % 256), layer 1 = the token id's bytes."""
    n = len(ids) - 1
    rows = np.zeros((max(n, 0), 2, 2), dtype=np.uint8)
    rows[:, 0, 0] = turn
    rows[:, 0, 1] = np.arange(n) % 256
    rows[:, 1, 0] = ids[:n] % 256
    rows[:, 1, 1] = ids[:n] // 256
    return rows


def row_token(rows: np.ndarray) -> np.ndarray:
    return rows[:, 1, 0].astype(np.int64) + 256 * rows[:, 1, 1].astype(np.int64)


def tool_call_text(command: str, thought: str = "") -> str:
    """An assistant turn exactly as the template renders it (the stop token included)."""
    call = render_tool_call({"name": "bash", "arguments": {"command": command}})
    return (f"{thought}\n" if thought else "") + call + IM_END


# ---- harnesses: how a chat loop turns a sampled text into the history the next prompt is rendered from ----

def parsed(text: str) -> dict[str, Any]:
    """The project's harness (t1_actors.rollout): content stripped, tool calls parsed and re-rendered."""
    return assistant_message(text.removesuffix(IM_END))


def verbatim(text: str) -> dict[str, Any]:
    """A harness that keeps the sampled text as the assistant's content (only the stop token removed)."""
    return {"role": "assistant", "content": text.removesuffix(IM_END)}


def strip_reasoning(messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
    """A Qwen3-like template: past assistant turns are rendered without their <think>...</think> block."""
    cleaned = [dict(m, content=re.sub(r"<think>.*?</think>\s*", "", m.get("content", ""), flags=re.DOTALL))
               if m["role"] == "assistant" else m for m in messages]
    return render_chat(cleaned, add_generation_prompt)


def thinking_disabled(messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
    """Qwen3 with thinking disabled: the generation prompt opens an empty think block history never shows."""
    text = render_chat(messages)
    return text + THINK_GENERATION_PROMPT if add_generation_prompt else text


def no_separator(messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
    """A template that drops the newline between an assistant turn's <|im_end|> and the next turn."""
    return render_chat(messages, add_generation_prompt).replace(IM_END + "\n<|im_start|>", IM_END + "<|im_start|>")


@dataclass
class Trial:
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)


def play(tok: Tokenizer, texts: list[str], *, outputs: list[str] | None = None,
         to_message: Callable[[str], dict[str, Any]] = parsed,
         render: Callable[..., str] = render_chat,
         sample: Callable[[str, int], np.ndarray] | None = None,
         append_tokens: bool = False, compact_after: int | None = None, tool_chars: int = 240,
         seed: int = 0, turns_per_version: int | None = None) -> Trial:
    """Play a scripted trial: each turn render the chat (generation prompt on), tokenize it (p_i), "sample"
    the ids of ``texts[i]`` (``sample(text, i)``, canonical by default), then append the harness's message and
    the (truncated) tool output. ``append_tokens``: build p_{i+1} by appending the tool turn's ids to
    p_i ++ a_i instead of re-rendering (and so drop the newline after <|im_end|>, a classic bug).
    ``compact_after``: from that turn on, re-truncate all past tool outputs to 40 characters.
    ``turns_per_version``: the learner publishes a new version every that many turns (None: one version)."""
    rng = np.random.default_rng(seed)
    sample = sample or (lambda text, i: encode(tok, text))
    outputs = outputs if outputs is not None else [f"exit_code: 0\nline {i}\n" for i in range(len(texts))]
    trial = Trial(messages=[{"role": "system", "content": "You are a terminal agent."},
                            {"role": "user", "content": "Task: count the words in /app/notes.txt."}])
    prompt = encode(tok, render(trial.messages, add_generation_prompt=True))
    for i, text in enumerate(texts):
        if compact_after is not None and i >= compact_after:
            trial.messages = [dict(m, content=truncate_output(m["content"], 40)) if m["role"] == "tool" else m
                              for m in trial.messages]
            prompt = encode(tok, render(trial.messages, add_generation_prompt=True))
        sampled = np.asarray(sample(text, i), dtype=np.int32)
        version = i // turns_per_version if turns_per_version else 0
        trial.turns.append(Turn(prompt_ids=prompt, sampled_ids=sampled,
                                sampler_logprobs=-rng.random(len(sampled)).astype(np.float32),
                                routing=traceable_routing(i, np.concatenate([prompt, sampled])),
                                policy_version=version))
        tool = {"role": "tool", "content": truncate_output(outputs[i], tool_chars)}
        trial.messages += [to_message(text), tool]
        if append_tokens:
            tail = render_chat([tool], add_generation_prompt=True)
            prompt = np.concatenate([prompt, sampled, encode(tok, tail)])
        else:
            prompt = encode(tok, render(trial.messages, add_generation_prompt=True))
    return trial
