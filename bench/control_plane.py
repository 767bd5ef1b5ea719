"""Control-plane and bulk cost of the runtime versus raw pynng, measured side by side in one run.

Round trip: the runtime's request/reply (an actor process serving under trio: HMAC seal and check,
envelope, record validation, dispatch to a handler, sealed reply) versus raw synchronous pynng
Req0/Rep0 between two processes moving the same encoded record. The two are measured in
alternating blocks so that both see the same machine load.

Bulk: the runtime's ``push`` (sealed, into the actor's bulk inbox and its handler) versus raw pynng
Push0/Pull0 of the same encoded records between two processes; MB/s from the first send until the
receiver holds them all (the receiver says so itself: no polling while it works).

    python bench/control_plane.py [--calls 2000] [--blocks 10] [--bulk-mb 4] [--bulk-count 48]

Last line: one JSON object with rtt_over_floor (the runtime's p50 over its own floor measured in the same
run: its sockets under trio plus the message work it must do; goal <= 1.2), bulk_ratio (against raw pynng;
goal >= 0.9), the comparison users know, vs_ray_rtt_p50 and vs_ray_bulk (a Ray actor's p50 over the
runtime's, the runtime's MB/s over Ray's, both sides measured in the same blocks; > 1: t1 ahead; null with
ray_absent when ray is not installed), rtt_p50_ratio and rtt_p99_ms, and where the round-trip gap goes:
- rtt_gap_server_us / rtt_gap_client_us: split by a third interleaved measurement, raw synchronous
  pynng calling the actor's server with sealed frames;
- rtt_bare_ratio: a fourth, the runtime's sockets alone under trio (nngraw.py: a PolledReq calling a
  RawRep that echoes, no sealing, envelope or dispatch) versus raw: what trio + pynng cost by themselves;
- rtt_work_us: the CPU the runtime's message work takes per round trip on both sides (seal, open,
  envelope, record validation, the Pong), timed hot in this process; rtt_floor_ratio = (bare p50 +
  rtt_work_us) / raw p50, the ratio the runtime could reach if nothing else cost anything;
and mac_GBps: the single-thread speed of each MAC (HMAC-SHA256 for control frames, AES-256-GMAC for
bulk), which every bulk byte pays once on each side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import pynng
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.ray_side import RaySide
from schemas import decode, encode
from schemas.messages import Generic, Ping
from t1_actors.job.config import parse_config
from t1_actors.runtime import Actor, connect, handles
from t1_actors.runtime.auth import REQUEST, Sealer
from t1_actors.runtime.memory import keep_freed_buffers
from t1_actors.runtime.wire import pack_envelope

KEY = "bench-key-0123456789abcdef"
PAYLOAD = b"x" * 256  # a small control message, like a heartbeat or a cancel
_BULK_WAIT_S = 300  # a bulk measurement that takes longer has lost messages


class BenchEcho(Actor):
    role = "bench"

    async def setup(self) -> None:
        self.blobs = 0
        self.more_blobs = trio.Event()

    @handles(Generic)
    async def generic(self, req: Generic):
        if req.op == "blob":
            self.blobs += 1
            self.more_blobs.set()
            return None
        if req.op == "blobs":
            return Generic(op="blobs", args={"n": self.blobs})
        if req.op == "wait_blobs":  # answers once the count reaches n: no polling during a measurement
            while self.blobs < req.args["n"]:
                self.more_blobs = trio.Event()
                await self.more_blobs.wait()
            return Generic(op="blobs", args={"n": self.blobs})
        raise KeyError(req.op)


# ---- raw pynng peers (separate process) ---------------------------------------------------------
def raw_server(rep_addr: str, pull_addr: str) -> None:
    """Echo requests; count pulled messages, report the count on request or once it reaches n."""
    import threading

    pulled = [0]
    more = threading.Condition()
    pull = pynng.Pull0(listen=pull_addr, recv_max_size=0)

    def pull_loop():
        try:
            while True:
                pull.recv()
                with more:
                    pulled[0] += 1
                    more.notify_all()
        except pynng.Closed:
            return

    puller = threading.Thread(target=pull_loop)
    puller.start()
    with pynng.Rep0(listen=rep_addr) as rep:
        while True:
            msg = rep.recv()
            if msg == b"count":
                rep.send(str(pulled[0]).encode())
            elif msg.startswith(b"wait "):
                with more:
                    more.wait_for(lambda target=int(msg[5:]): pulled[0] >= target, timeout=_BULK_WAIT_S)
                    rep.send(str(pulled[0]).encode())
            elif msg == b"stop":
                rep.send(b"bye")  # not empty: pynng 0.9 cannot receive an empty message
                break
            else:
                rep.send(msg)
    pull.close()  # before exit: nng must not be torn down under a thread still inside recv
    puller.join()


def serve_bare(address: str, spin_s: float) -> None:
    """The runtime's server socket under trio, echoing: no sealing, envelope or dispatch."""
    from t1_actors.runtime.nngraw import RawRep

    async def main():
        sock = RawRep(max_bytes=1 << 20, spin_s=spin_s)
        sock.listen(address)
        while True:
            header, body = await sock.receive()
            if not sock.try_reply(header, body):
                await sock.reply(header, body)

    trio.run(main)


def serve_actor_process(config_path: str) -> None:
    from t1_actors.job.config import load_config
    from t1_actors.runtime import run_actor_process

    sys.exit(run_actor_process(BenchEcho, load_config(config_path), "bench-0"))


# ---- measurements -------------------------------------------------------------------------------
def raw_rtt_block(req: pynng.Req0, n: int) -> list[float]:
    wire = encode(Ping(payload=PAYLOAD))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        req.send(wire)
        decode(req.recv())
        times.append(time.perf_counter() - t0)
    return times


def raw_to_actor_rtt_block(req: pynng.Req0, n: int) -> list[float]:
    """Raw synchronous pynng calling the actor's server with sealed Ping frames (sealed before the clock
    starts): the runtime's server-side cost alone, for the split of the gap between its two sides."""
    sealer = Sealer(KEY.encode())
    frames = [sealer.seal(REQUEST, pack_envelope("bench", "bench-0", Ping(payload=PAYLOAD), os.urandom(8)))
              for _ in range(n)]
    times = []
    for frame in frames:
        t0 = time.perf_counter()
        req.send(frame)
        req.recv()
        times.append(time.perf_counter() - t0)
    return times


async def bare_rtt_block(sock, n: int) -> list[float]:
    """The runtime's client socket (PolledReq) calling the bare echo: trio + pynng alone."""
    wire = encode(Ping(payload=PAYLOAD))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        reply = await sock.request(wire, trio.current_time() + 5)
        if reply is None:
            raise RuntimeError("bare echo: no reply in 5 s")
        decode(reply)
        times.append(time.perf_counter() - t0)
    return times


def rtt_work_us() -> float:
    """CPU of the runtime's message work per round trip, both sides, hot: the caller seals a Ping, the
    server opens it, validates the record, builds and seals the Pong, the caller opens and validates it."""
    from schemas.messages import Pong
    from t1_actors.runtime.auth import REPLY, Opener
    from t1_actors.runtime.wire import unpack_envelope

    sealer, opener = Sealer(KEY.encode()), Opener(KEY.encode(), 60)
    ping = Ping(payload=PAYLOAD)

    def round_trip():
        request = sealer.seal(REQUEST, pack_envelope("bench", "bench-0", ping, os.urandom(8)))
        env = unpack_envelope(opener.open(REQUEST, request))
        pong = Pong(actor=env.dest, payload=env.record().payload)
        reply = sealer.seal(REPLY, pack_envelope(env.dest, env.sender, pong, os.urandom(8), env.msg_id))
        return unpack_envelope(opener.open(REPLY, reply)).record()

    return min(timeit.repeat(round_trip, number=2000, repeat=5)) / 2000 * 1e6


def mac_GBps(blob: bytes) -> dict[str, float]:
    """Single-thread speed of the control frames' MAC and the bulk frames' MAC over one bulk message:
    what one check per side costs against the bytes raw pynng only moves (timed as sealing it)."""
    from t1_actors.runtime.auth import BULK

    sealer = Sealer(KEY.encode())
    return {name: round(len(blob) / (min(timeit.repeat(lambda channel=channel: sealer.header(channel, blob),
                                                       number=5, repeat=5)) / 5) / 1e9, 2)
            for name, channel in (("hmac_sha256", REQUEST), ("aes_gmac", BULK))}


async def runtime_rtt_block(group, n: int) -> list[float]:
    record = Ping(payload=PAYLOAD)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await group.call(record, deadline_s=5)
        times.append(time.perf_counter() - t0)
    return times


def raw_bulk(req: pynng.Req0, push: pynng.Push0, blob: bytes, count: int) -> float:
    req.send(b"count")
    before = int(req.recv())
    wire = encode(Generic(op="blob", args={"data": blob}))
    t0 = time.perf_counter()
    for _ in range(count):
        push.send(wire)
    req.send(b"wait %d" % (before + count))
    if int(req.recv()) - before < count:
        raise RuntimeError(f"raw bulk: the receiver did not get {count} messages in {_BULK_WAIT_S} s")
    return len(wire) * count / (time.perf_counter() - t0) / 1e6


async def runtime_bulk(group, blob: bytes, count: int) -> float:
    before = (await group.call(Generic(op="blobs"))).args["n"]
    record = Generic(op="blob", args={"data": blob})
    size = len(encode(record))
    t0 = time.perf_counter()
    for _ in range(count):
        await group.push(record)
    # DeadlineExceeded when messages were lost (e.g. rejected): said, rather than waited for forever
    await group.call(Generic(op="wait_blobs", args={"n": before + count}), deadline_s=_BULK_WAIT_S)
    return size * count / (time.perf_counter() - t0) / 1e6


def process_cpu_s(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU per operation of this process (the caller) and of one server process, summed over blocks."""

    def __init__(self, server_pid: int):
        self.server_pid, self.client_s, self.server_s, self.ops = server_pid, 0.0, 0.0, 0

    def start(self) -> None:
        self._c0, self._s0 = time.process_time(), process_cpu_s(self.server_pid)

    def stop(self, ops: int) -> None:
        self.client_s += time.process_time() - self._c0
        self.server_s += process_cpu_s(self.server_pid) - self._s0
        self.ops += ops

    def per_op_us(self) -> tuple[float, float]:
        return round(self.client_s / self.ops * 1e6, 1), round(self.server_s / self.ops * 1e6, 1)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="round trips per side")
    parser.add_argument("--blocks", type=int, default=10, help="alternating blocks the calls are split into")
    parser.add_argument("--bulk-mb", type=float, default=4.0, help="size of one bulk message (MiB)")
    parser.add_argument("--bulk-count", type=int, default=48, help="bulk messages per measurement")
    parser.add_argument("--bulk-rounds", type=int, default=5, help="alternating raw/runtime bulk measurements")
    parser.add_argument("--spin-us", type=float, default=None,
                        help="[transport] poll_spin_us of the runtime (default: the config default)")
    parser.add_argument("--serve-raw", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--serve-actor", help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_raw:
        return raw_server(*args.serve_raw)
    if args.serve_actor:
        return serve_actor_process(args.serve_actor)
    if args.serve_bare:
        return serve_bare(args.serve_bare[0], float(args.serve_bare[1]))
    keep_freed_buffers()  # this process sends as an actor process would (run_actor_process does the same)

    base = Path(tempfile.mkdtemp(prefix="t1cp-"))
    transport = {} if args.spin_us is None else {"poll_spin_us": args.spin_us}
    config = parse_config({"run": {"id": "bench", "dir": str(base), "hmac_key": KEY}, "transport": transport,
                           "actors": [{"name": "bench-0", "role": "bench",
                                       "actor_class": "bench.control_plane:BenchEcho"}]})
    cfg_path = base / "run.json"
    cfg_path.write_text(json.dumps({**config.to_jsonable(), "run": {**config.to_jsonable()["run"], "hmac_key": KEY}}))
    rep_addr, pull_addr, bare_addr = f"ipc://{base}/raw-rep", f"ipc://{base}/raw-pull", f"ipc://{base}/bare"
    spin_s = config.transport.poll_spin_us * 1e-6
    me = [sys.executable, str(Path(__file__).resolve())]
    procs = [subprocess.Popen(me + ["--serve-raw", rep_addr, pull_addr]),
             subprocess.Popen(me + ["--serve-actor", str(cfg_path)], stderr=subprocess.DEVNULL),
             subprocess.Popen(me + ["--serve-bare", bare_addr, str(spin_s)])]
    ray_side, ray_absent = RaySide.start()
    try:
        result = trio.run(measure, args, config, rep_addr, pull_addr, bare_addr, procs[0].pid, procs[1].pid,
                          ray_side)
    finally:
        if ray_side is not None:
            ray_side.stop()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a starved machine: do not lose the measurement over it
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)
    if ray_absent:
        result["ray_absent"] = ray_absent
    print(json.dumps(result))


async def measure(args, config, rep_addr: str, pull_addr: str, bare_addr: str, raw_pid: int, actor_pid: int,
                  ray_side: RaySide | None) -> dict:
    from t1_actors.runtime.nngraw import PolledReq

    req = pynng.Req0(recv_max_size=0, recv_timeout=60_000)  # a dead raw peer fails the run, not hangs it
    req.dial(rep_addr, block=False)
    push = pynng.Push0()
    push.dial(pull_addr, block=False)
    async with connect(config, "bench") as peers:
        group = peers("bench-0")
        with trio.fail_after(120):  # both servers up
            while True:
                try:
                    await group.call(Ping(), deadline_s=1)
                    break
                except Exception:
                    await trio.sleep(0.1)
        to_actor = pynng.Req0(recv_max_size=0, recv_timeout=60_000)
        to_actor.dial(config.control_address(config.actor("bench-0")), block=False)
        bare_sock = PolledReq(bare_addr, 1 << 20, config.transport.poll_spin_us * 1e-6)
        raw_rtt_block(req, 50)  # warm the paths
        await runtime_rtt_block(group, 50)
        raw_to_actor_rtt_block(to_actor, 50)
        await bare_rtt_block(bare_sock, 50)
        raw, rt, half, bare, ray = [], [], [], [], []
        if ray_side is not None:
            ray_side.rtt_block(PAYLOAD, 50)
        raw_cpu, rt_cpu = CpuMeter(raw_pid), CpuMeter(actor_pid)
        per_block = max(1, args.calls // args.blocks)
        for _ in range(args.blocks):
            raw_cpu.start()
            raw += raw_rtt_block(req, per_block)
            raw_cpu.stop(per_block)
            rt_cpu.start()
            rt += await runtime_rtt_block(group, per_block)
            rt_cpu.stop(per_block)
            half += raw_to_actor_rtt_block(to_actor, per_block)
            bare += await bare_rtt_block(bare_sock, per_block)
            if ray_side is not None:
                ray += ray_side.rtt_block(PAYLOAD, per_block)
        to_actor.close()
        bare_sock.close()
        work_us = rtt_work_us()
        blob = os.urandom(int(args.bulk_mb * (1 << 20)))
        raw_bulk(req, push, blob, 4)
        await runtime_bulk(group, blob, 4)
        raw_mbps, rt_mbps, ray_mbps = [], [], []
        if ray_side is not None:
            ray_side.bulk(blob, 4)
        raw_bulk_cpu, rt_bulk_cpu = CpuMeter(raw_pid), CpuMeter(actor_pid)
        for _ in range(args.bulk_rounds):
            raw_bulk_cpu.start()
            raw_mbps.append(raw_bulk(req, push, blob, args.bulk_count))
            raw_bulk_cpu.stop(args.bulk_count)
            rt_bulk_cpu.start()
            rt_mbps.append(await runtime_bulk(group, blob, args.bulk_count))
            rt_bulk_cpu.stop(args.bulk_count)
            if ray_side is not None:
                ray_mbps.append(ray_side.bulk(blob, args.bulk_count))
        macs = mac_GBps(blob)
    req.send(b"stop")
    req.recv()
    req.close()
    push.close()
    raw_p50, rt_p50, half_p50, bare_p50 = pct(raw, 0.5), pct(rt, 0.5), pct(half, 0.5), pct(bare, 0.5)
    raw_bulk_mbps, rt_bulk_mbps = statistics.median(raw_mbps), statistics.median(rt_mbps)
    # each runtime round against the raw round just before it (same minute's load), median over rounds
    bulk_ratio = statistics.median(rt / raw for rt, raw in zip(rt_mbps, raw_mbps))
    floor_p50 = bare_p50 + work_us * 1e-6
    vs_ray = {"vs_ray_rtt_p50": None, "vs_ray_bulk": None, "ray_rtt_p50_us": None, "ray_rtt_p99_ms": None,
              "ray_bulk_MBps": None}
    if ray:  # > 1: t1 is ahead (Ray's p50 over t1's; t1's MB/s over Ray's, round by round)
        vs_ray = {"vs_ray_rtt_p50": round(pct(ray, 0.5) / rt_p50, 3),
                  "vs_ray_bulk": round(statistics.median(rt / r for rt, r in zip(rt_mbps, ray_mbps)), 3),
                  "ray_rtt_p50_us": round(pct(ray, 0.5) * 1e6, 1), "ray_rtt_p99_ms": round(pct(ray, 0.99) * 1e3, 3),
                  "ray_bulk_MBps": round(statistics.median(ray_mbps), 1)}
    return {
        "rtt_p50_ratio": round(rt_p50 / raw_p50, 3),
        "rtt_p99_ms": round(pct(rt, 0.99) * 1e3, 3),
        "bulk_ratio": round(bulk_ratio, 3),
        "rtt_p50_us": round(rt_p50 * 1e6, 1), "raw_rtt_p50_us": round(raw_p50 * 1e6, 1),
        "raw_rtt_p99_ms": round(pct(raw, 0.99) * 1e3, 3),
        # where the gap sits: raw client -> runtime server minus raw; the runtime client is the rest
        "rtt_gap_server_us": round((half_p50 - raw_p50) * 1e6, 1),
        "rtt_gap_client_us": round((rt_p50 - half_p50) * 1e6, 1),
        "rtt_bare_ratio": round(bare_p50 / raw_p50, 3), "rtt_bare_p50_us": round(bare_p50 * 1e6, 1),
        "rtt_work_us": round(work_us, 1),
        "rtt_floor_ratio": round(floor_p50 / raw_p50, 3),
        # the runtime over its own floor (its sockets under trio + the message work it must do): goal <= 1.2
        "rtt_over_floor": round(rt_p50 / floor_p50, 3),
        **vs_ray,
        # CPU per round trip (caller, server), all threads: the busy-poll's cost shows here.
        "rtt_cpu_us": rt_cpu.per_op_us(), "raw_rtt_cpu_us": raw_cpu.per_op_us(),
        "bulk_MBps": round(rt_bulk_mbps, 1), "raw_bulk_MBps": round(raw_bulk_mbps, 1),
        # CPU per bulk message (sender, receiver), all threads
        "bulk_cpu_ms": [round(v / 1e3, 2) for v in rt_bulk_cpu.per_op_us()],
        "raw_bulk_cpu_ms": [round(v / 1e3, 2) for v in raw_bulk_cpu.per_op_us()],
        "mac_GBps": macs,
        "calls": len(rt), "bulk_message_MiB": args.bulk_mb, "bulk_count": args.bulk_count,
        "transport": "ipc", "cpus": os.cpu_count(), "load_average": round(os.getloadavg()[0], 1),
        "targets_met": rt_p50 / floor_p50 <= 1.2 and bulk_ratio >= 0.9,
    }


if __name__ == "__main__":
    main()
