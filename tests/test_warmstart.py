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


def test_the_short_phase_draws_the_short_chats_alone_then_all_with_a_fresh_schedule(tiny_model, monkeypatch):
    from t1_actors.warmstart import finetune
    from t1_actors.warmstart.finetune import SFTPhase

    torch.set_num_threads(1)
    # each example its own token, so a batch is known by its ids; 20-token chats and 120-token ones
    examples = [(np.full(n, 1 + k, dtype=np.int64), np.ones(n, dtype=np.float32))
                for k, n in enumerate([20] * 30 + [120] * 30)]
    assert finetune.short_chats(examples, 4) == examples[:30] and finetune.short_chats(examples, 1) == examples
    batches: list[tuple[int, frozenset[int]]] = []
    rates: list[float] = []
    real_loss = finetune.sft_loss

    def spy(model, ids, *rest):
        batches.append((ids.shape[1], frozenset(ids[:, 0].tolist())))
        return real_loss(model, ids, *rest)

    monkeypatch.setattr(finetune, "sft_loss", spy)
    real_rate = finetune.sft_learning_rate
    monkeypatch.setattr(finetune, "sft_learning_rate", lambda *a: rates.append(real_rate(*a)) or rates[-1])
    model = MoEPolicy(tiny_model(vocab_size=64, hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
                                 head_dim=16, num_experts=2, top_k=1))
    seen_after_short: list[int] = []
    whole, short = finetune.two_phase_finetune(
        model, examples, short=SFTPhase(6, 4, 2), main=SFTPhase(12, 8, 0), seconds=60, lr=1e-3, pad_id=0,
        buckets=2, after_short=lambda report: seen_after_short.append(len(batches)))
    assert seen_after_short == [6] and short is not None and short.steps == 6 and short.examples_seen == 24
    widths = [width for width, _ in batches]
    assert widths[:6] == [20] * 6 and 120 in widths[6:]  # the long chats only after the short phase
    assert [len(ids) for _, ids in batches] == [4] * 6 + [8] * 12  # each phase its own batch size
    assert batches[0][1] == batches[2][1] == batches[4][1]  # the short phase's anchor every 2nd step
    assert len({ids for _, ids in batches[6:]}) == 12  # anchor_every 0: every batch of the main phase fresh
    assert rates[6] == rates[0] == real_rate(1e-3, 0, 0.0) != rates[5]  # the main phase starts its warm-up again
    assert (whole.steps, whole.examples_seen, whole.distinct_examples) == (18, 24 + 96, 60)
    assert whole.losses[:6] == short.losses and short.tokens == short.positions == 6 * 4 * 20
    with pytest.raises(ValueError, match="buckets must be >= 2"):
        finetune.two_phase_finetune(model, examples, short=SFTPhase(2, 4, 0), main=SFTPhase(2, 4, 0), seconds=1,
                                    lr=1e-3, pad_id=0, buckets=0)


def test_one_phase_draws_every_bucket_from_the_start(tiny_model, monkeypatch):
    from t1_actors.warmstart import finetune
    from t1_actors.warmstart.finetune import SFTPhase

    torch.set_num_threads(1)
    examples = [(np.ones(n, dtype=np.int64), np.ones(n, dtype=np.float32)) for n in [20] * 30 + [120] * 30]
    widths: list[int] = []
    real_loss = finetune.sft_loss
    monkeypatch.setattr(finetune, "sft_loss", lambda model, ids, *rest: widths.append(ids.shape[1]) or
                        real_loss(model, ids, *rest))
    model = MoEPolicy(tiny_model(vocab_size=64, hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1,
                                 head_dim=16, num_experts=2, top_k=1))
    whole, short = finetune.two_phase_finetune(model, examples, short=None, main=SFTPhase(6, 8, 2), seconds=60,
                                               lr=1e-3, pad_id=0, buckets=2)
    assert short is None and whole.steps == 6 and widths[2] == 120  # step 2's anchor is the long bucket's


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
