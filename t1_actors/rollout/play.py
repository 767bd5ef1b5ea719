"""Trials played one by one to their end, outside the batch schedule: ``play_once`` (issue, play in a fresh
sandbox, verify, close), ``play_all`` (many at a bounded concurrency: the eval passes, the probe) and ``run_warmup``
(the critic's warm-up trajectories)."""

from __future__ import annotations

from collections.abc import Container

import trio

from schemas import TrialIssued
from t1_actors import tito
from t1_actors.rollout.loop import TrialRollout
from t1_actors.rollout.trials import TrialOutcome, TrialRunner


async def play_once(runner: TrialRunner, task_id: str, split: str, *, assemble: bool, label: str = "",
                    sample_index: int = 0, temperature: float | None = None) -> TrialOutcome:
    """Issue one trial of a task, play it in a fresh sandbox, verify it, and always close the sandbox.

    ``label`` names the eval pass the trial belongs to (``TrialIssued.label``); eval trials are seeded. A sandbox
    that cannot be opened ends the trial as an infrastructure failure (``TrialRunner.end_unopened``)."""
    trial_id = runner.new_trial_id(split)
    await runner.ports.log(TrialIssued(trial_id=trial_id, task_id=task_id, split=split, label=label,
                                       sample=sample_index, temperature=temperature,
                                       policy_version_wanted=runner.ports.learner_version()))
    unopened = await runner.open_sandbox(trial_id, task_id)
    if unopened is not None:
        outcome = await runner.end_unopened(trial_id, task_id, TrialRollout(), unopened, assemble=assemble)
        outcome.sample = sample_index
        return outcome
    try:
        rollout = await runner.play(trial_id, task_id, seeded=split == "eval", sample_index=sample_index,
                                    temperature=temperature, trained=assemble)
        outcome = await runner.finish(trial_id, task_id, rollout, assemble=assemble)
        outcome.sample = sample_index
        return outcome
    finally:
        await runner.close_sandbox(trial_id)


async def play_all(runner: TrialRunner, task_ids: list[str], split: str, *, assemble: bool,
                   concurrency: int, label: str = "", samples: int = 1, temperature: float | None = None,
                   skip: Container[tuple[str, int]] = ()) -> list[TrialOutcome]:
    """``play_once`` ``samples`` times for every task, at most ``concurrency`` at a time; not the (task, sample)
    pairs in ``skip`` (played already)."""
    outcomes: list[TrialOutcome] = []
    limiter = trio.CapacityLimiter(concurrency)

    async def one(task_id: str, sample_index: int) -> None:
        async with limiter:
            outcomes.append(await play_once(runner, task_id, split, assemble=assemble, label=label,
                                            sample_index=sample_index, temperature=temperature))

    async with trio.open_nursery() as nursery:
        for sample_index in range(samples):
            for task_id in task_ids:
                if (task_id, sample_index) not in skip:
                    nursery.start_soon(one, task_id, sample_index)
    return outcomes


async def run_warmup(runner: TrialRunner, task_ids: list[str], *, concurrency: int) -> list[str]:
    """Offline trajectories for the critic's warm-up: train tasks played by the SFT policy, logged, not admitted."""
    outcomes = await play_all(runner, task_ids, "warmup", assemble=True, concurrency=concurrency)
    logged = [o for o in outcomes if o.chunks]
    # one commit: a warm-up's trajectories are in the log all together or not at all (schedule: a restarted
    # controller that finds them hands them to the critic instead of playing the warm-up again)
    await runner.ports.log(*[tito.to_event(c, trial_id=o.trial_id, task_id=o.task_id) for o in logged for c in o.chunks])
    return [o.trial_id for o in logged]
