"""``[campaign]``: the phases' budgets, read by the job, the staleness controller and ``t1-probe``.

The rules across sections live in ``job.rules`` and run on every load of a run config.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..rollout import RolloutLimits


class CampaignConfig(BaseModel):
    """[campaign]: the phases' budgets. Defaults: the <= 30 min tiny run on 2 CPU cores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    tokenizer_vocab: int = Field(1024, ge=300)
    tokenizer: str | None = Field(None, description="an HF tokenizer directory (tokenizer.json + tokenizer_config.json "
                                                    "with its chat_template, e.g. .cache/qwen3-tokenizer) used instead "
                                                    "of training t1's BPE: its template renders SFT chats (with "
                                                    "reasoning, t1_actors.chat_sft) and every prompt; [model] "
                                                    "vocab_size becomes its size")
    sft_steps: int | None = Field(600, gt=0, description="SFT optimiser steps (None: train until sft_seconds); "
                                                        "a step budget makes two runs of one seed the same")
    sft_seconds: float = Field(1800.0, gt=0, description="upper bound on SFT's wall time (the whole budget when "
                                                         "sft_steps is None)")
    sft_batch_size: int = Field(32, gt=0)
    sft_lr: float = Field(1e-3, gt=0)
    sft_max_len: int = Field(640, gt=16)
    sft_threads: int = Field(2, gt=0)
    sft_oracle_workers: int = Field(2, gt=0, description="sandboxes executing oracles at once before SFT")
    sft_anchor_every: int = Field(2, ge=0, description="every n-th SFT step trains on one fixed anchor batch "
                                                       "(0: never); see warmstart.supervised_finetune")
    warmup_trials: int = Field(64, ge=0)
    rl_steps: int | None = Field(None, ge=0, description="PPO steps (admitted batches) of the RL phase; None: "
                                                        "until rl_seconds")
    rl_seconds: float = Field(660.0, ge=0, description="upper bound on the RL phase's wall time (the whole budget "
                                                       "when rl_steps is None)")
    eval_concurrency: int = Field(32, gt=0)
    max_turns: int = Field(4, gt=0)
    max_new_tokens: int = Field(64, gt=0)
    max_context: int = Field(768, gt=32)
    tool_output_chars: int = Field(240, gt=0)
    actor_ready_timeout_s: float = Field(120.0, gt=0)
    finish_timeout_s: float = Field(600.0, gt=0)  # after rl_seconds: last steps and the final eval
    warm_start_from: str | None = Field(None, description="a previous run's directory: reuse its tokenizer and "
                                                          "SFT policy (version 0) instead of phases 2-3")
    tito_repairs: list[Literal["normalized", "retokenized"]] = Field(
        [], description="TITO repairs tried before a split ([] = every loss token keeps the sampler's exact "
                        "context; a repaired boundary trains later turns on a context the sampler never saw)")

    def rollout_limits(self) -> RolloutLimits:
        return RolloutLimits(max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                             max_context=self.max_context, tool_output_chars=self.tool_output_chars)
