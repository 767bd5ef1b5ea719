"""Learner and critic actors over the real runtime and event log: warm-up, values, a PPO step, publishing,
the critic's update after it, and a restarted learner that resumes from its checkpoint exactly once."""

from __future__ import annotations

import pytest
import torch
import trio

pytest.importorskip("t1_actors.runtime.host")

from _learner_data import TINY, sample_trajectories, tiny_policy
from _trio import trio_test

from schemas import StalenessDecision, TrialIssued, WeightsPublished
from storage import EventLog
from t1_actors.backends.torch_learner import sha256_file
from t1_actors.critic import CriticActor
from t1_actors.learner import LearnerActor
from t1_actors.runtime.host import serve_actor

torch.set_num_threads(1)
BATCH = 4


def _config(actor_config, *, warmup_trajectories=4, roles=("learner", "critic")):
    actors = {"learner": {"name": "learner-0", "role": "learner", "actor_class": "t1_actors.learner:LearnerActor"},
              "critic": {"name": "critic-0", "role": "critic", "actor_class": "t1_actors.critic:CriticActor"}}
    return actor_config(*(actors[role] for role in roles), run_id="learner-test", model=TINY.model_dump(),
                        learner={"batch_size": BATCH, "threads": 1, "poll_interval_s": 0.02},
                        critic={"warmup_trajectories": warmup_trajectories, "poll_interval_s": 0.02},
                        ppo={"minibatches": 2}, campaign={"max_context": TINY.max_position})


def _write(log: EventLog, name: str, events) -> None:
    with log.writer(name, routing_shape=(TINY.num_layers, TINY.top_k), num_experts=TINY.num_experts) as writer:
        for event in events:
            writer.append(event)
        writer.commit()


def _trials(policy, split: str, seed: int, n: int = BATCH):
    events = []
    for trajectory in sample_trajectories(policy, n, seed=seed):
        trial = trajectory.trial_id + f"-{split}"
        trajectory = trajectory.model_copy(update={"trial_id": trial})
        events += [TrialIssued(trial_id=trial, task_id="task", split=split, policy_version_wanted=0), trajectory]
        if split == "train":
            events.append(StalenessDecision(trial_id=trial, decision="admit", lag=0, policy_version=0))
    return events


async def _wait_for(log: EventLog, kind: str, count: int, timeout: float = 90.0):
    with trio.fail_after(timeout):
        while True:
            found = [e for _, e in log.events(kinds=[kind])]
            if len(found) >= count:
                return found
            await trio.sleep(0.05)


def _critic_updates(run_dir) -> int:
    path = run_dir / "checkpoints" / "critic-0.pt"
    return int(torch.load(path, weights_only=True)["critic"]["updates"]) if path.is_file() else 0



@trio_test
async def test_critic_and_learner_actors_train_publish_and_resume(tmp_path, actor_config):
    config = _config(actor_config)
    run_dir = config.run.dir
    policy = tiny_policy()
    policy.save(run_dir / "weights" / "v00000")
    log = EventLog.open(run_dir / "log", create=True)
    initial = WeightsPublished(version=0, sha256=sha256_file(run_dir / "weights/v00000/model.safetensors"),
                               location=str(run_dir / "weights" / "v00000"), step=0)
    _write(log, "campaign", [initial] + _trials(policy, "warmup", seed=1) + _trials(policy, "train", seed=2))

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_actor, CriticActor, config, "critic-0")
        await nursery.start(serve_actor, LearnerActor, config, "learner-0")
        [warmup] = await _wait_for(log, "critic_warmup", 1)
        [step] = await _wait_for(log, "learner_step", 1)
        published = await _wait_for(log, "weights_published", 2)
        # the critic's clipped-value update on the step's trials ends with its checkpoint
        with trio.fail_after(60):
            while _critic_updates(run_dir) < 1:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()

    assert warmup.trajectories == BATCH and warmup.explained_variance_after > warmup.explained_variance_before
    values = [e for _, e in log.events(kinds=["critic_values"])]
    assert sorted(v.trial_id for v in values) == sorted(step.trials)  # train trials only, each valued once
    assert step.step == 0 and step.policy_version == 1 and len(step.trials) == BATCH
    for name in ("policy_loss", "clip_fraction", "approx_kl", "entropy", "explained_variance", "logprob_gap_r3",
                 "logprob_gap_no_r3", "routing_mismatch_no_r3", "tokens_per_s"):
        assert name in step.metrics
    newest = max(published, key=lambda e: e.version)
    assert newest.version == 1 and newest.sha256 == sha256_file(f"{newest.location}/model.safetensors")

    # more admitted trials arrive while the learner is down; the restarted learner resumes from its checkpoint
    _write(log, "campaign", _trials(policy, "train", seed=3))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_actor, CriticActor, config, "critic-0")
        await nursery.start(serve_actor, LearnerActor, config, "learner-0")
        steps = await _wait_for(log, "learner_step", 2)
        nursery.cancel_scope.cancel()
    assert [s.step for s in steps] == [0, 1] and steps[1].policy_version == 2
    assert not set(steps[0].trials) & set(steps[1].trials)  # exactly once
    assert len([e for _, e in log.events(kinds=["critic_warmup"])]) == 1  # the critic resumed warm


@trio_test
async def test_critic_warms_up_when_asked_and_only_once(tmp_path, actor_config):
    from schemas import Ack, Generic
    from t1_actors.runtime.peers import connect

    # 100 warm-up trials never arrive: only the request starts the warm-up
    config = _config(actor_config, warmup_trajectories=100, roles=("critic",))
    policy = tiny_policy()
    log = EventLog.open(config.run.dir / "log", create=True)
    warmup = _trials(policy, "warmup", seed=1)
    _write(log, "campaign", warmup + _trials(policy, "train", seed=2))
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_actor, CriticActor, config, "critic-0")
        async with connect(config, "test") as peers:
            await trio.sleep(0.5)
            assert not [e for _, e in log.events(kinds=["critic_values"])]  # admitted, but waiting for warm-up
            ids = sorted({e.trial_id for e in warmup})
            reply = await peers("critic").call_bulk(Generic(op="critic_warmup", args={"trial_ids": ids}))
            assert isinstance(reply, Ack) and f"{BATCH} trajectories" in reply.detail
            again = await peers("critic").call_bulk(Generic(op="critic_warmup", args={"trial_ids": ids}))
            assert "already warm" in again.detail
        values = await _wait_for(log, "critic_values", BATCH)
        nursery.cancel_scope.cancel()
    assert len([e for _, e in log.events(kinds=["critic_warmup"])]) == 1
    assert {v.trial_id for v in values} == {e.trial_id for e in _trials(policy, "train", seed=2)}
