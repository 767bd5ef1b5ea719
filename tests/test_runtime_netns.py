"""Two actors in separate network namespaces (joined by a veth pair) talk over tcp://.

Needs root and `ip netns`: skipped without root, failed as root without them (tests/_netns.py). Each actor runs alone
(`t1-actor echo --config ... --name ...`) inside its namespace, as on two hosts of a cluster; the
test's driver runs inside the second namespace and asks actor B to call actor A across the link.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from _netns import require_netns

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(300)]

TESTS = Path(__file__).resolve().parent
KEY = "netns-test-key-0123456789"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def two_namespaces():
    require_netns()  # skipped without root; as root without `ip` (or refused) a failure: CI runs this
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b, veth_a, veth_b = f"t1a{tag}", f"t1b{tag}", f"t1va{tag}", f"t1vb{tag}"
    steps = [("netns", "add", ns_a), ("netns", "add", ns_b),
             ("link", "add", veth_a, "type", "veth", "peer", "name", veth_b),
             ("link", "set", veth_a, "netns", ns_a), ("link", "set", veth_b, "netns", ns_b),
             ("-n", ns_a, "addr", "add", "10.231.0.1/24", "dev", veth_a),
             ("-n", ns_b, "addr", "add", "10.231.0.2/24", "dev", veth_b),
             ("-n", ns_a, "link", "set", veth_a, "up"), ("-n", ns_b, "link", "set", veth_b, "up"),
             ("-n", ns_a, "link", "set", "lo", "up"), ("-n", ns_b, "link", "set", "lo", "up")]
    try:
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.fail(f"cannot build the namespaces (ip {' '.join(step)}): {done.stderr.strip()}")
        yield ns_a, ns_b
    finally:
        _ip("netns", "del", ns_a)  # deleting a namespace removes its end of the veth pair, and the pair
        _ip("netns", "del", ns_b)


DRIVER = textwrap.dedent("""
    import sys, trio
    from schemas.messages import Generic, Ping
    from t1_actors.job.config import load_config
    from t1_actors.runtime import DeadlineExceeded, connect

    async def main():
        config = load_config(sys.argv[1])
        async with connect(config, "driver") as peers:
            with trio.fail_after(120):
                for name in ("echo-b",):
                    while True:
                        try:
                            await peers(name).call(Ping(), deadline_s=1)
                            break
                        except DeadlineExceeded:
                            await trio.sleep(0.2)
                while True:  # B calls A across the veth link, over tcp
                    try:
                        reply = await peers("echo-b").call(
                            Generic(op="call_peer", args={"peer": "echo-a", "deadline_s": 1.0}), deadline_s=3)
                        break
                    except Exception as exc:
                        await trio.sleep(0.2)
            print("VIA", reply.args["via"])
            pong = await peers("echo-a").call(Ping(payload=b"direct"), deadline_s=5)
            print("PONG", pong.actor)

    trio.run(main)
""")


def test_actors_in_two_namespaces_talk_over_tcp(two_namespaces):
    ns_a, ns_b = two_namespaces
    run_dir = Path(tempfile.mkdtemp(prefix="t1ns-"))
    config = run_dir / "run.toml"
    config.write_text(textwrap.dedent(f"""
        [run]
        id = "netns"
        dir = "{run_dir}"
        hmac_key = "{KEY}"

        [supervisor]
        address = "tcp://10.231.0.1:7390"

        [[actors]]
        name = "echo-a"
        role = "echo"
        host = "ns-a"
        address = "tcp://10.231.0.1:7400"
        actor_class = "plugin_actors:EchoActor"

        [[actors]]
        name = "echo-b"
        role = "echo"
        host = "ns-b"
        address = "tcp://10.231.0.2:7400"
        actor_class = "plugin_actors:EchoActor"
    """))
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "t1_actors.cli", "echo", "--config", str(config), "--name"]
    actors = [subprocess.Popen(["ip", "netns", "exec", ns, *cmd, name], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for ns, name in ((ns_a, "echo-a"), (ns_b, "echo-b"))]
    try:
        driver = subprocess.run(["ip", "netns", "exec", ns_b, sys.executable, "-c", DRIVER, str(config)],
                                env=env, capture_output=True, text=True, timeout=200)
        assert driver.returncode == 0, driver.stderr[-3000:]
        assert "VIA echo-b" in driver.stdout  # echo-a answered echo-b's call, made from the other namespace
        assert "PONG echo-a" in driver.stdout
    finally:
        for proc in actors:
            proc.terminate()
        for proc in actors:
            proc.wait(timeout=60)
        shutil.rmtree(run_dir, ignore_errors=True)
    assert [proc.returncode for proc in actors] == [0, 0]  # SIGTERM: a clean shutdown in each namespace
