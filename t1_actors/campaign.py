"""The main job: a whole T1-style campaign on the embedded default, wired from the run's config.

    t1-actor launch --config configs/tiny.toml [--quick] [--run-dir DIR]

1. corpus: the synthetic train/eval task sets ([tasks]), disjoint by construction;
2. tokenizer: a byte-level BPE trained on the training split's rendered oracle chats;
3. SFT warm start on executed oracle trajectories -> policy version 0 (safetensors, checksum, event);
4. the six actors as processes under the supervisor: the staleness controller evaluates the SFT policy
   on the eval split, plays warm-up trials for the critic's warm-up, runs asynchronous PPO for
   ``rl_seconds``, and evaluates again;
5. ``summary.json`` and the training-dynamics plots in the run directory.

Everything the actors do is in the run's Zarr log (RUN/log); ``t1-replay`` reads it back.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from schemas import WeightsPublished

from .rollout import RolloutLimits


class CampaignConfig(BaseModel):
    """[campaign]: the phases' budgets. Defaults: the <= 30 min tiny run on 2 CPU cores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    tokenizer_vocab: int = Field(1024, ge=300)
    sft_seconds: float = Field(540.0, gt=0)
    sft_batch_size: int = Field(32, gt=0)
    sft_lr: float = Field(1e-3, gt=0)
    sft_max_len: int = Field(640, gt=16)
    sft_threads: int = Field(2, gt=0)
    warmup_trials: int = Field(64, ge=0)
    rl_seconds: float = Field(660.0, ge=0)
    eval_concurrency: int = Field(32, gt=0)
    max_turns: int = Field(4, gt=0)
    max_new_tokens: int = Field(64, gt=0)
    max_context: int = Field(768, gt=32)
    tool_output_chars: int = Field(240, gt=0)
    actor_ready_timeout_s: float = Field(120.0, gt=0)
    finish_timeout_s: float = Field(600.0, gt=0)  # after rl_seconds: last steps and the final eval

    def rollout_limits(self) -> RolloutLimits:
        return RolloutLimits(max_turns=self.max_turns, max_new_tokens=self.max_new_tokens,
                             max_context=self.max_context, tool_output_chars=self.tool_output_chars)


# ---------------------------------------------------------------------------------------------- paths

def tokenizer_path(run_dir: Path) -> Path:
    return run_dir / "tokenizer.json"


def weights_dir(run_dir: Path, version: int) -> Path:
    return run_dir / "weights" / f"v{version:05d}"


def log_path(run_dir: Path) -> Path:
    return run_dir / "log"


# ---------------------------------------------------------------------------------------------- phases

def train_run_tokenizer(run_dir: Path, train_tasks: list, vocab: int):
    """Phase 2: the tiny BPE, trained on rendered oracle chats of the training split only."""
    from .policy.tokenizer import train_tokenizer
    from .warmstart import chat_corpus

    tokenizer = train_tokenizer(chat_corpus(train_tasks), vocab)
    tokenizer.save(str(tokenizer_path(run_dir)))
    return tokenizer


def warm_start(run_dir: Path, config, tasks, tokenizer, *, progress=None) -> tuple[Any, dict[str, Any]]:
    """Phase 3: SFT on executed oracle trajectories; returns the policy and a report."""
    from .backends.local_sandbox import LocalSandboxBackend
    from .policy import MoEPolicy
    from .policy.tokenizer import special_token_ids
    from .tasks import oracle_trajectory
    from .warmstart import OracleProducer, supervised_finetune

    campaign: CampaignConfig = config.campaign
    torch.manual_seed(campaign.seed)
    torch.set_num_threads(campaign.sft_threads)
    policy = MoEPolicy(config.model)
    sandboxes = LocalSandboxBackend(config.sandbox.local)

    def execute_oracle(task) -> list[str] | None:
        try:
            with sandboxes.open(task, f"sft-{task.id}") as sandbox:
                outputs = []
                for command in oracle_trajectory(task):
                    result = sandbox.exec(command)
                    outputs.append(result.stdout + result.stderr)
                return outputs
        except Exception:  # an infrastructure hiccup costs one example, never the run
            return None

    pad_id = special_token_ids(tokenizer)["<|endoftext|>"]
    try:
        with OracleProducer(tasks.train, execute_oracle, tokenizer, campaign.tool_output_chars,
                            campaign.sft_max_len) as producer:
            report = supervised_finetune(policy, producer, seconds=campaign.sft_seconds,
                                         batch_size=campaign.sft_batch_size, lr=campaign.sft_lr, pad_id=pad_id,
                                         seed=campaign.seed, progress=progress)
    finally:
        sandboxes.close()
    return policy, {"steps": report.steps, "examples_seen": report.examples_seen,
                    "distinct_examples": report.distinct_examples, "final_loss": report.final_loss,
                    "seconds": round(report.seconds, 1), "tokens_per_s": round(report.tokens_per_s, 1),
                    "oracle_failures": producer.failures, "parameters": policy.num_parameters()}


def publish_initial_policy(run_dir: Path, policy) -> WeightsPublished:
    """Version 0 = the SFT checkpoint, published like any learner version (safetensors + sha256)."""
    from .backends.torch_learner import sha256_file

    directory = weights_dir(run_dir, 0)
    policy.save(directory)
    weights = next(directory.glob("*.safetensors"))
    return WeightsPublished(version=0, sha256=sha256_file(weights), location=str(directory), step=0)


def write_summary(run_dir: Path, *, eval_before, eval_after, actors: list[str], counts: dict[str, int],
                  extra: dict[str, Any]) -> dict[str, Any]:
    def scored(e) -> dict[str, Any] | None:
        if e is None:
            return None
        return {"resolved": e.resolved, "n": e.n, "resolved_rate": e.resolved / e.n if e.n else 0.0,
                "mean_reward": e.mean_reward, "ci95": [e.ci_low, e.ci_high], "policy_version": e.policy_version,
                "per_family": e.per_family}

    summary = {"eval_before": scored(eval_before), "eval_after": scored(eval_after), "actors": actors,
               "events": counts, **extra}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
