"""The validation probe during RL (``[eval] probe_every``): played by the schedule between learner steps with the
policy of that step, never trained on, skipped on restart when its label is in the log; and its config rules."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
from fixtures.trials import play_in_world

from schemas import EvalResult, StalenessDecision, TrajectoryAssembled, TrialIssued
from t1_actors.eval.protocol import EvalConfig, probe_due, probe_label, probe_task_ids
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.rollout.trials import BatchStats
from t1_actors.schedule import CampaignConfig, Controller, TaskSplits, play_schedule, steps_taken

TINY = Path(__file__).resolve().parent.parent / "configs" / "tiny.toml"
BATCH = 2


def test_the_probe_is_due_every_n_steps_but_never_after_the_last():
    assert [k for k in range(13) if probe_due(k, 4, 12)] == [4, 8]
    assert [k for k in range(13) if probe_due(k, 4, None)] == [4, 8, 12]  # RL ends by its clock: no last step known
    assert not any(probe_due(k, 0, 12) for k in range(13))
    assert probe_label(10) == "probe_s10" and re.fullmatch(r"probe_s(\d+)", probe_label(10))
    ids = [f"v{i}" for i in range(5)]
    assert probe_task_ids(ids, EvalConfig(probe_tasks=3)) == ["v0", "v1", "v2"]
    assert probe_task_ids(ids, EvalConfig()) == ids


class _Logger:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def info(self, event: str, **fields) -> None:
        self.lines.append((event, fields))

    warning = info


def _play(world, *, learned_before: int = 0, logged: tuple = (), pending_before: int = 0):
    """The schedule (SFT passes read elsewhere, no warm-up) with 6 PPO steps of 2 trials and a probe every 2 steps
    on 3 of 5 validation tasks, against a learner that trains each full batch admitted in 0.3 s (its version: the
    steps before plus the batches trained, ``pending_before`` trials admitted before and not trained first), and a
    sampler that serves the learner's newest version."""
    campaign = CampaignConfig(warmup_trials=0, rl_steps=6, rl_seconds=600, eval_concurrency=4)
    staleness = StalenessConfig(batch_size=BATCH, oversample=0.5, max_in_flight=4)
    eval_config = EvalConfig(temperatures=[1.0], pass_k_tasks=0, sft_passes="warm_start", probe_every=2,
                             probe_tasks=3)
    served: dict[str, set[int]] = {}
    paused: list[float] = []
    logger = _Logger()

    async def body(ports, runner, tasks):
        ids = [t.id for t in tasks]
        splits = TaskSplits(rl=ids[:14], validation=ids[14:19], eval=ids[19:21], pass_k=[])
        ports.version = learned_before
        generate = ports.generate

        async def serving_the_learners_version(trial_id, turn, prompt_ids, **kwargs):
            generation = dataclasses.replace(await generate(trial_id, turn, prompt_ids, **kwargs),
                                             policy_version=ports.version)
            served.setdefault(trial_id, set()).add(generation.policy_version)
            return generation

        ports.generate = serving_the_learners_version

        async def learner() -> None:  # one step per full batch admitted, each taking a while
            while True:
                admitted = sum(isinstance(e, StalenessDecision) and e.decision == "admit" for e in ports.events)
                if learned_before + (pending_before + admitted) // BATCH > ports.version:
                    await trio.sleep(0.3)
                    ports.version += 1
                await trio.sleep(0.01)

        async def wait_for_version(version, until) -> None:
            while ports.version < version and not until():
                await trio.sleep(0.01)

        async def events(kind):
            return [e for e in (*logged, *ports.events) if e.kind == kind]

        async def no_warmup(trial_ids) -> None:
            raise AssertionError("no warm-up in this schedule")

        controller = Controller(logger=logger, version=lambda: ports.version, wait_for_version=wait_for_version,
                                events=events, rl_seconds_left=lambda: 600.0, warm_up_critic=no_warmup,
                                pause_rl_clock=paused.append)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(learner)
            with trio.fail_after(300):
                await play_schedule(runner, controller, splits, campaign=campaign, staleness=staleness,
                                    eval_config=eval_config, run_temperature=1.0, stats=BatchStats())
            nursery.cancel_scope.cancel()
        return ports.events, splits

    events, splits = play_in_world(world, body, seed=None)
    return events, splits, served, paused, logger


def _check_probe(events, splits, served, step: int, *, admitted_before: int) -> None:
    """Probe ``step``: its 3 fixed validation tasks, each trial sampled by version ``step`` only, played after
    ``admitted_before`` admissions and with no train trial issued until its result was logged."""
    name = probe_label(step)
    issued = [i for i, e in enumerate(events) if isinstance(e, TrialIssued) and e.label == name]
    [result] = [i for i, e in enumerate(events) if isinstance(e, EvalResult) and e.label == name]
    trials = [events[i] for i in issued]
    assert sorted(t.task_id for t in trials) == sorted(splits.validation[:3])
    assert {t.split for t in trials} == {"eval"} and {t.policy_version_wanted for t in trials} == {step}
    assert {v for t in trials for v in served.get(t.trial_id, set())} <= {step}
    assert events[result].policy_version == step and events[result].temperature == 1.0 and not events[result].last
    admits = sum(isinstance(e, StalenessDecision) and e.decision == "admit" for e in events[:issued[0]])
    assert admits == admitted_before, (name, admits)
    assert not [e for e in events[issued[0]:result] if isinstance(e, TrialIssued) and e.split == "train"], \
        f"a train trial was issued while {name} ran"


def _nothing_of_a_probe_reaches_the_learner(events) -> None:
    probe_trials = {e.trial_id for e in events if isinstance(e, TrialIssued) and e.label.startswith("probe_s")}
    assert probe_trials
    assert not [e for e in events if isinstance(e, (StalenessDecision, TrajectoryAssembled))
                and e.trial_id in probe_trials]


def test_probes_run_between_steps_with_that_steps_policy_and_never_reach_the_learner(trial_world):
    events, splits, served, paused, logger = _play(trial_world)
    labels = [e.label for e in events if isinstance(e, EvalResult)]
    assert labels == ["probe_s2", "probe_s4", "rl_val_T1", "after"]  # none after step 6, RL's last
    for step in (2, 4):
        _check_probe(events, splits, served, step, admitted_before=step * BATCH)
    _nothing_of_a_probe_reaches_the_learner(events)
    assert len(paused) == 2 and all(p > 0 for p in paused)  # RL's clock stood still while each ran
    phases = [fields for event, fields in logger.lines if event == "phase"]
    assert {"phase": "probe s2", "policy_version": 2, "n": 3} in phases


def test_a_restarted_schedule_plays_the_missing_probe_first_and_skips_the_logged_one(trial_world):
    """A predecessor died after step 4 was trained, before its probe was logged (probe s2 was): the restarted
    schedule plays probe s4 before issuing any train trial, never probe s2 again, then RL's last 2 steps."""
    logged = (SimpleNamespace(kind="weights_published", version=4),
              EvalResult(label="probe_s2", policy_version=2, n=3, resolved=0, mean_reward=0.0, ci_low=0.0,
                         ci_high=1.0, temperature=1.0))
    events, splits, served, paused, _ = _play(trial_world, learned_before=4, logged=logged)
    labels = [e.label for e in events if isinstance(e, EvalResult)]
    assert labels == ["probe_s4", "rl_val_T1", "after"]
    _check_probe(events, splits, served, 4, admitted_before=0)
    assert sum(isinstance(e, StalenessDecision) and e.decision == "admit" for e in events) == 2 * BATCH
    _nothing_of_a_probe_reaches_the_learner(events)


def test_a_batch_admitted_before_a_restart_and_not_yet_trained_is_a_step_taken(trial_world):
    """The controller died (alone or with the whole campaign) after steps 0-1 were published, with a third batch
    admitted and one trial of a fourth: the learner will still train that batch, so the restarted schedule counts
    it (steps_taken = 3), takes RL's last 3 steps (6 in all, rl_steps), not 4, and evaluates version 6."""
    def admit(i: int) -> StalenessDecision:
        return StalenessDecision(trial_id=f"dead-{i}", decision="admit", lag=0, policy_version=0)

    logged = (SimpleNamespace(kind="weights_published", version=2), *[admit(i) for i in range(2 * BATCH + 3)])
    assert steps_taken([logged[0]], logged[1:], BATCH) == 3 and steps_taken([logged[0]], [], BATCH) == 2
    events, splits, served, _, _ = _play(trial_world, learned_before=2, logged=logged, pending_before=3)
    assert sum(isinstance(e, StalenessDecision) and e.decision == "admit" for e in events) == 3 * BATCH
    results = {e.label: e for e in events if isinstance(e, EvalResult)}
    assert list(results) == ["probe_s4", "rl_val_T1", "after"]  # step 3 + the first new batch = step 4's probe
    assert results["after"].policy_version == 6 and results["probe_s4"].policy_version == 4
    train = [e.trial_id for e in events if isinstance(e, TrialIssued) and e.split == "train"]
    assert {v for t in train for v in served.get(t, set())} <= {2, 3, 4, 5}  # batch k once the learner is at k - 1


def _tiny_with(tmp_path, eval_lines: str, rl_steps: int = 40) -> Path:
    text = TINY.read_text().replace("rl_steps = 40 ", f"rl_steps = {rl_steps} ", 1)
    path = tmp_path / "run.toml"
    path.write_text(re.sub(r"(?m)^\[eval\].*$", "[eval]\n" + eval_lines, text, count=1))
    return path


def test_a_probe_that_could_not_run_is_refused_before_anything_starts(tmp_path):
    from t1_actors.job.main import load_campaign_config
    from t1_actors.runtime.config import ConfigError

    config = load_campaign_config(_tiny_with(tmp_path, "probe_every = 10\nprobe_tasks = 96"))
    assert (config.eval.probe_every, config.eval.probe_tasks) == (10, 96)  # 48 single + 48 recovery tasks
    with pytest.raises(ConfigError, match=r"probe_tasks = 97 but the validation split holds 96 tasks"):
        load_campaign_config(_tiny_with(tmp_path, "probe_every = 10\nprobe_tasks = 97"))
    with pytest.raises(ConfigError, match=r"probe_every = 40 but \[campaign\] rl_steps = 40: no probe"):
        load_campaign_config(_tiny_with(tmp_path, "probe_every = 40"))
    with pytest.raises(ConfigError, match=r"probe_every = 1 but \[campaign\] rl_steps = 1: no probe"):
        load_campaign_config(_tiny_with(tmp_path, "probe_every = 1", rl_steps=1))
    empty = _tiny_with(tmp_path, "probe_every = 10").read_text()
    empty = re.sub(r"(?m)^(validation_size|recovery_validation) = \d+", r"\1 = 0", empty)
    (tmp_path / "empty.toml").write_text(empty)
    with pytest.raises(ConfigError, match=r"probe_every = 10 but the validation split is empty"):
        load_campaign_config(tmp_path / "empty.toml")
    with pytest.raises(ConfigError, match="probe_tasks"):
        load_campaign_config(_tiny_with(tmp_path, "probe_every = 10\nprobe_tasks = 0"))
    with pytest.raises(ConfigError, match="probe_every"):
        load_campaign_config(_tiny_with(tmp_path, "probe_every = -1"))
