"""SFT warm start: oracle chats, the assistant-only loss mask, and a short fit that lowers the loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from t1_actors.policy import MoEPolicy
from t1_actors.policy.chat_template import render_chat
from t1_actors.policy.tokenizer import special_token_ids, train_tokenizer
from t1_actors.tasks import generate, oracle_trajectory
from t1_actors.warmstart.finetune import (
    DONE_TEXT,
    chat_corpus,
    execute_oracle_pool,
    length_buckets,
    oracle_messages,
    sft_example,
    supervised_finetune,
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


def test_a_short_fit_lowers_the_loss_and_reports_what_it_saw(tiny_model):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tasks = generate("train", 24, seed=2)
    tokenizer = _tokenizer(tasks)
    model = MoEPolicy(tiny_model(wide=True, vocab_size=400, hidden_size=48, head_dim=24, moe_intermediate_size=48))

    def execute(task):  # the outputs are incidental here; the sandbox path is tested by the campaign
        return ["" for _ in oracle_trajectory(task)]

    def flaky(task):  # one infrastructure failure costs one example, never the pool
        return None if task is tasks[5] else execute(task)

    pad = special_token_ids(tokenizer)["<|endoftext|>"]
    seen = []
    examples, failures = execute_oracle_pool(tasks, flaky, tokenizer, tool_output_chars=240, max_len=512,
                                             workers=2, progress=lambda done, total: seen.append((done, total)))
    assert failures == 1 and len(examples) == 23 and seen[-1] == (24, 24)
    report = supervised_finetune(model, examples, seconds=8, batch_size=8, lr=3e-3, pad_id=pad)
    assert report.steps >= 3 and report.distinct_examples == 23
    assert report.epochs == report.examples_seen / 23
    assert np.mean(report.losses[-2:]) < report.losses[0] - 0.5


def test_an_empty_pool_is_a_clear_error(tiny_model):
    model = MoEPolicy(tiny_model(vocab_size=64, hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
                                 head_dim=16, num_experts=2, top_k=1))
    try:
        supervised_finetune(model, [], seconds=1, batch_size=2, lr=1e-3, pad_id=0)
    except RuntimeError as exc:
        assert "no oracle example" in str(exc)
    else:
        raise AssertionError("an empty pool must not train")


def test_the_anchor_batch_is_one_fixed_batch_the_model_memorises(tiny_model):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tasks = generate("train", 24, seed=4)
    tokenizer = _tokenizer(tasks)
    examples = [sft_example(oracle_messages(t.instruction, oracle_trajectory(t), ["" for _ in oracle_trajectory(t)],
                                            240), tokenizer) for t in tasks]
    model = MoEPolicy(tiny_model(wide=True, vocab_size=400, hidden_size=48, head_dim=24, moe_intermediate_size=48))
    pad = special_token_ids(tokenizer)["<|endoftext|>"]
    # anchor_every = 1: every step is the same 4-example batch, so its loss keeps falling step after step
    report = supervised_finetune(model, examples, seconds=6, batch_size=4, lr=3e-3, pad_id=pad, anchor_every=1)
    assert report.steps >= 10 and report.examples_seen == 4 * report.steps
    assert report.losses[-1] < report.losses[0] - 1.0  # measured under load at 10 steps: 5.98 -> 3.23
    with pytest.raises(ValueError, match="anchor_every must be >= 0"):
        supervised_finetune(model, examples, seconds=1, batch_size=4, lr=1e-3, pad_id=pad, anchor_every=-1)


def test_length_buckets_cut_batches_that_pad_less(tiny_model):
    torch.set_num_threads(1)
    # a pool of short and long chats, as long.toml's single-turn and long families give
    examples = [(np.ones(n, dtype=np.int64), np.ones(n, dtype=np.float32)) for n in [20] * 30 + [120] * 30]
    groups = length_buckets(examples, 2)
    assert [len(g) for g in groups] == [30, 30] and {len(ids) for ids, _ in groups[0]} == {20}
    assert sum(len(g) for g in length_buckets(examples, 7)) == 60 and len(length_buckets(examples[:3], 8)) == 3

    def padding(buckets: int) -> float:
        torch.manual_seed(0)
        model = MoEPolicy(tiny_model(vocab_size=64, hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
                                     head_dim=16, num_experts=2, top_k=1))
        return supervised_finetune(model, examples, seconds=60, steps=12, batch_size=8, lr=1e-3, pad_id=0,
                                   buckets=buckets).padding

    # random batches of the mix pad most short rows to 120; batches within a bucket never pad here
    assert padding(0) > 0.3 and padding(2) == 0.0
    with pytest.raises(ValueError, match="buckets must be >= 0"):
        padding(-1)


def test_short_first_opens_the_buckets_shortest_first(tiny_model, monkeypatch):
    from t1_actors.warmstart import finetune

    assert [finetune.open_buckets(4, p, 0.5) for p in (0.0, 0.49, 0.5, 1.0)] == [2, 2, 4, 4]
    assert finetune.open_buckets(3, 0.1, 0.5) == 1 and finetune.open_buckets(2, 0.1, 0.5) == 1
    assert finetune.open_buckets(4, 0.0, 0.0) == 4  # off: every bucket from the start
    torch.set_num_threads(1)
    examples = [(np.ones(n, dtype=np.int64), np.ones(n, dtype=np.float32)) for n in [20] * 30 + [120] * 30]
    widths: list[int] = []
    real_loss = finetune.sft_loss
    monkeypatch.setattr(finetune, "sft_loss", lambda model, ids, *rest: widths.append(ids.shape[1]) or
                        real_loss(model, ids, *rest))

    def batch_widths(short_first: float) -> list[int]:
        widths.clear()
        torch.manual_seed(0)
        model = MoEPolicy(tiny_model(vocab_size=64, hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
                                     head_dim=16, num_experts=2, top_k=1))
        finetune.supervised_finetune(model, examples, seconds=60, steps=12, batch_size=8, lr=1e-3, pad_id=0,
                                     buckets=2, short_first=short_first)
        return list(widths)

    early, late = batch_widths(0.5)[:6], batch_widths(0.5)[6:]
    assert early == [20] * 6 and late[0] == 120  # the long half joins at half the budget (its anchor first)
    assert 120 in batch_widths(0.0)[:6]  # off: both buckets from the start (step 2's anchor is the long one)
    with pytest.raises(ValueError, match="needs buckets > 0"):
        finetune.supervised_finetune(MoEPolicy(tiny_model()), examples, seconds=1, batch_size=4, lr=1e-3, pad_id=0,
                                     short_first=0.5)


def test_anchor_steps_in_the_short_phase_only_leave_the_mixed_phase_fresh(tiny_model, monkeypatch):
    from t1_actors.warmstart import finetune

    torch.set_num_threads(1)
    # each example its own token, so a batch is known by its ids
    examples = [(np.full(n, 1 + k, dtype=np.int64), np.ones(n, dtype=np.float32))
                for k, n in enumerate([20] * 30 + [120] * 30)]
    batches: list[frozenset[int]] = []
    real_loss = finetune.sft_loss
    monkeypatch.setattr(finetune, "sft_loss", lambda model, ids, *rest: batches.append(
        frozenset(ids[:, 0].tolist())) or real_loss(model, ids, *rest))

    def steps_of(anchor_phases: str) -> list[frozenset[int]]:
        batches.clear()
        model = MoEPolicy(tiny_model(vocab_size=64, hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
                                     head_dim=16, num_experts=2, top_k=1))
        finetune.supervised_finetune(model, examples, seconds=60, steps=12, batch_size=8, lr=1e-3, pad_id=0,
                                     buckets=2, short_first=0.5, anchor_every=2, anchor_phases=anchor_phases)
        return list(batches)

    everywhere, short_only = steps_of("all"), steps_of("short")
    # the short phase (steps 0-5): the short bucket's anchor at steps 0, 2, 4 either way
    assert everywhere[0] == everywhere[2] == everywhere[4] and short_only[0] == short_only[2] == short_only[4]
    # the mixed phase: "all" trains the long anchor at steps 6 and 10; "short" draws both fresh
    assert everywhere[6] == everywhere[10]
    assert short_only[6] != short_only[10] and short_only[6] != everywhere[6]
    with pytest.raises(ValueError, match="anchor_phases"):
        finetune.supervised_finetune(MoEPolicy(tiny_model()), examples, seconds=1, batch_size=4, lr=1e-3, pad_id=0,
                                     buckets=2, anchor_phases="short")


def test_a_warm_start_fitted_on_this_runs_rl_tasks_is_refused(tmp_path):
    import json

    from t1_actors.job.sft import check_warm_start_tasks
    from t1_actors.tasks import TasksConfig, build_task_sets

    def previous_run(name, **tasks):
        run = tmp_path / name
        run.mkdir()
        (run / "config.resolved.json").write_text(json.dumps({"tasks": {"seed": 0, "eval_size": 4, **tasks}}))
        return run

    carved = build_task_sets(TasksConfig(train_size=48, eval_size=4, rl_size=16))
    check_warm_start_tasks(previous_run("sft-on-32", train_size=32), carved)  # saw train[:32]: disjoint from RL
    check_warm_start_tasks(previous_run("same-split", train_size=48, rl_size=16), carved)
    with pytest.raises(ValueError, match="fitted on 16 of this run's 16 RL tasks"):
        check_warm_start_tasks(previous_run("sft-on-all", train_size=48), carved)
    with pytest.raises(ValueError, match="cannot tell which tasks its SFT saw"):
        check_warm_start_tasks(tmp_path / "nowhere", carved)
    # no carve-out asked for: nothing to protect
    check_warm_start_tasks(tmp_path / "nowhere", build_task_sets(TasksConfig(train_size=48, eval_size=4)))
