"""The main job: a whole T1-style campaign on the embedded default, wired from the run's config.

    t1-actor launch --config configs/tiny.toml [--quick] [--run-dir DIR] [--resume] [--until sft]

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

``--resume`` goes on with a run whose every process died at once, from its log (``t1_actors.job.resume``).
``--until sft`` stops after phase 3 (the SFT policy published, its imitation in ``RUN/sft.json``): SFT variants
compared before any RL, each reusing one executed oracle pool (``[campaign] oracle_pool_from``); ``--resume``
later goes on with RL from it.

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
from t1_actors.job.progress import run_actors, say, sft_with_progress
from t1_actors.job.resume import RESOLVED, Resume, ResumeError, keep_sft_report, resume_state
from t1_actors.job.sft import (
    check_warm_start_passes,
    check_warm_start_tasks,
    copy_run_tokenizer,
    publish_initial_policy,
    reuse_warm_start,
    train_run_tokenizer,
)
from t1_actors.job.summary import code_version, summarise
from t1_actors.layout import has_log, record_log_location, tokenizer_path, weights_dir
from t1_actors.policy import load_tokenizer
from t1_actors.policy.config import ModelConfig
from t1_actors.runtime.config import write_resolved
from t1_actors.staleness import pause_rl_clock
from t1_actors.tasks import build_task_sets
from t1_actors.tasks.config import TasksConfig
from t1_actors.warmstart.oracle_outputs import outputs_path

UNTIL = ("sft",)  # where ``--until`` may stop a run: after phase 3


class RunLocationError(FileExistsError):
    """The run directory or the ``[storage] url`` cannot take this run (found before anything started)."""


def check_run_location(config) -> None:
    """Before any phase: the run directory holds no log, and a ``[storage] url`` names a reachable bucket
    (else ``LogError`` naming the URL: missing bucket, refused credentials, unreachable endpoint) with no
    log under its prefix yet."""
    run_dir = Path(config.run.dir)
    if has_log(run_dir):
        raise RunLocationError(f"{run_dir} already holds a run's log; pass --run-dir NEW_DIR for a new run, or "
                               "--resume to go on with this one (nothing was touched)")
    url = config.section(StorageConfig).url
    try:
        taken = bool(url) and log_exists(url)
    except LogError as error:
        raise RunLocationError(f"[storage] url: {error}") from None
    if taken:
        raise RunLocationError(f"{url} already holds a run's log; give [storage] url a new prefix, or pass "
                               "--resume to go on with that run (nothing was touched)")


def check_oracle_pool(config) -> None:
    """``[campaign] oracle_pool_from`` names a run that kept its executed oracles' outputs."""
    source = config.section(CampaignConfig).oracle_pool_from
    if source is not None and not outputs_path(source).is_file():
        raise RunLocationError(f"[campaign] oracle_pool_from = {source!r}: no {outputs_path(source).name} there; "
                               "point it at a run that executed its SFT pool (not one that warm-started from "
                               "another), or unset it (nothing was touched)")


def check_warm_start(config) -> None:
    """``[eval] sft_passes = "warm_start"``: the warm-start run's SFT passes are this run's (same draws), checked
    before anything is built or written."""
    campaign = config.section(CampaignConfig)
    if campaign.warm_start_from is not None and config.section(EvalConfig).sft_passes == "warm_start":
        try:
            check_warm_start_passes(Path(campaign.warm_start_from), config)
        except ValueError as error:
            raise RunLocationError(str(error)) from None


def check_resumable(config) -> Resume:
    """``--resume``: the run directory's config and state, checked before anything starts (``job.resume``)."""
    try:
        return resume_state(config)
    except ResumeError as error:
        raise RunLocationError(str(error)) from None


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


def _with_policy(config, location: str, version: int = 0):
    """The config with every sampler starting from a published version: the SFT checkpoint (version 0), or the
    newest one when a campaign is resumed."""
    actors = []
    for spec in config.actors:
        if spec.role == "sampler":
            spec = spec.model_copy(update={"options": {**spec.options, "policy_path": location,
                                                       "initial_version": version}})
        actors.append(spec)
    data = _jsonable(config)
    data["actors"] = [a.model_dump(mode="json") for a in actors]
    return parse_config(data, "campaign")


def run_campaign(config, *, console=None, write_report=None, hosts: set[str] | None = None,
                 resume: bool = False, until: str | None = None) -> dict[str, Any]:
    """Run every phase; returns the summary (also written to RUN/summary.json). ``until = "sft"``: stop after
    phase 3 and return ``{"until": "sft", "sft": ..., "timings_s": ...}`` (what ``RUN/sft.json`` keeps).

    ``write_report(run_dir) -> dict`` draws the plots (the CLI passes ``tools.report.write_report``; this
    module stays below the faces that read logs). ``resume``: go on with the run in ``[run] dir`` from its log
    (``t1-actor launch --resume``: ``job.resume`` says what is checked and skipped)."""
    console = console or Console(stderr=True)
    campaign: CampaignConfig = config.section(CampaignConfig)
    run_dir = Path(config.run.dir)
    if until is not None and until not in UNTIL:
        raise ValueError(f"until = {until!r}: a run can stop after one of {UNTIL}")
    state = check_resumable(config) if resume else None
    if state is None:
        check_run_location(config)
    if state is None or not state.prepared:
        check_oracle_pool(config)
        check_warm_start(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    record_log_location(run_dir, config.section(StorageConfig).url)
    started = time.monotonic()
    code = code_version()  # now: a commit landing while the run goes must not be credited with it
    timings: dict[str, float] = {}

    if state is not None and state.prepared:
        config = _with_vocab(config, load_tokenizer(tokenizer_path(run_dir)).vocab_size)
        sft, timings = state.sft, {**state.timings, "down_s": state.down_s}
        if state.finished:
            say(console, f"resume: {run_dir} had finished (the RL policy's last eval pass is logged); summary only")
            return summarise(run_dir, config, sft=sft, timings=timings, console=console, write_report=write_report,
                             code=code)
        assert state.newest is not None
        published = state.newest
        if weights_dir(run_dir, published.version).is_dir():  # where it is now (the run directory may have moved)
            published = published.model_copy(update={"location": str(weights_dir(run_dir, published.version))})
        for spec in config.actors_of("staleness"):  # RL's budget is for training: the down time is not taken from it
            pause_rl_clock(run_dir, spec.name, state.down_s)
        say(console, f"resume: {run_dir} goes on from its log (down {state.down_s:.0f} s; phases 1-3 done; samplers "
                     f"start from policy version {published.version})")
    else:
        if state is not None:
            say(console, f"resume: {run_dir} had not finished its SFT phase: phases 1-3 run again")
        write_resolved(config, run_dir / RESOLVED)  # what a relaunch compares its config with
        config, sft, published = _prepare(config, run_dir, campaign, console, timings, started)
        keep_sft_report(run_dir, sft, timings)
    if until == "sft":
        say(console, f"--until sft: {run_dir} stops with its SFT policy (version 0; report in {run_dir}/sft.json); "
                     "`t1-actor launch --resume` with the same config goes on with RL")
        return {"until": "sft", "sft": sft, "timings_s": timings}

    run_config = _with_policy(config, published.location, published.version)
    rl_start = time.monotonic()
    with local_sglang(run_config, published.location, run_dir) as run_config:  # [sampler] sglang_server = "local"
        trio.run(run_actors, run_config, campaign, console, hosts)
    timings["actors_s"] = time.monotonic() - rl_start
    timings["total_s"] = time.monotonic() - started
    return summarise(run_dir, run_config, sft=sft, timings=timings, console=console, write_report=write_report,
                     code=code)


def _prepare(config, run_dir: Path, campaign: CampaignConfig, console, timings: dict[str, float], started: float):
    """Phases 1-3: the corpus, the tokenizer and the SFT policy (or their reuse from ``warm_start_from``), version
    0 published and logged. Returns the config sized to the tokenizer, the SFT report and version 0's event."""
    with console.status("[bold]1/5 task corpus[/]"):
        tasks = build_task_sets(config.section(TasksConfig))
    console.log(f"corpus: SFT on {len(tasks.sft)} tasks, RL on {len(tasks.rl)}, {len(tasks.validation)} validation "
                f"and {len(tasks.eval)} eval tasks")
    if campaign.warm_start_from is not None:
        check_warm_start_tasks(Path(campaign.warm_start_from), tasks)  # its passes: check_warm_start, before
        tokenizer, policy, sft = reuse_warm_start(Path(campaign.warm_start_from), run_dir)
        config = _with_vocab(config, tokenizer.vocab_size)
        if policy.config != config.section(ModelConfig):
            asked = config.section(ModelConfig).model_dump()
            raise ValueError(f"[campaign] warm_start_from: the policy in {campaign.warm_start_from} has model "
                             f"{policy.config.model_dump()}, the config asks for {asked}; make [model] match it")
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
        reused = f", {sft['oracle_reused']} outputs reused" if sft.get("oracle_reused") else ""
        console.log(f"oracle pool: {sft['distinct_examples']} executed oracle chats in {sft['oracle_pool_seconds']:.0f} s"
                    f"{reused}; "
                    f"SFT: {sft['steps']} steps ({sft['epochs']:.1f} epochs), loss {sft['final_loss']:.3f}, "
                    f"{sft['tokens_per_s']:.0f} tok/s")
        if sft.get("oracle_lost_warning"):
            console.log(f"warning: {sft['oracle_lost_warning']}", markup=False, highlight=False)
        held_out = sft["imitation"]
        console.log(f"SFT imitation of {held_out['chats']} validation chats (teacher-forced, greedy): "
                    f"{held_out['turn_accuracy']:.0%} of turns, {held_out['chat_accuracy']:.0%} of chats right")
    published = publish_initial_policy(run_dir, policy)
    log = EventLog.open(config.log_location(), create=True, config=config.section(StorageConfig))
    model = config.section(ModelConfig)
    with log.writer("campaign", routing_shape=(model.num_layers, model.top_k), num_experts=model.num_experts) as w:
        w.append(published)
        w.commit()
    return config, sft, published
