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

The server is supervised (``ServerWatch``): one that dies is started again on the same port, with the run's
latest published weights, after ``[sampler] sglang_restart_backoff_s`` (doubled per restart), at most
``sglang_restart_limit`` times; each death and restart is a line of ``RUN/sglang/restarts.jsonl`` and the new
server's start id names the turns it serves (``SamplerTurn.engine_start_id``). Turns in flight when it died end
as infrastructure failures (``finish_reason = "error"``), never as a reward of 0.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.backends.sglang_server import SGLangServer
from t1_actors.job.config import parse_config
from t1_actors.layout import published_versions, weights_dir
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
    run_dir = Path(run_dir)

    def start(policy: Path, version: int, port: int | None) -> SGLangServer:
        return SGLangServer.start(policy, context_length=context_length, max_concurrent=concurrent, port=port,
                                  weight_version=version, venv=sampler.sglang_venv,
                                  log_path=directory / "server.log", start_timeout_s=sampler.sglang_start_timeout_s)

    server = start(Path(policy_dir), 0, None)
    watch = ServerWatch(server, lambda version, port: start(weights_dir(run_dir, version), version, port),
                        latest=lambda: max(published_versions(run_dir), default=0),
                        journal=directory / "restarts.jsonl", limit=sampler.sglang_restart_limit,
                        backoff_s=sampler.sglang_restart_backoff_s)
    with watch:  # from here on the server is stopped whatever happens, as the earlier `with` server did
        (directory / "engine.json").write_text(json.dumps(
            {**server.engine.__dict__, "url": server.url, "started_s": round(server.started_s, 1),
             "context_length": context_length, "max_concurrent": concurrent}, indent=2))
        yield with_sampler_url(config, server.url)


class ServerWatch:
    """Restarts a local SGLang server that died, in a thread: on the same port (its URL does not change),
    at the version ``latest()`` names, after ``backoff_s`` doubled per restart, at most ``limit`` times. Every
    death, restart and the giving up is a JSON line of ``journal``. ``with watch:`` watches for the block's
    duration and then stops whichever server is current; ``watch.server`` is the current one."""

    def __init__(self, server: SGLangServer, start: Callable[[int, int], SGLangServer], *, latest: Callable[[], int],
                 journal: Path, limit: int, backoff_s: float, poll_s: float = 0.5):
        self.server, self._start, self._latest, self.journal = server, start, latest, journal
        self.limit, self.backoff_s, self.poll_s = limit, backoff_s, poll_s
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sglang-watch", daemon=True)

    def __enter__(self) -> ServerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.server.stop()

    def _note(self, **fields: Any) -> None:
        with open(self.journal, "a") as f:
            f.write(json.dumps({"time": round(time.time(), 3), **fields}) + "\n")

    def _watch(self) -> None:
        port = int(self.server.url.rsplit(":", 1)[1])
        while not self._stop.wait(self.poll_s):
            if self.server.alive():
                continue
            self._note(event="died", pid=self.server.pid, exit_code=self.server.process.poll(),
                       start_id=getattr(self.server.engine, "start_id", None))
            while not self._stop.is_set():
                if self.restarts >= self.limit:
                    self._note(event="gave_up", restarts=self.restarts,
                               reason=f"sglang_restart_limit = {self.limit} reached; the run's later turns fail")
                    return
                if self._stop.wait(self.backoff_s * 2 ** self.restarts):
                    return
                self.restarts += 1
                version = self._latest()
                try:
                    self.server = self._start(version, port)
                except Exception as exc:  # a failed start counts as a restart: noted, then tried again
                    self._note(event="restart_failed", restart=self.restarts, version=version, error=str(exc)[:500])
                    continue
                self._note(event="restarted", restart=self.restarts, version=version, pid=self.server.pid,
                           start_id=self.server.engine.start_id, started_s=round(self.server.started_s, 1))
                break


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
