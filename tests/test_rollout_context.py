"""Budgets and context management: every finish, cut and edit of a trial is counted, the edited prompt fits,
the instruction and the last turn survive every edit, and TITO trains the edited prompt as a new chunk."""

from __future__ import annotations

import json

import numpy as np
import pytest
import trio

from schemas import ContextEdited, TrialEnded, TrialIssued
from t1_actors import tito
from t1_actors.policy.chat_template import render_chat
from t1_actors.policy.generation import Generation
from t1_actors.rollout import RolloutLimits, ToolOutcome, run_trial
from t1_actors.rollout.context import DROPPED_OUTPUT, drop_old_outputs, fit_context, turn_starts, window
from t1_actors.rollout.endings import trial_endings

INSTRUCTION = "Find the file that names the next one, and follow the chain to the end."


def encode(text: str) -> list[int]:  # one id per byte: a real, reversible tokenizer for the harness's arithmetic
    return list(text.encode())


def decode(ids: list[int]) -> str:
    return bytes(ids).decode(errors="replace")


def tool_call(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"


def scripted_agent(texts, *, finish_reason="stop"):
    """A sample port answering turn i with ``texts[i]`` (the last one repeated), routing recorded per position."""

    async def sample(prompt_ids: np.ndarray, turn: int) -> Generation:
        ids = np.asarray(encode(texts[min(turn, len(texts) - 1)]), dtype=np.int32)
        rows = np.zeros((len(prompt_ids) + len(ids) - 1, 1, 1), dtype=np.uint8)
        return Generation(prompt_len=len(prompt_ids), output_ids=ids, logprobs=np.full(len(ids), -0.5, np.float32),
                          routing=rows, finish_reason=finish_reason)

    return sample


def shell(output: str):
    async def execute(command: str, turn: int) -> ToolOutcome:
        return ToolOutcome(exit_code=0, output=f"{output} (turn {turn})")

    return execute


def play(limits: RolloutLimits, *, texts=None, output="x" * 60):
    texts = texts or [tool_call(f"cat /app/step{i}.txt") for i in range(3)]
    return trio.run(lambda: run_trial(INSTRUCTION, sample=scripted_agent(texts), execute=shell(output),
                                      encode=encode, decode=decode, limits=limits))


def prompt_of(messages):
    return np.asarray(encode(render_chat(messages, add_generation_prompt=True)), dtype=np.int32)


def chat(turns: int, output: str = "o" * 50):
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": INSTRUCTION}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"name": "bash", "arguments": {"command": f"cat {i}"}}]}, {"role": "tool", "content": f"{i}:{output}"}]
    return messages


def test_drop_old_outputs_keeps_the_instruction_and_the_last_turns_outputs():
    messages = chat(5)
    edited, n = drop_old_outputs(messages, keep_last_turns=2)
    assert n == 3 and edited[:2] == messages[:2]
    outputs = [m["content"] for m in edited if m["role"] == "tool"]
    assert outputs[:3] == [DROPPED_OUTPUT] * 3 and outputs[3:] == [messages[-3]["content"], messages[-1]["content"]]
    assert drop_old_outputs(edited, keep_last_turns=2) == (edited, 0)  # nothing left to drop
    assert drop_old_outputs(chat(2), keep_last_turns=2)[1] == 0


def test_window_keeps_the_instruction_and_the_most_recent_turns_that_fit():
    messages = chat(6)
    budget = len(prompt_of(messages[:2] + messages[-6:]))  # room for the last three turns exactly
    edited, removed = window(messages, lambda c: len(prompt_of(c)) <= budget)
    assert edited == messages[:2] + messages[-6:] and removed == 6
    assert len(turn_starts(edited)) == 3


@pytest.mark.parametrize("strategy", ["end", "drop_old_outputs", "window"])
def test_fit_context_edits_only_when_the_prompt_is_too_long_and_the_result_fits(strategy):
    messages = chat(6)
    full = len(prompt_of(messages))
    assert fit_context(messages, prompt_of, budget=full, strategy=strategy, keep_last_turns=1, turn=6)[2] is None
    fitted = fit_context(messages, prompt_of, budget=full - 40, strategy=strategy, keep_last_turns=1, turn=6)
    if strategy == "end":
        assert fitted is None
        return
    edited, prompt, edit = fitted
    assert len(prompt) <= full - 40 and edit.tokens_before == full and edit.tokens_after == len(prompt)
    assert edit.strategy == strategy and edit.turn == 6 and edit.messages_edited > 0
    assert edited[:2] == messages[:2] and edited[-2:] == messages[-2:]  # instruction and last turn survive
    assert fit_context(messages, prompt_of, budget=10, strategy=strategy, keep_last_turns=1, turn=6) is None


@pytest.mark.parametrize("strategy", ["window", "drop_old_outputs"])
def test_a_trial_that_outgrows_its_context_is_edited_logged_and_trained_as_a_new_chunk(strategy):
    limits = RolloutLimits(max_turns=8, max_new_tokens=80, max_context=1200, tool_output_chars=240,
                           context_strategy=strategy, keep_last_turns=1)
    rollout = play(limits, output="x" * 300)
    ended = play(RolloutLimits(**{**limits.__dict__, "context_strategy": "end"}), output="x" * 300)
    assert ended.finish == "context" and not ended.context_edits
    assert rollout.context_edits and len(rollout.turns) > len(ended.turns)  # the edits bought turns
    if strategy == "window":  # dropping outputs alone cannot outlast a chat of ever more tool calls
        assert rollout.finish == "max_turns" and len(rollout.turns) == 8
    assert all(e.tokens_after <= 1200 - 80 < e.tokens_before for e in rollout.context_edits)
    assert rollout.truncations["tool_output"] == len(rollout.turns)  # every 300-character output cut, and counted
    for turn in rollout.turns:
        assert len(turn.prompt_ids) + limits.max_new_tokens <= limits.max_context
    chunks = tito.assemble(rollout.turns, tokenizer=None, reward=0.5, repairs=())
    opened = {c.turns[0] for c in chunks[1:]}
    assert {e.turn for e in rollout.context_edits} <= opened  # an edited prompt opens a chunk of the same trial
    assert all(c.reward == 0.5 for c in chunks)


def test_without_a_strategy_a_full_context_ends_the_trial_as_context():
    rollout = play(RolloutLimits(max_turns=8, max_new_tokens=80, max_context=900, tool_output_chars=400))
    assert rollout.finish == "context" and 1 <= len(rollout.turns) < 8 and not rollout.context_edits


def test_a_spent_token_budget_ends_the_trial_and_a_cut_turn_is_counted():
    rollout = play(RolloutLimits(max_turns=8, max_new_tokens=80, max_context=4000, max_total_new_tokens=100))
    assert rollout.finish == "token_budget" and rollout.tokens >= 100 and len(rollout.turns) == 2
    cut = trio.run(lambda: run_trial(INSTRUCTION, sample=scripted_agent(["partial answer"], finish_reason="length"),
                                     execute=shell("-"), encode=encode, decode=decode, limits=RolloutLimits()))
    assert cut.truncations["turn_tokens"] == 1


def test_a_turn_cut_at_max_new_tokens_ends_its_trial_as_turn_tokens_not_answered():
    """The cut turn ends the trial (its text is no answer, its tool call never runs): summary.json's ``finishes``
    tells it from an answer, and ``truncations`` counts the cut."""
    cut = trio.run(lambda: run_trial(INSTRUCTION, sample=scripted_agent(["partial answer"], finish_reason="length"),
                                     execute=shell("-"), encode=encode, decode=decode, limits=RolloutLimits()))
    assert cut.finish == "turn_tokens" and len(cut.turns) == 1 and cut.truncations == {"turn_tokens": 1}
    answered = trio.run(lambda: run_trial(INSTRUCTION, sample=scripted_agent(["done"]), execute=shell("-"),
                                          encode=encode, decode=decode, limits=RolloutLimits()))
    assert answered.finish == "answered" and not answered.truncations


def test_endings_are_counted_per_split_from_the_log():
    events = [TrialIssued(trial_id="a", task_id="t", split="train", policy_version_wanted=0),
              TrialIssued(trial_id="b", task_id="t", split="eval", policy_version_wanted=0),
              ContextEdited(trial_id="a", turn=3, strategy="window", tokens_before=900, tokens_after=500,
                            messages_edited=4),
              TrialEnded(trial_id="a", finish="max_turns", truncations={"tool_output": 2}, context_edits=1),
              TrialEnded(trial_id="b", finish="context"),
              TrialEnded(trial_id="c", finish="turn_tokens", truncations={"turn_tokens": 1})]
    endings = trial_endings(enumerate(events))
    assert endings["finishes"] == {"eval": {"context": 1}, "train": {"max_turns": 1}, "unknown": {"turn_tokens": 1}}
    assert endings["truncations"] == {"eval": {}, "train": {"tool_output": 2}, "unknown": {"turn_tokens": 1}}
    assert endings["context_edits"] == {"train": {"window": 1}}
