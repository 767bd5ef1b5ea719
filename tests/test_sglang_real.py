"""The SGLang backend against a REAL SGLang server (sglang 0.5.23 on the CPU, its own venv from .ci/setup-sglang).

One server for the whole module, started through the launcher (``SGLangServer``, what ``t1-sglang-serve``
and the campaign use) on a tiny t1 policy written by ``MoEPolicy.save``. What is checked here against the
real server: sampled ids with logprobs at the request's temperature, routed experts decoded into t1's
routing record and the cross-check against t1's torch policy on the same weights (every token, every
layer), seeds, ``/abort_request``, ``/update_weights_from_disk`` through the sampler actor (its policy
version follows), R3 through t1's learner, the engine recorded per turn, and a server killed mid-rollout
(an infrastructure failure, last: it ends the module's server). tests/test_sampler_sglang.py keeps the
stand-in for the wire details only (malformed answers, HTTP errors).

The SGLang venv is part of CI's set-up (.ci/setup runs .ci/setup-sglang): when it is missing these tests
FAIL saying so, they never skip.
"""

from __future__ import annotations

import hashlib
import json
import os

import httpx
import numpy as np
import pytest
import torch
import trio
from _trio import trio_test
from fixtures.models import tiny_model_config

from schemas import GenerateReply, GenerateRequest, PolicyUpdate, SamplerTurn, TrajectoryAssembled
from t1_actors.backends.sampler_backend import BackendUnavailable, GenerateSpec, SamplerConfig
from t1_actors.backends.sglang_sampler import SGLangError, SGLangSampler
from t1_actors.backends.sglang_server import SETUP_HINT, SGLangServer, SGLangServerError, check_venv, sglang_venv
from t1_actors.backends.torch_learner import TorchCritic, TorchLearner, collate
from t1_actors.policy import MoEPolicy
from t1_actors.policy.generation import Generation
from t1_actors.policy.sampling import SamplingParams
from t1_actors.rollout import RolloutLimits, ToolOutcome, run_trial
from t1_actors.train.ppo import PPOConfig
from tools._replay.drift import token_logprobs

pytestmark = [pytest.mark.slow, pytest.mark.sglang_venv]
torch.set_num_threads(1)  # the other core is the server's

MODEL = tiny_model_config(vocab_size=256, hidden_size=64, head_dim=16, moe_intermediate_size=32, max_position=512)
CONTEXT = 512
MEASURED: dict[str, object] = {}  # figures docs/sglang.md quotes; printed at module end (pytest -s)



def _policy(seed: int) -> MoEPolicy:
    torch.manual_seed(seed)
    policy = MoEPolicy(MODEL).eval()
    with torch.no_grad():
        policy.lm_head.weight.normal_(0, 0.3)  # peaked enough that temperature matters
    return policy


def _fp8_rounded(policy: MoEPolicy) -> MoEPolicy:
    """The policy with every matrix rounded through FP8 e4m3 (per-tensor scale), stored back in float32:
    what an engine serving FP8 weights computes with, while the learner keeps the float32 ones."""
    def rounded(w: torch.Tensor) -> torch.Tensor:
        if w.dim() < 2:
            return w
        scale = w.abs().max() / 448.0
        return (w / scale).to(torch.float8_e4m3fn).float() * scale

    served = MoEPolicy(MODEL).eval()
    served.load_state_dict({k: rounded(v) for k, v in policy.state_dict().items()})
    return served


def _prompt(i: int, n: int = 6) -> list[int]:
    return np.random.default_rng(100 + i).integers(0, MODEL.vocab_size, size=n + i % 5).tolist()


def _sorted(routing: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(routing, dtype=np.int64), axis=-1)  # the expert SET of each (token, layer)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    venv = sglang_venv()
    try:
        check_venv(venv)
    except SGLangServerError as exc:
        pytest.fail(f"the real-SGLang tests need the SGLang venv: {exc}. {SETUP_HINT}", pytrace=False)
    root = tmp_path_factory.mktemp("sglang")
    _policy(0).save(root / "weights" / "v00000")
    handle = SGLangServer.start(root / "weights" / "v00000", context_length=CONTEXT, max_concurrent=32,
                                weight_version=0, log_path=root / "server.log")
    MEASURED["start_s"] = round(handle.started_s, 1)
    handle.root = root
    yield handle
    handle.stop()
    assert not handle.alive()
    if os.environ.get("T1_SGLANG_MEASURE"):
        print("\nSGLANG_MEASURED " + json.dumps(MEASURED, sort_keys=True))


def _config(server, **kw) -> SamplerConfig:
    return SamplerConfig(backend="sglang", sglang_url=server.url, **kw)


async def _sample(server, specs: list[GenerateSpec]):
    async with SGLangSampler.open(_config(server), model=MODEL) as sampler:
        return await sampler.generate(specs)


@trio_test
async def test_sampled_ids_logprobs_and_routing_agree_with_the_torch_policy(server):
    """Routing cross-check: on the same weights SGLang's expert sets equal t1's on every token and layer,
    and SGLang's logprobs are t1's log_softmax(logits / T) of the sampled ids, at each request's T."""
    policy = MoEPolicy.load(server.root / "weights" / "v00000").eval()
    specs = [GenerateSpec(f"x-{t}-{i}", _prompt(i), SamplingParams(max_new_tokens=24, temperature=t, seed=i))
             for t in (0.6, 1.0) for i in range(6)]
    results = await _sample(server, specs)
    positions = agree = 0
    worst = 0.0
    for spec, g in zip(specs, results):
        prompt, n = list(spec.input_ids), len(g.output_ids)
        assert g.finish_reason == "length" and n == 24 and g.policy_version == 0
        assert g.routing.dtype == np.uint8  # E = 8 <= 256: one byte per expert id
        assert g.routing.shape == (len(prompt) + n - 1, MODEL.num_layers, MODEL.top_k)  # the last token: no row
        ids = np.asarray(prompt + g.output_ids.tolist())
        lp, live = token_logprobs(policy, ids, temperature=spec.params.temperature)
        expected = lp[len(prompt):]
        worst = max(worst, float(np.abs(expected - g.logprobs).max()))
        positions += live.shape[0] * live.shape[1]
        agree += int((_sorted(live) == _sorted(g.routing)).all(-1).sum())
        # at the other temperature the same ids have other logprobs: the server used the request's T
        other = token_logprobs(policy, ids, temperature=1.6 - spec.params.temperature)[0][len(prompt):]
        assert np.abs(other - g.logprobs).max() > 10 * max(float(np.abs(expected - g.logprobs).max()), 1e-4)
    MEASURED.update(routing_agreement=f"{agree}/{positions}", max_logprob_diff=worst)
    assert agree == positions
    assert worst < 2e-3


@trio_test
async def test_a_stop_id_ends_the_turn_and_is_kept(server):
    """What the engine guarantees, not a replay of another request's ids (the CPU engine is not deterministic
    near ties, even at T -> 0): a turn ends at its first sampled stop id, which it keeps, and it has a routing
    row for every fed position. The stop ids are those a free run sampled early, so one is drawn for sure."""
    prompt, near_greedy = _prompt(3), dict(max_new_tokens=40, temperature=0.01)
    [free] = await _sample(server, [GenerateSpec("free", prompt, SamplingParams(**near_greedy))])
    stops = tuple(sorted({int(i) for i in free.output_ids[2:12]}))
    [g] = await _sample(server, [GenerateSpec("stop", prompt, SamplingParams(**near_greedy, stop_ids=stops))])
    ids = g.output_ids.tolist()
    assert g.finish_reason == "stop" and ids[-1] in stops and not set(ids[:-1]) & set(stops), (ids, stops)
    assert g.routing.shape[0] == len(prompt) + len(ids) - 1  # the stop id is the last sampled token: no row


@trio_test
async def test_request_seeds_do_not_reproduce_on_the_cpu_engine(server):
    """Measured, and pinned so the docs stay true: SGLang honours ``sampling_seed`` only with
    --enable-deterministic-inference, which the CPU engine's torch_native attention does not support; two
    requests with one seed draw differently. So the eval's common random numbers do not pair passes
    served by SGLang here (docs/sglang.md); the torch sampler's do."""
    prompt = _prompt(4)
    runs = await _sample(server, [GenerateSpec(f"seed-{k}", prompt, SamplingParams(max_new_tokens=32, seed=11))
                                  for k in range(2)])
    same = bool(np.array_equal(runs[0].output_ids, runs[1].output_ids))
    MEASURED["seed_reproduces"] = same
    assert not same


@trio_test
async def test_abort_request_ends_a_generation_with_what_it_has(server):
    prompt = _prompt(5)
    budget = CONTEXT - len(prompt) - 1
    async with SGLangSampler.open(_config(server), model=MODEL) as sampler:
        out = {}

        async def ask() -> None:
            [out["g"]] = await sampler.generate([GenerateSpec("long", prompt, SamplingParams(max_new_tokens=budget))])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await trio.sleep(1.0)  # ordering only: the request is running when the abort comes
            await sampler.cancel("long")
    g = out["g"]
    assert g.finish_reason == "cancelled" and 0 < len(g.output_ids) < budget
    assert len(g.logprobs) == len(g.output_ids)
    assert g.routing.shape == (len(prompt) + len(g.output_ids) - 1, MODEL.num_layers, MODEL.top_k)


def _actor_config(tmp_path, server, **sampler):
    from t1_actors.job.config import parse_config

    return parse_config({
        "run": {"id": "sglang-real", "dir": str(tmp_path / "run"), "hmac_key": "k" * 32},
        "model": MODEL.model_dump(),
        "campaign": {"max_context": MODEL.max_position},  # t1-actor check refuses a context the model cannot hold
        "sampler": {"backend": "sglang", "sglang_url": server.url, **sampler},
        "actors": [{"name": "sampler-0", "role": "sampler", "actor_class": "t1_actors.sampler:SamplerActor"}],
    })


def _request(trial: str, prompt: list[int], n: int, seed: int = 0) -> GenerateRequest:
    return GenerateRequest(trial_id=trial, turn=0, input_ids=np.asarray(prompt, np.int32), max_new_tokens=n,
                           temperature=1.0, top_p=1.0, seed=seed)


def _turns(run_dir) -> dict[str, SamplerTurn]:
    import storage

    return {e.trial_id: e for _, e in storage.EventLog.open(run_dir / "log").events(kinds=["sampler_turn"])}


@trio_test
async def test_sampler_actor_follows_published_versions_and_records_the_engine(server, tmp_path):
    """Through the sampler actor (runtime, log): a published version is loaded with /update_weights_from_disk,
    replies say which version served them, every turn names the engine; a bad version is refused, kept serving."""
    from t1_actors.runtime.host import serve_actor
    from t1_actors.runtime.peers import connect
    from t1_actors.sampler import SamplerActor

    new = _policy(1)
    published = server.root / "weights" / "v00001"
    new.save(published)
    sha = hashlib.sha256((published / "model.safetensors").read_bytes()).hexdigest()
    config = _actor_config(tmp_path, server)
    prompt = _prompt(6)
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_actor, SamplerActor, config, "sampler-0")
            async with connect(config, "test") as peers:
                sampler = peers("sampler")
                before = await sampler.call(_request("v0", prompt, 16), deadline_s=120)
                await sampler.call(PolicyUpdate(version=1, location=str(published), sha256=sha), deadline_s=60)
                while (after := await sampler.call(_request("v1", prompt, 16), deadline_s=120)).policy_version != 1:
                    await trio.sleep(0.2)
                await sampler.call(PolicyUpdate(version=2, location=str(server.root / "nowhere"), sha256=""),
                                   deadline_s=60)
                await trio.sleep(2.0)  # the failed load is logged; the server keeps version 1
                kept = await sampler.call(_request("kept", prompt, 8), deadline_s=120)
            nursery.cancel_scope.cancel()
    assert isinstance(before, GenerateReply) and before.policy_version == 0
    assert after.policy_version == 1 and kept.policy_version == 1
    ids = np.asarray(prompt + after.output_ids.tolist())
    lp, live = token_logprobs(new.eval(), ids)
    assert np.abs(lp[len(prompt):] - after.logprobs).max() < 2e-3
    assert np.array_equal(_sorted(live), _sorted(after.routing))  # version 1's experts, not version 0's
    turns = _turns(config.run.dir)
    assert {t.engine for t in turns.values()} == {"sglang"}
    assert {t.engine_version for t in turns.values()} == {"0.5.23"}
    assert {t.engine_start_id for t in turns.values()} == {server.engine.start_id}
    assert turns["v1"].policy_version == 1 and turns["v1"].error is None
    # later tests start from version 1: the server reports what it serves
    async with SGLangSampler.open(_config(server), model=MODEL) as direct:
        with pytest.raises(SGLangError, match="could not load policy version 9"):
            await direct.load_weights(str(server.root / "nowhere"), version=9)


@trio_test
async def test_r3_replaying_sglang_routing_shrinks_the_learners_logprob_gap(server):
    """R3 end to end: SGLang serves FP8-rounded weights (stored as float32), the learner trains the float32
    ones; its forward replaying SGLang's routing is closer to SGLang's logprobs than its live routing."""
    learner_policy = _policy(2)
    served = server.root / "weights" / "v00002"
    _fp8_rounded(learner_policy).save(served)
    async with SGLangSampler.open(_config(server), model=MODEL) as sampler:
        await sampler.load_weights(str(served), version=2)
        specs = [GenerateSpec(f"r3-{i}", _prompt(i, 8), SamplingParams(max_new_tokens=32, seed=i)) for i in range(24)]
        results = await sampler.generate(specs)
    trajectories = []
    for i, (spec, g) in enumerate(zip(specs, results)):
        assert g.policy_version == 2
        prompt = list(spec.input_ids)
        ids = np.asarray(prompt + g.output_ids.tolist(), np.int32)
        mask = np.zeros(len(ids), np.uint8)
        mask[len(prompt):] = 1
        logprobs = np.zeros(len(ids), np.float32)
        logprobs[len(prompt):] = g.logprobs
        trajectories.append(TrajectoryAssembled(
            trial_id=spec.request_id, chunk=0, task_id="task", token_ids=ids, loss_mask=mask,
            sampler_logprobs=logprobs, routing=g.routing, token_versions=mask.astype(np.int32) * 2,
            boundary_cases=["strict"], reward=float(i % 2), policy_version=2, turns=1))
    batch = collate(trajectories, None, num_layers=MODEL.num_layers, top_k=MODEL.top_k)
    cfg = PPOConfig()
    metrics = TorchLearner(learner_policy, cfg, critic=TorchCritic.for_policy(learner_policy, cfg)).step(batch).metrics
    MEASURED.update(r3={k: metrics[k] for k in ("logprob_gap_r3", "logprob_gap_no_r3", "routing_mismatch_no_r3")})
    assert metrics["routing_mismatch_no_r3"] > 0  # FP8 rounding flipped some of SGLang's expert choices
    assert metrics["logprob_gap_r3"] < metrics["logprob_gap_no_r3"]


def test_a_server_stops_when_the_process_that_started_it_is_killed(tmp_path):
    """The server has its own session (a Ctrl-C at the campaign must not reach it), so a campaign killed with
    SIGKILL, whose atexit never runs, must not leave it behind: the boot script watches its parent."""
    import signal
    import subprocess
    import sys
    import time

    from t1_actors.backends.sglang_server import group_alive

    _policy(3).save(tmp_path / "policy")
    script = ("import sys, time\n"
              "from t1_actors.backends.sglang_server import SGLangServer\n"
              "server = SGLangServer.start(sys.argv[1], context_length=256, max_concurrent=2, log_path=sys.argv[2])\n"
              "print(server.pid, server.url, flush=True)\n"
              "time.sleep(3600)\n")
    starter = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "policy"), str(tmp_path / "server.log")],
                               stdout=subprocess.PIPE, text=True)
    try:
        pid, url = starter.stdout.readline().split()
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    deadline = time.monotonic() + 30
    while group_alive(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not group_alive(int(pid)), f"the server's process group {pid} outlived the process that started it"
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=5)


@trio_test
async def test_a_server_killed_mid_rollout_is_sampled_again_by_its_restart(server, tmp_path):
    """LAST in this module: it kills the module's server. The server dies while the sampler actor's turn
    generates and a new one starts on its URL (what ``ServerWatch`` does for a campaign's local server): the turn
    waits for it (``sglang_server_wait_s``) and is sampled again by the new start, so the trial goes on; the log
    holds that one turn, named by the new start. A client opened on a dead URL is refused, naming it (the turn
    that outwaits ``sglang_server_wait_s`` is an infrastructure failure: tests/test_sampler_sglang.py)."""
    from t1_actors.runtime.host import serve_actor
    from t1_actors.runtime.peers import connect
    from t1_actors.sampler import SamplerActor

    config = _actor_config(tmp_path, server, sglang_server_wait_s=300.0)
    prompt = _prompt(7)
    port = int(server.url.rsplit(":", 1)[1])
    restarted: list[SGLangServer] = []

    async def kill_and_restart() -> None:
        await trio.sleep(1.0)  # ordering only: the turn is generating when the server dies
        await trio.to_thread.run_sync(server.kill)
        restarted.append(await trio.to_thread.run_sync(lambda: SGLangServer.start(
            server.root / "weights" / "v00000", context_length=CONTEXT, max_concurrent=32, port=port,
            weight_version=0, log_path=server.root / "server-restarted.log")))

    try:
        with trio.fail_after(400):
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_actor, SamplerActor, config, "sampler-0")
                async with connect(config, "test") as peers:
                    sampler = peers("sampler")

                    async def sample(prompt_ids: np.ndarray, turn: int) -> Generation:
                        nursery.start_soon(kill_and_restart)
                        reply = await sampler.call(GenerateRequest(
                            trial_id="dies", turn=turn, input_ids=prompt_ids,
                            max_new_tokens=CONTEXT - len(prompt_ids) - 1, temperature=1.0, top_p=1.0), deadline_s=380)
                        return Generation.from_reply(reply, len(prompt_ids))

                    async def execute(command: str, turn: int) -> ToolOutcome:
                        return ToolOutcome(0, "", None)

                    rollout = await run_trial("task", sample=sample, execute=execute, encode=lambda _: prompt,
                                              decode=lambda _: "", limits=RolloutLimits(max_turns=1, max_new_tokens=8,
                                                                                        max_context=CONTEXT))
                nursery.cancel_scope.cancel()
        assert not server.alive() and restarted and restarted[0].url == server.url
        assert rollout.infra_error is None and len(rollout.turns) == 1 and rollout.finish != "sampler_error"
        turn = _turns(config.run.dir)["dies"]
        assert turn.finish_reason in ("stop", "length") and len(turn.sampled_ids) > 0 and turn.error is None
        assert turn.engine == "sglang" and turn.engine_start_id == restarted[0].engine.start_id != server.engine.start_id
        ours = token_logprobs(_policy(0), np.concatenate([turn.prompt_ids, turn.sampled_ids]), temperature=1.0)[0]
        assert np.abs(ours[len(turn.prompt_ids):] - turn.sampler_logprobs).max() < 1e-2  # the same policy served it
    finally:
        for again in restarted:
            again.stop()
    # never a silent fallback: a client opened on the dead URL is refused, naming it
    with pytest.raises(BackendUnavailable, match=server.url):
        async with SGLangSampler.open(_config(server), model=MODEL):
            pass

