"""The campaign's phases and their budgets (``[campaign]``), and the schedule, as the staleness controller
plays it over ``TrialPorts``:

    eval of the SFT policy -> warm-up trials + the critic's warm-up -> asynchronous PPO -> eval of the RL policy

With ``[eval] probe_every = N`` the PPO phase pauses after learner steps N, 2N, ... (not after its last) for
the validation probe (``probe_s{K}``): no trial is issued for training until the probe's last trial is
verified, so the learner, which only trains admitted batches, stays at version K throughout it; the probe's
trials are eval trials (never assembled, admitted or trained on), and its time is left out of RL's clock.

Each phase is skipped when the log shows it done (a probe too, by its label), so a restarted controller
resumes where the last one stopped. The task orders are functions of ``[campaign] seed`` alone: ``t1-probe``
(the synchronous twin, unrelated to the validation probe) draws the same warm-up tasks and the same RL order
for a seed.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import trio
from pydantic import BaseModel, ConfigDict, Field, model_validator

from t1_actors.eval.protocol import EvalConfig, evaluate_policy, probe_due, probe_label, probe_task_ids
from t1_actors.rollout import RolloutLimits
from t1_actors.rollout.admission import StalenessConfig, grouped
from t1_actors.rollout.eval_pass import finished_eval_attempts, run_eval
from t1_actors.rollout.play import run_warmup
from t1_actors.rollout.trials import BatchStats, InFlight, TrialRunner, run_batches


class CampaignConfig(BaseModel):
    """[campaign]: the phases' budgets. Defaults: the <= 30 min tiny run on 2 CPU cores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="seed of the SFT warm start (initial weights, example order) and of the "
                                     "critic's warm-up tasks and RL's task order (eval turns are seeded by task, "
                                     "not by it)")
    tokenizer_path_components: bool = Field(False, description="the BPE keeps a slash on the word after it "
                                                               "(/lunar): each name of a path follows a token "
                                                               "of its own (see policy.tokenizer.train_tokenizer)")
    tokenizer_vocab: int = Field(1024, ge=300, description="ids of the byte-level BPE trained on the SFT tasks "
                                                           "(special tokens and the 256 bytes included; it may stop "
                                                           "short on a small corpus); [model] vocab_size becomes its "
                                                           "size. Unused with tokenizer or warm_start_from")
    tokenizer: str | None = Field(None, description="an HF tokenizer directory (tokenizer.json + tokenizer_config.json "
                                                    "with its chat_template, e.g. .cache/qwen3-tokenizer) used instead "
                                                    "of training t1's BPE: its template renders SFT chats (with "
                                                    "reasoning, t1_actors.warmstart.chats) and every prompt; [model] "
                                                    "vocab_size becomes its size")
    sft_steps: int | None = Field(600, gt=0, description="SFT optimiser steps (after sft_short_steps, if any; None: "
                                                        "train until sft_seconds); a step budget makes two runs of "
                                                        "one seed the same")
    sft_seconds: float = Field(1800.0, gt=0, description="upper bound on SFT's wall time (the whole budget when "
                                                         "sft_steps is None)")
    sft_batch_size: int = Field(32, gt=0, description="examples per SFT optimiser step")
    sft_lr: float = Field(1e-3, gt=0, description="SFT learning rate (AdamW)")
    sft_max_len: int = Field(640, gt=16, description="longest SFT example in tokens: longer oracle chats are left out")
    sft_threads: int = Field(2, gt=0, description="torch threads of the SFT phase")
    sft_oracle_workers: int = Field(2, gt=0, description="sandboxes executing oracles at once before SFT")
    sft_anchor_every: int = Field(2, ge=0, description="every n-th SFT step trains on one fixed anchor batch "
                                                       "(0: never); see warmstart.supervised_finetune")
    sft_anchor_phases: Literal["all", "short"] = Field("all", description="where the anchor steps are: 'all' of "
                                                       "SFT, or its short phase only (with sft_short_steps: the "
                                                       "phase on all chats then draws every batch fresh)")
    sft_length_buckets: int = Field(0, ge=0, description="> 0: each SFT batch is drawn from one of this many "
                                                         "groups of oracle chats of similar length, so it pads to "
                                                         "about its own length (0: from the whole pool)")
    sft_short_steps: int = Field(0, ge=0, description="> 0: SFT starts with a phase of this many steps on the shorter "
                                                      "half of the length buckets alone (the single-turn chats), "
                                                      "with its own warm-up and cosine, before sft_steps on all "
                                                      "(the policy learns to copy there; needs sft_length_buckets "
                                                      ">= 2); 0: one phase")
    sft_short_batch_size: int | None = Field(None, gt=0, description="examples per step of the short phase (None: "
                                                                     "sft_batch_size)")
    sft_rename: Literal["none", "short"] = Field("none", description="'short': each fresh batch of the short phase "
                                                 "is trained under random names (the synthetic corpus's names and "
                                                 "words permuted over the whole chat; the anchor batches keep "
                                                 "theirs), so it is fitted by copying, not memorising; needs "
                                                 "sft_short_steps > 0 and t1's own tokenizer (no [campaign] "
                                                 "tokenizer)")
    warmup_trials: int = Field(64, ge=0, description="critic warm-up trials played by the SFT policy on distinct "
                                                     "RL tasks before RL (0: no warm-up); see [critic] "
                                                     "warmup_trajectories")
    rl_steps: int | None = Field(None, ge=0, description="PPO steps (admitted batches) of the RL phase; None: "
                                                        "until rl_seconds")
    rl_seconds: float = Field(660.0, ge=0, description="upper bound on the RL phase's wall time (the whole budget "
                                                       "when rl_steps is None)")
    eval_concurrency: int = Field(32, gt=0, description="trials played at once by the eval passes and the critic's "
                                                        "warm-up (a local SGLang server is sized for it too)")
    max_turns: int = Field(4, gt=0, description="assistant turns of a trial at most (a task's own lower cap wins); "
                                                "finish = max_turns")
    max_new_tokens: int = Field(64, gt=0, description="tokens one turn may generate; a turn cut there ends its trial "
                                                      "(finish = turn_tokens)")
    max_context: int = Field(768, gt=32, description="tokens a turn's prompt plus its max_new_tokens may fill; what "
                                                     "happens when the next prompt would not fit: context_strategy. "
                                                     "At most [model] max_position")
    tool_output_chars: int = Field(240, gt=0, description="a longer tool output is cut (counted: truncations)")
    max_total_new_tokens: int | None = Field(None, gt=0, description="a trial's total of generated tokens, checked "
                                             "between turns (finish = token_budget); None: no total")
    context_strategy: Literal["end", "drop_old_outputs", "window"] = Field(
        "end", description="when the next prompt would not fit max_context: end the trial, replace tool outputs "
                           "older than keep_last_turns by a marker, or keep the instruction and the last turns that "
                           "fit (each edit logged, and a new TITO chunk of the trial)")
    keep_last_turns: int = Field(2, ge=0, description="drop_old_outputs keeps the outputs of this many last turns "
                                                      "(0: the latest output too becomes the marker)")
    actor_ready_timeout_s: float = Field(120.0, gt=0, description="start-up allowance of the actors phase: "
                                                                  "every local actor must be ready within 3x this; "
                                                                  "2x it also counts in the phase's overall deadline")
    finish_timeout_s: float = Field(600.0, gt=0, description="after rl_seconds: the learner has half of it to train "
                                                             "the batches already admitted before the final eval; "
                                                             "the whole counts in the actors phase's deadline")
    warm_start_from: str | None = Field(None, description="a previous run's directory: reuse its tokenizer and "
                                                          "SFT policy (version 0) instead of phases 2-3")
    oracle_pool_from: str | None = Field(None, description="a previous run's directory: reuse its executed oracles' "
                                                           "outputs (RUN/oracle_outputs.jsonl.gz) for the tasks it "
                                                           "had, instead of executing them again; SFT itself runs")
    tito_repairs: list[Literal["normalized", "retokenized"]] = Field(
        [], description="TITO repairs tried before a split ([] = every loss token keeps the sampler's exact "
                        "context; a repaired boundary trains later turns on a context the sampler never saw)")

    def rollout_limits(self) -> RolloutLimits:
        return RolloutLimits(max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                             max_context=self.max_context, tool_output_chars=self.tool_output_chars,
                             max_total_new_tokens=self.max_total_new_tokens, context_strategy=self.context_strategy,
                             keep_last_turns=self.keep_last_turns)

    @model_validator(mode="after")
    def _short_phase_needs_buckets(self) -> CampaignConfig:
        if self.sft_short_steps > 0 and self.sft_length_buckets < 2:
            raise ValueError(f"[campaign] sft_short_steps = {self.sft_short_steps} draws from the shorter half of "
                             f"SFT's length buckets, but sft_length_buckets = {self.sft_length_buckets}; set "
                             "sft_length_buckets >= 2 (e.g. 4) or sft_short_steps = 0")
        return self

    @model_validator(mode="after")
    def _renaming_needs_a_short_phase_and_t1s_template(self) -> CampaignConfig:
        if self.sft_rename == "short" and self.sft_short_steps == 0:
            raise ValueError("[campaign] sft_rename = 'short' renames the short phase's batches, but sft_short_steps "
                             "= 0 (no short phase); set sft_short_steps > 0 or sft_rename = 'none'")
        if self.sft_rename != "none" and self.tokenizer is not None:
            raise ValueError(f"[campaign] sft_rename = {self.sft_rename!r} renders renamed chats on t1's own "
                             f"template, but tokenizer = {self.tokenizer!r} (an HF template's chats); set "
                             "sft_rename = 'none' or leave tokenizer unset")
        return self

    @model_validator(mode="after")
    def _short_anchors_need_a_short_phase(self) -> CampaignConfig:
        if self.sft_anchor_phases == "short" and self.sft_short_steps == 0:
            raise ValueError("[campaign] sft_anchor_phases = 'short' keeps the anchor steps to the short phase, but "
                             "sft_short_steps = 0 (no short phase); set sft_short_steps > 0 or sft_anchor_phases = "
                             "'all'")
        return self

    @model_validator(mode="after")
    def _a_pool_only_for_an_sft(self) -> CampaignConfig:
        if self.oracle_pool_from is not None and self.warm_start_from is not None:
            raise ValueError(f"[campaign] oracle_pool_from = {self.oracle_pool_from!r} feeds this run's SFT, but "
                             f"warm_start_from = {self.warm_start_from!r} skips it; unset one of them")
        return self

    @model_validator(mode="after")
    def _a_turn_fits_the_context(self) -> CampaignConfig:
        if self.max_new_tokens >= self.max_context:
            raise ValueError(f"[campaign] max_new_tokens = {self.max_new_tokens} leaves no room for a prompt in "
                             f"max_context = {self.max_context}; raise max_context or lower max_new_tokens")
        return self


def warmup_task_ids(rl_ids: list[str], n: int, seed: int) -> list[str]:
    """The critic's warm-up tasks: ``n`` distinct RL tasks drawn with ``seed + 1``."""
    return random.Random(seed + 1).sample(rl_ids, min(n, len(rl_ids)))


def rl_task_order(rl_ids: list[str], seed: int) -> list[str]:
    """One pass over the RL tasks in the order RL draws them (drawn with ``seed + 2``; RL cycles it)."""
    return random.Random(seed + 2).sample(rl_ids, len(rl_ids))


@dataclass
class TaskSplits:
    rl: list[str]  # the train tasks RL may draw ([tasks] rl_size)
    validation: list[str]
    eval: list[str]
    pass_k: list[str]


@dataclass
class Controller:
    """What the schedule needs from the controller that plays it (the staleness actor)."""

    logger: object  # structured logger: .info(event, **fields)
    version: Callable[[], int]  # the learner's newest published version
    wait_for_version: Callable[[int, Callable[[], bool]], Awaitable[None]]
    events: Callable[[str], Awaitable[list]]  # the log's events of one kind
    rl_seconds_left: Callable[[], float]  # the RL phase's wall-clock budget left (it survives restarts)
    warm_up_critic: Callable[[list[str]], Awaitable[None]]
    # seconds RL's clock stood still (a validation probe): kept where rl_seconds_left reads them back
    pause_rl_clock: Callable[[float], None] = lambda seconds: None


def steps_taken(published: Sequence, decisions: Sequence, batch_size: int) -> int:
    """The learner steps a restarted controller's predecessors have taken or made certain:

        steps = max(newest published version, floor(admitted trials / batch_size))

    The learner trains admitted trials in admission order, ``batch_size`` a step, whatever controller admitted
    them: a batch admitted before the kill and not yet trained is a step the learner will still take (counting
    it again would take one step more than ``rl_steps``). A part batch's trials wait in the learner for the
    first trials the new controller admits."""
    admitted = sum(1 for e in decisions if e.decision == "admit")
    return max(max((e.version for e in published), default=0), admitted // batch_size)


async def play_schedule(runner: TrialRunner, controller: Controller, splits: TaskSplits, *, campaign: CampaignConfig,
                        staleness: StalenessConfig, eval_config: EvalConfig, run_temperature: float,
                        stats: BatchStats, resumed: Sequence[InFlight] = ()) -> None:
    """Play every phase the log does not show done; returns after the RL policy's last eval pass. ``resumed``:
    train trials a dead controller left mid-trajectory, continued by the first batch (``rollout.resume``)."""
    log = controller.logger
    done = {e.label: e for e in await controller.events("eval_result")}
    issued = await controller.events("trial_issued")
    # the attempts of passes a dead controller left half played: each pass goes on from them
    finished = finished_eval_attempts(
        [*issued, *await controller.events("trial_ended"), *await controller.events("verifier_result")],
        {task_id: task.family or "" for task_id, task in runner.tasks.items()})

    async def evaluate(policy: str) -> None:
        async def on_pass(name: str) -> None:
            log.info("phase", phase=f"eval {name}", policy_version=controller.version())

        best = await evaluate_policy(runner, policy, validation_ids=splits.validation, eval_ids=splits.eval,
                                     pass_k_ids=splits.pass_k, config=eval_config, run_temperature=run_temperature,
                                     concurrency=campaign.eval_concurrency, done=done, on_pass=on_pass,
                                     finished=finished)
        log.info("best_temperature", policy=policy, temperature=best)

    if eval_config.sft_passes == "run":  # else they are the warm-start run's (the summary reads them there)
        await evaluate("sft")
    if campaign.warmup_trials and not await controller.events("critic_warmup"):
        # a warm-up whose trajectories are logged (one commit: all or none) is not played again, only handed over
        warm_trials = {e.trial_id for e in issued if e.split == "warmup"}
        played = list(dict.fromkeys(e.trial_id for e in await controller.events("trajectory")
                                    if e.trial_id in warm_trials))
        log.info("phase", phase="warmup", n=campaign.warmup_trials, logged_before=len(played))
        if not played:
            warm_ids = warmup_task_ids(splits.rl, campaign.warmup_trials, campaign.seed)
            played = await run_warmup(runner, warm_ids, concurrency=campaign.eval_concurrency)
        await controller.warm_up_critic(played)
    if not any(name == "after" or name.startswith("rl_") for name in done):  # RL not yet evaluated
        log.info("phase", phase="rl", seconds=campaign.rl_seconds)
        order = grouped(itertools.cycle(rl_task_order(splits.rl, campaign.seed)), staleness.group_size)
        end = trio.current_time() + controller.rl_seconds_left()
        # steps a restarted controller finds already taken (read from the log, not the version follower)
        learned_before = steps_taken(await controller.events("weights_published"),
                                     await controller.events("staleness_decision"), staleness.batch_size)

        def until() -> bool:  # the step budget (two runs of a seed take the same steps) or the clock
            budget = campaign.rl_steps
            steps_done = budget is not None and learned_before + stats.batches >= budget
            return steps_done or trio.current_time() >= end

        async def probe() -> None:
            """The validation probe after the step just admitted, when due and not in the log yet."""
            nonlocal end
            step = learned_before + stats.batches
            name = probe_label(step)
            if not probe_due(step, eval_config.probe_every, campaign.rl_steps) or name in done or until():
                return
            await controller.wait_for_version(step, until)  # the learner trains the batch just admitted
            if controller.version() != step:  # RL's clock ran out first (or a predecessor's batch is in flight)
                log.warning("probe_skipped", step=step, policy_version=controller.version())
                return
            started = trio.current_time()
            ids = probe_task_ids(splits.validation, eval_config)
            log.info("phase", phase=f"probe s{step}", policy_version=step, n=len(ids))
            done[name] = await run_eval(runner, ids, label=name, concurrency=campaign.eval_concurrency,
                                        temperature=run_temperature, finished=finished.get(name))
            paused = trio.current_time() - started
            end += paused  # RL's budget is for training: the probe's time is not taken from it
            controller.pause_rl_clock(paused)

        await probe()  # a restarted controller whose predecessor died before (or while) playing one
        await run_batches(runner, lambda: next(order), staleness, until=until,
                          wait_for_learner=lambda v: controller.wait_for_version(v, until), stats=stats,
                          resumed=resumed, between_batches=probe, first_batch=learned_before)
        # Let the learner finish the batches already admitted before the final eval.
        with trio.move_on_after(campaign.finish_timeout_s / 2):
            await controller.wait_for_version(learned_before + stats.batches, lambda: False)
        log.info("phase", phase="eval_after", policy_version=controller.version(), bias=stats.bias.summary())
    else:  # RL was over: the trials left cancelled stay so (their decision is logged); their sandboxes go
        for flight in resumed:
            await runner.ports.close_sandbox(flight.sandbox_id)
    await evaluate("rl")
