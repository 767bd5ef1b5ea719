"""SFT examples on Qwen3's real chat template (t1_actors.warmstart.chats): reasoning derived from the oracle, the loss on
each assistant turn as the template rendered it when it was produced, one sequence unless the template re-renders
history; and the pieces the Qwen3 campaign adds around it (the [campaign] tokenizer rule, the run's tokenizer
directory, the replay tools' boundary figures, SFT's loss on masked positions only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _qwen3 import qwen3, qwen3_dir

from t1_actors import tito
from t1_actors.policy import MoEPolicy
from t1_actors.policy.chat_tokenizer import BASH_TOOL
from t1_actors.schedule import CampaignConfig
from t1_actors.tasks import generate, oracle_trajectory
from t1_actors.warmstart.chats import (
    final_reasoning,
    oracle_chat,
    produced_turns,
    step_reasoning,
    turn_examples,
)
from t1_actors.warmstart.finetune import assistant_spans, pad_batch, sft_loss

FOLLOW_UP = "Now print the word count of the file."


@pytest.fixture(scope="module")
def tok():
    return qwen3()


@pytest.fixture(scope="module")
def tasks():
    return generate("train", 12, seed=5)


def _chat(task, outputs=None):
    commands = oracle_trajectory(task)
    return oracle_chat(task.instruction, commands, outputs or [f"out {i}\n" for i in range(len(commands))], 240)


def test_reasoning_is_derived_from_the_oracle_command():
    assert step_reasoning("chmod 600 /app/a.txt", 0, 2) == "Step 1 of 2: chmod on /app/a.txt."
    assert step_reasoning("head -n 3 /app/in.txt > /app/out.txt", 1, 3) == "Step 2 of 3: head on /app/out.txt."
    assert step_reasoning("ls", 0, 1) == "Step 1 of 1: ls."
    assert step_reasoning("echo 'unbalanced", 0, 1) == "Step 1 of 1: echo."
    assert final_reasoning(1) == "All 1 command ran; the task is done."


def test_one_query_chat_is_one_sequence_with_every_turn_as_produced(tok, tasks):
    for task in tasks:
        chat = _chat(task)
        turns = produced_turns(chat, tok)
        assistant = [m for m in chat if m["role"] == "assistant"]
        assert len(turns) == len(assistant) == len(oracle_trajectory(task)) + 1
        examples = turn_examples(chat, tok)
        assert len(examples) == 1  # Qwen3 keeps the reasoning of every turn after the last user query: strict
        ids, mask = examples[0]
        # the loss region is exactly the produced turns, in order, each a <think> block + call (or done) + <|im_end|>
        np.testing.assert_array_equal(ids[mask > 0], np.concatenate([t.sampled_ids for t in turns]))
        for turn, message in zip(turns, assistant):
            text = tok.decode(turn.sampled_ids)
            assert text.startswith(f"<think>\n{message['reasoning_content']}\n</think>\n\n") and text.endswith("<|im_end|>")
            if "tool_calls" in message:
                assert message["tool_calls"][0]["arguments"]["command"] in text and "<tool_call>" in text
        # and the whole sequence is the template's render of the whole chat (no newline after the last <|im_end|>)
        whole = tok.apply_chat_template(chat, tools=[BASH_TOOL])
        assert tok.decode(ids) == whole.removesuffix("\n")


def test_a_follow_up_query_strips_past_reasoning_and_splits_the_sequence(tok, tasks):
    task = tasks[0]
    chat = _chat(task) + [{"role": "user", "content": FOLLOW_UP},
                          {"role": "assistant", "content": "done", "reasoning_content": "Nothing more to run."}]
    with pytest.raises(ValueError, match="prefix"):  # why warmstart's one-render spans cannot be used here
        assistant_spans(chat, tok.apply_chat_template)
    turns = produced_turns(chat, tok)
    examples = turn_examples(chat, tok)
    assert len(examples) == 2
    # each loss span sits right after exactly the prompt the sampler saw at its turn
    chunks = tito.assemble(turns, tok, reward=0.0, repairs=())
    for chunk in chunks:
        for span in chunk.loss_spans:
            np.testing.assert_array_equal(chunk.token_ids[:span.start], turns[span.turn].prompt_ids)
    last_prompt = tok.decode(turns[-1].prompt_ids)
    assert "Step 1 of" not in last_prompt  # the earlier turns' reasoning is gone from the re-render
    assert "Step 1 of" in tok.decode(examples[0][0])


def test_sft_loss_on_masked_positions_equals_the_full_head_loss(tiny_model):
    torch.manual_seed(0)
    model = MoEPolicy(tiny_model(vocab_size=97, num_experts=4, moe_intermediate_size=32))
    rng = np.random.default_rng(0)
    examples = [(rng.integers(1, 97, n), (rng.random(n) < 0.4).astype(np.float32)) for n in (9, 14, 5)]
    ids, mask, attention = pad_batch(examples, pad_id=0)
    logits = model(ids[:, :-1], attention_mask=attention[:, :-1]).logits
    nll = F.cross_entropy(logits.reshape(-1, 97), ids[:, 1:].reshape(-1), reduction="none")
    reference = (nll * mask[:, 1:].reshape(-1)).sum() / mask[:, 1:].sum()
    torch.testing.assert_close(sft_loss(model, ids, mask, attention), reference, rtol=1e-5, atol=1e-6)


def test_campaign_tokenizer_rule_names_the_key_and_the_fix(tmp_path):
    from t1_actors.job.config import load_config

    body = "[[actors]]\nname = \"staleness-0\"\nrole = \"staleness\"\n"
    missing = tmp_path / "qwen3-tokenizer"
    (tmp_path / "a.toml").write_text(f"[campaign]\ntokenizer = \"{missing}\"\n{body}")
    with pytest.raises(Exception, match=r"\[campaign\] tokenizer.*fetch-qwen3-tokenizer"):
        load_config(tmp_path / "a.toml")
    (tmp_path / "b.toml").write_text(f"[campaign]\ntokenizer = \"{qwen3_dir()}\"\n{body}")
    assert load_config(tmp_path / "b.toml").section(CampaignConfig).tokenizer == str(qwen3_dir())
    (tmp_path / "c.toml").write_text(f"[campaign]\ntokenizer = \"{qwen3_dir()}\"\nwarm_start_from = \"{tmp_path}\"\n{body}")
    with pytest.raises(Exception, match="warm_start_from"):
        load_config(tmp_path / "c.toml")


def test_the_run_keeps_the_hf_tokenizer_and_replay_reads_a_directory(tmp_path, tok):
    from t1_actors.job.sft import copy_run_tokenizer
    from t1_actors.layout import tokenizer_path
    from tools._replay.run import RunError, RunView

    loaded = copy_run_tokenizer(tmp_path, qwen3_dir())
    assert tokenizer_path(tmp_path) == tmp_path / "tokenizer" and loaded.chat_template == tok.chat_template
    chat = _chat(generate("train", 1, seed=1)[0])
    assert loaded.apply_chat_template(chat) == tok.apply_chat_template(chat)
    view = RunView.__new__(RunView)  # only the tokenizer lookup is exercised
    view.root = tmp_path
    assert view.tokenizer(str(qwen3_dir())).get_vocab_size() == 151669
    assert view.tokenizer().get_vocab_size() == 151669  # RUN/tokenizer/tokenizer.json
    with pytest.raises(RunError, match="no such file or directory"):
        view.tokenizer(str(tmp_path / "nowhere"))


def test_boundary_figures_count_cases_reasoning_and_template_changes(tok, tasks):
    from tools._replay.boundaries import boundary_report, changed_tokens

    task = tasks[0]
    chat = _chat(task) + [{"role": "user", "content": FOLLOW_UP},
                          {"role": "assistant", "content": "done", "reasoning_content": "Nothing more to run."}]
    turns = produced_turns(chat, tok)
    n = len(turns)
    assert all(changed_tokens(a.prompt_ids, a.sampled_ids, b.prompt_ids) == (0, 0) for a, b in zip(turns[:-2], turns[1:-1]))
    beyond, diff = changed_tokens(turns[-2].prompt_ids, turns[-2].sampled_ids, turns[-1].prompt_ids)
    assert 0 < diff <= beyond
    chunks = tito.assemble(turns, tok, reward=0.0, repairs=())

    class Logged:  # the fields of SamplerTurn / TrajectoryAssembled the report reads
        def __init__(self, **kw):
            self.__dict__.update(kw)

    logged_turns = [Logged(turn=i, prompt_ids=t.prompt_ids, sampled_ids=t.sampled_ids) for i, t in enumerate(turns)]
    logged_chunks = [Logged(boundary_cases=list(c.boundary_cases)) for c in chunks]
    report = boundary_report({"t": logged_chunks}, {"t": logged_turns}, tok.backend_tokenizer)
    assert report["multi_turn"] == report["multi_turn_with_reasoning"] == report["multi_turn_reasoning_every_turn"] == 1
    assert report["repair_cases"] == {"strict": n - 2, "normalized": 0, "retokenized": 0, "split": 1, "version": 0}
    assert report["classified"] == report["repair_cases"]  # stripped reasoning deep in history: no repair holds
    assert report["template_changes"]["text_changed"] == 1
    assert report["template_changes"]["changed"] == 1 and report["template_changes"]["diff_tokens"]["max"] == diff
    no_think = [Logged(turn=t.turn, prompt_ids=t.prompt_ids, sampled_ids=t.sampled_ids[3:]) for t in logged_turns]
    assert boundary_report({"t": logged_chunks}, {"t": no_think}, tok.backend_tokenizer)["multi_turn_with_reasoning"] == 0
    last_without = logged_turns[:-1] + [no_think[-1]]  # the last turn is re-rendered by no boundary
    only_last = boundary_report({"t": logged_chunks}, {"t": last_without}, tok.backend_tokenizer)
    assert only_last["multi_turn_with_reasoning"] == 1 and only_last["multi_turn_reasoning_every_turn"] == 0
    assert only_last["turns_with_reasoning"] == {"turns": n, "with_reasoning": n - 1}
