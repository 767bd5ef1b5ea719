"""Loaders: Terminal-Bench and Harbor task directories the tests write, the own format's round trip,
and malformed tasks, each rejected with an error naming the file and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from t1_actors.tasks import (
    EXAMPLES_DIR,
    FAMILIES,
    TaskFormatError,
    detect_format,
    generate,
    load_task,
    load_tasks,
    oracle_trajectory,
    write_task,
)
from t1_actors.tasks.formats._common import runner_dependencies, runner_targets

TB_COMPOSE = """\
services:
  client:
    build:
      dockerfile: Dockerfile
    image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}
    environment:
      - TEST_DIR=${T_BENCH_TEST_DIR}
      - MODE=strict
"""


def write(root: Path, files: dict[str, str]) -> Path:
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(body))
    return root


def tb_task(root: Path, name: str, **overrides: str | None) -> Path:
    files = {
        "task.yaml": f"instruction: |-\n  Write {name} to /app/{name}.txt.\ndifficulty: easy\ncategory: files\n"
                     "tags: [shell]\nmax_agent_timeout_sec: 90\nmax_test_timeout_sec: 15\n",
        "Dockerfile": "FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\nWORKDIR /app\n",
        "solution.sh": f"#!/bin/bash\necho {name} > /app/{name}.txt\n",
        "run-tests.sh": "#!/bin/bash\npip install pytest==8.4.1 requests==2.32.3\n"
                        "pytest $TEST_DIR/test_outputs.py -rA\n",
        "tests/test_outputs.py": f"def test_file():\n    assert open('/app/{name}.txt').read() == '{name}\\n'\n",
    }
    files.update(overrides)
    return write(root / name, {k: v for k, v in files.items() if v is not None})


def harbor_task(root: Path, name: str, **overrides: str | None) -> Path:
    files = {
        "task.toml": 'version = "1.0"\n[metadata]\ndifficulty = "easy"\ncategory = "text"\ntags = ["wc"]\n'
                     "[verifier]\ntimeout_sec = 30.0\n[verifier.env]\nLANG = \"C.UTF-8\"\n"
                     "[agent]\ntimeout_sec = 100.0\n[environment]\nbuild_timeout_sec = 200.0\ncpus = 2\n"
                     'memory = "2G"\n',
        "instruction.md": f"Count the lines of /app/{name}.txt into /app/count.txt.\n",
        "environment/Dockerfile": f"FROM ubuntu:24.04\nWORKDIR /work\nCOPY {name}.txt /app/{name}.txt\n",
        f"environment/{name}.txt": "a\nb\n",
        "solution/solve.sh": f"#!/bin/bash\nwc -l < /app/{name}.txt > /app/count.txt\n",
        "tests/test.sh": "#!/bin/bash\nuvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 -w numpy pytest "
                         "--ctrf /logs/verifier/ctrf.json /tests/test_count.py -rA\n",
        "tests/test_count.py": "def test_count():\n    assert open('/app/count.txt').read().strip() == '2'\n",
    }
    files.update(overrides)
    return write(root / name, {k: v for k, v in files.items() if v is not None})


# --- Terminal-Bench ---------------------------------------------------------------------------

def write_terminal_bench_trio(root: Path) -> None:
    """Three runnable Terminal-Bench tasks: solution.sh, solution.yaml + compose env, legacy descriptions."""
    tb_task(root, "plain")
    tb_task(root, "with-yaml-solution", **{
        "solution.sh": None,
        "solution.yaml": "- command: mkdir -p /app/out\n  min_timeout_sec: 0.1\n"
                         "- command: echo $MODE > /app/out/mode.txt\n  block: true\n"
                         "- command: echo with-yaml-solution > /app/with-yaml-solution.txt\n",
        "docker-compose.yaml": TB_COMPOSE,
        "run-tests.sh": "#!/bin/bash\npytest $TEST_DIR/test_outputs.py $TEST_DIR/test_mode.py -rA\n",
        "tests/test_mode.py": "def test_mode():\n    assert open('/app/out/mode.txt').read() == 'strict\\n'\n",
    })
    tb_task(root, "legacy-descriptions", **{
        "task.yaml": "descriptions:\n  - key: base\n    description: Write legacy-descriptions to "
                     "/app/legacy-descriptions.txt.\n  - key: hard\n    description: other\n",
        "run-tests.sh": None,
        "tests/helpers/data.txt": "x\n",
    })


def test_terminal_bench_tasks_load(tmp_path):
    write_terminal_bench_trio(tmp_path)
    tasks = load_tasks(tmp_path)
    assert [t.id for t in tasks] == ["legacy-descriptions", "plain", "with-yaml-solution"]  # sorted by id
    by_id = {t.id: t for t in tasks}

    task = by_id["plain"]
    assert task.source_format == "terminal-bench" and task.split == "eval" and task.family == "files"
    assert task.instruction == "Write plain to /app/plain.txt."
    assert task.environment.workdir == "/app"
    assert task.environment.base_image == "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624"
    assert task.environment.context_dir == str((tmp_path / "plain").resolve())
    assert task.environment.dockerfile.startswith("FROM ")
    assert task.tests.targets == ["test_outputs.py"] and task.tests.dependencies == ["requests==2.32.3"]
    assert task.limits.agent_timeout_s == 90 and task.limits.verifier_timeout_s == 15
    assert task.metadata["tags"] == ["shell"] and task.metadata["difficulty"] == "easy"
    assert oracle_trajectory(task) == [task.oracle.script.strip()]

    task = by_id["with-yaml-solution"]
    assert task.oracle.commands == ["mkdir -p /app/out", "echo $MODE > /app/out/mode.txt",
                                    "echo with-yaml-solution > /app/with-yaml-solution.txt"]
    assert task.environment.env == {"MODE": "strict"}  # TEST_DIR belongs to the harness

    task = by_id["legacy-descriptions"]
    assert task.instruction == "Write legacy-descriptions to /app/legacy-descriptions.txt."
    assert set(task.tests.files) == {"test_outputs.py", "helpers/data.txt"} and task.tests.script is None


def test_terminal_bench_split_is_chosen_by_the_caller(tmp_path):
    assert load_task(tb_task(tmp_path, "x"), split="train").split == "train"


@pytest.mark.parametrize("overrides, file, field, message", [
    ({"task.yaml": "difficulty: easy\n"}, "task.yaml", "instruction", "missing"),
    ({"task.yaml": "instruction: [unclosed\n"}, "task.yaml", None, "not valid YAML"),
    ({"task.yaml": "- a list\n"}, "task.yaml", "(top level)", "expected a YAML mapping"),
    ({"task.yaml": "instruction: 42\n"}, "task.yaml", "instruction", "expected the task's instruction"),
    ({"task.yaml": "instruction: hi\nmax_agent_timeout_sec: long\n"}, "task.yaml", "max_agent_timeout_sec",
     "expected a number of seconds"),
    ({"task.yaml": "instruction: '  '\n"}, "task.yaml", "instruction", "instruction is empty"),
    ({"Dockerfile": None}, "Dockerfile", None, "missing"),
    ({"solution.sh": None}, "solution.sh", None, "solution.sh or solution.yaml"),
    ({"solution.sh": None, "solution.yaml": "- command: ls\n- timeout: 3\n"}, "solution.yaml", "[1].command",
     "missing or empty"),
    ({"tests/test_outputs.py": None}, "tests", None, "missing"),
    ({"docker-compose.yaml": "services:\n  server:\n    image: redis\n"}, "docker-compose.yaml",
     "services.client", "service 'client'"),
])
def test_malformed_terminal_bench_named(tmp_path, overrides, file, field, message):
    path = tb_task(tmp_path, "bad", **overrides)
    with pytest.raises(TaskFormatError, match=message) as error:
        load_task(path)
    assert error.value.file == str(path / file) and error.value.field == field


def test_extra_compose_services_are_noted(tmp_path):
    compose = TB_COMPOSE + "  redis:\n    image: redis:7\n"
    task = load_task(tb_task(tmp_path, "services", **{"docker-compose.yaml": compose}))
    assert task.metadata["services"] == ["redis"]
    harbor = load_task(harbor_task(tmp_path, "sidecar", **{
        "environment/docker-compose.yaml": "services:\n  main:\n    build: .\n  db:\n    image: postgres:16\n"}))
    assert harbor.metadata["services"] == ["db"]


def test_compose_build_context_and_dockerfile(tmp_path):
    compose = TB_COMPOSE.replace("      dockerfile: Dockerfile\n", "      context: ./env\n      dockerfile: Custom\n")
    path = tb_task(tmp_path, "ctx", **{"docker-compose.yaml": compose, "Dockerfile": None,
                                       "env/Custom": "FROM python:3.12\nWORKDIR /srv/app/\n"})
    task = load_task(path)
    assert task.environment.context_dir == str((path / "env").resolve())
    assert task.environment.base_image == "python:3.12" and task.environment.workdir == "/srv/app"
    (path / "env" / "Custom").unlink()
    with pytest.raises(TaskFormatError, match="missing") as error:
        load_task(path)
    assert error.value.file == str((path / "env" / "Custom").resolve())


# --- Harbor -----------------------------------------------------------------------------------

def test_harbor_tasks_load(tmp_path):
    harbor_task(tmp_path, "lines")
    harbor_task(tmp_path, "no-solution", **{"solution/solve.sh": None})
    harbor_task(tmp_path, "prebuilt-image", **{
        "environment/Dockerfile": None,
        "task.toml": '[environment]\ndocker_image = "python:3.12-slim"\nmemory_mb = 512\n',
        "tests/test.sh": "#!/bin/bash\npytest /tests -rA\n",
        "tests/conftest_data.json": "{}",
    })
    tasks = {t.id: t for t in load_tasks(tmp_path)}
    assert sorted(tasks) == ["lines", "no-solution", "prebuilt-image"]

    task = tasks["lines"]
    assert detect_format(tmp_path / "lines") == "harbor" and task.source_format == "harbor"
    assert task.instruction.startswith("Count the lines of /app/lines.txt") and task.family == "text"
    assert task.environment.workdir == "/work" and task.environment.base_image == "ubuntu:24.04"
    assert task.environment.context_dir == str((tmp_path / "lines" / "environment").resolve())
    assert set(task.tests.files) == {"test_count.py"} and task.tests.targets == ["test_count.py"]
    assert task.tests.dependencies == ["numpy"] and task.tests.env == {"LANG": "C.UTF-8"}
    assert "uvx" in task.tests.script
    limits = task.limits
    assert (limits.agent_timeout_s, limits.verifier_timeout_s, limits.build_timeout_s) == (100, 30, 200)
    assert (limits.cpus, limits.memory_mb) == (2, 2048)
    assert task.metadata == {"difficulty": "easy", "category": "text", "tags": ["wc"], "format_version": "1.0"}
    assert task.oracle.script.startswith("#!/bin/bash")

    assert tasks["no-solution"].oracle is None and tasks["no-solution"].oracle_commands == []
    with pytest.raises(ValueError, match="no oracle solution"):
        oracle_trajectory(tasks["no-solution"])

    task = tasks["prebuilt-image"]
    assert task.environment.dockerfile is None and task.environment.base_image == "python:3.12-slim"
    assert task.limits.memory_mb == 512 and task.tests.targets == [] and task.family == "harbor"


def write_harbor_trio(root: Path) -> None:
    """Three runnable Harbor tasks: COPY from the context, a COPY heredoc + ENV, a RUN outside /app."""
    harbor_task(root, "lines")
    harbor_task(root, "heredoc", **{
        "environment/Dockerfile": "# syntax=docker/dockerfile:1\nFROM ubuntu:24.04\nENV LINES_FILE=/app/heredoc.txt\n"
                                  "WORKDIR /app\nCOPY <<EOT /app/heredoc.txt\nfirst\nsecond\nEOT\n",
        "environment/heredoc.txt": None,
    })
    harbor_task(root, "built-by-run", **{
        "environment/Dockerfile": "FROM ubuntu:24.04\nWORKDIR /app\nRUN mkdir -p /opt/data && "
                                  "printf 'a\\nb\\n' > /opt/data/src.txt && "
                                  "cp /opt/data/src.txt /app/built-by-run.txt\n",
        "environment/built-by-run.txt": None,
        "tests/test_source.py": "def test_source_kept():\n    assert open('/opt/data/src.txt').read() == 'a\\nb\\n'\n",
    })


def test_written_tasks_run_through_the_sandbox_and_verifier(tmp_path):
    """Loader -> local sandbox (Dockerfile replayed) -> verifier: each oracle resolves its task, a no-op doesn't."""
    from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig
    from t1_actors.verify.engine import Verifier, VerifierConfig

    write_terminal_bench_trio(tmp_path / "tb")
    write_harbor_trio(tmp_path / "harbor")
    tasks = load_tasks(tmp_path / "tb") + load_tasks(tmp_path / "harbor")
    assert [t.source_format for t in tasks] == ["terminal-bench"] * 3 + ["harbor"] * 3
    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path / "sandbox")))
    with Verifier(VerifierConfig(base_dir=str(tmp_path / "verifier"))) as verifier:
        for task in tasks:
            for oracle in (True, False):
                with backend.open(task, f"{task.id}-{oracle}") as sandbox:
                    if oracle and task.oracle.commands:
                        exits = [sandbox.exec(command).exit_code for command in task.oracle.commands]
                        assert exits == [0] * len(exits)
                    elif oracle:
                        sandbox.write_file("/tmp/solve.sh", task.oracle.script.encode(), 0o755)
                        assert sandbox.exec("bash /tmp/solve.sh").exit_code == 0
                    outcome = verifier.verify(task, sandbox.trial_root)
                run = task.tests.targets or [n for n in task.tests.files if n.endswith(".py")]
                assert outcome.infra_error is None
                assert outcome.total == sum(task.tests.files[name].count("def test_") for name in run)
                assert outcome.resolved is oracle, (task.id, oracle, outcome.tests, outcome.log_tail)
    backend.close()


@pytest.mark.parametrize("overrides, file, field, message", [
    ({"task.toml": "version = \n"}, "task.toml", None, "not valid TOML"),
    ({"task.toml": "agent = 3\n"}, "task.toml", "agent", r"expected a \[agent\] table"),
    ({"task.toml": "[agent]\ntimeout_sec = \"soon\"\n"}, "task.toml", "agent.timeout_sec", "expected seconds"),
    ({"task.toml": "[environment]\nmemory = \"lots\"\n"}, "task.toml", "environment.memory", "not a size"),
    ({"task.toml": "[verifier]\nenv = 3\n"}, "task.toml", "verifier.env", "a table of strings"),
    ({"instruction.md": None}, "instruction.md", None, "instruction.md"),
    ({"environment/Dockerfile": None}, "environment/Dockerfile", None, "docker_image"),
    ({"tests/test.sh": None}, "tests/test.sh", None, "missing"),
    ({"tests/test_count.py": None}, "tests", None, "no test files besides test.sh"),
])
def test_malformed_harbor_named(tmp_path, overrides, file, field, message):
    path = harbor_task(tmp_path, "bad", **overrides)
    with pytest.raises(TaskFormatError, match=message) as error:
        load_task(path)
    assert error.value.file == str(path / file) and error.value.field == field
    assert str(error.value).startswith(str(path / file))


# --- the own format ---------------------------------------------------------------------------

def test_own_format_round_trips_every_family(tmp_path):
    for task in generate("train", len(FAMILIES), seed=4) + generate("eval", len(FAMILIES), seed=4):
        written = write_task(task, tmp_path / task.id)
        assert detect_format(written) == "t1"
        assert load_task(written) == task, task.family


def test_own_format_round_trips_external_tasks(tmp_path):
    for task in load_tasks(EXAMPLES_DIR):
        back = load_task(write_task(task, tmp_path / task.id))
        assert back.environment.context_dir == str((tmp_path / task.id / "context").resolve())
        assert back.model_dump(exclude={"environment": {"context_dir"}}) == \
            task.model_dump(exclude={"environment": {"context_dir"}})
        context = Path(back.environment.context_dir)
        original = Path(task.environment.context_dir)
        assert sorted(p.name for p in context.iterdir()) == sorted(p.name for p in original.iterdir())


def test_own_format_keeps_modes_and_files_outside_app(tmp_path):
    task = generate("train", 1, seed=0)[0].model_copy(deep=True)
    data = task.model_dump()
    data["environment"]["files"]["/opt/tool/run.sh"] = {"content": "#!/bin/sh\necho hi\n", "mode": 0o755}
    data["environment"]["setup"] = ["mkdir -p /data"]
    task = type(task)(**data)
    path = write_task(task, tmp_path / "t")
    assert (path / "files/opt/tool/run.sh").is_file()
    assert 'file_modes' in (path / "t1-task.toml").read_text()
    assert load_task(path) == task


def test_write_task_refuses_a_used_directory(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        write_task(generate("train", 1)[0], tmp_path / "used")


@pytest.mark.parametrize("edit, field, message", [
    (lambda s: s.replace('id = "', 'id = "bad id '), "id", "must match"),
    (lambda s: s.replace('workdir = "/app"', 'workdir = "app"'), "environment.workdir", "absolute path"),
    (lambda s: s + '\n[environment.file_modes]\n"/app/nope.txt" = "755"\n', "environment.file_modes",
     "not under files/"),
    (lambda s: s.replace('split = "train"', 'split = "dev"'), "split", "'train' or 'eval'"),
    (lambda s: "surprise = 1\n" + s, "surprise", "Extra inputs are not permitted"),
])
def test_malformed_own_format_named(tmp_path, edit, field, message):
    path = write_task(generate("train", 1)[0], tmp_path / "t")
    spec = path / "t1-task.toml"
    spec.write_text(edit(spec.read_text()))
    with pytest.raises(TaskFormatError, match=message) as error:
        load_task(path)
    assert error.value.file == str(spec) and error.value.field == field


def test_empty_tests_directory_named(tmp_path):
    path = tb_task(tmp_path, "empty-tests", **{"tests/test_outputs.py": None})
    (path / "tests").mkdir()
    with pytest.raises(TaskFormatError, match="holds no files") as error:
        load_task(path)
    assert error.value.file == str(path / "tests")


def test_not_a_task_directory(tmp_path):
    with pytest.raises(TaskFormatError, match="is not a task directory"):
        load_task(tmp_path)
    with pytest.raises(TaskFormatError, match="is not a directory"):
        load_task(tmp_path / "absent")


def test_duplicate_ids_in_a_tree(tmp_path):
    tb_task(tmp_path / "a", "same")
    harbor_task(tmp_path / "b", "same")
    with pytest.raises(TaskFormatError, match="duplicate task id 'same'"):
        load_tasks(tmp_path)


# --- the examples and the runner-script readers -----------------------------------------------

def test_examples_hold_three_tasks_of_each_format():
    tasks = load_tasks(EXAMPLES_DIR)
    formats = [t.source_format for t in tasks]
    assert formats.count("terminal-bench") >= 3 and formats.count("harbor") >= 3
    for task in tasks:
        assert task.oracle is not None and task.environment.dockerfile and len(task.tests.files) >= 1


def test_runner_dependencies():
    script = """\
        pip install pytest==8.4.1 requests   # comment numpy
        uv pip install 'pandas>=2' -q && uv add scipy==1.14
        uvx -p 3.13 -w pytest==8.4.1 --with pyyaml pytest /tests
        pip3 install -r requirements.txt --index-url https://x.invalid/simple ./local_pkg hypothesis[cli]
    """
    assert runner_dependencies(textwrap.dedent(script)) == \
        ["requests", "pandas>=2", "scipy==1.14", "pyyaml", "hypothesis[cli]"]


def test_runner_targets():
    files = {"test_a.py": "", "sub/test_b.py": "", "helper.py": ""}
    assert runner_targets("pytest $TEST_DIR/sub/test_b.py ${TEST_DIR}/test_a.py /tests/missing.py", files) == \
        ["sub/test_b.py", "test_a.py"]
