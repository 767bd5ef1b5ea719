"""The main job: a whole T1-style campaign on the embedded default, wired from the run's config.

    t1-actor launch --config configs/tiny.toml [--quick] [--run-dir DIR]

1. corpus: the synthetic train/eval task sets ([tasks]), disjoint by construction; ``[tasks] rl_size``
   keeps the last train tasks for RL alone;
2. tokenizer: a byte-level BPE trained on the rendered oracle chats of the SFT tasks, or the HF tokenizer
   directory of ``[campaign] tokenizer`` (e.g. Qwen3's) copied into the run, its chat template used everywhere;
3. SFT warm start on executed oracle trajectories of the SFT tasks -> policy version 0 (safetensors,
   checksum, event);
4. the six actors as processes under the supervisor: the staleness controller evaluates the SFT policy
   on the eval split, plays warm-up trials for the critic's warm-up, runs asynchronous PPO on the RL
   tasks for ``rl_seconds``, and evaluates again;
5. ``summary.json`` and the training-dynamics plots in the run directory.

Everything the actors do is in the run's Zarr log (RUN/log, or ``[storage] url`` on S3, checked before
anything starts); ``t1-replay`` reads it back.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio
from rich.console import Console

from storage import EventLog, LogError, log_exists
from storage.config import StorageConfig
from t1_actors.eval.protocol import EvalConfig
from t1_actors.job.config import CampaignConfig, load_config, parse_config
from t1_actors.job.local_sglang import local_sglang
from t1_actors.job.progress import run_actors, sft_with_progress
from t1_actors.job.sft import (
    check_warm_start_passes,
    check_warm_start_tasks,
    copy_run_tokenizer,
    publish_initial_policy,
    reuse_warm_start,
    train_run_tokenizer,
)
from t1_actors.job.summary import code_version, summarise
from t1_actors.layout import has_log, record_log_location, tokenizer_path
from t1_actors.policy.config import ModelConfig
from t1_actors.tasks import build_task_sets
from t1_actors.tasks.config import TasksConfig


class RunLocationError(FileExistsError):
    """The run directory or the ``[storage] url`` cannot take this run (found before anything started)."""


def check_run_location(config) -> None:
    """Before any phase: the run directory holds no log, and a ``[storage] url`` names a reachable bucket
    (else ``LogError`` naming the URL: missing bucket, refused credentials, unreachable endpoint) with no
    log under its prefix yet."""
    run_dir = Path(config.run.dir)
    if has_log(run_dir):
        raise RunLocationError(f"{run_dir} already holds a run's log; pass --run-dir NEW_DIR (nothing was touched)")
    url = config.section(StorageConfig).url
    try:
        taken = bool(url) and log_exists(url)
    except LogError as error:
        raise RunLocationError(f"[storage] url: {error}") from None
    if taken:
        raise RunLocationError(f"{url} already holds a run's log; give [storage] url a new prefix "
                               "(nothing was touched)")


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def load_campaign_config(path: str | Path, *, quick: bool = False, run_dir: str | Path | None = None):
    """Read the run's TOML, apply the ``[quick.*]`` overrides with ``--quick`` and ``--run-dir``, validate
    (every section and every rule across them: the validators of ``t1_actors.job.config.RunConfig``)."""
    return load_config(path, quick=quick, run_dir=run_dir)


def _with_vocab(config, vocab_size: int):
    """The config with the model's vocabulary sized to the trained tokenizer (BPE may stop short of the
    asked size on a small corpus; logits for ids no text maps to would only waste probability mass)."""
    data = _jsonable(config)
    data["model"] = {**config.section(ModelConfig).model_dump(mode="json"), "vocab_size": vocab_size}
    return parse_config(data, "campaign")


def _jsonable(config) -> dict:
    data = config.to_jsonable()
    if config.run.hmac_key is not None:
        data["run"]["hmac_key"] = config.run.hmac_key.get_secret_value()
    return data


def _with_policy(config, location: str):
    """The config with every sampler starting from the SFT checkpoint (version 0)."""
    actors = []
    for spec in config.actors:
        if spec.role == "sampler":
            spec = spec.model_copy(update={"options": {**spec.options, "policy_path": location}})
        actors.append(spec)
    data = _jsonable(config)
    data["actors"] = [a.model_dump(mode="json") for a in actors]
    return parse_config(data, "campaign")


def run_campaign(config, *, console=None, write_report=None, hosts: set[str] | None = None) -> dict[str, Any]:
    """Run every phase; returns the summary (also written to RUN/summary.json).

    ``write_report(run_dir) -> dict`` draws the plots (the CLI passes ``tools.report.write_report``; this
    module stays below the faces that read logs)."""
    console = console or Console(stderr=True)
    campaign: CampaignConfig = config.section(CampaignConfig)
    run_dir = Path(config.run.dir)
    check_run_location(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    record_log_location(run_dir, config.section(StorageConfig).url)
    started = time.monotonic()
    code = code_version()  # now: a commit landing while the run goes must not be credited with it
    timings: dict[str, float] = {}

    with console.status("[bold]1/5 task corpus[/]"):
        tasks = build_task_sets(config.section(TasksConfig))
    console.log(f"corpus: SFT on {len(tasks.sft)} tasks, RL on {len(tasks.rl)}, {len(tasks.validation)} validation "
                f"and {len(tasks.eval)} eval tasks")
    if campaign.warm_start_from is not None:
        check_warm_start_tasks(Path(campaign.warm_start_from), tasks)
        if config.section(EvalConfig).sft_passes == "warm_start":
            check_warm_start_passes(Path(campaign.warm_start_from), config)
        tokenizer, policy, sft = reuse_warm_start(Path(campaign.warm_start_from), run_dir)
        config = _with_vocab(config, tokenizer.vocab_size)
        if policy.config != config.section(ModelConfig):
            raise ValueError(f"[campaign] warm_start_from: the policy in {campaign.warm_start_from} has model "
                             f"{policy.config.model_dump()}, the config asks for {config.section('model').model_dump()}; "
                             "make [model] match it")
        console.log(f"warm start reused from {campaign.warm_start_from} (tokenizer and SFT policy version 0)")
    else:
        with console.status("[bold]2/5 tokenizer[/]"):
            tokenizer = (copy_run_tokenizer(run_dir, campaign.tokenizer) if campaign.tokenizer is not None
                         else train_run_tokenizer(run_dir, tasks.sft, campaign.tokenizer_vocab,
                                                 path_components=campaign.tokenizer_path_components))
        console.log(f"tokenizer: {tokenizer.vocab_size} ids -> {tokenizer_path(run_dir)}")
        config = _with_vocab(config, tokenizer.vocab_size)
        timings["prepare_s"] = time.monotonic() - started
        sft_start = time.monotonic()
        policy, sft = sft_with_progress(config, tasks, tokenizer, campaign, console)
        timings["sft_s"] = time.monotonic() - sft_start
        console.log(f"oracle pool: {sft['distinct_examples']} executed oracle chats in {sft['oracle_pool_seconds']:.0f} s; "
                    f"SFT: {sft['steps']} steps ({sft['epochs']:.1f} epochs), loss {sft['final_loss']:.3f}, "
                    f"{sft['tokens_per_s']:.0f} tok/s")
    published = publish_initial_policy(run_dir, policy)
    log = EventLog.open(config.log_location(), create=True, config=config.section(StorageConfig))
    model = config.section(ModelConfig)
    with log.writer("campaign", routing_shape=(model.num_layers, model.top_k), num_experts=model.num_experts) as w:
        w.append(published)
        w.commit()
    del policy

    run_config = _with_policy(config, published.location)
    rl_start = time.monotonic()
    with local_sglang(run_config, published.location, run_dir) as run_config:  # [sampler] sglang_server = "local"
        trio.run(run_actors, run_config, campaign, console, hosts)
    timings["actors_s"] = time.monotonic() - rl_start
    timings["total_s"] = time.monotonic() - started
    return summarise(run_dir, run_config, sft=sft, timings=timings, console=console, write_report=write_report,
                     code=code)
