"""Every synthetic family's oracle passes every one of its tests; a no-op passes at most half of them.

The tasks run in one bubblewrap sandbox (no network, the host read-only, a throwaway /app) driven by
one Python process, which for each case lays the task's files down in a fresh /app, runs the
commands through bash, and runs the task's tests with pytest, counting only PASSED outcomes.
(The project's own local sandbox + verifier run these same tasks in tests/test_verifier_*.py.)
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from t1_actors.tasks import FAMILIES, Task, generate

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (bwrap) on PATH")

_DRIVER = r'''
import base64, json, os, shutil, subprocess, sys
import pytest

class Outcomes:
    def __init__(self):
        self.collected, self.passed = 0, 0
    def pytest_collection_finish(self, session):
        self.collected = len(session.items)
    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.passed:
            self.passed += 1

def reset(directory):
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)

os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only pytest itself: faster, and no stray plugin
results = []
for case in json.load(open("/cases/cases.json")):
    reset("/app")
    for path, (content, mode) in case["files"].items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(content))
        os.chmod(path, mode)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", **case["env"]}
    exits = [subprocess.run(["bash", "-c", c], cwd="/app", env=env, capture_output=True, timeout=30).returncode
             for c in case["commands"]]
    outcomes, modules = Outcomes(), set(sys.modules)
    with open(os.devnull, "w") as quiet:
        sys.stdout, saved = quiet, sys.stdout
        try:
            pytest.main(["-q", "-p", "no:cacheprovider", "--import-mode=importlib", case["tests"]],
                        plugins=[outcomes])
        finally:
            sys.stdout = saved
            for name in set(sys.modules) - modules:  # each task's test_outputs is a new module
                if (getattr(sys.modules[name], "__file__", None) or "").startswith("/cases/"):
                    del sys.modules[name]
    results.append({"passed": outcomes.passed, "total": outcomes.collected, "exits": exits})
json.dump(results, open("/cases/results.json", "w"))
'''


def _bwrap(root: Path) -> list[str]:
    """Host system read-only, fresh /app, /tmp, no network; the venv's interpreter visible."""
    args = ["bwrap", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{link}"):
            args += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
    for prefix in sorted({sys.base_prefix, sys.prefix}):
        if not prefix.startswith("/usr/"):
            args += ["--ro-bind", prefix, prefix]
    return args + ["--bind", str(root / "app"), "/app", "--bind", str(root / "cases"), "/cases",
                   "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "--die-with-parent",
                   "--chdir", "/app", "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
                   sys.executable, "-I", "/cases/driver.py"]


def run_cases(root: Path, cases: list[tuple[Task, list[str]]]) -> list[dict]:
    """Run each (task, commands) case in the sandbox; per case: passed, total, exit codes."""
    (root / "app").mkdir()
    cases_dir = root / "cases"
    cases_dir.mkdir()
    manifest = []
    for index, (task, commands) in enumerate(cases):
        tests_dir = cases_dir / f"tests{index}"
        for name, body in task.tests.files.items():
            (tests_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (tests_dir / name).write_bytes(body.encode() if isinstance(body, str) else body)
        manifest.append({
            "files": {p: [base64.b64encode(s.data).decode(), s.mode] for p, s in task.environment.files.items()},
            "env": task.environment.env, "commands": commands, "tests": f"/cases/tests{index}",
        })
    (cases_dir / "cases.json").write_text(json.dumps(manifest))
    (cases_dir / "driver.py").write_text(_DRIVER)
    done = subprocess.run(_bwrap(root), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((cases_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """A train and an eval task per family, each run with its oracle and with no command."""
    tasks = generate("train", len(FAMILIES), seed=7) + generate("eval", len(FAMILIES), seed=7)
    cases = [(task, variant) for task in tasks for variant in (task.oracle.commands, [])]
    results = run_cases(tmp_path_factory.mktemp("sandbox"), cases)
    return [(task, commands, result) for (task, commands), result in zip(cases, results)]


def test_every_family_is_exercised(outcomes):
    assert {task.family for task, _, _ in outcomes} == set(FAMILIES)


def test_oracle_commands_succeed(outcomes):
    failed = [(task.id, commands, result["exits"]) for task, commands, result in outcomes
              if commands and any(result["exits"])]
    assert not failed


def test_oracle_passes_every_test(outcomes):
    for task, commands, result in outcomes:
        if commands:
            assert result["total"] == task.metadata["checks"], task.id
            assert result["passed"] == result["total"], (task.id, result)


def test_noop_passes_at_most_half(outcomes):
    for task, commands, result in outcomes:
        if not commands:
            assert result["total"] == task.metadata["checks"], task.id
            assert result["passed"] <= result["total"] / 2, (task.id, result)


def test_a_wrong_answer_earns_partial_credit(tmp_path):
    """Partial progress pays: the first oracle command alone passes some tests, but not all."""
    tasks = [t for t in generate("train", len(FAMILIES), seed=3) if len(t.oracle.commands) >= 2]
    results = run_cases(tmp_path, [(task, task.oracle.commands[:1]) for task in tasks])
    partial = [0 < r["passed"] < r["total"] for r in results]
    assert sum(partial) >= len(tasks) * 3 // 4, [(t.family, r) for t, r in zip(tasks, results)]
