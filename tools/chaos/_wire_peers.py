"""Hostile peers over a raw socket (nng's SP protocol spoken by hand): half a frame then a stall past the
heartbeat timeout; a length prefix far over the size limit; a bulk message stalled after 1 MiB of 8 MiB while
the good peer's bulk push must still be delivered; disconnects mid-frame and mid-request; a bad handshake;
clock skew beyond the freshness window (either way); a process of another run (another key) calling the
actor (``python -m tools.chaos._wire_peers intruder CONFIG N``).

After each case a good peer's ping must be answered within the heartbeat timeout; ``hostile_peers`` lists the
cases after which it was not.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pynng
import trio

from schemas.messages import Generic, Ping
from t1_actors.runtime import DeadlineExceeded, connect
from t1_actors.runtime.auth import REQUEST, Sealer
from t1_actors.runtime.wire import pack_envelope
from tools.chaos._wire_frames import sealed_at
from tools.chaos._wire_target import HEARTBEAT_TIMEOUT_S, MAX_AGE_S, actor_counts, rejections

_SP_REQ, _SP_PUSH = 0x30, 0x50  # nng protocol numbers of the peers we pretend to be (Req0, Push0)


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



async def hostile_peers(config, target, key: bytes, other_cfg: Path) -> tuple[dict[str, str], dict[str, bool], list[str]]:
    """Every hostile peer in turn against the actor ``wire-0`` (the module docstring's list); returns each case's
    outcome in words, the positive controls (a frame sealed with the right key is handled, skew inside the
    window accepted) and the cases after which the good peer's check missed its deadline."""
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
    stored = (await actor_counts(target))["stored"]
    sock = await trio.to_thread.run_sync(_raw_connect, bulk_path, _SP_PUSH)
    sock.sendall(b"\x01" + (8 << 20).to_bytes(8, "big") + os.urandom(1 << 20))
    await target.push(Generic(op="store", args={"during": "stall"}))
    delivered = False
    with trio.move_on_after(10):
        while (await actor_counts(target))["stored"] <= stored:
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
    before = await rejections(target)
    skewed = {f"{s:+g}s": await raw_request(request(Generic(op="forged"), sent_ns=time.time_ns() + int(s * 1e9)))
              for s in (MAX_AGE_S + 5, -(MAX_AGE_S + 5))}
    stale = (await rejections(target) - before)["stale"]
    outcomes["clock_skew_beyond_window"] = (f"{sum(r is None for r in skewed.values())} of 2 dropped "
                                            f"({stale} counted stale): skews {', '.join(skewed)}")
    inside = [await raw_request(request(Generic(op="legit"), sent_ns=time.time_ns() + int(s * 1e9)))
              for s in (MAX_AGE_S / 2, -MAX_AGE_S / 2)]
    signed = await raw_request(request(Generic(op="legit")))
    # a process of another run: its own config and key, calling this actor at its address
    before = await rejections(target)
    result = await trio.run_process([sys.executable, "-m", "tools.chaos._wire_peers", "intruder",
                                     str(other_cfg), "10"], capture_stdout=True, check=False)
    try:
        intruder = json.loads(result.stdout.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        intruder = {"error": f"intruder exited {result.returncode}"}
    await trio.sleep(0.5)
    bad_mac = (await rejections(target) - before)["bad_mac"]
    outcomes["other_run_process"] = (f"{intruder.get('timed_out', '?')} of {intruder.get('calls', '?')} calls "
                                     f"unanswered, {intruder.get('pushes', '?')} bulk pushes; {bad_mac} frames "
                                     "rejected bad_mac")
    for case in unanswered:
        outcomes[case] = f"the good peer's check after it missed its deadline ({outcomes.get(case, '')})"
    controls = {"a frame sealed with the right key is handled": signed is not None,
                "skew inside the window is accepted": all(r is not None for r in inside)}
    return outcomes, controls, unanswered



async def _intruder(config_path: str, calls: int) -> dict[str, int]:
    """A client of another run (its own config and key) calling and pushing to the victim."""
    from t1_actors.job.config import load_config  # noqa: PLC0415 - keeps chaos free of torch until this section runs (1.6 s)

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
