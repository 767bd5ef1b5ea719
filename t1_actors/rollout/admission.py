"""Admission rules of the staleness controller: policy lag, oversampling, the cancelled tail.

Pure functions and a small ledger, so the rules can be read and tested apart from the actor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StalenessConfig(BaseModel):
    """[staleness]: how far behind the learner a trajectory may be, and how much to oversample."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(32, gt=0, description="admitted trajectories per learner step")
    max_staleness: int = Field(1, ge=0, description="admit a finished trajectory iff learner_version - "
                                                    "trial_version <= this (trial_version: the oldest policy version "
                                                    "that sampled one of its tokens); 0: on-policy only")
    oversample: float = Field(0.25, ge=0, description="launch batch_size + ceil(batch_size * oversample) trials per "
                                                      "batch, so the slowest can be cut once the batch is full")
    on_cancel: Literal["drop", "continue"] = Field(
        "continue", description="the tail cut when a batch is full: dropped, or continued in the next batch with its "
                                "tokens and per-token policy versions kept")
    max_in_flight: int = Field(48, gt=0, description="trials (and so sandboxes) running at once, whatever oversample "
                                                     "asks; at least batch_size")
    group_size: int = Field(1, gt=0, description="trials of each task issued one after another (a group, for [ppo] "
                                                 "advantage_estimator = 'rloo'); 1 = the recipe")
    resume_after_restart: bool = Field(
        False, description="a restarted controller continues its predecessor's train trials mid-trajectory, rebuilt "
                           "from the log (rollout.resume); their turn records then keep their routing rows, which the "
                           "trajectory stores again: about twice a trained trial's log bytes (docs/chaos.md). false: a "
                           "dead controller's trials are closed, the log stays ~1.03x its distinct bytes "
                           "(docs/long_horizons.md); `t1-actor chaos` turns it on")
    sampler_restart_wait_s: float = Field(
        120.0, gt=0, description="how long a turn waits for its sampler once the sampler stops answering pings (a "
                                 "restarted sampler answers the turn in flight itself); past it the trial ends as an "
                                 "infrastructure failure")
    max_open_failures: int = Field(
        10, gt=0, description="sandbox opens that fail in a row (the sandbox's infrastructure: an environment that "
                              "cannot be built, the disk budget spent) with no sandbox open before the controller "
                              "stops: every open fails. Each such trial ends as an infrastructure failure; while "
                              "others are open, the next opens go one at a time after a backoff (rollout.opens)")

    @model_validator(mode="after")
    def _check(self) -> StalenessConfig:
        if self.max_in_flight < self.batch_size:
            raise ValueError(f"max_in_flight = {self.max_in_flight} is below batch_size = {self.batch_size}: a batch "
                             f"could never fill; raise max_in_flight to at least {self.batch_size}")
        return self


def policy_lag(learner_version: int, trial_version: int) -> int:
    """lag = v_learner - v_trial, with v_trial the OLDEST version that produced a loss token of the trial."""
    return learner_version - trial_version


def admit(lag: int, max_staleness: int) -> bool:
    """Admit a finished trajectory iff 0 <= lag <= max_staleness (a negative lag is a bookkeeping bug)."""
    if lag < 0:
        raise ValueError(f"negative policy lag {lag}: a trial claims a version the learner has not published")
    return lag <= max_staleness


def grouped(task_ids: Iterable[str], group_size: int) -> Iterator[str]:
    """Each task repeated ``group_size`` times in a row: the attempts a group baseline compares."""
    for task_id in task_ids:
        for _ in range(group_size):
            yield task_id


def trials_to_launch(batch_size: int, oversample: float, max_in_flight: int | None = None) -> int:
    """Trials launched per batch: B + k with k = ceil(B * oversample), so slow trials can be cut; at most
    ``max_in_flight`` (a cap on sandboxes), never fewer than B."""
    wanted = batch_size + math.ceil(batch_size * oversample)
    return wanted if max_in_flight is None else max(batch_size, min(wanted, max_in_flight))


@dataclass
class LengthBias:
    """Turns and tokens of admitted vs cancelled trials: does cutting the tail favour short tasks?"""

    admitted_turns: list[int] = field(default_factory=list)
    admitted_tokens: list[int] = field(default_factory=list)
    cancelled_turns: list[int] = field(default_factory=list)
    cancelled_tokens: list[int] = field(default_factory=list)

    def record(self, decision: str, turns: int, tokens: int) -> None:
        if decision == "admit":
            self.admitted_turns.append(turns)
            self.admitted_tokens.append(tokens)
        elif decision == "cancel":
            self.cancelled_turns.append(turns)
            self.cancelled_tokens.append(tokens)

    def summary(self) -> dict[str, float]:
        def mean(values: list[int]) -> float:
            return float(sum(values) / len(values)) if values else float("nan")

        return {
            "admitted": len(self.admitted_turns), "cancelled": len(self.cancelled_turns),
            "admitted_mean_turns": mean(self.admitted_turns), "cancelled_mean_turns": mean(self.cancelled_turns),
            "admitted_mean_tokens": mean(self.admitted_tokens), "cancelled_mean_tokens": mean(self.cancelled_tokens),
        }
