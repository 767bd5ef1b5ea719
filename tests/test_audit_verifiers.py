"""t1-audit verifiers: recorded checksums against task sources, consistency, tamper flags, log integrity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas import VerifierResult
from storage import EventLog
from t1_actors.tasks import write_task
from t1_actors.tasks.model import Oracle, Task
from t1_actors.tasks.model import Tests as TaskTests
from t1_actors.verify.engine import tree_sha256 as sha_of_tests
from tools.audit import main

TEST_V1 = "def test_out():\n    assert open('/app/out.txt').read() == 'hi\\n'\n"
TEST_V2 = TEST_V1 + "\ndef test_more():\n    assert True\n"


def task(task_id: str, test: str) -> Task:
    return Task(id=task_id, family="audit-test", instruction="Write hi to /app/out.txt.",
                oracle=Oracle(script="echo hi > /app/out.txt", commands=["echo hi > /app/out.txt"]),
                tests=TaskTests(files={"test_outputs.py": test}))


def result(trial: str, task_id: str, sha: str, *, passed: int = 1, tests: dict | None = None,
           flags: list[str] | None = None, reward: float | None = None) -> VerifierResult:
    tests = tests if tests is not None else {"test_outputs.py::test_out": "passed"}
    return VerifierResult(trial_id=trial, task_id=task_id, tests=tests, passed=passed, total=len(tests),
                          reward=passed / 20 if reward is None else reward, reward_scale=20, verifier_sha256=sha,
                          tamper_flags=flags or [])


def make_run(root: Path, events: list[VerifierResult]) -> Path:
    log = EventLog.open(root / "log", create=True)
    with log.writer("verifier-0") as w:
        for e in events:
            w.append(e)
        w.commit()
    return root


@pytest.fixture
def sources(tmp_path):
    tasks = tmp_path / "tasks"
    write_task(task("alpha", TEST_V1), tasks / "alpha")
    write_task(task("beta", TEST_V2), tasks / "beta")  # beta's tests changed since the run below
    return tasks


def test_clean_run_passes(tmp_path, sources, capsys):
    run = make_run(tmp_path / "run", [result("t0", "alpha", sha_of_tests({"test_outputs.py": TEST_V1}))])
    assert main(["verifiers", str(run), "--tasks", str(sources), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["checksums_checked"] == 1 and out["checksum_mismatches"] == []
    assert out["log_integrity"]["segments"] == 1


def test_mismatch_inconsistency_tamper_and_unknown(tmp_path, sources, capsys):
    sha_v1 = sha_of_tests({"test_outputs.py": TEST_V1})
    run = make_run(tmp_path / "run", [
        result("t0", "alpha", sha_v1),
        result("t1", "beta", sha_v1),  # scored with the old tests: mismatch
        result("t2", "alpha", sha_v1, passed=1, tests={"a": "passed", "b": "failed"}, reward=0.5),  # reward != P/S
        result("t3", "alpha", sha_v1, flags=["planted conftest.py", "wrote /tests"]),
        result("t4", "gamma", sha_v1),  # no source
    ])
    assert main(["verifiers", str(run), "--tasks", str(sources), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [m["trial_id"] for m in out["checksum_mismatches"]] == ["t1"]
    assert [i["trial_id"] for i in out["inconsistent"]] == ["t2"]
    assert "reward 0.5 != P/S" in out["inconsistent"][0]["problems"][0]
    assert out["tamper_flags"] == [{"event": "verifier-0:3", "trial_id": "t3", "task_id": "alpha",
                                    "flags": ["planted conftest.py", "wrote /tests"]}]
    assert out["tasks_without_source"] == {"gamma": 1}
    assert main(["verifiers", str(run), "--tasks", str(sources)]) == 1
    text = capsys.readouterr().out
    assert "checksum mismatches" in text and "planted conftest.py" in text and "FAILED" in text


def test_real_verifier_checksum_matches_the_source(tmp_path, sources, capsys):
    from t1_actors.tasks import load_task
    from tools._audit.task_runner import LocalTrialRunner

    alpha = load_task(sources / "alpha")
    try:
        runner = LocalTrialRunner()
    except Exception as exc:
        pytest.skip(f"the local sandbox cannot run here: {exc}")
    with runner:
        sandbox = runner.backend.open(alpha, "verified-0")
        try:
            sandbox.exec("echo hi > /app/out.txt", 10)
            event = runner.verifier.verify(alpha, sandbox.trial_root).to_event()
        finally:
            sandbox.close()
    assert event.passed == 1
    run = make_run(tmp_path / "run", [event])
    assert main(["verifiers", str(run), "--tasks", str(sources), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checksums_checked"] == 1


def test_corrupted_log_is_named(tmp_path, sources, capsys):
    run = make_run(tmp_path / "run", [result("t0", "alpha", "0" * 64)])
    chunks = [p for p in (run / "log").rglob("*") if p.is_file() and "/c/" in str(p)]
    assert chunks, "expected zarr chunk files in the log"
    target = max(chunks, key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    assert main(["verifiers", str(run), "--tasks", str(sources)]) == 2
    assert "segment 'verifier-0'" in capsys.readouterr().err


def test_synthetic_corpus_from_the_run_config(tmp_path, capsys):
    from t1_actors.tasks import generate

    task = generate("train", 1, seed=7)[0]
    sha = sha_of_tests(task.tests.files)
    run = make_run(tmp_path / "run", [result("t0", task.id, sha)])
    (run / "config.toml").write_text("[tasks]\nseed = 7\ntrain_size = 3\neval_size = 1\n")
    assert main(["verifiers", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["checksums_checked"] == 1 and out["task_sources"] == [f"{run / 'config.toml'} [tasks]"]


def test_nothing_checkable_is_not_ok(tmp_path, sources, capsys):
    run = make_run(tmp_path / "run", [result("t0", "unknown-task", "0" * 64)])
    assert main(["verifiers", str(run), "--tasks", str(sources), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["checksums_checked"] == 0 and "no result could be checked" in out["problem"]
