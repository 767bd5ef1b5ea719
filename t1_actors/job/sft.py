"""Phases 2-3 of the campaign: the run's tokenizer and the SFT warm start (policy version 0).

Either trained here (BPE on the SFT tasks' oracle chats, or the HF tokenizer directory of ``[campaign] tokenizer``
copied in; then SFT on their executed oracles) or reused from
a previous run (``[campaign] warm_start_from``), with the checks that the reuse is sound: its SFT never saw
this run's RL tasks, and with ``[eval] sft_passes = "warm_start"`` its logged SFT passes were drawn as this
run's would be.
"""

from __future__ import annotations

import json
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from schemas import EvalResult, WeightsPublished
from storage import EventLog
from t1_actors.backends.local_sandbox import LocalSandboxBackend
from t1_actors.backends.sandbox_backend import SandboxConfig
from t1_actors.eval.protocol import EvalConfig
from t1_actors.eval.skills import is_sft_label
from t1_actors.job.config import CampaignConfig, RunConfig
from t1_actors.layout import has_log, hf_tokenizer_dir, log_location, sha256_file, tokenizer_path, weights_dir
from t1_actors.policy import MoEPolicy, load_tokenizer
from t1_actors.policy.config import ModelConfig
from t1_actors.policy.tokenizer import special_token_ids, train_tokenizer
from t1_actors.tasks import TasksConfig, build_task_sets, oracle_trajectory
from t1_actors.tasks.synthetic import RENAMEABLE
from t1_actors.warmstart.chats import oracle_chat, turn_examples
from t1_actors.warmstart.finetune import (
    Example,
    SFTPhase,
    chat_corpus,
    execute_oracle_pool,
    oracle_examples,
    two_phase_finetune,
)
from t1_actors.warmstart.heldout import imitation
from t1_actors.warmstart.oracle_outputs import OracleOutputs, read_outputs, write_outputs
from t1_actors.warmstart.rename import RenamedExamples, Renamer


def train_run_tokenizer(run_dir: Path, train_tasks: list, vocab: int, *, path_components: bool = False):
    """Phase 2: the tiny BPE, trained on rendered oracle chats of the training split only."""
    train_tokenizer(chat_corpus(train_tasks), vocab, path_components=path_components).save(str(tokenizer_path(run_dir)))
    return load_tokenizer(tokenizer_path(run_dir))  # exactly what the run's actors will load


def copy_run_tokenizer(run_dir: Path, source: str | Path):
    """Phase 2 with ``[campaign] tokenizer``: the HF tokenizer directory, copied into RUN/tokenizer/ (so the run
    keeps what it was sampled with), loaded back from there as the actors will."""
    load_tokenizer(source).save(hf_tokenizer_dir(run_dir))
    return load_tokenizer(tokenizer_path(run_dir))


def warm_start(config, tasks, tokenizer, *, pool_progress=None, progress=None) -> tuple[Any, dict[str, Any]]:
    """Phase 3: execute the SFT tasks' oracles (``tasks.sft``), then SFT on them; returns the policy and a report,
    with the policy's teacher-forced imitation of the validation split's executed oracles (``imitation``).

    The outputs are kept in ``RUN/oracle_outputs.jsonl.gz``; with ``[campaign] oracle_pool_from`` a previous run's
    are used for the tasks it had (``oracle_reused`` of them), the others executed."""
    campaign: CampaignConfig = config.section(CampaignConfig)
    torch.manual_seed(campaign.seed)
    torch.set_num_threads(campaign.sft_threads)
    sandboxes = LocalSandboxBackend(config.section(SandboxConfig).local)
    pool = OracleOutputs(read_outputs(campaign.oracle_pool_from) if campaign.oracle_pool_from else None)

    def execute_oracle(task) -> list[str] | None:
        return pool.outputs(task, partial(pool.execute, sandboxes))

    examples_of = None
    if getattr(tokenizer, "chat_template", None) is not None:  # an HF template: reasoning chats, TITO-style examples

        def examples_of(task, outputs):
            chat = oracle_chat(task.instruction, oracle_trajectory(task), outputs, campaign.tool_output_chars)
            return turn_examples(chat, tokenizer)

    def held_out_chats(task) -> list[tuple[str, Example]]:  # a validation chat, whatever its length
        outputs = execute_oracle(task)
        examples = [] if outputs is None else oracle_examples(task, outputs, tokenizer, examples_of=examples_of,
                                                               tool_output_chars=campaign.tool_output_chars)
        return [(task.family or "", example) for example in examples]

    pool_start = time.monotonic()
    try:
        examples, failures = execute_oracle_pool(tasks.sft, execute_oracle, tokenizer,
                                                 tool_output_chars=campaign.tool_output_chars,
                                                 max_len=campaign.sft_max_len, workers=campaign.sft_oracle_workers,
                                                 progress=pool_progress, examples_of=examples_of)
        pool.check_losses(len(tasks.sft))
        held_out = [chat for task in tasks.validation for chat in held_out_chats(task)]
    finally:
        sandboxes.close()
    write_outputs(config.run.dir, pool.kept)
    pool_seconds = time.monotonic() - pool_start
    policy = MoEPolicy(config.section(ModelConfig))
    pad_id = special_token_ids(tokenizer)["<|endoftext|>"]
    short = None
    if campaign.sft_short_steps:
        short = SFTPhase(campaign.sft_short_steps, campaign.sft_short_batch_size or campaign.sft_batch_size,
                         campaign.sft_anchor_every)
    main = SFTPhase(campaign.sft_steps, campaign.sft_batch_size,
                    0 if campaign.sft_anchor_phases == "short" else campaign.sft_anchor_every)
    after_short: dict[str, Any] = {}

    def read_short_phase(first) -> None:  # the cheap early reading: does this seed copy yet?
        after_short.update(steps=first.steps, final_loss=first.final_loss, seconds=round(first.seconds, 1),
                           imitation=imitation(policy, held_out))

    renamed = None
    if campaign.sft_rename == "short":
        renamed = RenamedExamples(Renamer(RENAMEABLE), tokenizer, campaign.tool_output_chars)
    report, _ = two_phase_finetune(policy, examples, short=short, main=main, seconds=campaign.sft_seconds,
                                   lr=campaign.sft_lr, pad_id=pad_id, seed=campaign.seed,
                                   buckets=campaign.sft_length_buckets, short_rewrite=renamed,
                                   after_short=read_short_phase, progress=progress)
    return policy, {"steps": report.steps, "examples_seen": report.examples_seen,
                    "distinct_examples": report.distinct_examples, "epochs": round(report.epochs, 2),
                    "final_loss": report.final_loss, "seconds": round(report.seconds, 1),
                    "tokens_per_s": round(report.tokens_per_s, 1), "padding": round(report.padding, 3),
                    "oracle_failures": failures, "oracle_reused": pool.reused, "oracle_lost": pool.lost,
                    "oracle_lost_warning": pool.losses(),
                    "oracle_pool_seconds": round(pool_seconds, 1), "parameters": policy.num_parameters(),
                    "imitation": imitation(policy, held_out), **({"short_phase": after_short} if after_short else {})}


def reuse_warm_start(previous: Path, run_dir: Path):
    """Phases 2-3 taken from a previous run: its tokenizer and its SFT policy (version 0), copied in."""
    source_tokenizer, source_policy = tokenizer_path(previous), weights_dir(previous, 0)
    missing = [str(p) for p in (source_tokenizer, source_policy) if not p.exists()]
    if missing:
        raise FileNotFoundError(f"[campaign] warm_start_from = {str(previous)!r}: missing {missing}; point it at "
                                "the directory of a run that finished its SFT phase")
    if source_tokenizer.is_dir():  # an HF tokenizer directory ([campaign] tokenizer in that run)
        shutil.copytree(source_tokenizer, hf_tokenizer_dir(run_dir))
    else:
        shutil.copyfile(source_tokenizer, tokenizer_path(run_dir))
    policy = MoEPolicy.load(source_policy)
    return load_tokenizer(tokenizer_path(run_dir)), policy, {"warm_start_from": str(previous)}


def check_warm_start_tasks(previous: Path, tasks) -> None:
    """Refuse a warm start whose SFT was fitted on this run's RL tasks: that would quietly undo ``rl_size``."""
    if not tasks.carved:
        return  # no carve-out asked for: RL shares the SFT tasks by design
    resolved = previous / "config.resolved.json"
    try:
        previous_tasks = TasksConfig.model_validate(json.loads(resolved.read_text())["tasks"])
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"[campaign] warm_start_from = {str(previous)!r}: cannot tell which tasks its SFT saw "
                         f"({resolved}: {error}); with [tasks] rl_size set, warm-start only from a t1 run directory"
                         ) from None
    seen = {t.id for t in build_task_sets(previous_tasks).sft}
    overlap = sum(1 for t in tasks.rl if t.id in seen)
    if overlap:
        raise ValueError(f"[campaign] warm_start_from = {str(previous)!r}: its SFT was fitted on {overlap} of this "
                         f"run's {len(tasks.rl)} RL tasks ([tasks] rl_size); raise [tasks] train_size past the "
                         f"{len(seen)} tasks it saw, or warm-start from a run with the same [tasks] section")


# what decides an eval pass's draws besides the policy: equal in both runs, or their SFT passes differ (the engine
# and its precision draw other tokens; the turn, token and context budgets and the context strategy end or edit
# a trial at other points)
_DRAW_KEYS = {"tasks": None, "eval": None, "sampler": ("temperature", "top_p", "backend", "dtype"),
              "campaign": ("max_turns", "max_new_tokens", "max_context", "tool_output_chars", "max_total_new_tokens",
                           "context_strategy", "keep_last_turns")}
# keys of those sections that no SFT pass reads: where the SFT passes come from, and the probe played during RL
_NOT_SFT_DRAWS = {("eval", "sft_passes"), ("eval", "probe_every"), ("eval", "probe_tasks")}


def decides_sft_draws(section: str, key: str) -> bool:
    """Whether ``[section] key`` decides the draws of the SFT policy's eval passes: two runs that differ there
    cannot share one SFT pass (``check_warm_start_passes`` refuses it; ``t1-actor ablate`` has such an arm play
    its own)."""
    if section not in _DRAW_KEYS or (section, key) in _NOT_SFT_DRAWS:
        return False
    keys = _DRAW_KEYS[section]
    return keys is None or key in keys


def check_warm_start_passes(previous: Path, config) -> None:
    """``[eval] sft_passes = "warm_start"``: the previous run's log holds the SFT policy's whole protocol,
    played on the same tasks with the same eval settings, so its passes are this run's SFT passes."""
    where = f"[eval] sft_passes = 'warm_start' with warm_start_from = {str(previous)!r}"
    try:
        theirs = json.loads((previous / "config.resolved.json").read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{where}: cannot read its config ({error})") from None

    for section, keys in _DRAW_KEYS.items():
        try:
            model = RunConfig.model_fields[section].annotation
            assert model is not None
            a = model.model_validate(theirs.get(section, {})).model_dump(mode="json")
        except ValueError as error:
            raise ValueError(f"{where}: its [{section}] no longer validates ({error})") from None
        b = getattr(config, section).model_dump(mode="json")
        for key in keys or sorted(set(a) | set(b)):
            if (section, key) not in _NOT_SFT_DRAWS and a.get(key) != b.get(key):
                raise ValueError(f"{where}: its [{section}] {key} = {a.get(key)!r}, this run's = {b.get(key)!r}; "
                                 "the SFT passes would not be the draws this run's RL passes pair with: make them "
                                 "equal, or set [eval] sft_passes = 'run'")
    if not has_log(previous):
        raise ValueError(f"{where}: it has no log ({log_location(previous)})")
    results = [e for _, e in EventLog.open(log_location(previous)).events(kinds=["eval_result"])
               if isinstance(e, EvalResult) and is_sft_label(e.label)]
    if not any(e.last for e in results):
        raise ValueError(f"{where}: its log holds {len(results)} SFT eval passes but not the protocol's last one; "
                         "let that run finish its SFT evals, or set [eval] sft_passes = 'run'")


def sft_passes_log(config):
    """The log the SFT policy's eval passes are read from, when not this run's (``[eval] sft_passes``)."""
    if config.section(EvalConfig).sft_passes != "warm_start":
        return None
    return EventLog.open(log_location(Path(config.section(CampaignConfig).warm_start_from)))


def publish_initial_policy(run_dir: Path, policy) -> WeightsPublished:
    """Version 0 = the SFT checkpoint, published like any learner version (safetensors + sha256)."""
    directory = weights_dir(run_dir, 0)
    policy.save(directory)
    weights = next(directory.glob("*.safetensors"))
    return WeightsPublished(version=0, sha256=sha256_file(weights), location=str(directory), step=0)
