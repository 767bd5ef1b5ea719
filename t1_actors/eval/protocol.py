"""Telling a skill from sharpening: the eval protocol the campaign runs on the SFT policy and on the RL policy.

A gain at T = 1.0 that the SFT policy reaches by a lower temperature is sharpening, not a skill. So each
policy gets, in this order (every pass seeded by ``trials.eval_seed``: common random numbers across
policies, temperatures and passes):

1. the validation split at every temperature of ``[eval] temperatures``; its best temperature is the one
   resolving most validation tasks (ties: higher mean reward, then the temperature nearest the run's);
2. the eval split at the run's sampling temperature (labels ``before`` / ``after``, as always);
3. the eval split at the best temperature (``sft_best`` / ``rl_best``; skipped when that is the run's
   temperature: the pass of step 2 is the same draw);
4. ``pass_k_samples`` attempts at each of ``pass_k_tasks`` fixed eval tasks at the best temperature
   (``sft_passk`` / ``rl_passk``): pass@k for k = 1..n. A skill lifts the whole curve, sharpening crosses it.

Each pass is one ``EvalResult`` in the log, its trials labelled with it (``TrialIssued.label``); a pass
already in the log is not run again (a restarted staleness controller resumes the protocol), and a pass it
left half played goes on from the attempts already verified (``rollout.eval_pass``: each counted once). The
statistics of the comparison live in ``t1_actors.stats``.

During RL, with ``[eval] probe_every = N``, the staleness controller also plays a fixed validation probe
(the first ``probe_tasks`` validation tasks, at the run's temperature, seeded like every pass) after
learner steps N, 2N, ... (not after RL's last step: the RL policy's passes above cover it), labelled
``probe_s{K}`` (``probe_label``): the resolved rate along RL, each point one policy version
(``t1_actors.schedule``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas import EvalResult
from t1_actors.rollout.eval_pass import EvalAttempt, run_eval
from t1_actors.rollout.trials import TrialRunner
from t1_actors.tasks.synthetic import LONG_FAMILIES

POLICIES = ("sft", "rl")
AT_RUN_TEMPERATURE = {"sft": "before", "rl": "after"}  # the labels summary.json has always read


class EvalConfig(BaseModel):
    """[eval]: the protocol's sizes. The split sizes themselves are [tasks] (eval_size, validation_size,
    composite_eval, composite_validation)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperatures: list[float] = Field([0.1, 0.25, 0.5, 0.7, 1.0], min_length=1,
                                      description="the grid each policy's best temperature is chosen from, on "
                                                  "the validation split")
    pass_k_tasks: int = Field(32, ge=0, description="eval tasks of the pass@k curve (long, then recovery and "
                                                    "composite tasks first, in eval order); 0: no pass@k")
    pass_k_samples: int = Field(16, ge=1, description="attempts per pass@k task: pass@k for k = 1..this")
    probe_every: int = Field(0, ge=0, description="during RL, play the validation probe after every this many "
                                                  "learner steps (K = N, 2N, ..., not after RL's last step), "
                                                  "labelled probe_s{K}, with policy version K, at the run's "
                                                  "temperature; trial admission pauses while it runs and its "
                                                  "trials are never trained on; 0: no probe")
    probe_tasks: int | None = Field(None, gt=0, description="the probe's tasks: the first this many of the "
                                                           "validation split, the same at every probe; None: the "
                                                           "whole split")
    sft_passes: Literal["run", "warm_start"] = Field(
        "run", description="where the SFT policy's passes come from: this run plays them ('run'), or they are "
                           "read from the log of [campaign] warm_start_from ('warm_start': the same policy, tasks "
                           "and eval seeds give the same draws, so RL seeds sharing one SFT pair against one pass)")

    @field_validator("temperatures")
    @classmethod
    def _positive(cls, grid: list[float]) -> list[float]:
        if any(t <= 0 for t in grid) or len(set(grid)) != len(grid):
            raise ValueError(f"[eval] temperatures = {grid}: each must be > 0 and appear once")
        return sorted(grid)


def label(policy: str, what: str, temperature: float | None = None) -> str:
    """The label of one pass: ``sft_val_T0.5``, ``rl_best``, ``sft_passk``, or before / after."""
    if what == "run":
        return AT_RUN_TEMPERATURE[policy]
    return f"{policy}_val_T{temperature:g}" if what == "val" else f"{policy}_{what}"


def probe_label(step: int) -> str:
    """The label of the validation probe played with the policy of learner step ``step``: ``probe_s{step}``."""
    return f"probe_s{step}"


def probe_step(label: str) -> int | None:
    """The learner step of a validation probe's label (``probe_label``'s inverse); None for any other label."""
    prefix = "probe_s"
    step = label[len(prefix):]
    return int(step) if label.startswith(prefix) and step.isdigit() and step.isascii() else None


def probe_due(step: int, every: int, last_step: int | None) -> bool:
    """Whether the probe is played after learner step ``step``: ``every`` > 0, ``step`` = N, 2N, ... and not RL's
    last step (``last_step``: ``[campaign] rl_steps``; None: RL ends by its clock, no step is known to be last)."""
    return every > 0 and step > 0 and step % every == 0 and (last_step is None or step < last_step)


def probe_task_ids(validation_ids: list[str], config: EvalConfig) -> list[str]:
    """The probe's fixed tasks: the first ``probe_tasks`` validation tasks (all of them when None)."""
    return list(validation_ids[: config.probe_tasks])


def best_temperature(grid: dict[float, EvalResult], run_temperature: float) -> float:
    """The temperature resolving the most validation trials; ties: higher mean reward, then the one
    nearest ``run_temperature``."""
    if not grid:
        raise ValueError("no validation pass to choose a temperature from")
    return max(grid, key=lambda t: (grid[t].resolved / max(grid[t].n, 1), grid[t].mean_reward,
                                    -abs(t - run_temperature)))


SKILL_KINDS = ("recovery", "composite")  # task kinds whose skill SFT never demonstrates


def pass_k_subset(eval_tasks: Sequence, n: int) -> list[str]:
    """The fixed pass@k tasks: the first ``n`` eval tasks of the long families (what a long-horizon run is
    about), then of the skill kinds (recovery, composite), then single-requirement ones, each in eval order."""
    def rank(task) -> int:
        family = task.family or ""
        return 0 if family in LONG_FAMILIES else 1 if family.startswith(SKILL_KINDS) else 2

    return [t.id for t in sorted(eval_tasks, key=rank)][:n]  # sorted is stable: eval order within a rank


async def evaluate_policy(runner: TrialRunner, policy: str, *, validation_ids: list[str], eval_ids: list[str],
                          pass_k_ids: list[str], config: EvalConfig, run_temperature: float, concurrency: int,
                          done: dict[str, EvalResult],
                          on_pass: Callable[[str], Awaitable[None]] | None = None,
                          finished: Mapping[str, Mapping[tuple[str, int], EvalAttempt]] | None = None) -> float:
    """Run the protocol's passes for ``policy`` ("sft" or "rl") that ``done`` (label -> logged result)
    lacks; returns the best temperature chosen on validation (the run's when there is no validation split).
    ``finished``: per label, the attempts a dead controller already played to a score (a pass it left half
    played goes on from them: ``eval_pass.run_eval``)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")

    async def run(name: str, task_ids: list[str], temperature: float | None, samples: int = 1,
                  last: bool = False) -> EvalResult:
        if name not in done:
            if on_pass is not None:
                await on_pass(name)
            done[name] = await run_eval(runner, task_ids, label=name, concurrency=concurrency,
                                        temperature=temperature, samples=samples, last=last,
                                        finished=(finished or {}).get(name))
        return done[name]

    grid: dict[float, EvalResult] = {}
    if validation_ids:
        for temperature in config.temperatures:
            grid[temperature] = await run(label(policy, "val", temperature), validation_ids, temperature)
    best = best_temperature(grid, run_temperature) if grid else run_temperature
    with_best, with_pass_k = best != run_temperature, bool(pass_k_ids and config.pass_k_tasks)
    await run(label(policy, "run"), eval_ids, None, last=not (with_best or with_pass_k))
    if with_best:
        await run(label(policy, "best"), eval_ids, best, last=not with_pass_k)
    if with_pass_k:
        await run(label(policy, "passk"), pass_k_ids, best, samples=config.pass_k_samples, last=True)
    return best
