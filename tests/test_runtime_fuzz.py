"""10,000 fuzzed, forged, replayed and misrouted frames against a live actor process: every one is
dropped and counted by reason, and the actor keeps answering real requests throughout."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pynng
import pytest
import trio

from schemas.messages import Generic, Ping, Pong
from t1_actors.job.config import load_config
from t1_actors.runtime import DeadlineExceeded, connect
from t1_actors.runtime.auth import REQUEST, Sealer
from t1_actors.runtime.wire import pack_envelope
from tools.chaos._wire_frames import forged_frames  # shared with `t1-actor chaos` (its wire section)

KEY = "fuzz-key-0123456789abcdef"
TESTS = Path(__file__).resolve().parent


def start_actor(run_dir: Path, name: str = "echo-0") -> tuple[subprocess.Popen, Path]:
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = run_dir / "run.toml"
    cfg.write_text(f'[run]\nid = "fuzz"\ndir = "{run_dir}"\nhmac_key = "{KEY}"\n'
                   f'[[actors]]\nname = "{name}"\nrole = "echo"\nactor_class = "plugin_actors:EchoActor"\n')
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, "-m", "t1_actors.cli", "echo", "--config", str(cfg), "--name", name],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, cfg


async def wait_answering(peers, name: str, within_s: float = 120) -> None:
    with trio.fail_after(within_s):
        while True:
            try:
                await peers(name).call(Ping(), deadline_s=1.0)
                return
            except DeadlineExceeded:
                pass


@pytest.mark.slow
def test_ten_thousand_forged_frames_are_dropped_while_serving():
    run_dir = Path(f"/tmp/t1fz-{os.getpid()}")
    proc, cfg_path = start_actor(run_dir)
    try:
        trio.run(_fuzz, load_config(cfg_path))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(run_dir, ignore_errors=True)
    assert proc.returncode == 0  # SIGTERM is a clean shutdown


async def _fuzz(config) -> None:
    rng = random.Random(7)
    async with connect(config, "fuzzer") as peers:
        await wait_answering(peers, "echo-0")
        spec = config.actor("echo-0")
        # a frame the actor accepted once: every resend of these exact bytes is a replay
        replay = Sealer(KEY.encode()).seal(REQUEST, pack_envelope("fuzzer", "echo-0", Ping(), b"r"))
        control = pynng.Req0(resend_time=24 * 3600 * 1000)
        control.dial(config.control_address(spec), block=True)
        ctx = control.new_context()
        await ctx.asend(replay)
        await ctx.arecv()
        ctx.close()
        bulk = pynng.Push0()
        bulk.dial(config.bulk_address(spec), block=True)

        expected: Counter[str] = Counter()
        frames = forged_frames(9_000, KEY.encode(), replay, rng)
        for start in range(0, len(frames), 500):
            contexts = []
            for reason, frame in frames[start:start + 500]:
                if reason == "x":
                    continue  # the flipped bit hit the magic/channel: counted below as whatever it became
                expected[reason] += 1
                ctx = control.new_context()
                await ctx.asend(frame)
                contexts.append(ctx)
            with trio.fail_after(10):  # the actor still answers, promptly
                assert isinstance(await peers("echo-0").call(Ping(payload=b"alive"), deadline_s=10), Pong)
            for ctx in contexts:
                ctx.close()
        # the bulk inbox gets its share: garbage, forged, control frames on the bulk channel
        for i in range(10_000 - sum(expected.values())):
            if i % 2:
                expected["short"] += 1  # shorter than a bulk header: 28 bytes + a 16-byte GMAC
                await bulk.asend(os.urandom(rng.randint(1, 43)))
            else:
                expected["wrong_channel"] += 1
                await bulk.asend(Sealer(KEY.encode()).seal(REQUEST, pack_envelope("x", "echo-0", Ping(), b"1")))
        await peers("echo-0").push(Generic(op="store", args={"last": True}))  # real bulk still flows
        assert sum(expected.values()) == 10_000
        with trio.fail_after(60):
            while True:
                stats = (await peers("echo-0").call(Generic(op="runtime.stats"))).args
                stored = (await peers("echo-0").call(Generic(op="stored"))).args["items"]
                if sum(stats["rejected"].values()) >= 10_000 and stored:
                    break
                await trio.sleep(0.1)
        assert stats["rejected"] == dict(expected)
        assert stored == [{"last": True}]
        control.close()
        bulk.close()
