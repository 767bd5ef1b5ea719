"""Trial orchestration (t1_actors.rollout.trials) on real engines in one process: eval, warm-up and PPO batches."""

from __future__ import annotations

import itertools

import pytest
import trio
from fixtures.trials import play_in_world

from schemas import EvalResult, StalenessDecision, TrajectoryAssembled, TrialEnded, TrialIssued, VerifierResult
from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.backends.torch_sampler import TorchSampler
from t1_actors.policy.sampling import SamplingParams
from t1_actors.policy.tokenizer import special_token_ids
from t1_actors.rollout import RolloutLimits
from t1_actors.rollout.admission import StalenessConfig, admit, grouped, policy_lag, trials_to_launch
from t1_actors.rollout.eval_pass import run_eval
from t1_actors.rollout.inprocess import InProcessPorts
from t1_actors.rollout.play import play_all, run_warmup
from t1_actors.rollout.trials import TrialRunner, eval_seed, run_batches
from t1_actors.stats import wilson_interval


def test_admission_rules():
    assert policy_lag(5, 3) == 2
    assert admit(0, 0) and admit(1, 1) and not admit(2, 1)
    with pytest.raises(ValueError, match="negative policy lag"):
        admit(-1, 1)
    assert trials_to_launch(32, 0.25) == 40 and trials_to_launch(4, 0.0) == 4
    assert trials_to_launch(32, 1.0, max_in_flight=48) == 48 and trials_to_launch(32, 0.25, max_in_flight=8) == 32
    with pytest.raises(ValueError, match="max_in_flight = 8 is below batch_size = 32"):
        StalenessConfig(batch_size=32, max_in_flight=8)
    low, high = wilson_interval(50, 100)
    assert 0.40 < low < 0.5 < high < 0.6
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert list(itertools.islice(grouped(itertools.cycle(["a", "b"]), 3), 7)) == list("aaabbba")


def test_a_group_baseline_without_groups_is_refused_before_anything_starts(tmp_path):
    import re
    from pathlib import Path

    from t1_actors.job.main import load_campaign_config
    from t1_actors.runtime.config import ConfigError

    text = (Path(__file__).resolve().parent.parent / "configs" / "tiny.toml").read_text()
    text = re.sub(r"(?m)^(advantage_estimator|group_size) = .*$", "", text)
    path = tmp_path / "run.toml"
    text = re.sub(r"(?m)^\[ppo\].*$", '[ppo]\nadvantage_estimator = "rloo"', text)
    path.write_text(re.sub(r"(?m)^\[staleness\].*$", "[staleness]\ngroup_size = 1", text))
    with pytest.raises(ConfigError, match="group_size >= 2"):
        load_campaign_config(path)


def test_eval_scores_every_task_and_logs_the_facts(trial_world):
    async def body(ports, runner, tasks):
        return ports, await run_eval(runner, [t.id for t in tasks[:6]], label="before", concurrency=4)

    ports, result = play_in_world(trial_world, body)
    assert isinstance(result, EvalResult) and result.n == 6 and 0 <= result.resolved <= 6
    assert result.ci_low <= result.resolved / 6 <= result.ci_high
    assert sum(isinstance(e, TrialIssued) for e in ports.events) == 6
    assert any(isinstance(e, EvalResult) for e in ports.events)


def test_evals_draw_common_random_numbers_and_training_trials_do_not(trial_world):
    """Two evals of one policy sample the same tokens task by task (eval_seed), so a task that flips between
    a run's before and after evals flipped because of the update; training trials keep independent draws."""
    async def body(ports, runner, tasks):
        ids = [t.id for t in tasks[:4]]
        return [await play_all(runner, ids, split, assemble=False, concurrency=4)
                for split in ("eval", "eval", "train", "train")]

    def sampled(outcomes):
        return {o.task_id: [t.generation.output_ids.tolist() for t in o.rollout.turns] for o in outcomes}

    first_eval, second_eval, first_train, second_train = (sampled(p) for p in play_in_world(trial_world, body, seed=None))
    assert first_eval == second_eval
    assert first_train != second_train
    assert eval_seed("a", 0) == eval_seed("a", 0) != eval_seed("a", 1) != eval_seed("b", 1)


def test_warmup_logs_trajectories_with_zero_drift(trial_world):
    async def body(ports, runner, tasks):
        return ports, await run_warmup(runner, [t.id for t in tasks[:4]], concurrency=4)

    ports, trial_ids = play_in_world(trial_world, body)
    trajectories = [e for e in ports.events if isinstance(e, TrajectoryAssembled)]
    assert {t.trial_id for t in trajectories} == set(trial_ids) and trial_ids
    for t in trajectories:
        assert (t.loss_mask == 1).sum() > 0 and t.routing is not None


def test_batches_admit_exactly_the_batch_and_record_the_cut_tail(trial_world):
    config = StalenessConfig(batch_size=3, oversample=1.0, max_staleness=1, on_cancel="continue")

    async def body(ports, runner, tasks):
        cycle = itertools.cycle([t.id for t in tasks])
        batches = {"n": 0}

        async def wait_for_learner(version):
            ports.version = max(ports.version, batches["n"])  # a learner that keeps up

        def until():
            batches["n"] = stats.batches
            return stats.batches >= 2

        from t1_actors.rollout.trials import BatchStats
        stats = BatchStats()
        await run_batches(runner, lambda: next(cycle), config, until=until, wait_for_learner=wait_for_learner,
                          stats=stats)
        return ports, stats

    ports, stats = play_in_world(trial_world, body)
    decisions = [e for e in ports.events if isinstance(e, StalenessDecision)]
    admitted = [d for d in decisions if d.decision == "admit"]
    assert stats.batches == 2 and len(admitted) == 6 == stats.admitted
    assert {d.decision for d in decisions} <= {"admit", "drop", "cancel", "resume"}
    assert stats.cancelled == sum(d.decision == "cancel" for d in decisions)
    assert not ports.sandboxes, "every sandbox is closed at the end, cancelled ones included"


def test_training_part_of_the_policy_on_the_megatron_learner_is_refused_before_anything_starts(tmp_path):
    from pathlib import Path

    from t1_actors.job.main import load_campaign_config
    from t1_actors.runtime.config import ConfigError

    text = (Path(__file__).resolve().parent.parent / "configs" / "tiny.toml").read_text()
    assert 'actor_params = ["*"]' in text  # the recipe trains every weight; the norm-gain variant is a line away
    text = text.replace('actor_params = ["*"]', 'actor_params = ["*norm*"]', 1)
    path = tmp_path / "run.toml"
    path.write_text(text.replace('backend = "torch"\nthreads = 1', 'backend = "megatron"\nthreads = 1', 1))
    with pytest.raises(ConfigError, match=r"actor_params = \['\*norm\*'\] but \[learner\] backend = 'megatron'"):
        load_campaign_config(path)


class _SandboxLostBeforeContinuations(InProcessPorts):
    """The verifier actor's answer when a trial's sandbox is gone (its sandbox actor was killed and its roots
    swept): a VerifierResult with infra_error, named by the trial asking (``VerifierActor.verify``). Here:
    every continuation's. Every other original trial samples slowly, so the batch fills before it ends and it
    is cut and continued."""

    async def generate(self, trial_id, turn, prompt_ids, seed=None, temperature=None, prefix=None,
                       record_routing=True):
        if "~" not in trial_id and int(trial_id[-1]) % 2:
            await trio.sleep(1.0)
        return await super().generate(trial_id, turn, prompt_ids, seed=seed, temperature=temperature, prefix=prefix,
                                      record_routing=record_routing)

    async def verify(self, trial_id, task_id, *, sandbox_id=None):
        if sandbox_id is None:  # the trial's own sandbox: an original's
            return await super().verify(trial_id, task_id)
        event = VerifierResult(trial_id=trial_id, task_id=task_id, tests={}, passed=0, total=0, reward=0.0,
                               reward_scale=20, verifier_sha256="", infra_error=f"no open sandbox of trial {sandbox_id}")
        self.events.append(event)
        return event


def test_a_continuation_whose_verification_fails_still_reaches_its_own_final_state(trial_world):
    from tools._replay.audit import audit_events

    config = StalenessConfig(batch_size=2, oversample=2.0, max_staleness=4, on_cancel="continue")
    tasks, tokenizer, model, sandbox, verifier = trial_world
    stop = special_token_ids(tokenizer)["<|im_end|>"]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, stop_ids=(stop,), seed=2)

    async def main():
        from t1_actors.rollout.trials import BatchStats

        async with TorchSampler.open(model, config=SamplerConfig(max_batch=16)) as sampler:
            ports = _SandboxLostBeforeContinuations(sampler, {t.id: t for t in tasks}, params, sandbox, verifier)
            runner = TrialRunner(ports, ports.tasks, tokenizer, RolloutLimits(max_turns=2, max_new_tokens=24))
            cycle = itertools.cycle([t.id for t in tasks])
            stats = BatchStats()

            async def wait_for_learner(version):
                ports.version = max(ports.version, stats.batches)

            await run_batches(runner, lambda: next(cycle), config, wait_for_learner=wait_for_learner, stats=stats,
                              until=lambda: stats.batches >= 6 or any(  # a continuation ran to its verification
                                  isinstance(e, TrialEnded) and "~" in e.trial_id for e in ports.events))
            return ports, stats

    ports, stats = trio.run(main)
    assert stats.resumed > 0, "no continuation was played: nothing was tested"
    lost = [e for e in ports.events if isinstance(e, VerifierResult) and e.infra_error is not None]
    continuations = {e.trial_id: e.resumed_from for e in ports.events
                     if isinstance(e, TrialIssued) and e.resumed_from is not None}
    assert lost and all(e.trial_id in continuations for e in lost)  # named by the continuation, not its original
    assert not {continuations[e.trial_id] for e in lost} & {  # and its original holds no result of its continuation
        e.trial_id for e in ports.events if isinstance(e, VerifierResult) and e.infra_error is not None}
    audit = audit_events((str(i), e) for i, e in enumerate(ports.events))
    assert audit.trials_unaccounted == 0 and audit.trials_final_twice == 0, audit.to_json()
    assert audit.trials_verified_twice == 0 and audit.trials_verified > 0, audit.to_json()
    assert audit.final_states["failed"] >= len(lost), audit.to_json()  # its own final state: its failed verification


def test_a_pass_left_half_played_goes_on_from_its_verified_attempts(trial_world):
    """A staleness controller killed mid-pass (alone, or with the whole campaign) left some attempts verified and
    one closed as abandoned: the next controller plays only the others, under the same label, and the pass's
    EvalResult is the one the uninterrupted pass gives (seeded draws), each attempt counted once, as the log's
    fold (labelled_attempts) counts them."""
    from t1_actors.rollout.eval_pass import finished_eval_attempts
    from t1_actors.rollout.recovery import ABANDONED
    from t1_actors.stats import labelled_attempts

    async def body(ports, runner, tasks):
        ids = [t.id for t in tasks[:4]]
        whole = await run_eval(runner, ids, label="before", concurrency=4, samples=2)
        by_trial = {e.trial_id: e for e in ports.events if isinstance(e, TrialIssued)}
        kept = [t for t, e in by_trial.items() if e.task_id in ids[:2]]  # verified before the kill
        cut = next(t for t, e in by_trial.items() if e.task_id == ids[2] and e.sample == 0)  # in flight at the kill
        dead = [e for e in ports.events if getattr(e, "trial_id", None) in kept]
        dead += [by_trial[cut], TrialEnded(trial_id=cut, finish="abandoned", infra_error=ABANDONED)]
        finished = finished_eval_attempts(dead, {t.id: t.family or "" for t in tasks})["before"]
        ports.events = list(dead)
        resumed = await run_eval(runner, ids, label="before", concurrency=4, samples=2, finished=finished)
        return ports, whole, resumed, set(finished)

    ports, whole, resumed, finished = play_in_world(trial_world, body)
    issued = [e for e in ports.events if isinstance(e, TrialIssued)]
    assert len(finished) == 4  # 2 tasks x 2 samples verified; the abandoned attempt is not finished
    played_again = {(e.task_id, e.sample) for e in issued[5:]}
    assert len(issued) == 4 + 1 + 4 and not played_again & finished  # kept, cut, then only the 4 unfinished
    means = {"mean_reward", "mean_turns"}  # summed in another order: equal up to rounding
    assert resumed.model_dump(exclude=means) == whole.model_dump(exclude=means)
    assert (resumed.mean_reward, resumed.mean_turns) == pytest.approx((whole.mean_reward, whole.mean_turns))
    assert len(labelled_attempts(ports.events)["before"]) == resumed.n == 8
