"""One eval pass's figures, and the attempts of a pass a dead staleness controller left half played.

An eval pass (``trials.run_eval``) plays every (task, sample) of its tasks and logs one ``EvalResult``. A
controller killed mid-pass (alone, or with the whole campaign: ``t1-actor launch --resume``) leaves some of
those attempts verified in the log and the others open (closed by ``rollout.recovery``). The restarted
controller keeps the verified ones (``finished_eval_attempts``) and plays only the rest, under the same label;
the pass's ``EvalResult`` counts each attempt once (``eval_result``), and ``stats.labelled_attempts`` folds the
log to the same attempts (per label, task and sample: the trial issued last).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from schemas import EvalResult, TrialEnded, TrialIssued, VerifierResult
from t1_actors.rollout.play import play_all
from t1_actors.rollout.trials import TrialRunner, resolved_by
from t1_actors.stats import eval_reward, wilson_interval


@dataclass(frozen=True)
class EvalAttempt:
    """One attempt of an eval pass as its ``EvalResult`` counts it: played now or read back from the log."""

    task_id: str
    sample: int
    family: str
    result: VerifierResult | None  # None: the agent loop ended without a verification (no turn played)
    turns: int
    versions: tuple[int, ...]  # the policy versions its turns were sampled with (read back: the version it wanted)

    @property
    def scored(self) -> bool:
        return self.result is not None and self.result.infra_error is None

    @property
    def resolved(self) -> bool:
        return resolved_by(self.result)


def finished_eval_attempts(events: Iterable, families: dict[str, str]) -> dict[str, dict[tuple[str, int], EvalAttempt]]:
    """Per label of a pass: the attempts (task, sample) the log shows verified with a score, their trial's ending
    logged. ``families``: task id -> family (an ``EvalResult`` counts per family). A pass whose ``EvalResult`` is
    logged is over: the caller skips it whole. Attempts that failed (an infrastructure error, an abandoned trial)
    are not finished: they are played again."""
    issued: dict[tuple[str, str, int], TrialIssued] = {}
    ended: dict[str, TrialEnded] = {}
    results: dict[str, VerifierResult] = {}
    for event in events:
        if isinstance(event, TrialIssued) and event.split == "eval" and event.label:
            issued[(event.label, event.task_id, event.sample)] = event
        elif isinstance(event, TrialEnded):
            ended[event.trial_id] = event
        elif isinstance(event, VerifierResult):
            results[event.trial_id] = event
    out: dict[str, dict[tuple[str, int], EvalAttempt]] = {}
    for (label, task_id, sample), trial in issued.items():
        result, ending = results.get(trial.trial_id), ended.get(trial.trial_id)
        if result is None or result.infra_error is not None or ending is None or ending.infra_error is not None:
            continue
        out.setdefault(label, {})[(task_id, sample)] = EvalAttempt(
            task_id, sample, families.get(task_id, ""), result, ending.turns, (trial.policy_version_wanted,))
    return out


def eval_result(label: str, attempts: Sequence[EvalAttempt], *, temperature: float | None, samples: int, last: bool,
                version: int) -> EvalResult:
    """The pass's ``EvalResult`` over its attempts, each counted once: resolved rate (all tests pass) over the
    scored ones (infrastructure failures left out), mean reward (``stats.eval_reward``), the Wilson 95 % CI,
    per-family rates and mean turns. ``version``: the policy version when no turn was sampled."""
    versions = [v for a in attempts for v in a.versions]
    scored = [a for a in attempts if a.scored]
    resolved = sum(a.resolved for a in scored)
    per_family: dict[str, list[float]] = {}
    for a in scored:
        per_family.setdefault(a.family, []).append(float(a.resolved))
    low, high = wilson_interval(resolved, len(scored))
    return EvalResult(label=label, temperature=temperature, samples=samples, last=last,
                      policy_version=max(versions, default=version), n=len(scored), resolved=resolved,
                      mean_turns=float(np.mean([a.turns for a in scored])) if scored else 0.0,
                      mean_reward=float(np.mean([eval_reward(a.result) for a in scored if a.result])) if scored else 0.0,
                      ci_low=low, ci_high=high,
                      per_family={k: float(np.mean(v)) for k, v in sorted(per_family.items())})


async def run_eval(runner: TrialRunner, task_ids: list[str], *, label: str, concurrency: int,
                   temperature: float | None = None, samples: int = 1, last: bool = False,
                   finished: Mapping[tuple[str, int], EvalAttempt] | None = None) -> EvalResult:
    """Every task ``samples`` times with the current policy at ``temperature`` (None: the run's), seeded
    by ``eval_seed``: resolved rate (all tests pass) over the trials, mean (dense: ``eval_reward``) reward, 95 % CI.

    ``finished``: attempts (task, sample) of this pass a dead controller already played to a score
    (``eval_pass.finished_eval_attempts``); those of the current policy version are counted as they are and not
    played again, so a pass resumed after a restart counts each attempt once."""
    version = runner.ports.learner_version()
    kept = {key: a for key, a in (finished or {}).items() if a.versions == (version,)}
    outcomes = await play_all(runner, task_ids, "eval", assemble=False, concurrency=concurrency, label=label,
                              samples=samples, temperature=temperature, skip=kept)
    attempts = list(kept.values()) + [
        EvalAttempt(o.task_id, o.sample, o.family, o.result, len(o.rollout.turns),
                    tuple(t.policy_version for t in o.rollout.turns)) for o in outcomes]
    event = eval_result(label, attempts, temperature=temperature, samples=samples, last=last,
                        version=runner.ports.learner_version())
    await runner.ports.log(event)
    return event
