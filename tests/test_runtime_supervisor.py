"""The supervisor with real actor processes: readiness, restarts, giving up, hung actors, clean shutdown,
and the `t1-actor launch` program under SIGINT and SIGKILL (no orphans, no half-written events)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio
from _trio import trio_test

import storage
from schemas.messages import Generic, Ping, Pong
from t1_actors.job.config import load_config, parse_config
from t1_actors.runtime import DeadlineExceeded, connect
from t1_actors.runtime.supervisor import Supervisor, SupervisorError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.alone]  # times heartbeats

KEY = "supervisor-test-key-0123456789"
TESTS = Path(__file__).resolve().parent
ENV = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")



@pytest.fixture
def run_dir():
    path = Path(tempfile.mkdtemp(prefix="t1sv-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def config_for(run_dir: Path, actors: list[dict], **supervisor) -> dict:
    return {"run": {"id": "sv", "dir": str(run_dir), "hmac_key": KEY},
            "transport": {"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 5.0, "control_deadline_s": 5.0},
            "supervisor": {"restart_backoff_s": 0.05, "shutdown_grace_s": 5.0, "ready_timeout_s": 120.0,
                           **supervisor},
            "actors": actors}


def echo(name: str) -> dict:
    return {"name": name, "role": "echo", "actor_class": "plugin_actors:EchoActor"}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def lifecycle(run_dir: Path) -> list[tuple[str, str, str]]:
    log = storage.EventLog.open(run_dir / "log")
    log.verify()  # every committed chunk checks out: nothing half-written
    return [(e.actor, e.state, e.reason) for _, e in log.events(kinds=["actor_lifecycle"])]


async def wait_for(predicate, within_s: float, every_s: float = 0.05):
    with trio.fail_after(within_s):
        while not (result := await predicate()):
            await trio.sleep(every_s)
        return result


@trio_test
async def test_restart_after_kill_and_clean_shutdown(run_dir):
    config = parse_config(config_for(run_dir, [echo("echo-0"), echo("echo-1")]))
    supervisor = Supervisor(config, env=ENV)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        first = {name: supervisor.pid(name) for name in ("echo-0", "echo-1")}
        async with connect(config, "tester") as peers:
            assert (await peers("echo-1").call(Ping())).actor == "echo-1"
            os.kill(first["echo-1"], signal.SIGKILL)

            async def restarted():
                pid = supervisor.pid("echo-1")
                return pid not in (None, first["echo-1"]) and supervisor.actors["echo-1"].ready.is_set()

            await wait_for(restarted, 120)
            assert isinstance(await peers("echo-1").call(Ping(), deadline_s=10), Pong)
            assert supervisor.pid("echo-0") == first["echo-0"]  # the other one was left alone
            second = supervisor.pid("echo-1")
        await supervisor.shutdown("test over")
    for pid in (*first.values(), second):
        assert not alive(pid)
    events = lifecycle(run_dir)
    assert ("echo-1", "died", "killed by SIGKILL") in events
    assert ("echo-1", "restarted", "") in events
    for name in ("echo-0", "echo-1"):  # each actor process committed its own 'stopped' on the way out
        assert events.index((name, "stopped", "shutdown")) > 0
    assert sum(1 for e in events if e[1] == "stopped" and e[2] == "test over") == 2  # the supervisor's record


@trio_test
async def test_crash_is_restarted_and_endless_crashes_are_given_up(run_dir):
    actors = [{"name": "once", "role": "crasher", "actor_class": "plugin_actors:CrashingActor"},
              {"name": "always", "role": "crasher", "actor_class": "plugin_actors:CrashingActor",
               "options": {"always": True}}]
    config = parse_config(config_for(run_dir, actors, restart_limit=2))
    supervisor = Supervisor(config, env=ENV)
    with pytest.raises(SupervisorError, match="'always' was given up on"):
        await supervisor.run()
    events = lifecycle(run_dir)
    # 'once' crashed in run() (exit code 1; or, on a loaded machine, was killed for silence first)
    assert any(e[0] == "once" and e[1] == "died" for e in events) and ("once", "restarted", "") in events
    died = [e[2] for e in events if e[0] == "always" and e[1] == "died"]
    assert died.count("exit code 1") == 3  # the supervisor's record: first start + 2 restarts
    assert died.count("RuntimeError: crashing on first start, as designed") == 3  # the actor's own last words
    assert any(e[0] == "always" and e[1] == "gave_up" and "2 restarts" in e[2] for e in events)
    assert all(not alive(m.process.pid) for m in supervisor.actors.values())


@trio_test
async def test_hung_actor_is_reported_and_restarted(run_dir):
    config = parse_config(config_for(run_dir, [echo("echo-0")]))
    supervisor = Supervisor(config, env=ENV)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        hung = supervisor.pid("echo-0")
        async with connect(config, "tester") as peers:
            with pytest.raises(DeadlineExceeded):
                await peers("echo-0").call(Generic(op="freeze", args={"s": 600}), deadline_s=0.5)
            await wait_for(lambda: _restarted(supervisor, "echo-0", hung), 120)
            assert isinstance(await peers("echo-0").call(Ping(), deadline_s=10), Pong)
        await supervisor.shutdown()
    assert not alive(hung)
    assert any(e[0] == "echo-0" and e[1] == "died" and "no heartbeat" in e[2] for e in lifecycle(run_dir))


async def _restarted(supervisor, name, old_pid):
    pid = supervisor.pid(name)
    return pid is not None and pid != old_pid and supervisor.actors[name].ready.is_set()


def _launch(run_dir: Path) -> tuple[subprocess.Popen, object]:
    toml = run_dir / "run.toml"
    toml.write_text(f'[run]\nid = "cli"\ndir = "{run_dir}"\n'
                    '[transport]\nheartbeat_interval_s = 0.2\nheartbeat_timeout_s = 5.0\n'
                    '[supervisor]\nshutdown_grace_s = 5.0\n'
                    + "".join(f'[[actors]]\nname = "{n}"\nrole = "echo"\nactor_class = "plugin_actors:EchoActor"\n'
                              for n in ("echo-0", "echo-1")))
    env = {k: v for k, v in ENV.items() if k != "T1_RUN_KEY"}  # the launcher makes a fresh run key
    proc = subprocess.Popen([sys.executable, "-m", "t1_actors.cli", "launch", "--config", str(toml)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, load_config(toml)


def _actor_pids(run_dir: Path, within_s: float = 120) -> dict[str, int]:
    """The pids of both actors, from the supervisor's 'started' events in the log."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            pids = {a: e.pid for _, e in storage.EventLog.open(run_dir / "log").events(kinds=["actor_lifecycle"])
                    if (a := e.actor) and e.state == "started" and e.pid and e.role == "echo"}
            ready = [line for line in (run_dir / "ready").read_text().splitlines()] if (run_dir / "ready").exists() else []
            if len(pids) == 2 and ready is not None:
                return pids
        except Exception:
            pass
        time.sleep(0.2)
    raise AssertionError("actors did not start")


def _wait_serving(run_dir: Path, within_s: float = 120) -> None:
    """Until both actors logged 'started' in their own segments (their sockets are up just before)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            log = storage.EventLog.open(run_dir / "log")
            if {"echo-0", "echo-1"} <= set(log.segments()):
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise AssertionError("actors did not come up")


def test_launch_sigint_stops_everything(run_dir):
    proc, _ = _launch(run_dir)
    try:
        _wait_serving(run_dir)
        pids = _actor_pids(run_dir)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not any(alive(pid) for pid in pids.values())
    events = lifecycle(run_dir)
    for name in pids:
        assert (name, "stopped", "shutdown") in events
    assert sum(1 for e in events if e[1] == "stopped" and e[2] == "supervisor got SIGINT") == 2


def test_actors_die_with_a_killed_supervisor(run_dir):
    proc, _ = _launch(run_dir)
    try:
        _wait_serving(run_dir)
        pids = _actor_pids(run_dir)
        proc.kill()  # SIGKILL: the supervisor gets no chance to clean up
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not any(alive(pid) for pid in pids.values())  # no orphans: they watch the supervisor's pidfd
    events = lifecycle(run_dir)
    for name in pids:  # ... which they handled as a clean shutdown, committing their log
        assert (name, "stopped", "shutdown") in events
