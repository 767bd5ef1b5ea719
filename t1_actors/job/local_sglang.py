"""A campaign's own SGLang server: ``[sampler] backend = "sglang"`` with ``sglang_server = "local"``.

    with local_sglang(config, policy_dir, run_dir) as config:   # config.section(SamplerConfig).sglang_url = the server
        trio.run(run_actors, config, ...)
    # the server is stopped here, whatever happened inside

Sizes come from the run's config: ``--context-length`` = ``[campaign] max_context``, concurrent requests =
the most trials the run plays at once (``[staleness] max_in_flight``, ``[campaign] eval_concurrency``), so
``--max-total-tokens`` = their product. The server starts at the run's version 0 (the SFT policy); later
versions reach it as every SGLang server gets them, by the sampler actor's ``/update_weights_from_disk``.
Its log is ``RUN/sglang/server.log``; ``RUN/sglang/engine.json`` names the engine (``summary.json``'s
``sampler_engine`` reads the log's turns, ``sampler_engine`` below). Any other config passes through
untouched (torch, or an external server).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.backends.sglang_server import SGLangServer
from t1_actors.job.config import parse_config
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.schedule import CampaignConfig


def wants_local_server(config) -> bool:
    sampler = config.section(SamplerConfig)
    return sampler.backend == "sglang" and sampler.sglang_server == "local"


def server_sizes(config) -> tuple[int, int]:
    """(context length, concurrent requests) a local server needs for this run."""
    campaign, staleness = config.section(CampaignConfig), config.section(StalenessConfig)
    return campaign.max_context, max(staleness.max_in_flight, campaign.eval_concurrency)


@contextmanager
def local_sglang(config, policy_dir: str | Path, run_dir: str | Path) -> Iterator[Any]:
    """The config with ``sglang_url`` pointing at a server started here (a local-server run), else itself."""
    if not wants_local_server(config):
        yield config
        return
    sampler = config.section(SamplerConfig)
    context_length, concurrent = server_sizes(config)
    directory = Path(run_dir) / "sglang"
    with SGLangServer.start(policy_dir, context_length=context_length, max_concurrent=concurrent, weight_version=0,
                            venv=sampler.sglang_venv, log_path=directory / "server.log",
                            start_timeout_s=sampler.sglang_start_timeout_s) as server:
        (directory / "engine.json").write_text(json.dumps(
            {**server.engine.__dict__, "url": server.url, "started_s": round(server.started_s, 1),
             "context_length": context_length, "max_concurrent": concurrent}, indent=2))
        yield with_sampler_url(config, server.url)


def with_sampler_url(config, url: str):
    data = config.to_jsonable()
    if config.run.hmac_key is not None:
        data["run"]["hmac_key"] = config.run.hmac_key.get_secret_value()
    data["sampler"] = {**config.section(SamplerConfig).model_dump(mode="json"), "sglang_url": url}
    return parse_config(data, "campaign")


def sampler_engine(log) -> dict[str, str] | None:
    """``{name, version}`` of the engine that served the run's turns (the log's ``SamplerTurn`` events), with
    ``start_ids`` when it was restarted; None for a log written before turns named their engine."""
    names, versions, starts = set(), set(), set()
    for _event_id, turn in log.events(kinds=["sampler_turn"]):
        if turn.engine is not None:
            names.add(turn.engine)
            versions.add(turn.engine_version)
            starts.add(turn.engine_start_id)
    if not names:
        return None
    out = {"name": "+".join(sorted(names)), "version": "+".join(sorted(v for v in versions if v))}
    if len(starts) > 1:
        out["start_ids"] = sorted(s for s in starts if s)
    return out
