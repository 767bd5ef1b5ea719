"""The verifier: P from pytest's own reports (only PASSED), reward P/20, pristine checksummed tests, and
every tampering case flagged without moving P."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from t1_actors.backends._sandbox import cgroups
from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig
from t1_actors.tasks.model import Environment, FileSpec, Limits, Task
from t1_actors.tasks.model import Tests as TaskTests
from t1_actors.train.ppo import REWARD_SCALE
from t1_actors.verify.engine import Verifier, VerifierConfig, missing_dependencies, tree_sha256

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or cgroups.available() is not None,
                                reason="the verifier needs root and cgroup v1 memory/pids")

TESTS = '''\
import os, subprocess, pytest

def test_answer():
    assert open("/app/answer.txt").read().strip() == "42"

def test_input_kept():
    assert open("/app/in.txt").read() == "hello\\n"

def test_runs_from_workdir():
    assert os.getcwd() == "/app"

def test_answer_via_subprocess():
    out = subprocess.run(["cat", "/app/answer.txt"], capture_output=True, text=True).stdout
    assert out.strip() == "42"

def test_never_passes():
    assert os.path.exists("/app/impossible")

@pytest.mark.skip(reason="skips never count")
def test_skipped():
    pass

@pytest.mark.xfail(reason="xfails never count")
def test_xfailed():
    assert False
'''
HONEST = 4  # what a correct answer earns: every test above except the impossible, skipped and xfailed ones


def make_task(task_id="answer", tests=TESTS, **limits) -> Task:
    return Task(id=task_id, family="test", instruction="write 42 to /app/answer.txt",
                environment=Environment(files={"/app/in.txt": FileSpec(content="hello\n")}),
                tests=TaskTests(files={"test_outputs.py": tests}),
                limits=Limits(verifier_timeout_s=limits.get("verifier_timeout_s", 30), memory_mb=256))


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path_factory.mktemp("sandbox"))))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    with Verifier(VerifierConfig(base_dir=str(tmp_path_factory.mktemp("verifier")))) as verifier:
        yield verifier


def run_trial(backend, verifier, commands: list[str], task: Task | None = None):
    task = task or make_task()
    with backend.open(task, "trial") as sandbox:
        for command in commands:
            result = sandbox.exec(command)
            assert result.exit_code == 0, (command, result.stderr)
        return verifier.verify(task, sandbox.trial_root), sandbox


def test_honest_solution_counts_only_passed_tests(backend, verifier):
    outcome, _ = run_trial(backend, verifier, ["echo 42 > /app/answer.txt"])
    assert outcome.infra_error is None and outcome.tamper_flags == []
    assert outcome.passed == HONEST and outcome.total == 7
    assert outcome.tests["test_outputs.py::test_skipped"] == "skipped"
    assert outcome.tests["test_outputs.py::test_xfailed"] == "xfailed"
    assert outcome.tests["test_outputs.py::test_never_passes"] == "failed"
    assert outcome.reward == HONEST / 20 == HONEST / REWARD_SCALE
    assert not outcome.resolved
    assert outcome.verifier_sha256 == tree_sha256(make_task().tests.files)
    event = outcome.to_event()
    assert event.passed == HONEST and event.reward_scale == 20


def test_no_op_agent_earns_only_what_the_untouched_workspace_passes(backend, verifier):
    outcome, _ = run_trial(backend, verifier, [])
    assert outcome.passed == 2 and outcome.reward == 0.1  # input kept + runs from workdir


CHEATS = {
    "test_path_written": ["mkdir -p /tests && printf 'def test_a(): pass\\ndef test_b(): pass\\n' > /tests/test_outputs.py"],
    "reward_file_written": ["mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt",
                            "echo '{\"passed\": 20}' > /app/results.json"],
    "conftest_planted": ["""cat > /app/conftest.py <<'EOF'
import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
EOF""", "cp /app/conftest.py /conftest.py"],
    "pytest_config_planted": ["printf '[pytest]\\naddopts = -p no:python\\n' > /app/pytest.ini",
                              "printf '[tool.pytest.ini_options]\\naddopts=\"-x\"\\n' > /app/pyproject.toml"],
    "sitecustomize_planted": ["""d=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); mkdir -p $d;
printf 'import builtins\\nbuiltins.open = None\\n' > $d/sitecustomize.py"""],
    "pth_planted": ["""d=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); mkdir -p $d;
echo 'import os; os.environ["HACKED"]="1"' > $d/evil.pth"""],
    "fake_pytest": ["printf '#!/bin/sh\\necho 7 passed\\n' > /usr/local/bin/pytest && chmod +x /usr/local/bin/pytest",
                    "mkdir -p /app/_pytest && echo 'raise SystemExit(0)' > /app/pytest.py"],
}


@pytest.mark.parametrize("kind", sorted(CHEATS))
def test_tampering_is_flagged_and_does_not_change_p(backend, verifier, kind):
    outcome, _ = run_trial(backend, verifier, ["echo 42 > /app/answer.txt", *CHEATS[kind]])
    assert outcome.infra_error is None
    assert outcome.passed == HONEST and outcome.total == 7, outcome.tests
    assert any(flag.startswith(kind + ":") for flag in outcome.tamper_flags), outcome.tamper_flags


def test_a_conftest_in_the_pristine_tests_is_honoured(backend, verifier):
    task = Task(id="with-conftest", family="test", instruction="x",
                tests=TaskTests(files={"conftest.py": "import pytest\n@pytest.fixture\ndef answer():\n    return 42\n",
                                       "test_a.py": "def test_a(answer):\n    assert answer == 42\n"}))
    outcome, _ = run_trial(backend, verifier, [], task)
    assert outcome.passed == 1 and outcome.resolved


def test_tests_run_against_a_throwaway_layer(backend, verifier):
    task = make_task("writer", tests="def test_w():\n    open('/app/written-by-test', 'w').write('x')\n")
    with backend.open(task, "trial") as sandbox:
        outcome = verifier.verify(task, sandbox.trial_root)
        assert outcome.passed == 1
        assert sandbox.exec("test -e /app/written-by-test").exit_code == 1
        assert sandbox.exec("test -e /tests").exit_code == 1  # the agent never sees the tests


def test_tests_have_no_network(backend, verifier):
    task = make_task("net", tests="import socket, pytest\ndef test_offline():\n"
                                  "    with pytest.raises(OSError):\n"
                                  "        socket.create_connection(('1.1.1.1', 53), timeout=2)\n")
    outcome, _ = run_trial(backend, verifier, [], task)
    assert outcome.passed == 1


def test_verifier_store_tampering_is_an_infra_error_not_a_score(backend, verifier):
    task = make_task("store")
    tests_dir, sha = verifier.pristine.materialise(task)
    target = tests_dir / "test_outputs.py"
    os.chmod(tests_dir, 0o755)
    os.chmod(target, 0o644)
    target.write_text("def test_everything(): pass\n")
    outcome, _ = run_trial(backend, verifier, ["echo 42 > /app/answer.txt"], task)
    assert outcome.infra_error and "changed on disk" in outcome.infra_error
    assert outcome.passed == 0 and outcome.tests == {}
    again, _ = run_trial(backend, verifier, ["echo 42 > /app/answer.txt"], task)  # rebuilt from the task
    assert again.infra_error is None and again.passed == HONEST


def test_missing_test_dependency_is_an_infra_error():
    assert missing_dependencies(["pytest==8.3", "requests>=2"]) == []
    assert missing_dependencies(["surely-not-installed-t1-pkg"]) == ["surely-not-installed-t1-pkg"]


def test_timeout_keeps_the_tests_that_finished(backend, verifier):
    task = make_task("slow", tests="import time\ndef test_fast():\n    pass\ndef test_slow():\n    time.sleep(60)\n",
                     verifier_timeout_s=8)
    outcome, _ = run_trial(backend, verifier, [], task)
    assert outcome.timed_out and outcome.infra_error is None
    assert outcome.tests == {"test_outputs.py::test_fast": "passed", "test_outputs.py::test_slow": "timeout"}
    assert outcome.passed == 1


def test_concurrent_verifications(backend, verifier):
    results = {}

    def one(i: int) -> None:
        commands = ["echo 42 > /app/answer.txt"] if i % 2 else []
        outcome, _ = run_trial(backend, verifier, commands)
        results[i] = outcome.passed

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: HONEST if i % 2 else 2 for i in range(6)}


def test_pristine_store_is_read_only_and_outside_the_trial(verifier):
    tests_dir, _ = verifier.pristine.materialise(make_task("ro"))
    mode = (tests_dir / "test_outputs.py").stat().st_mode & 0o777
    assert mode == 0o444
    assert not str(tests_dir).startswith("/tmp/t1-sandbox")
    assert Path(verifier.config.base_dir) in tests_dir.parents


def test_tests_see_read_only_tests_and_no_host_project(backend, verifier):
    task = make_task("view", tests="import os, pytest\n"
                                   "def test_tests_read_only():\n    with pytest.raises(OSError):\n"
                                   "        open('/tests/planted.py', 'w')\n"
                                   "def test_no_host_project():\n    assert not os.path.exists('/work/main/t1_actors')\n"
                                   "def test_task_env():\n    assert os.environ['TEST_DIR'] == '/tests'\n")
    outcome, _ = run_trial(backend, verifier, [], task)
    assert outcome.passed == 3, outcome.tests


def test_symlinks_planted_where_the_verifier_mounts_are_replaced(backend, verifier):
    outcome, _ = run_trial(backend, verifier, ["echo 42 > /app/answer.txt",
                                               "ln -s /etc /tests && mkdir -p /root && ln -s /app /root/.pyenv && "
                                               "ln -s /app /work && rmdir /tmp && ln -s /etc /tmp"])
    assert outcome.infra_error is None, outcome.infra_error
    assert outcome.passed == HONEST and "test_path_written:/tests" in outcome.tamper_flags


def test_missing_test_dependencies_are_installed_into_the_verifiers_own_env(backend, tmp_path):
    package = tmp_path / "t1-depcheck-pkg"
    (package / "t1_depcheck_pkg").mkdir(parents=True)
    (package / "t1_depcheck_pkg" / "__init__.py").write_text("VALUE = 7\n")
    (package / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                            '"setuptools.build_meta"\n\n[project]\nname = "t1-depcheck-pkg"\n'
                                            'version = "1.0"\n')
    task = Task(id="deps", family="test", instruction="x",
                tests=TaskTests(files={"test_dep.py": "import t1_depcheck_pkg\n\ndef test_dep():\n"
                                                      "    assert t1_depcheck_pkg.VALUE == 7\n"},
                                dependencies=["pytest", str(package)]))
    offline = ["--no-index", "--no-build-isolation"]
    with Verifier(VerifierConfig(base_dir=str(tmp_path / "v1"), pip_args=offline)) as verifier, \
            backend.open(task, "deps") as sandbox:
        outcome = verifier.verify(task, sandbox.trial_root)
        assert outcome.infra_error is None and outcome.passed == 1, (outcome.infra_error, outcome.log_tail)
        assert sandbox.exec("python3 -c 'import t1_depcheck_pkg'").exit_code != 0  # never in the agent's env
    with Verifier(VerifierConfig(base_dir=str(tmp_path / "v2"), install_test_dependencies=False)) as verifier, \
            backend.open(task, "deps") as sandbox:
        refused = verifier.verify(task, sandbox.trial_root)
        assert refused.infra_error and "not installed" in refused.infra_error and refused.passed == 0
