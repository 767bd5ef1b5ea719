"""Hypothesis: over random turn texts, harness behaviours and random (non-canonical) tokenizations of the
sampled text, TITO keeps its invariant (loss-region ids = sampled ids) and its exactness promises."""

from __future__ import annotations

import numpy as np
from _tito_harness import (
    encode,
    no_separator,
    parsed,
    play,
    project_tokenizer,
    row_token,
    segment,
    strip_reasoning,
    thinking_disabled,
    tool_call_text,
    verbatim,
)
from fixtures.tito_checks import check_loss_region, loss_starts
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from t1_actors import tito
from t1_actors.policy.chat_template import IM_END, render_chat

TOK = project_tokenizer()
WORDS = st.text(alphabet="abcdefgz019 .,:;'\"/-_\n\t\u00e9\u2192\u4e2d", max_size=40)


@st.composite
def assistant_texts(draw):
    lead = draw(st.sampled_from(["", "", "\n", " ", "\n\n"]))
    reasoning = draw(st.sampled_from(["", f"<think>\n{draw(WORDS)}\n</think>\n\n"]))
    thought = draw(WORDS)
    body = (tool_call_text(draw(WORDS), thought) if draw(st.booleans()) else thought + IM_END)
    if draw(st.booleans()):
        body = body.removesuffix(IM_END) + draw(st.sampled_from(["", "\n", "  ", "\n\n"]))  # no stop token
    return lead + reasoning + body


HARNESSES = {"parsed": parsed, "verbatim": verbatim}
TEMPLATES = {"render_chat": render_chat, "no_separator": no_separator, "strip_reasoning": strip_reasoning,
             "thinking_disabled": thinking_disabled}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(assistant_texts(), min_size=1, max_size=4),
       outputs=st.lists(WORDS, min_size=4, max_size=4),
       harness=st.sampled_from(sorted(HARNESSES)), template=st.sampled_from(sorted(TEMPLATES)),
       append_tokens=st.booleans(), canonical=st.booleans(), rng=st.randoms(use_true_random=False))
def test_invariant_holds_for_random_trials(texts, outputs, harness, template, append_tokens, canonical, rng):
    sample = (lambda text, i: encode(TOK, text)) if canonical else (lambda text, i: segment(TOK, text, rng))
    trial = play(TOK, texts, outputs=outputs, to_message=HARNESSES[harness], render=TEMPLATES[template],
                 sample=sample, append_tokens=append_tokens)
    chunks = tito.assemble(trial.turns, TOK, reward=0.5)
    check_loss_region(chunks, trial.turns)
    metrics = tito.tito_metrics(chunks)
    assert sum(metrics[f"boundary_{case}"] for case in tito.CASES) == len(texts) - 1
    assert metrics["chunks"] == 1 + metrics["boundary_split"]
    if append_tokens:  # the sampler's ids are in every next prompt: nothing to repair
        assert metrics["boundary_strict"] == len(texts) - 1
    for chunk in chunks:
        first = trial.turns[chunk.turns[0]]
        np.testing.assert_array_equal(chunk.token_ids[:len(first.prompt_ids)], first.prompt_ids)
        exact = True  # while every boundary so far was strict, each turn trains on exactly its prompt
        for n, start in enumerate(loss_starts(chunk, trial.turns)):
            if n:
                exact &= chunk.boundary_cases[n - (chunk.index == 0)] == "strict"
            if exact and start is not None:
                np.testing.assert_array_equal(chunk.token_ids[:start], trial.turns[chunk.turns[n]].prompt_ids)
        recorded = chunk.routing_recorded
        np.testing.assert_array_equal(row_token(chunk.routing[recorded]), chunk.token_ids[:-1][recorded])
        event = tito.to_event(chunk, trial_id="t", task_id="x")
        assert event.boundary_cases == list(chunk.boundary_cases)


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, 99), min_size=1, max_size=140),
       sampled=st.lists(st.integers(100, 199), min_size=0, max_size=30),
       junk=st.lists(st.integers(200, 299), min_size=1, max_size=10),
       s=st.integers(0, 140), u=st.integers(0, 30))
def test_normalized_finds_exactly_the_dropped_tokens(prompt, sampled, junk, s, u):
    """p_{i+1} = p_i[:-s] ++ a_i[:-u] ++ other tokens (disjoint alphabets, so nothing matches by chance):
    the normalized case recovers (s, u) whenever s <= 96 and u <= 16, and holds nowhere else."""
    s, u = min(s, len(prompt)), min(u, len(sampled))
    assume(s + u > 0)
    p, a = np.asarray(prompt), np.asarray(sampled)
    next_prompt = np.concatenate([p[:len(p) - s], a[:len(a) - u], junk])
    assert tito.strict(p, a, next_prompt) is None
    repair = tito.normalized(p, a, next_prompt)
    if s <= tito.MAX_PROMPT_DROP and u <= tito.MAX_SAMPLED_DROP:
        assert (repair.prompt_dropped, repair.sampled_dropped) == (s, u)
        assert repair.kept == len(next_prompt) - len(junk)
        kept = np.concatenate([p[:len(p) - s], a[:len(a) - u]])
        np.testing.assert_array_equal(next_prompt[:repair.kept], kept)
    else:
        assert repair is None
