"""Issue 23 part 3, the wire: forged frames and hostile peers against a live actor under its supervisor.

``wire_faults(work_dir, seed=..., frames=10_000)`` starts a real ``Supervisor`` (in this process) with one
actor process, ``WireTarget`` (role ``wire``), and a good peer that pings it every
``PING_EVERY_S`` with the heartbeat timeout as deadline for the whole attack. Then:

1. **Fuzz** (what tests/test_runtime_fuzz.py does, generator shared): ``frames`` frames — short, unsigned,
   made-up MACs, another run's key, one flipped bit, replays of an accepted frame, stale, authentic
   garbage, misaddressed — on the control socket, the rest on the bulk socket; every one must be
   rejected, by the reason expected, and none handled (the forged records are ``Generic(op="forged")``,
   which ``WireTarget`` counts).
2. **Hostile peers** over the raw socket (nng's SP protocol spoken by hand): half a frame then a stall
   past the heartbeat timeout; a length prefix far over the size limit; a bulk message stalled after
   1 MiB of 8 MiB while the good peer's bulk push must still be delivered; disconnects mid-frame and
   mid-request (a real request whose caller hangs up before the reply); a bad handshake; clock skew
   beyond the freshness window (either way); a process of another run (another key) calling it.
3. ``heartbeats_missed``: the good peer's pings that missed their deadline (``pings_checked`` sent);
   also the supervisor's view (largest gap between heartbeats, 'unreachable' or restarts logged), and
   the actor's pid unchanged (no crash).

Positive controls: a frame sealed with the right key over the same raw path IS handled; skew inside
the window is accepted (both counted by ``WireTarget`` as ``legit``).

The actor and its settings are in ``_wire_target``, the forged frames in ``_wire_frames``, the hostile peers
in ``_wire_peers``; this module runs the fuzz and the peers under a supervisor and writes the report.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pynng
import structlog
import trio

from schemas.messages import Generic, Ping
from storage import EventLog
from t1_actors.runtime import DeadlineExceeded, connect
from t1_actors.runtime.auth import REQUEST, Sealer
from t1_actors.runtime.supervisor import Supervisor
from t1_actors.runtime.wire import pack_envelope
from tools.chaos._wire_frames import forged_frames
from tools.chaos._wire_peers import hostile_peers
from tools.chaos._wire_target import (
    HEARTBEAT_INTERVAL_S,
    HEARTBEAT_TIMEOUT_S,
    MAX_AGE_S,
    PING_EVERY_S,
    actor_counts,
    rejections,
)


class _Pinger:
    """The good peer: a Ping every PING_EVERY_S, each within the heartbeat timeout."""

    def __init__(self, target):
        self.target, self.sent, self.missed, self.worst_s = target, 0, 0, 0.0

    async def run(self) -> None:
        while True:
            self.sent += 1
            started = time.monotonic()
            try:
                await self.target.call(Ping(), deadline_s=HEARTBEAT_TIMEOUT_S)
            except DeadlineExceeded:
                self.missed += 1
            self.worst_s = max(self.worst_s, time.monotonic() - started)
            await trio.sleep(PING_EVERY_S)


def _write_config(run_dir: Path, run_id: str, key: str, victim: Path | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = run_dir / "run.toml"
    address = f'address = "ipc://{victim}"\nhost = "elsewhere"\n' if victim else ""
    cfg.write_text(f'[run]\nid = "{run_id}"\ndir = "{run_dir}"\nhmac_key = "{key}"\n'
                   f'[transport]\nheartbeat_interval_s = {HEARTBEAT_INTERVAL_S}\n'
                   f'heartbeat_timeout_s = {HEARTBEAT_TIMEOUT_S}\nmax_message_age_s = {MAX_AGE_S}\n'
                   f'[[actors]]\nname = "wire-0"\nrole = "wire"\n{address}'
                   f'actor_class = "tools.chaos._wire_target:WireTarget"\n')
    return cfg


async def _fuzz(config, target, key: bytes, frames: int, rng: random.Random) -> dict[str, Any]:
    spec = config.actor("wire-0")
    before = await rejections(target)
    replay = Sealer(key).seal(REQUEST, pack_envelope("fuzzer", "wire-0", Ping(), b"r"))
    control = pynng.Req0(resend_time=24 * 3600 * 1000)
    control.dial(config.control_address(spec), block=True)
    ctx = control.new_context()
    await ctx.asend(replay)  # accepted once: every resend of these bytes is a replay
    await ctx.arecv()
    ctx.close()
    bulk = pynng.Push0()
    bulk.dial(config.bulk_address(spec), block=True)
    expected: Counter[str] = Counter()
    control_frames = forged_frames(frames * 9 // 10, key, replay, rng, dest="wire-0", record=Generic(op="forged"))
    sent = 0
    for start in range(0, len(control_frames), 500):
        contexts = []
        for reason, frame in control_frames[start:start + 500]:
            if reason != "x":
                expected[reason] += 1
            sent += 1
            ctx = control.new_context()
            await ctx.asend(frame)
            contexts.append(ctx)
        await target.call(Ping(), deadline_s=10)
        for ctx in contexts:
            ctx.close()
    forged_bulk = Sealer(key).seal(REQUEST, pack_envelope("x", "wire-0", Generic(op="forged"), b"1"))
    while sent < frames:
        if sent % 2:
            expected["short"] += 1  # shorter than a bulk header: 28 bytes + a 16-byte GMAC
            await bulk.asend(os.urandom(rng.randint(1, 43)))
        else:
            expected["wrong_channel"] += 1
            await bulk.asend(forged_bulk)
        sent += 1
    with trio.move_on_after(60):
        while sum((await rejections(target) - before).values()) < sent:
            await trio.sleep(0.1)
    rejected = await rejections(target) - before
    control.close()
    bulk.close()
    flipped = sent - sum(expected.values())  # counted under whatever they became
    unexpected = {r: n - expected.get(r, 0) for r, n in rejected.items() if n != expected.get(r, 0)}
    return {"frames_fuzzed": sent, "frames_rejected": dict(sorted(rejected.items())),
            "frames_not_rejected": sent - sum(rejected.values()),
            "rejections_off_expectation": {"flipped_magic_or_channel": flipped, "reasons": unexpected}}


async def _attack(config, other_cfg: Path, key: bytes, frames: int, rng: random.Random) -> dict[str, Any]:
    # this process's lines (the supervisor's, the good peer's) go to stderr, as JSON: stdout is the report's
    logger = structlog.wrap_logger(structlog.PrintLogger(file=sys.stderr), processors=[
        structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.JSONRenderer()], wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    supervisor = Supervisor(config, logger=logger.bind(actor="supervisor", role="supervisor", run_id=config.run.id))
    gaps = {"max": 0.0, "beats": 0}

    async def watch_heartbeats() -> None:
        last = None
        while True:
            beat = supervisor.actors["wire-0"].last_heartbeat
            if beat is not None and beat != last:
                if last is not None:
                    gaps["max"] = max(gaps["max"], beat - last)
                last, gaps["beats"] = beat, gaps["beats"] + 1
            await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        try:
            async with connect(config, "good-peer", logger=logger.bind(actor="good-peer")) as peers:
                target = peers("wire-0")
                first = await actor_counts(target)
                pinger = _Pinger(target)
                async with trio.open_nursery() as watchers:
                    watchers.start_soon(pinger.run)
                    watchers.start_soon(watch_heartbeats)
                    fuzz = await _fuzz(config, target, key, frames, rng)
                    hostile, controls, unanswered = await hostile_peers(config, target, key, other_cfg)
                    watchers.cancel_scope.cancel()
                last = await actor_counts(target)
        finally:
            await supervisor.shutdown("wire chaos done")
    lifecycle = [e for _, e in EventLog.open(config.run.dir / "log").events(kinds=["actor_lifecycle"])
                 if e.role == "wire"]
    return {
        **fuzz,
        "frames_accepted_forged": max(fuzz["frames_not_rejected"], last["handled"].get("forged", 0)),
        "forged_handled_by_actor": last["handled"].get("forged", 0),
        "hostile_peers": hostile,
        "heartbeats_missed": pinger.missed + len(unanswered), "pings_checked": pinger.sent + 4,  # + the 4 checks
        "ping_worst_s": round(pinger.worst_s, 3), "ping_deadline_s": HEARTBEAT_TIMEOUT_S,
        "supervisor_heartbeats_seen": gaps["beats"], "supervisor_heartbeat_max_gap_s": round(gaps["max"], 2),
        "supervisor_unreachable_or_restarted": sum(1 for e in lifecycle if e.state in ("unreachable", "restarted")),
        "actor_crashed": last["pid"] != first["pid"],
        "wire_positive_controls": controls,
    }


def wire_faults(work_dir: Path, *, seed: int = 0, frames: int = 10_000, say=lambda line: None) -> dict[str, Any]:
    """Part 3's report keys."""
    from t1_actors.job.config import load_config  # noqa: PLC0415 - keeps chaos free of torch until this section runs (1.6 s)

    rng = random.Random(seed)
    key = secrets.token_hex(24)
    run_dir = work_dir / "wire-run"
    config = load_config(_write_config(run_dir, "wire-chaos", key))
    victim = Path(config.control_address(config.actor("wire-0"))[len("ipc://"):])
    other_cfg = _write_config(work_dir / "other-run", "another-run", secrets.token_hex(24), victim=victim)
    say(f"chaos wire: {frames} fuzzed frames, then the hostile peers")
    return trio.run(_attack, config, other_cfg, key.encode(), frames, rng)
