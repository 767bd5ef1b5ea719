"""SFT under random names (warmstart.rename): a consistent permutation of the corpus's vocabularies over a whole
chat, rendered again on t1's template; the short phase's fresh batches renamed, its anchor batches not."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from t1_actors.job.config import CampaignConfig
from t1_actors.policy import MoEPolicy
from t1_actors.policy.chat_template import render_chat
from t1_actors.policy.tokenizer import train_tokenizer
from t1_actors.tasks import generate, oracle_trajectory
from t1_actors.tasks.synthetic import RENAMEABLE
from t1_actors.warmstart import finetune
from t1_actors.warmstart.finetune import OracleExample, SFTPhase, chat_corpus, oracle_examples, oracle_messages
from t1_actors.warmstart.rename import RenamedExamples, Renamer


def test_one_permutation_per_vocabulary_over_every_text_whole_words_only():
    renamer = Renamer([["oak", "pine", "fern"], ["red", "blue"]])
    rng = random.Random(0)
    seen = set()
    for _ in range(40):
        a, b, c = renamer(["cp /app/oak.txt /app/pine/", "oak pine oaks fern", "sed 's/red/blue/' | grep red"], rng)
        first = re.fullmatch(r"cp /app/(\w+)\.txt /app/(\w+)/", a)
        assert first and {first[1], first[2]} <= {"oak", "pine", "fern"} and first[1] != first[2]
        assert b.split()[:2] == [first[1], first[2]] and b.split()[2] == "oaks"  # the same renaming in each text
        assert {b.split()[3], first[1], first[2]} == {"oak", "pine", "fern"}  # a permutation, names stay names
        word = re.fullmatch(r"sed 's/(\w+)/(\w+)/' \| grep (\w+)", c)
        assert word and word[1] == word[3] and {word[1], word[2]} == {"red", "blue"}
        seen.add((first[1], word[1]))
    assert len(seen) == 6  # every name and word can land anywhere
    with pytest.raises(ValueError, match="two vocabularies"):
        Renamer([["salt"], ["salt", "tea"]])


def test_the_corpus_vocabularies_leave_shell_words_alone():
    names, words = RENAMEABLE
    assert not set(names) & set(words) and {"cat", "tree", "root"}.isdisjoint(names + words)
    assert len(names) > 50 and len(words) > 30


def test_a_renamed_oracle_chat_is_the_same_chat_under_other_names():
    tasks = generate("train", 24, seed=3, families=["pipeline", "copy_rename", "explore"])
    tokenizer = train_tokenizer(chat_corpus(tasks), 400)
    renamed = RenamedExamples(Renamer(RENAMEABLE), tokenizer, 240)
    for task in tasks[:3]:
        commands = oracle_trajectory(task)
        outputs = [f"printed by step {i}: {command}" for i, command in enumerate(commands)]
        (example,) = oracle_examples(task, outputs, tokenizer, tool_output_chars=240)
        assert isinstance(example, OracleExample) and example.commands == commands
        ids, mask = renamed(example, random.Random(1))
        text = tokenizer.decode(ids.tolist(), skip_special_tokens=False)
        original = render_chat(oracle_messages(task.instruction, commands, outputs, 240))
        assert text != original and len(re.findall(r"\b\w+\b", text)) == len(re.findall(r"\b\w+\b", original))
        # a word of the chat that is not in the vocabularies is untouched, and every renamed word maps one way
        pairs = set(zip(re.findall(r"\b\w+\b", original), re.findall(r"\b\w+\b", text)))
        vocabulary = set(RENAMEABLE[0]) | set(RENAMEABLE[1])
        assert all(a == b for a, b in pairs if a not in vocabulary)
        assert len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs})
        assert mask.sum() > 0 and len(mask) == len(ids)  # the assistant turns are still what it learns
        learned = tokenizer.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
        assert learned.count("<|im_end|>") == len(commands) + 1
    plain = (np.ones(3, dtype=np.int64), np.ones(3, dtype=np.float32))
    assert renamed(plain, random.Random(0)) is plain  # an example without its chat is trained as it is


def test_the_short_phase_renames_its_fresh_batches_and_never_an_anchor(tiny_model, monkeypatch):
    torch.set_num_threads(1)
    examples = [(np.full(n, 1 + k, dtype=np.int64), np.ones(n, dtype=np.float32))
                for k, n in enumerate([20] * 30 + [120] * 30)]
    first_ids: list[set[int]] = []
    real_loss = finetune.sft_loss
    monkeypatch.setattr(finetune, "sft_loss", lambda model, ids, *rest: first_ids.append(set(ids[:, 0].tolist()))
                        or real_loss(model, ids, *rest))
    marked = 63  # a rewritten example starts with this token

    def mark(example, rng):
        ids, mask = example
        return np.concatenate([[marked], ids[1:]]), mask

    model = MoEPolicy(tiny_model(vocab_size=64, hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
                                 head_dim=16, num_experts=2, top_k=1))
    finetune.two_phase_finetune(model, examples, short=SFTPhase(6, 4, 2), main=SFTPhase(4, 4, 0), seconds=60,
                                lr=1e-3, pad_id=0, buckets=2, short_rewrite=mark)
    assert [marked in ids for ids in first_ids[:6]] == [False, True] * 3  # anchors (even steps) keep their ids
    assert all(ids == {marked} for ids in first_ids[1:6:2])
    assert not any(marked in ids for ids in first_ids[6:])  # the main phase trains every chat as it is


def test_renaming_is_refused_without_a_short_phase_or_with_an_hf_template():
    base = {"sft_length_buckets": 4, "sft_short_steps": 10}
    assert CampaignConfig(**base, sft_rename="short").sft_rename == "short"
    with pytest.raises(ValidationError, match="sft_short_steps"):
        CampaignConfig(sft_rename="short")
    with pytest.raises(ValidationError, match="own template"):
        CampaignConfig(**base, sft_rename="short", tokenizer="/models/qwen3")
