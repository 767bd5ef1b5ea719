"""The sampler actor over the real runtime (pynng, HMAC) and event log: generate, cancel, policy update."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
import trio
from fixtures.models import NARROW, tiny_model_config

pytest.importorskip("t1_actors.runtime.host")

from _trio import trio_test

from schemas import Cancel, GenerateReply, GenerateRequest, PolicyUpdate, SamplerTurn
from storage import stored_routing
from t1_actors.policy import MoEPolicy
from t1_actors.runtime.errors import RemoteError
from t1_actors.runtime.host import serve_actor
from t1_actors.runtime.peers import connect
from t1_actors.sampler import SamplerActor

torch.set_num_threads(1)

MODEL = NARROW  # the [model] section of the actor's run config: the tiny narrow shape


def _config(actor_config):
    return actor_config({"name": "sampler-0", "role": "sampler", "actor_class": "t1_actors.sampler:SamplerActor",
                         "options": {"seed": 3}}, run_id="sampler-test", model=MODEL, sampler={"batch_window_s": 0.001})


def _request(trial: str, n: int, seed: int = 0) -> GenerateRequest:
    return GenerateRequest(trial_id=trial, turn=0, input_ids=np.arange(1, 9, dtype=np.int32), max_new_tokens=n,
                           temperature=1.0, top_p=1.0, seed=seed)


@trio_test
async def test_generate_cancel_and_policy_update_over_the_runtime(tmp_path, actor_config):
    config = _config(actor_config)
    new_policy = MoEPolicy(tiny_model_config())
    new_policy.save(tmp_path / "v1")
    sha = hashlib.sha256((tmp_path / "v1" / "model.safetensors").read_bytes()).hexdigest()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_actor, SamplerActor, config, "sampler-0")
            async with connect(config, "test") as peers:
                sampler = peers("sampler")
                reply = await sampler.call(_request("t-1", 12), deadline_s=60)
                assert isinstance(reply, GenerateReply) and len(reply.output_ids) == 12
                assert reply.routing.shape == (8 + 12 - 1, 2, 2) and reply.policy_version == 0

                cancelled = {}

                async def long_one() -> None:
                    cancelled["reply"] = await sampler.call(_request("t-2", 100000), deadline_s=60)

                async with trio.open_nursery() as inner:
                    inner.start_soon(long_one)
                    await trio.sleep(0.3)  # let it generate a little
                    await sampler.call(Cancel(trial_id="t-2", reason="test"), deadline_s=10)
                partial = cancelled["reply"]
                assert partial.finish_reason == "cancelled" and len(partial.output_ids) < 100000

                with pytest.raises(RemoteError, match="sha256"):
                    await sampler.call(PolicyUpdate(version=1, location=str(tmp_path / "v1"), sha256="0" * 64),
                                       deadline_s=30)
                await sampler.call(PolicyUpdate(version=1, location=str(tmp_path / "v1"), sha256=sha), deadline_s=30)
                with trio.fail_after(30):  # acknowledged at once, loaded between generations
                    while (await sampler.call(_request("t-3", 5), deadline_s=60)).policy_version != 1:
                        await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    import storage
    log = storage.EventLog.open(config.run.dir / "log")
    turns = {e.trial_id: e for _, e in log.events(kinds=["sampler_turn"])}
    assert set(turns) == {"t-1", "t-2", "t-3"}
    first = turns["t-1"]
    assert isinstance(first, SamplerTurn) and first.sampler_id == "sampler-0"
    assert np.array_equal(first.sampled_ids, reply.output_ids)
    assert np.array_equal(first.routing, stored_routing(reply.routing))  # the log keeps each selection as a set
    np.testing.assert_array_equal(first.sampler_logprobs, reply.logprobs)
    assert turns["t-2"].finish_reason == "cancelled" and turns["t-3"].policy_version == 1


@trio_test
async def test_a_request_for_a_version_not_loaded_yet_waits_for_it_once(tmp_path, actor_config):
    """The controller learns of a version from the log before the sampler is sent it: a turn that wants it is
    served by it, not by the version before; a version that never comes delays one wait, not every turn."""
    config = actor_config({"name": "sampler-0", "role": "sampler", "actor_class": "t1_actors.sampler:SamplerActor",
                           "options": {"seed": 3, "version_wait_s": 1.0}}, run_id="sampler-test", model=MODEL,
                          sampler={"batch_window_s": 0.001})
    MoEPolicy(tiny_model_config()).save(tmp_path / "v1")
    sha = hashlib.sha256((tmp_path / "v1" / "model.safetensors").read_bytes()).hexdigest()

    def wanting(trial: str, version: int) -> GenerateRequest:
        return _request(trial, 3).model_copy(update={"policy_version_wanted": version})

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_actor, SamplerActor, config, "sampler-0")
            async with connect(config, "test") as peers:
                sampler = peers("sampler")
                assert (await sampler.call(wanting("t-0", 0), deadline_s=60)).policy_version == 0  # warm
                replies = {}

                async def ask(trial: str) -> None:
                    replies[trial] = await sampler.call(wanting(trial, 1), deadline_s=60)

                async with trio.open_nursery() as inner:
                    for trial in ("t-1", "t-2", "t-3"):  # asked before the update is sent, as a probe's trials are
                        inner.start_soon(ask, trial)
                    await trio.sleep(0.3)
                    await sampler.call(PolicyUpdate(version=1, location=str(tmp_path / "v1"), sha256=sha),
                                       deadline_s=30)
                assert {r.policy_version for r in replies.values()} == {1}

                started = trio.current_time()
                assert (await sampler.call(wanting("t-4", 2), deadline_s=60)).policy_version == 1  # never sent
                waited = trio.current_time() - started
                started = trio.current_time()
                assert (await sampler.call(wanting("t-5", 2), deadline_s=60)).policy_version == 1
                assert waited >= 1.0 and trio.current_time() - started < waited  # the second did not wait again
            nursery.cancel_scope.cancel()
