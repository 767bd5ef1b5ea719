"""The paper's training dynamics, from the log alone: turns and tokens per trajectory before RL, after RL and at
every learner step, how the trials of each step ended, and the validation probe's resolved rate.

    dynamics = Dynamics.fold(log.events(kinds=DYNAMICS_KINDS))
    keys = dynamics.summary()          # summary.json's turns, tokens, per_step, probe
    dynamics.of_label("after")         # the RL policy's eval trials: [Trajectory(turns, tokens, finish, ...)]

- **turns** of a trajectory: its assistant turns (``TrialEnded.turns``; a continuation counts its original's).
- **tokens** of a trajectory: ``trajectory_tokens`` of its turns (prompt and completions of the whole trajectory).
- **before_rl** / **after_rl**: the eval trials labelled ``before`` / ``after``, the eval split played by the SFT
  policy and by the final RL policy at the run's (the RL) sampling temperature. These two passes are the paired
  ones: the same tasks, drawn with the same common random numbers (``t1_actors.eval.protocol``), which the
  best-temperature passes (``sft_best`` / ``rl_best``) are not, each policy having its own temperature.
- **per_step**: the train trials grouped by the learner step that trained them (``LearnerStep.trials``), keyed by
  ``LearnerStep.step``; a trial no step consumed (dropped, cancelled, or left over at the end) is in none.
- **probe**: eval passes labelled ``probe_s{K}`` (the validation split at the RL temperature after K learner
  steps; ``EvalResult`` like any pass), at step K. A run without them has an empty list.

Finishes, truncations and context edits per step are ``Endings.counts`` (``t1_actors.rollout.endings``): the same
fold as summary.json's per-split ``finishes`` / ``truncations`` / ``context_edits``, grouped by step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas import EvalResult, LearnerStep, SamplerTurn, TrialEnded
from t1_actors.eval.protocol import AT_RUN_TEMPERATURE, probe_step
from t1_actors.policy.generation import TurnPrefix
from t1_actors.rollout.endings import ENDING_KINDS, Endings
from t1_actors.rollout.resume import RebuildError, lineage, logged_turns

DYNAMICS_KINDS = [*ENDING_KINDS, "sampler_turn", "learner_step", "eval_result"]
BEFORE_RL, AFTER_RL = AT_RUN_TEMPERATURE["sft"], AT_RUN_TEMPERATURE["rl"]
QUANTILES = {"p10": 10, "p50": 50, "p90": 90}


def trajectory_tokens(turns: Sequence[SamplerTurn]) -> int:
    """Tokens of one trajectory, prompt and completions: T = sum_t (|P_t| - s_t + |a_t|), with P_t turn t's whole
    prompt, a_t its sampled ids and s_t the length of the prefix P_t shares with the previous turn's stream
    S_{t-1} = P_{t-1} ++ a_{t-1} (s_0 = 0; ``TurnPrefix.after``, the comparison the sampler stores turns by).

    ``turns``: the trajectory's turns in order, each whole (``tito.expand_turns``). For a trajectory whose every
    prompt extends the previous stream this is its final length |P_last| + |a_last|, the stream TITO trains; a
    prompt edited to fit the context adds only what it does not share (the system prompt and instruction are
    counted once), so T is the number of distinct positions the sampler computed."""
    total, previous = 0, None
    for turn in turns:
        prompt = np.asarray(turn.prompt_ids)
        shared = 0 if previous is None else TurnPrefix.after(
            np.asarray(previous.prompt_ids), np.asarray(previous.sampled_ids), None, previous.policy_version,
            prompt).shared
        total += len(prompt) - shared + len(turn.sampled_ids)
        previous = turn
    return total


def quantiles(values: Sequence[float]) -> dict[str, float | int] | None:
    """{"mean", "p10", "p50", "p90", "max", "n"} of ``values`` (numpy's linear quantiles); None when empty."""
    if not values:
        return None
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), **{k: float(np.percentile(v, q)) for k, q in QUANTILES.items()},
            "max": float(v.max()), "n": len(v)}


@dataclass(frozen=True)
class Trajectory:
    """One ended trial: its split, eval label, finish, assistant turns and tokens (None: its turns do not
    rebuild from the log)."""

    trial_id: str
    split: str
    label: str
    finish: str
    turns: int
    tokens: int | None


@dataclass
class Dynamics:
    """The fold: trials' endings (``Endings``), their sampler turns, the learner's steps and the probe passes."""

    endings: Endings = field(default_factory=Endings)
    sampler_turns: dict[str, list[SamplerTurn]] = field(default_factory=lambda: defaultdict(list))
    steps: dict[int, LearnerStep] = field(default_factory=dict)
    probes: dict[int, EvalResult] = field(default_factory=dict)
    _trajectories: dict[str, Trajectory] | None = field(default=None, repr=False)

    @classmethod
    def fold(cls, events: Iterable[tuple[Any, Any]]) -> Dynamics:
        """Over ``(event_id, event)`` pairs in log order (kinds other than ``DYNAMICS_KINDS`` are ignored). A step
        or a probe logged twice (a restarted actor) counts once: its last record."""
        dynamics = cls()
        for _event_id, event in events:
            dynamics.endings.add(event)
            if isinstance(event, SamplerTurn):
                dynamics.sampler_turns[event.trial_id].append(event)
            elif isinstance(event, LearnerStep):
                dynamics.steps[event.step] = event
            elif isinstance(event, EvalResult) and (step := probe_step(event.label)) is not None:
                dynamics.probes[step] = event
        return dynamics

    def trajectory(self, end: TrialEnded) -> Trajectory:
        issue = self.endings.issued.get(end.trial_id)
        chain = lineage(end.trial_id, self.endings.issued)
        try:
            tokens: int | None = trajectory_tokens(logged_turns(
                [turn for trial_id in chain for turn in self.sampler_turns.get(trial_id, [])]))
        except RebuildError:
            tokens = None
        return Trajectory(end.trial_id, self.endings.split_of(end.trial_id), issue.label if issue else "",
                          end.finish, end.turns, tokens)

    def trajectories(self) -> dict[str, Trajectory]:
        """Every ended trial by id (its last ``TrialEnded``), in log order; computed once per fold."""
        if self._trajectories is None:
            ends = {end.trial_id: end for end in self.endings.ended}
            self._trajectories = {trial_id: self.trajectory(end) for trial_id, end in ends.items()}
        return self._trajectories

    def of_label(self, label: str) -> list[Trajectory]:
        """The ended trials of the eval pass ``label``, in log order."""
        return [t for t in self.trajectories().values() if t.split == "eval" and t.label == label]

    def step_of(self) -> dict[str, int]:
        """Trial id -> the learner step that trained it."""
        return {trial_id: step for step, event in sorted(self.steps.items()) for trial_id in event.trials}

    def summary(self, before: Dynamics | None = None) -> dict[str, Any]:
        """summary.json's ``turns``, ``tokens`` ({"before_rl", "after_rl": quantiles, "per_step": [{"step", ...
        quantiles}]}), ``per_step`` ([{"step", "policy_version", "trials", "finishes", "truncations",
        "context_edits"}]) and ``probe`` ([{"step", "label", "resolved", "n", "rate", "mean_reward"}]).
        ``before``: the fold the SFT policy's passes come from when another log holds them (``[eval] sft_passes
        = "warm_start"``); default this one."""
        trajectories = self.trajectories()
        evals = {"before_rl": (before or self).of_label(BEFORE_RL), "after_rl": self.of_label(AFTER_RL)}
        step_of = self.step_of()
        by_step: dict[int, list[Trajectory]] = defaultdict(list)
        for trial_id, trajectory in trajectories.items():
            if trial_id in step_of:
                by_step[step_of[trial_id]].append(trajectory)
        out: dict[str, Any] = {}
        for key in ("turns", "tokens"):
            def values(group: list[Trajectory], key: str = key) -> list[float]:
                return [v for t in group if (v := getattr(t, key)) is not None]

            out[key] = {**{name: quantiles(values(group)) for name, group in evals.items()},
                        "per_step": [{"step": step, **(quantiles(values(by_step[step])) or {"n": 0})}
                                     for step in sorted(self.steps)]}
        ended = self.endings.counts(step_of.get)
        out["per_step"] = [{"step": step, "policy_version": event.policy_version, "trials": len(event.trials),
                            **{key: ended[key].get(step, {}) for key in ended}}
                           for step, event in sorted(self.steps.items())]
        out["probe"] = [{"step": k, "label": e.label, "resolved": e.resolved, "n": e.n,
                         "rate": e.resolved / e.n if e.n else None, "mean_reward": e.mean_reward}
                        for k, e in sorted(self.probes.items())]
        return out

    def lengths(self, before: Dynamics | None = None) -> dict[str, dict[str, list[int]]]:
        """Per-trajectory turns and tokens of the before_rl and after_rl trials (the histogram's data)."""
        groups = {"before_rl": (before or self).of_label(BEFORE_RL), "after_rl": self.of_label(AFTER_RL)}
        return {name: {"turns": [t.turns for t in group], "tokens": [t.tokens for t in group if t.tokens is not None]}
                for name, group in groups.items()}
