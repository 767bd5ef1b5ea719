"""SFT warm start: oracle chats, the assistant-only loss mask, and a short fit that lowers the loss."""

from __future__ import annotations

import numpy as np
import torch

from t1_actors.policy import ModelConfig, MoEPolicy
from t1_actors.policy.chat_template import render_chat
from t1_actors.policy.tokenizer import special_token_ids, train_tokenizer
from t1_actors.tasks import generate, oracle_trajectory
from t1_actors.warmstart import (
    DONE_TEXT, OracleProducer, chat_corpus, oracle_messages, sft_example, supervised_finetune,
)


def _tokenizer(tasks):
    return train_tokenizer(chat_corpus(tasks), 400)


def test_mask_covers_exactly_the_assistant_turns():
    tasks = generate("train", 12, seed=1)
    tokenizer = _tokenizer(tasks)
    task = tasks[0]
    commands = oracle_trajectory(task)
    messages = oracle_messages(task.instruction, commands, ["out-" + str(i) for i in range(len(commands))], 240)
    ids, mask = sft_example(messages, tokenizer)
    assert len(ids) == len(mask) and mask.sum() > 0
    learned = tokenizer.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
    for command in commands:
        assert command.split()[0] in learned
    assert DONE_TEXT in learned and "<|im_end|>" in learned
    assert task.instruction not in learned and "out-0" not in learned  # user and tool turns are context only
    assert tokenizer.decode(ids.tolist(), skip_special_tokens=False) == render_chat(messages)


def test_a_short_fit_lowers_the_loss_and_reports_what_it_saw():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tasks = generate("train", 24, seed=2)
    tokenizer = _tokenizer(tasks)
    model = MoEPolicy(ModelConfig(vocab_size=400, hidden_size=48, num_layers=2, num_heads=2, num_kv_heads=1,
                                  head_dim=24, num_experts=4, top_k=2, moe_intermediate_size=48))

    def execute(task):  # the outputs are incidental here; the sandbox path is tested by the campaign
        return ["" for _ in oracle_trajectory(task)]

    pad = special_token_ids(tokenizer)["<|endoftext|>"]
    with OracleProducer(tasks, execute, tokenizer, 240, 512) as producer:
        report = supervised_finetune(model, producer, seconds=8, batch_size=8, lr=3e-3, pad_id=pad, min_examples=24)
    assert report.steps >= 3 and report.distinct_examples == 24
    assert np.mean(report.losses[-2:]) < report.losses[0] - 0.5
