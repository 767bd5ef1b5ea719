"""TITO boundary cases with the project's BPE tokenizer and chat template: each harness behaviour the issue lists
lands in the expected repair case, and the loss region holds exactly the sampled ids (drift 0)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import trio
from _tito_harness import (
    decode,
    encode,
    no_separator,
    noncanonical,
    parsed,
    play,
    project_tokenizer,
    row_token,
    strip_reasoning,
    thinking_disabled,
    tool_call_text,
    traceable_routing,
    verbatim,
)
from fixtures.tito_checks import check_loss_region, loss_starts

import schemas
from t1_actors import tito
from t1_actors.policy.chat_template import IM_END, render_chat
from t1_actors.policy.generation import Generation
from t1_actors.rollout import RolloutLimits, ToolOutcome, run_trial

TEXTS = [tool_call_text("ls -la /app", "I'll list the files."), tool_call_text("wc -w /app/notes.txt"),
         "The file has 12 words." + IM_END]


@pytest.fixture(scope="module")
def tok():
    return project_tokenizer()


def assemble(trial, tok, reward=0.35):
    chunks = tito.assemble(trial.turns, tok, reward=reward)
    check_loss_region(chunks, trial.turns)
    return chunks


def cases(chunks):
    return [case for chunk in chunks for case in chunk.boundary_cases]


# ---- the harness that re-renders the whole history each turn --------------------------------------------


def test_rerendering_harness_with_canonical_ids_is_strict_and_exact(tok):
    trial = play(tok, TEXTS)
    [chunk] = assemble(trial, tok)
    assert chunk.boundary_cases == ("strict", "strict")
    for n, start in enumerate(loss_starts(chunk, trial.turns)):  # every turn trains on exactly its prompt
        np.testing.assert_array_equal(chunk.token_ids[:start], trial.turns[n].prompt_ids)


def test_rerendering_harness_with_noncanonical_ids_is_retokenized(tok):
    rng = random.Random(3)
    trial = play(tok, TEXTS, sample=lambda text, i: noncanonical(tok, text, rng) if i < 2 else encode(tok, text))
    span_ids = trial.turns[1].prompt_ids[len(trial.turns[0].prompt_ids):][:len(encode(tok, TEXTS[0]))]
    assert not np.array_equal(span_ids, trial.turns[0].sampled_ids)  # the next prompt holds other ids
    [chunk] = assemble(trial, tok)
    assert chunk.boundary_cases == ("retokenized", "retokenized")
    metrics = tito.tito_metrics([chunk])
    retokenized = len(trial.turns[0].sampled_ids) + len(trial.turns[1].sampled_ids)
    assert metrics["retokenized_loss_tokens"] == retokenized
    assert metrics["retokenized_share"] == pytest.approx(retokenized / metrics["loss_tokens"])


def test_project_rollout_harness(tok):
    """t1_actors.rollout.run_trial (re-renders each turn, parses tool calls) with a scripted sampler."""
    rng = random.Random(5)
    texts = [tool_call_text("cat /app/notes.txt"), tool_call_text("wc -w /app/notes.txt", "Count them."),
             "Done." + IM_END]
    seen = []

    async def sample(prompt_ids, turn):
        ids = noncanonical(tok, texts[turn], rng) if turn == 1 else encode(tok, texts[turn])
        seen.append(tito.Turn(prompt_ids, ids, np.full(len(ids), -0.5, np.float32),
                              traceable_routing(turn, np.concatenate([prompt_ids, ids])), policy_version=3))
        return Generation(len(prompt_ids), ids, np.full(len(ids), -0.5, np.float32), None, "stop", 3)

    async def execute(command, turn):
        return ToolOutcome(0, f"ran {command}\n")

    rollout = trio.run(lambda: run_trial("Count the words in /app/notes.txt.", sample=sample, execute=execute,
                                         encode=lambda s: tok.encode(s).ids, decode=lambda ids: decode(tok, ids),
                                         limits=RolloutLimits(max_turns=3, max_new_tokens=64, max_context=4096)))
    assert rollout.finish == "answered" and len(seen) == 3
    chunks = tito.assemble(seen, tok, reward=0.5)
    check_loss_region(chunks, seen)
    assert cases(chunks) == ["strict", "retokenized"]


# ---- merges across the assistant/template boundary -------------------------------------------------------


def test_merge_of_template_newline_with_sampled_newline_is_retokenized(tok):
    """"assistant\\n" + a sampled "\\n<tool_call>..." re-tokenizes to "assistant" "\\n\\n": no span of the next
    prompt starts where the sampled text starts, so the merged prompt token is matched with it."""
    assert tok.encode("assistant\n\n<tool_call>").tokens[1] == "\u010a\u010a"  # premise: "\n\n" is one token
    texts = ["\n" + TEXTS[0].split("\n", 1)[1], "\n" + TEXTS[1], TEXTS[2]]
    trial = play(tok, texts, to_message=verbatim)
    [chunk] = assemble(trial, tok)
    assert chunk.boundary_cases == ("retokenized", "retokenized")
    assert [r.prompt_dropped for r in chunk.repairs] == [1, 1]


def test_merge_of_sampled_tail_with_template_text_is_normalized(tok):
    """A template that ends assistant turns with "\\n" before <|im_end|>, a sampler that returns no stop token:
    the sampled trailing "\\n" and the template's merge into "\\n\\n" (one token), u = 1."""
    def newline_template(messages, add_generation_prompt=False):
        fixed = [dict(m, content=m["content"] + "\n") if m["role"] == "assistant" else m for m in messages]
        return render_chat(fixed, add_generation_prompt)

    texts = ["I will count the words now.\n", "Counting again to be sure.\n", "The answer is 12.\n"]
    trial = play(tok, texts, to_message=verbatim, render=newline_template)
    assert encode(tok, "now.\n\n").tolist()[-1] != encode(tok, "now.\n").tolist()[-1]  # premise: a merge
    [chunk] = assemble(trial, tok)
    assert chunk.boundary_cases == ("normalized", "normalized")
    assert [(r.prompt_dropped, r.sampled_dropped) for r in chunk.repairs] == [(0, 1), (0, 1)]


# ---- whitespace the harness normalised ------------------------------------------------------------------


def test_trailing_whitespace_stripped_by_harness_is_normalized(tok):
    texts = [TEXTS[0].replace("</tool_call>", "</tool_call>\n"), TEXTS[1], TEXTS[2]]
    trial = play(tok, texts, to_message=parsed)
    [chunk] = assemble(trial, tok)
    assert chunk.boundary_cases == ("normalized", "strict")
    assert (chunk.repairs[0].prompt_dropped, chunk.repairs[0].sampled_dropped) == (0, 2)  # "\n" <|im_end|>


def test_leading_newline_stripped_by_harness_is_normalized(tok):
    texts = ["\n" + TEXTS[0].split("\n", 1)[1], TEXTS[1], TEXTS[2]]
    trial = play(tok, texts, to_message=parsed)
    [chunk] = assemble(trial, tok)
    assert chunk.boundary_cases[0] == "normalized"
    assert (chunk.repairs[0].prompt_dropped, chunk.repairs[0].sampled_dropped) == (1, 0)


def test_whitespace_changed_mid_turn_is_split(tok):
    """Stripping spaces before a long tool call changes the text far from the end: no repair, a new chunk."""
    long_call = tool_call_text("find /app -name '*.txt' -exec wc -w {} + | sort -n | tail -n 3", "Look.   ")
    trial = play(tok, [long_call, TEXTS[2]], to_message=parsed)
    chunks = assemble(trial, tok, reward=0.25)
    assert cases(chunks) == ["split"] and [c.reward for c in chunks] == [0.25, 0.25]
    for chunk in chunks:  # each chunk is exactly what the sampler saw
        turn = trial.turns[chunk.turns[0]]
        np.testing.assert_array_equal(chunk.token_ids, np.concatenate([turn.prompt_ids, turn.sampled_ids]))


# ---- a newline separator dropped at the assistant->tool boundary ------------------------------------------


def test_token_appending_harness_that_drops_the_separator_is_strict(tok):
    """The classic bug: p_{i+1} = p_i ++ a_i ++ ids(tool turn) loses the "\\n" after <|im_end|>, so a trainer
    that re-renders the chat trains on a context the sampler never saw. TITO trains on p_{i+1} as seen."""
    trial = play(tok, TEXTS, append_tokens=True)
    rerendered = encode(tok, render_chat(trial.messages[:4], add_generation_prompt=True))
    assert not np.array_equal(rerendered, trial.turns[2].prompt_ids)  # premise: re-rendering differs
    [chunk] = assemble(trial, tok)
    assert chunk.boundary_cases == ("strict", "strict")
    for n, start in enumerate(loss_starts(chunk, trial.turns)):
        np.testing.assert_array_equal(chunk.token_ids[:start], trial.turns[n].prompt_ids)


def test_sampled_separator_dropped_by_template_is_normalized(tok):
    trial = play(tok, [t + "\n" for t in TEXTS], render=no_separator)
    [chunk] = assemble(trial, tok)
    assert chunk.boundary_cases == ("normalized", "normalized")
    assert [(r.prompt_dropped, r.sampled_dropped) for r in chunk.repairs] == [(0, 1), (0, 1)]


# ---- templates that do not show past turns as sampled ---------------------------------------------------


def test_template_stripping_past_reasoning_splits(tok):
    reasoning = "<think>\nFirst I need the file list, then the word count of the notes file.\n</think>\n\n"
    trial = play(tok, [reasoning + t for t in TEXTS], render=strip_reasoning, to_message=verbatim)
    chunks = assemble(trial, tok, reward=0.6)
    assert [c.boundary_cases for c in chunks] == [(), ("split",), ("split",)]
    assert [c.index for c in chunks] == [0, 1, 2] and {c.reward for c in chunks} == {0.6}
    events = [tito.to_event(c, trial_id="t-1", task_id="count") for c in chunks]
    assert [e.chunk for e in events] == [0, 1, 2] and {e.trial_id for e in events} == {"t-1"}


def test_generation_prompt_history_omits_is_normalized(tok):
    """Qwen3 with thinking disabled: an empty think block opens every generation, history never shows it."""
    trial = play(tok, TEXTS, render=thinking_disabled)
    [chunk] = assemble(trial, tok)
    suffix = len(encode(tok, "<think>\n\n</think>\n\n"))
    assert chunk.boundary_cases == ("normalized", "normalized")
    assert [(r.prompt_dropped, r.sampled_dropped) for r in chunk.repairs] == [(suffix, 0)] * 2


# ---- tool outputs -------------------------------------------------------------------------------------------


def test_truncated_tool_output_is_strict(tok):
    outputs = ["caf\u00e9 \u2192 na\u00efve output line\r\n" * 30, "x" * 1000, ""]
    trial = play(tok, TEXTS, outputs=outputs, tool_chars=97)
    assert "[truncated]" in trial.messages[3]["content"]
    [chunk] = assemble(trial, tok)
    assert chunk.boundary_cases == ("strict", "strict")


def test_history_compaction_of_old_tool_output_splits(tok):
    """A harness that later re-truncates old tool outputs changes history the stream already holds."""
    trial = play(tok, TEXTS, outputs=["long output line\n" * 20, "short\n", ""], tool_chars=1000, compact_after=2)
    chunks = assemble(trial, tok)
    assert cases(chunks) == ["strict", "split"]


# ---- routing aligned to the stream ------------------------------------------------------------------------


def test_routing_rows_come_from_the_rule_when_strict(tok):
    """Sampled tokens keep their own turn's row; prompt positions and a turn's last sampled token take the
    latest turn that fed them."""
    trial = play(tok, TEXTS)
    [chunk] = assemble(trial, tok)
    turns = trial.turns
    ends = [len(t.prompt_ids) + len(t.sampled_ids) for t in turns]  # strict: stream prefix = turn sequence
    sampled_by = np.full(len(chunk.token_ids), -1)
    for n, start in enumerate(loss_starts(chunk, turns)):
        sampled_by[start:start + len(turns[n].sampled_ids) - 1] = n  # not the last: never fed by its turn
    assert chunk.routing.shape == (len(chunk.token_ids) - 1, 2, 2) and chunk.routing_recorded.all()
    for j in range(len(chunk.routing)):
        source = sampled_by[j] if sampled_by[j] >= 0 else max(n for n in range(len(turns)) if j < ends[n] - 1)
        expected = traceable_routing(source, np.concatenate([turns[source].prompt_ids, turns[source].sampled_ids]))
        np.testing.assert_array_equal(chunk.routing[j], expected[j])


def test_routing_rows_hold_the_stream_tokens_in_every_case(tok):
    rng = random.Random(11)
    texts = [TEXTS[0].replace("</tool_call>", "</tool_call>\n"), TEXTS[1], tool_call_text("cat /app/a.txt"),
             TEXTS[2]]
    trial = play(tok, texts, sample=lambda text, i: noncanonical(tok, text, rng) if i == 1 else encode(tok, text))
    [chunk] = assemble(trial, tok)
    assert chunk.boundary_cases == ("normalized", "retokenized", "strict")
    recorded = chunk.routing_recorded
    np.testing.assert_array_equal(row_token(chunk.routing[recorded]), chunk.token_ids[:-1][recorded])
    # one row no turn computed per boundary that did not keep the last sampled token as an id
    assert (~recorded).sum() == 2 == tito.tito_metrics([chunk])["routing_rows_unrecorded"]
    for n, start in enumerate(loss_starts(chunk, trial.turns)):
        rows = chunk.routing[start:start + len(trial.turns[n].sampled_ids) - 1]
        assert (rows[:, 0, 0] == n).all()


def test_no_routing_gives_none(tok):
    trial = play(tok, TEXTS)
    turns = [tito.Turn(t.prompt_ids, t.sampled_ids, t.sampler_logprobs, None, t.policy_version) for t in trial.turns]
    [chunk] = tito.assemble(turns, tok, reward=0.0)
    assert chunk.routing is None and chunk.routing_recorded is None
    assert tito.to_event(chunk, trial_id="t", task_id="x").routing is None


# ---- event, metrics, drift ----------------------------------------------------------------------------------


def test_event_round_trips_and_carries_versions(tok):
    trial = play(tok, TEXTS, turns_per_version=2)  # versions 0, 0, 1: the version change opens chunk 1
    first, second = assemble(trial, tok, reward=0.45)
    events = [tito.to_event(chunk, trial_id="trial-7", task_id="wc") for chunk in (first, second)]
    for event in events:
        assert schemas.decode(schemas.encode(event)) == event
        assert event.reward == 0.45 and event.routing.dtype == np.uint8
    assert events[0].boundary_cases == ["strict"] and events[0].turns == 2 and events[0].policy_version == 0
    assert events[1].boundary_cases == ["version"] and events[1].turns == 1 and events[1].policy_version == 1
    lengths = [len(t.sampled_ids) for t in trial.turns]
    for event, expected in zip(events, ([0, 0], [1])):
        versions = event.token_versions[event.loss_mask.astype(bool)]
        np.testing.assert_array_equal(versions, np.repeat(expected, lengths[:2] if expected == [0, 0] else lengths[2:]))


def test_a_version_change_opens_a_chunk_replayed_with_its_own_forwards_routing(tok):
    """R3 across versions: after a weight update the prompt was prefilled under the new weights and routed
    differently, so a turn of a new version starts a chunk whose stream is exactly p_i ++ a_i and whose routing
    is every row of that turn's own record; turns of one version share a chunk; without a routing record (no R3)
    a version change needs no chunk of its own."""
    trial = play(tok, TEXTS + [TEXTS[0]], turns_per_version=2)  # versions 0, 0, 1, 1
    chunks = tito.assemble(trial.turns, tok, reward=0.2)
    assert [c.turns for c in chunks] == [(0, 1), (2, 3)] and cases(chunks) == ["strict", "version", "strict"]
    assert tito.tito_metrics(chunks)["boundary_version"] == 1
    check_loss_region(chunks, trial.turns)
    trial = play(tok, TEXTS, turns_per_version=1)  # versions 0, 1, 2: a chunk per turn
    chunks = tito.assemble(trial.turns, tok, reward=0.2)
    assert cases(chunks) == ["version", "version"]
    for chunk, turn in zip(chunks, trial.turns):  # every row, the prefix's included, is the turn's own forward's
        np.testing.assert_array_equal(chunk.token_ids, np.concatenate([turn.prompt_ids, turn.sampled_ids]))
        np.testing.assert_array_equal(chunk.routing, turn.routing)
        assert chunk.routing_recorded.all()
    check_loss_region(chunks, trial.turns)
    unrecorded = [tito.Turn(**{**t.__dict__, "routing": None}) for t in trial.turns]
    [one] = tito.assemble(unrecorded, tok, reward=0.2)
    assert one.boundary_cases == ("strict", "strict")


def test_samplerturn_events_are_accepted(tok):
    trial = play(tok, TEXTS)
    events = [schemas.SamplerTurn(trial_id="t", turn=i, prompt_ids=t.prompt_ids, sampled_ids=t.sampled_ids,
                                  sampler_logprobs=t.sampler_logprobs, routing=t.routing,
                                  policy_version=t.policy_version, finish_reason="stop", temperature=1.0, top_p=1.0)
              for i, t in enumerate(trial.turns)]
    [from_events] = tito.assemble(events, tok, reward=0.1)
    [from_turns] = tito.assemble(trial.turns, tok, reward=0.1)
    assert tito.to_event(from_events, trial_id="t", task_id="x") == tito.to_event(from_turns, trial_id="t", task_id="x")


def test_metrics_count_cases_and_tokens(tok):
    trial = play(tok, [t + "\n" for t in TEXTS], render=no_separator)
    chunks = assemble(trial, tok)
    metrics = tito.tito_metrics(chunks)
    assert metrics["loss_tokens"] == sum(len(t.sampled_ids) for t in trial.turns)
    assert (metrics["boundary_strict"], metrics["boundary_normalized"], metrics["boundary_retokenized"],
            metrics["boundary_split"]) == (0, 2, 0, 0)
    assert metrics["retokenized_share"] == 0.0 and metrics["drift_rate"] == 0.0
    assert metrics["context_mismatch_tokens"] == 2


def test_drift_is_detected_and_raised(tok, monkeypatch):
    trial = play(tok, TEXTS)
    [chunk] = assemble(trial, tok)
    ids = chunk.token_ids.copy()
    first_loss = int(np.flatnonzero(chunk.loss_mask)[0])
    ids[first_loss] = (ids[first_loss] + 1) % 1024
    tampered = tito.TrajectoryChunk(**{**chunk.__dict__, "token_ids": ids})
    assert tito.loss_region_drift(tampered) == 1
    assert tito.tito_metrics([tampered])["drift_tokens"] == 1
    shifted = tito.TrajectoryChunk(**{**chunk.__dict__, "loss_mask": np.roll(chunk.loss_mask, 1)})
    assert tito.loss_region_drift(shifted) > 0

    real = tito.assembly._build_chunk
    monkeypatch.setattr(tito.assembly, "_build_chunk", lambda *a, **k: tito.TrajectoryChunk(**{**real(*a, **k).__dict__,
                                                                                      "token_ids": ids}))
    with pytest.raises(tito.TitoDriftError, match="1 loss-region tokens"):
        tito.assemble(trial.turns, tok, reward=0.0)


@pytest.mark.parametrize("change, message", [
    (dict(sampler_logprobs=np.zeros(3, np.float32)), "turn 1: sampler_logprobs has shape"),
    (dict(routing=np.zeros((2, 2, 2), np.uint8)), "turn 1: routing has shape"),
    (dict(prompt_ids=np.zeros(0, np.int32)), "turn 1: prompt_ids is empty"),
    (dict(sampled_ids=np.zeros((2, 2), np.int32)), "turn 1: sampled_ids must be a 1-d integer array"),
    (dict(token_versions=np.zeros(1, np.int32)), "turn 1: token_versions has 1 entries"),
])
def test_bad_turns_get_clear_errors(tok, change, message):
    trial = play(tok, TEXTS)
    turns = list(trial.turns)
    turns[1] = tito.Turn(**{**turns[1].__dict__, **change})
    with pytest.raises(tito.TitoError, match=message):
        tito.assemble(turns, tok, reward=0.0)
    with pytest.raises(tito.TitoError, match="no turns"):
        tito.assemble([], tok, reward=0.0)


def test_turns_without_routing_leave_rows_to_the_turns_that_have_it(tok):
    trial = play(tok, TEXTS)
    turns = list(trial.turns)
    turns[2] = tito.Turn(**{**turns[2].__dict__, "routing": None})
    [chunk] = tito.assemble(turns, tok, reward=0.0)
    end_1 = len(turns[1].prompt_ids) + len(turns[1].sampled_ids) - 1  # rows turn 1 fed
    assert chunk.routing_recorded[:end_1].all() and not chunk.routing_recorded[end_1:].any()
    assert (chunk.routing[:len(turns[0].prompt_ids), 0, 0] == 1).all()  # latest turn with rows: 1


def test_partial_rollout_versions_per_token(tok):
    """A generation resumed under a newer policy carries per-token versions; the chunk's version is the oldest."""
    trial = play(tok, TEXTS)
    turns = list(trial.turns)
    n = len(turns[1].sampled_ids)
    versions = np.asarray([4] * (n // 2) + [5] * (n - n // 2), dtype=np.int32)
    turns[0] = tito.Turn(**{**turns[0].__dict__, "policy_version": 4})
    turns[1] = tito.Turn(**{**turns[1].__dict__, "token_versions": versions, "policy_version": 4})  # began under 4
    turns[2] = tito.Turn(**{**turns[2].__dict__, "policy_version": 5})
    [chunk] = tito.assemble(turns, tok, reward=0.0)
    loss_versions = chunk.token_versions[chunk.loss_mask.astype(bool)]
    lengths = [len(t.sampled_ids) for t in turns]
    np.testing.assert_array_equal(loss_versions, np.concatenate([[4] * lengths[0], versions, [5] * lengths[2]]))
    assert chunk.policy_version == 4


def test_without_repairs_every_turn_keeps_the_samplers_exact_context(tok):
    """repairs=() (the campaign's default): a boundary that is not strict splits, so each chunk's stream up
    to every loss token is exactly a prompt the sampler saw followed by what it sampled."""
    rng = random.Random(11)
    texts = [TEXTS[0].replace("</tool_call>", "</tool_call>\n"), TEXTS[1], tool_call_text("cat /app/a.txt"),
             TEXTS[2]]
    trial = play(tok, texts, sample=lambda text, i: noncanonical(tok, text, rng) if i == 1 else encode(tok, text))
    chunks = tito.assemble(trial.turns, tok, reward=0.35, repairs=())
    check_loss_region(chunks, trial.turns)
    assert cases(chunks) == ["split", "split", "strict"]
    for chunk in chunks:
        first = trial.turns[chunk.turns[0]]
        seen = np.concatenate([first.prompt_ids] + [trial.turns[t].sampled_ids for t in chunk.turns])
        assert np.array_equal(chunk.token_ids[:len(first.prompt_ids) + len(first.sampled_ids)],
                              seen[:len(first.prompt_ids) + len(first.sampled_ids)])
        for t in chunk.turns:  # every turn's prompt is a prefix of the chunk's stream
            prompt = trial.turns[t].prompt_ids
            assert np.array_equal(chunk.token_ids[:len(prompt)], prompt)
    assert {c.reward for c in chunks} == {0.35}
    assert cases(tito.assemble(trial.turns, tok, reward=0.35, repairs=("normalized",)))[:1] == ["normalized"]
    with pytest.raises(tito.TitoError, match="unknown repair cases"):
        tito.assemble(trial.turns, tok, reward=0.35, repairs=("guess",))
