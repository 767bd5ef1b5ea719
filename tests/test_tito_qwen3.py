"""TITO on Qwen3's real chat template: multi-turn agent chats with <think> blocks and tool calls (oracle commands
of synthetic tasks), each scenario of ``_qwen3_tito`` landing in the boundary case the template's re-render forces,
and the loss region holding exactly the sampled ids in the contexts the sampler saw (drift 0)."""

from __future__ import annotations

import numpy as np
import pytest
from _qwen3 import qwen3
from _qwen3_tito import SCENARIOS, changed_tokens, measure, play

from t1_actors import tito
from t1_actors.tasks import generate, oracle_trajectory

# scenario -> the case of every boundary (follow_up: strict until the second query, split into it)
EXPECTED = {"thinking": "strict", "noncanonical": "retokenized", "padded_think": "split", "empty_think": "split",
            "no_thinking": "normalized"}


@pytest.fixture(scope="module")
def tok():
    return qwen3()


@pytest.fixture(scope="module")
def tasks():
    return [t for t in generate("train", 12, seed=3) if 1 <= len(oracle_trajectory(t)) <= 4][:8]


def check_exact(chunks, turns):
    """Independently of the chunks' bookkeeping: masked ids are the sampled ids in order, and each sampled span
    is preceded in its chunk by exactly the ids its sampler saw (p_i), so every loss token has its sampler's
    context, when no repair was allowed."""
    for chunk in chunks:
        mask = chunk.loss_mask.astype(bool)
        np.testing.assert_array_equal(chunk.token_ids[mask], np.concatenate([turns[t].sampled_ids for t in chunk.turns]))
        assert tito.loss_region_drift(chunk) == 0
        for span in chunk.loss_spans:
            np.testing.assert_array_equal(chunk.token_ids[:span.start], turns[span.turn].prompt_ids)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenario_lands_in_its_case_with_zero_drift(tok, tasks, scenario):
    for n, task in enumerate(tasks):
        turns = play(tok, task.instruction, oracle_trajectory(task), scenario, seed=n)
        chunks = tito.assemble(turns, tok, reward=1.0)
        cases = [c for chunk in chunks for c in chunk.boundary_cases]
        want = EXPECTED.get(scenario)
        if scenario == "follow_up":  # the second query re-renders every earlier turn without its reasoning
            assert cases == ["strict"] * (len(turns) - 2) + ["split"]
            assert changed_tokens(turns[-2], turns[-1].prompt_ids)[1] > 0
        else:
            assert cases == [want] * (len(turns) - 1), (task.id, cases)
        assert tito.tito_metrics(chunks)["drift_tokens"] == 0
        check_exact(tito.assemble(turns, tok, reward=1.0, repairs=()), turns)


def test_the_template_changes_what_it_should_and_nothing_else(tok, tasks):
    """Per boundary, tokens of p_i ++ a_i the next prompt does not hold: none with reasoning kept; the 4-token
    empty think block of the generation prompt with thinking disabled (exactly what ``normalized`` drops)."""
    task = tasks[0]
    thinking = play(tok, task.instruction, oracle_trajectory(task), "thinking")
    assert all(changed_tokens(a, b.prompt_ids) == (0, 0) for a, b in zip(thinking, thinking[1:]))
    disabled = play(tok, task.instruction, oracle_trajectory(task), "no_thinking")
    empty_think = tok.encode("<think>\n\n</think>\n\n")
    for a, b in zip(disabled, disabled[1:]):
        assert a.prompt_ids[-len(empty_think):].tolist() == empty_think
        assert changed_tokens(a, b.prompt_ids)[1] == len(empty_think)
        repair = tito.repair_boundary(a, b.prompt_ids, tok)
        assert (repair.case, repair.prompt_dropped, repair.sampled_dropped) == ("normalized", len(empty_think), 0)


def test_measured_shares_cover_every_boundary(tok, tasks):
    rows = measure(tok, tasks[:4], oracle_trajectory)
    for row in rows.values():
        assert sum(row["cases"].values()) == row["boundaries"] and row["drift_tokens"] == 0
    assert rows["thinking"]["shares"]["strict"] == 1.0 and rows["thinking"]["diff_tokens"] == 0
    assert rows["no_thinking"]["context_mismatch_tokens"] == rows["no_thinking"]["diff_tokens"]
