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
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import struct
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import structlog
import trio

from schemas.messages import Generic, Ping
from t1_actors.runtime import Actor, DeadlineExceeded, handles
from t1_actors.runtime.auth import MAGIC, REQUEST, Sealer
from t1_actors.runtime.wire import pack_envelope

PING_EVERY_S = 0.2
HEARTBEAT_INTERVAL_S, HEARTBEAT_TIMEOUT_S, MAX_AGE_S = 0.5, 3.0, 20.0
_SP_REQ, _SP_PUSH = 0x30, 0x50  # nng protocol numbers of the peers we pretend to be (Req0, Push0)


class WireTarget(Actor):
    """The actor under attack: counts what it handles (``forged`` must stay 0), stores bulk pushes."""

    role = "wire"

    async def setup(self) -> None:
        self.handled: Counter[str] = Counter()
        self.stored = 0

    @handles(Generic)
    async def generic(self, req: Generic) -> Generic | None:
        if req.op in ("forged", "legit"):
            self.handled[req.op] += 1
            return Generic(op="handled", args={"op": req.op})
        if req.op == "store":
            self.stored += 1
            return None
        if req.op == "sleep":
            await trio.sleep(float(req.args["s"]))
            return Generic(op="slept")
        if req.op == "count":
            return Generic(op="count", args={"handled": dict(self.handled), "stored": self.stored, "pid": os.getpid()})
        raise KeyError(f"unknown op {req.op!r}")


# ---- frames --------------------------------------------------------------------------------------

def sealed_at(key: bytes, sent_ns: int, body: bytes, channel: bytes = REQUEST) -> bytes:
    """A frame sealed with ``key`` as a sender whose clock reads ``sent_ns`` would seal it."""
    prefix = MAGIC + channel + struct.pack(">Q", sent_ns) + os.urandom(16)
    return prefix + Sealer(key)._macs[channel].digest(prefix, body) + body


def authentic_garbage(key: bytes, rng: random.Random) -> bytes:
    body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
    return sealed_at(key, time.time_ns(), body)


def forged_frames(n: int, key: bytes, replay: bytes, rng: random.Random, *, dest: str = "echo-0",
                  record=None) -> list[tuple[str, bytes]]:
    """``n`` control frames the receiver must drop, each with the reason it must give (``"x"``: a flipped
    bit hit the magic or channel, so the reason is whatever the frame became)."""
    record = Ping() if record is None else record
    good = Sealer(key)
    out = []
    for i in range(n):
        kind = i % 9
        if kind == 0:
            out.append(("short", os.urandom(rng.randint(0, 59))))
        elif kind == 1:
            out.append(("unsigned", b"X" + os.urandom(rng.randint(60, 400))))
        elif kind == 2:  # right layout, made-up MAC
            out.append(("bad_mac", MAGIC + b"Q" + struct.pack(">Q", time.time_ns()) + os.urandom(rng.randint(56, 300))))
        elif kind == 3:  # sealed with another run's key
            out.append(("bad_mac", Sealer(b"other-run-key-xxxxxxxx").seal(REQUEST, pack_envelope("x", dest, record, b"1"))))
        elif kind == 4:  # a real frame with one bit flipped
            frame = bytearray(good.seal(REQUEST, pack_envelope("x", dest, record, b"1")))
            frame[rng.randrange(4, len(frame))] ^= 1 << rng.randrange(8)
            out.append(("bad_mac" if frame[:4] == MAGIC + b"Q" else "x", bytes(frame)))
        elif kind == 5:
            out.append(("replayed", replay))
        elif kind == 6:
            out.append(("stale", sealed_at(key, time.time_ns() - 3600 * 10**9, pack_envelope("x", dest, record, b"1"))))
        elif kind == 7:
            out.append(("malformed", authentic_garbage(key, rng)))
        else:
            out.append(("misaddressed", good.seal(REQUEST, pack_envelope("x", dest + "-9", record, b"1"))))
    return out


# ---- nng's SP protocol by hand (ipc transport: 8-byte handshake, then [0x01][u64 length] per message) ----

def _raw_connect(address: str, protocol: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address[len("ipc://"):])
    sock.sendall(b"\x00SP\x00" + protocol.to_bytes(2, "big") + b"\x00\x00")
    sock.settimeout(5)
    sock.recv(8)  # the actor's handshake
    return sock


def _ipc_message(payload: bytes, claimed: int | None = None) -> bytes:
    return b"\x01" + (len(payload) if claimed is None else claimed).to_bytes(8, "big") + payload


def _closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


# ---- the attack ----------------------------------------------------------------------------------

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
                   f'actor_class = "tools.chaos._wire_faults:WireTarget"\n')
    return cfg


async def _counts(target) -> dict[str, Any]:
    return (await target.call(Generic(op="count"), deadline_s=10)).args


async def _rejected(target) -> Counter[str]:
    return Counter((await target.call(Generic(op="runtime.stats"), deadline_s=10)).args["rejected"])


async def _fuzz(config, target, key: bytes, frames: int, rng: random.Random) -> dict[str, Any]:
    import pynng

    spec = config.actor("wire-0")
    before = await _rejected(target)
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
        while sum((await _rejected(target) - before).values()) < sent:
            await trio.sleep(0.1)
    rejected = await _rejected(target) - before
    control.close()
    bulk.close()
    flipped = sent - sum(expected.values())  # counted under whatever they became
    unexpected = {r: n - expected.get(r, 0) for r, n in rejected.items() if n != expected.get(r, 0)}
    return {"frames_fuzzed": sent, "frames_rejected": dict(sorted(rejected.items())),
            "frames_not_rejected": sent - sum(rejected.values()),
            "rejections_off_expectation": {"flipped_magic_or_channel": flipped, "reasons": unexpected}}


async def _hostile(config, target, key: bytes, other_cfg: Path) -> tuple[dict[str, str], dict[str, bool], list[str]]:
    spec = config.actor("wire-0")
    control_path, bulk_path = config.control_address(spec), config.bulk_address(spec)
    outcomes: dict[str, str] = {}
    good = Sealer(key)
    unanswered: list[str] = []  # cases after which the good peer's check missed its deadline

    async def alive(case: str) -> None:
        try:
            await target.call(Ping(), deadline_s=HEARTBEAT_TIMEOUT_S)
        except DeadlineExceeded:
            unanswered.append(case)

    def request(record, channel_key=key, sent_ns=None) -> bytes:
        body = pack_envelope("hostile", "wire-0", record, os.urandom(8))
        return sealed_at(channel_key, time.time_ns() if sent_ns is None else sent_ns, body)

    async def raw_request(frame: bytes) -> bytes | None:
        """Send one request over a hand-made Req0 connection; the reply frame, or None (dropped)."""
        sock = await trio.to_thread.run_sync(_raw_connect, control_path, _SP_REQ)
        try:
            await trio.to_thread.run_sync(sock.sendall, _ipc_message(b"\x80\x00\x00\x01" + frame))

            def reply() -> bytes | None:
                sock.settimeout(2.0)
                try:
                    head = sock.recv(9)
                    return sock.recv(int.from_bytes(head[1:9], "big")) if len(head) == 9 else None
                except TimeoutError:
                    return None
            return await trio.to_thread.run_sync(reply)
        finally:
            sock.close()

    # half a frame, then silence past the heartbeat timeout
    sock = await trio.to_thread.run_sync(_raw_connect, control_path, _SP_REQ)
    frame = _ipc_message(b"\x80\x00\x00\x02" + request(Generic(op="forged")))
    sock.sendall(frame[:len(frame) // 2])
    await trio.sleep(HEARTBEAT_TIMEOUT_S + 1)
    await alive("half_frame_then_stall")
    sock.close()
    outcomes["half_frame_then_stall"] = f"stalled {HEARTBEAT_TIMEOUT_S + 1:g}s mid-frame; actor answered meanwhile"
    # a length prefix far past control_max_bytes
    sock = await trio.to_thread.run_sync(_raw_connect, control_path, _SP_REQ)
    sock.sendall(_ipc_message(os.urandom(1024), claimed=1 << 40))
    closed = await trio.to_thread.run_sync(_closed_by_peer, sock, 5.0)
    sock.close()
    await alive("oversized_length_prefix")
    outcomes["oversized_length_prefix"] = "connection closed by the actor" if closed else "ignored, connection left open"
    # a bulk message stalled after 1 MiB of 8 MiB, while the good peer pushes
    stored = (await _counts(target))["stored"]
    sock = await trio.to_thread.run_sync(_raw_connect, bulk_path, _SP_PUSH)
    sock.sendall(b"\x01" + (8 << 20).to_bytes(8, "big") + os.urandom(1 << 20))
    await target.push(Generic(op="store", args={"during": "stall"}))
    delivered = False
    with trio.move_on_after(10):
        while (await _counts(target))["stored"] <= stored:
            await trio.sleep(0.05)
        delivered = True
    await trio.sleep(HEARTBEAT_TIMEOUT_S)
    sock.close()
    outcomes["stall_mid_bulk"] = ("good peer's push delivered during the stall" if delivered
                                  else "good peer's push NOT delivered during the stall")
    # disconnects: mid-frame and mid-request
    for _ in range(20):
        sock = await trio.to_thread.run_sync(_raw_connect, control_path, _SP_REQ)
        sock.sendall(_ipc_message(b"\x80\x00\x00\x03" + request(Generic(op="forged")))[:40])
        sock.close()
    import pynng

    for _ in range(20):
        hangup = pynng.Req0()
        hangup.dial(control_path, block=True)
        await hangup.asend(good.seal(REQUEST, pack_envelope("hostile", "wire-0", Generic(op="sleep", args={"s": 0.3}),
                                                            os.urandom(8))))
        hangup.close()  # gone before the reply
    await trio.sleep(0.5)
    await alive("disconnect_mid_request")
    outcomes["disconnect_mid_frame"] = "20 connections cut 40 bytes into a frame; actor answered after"
    outcomes["disconnect_mid_request"] = "20 callers gone before the reply; actor answered after"
    # a bad handshake
    for _ in range(10):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(control_path[len("ipc://"):])
        sock.sendall(os.urandom(64))
        sock.close()
    await alive("garbage_handshake")
    outcomes["garbage_handshake"] = "10 connections of random bytes; actor answered after"
    # clock skew beyond the freshness window, both ways; inside it (the control) accepted
    before = await _rejected(target)
    skewed = {f"{s:+g}s": await raw_request(request(Generic(op="forged"), sent_ns=time.time_ns() + int(s * 1e9)))
              for s in (MAX_AGE_S + 5, -(MAX_AGE_S + 5))}
    stale = (await _rejected(target) - before)["stale"]
    outcomes["clock_skew_beyond_window"] = (f"{sum(r is None for r in skewed.values())} of 2 dropped "
                                            f"({stale} counted stale): skews {', '.join(skewed)}")
    inside = [await raw_request(request(Generic(op="legit"), sent_ns=time.time_ns() + int(s * 1e9)))
              for s in (MAX_AGE_S / 2, -MAX_AGE_S / 2)]
    signed = await raw_request(request(Generic(op="legit")))
    # a process of another run: its own config and key, calling this actor at its address
    before = await _rejected(target)
    result = await trio.run_process([sys.executable, "-m", "tools.chaos._wire_faults", "intruder",
                                     str(other_cfg), "10"], capture_stdout=True, check=False)
    try:
        intruder = json.loads(result.stdout.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        intruder = {"error": f"intruder exited {result.returncode}"}
    await trio.sleep(0.5)
    bad_mac = (await _rejected(target) - before)["bad_mac"]
    outcomes["other_run_process"] = (f"{intruder.get('timed_out', '?')} of {intruder.get('calls', '?')} calls "
                                     f"unanswered, {intruder.get('pushes', '?')} bulk pushes; {bad_mac} frames "
                                     "rejected bad_mac")
    for case in unanswered:
        outcomes[case] = f"the good peer's check after it missed its deadline ({outcomes.get(case, '')})"
    controls = {"a frame sealed with the right key is handled": signed is not None,
                "skew inside the window is accepted": all(r is not None for r in inside)}
    return outcomes, controls, unanswered


async def _attack(config, other_cfg: Path, key: bytes, frames: int, rng: random.Random) -> dict[str, Any]:
    from storage import EventLog
    from t1_actors.runtime import connect
    from t1_actors.runtime.supervisor import Supervisor

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
                first = await _counts(target)
                pinger = _Pinger(target)
                async with trio.open_nursery() as watchers:
                    watchers.start_soon(pinger.run)
                    watchers.start_soon(watch_heartbeats)
                    fuzz = await _fuzz(config, target, key, frames, rng)
                    hostile, controls, unanswered = await _hostile(config, target, key, other_cfg)
                    watchers.cancel_scope.cancel()
                last = await _counts(target)
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
    import secrets

    from t1_actors.job.config import load_config

    rng = random.Random(seed)
    key = secrets.token_hex(24)
    run_dir = work_dir / "wire-run"
    config = load_config(_write_config(run_dir, "wire-chaos", key))
    victim = Path(config.control_address(config.actor("wire-0"))[len("ipc://"):])
    other_cfg = _write_config(work_dir / "other-run", "another-run", secrets.token_hex(24), victim=victim)
    say(f"chaos wire: {frames} fuzzed frames, then the hostile peers")
    return trio.run(_attack, config, other_cfg, key.encode(), frames, rng)


async def _intruder(config_path: str, calls: int) -> dict[str, int]:
    """A client of another run (its own config and key) calling and pushing to the victim."""
    from t1_actors.job.config import load_config
    from t1_actors.runtime import connect

    config = load_config(Path(config_path))
    timed_out = 0
    async with connect(config, "intruder") as peers:
        for _ in range(calls):
            try:
                await peers("wire-0").call(Generic(op="forged"), deadline_s=0.5)
            except DeadlineExceeded:
                timed_out += 1
            await peers("wire-0").push(Generic(op="forged"))
        await trio.sleep(0.5)  # let the pushes leave
    return {"calls": calls, "timed_out": timed_out, "pushes": calls}


if __name__ == "__main__" and sys.argv[1:2] == ["intruder"]:
    print(json.dumps(trio.run(_intruder, sys.argv[2], int(sys.argv[3]))))
