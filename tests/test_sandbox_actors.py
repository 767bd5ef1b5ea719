"""The sandbox and verifier actors over the real runtime (pynng, HMAC) and event log."""

from __future__ import annotations

import json
import os

import pytest
import trio

pytest.importorskip("t1_actors.runtime.host")

from _trio import trio_test

from schemas import Cancel, ExecRequest, Generic, SandboxClose, SandboxExec, SandboxOpen, VerifierResult, VerifyRequest
from t1_actors.backends._sandbox import cgroups
from t1_actors.runtime.errors import RemoteError, RequestCancelled
from t1_actors.runtime.host import serve_actor
from t1_actors.runtime.peers import connect
from t1_actors.sandbox import SandboxActor
from t1_actors.tasks import TasksConfig, build_task_sets
from t1_actors.verifier import VerifierActor

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or cgroups.available() is not None,
                                reason="the local sandbox needs root and cgroup v1 memory/pids")
TASKS = {"seed": 0, "train_size": 2, "eval_size": 2}



def _config(actor_config, tmp_path):
    return actor_config({"name": "sandbox-0", "role": "sandbox", "actor_class": "t1_actors.sandbox:SandboxActor"},
                        {"name": "verifier-0", "role": "verifier", "actor_class": "t1_actors.verifier:VerifierActor"},
                        run_id="sandbox-test", tasks=TASKS, sandbox={"local": {"base_dir": str(tmp_path / "sandbox")}},
                        verifier={"base_dir": str(tmp_path / "verifier")})


@trio_test
async def test_trial_through_sandbox_and_verifier_actors(tmp_path, actor_config):
    config = _config(actor_config, tmp_path)
    task = build_task_sets(TasksConfig(**TASKS)).eval[0]
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_actor, SandboxActor, config, "sandbox-0")
            await nursery.start(serve_actor, VerifierActor, config, "verifier-0")
            async with connect(config, "test") as peers:
                sandbox, verifier = peers("sandbox"), peers("verifier")
                await sandbox.call(SandboxOpen(trial_id="a", task_id=task.id), deadline_s=60)
                for turn, command in enumerate(task.oracle_commands or [task.oracle.script]):
                    event = await sandbox.call(ExecRequest(trial_id="a", turn=turn, command=command, timeout_s=10),
                                               deadline_s=30)
                    assert isinstance(event, SandboxExec) and event.exit_code == 0, event
                bomb = await sandbox.call(ExecRequest(trial_id="a", turn=50, command="b() { b | b & }; b; sleep 1",
                                                      timeout_s=3), deadline_s=30)
                assert bomb.infra_error is None  # contained, and the actor keeps serving:
                result = await verifier.call(VerifyRequest(trial_id="a", task_id=task.id), deadline_s=60)
                assert isinstance(result, VerifierResult) and result.infra_error is None
                assert result.passed == result.total > 0 and result.reward == result.passed / 20
                # a continuation verified in its original's sandbox: the result names the continuation
                continued = await verifier.call(VerifyRequest(trial_id="a~c1", task_id=task.id, sandbox_id="a"),
                                                deadline_s=60)
                assert continued.trial_id == "a~c1" and continued.infra_error is None
                assert (continued.passed, continued.total) == (result.passed, result.total)

                missing = await sandbox.call(ExecRequest(trial_id="nope", turn=0, command="true", timeout_s=1),
                                             deadline_s=10)
                assert missing.infra_error and "SandboxOpen" in missing.infra_error
                unknown = await verifier.call(VerifyRequest(trial_id="nope", task_id=task.id), deadline_s=30)
                assert unknown.infra_error and unknown.reward == 0.0
                with pytest.raises(RemoteError, match="KeyError|unknown task"):
                    await sandbox.call(SandboxOpen(trial_id="b", task_id="no-such-task"), deadline_s=30)

                await sandbox.call(SandboxOpen(trial_id="c", task_id=task.id), deadline_s=60)
                outcome = {}

                async def long_command() -> None:
                    try:
                        outcome["reply"] = await sandbox.call(
                            ExecRequest(trial_id="c", turn=0, command="sleep 30", timeout_s=60), deadline_s=60)
                    except RemoteError as exc:
                        outcome["error"] = exc

                started = trio.current_time()
                async with trio.open_nursery() as inner:
                    inner.start_soon(long_command)
                    await trio.sleep(0.5)
                    await sandbox.call(Cancel(trial_id="c", reason="tail cut"), deadline_s=10)
                assert trio.current_time() - started < 20 and outcome
                with pytest.raises(RequestCancelled):  # the runtime refuses a cancelled trial from now on
                    await sandbox.call(ExecRequest(trial_id="c", turn=1, command="true", timeout_s=1), deadline_s=10)
                assert not list((tmp_path / "sandbox" / "trials").glob("c-*/trial.json"))  # and its root is gone
                # what a restarted staleness controller asks before resuming a trial in its sandbox
                held = await sandbox.call(Generic(op="open_sandboxes", args={"trial_ids": ["a", "c", "zz"]}))
                assert json.loads(held.detail) == ["a"]
                await sandbox.call(SandboxClose(trial_id="a"), deadline_s=30)
                held = await sandbox.call(Generic(op="open_sandboxes", args={"trial_ids": ["a"]}))
                assert json.loads(held.detail) == []
            nursery.cancel_scope.cancel()

    import storage
    log = storage.EventLog.open(config.run.dir / "log")
    execs = [e for _, e in log.events(kinds=["sandbox_exec"])]
    results = [e for _, e in log.events(kinds=["verifier_result"])]
    assert {e.trial_id for e in execs} >= {"a", "nope"}
    assert [r.trial_id for r in results] == ["a", "a~c1", "nope"] and results[0].passed == results[0].total
