"""TITO with the project's policy sampling: the training forward over an assembled chunk, with its routing
replayed (R3), gives back the sampler's logprobs on every loss token whose context the stream holds exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tito_harness import decode, encode, project_tokenizer, verbatim
from fixtures.tito_checks import check_loss_region, loss_starts

from t1_actors import tito
from t1_actors.policy.chat_template import IM_END, render_chat
from t1_actors.policy.model import MoEPolicy
from t1_actors.policy.sampling import SamplingParams, generate


@pytest.fixture(scope="module")
def tok():
    return project_tokenizer()


@pytest.fixture(scope="module")
def model(tiny_model):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = tiny_model(wide=True, vocab_size=1024)
    return MoEPolicy(config).eval()


def sampled_trial(model, tok, *, append_tokens: bool, turns: int = 4, seed: int = 0) -> list[tito.Turn]:
    """A chat loop around the real sampler (random weights, so the text is noise and re-tokenizes badly)."""
    messages = [{"role": "user", "content": "Task: count the words in /app/notes.txt."}]
    prompt = encode(tok, render_chat(messages, add_generation_prompt=True))
    out = []
    for i in range(turns):
        params = SamplingParams(max_new_tokens=12, temperature=1.0, stop_ids=(tok.token_to_id(IM_END),), seed=seed + i)
        [generation] = generate(model, [prompt.tolist()], params)
        out.append(tito.Turn(prompt, generation.output_ids, generation.logprobs, generation.routing, policy_version=1))
        tool = {"role": "tool", "content": f"exit_code: 0\nline {i}\n"}
        messages += [verbatim(decode(tok, generation.output_ids)), tool]
        if append_tokens:
            prompt = np.concatenate([prompt, generation.output_ids, encode(tok, render_chat([tool], True))])
        else:
            prompt = encode(tok, render_chat(messages, add_generation_prompt=True))
    return out


@torch.no_grad()
def train_logprobs(model, chunk) -> np.ndarray:
    """log pi(T_j | T_<j) for every stream position (0 for the first), routing replayed from the chunk."""
    ids = torch.from_numpy(chunk.token_ids.astype(np.int64))[None]
    rows = np.concatenate([chunk.routing, chunk.routing[-1:]])  # the last position's row feeds no logit we use
    logits = model(ids, routing_replay=torch.from_numpy(rows.astype(np.int64))[None]).logits[0, :-1]
    taken = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return np.concatenate([[0.0], taken.numpy()])


def exact_turns(chunk, turns):
    """(start, length) of the chunk's turns whose context is exactly their prompt (all boundaries strict so far)."""
    out, exact = [], True
    for n, start in enumerate(loss_starts(chunk, turns)):
        if n:
            exact &= chunk.boundary_cases[n - (chunk.index == 0)] == "strict"
        if exact and start is not None:
            turn = turns[chunk.turns[n]]
            np.testing.assert_array_equal(chunk.token_ids[:start], turn.prompt_ids)
            out.append((start, len(turn.sampled_ids)))
    return out


@pytest.mark.parametrize("append_tokens", [True, False], ids=["token-appending", "re-rendering"])
def test_replayed_forward_reproduces_sampler_logprobs(model, tok, append_tokens):
    turns = sampled_trial(model, tok, append_tokens=append_tokens)
    chunks = tito.assemble(turns, tok, reward=0.4)
    check_loss_region(chunks, turns)
    if append_tokens:
        assert [c for chunk in chunks for c in chunk.boundary_cases] == ["strict"] * (len(turns) - 1)
    checked = 0
    for chunk in chunks:
        trained = train_logprobs(model, chunk)
        for start, length in exact_turns(chunk, turns):
            np.testing.assert_allclose(trained[start:start + length], chunk.sampler_logprobs[start:start + length],
                                       atol=2e-4)
            checked += length
    assert checked >= len(turns[0].sampled_ids) > 0
