"""A sampled turn is stored once: its record holds what is new since the trial's previous turn (prompt ids after
the shared prefix, the routing rows its version had not recorded), ``expand_turns`` rebuilds every whole record
bit for bit, TITO assembles the stored records into the same trajectory, and a trial of N turns stores each
position once instead of about N/2 times."""

from __future__ import annotations

import numpy as np
import pytest
from _tito_harness import play, project_tokenizer, tool_call_text

import schemas
from t1_actors import tito
from t1_actors.policy.generation import Generation, RoutingRows, TurnPrefix

TEXTS = [tool_call_text("ls -la /app", "I'll list the files."), tool_call_text("wc -w /app/notes.txt"),
         tool_call_text("cat /app/next.txt")]


@pytest.fixture(scope="module")
def tok():
    return project_tokenizer()


def routed(trial, turns_per_version=None):
    """The trial's turns with routing as a sampler records it: a row is a function of the weights' version and
    the stream up to its position (same version, same prefix: same rows), traceable by version in layer 0."""
    out = []
    for turn in trial.turns:
        ids = np.concatenate([turn.prompt_ids, turn.sampled_ids])[:-1]
        rows = np.zeros((len(ids), 2, 2), dtype=np.uint8)
        rows[:, 0, 0], rows[:, 0, 1] = turn.policy_version, np.arange(len(ids)) % 256
        rows[:, 1, 0], rows[:, 1, 1] = ids % 256, ids // 256
        out.append(tito.Turn(**{**turn.__dict__, "routing": rows}))
    return out


def stored_turns(trial_turns, trial_id="t-1"):
    """The records a sampler writes for these turns, each against its predecessor (as the trial runner asks)."""
    events, previous = [], None
    for i, turn in enumerate(trial_turns):
        prefix = TurnPrefix() if previous is None else TurnPrefix.after(
            previous.prompt_ids, previous.sampled_ids, previous.routing, previous.policy_version, turn.prompt_ids)
        generation = Generation(len(turn.prompt_ids), turn.sampled_ids.astype(np.int32), turn.sampler_logprobs,
                                turn.routing, "stop", turn.policy_version)
        events.append(generation.to_event(trial_id, i, turn.prompt_ids, temperature=1.0, top_p=1.0, sampler_id="s",
                                          prefix=prefix))
        previous = turn
    return events


def whole_records(trial_turns, trial_id="t-1"):
    return [Generation(len(t.prompt_ids), t.sampled_ids.astype(np.int32), t.sampler_logprobs, t.routing, "stop",
                       t.policy_version).to_event(trial_id, i, t.prompt_ids, temperature=1.0, top_p=1.0, sampler_id="s")
            for i, t in enumerate(trial_turns)]


@pytest.mark.parametrize("turns_per_version", [None, 2])
def test_stored_turns_expand_to_the_whole_records_and_assemble_the_same(tok, turns_per_version):
    turns = routed(play(tok, TEXTS * 3, turns_per_version=turns_per_version))
    stored = stored_turns(turns)
    assert all(e.prefix_len > 0 for e in stored[1:])  # every later turn shares the stream it extends
    for event in stored:
        assert schemas.decode(schemas.encode(event)) == event
    expanded = tito.expand_turns(stored)
    for got, want in zip(expanded, whole_records(turns)):
        assert got == want  # ids, logprobs and every routing row, bit for bit
    events = [tito.to_event(c, trial_id="t-1", task_id="x") for c in tito.assemble(stored, tok, reward=0.3)]
    again = [tito.to_event(c, trial_id="t-1", task_id="x") for c in tito.assemble(turns, tok, reward=0.3)]
    assert events == again


def test_a_turn_of_a_new_version_records_all_its_rows_and_one_of_the_same_version_only_new_ones(tok):
    turns = routed(play(tok, TEXTS, turns_per_version=2))  # versions 0, 0, 1
    same, new = stored_turns(turns)[1:]
    assert same.routing_start == min(same.prefix_len, len(turns[0].routing)) > 0
    assert len(same.routing) == len(turns[1].routing) - same.routing_start
    assert new.routing_start == 0 and len(new.routing) == len(turns[2].routing)  # re-prefilled: all its rows
    reply = Generation(len(turns[1].prompt_ids), turns[1].sampled_ids.astype(np.int32), turns[1].sampler_logprobs,
                       turns[1].routing, "stop", 0).to_reply(
        "t-1", 1, TurnPrefix.after(turns[0].prompt_ids, turns[0].sampled_ids, turns[0].routing, 0,
                                   turns[1].prompt_ids))
    assert reply.routing_start == same.routing_start and len(reply.routing) == len(same.routing)  # the wire too
    whole = RoutingRows().full(Generation.from_reply(reply, len(turns[1].prompt_ids)), turns[0].routing)
    np.testing.assert_array_equal(whole.routing, turns[1].routing)


def test_a_long_trial_stores_each_position_once(tok):
    turns = routed(play(tok, TEXTS * 10))  # 30 turns, one version
    stored = stored_turns(turns)
    whole = whole_records(turns)
    last = turns[-1]
    distinct = len(last.prompt_ids) + len(last.sampled_ids)
    stored_ids = sum(len(e.prompt_ids) + len(e.sampled_ids) for e in stored)
    whole_ids = sum(len(e.prompt_ids) + len(e.sampled_ids) for e in whole)
    stored_rows = sum(len(e.routing) for e in stored)
    assert stored_ids == distinct and stored_rows == distinct - 1  # once each
    assert whole_ids > 10 * distinct  # what one record per whole prompt costs at 30 turns


def test_a_turn_that_extends_a_missing_turn_is_named(tok):
    turns = routed(play(tok, TEXTS))
    with pytest.raises(tito.TitoError, match="turn 1 extends a previous turn that is not given"):
        tito.expand_turns(stored_turns(turns)[1:])


def test_a_trials_routing_rows_are_views_of_one_buffer_and_a_new_version_starts_another(tok):
    """The trial runner's ``RoutingRows``: the turns of one version extend one buffer in place (each turn's rows a
    view, no copy of the prefix), a turn of a new version starts a new buffer, and every turn's rows stay its own."""
    turns = routed(play(tok, TEXTS * 2, turns_per_version=3))  # versions 0, 0, 0, 1, 1, 1
    stored, rows, kept = stored_turns(turns), RoutingRows(), []
    for event, turn in zip(stored, turns):
        reply = Generation(len(turn.prompt_ids), turn.sampled_ids.astype(np.int32), turn.sampler_logprobs,
                           event.routing, "stop", turn.policy_version, routing_start=event.routing_start)
        kept.append(rows.full(reply, kept[-1] if kept else None).routing)
    for got, turn in zip(kept, turns):
        np.testing.assert_array_equal(got, turn.routing)
    assert kept[1].base is kept[0].base is kept[2].base  # one version: one buffer
    assert kept[3].base is not kept[0].base and kept[4].base is kept[3].base


def test_a_trained_trials_turns_leave_their_routing_to_its_trajectory(tok):
    """``record_routing`` False (a trial played to be trained): the turn's record keeps its ids and logprobs but no
    routing rows (the trajectory stores them, once); the reply still carries the rows the assembly needs."""
    turns = routed(play(tok, TEXTS))
    previous, turn = turns[0], turns[1]
    prefix = TurnPrefix.after(previous.prompt_ids, previous.sampled_ids, previous.routing, 0, turn.prompt_ids)
    generation = Generation(len(turn.prompt_ids), turn.sampled_ids.astype(np.int32), turn.sampler_logprobs,
                            turn.routing, "stop", 0)
    event = generation.to_event("t-1", 1, turn.prompt_ids, temperature=1.0, top_p=1.0, sampler_id="s",
                                prefix=prefix, record_routing=False)
    assert event.routing is None and event.routing_start == 0 and event.prefix_len == prefix.shared
    np.testing.assert_array_equal(event.sampled_ids, turn.sampled_ids)
    assert len(generation.to_reply("t-1", 1, prefix).routing) == len(turn.routing) - prefix.rows
    [whole] = tito.expand_turns([*whole_records(turns[:1]), event])[1:]
    np.testing.assert_array_equal(whole.prompt_ids, turn.prompt_ids)
