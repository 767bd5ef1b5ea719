"""Terminal-Bench and Harbor tasks, written here, through loader -> local sandbox -> verifier; and the
`run-task` CLI on them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from t1_actors import run_task
from t1_actors.backends._sandbox import cgroups
from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig
from t1_actors.tasks.formats import load_task
from t1_actors.verify.engine import Verifier, VerifierConfig

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or cgroups.available() is not None,
                                reason="the local sandbox needs root and cgroup v1 memory/pids")

# name -> (Dockerfile, extra context files, solution, tests); the tests check paths far outside /app
TASKS = {
    "etc-config": (
        "FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\nWORKDIR /app\n"
        "RUN mkdir -p /etc/svc && printf 'port=8080\\nmode=dev\\n' > /etc/svc/svc.conf\n",
        {},
        "sed -i 's/mode=dev/mode=prod/' /etc/svc/svc.conf\n",
        "def test_mode():\n    assert 'mode=prod' in open('/etc/svc/svc.conf').read()\n\n"
        "def test_port_kept():\n    assert 'port=8080' in open('/etc/svc/svc.conf').read()\n",
    ),
    "opt-tool": (
        "FROM ghcr.io/laude-institute/t-bench/python-3-13:20250620\nCOPY tool.py /opt/tool/tool.py\n"
        "ENV TOOL_HOME=/opt/tool\n",
        {"tool.py": "import sys\nprint(sum(int(x) for x in sys.argv[1:]))\n"},
        "printf '#!/bin/sh\\nexec python3 $TOOL_HOME/tool.py \"$@\"\\n' > /usr/local/bin/addup\n"
        "chmod +x /usr/local/bin/addup\naddup 1 2 3 > /app/sum.txt\n",
        "import os, subprocess\n\ndef test_wrapper_executable():\n    assert os.access('/usr/local/bin/addup', os.X_OK)\n\n"
        "def test_wrapper_works():\n    out = subprocess.run(['addup', '4', '5'], capture_output=True, text=True)\n"
        "    assert out.stdout.strip() == '9'\n\n"
        "def test_sum_file():\n    assert open('/app/sum.txt').read().strip() == '6'\n",
    ),
    "data-archive": (
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY <<EOT /data/logs/a.log\nalpha\nEOT\nCOPY <<EOT /data/logs/b.log\nbeta\nEOT\n",
        {},
        "mkdir -p /protected && tar -czf /protected/logs.tgz -C /data logs\n",
        "import tarfile\n\ndef test_archive_exists():\n    assert tarfile.is_tarfile('/protected/logs.tgz')\n\n"
        "def test_archive_members():\n    names = tarfile.open('/protected/logs.tgz').getnames()\n"
        "    assert 'logs/a.log' in names and 'logs/b.log' in names\n\n"
        "def test_sources_kept():\n    assert open('/data/logs/a.log').read() == 'alpha\\n'\n",
    ),
}


def write_terminal_bench(root: Path, name: str) -> Path:
    dockerfile, context, solution, tests = TASKS[name]
    task = root / f"tb-{name}"
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text(f"instruction: |-\n  Do the {name} task.\ndifficulty: easy\ncategory: test\n"
                                    "max_agent_timeout_sec: 60\nmax_test_timeout_sec: 30\n")
    (task / "Dockerfile").write_text(dockerfile)
    for rel, content in context.items():
        (task / rel).write_text(content)
    (task / "solution.sh").write_text("#!/bin/bash\nset -e\n" + solution)
    (task / "run-tests.sh").write_text("#!/bin/bash\npip install pytest\npytest $TEST_DIR/test_outputs.py -rA\n")
    (task / "tests" / "test_outputs.py").write_text(tests)
    return task


def write_harbor(root: Path, name: str) -> Path:
    dockerfile, context, solution, tests = TASKS[name]
    task = root / f"harbor-{name}"
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text('version = "1.0"\n\n[metadata]\ndifficulty = "easy"\n\n[verifier]\n'
                                    "timeout_sec = 30.0\n\n[agent]\ntimeout_sec = 60.0\n")
    (task / "instruction.md").write_text(f"Do the {name} task.\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, content in context.items():
        (task / "environment" / rel).write_text(content)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nset -e\n" + solution)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\nuv pip install pytest\npytest /tests -rA\n")
    (task / "tests" / "test_state.py").write_text(tests)
    return task


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    return {"sandbox": str(tmp_path_factory.mktemp("sandbox")), "verifier": str(tmp_path_factory.mktemp("verifier")),
            "tasks": [write_terminal_bench(root, name) for name in TASKS] + [write_harbor(root, name) for name in TASKS]}


@pytest.fixture(scope="module")
def backend(dirs):
    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=dirs["sandbox"]))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def verifier(dirs):
    with Verifier(VerifierConfig(base_dir=dirs["verifier"])) as verifier:
        yield verifier


@pytest.mark.parametrize("index", range(6), ids=[f"tb-{n}" for n in TASKS] + [f"harbor-{n}" for n in TASKS])
def test_task_through_loader_sandbox_verifier(dirs, backend, verifier, index):
    task = load_task(dirs["tasks"][index])
    assert task.source_format == ("terminal-bench" if index < 3 else "harbor")
    with backend.open(task, "noop") as sandbox:
        noop = verifier.verify(task, sandbox.trial_root)
    with backend.open(task, "oracle") as sandbox:
        assert sandbox.build.cached
        sandbox.write_file("/tmp/solve.sh", task.oracle.script.encode(), 0o755)
        ran = sandbox.exec("bash /tmp/solve.sh", timeout_s=30)
        assert ran.exit_code == 0, ran.stderr
        solved = verifier.verify(task, sandbox.trial_root)
    assert noop.infra_error is None and solved.infra_error is None
    assert solved.resolved and solved.passed == solved.total >= 2
    assert noop.passed < solved.total
    assert solved.reward == solved.passed / 20
    assert solved.tamper_flags == []
    for path in ("/etc/svc", "/opt/tool", "/protected", "/usr/local/bin/addup", "/data/logs"):
        assert not Path(path).exists(), f"the task's build or solution leaked {path} onto the host"


def test_run_task_cli_json(dirs, capsys):
    task_dir = str(dirs["tasks"][1])
    common = ["--json", "--sandbox-dir", dirs["sandbox"], "--verifier-dir", dirs["verifier"]]
    assert run_task.main([task_dir, "--oracle", *common]) == 0
    solved = json.loads(capsys.readouterr().out)
    assert solved["resolved"] is True and solved["tests_total"] == solved["passed"] == 3
    assert solved["reward"] == 3 / 20 and solved["oracle_exit_code"] == 0
    assert run_task.main([task_dir, *common]) == 1
    noop = json.loads(capsys.readouterr().out)
    assert noop["resolved"] is False and noop["tests_total"] == 3 and noop["passed"] < 3


def test_run_task_cli_text_and_bad_task(dirs, capsys, tmp_path):
    assert run_task.main([str(dirs["tasks"][3]), "--oracle", "--sandbox-dir", dirs["sandbox"],
                          "--verifier-dir", dirs["verifier"]]) == 0
    out = capsys.readouterr().out
    assert "tests       2" in out and "passed (P)  2" in out and "reward      0.1000" in out and "resolved    yes" in out
    assert run_task.main([str(tmp_path)]) == 2
    assert "not a task directory" in capsys.readouterr().err
