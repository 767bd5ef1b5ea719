"""The harness tokenizes what a turn adds: ``IncrementalTokens`` gives exactly the ids of tokenizing the whole prompt,
whatever the chat does between calls (turns appended, old outputs dropped, a window, a template that rewrites history),
while tokenizing only the text after the last shared turn boundary."""

from __future__ import annotations

import functools
import random

import numpy as np
from _qwen3 import qwen3
from _tito_harness import project_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from t1_actors.policy.chat_template import render_chat
from t1_actors.rollout.context import drop_old_outputs, window
from t1_actors.rollout.prompt import IncrementalPrompt, IncrementalRender, IncrementalTokens, common_prefix


def t1_bpe(path_components: bool = False):
    tok = project_tokenizer(path_components=path_components)
    return lambda text: tok.encode(text).ids




@functools.cache
def cached_bpe(path_components: bool):  # True: long.toml's ([campaign] tokenizer_path_components)
    return t1_bpe(path_components)


def random_chat(rng: random.Random, turns: int) -> list[dict]:
    words = ["ls", "-la", "/app", "/app/lunar/thorn.txt",
             "cat", "notes.txt", "wc", "-l", "echo", "done", "ünïcode", "  ", "\n", "<tool_call>"]
    messages = [{"role": "system", "content": "You are a shell agent."},
                {"role": "user", "content": " ".join(rng.choices(words, k=12))}]
    for _ in range(turns):
        command = " ".join(rng.choices(words, k=rng.randint(1, 6)))
        messages.append({"role": "assistant", "content": rng.choice(["", "Let me look."]),
                         "tool_calls": [{"name": "bash", "arguments": {"command": command}}]})
        messages.append({"role": "tool", "content": "".join(rng.choices(words, k=rng.randint(0, 30)))})
    return messages


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), edits=st.lists(st.sampled_from(["append", "drop", "window", "rewrite"]),
                                                   min_size=1, max_size=12), path_components=st.booleans())
def test_incremental_ids_equal_tokenizing_the_whole_prompt(seed, edits, path_components):
    encode, rng = cached_bpe(path_components), random.Random(seed)
    tokens, rendered, messages = IncrementalTokens(encode), IncrementalRender(render_chat), random_chat(rng, 1)
    prompt = IncrementalPrompt(render_chat, encode)  # the harness's: never joins or compares the whole chat
    for edit in edits:
        if edit == "append":
            messages = messages + random_chat(rng, 1)[2:]
        elif edit == "drop":
            messages = drop_old_outputs(messages, keep_last_turns=1)[0]
        elif edit == "window":
            messages = window(messages, lambda chat: len(chat) <= 6)[0]
        else:  # a template that re-renders an old turn differently
            messages = [dict(m, content=m["content"].upper()) if i == 3 else m for i, m in enumerate(messages)]
        text = render_chat(messages, add_generation_prompt=True)
        assert rendered(messages) == text  # message by message: only the new ones (and the last shared) anew
        np.testing.assert_array_equal(tokens(text), np.asarray(encode(text), np.int32))
        np.testing.assert_array_equal(prompt(messages), np.asarray(encode(text), np.int32))


def test_a_long_trial_tokenizes_each_character_about_once():
    encode = t1_bpe()
    tokens, rng, messages, total = IncrementalTokens(encode), random.Random(3), random_chat(random.Random(3), 0), 0
    for _ in range(60):
        messages = messages + random_chat(rng, 1)[2:]
        text = render_chat(messages, add_generation_prompt=True)
        ids = tokens(text)
        total += len(text)
    np.testing.assert_array_equal(ids, np.asarray(encode(text), np.int32))
    assert tokens.tokenized_chars < 1.3 * len(text) < total / 20  # from scratch: the sum of every prompt


def test_the_harness_prompt_tokenizes_each_character_about_once_without_joining_the_chat():
    encode = t1_bpe()
    prompt, rng, messages = IncrementalPrompt(render_chat, encode), random.Random(4), random_chat(random.Random(4), 0)
    for _ in range(60):
        messages = messages + random_chat(rng, 1)[2:]
        ids = prompt(messages)
    text = render_chat(messages, add_generation_prompt=True)
    np.testing.assert_array_equal(ids, np.asarray(encode(text), np.int32))
    assert prompt.tokens.tokenized_chars < 1.3 * len(text)
    assert prompt.rendered.text_from(0) == text and prompt.rendered.text_from(1000) == text[1000:]


def test_qwen3_template_and_tokenizer_incrementally():
    tok = qwen3()
    encode, render = tok.encode, tok.apply_chat_template
    tokens, rng, messages = IncrementalTokens(encode), random.Random(5), random_chat(random.Random(5), 0)
    for _ in range(12):
        messages = messages + random_chat(rng, 1)[2:]
        text = render(messages, add_generation_prompt=True)
        np.testing.assert_array_equal(tokens(text), np.asarray(encode(text), np.int32))
    assert tokens.tokenized_chars < 2 * len(text)


def test_common_prefix():
    assert common_prefix("abcdef", "abcxyz") == 3 and common_prefix("abc", "abc") == 3 and common_prefix("", "a") == 0
    assert common_prefix("a" * 1000 + "b", "a" * 1000 + "c") == 1000
