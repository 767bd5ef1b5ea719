"""t1-audit tasks: executed gates on tasks these tests write, good ones and one broken task per gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t1_actors.tasks import write_task
from t1_actors.tasks.model import Environment, FileSpec, Oracle, Task
from t1_actors.tasks.model import Tests as TaskTests
from tools._audit.task_checks import audit_task, hidden_requirements, oracle_steps, shortcut_variants
from tools.audit import main

GOOD_TEST = '''from pathlib import Path

def test_report_exists():
    assert Path("/app/report.txt").exists()

def test_report_content():
    assert Path("/app/report.txt").read_text() == "ok\\n"

def test_archive():
    assert Path("/app/archive/report.txt").read_text() == "ok\\n"
'''
GOOD_INSTRUCTION = "Write ok to /app/report.txt, then copy it into the directory /app/archive."
GOOD_ORACLE = ["cd /app", "echo ok > /app/report.txt", "mkdir -p /app/archive", "cp /app/report.txt /app/archive/"]


def own_task(task_id: str, *, instruction: str = GOOD_INSTRUCTION, test: str = GOOD_TEST,
             oracle: list[str] = GOOD_ORACLE, files: dict | None = None) -> Task:
    return Task(id=task_id, family="audit-test", instruction=instruction,
                environment=Environment(files={p: FileSpec(content=c) for p, c in (files or {}).items()}),
                oracle=Oracle(script="\n".join(oracle), commands=oracle), tests=TaskTests(files={"test_outputs.py": test}))


BROKEN = {
    # the oracle does not solve its own task
    "bad-oracle": (own_task("bad-oracle", oracle=["echo ko > /app/report.txt", "mkdir -p /app/archive",
                                                   "cp /app/report.txt /app/archive/"]), "oracle_passes"),
    # doing nothing passes: the tests check nothing the agent must do
    "weak-verifier": (own_task("weak-verifier", test="import os\n\ndef test_app():\n    assert os.path.isdir('/app')\n"),
                      "noop_fails"),
    # the tests never look at the archive: dropping the last two commands still passes
    "shortcut": (own_task("shortcut", test=GOOD_TEST.split("\ndef test_archive")[0]), "no_shortcut"),
    # the tests sit in the agent's workspace
    "leaky": (own_task("leaky", files={"/app/.hidden/test_outputs.py": GOOD_TEST}), "no_leakage"),
    # the tests check a file the instruction never names
    "hidden": (own_task("hidden", test=GOOD_TEST + "\ndef test_log():\n    assert open('/app/audit.log').read()\n",
                        oracle=GOOD_ORACLE + ["echo done > /app/audit.log"]), "no_hidden_requirement"),
}


def write_terminal_bench(root: Path, *, leak: bool = False) -> Path:
    task = root / ("tb-leaky" if leak else "tb-good")
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text('instruction: |\n  Create /app/greeting.txt containing the line "hello".\n'
                                    "difficulty: easy\ncategory: file-operations\n")
    copy = "COPY tests/ /app/tests/\n" if leak else ""
    (task / "Dockerfile").write_text(f"FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest\nWORKDIR /app\n{copy}")
    (task / "solution.sh").write_text("#!/bin/bash\necho hello > /app/greeting.txt\n")
    (task / "tests" / "test_outputs.py").write_text(
        "from pathlib import Path\n\ndef test_greeting_exists():\n    assert Path('/app/greeting.txt').exists()\n\n"
        "def test_greeting_content():\n    assert Path('/app/greeting.txt').read_text().strip() == 'hello'\n")
    return task


def write_harbor(root: Path) -> Path:
    task = root / "harbor-good"
    for sub in ("tests", "solution", "environment"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text('version = "1.0"\n[metadata]\ndifficulty = "easy"\n[verifier]\ntimeout_sec = 60\n')
    (task / "instruction.md").write_text("Write the number 42 to /app/answer.txt and copy it to /app/backup.txt.\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\necho 42 > /app/answer.txt\ncp /app/answer.txt /app/backup.txt\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\npytest /tests/test_state.py\n")
    (task / "tests" / "test_state.py").write_text(
        "def test_answer():\n    assert open('/app/answer.txt').read().strip() == '42'\n\n"
        "def test_backup():\n    assert open('/app/backup.txt').read().strip() == '42'\n")
    return task


@pytest.fixture(scope="module")
def runner():
    from tools._audit.task_runner import LocalTrialRunner

    try:
        r = LocalTrialRunner()
    except Exception as exc:
        pytest.skip(f"the local sandbox cannot run here: {exc}")
    yield r
    r.close()


def test_good_task_passes_every_gate(runner):
    audit = audit_task(own_task("good"), runner)
    assert audit.ok, audit.to_json()
    assert audit.soft["oracle_deterministic"] is True
    assert audit.soft["tests"] == 3 and audit.soft["noop_pass_share"] == 0.0
    assert audit.soft["partial_credit_share"] > 0  # dropping a step earns some but not all tests


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_task_fails_its_gate(runner, name):
    task, gate = BROKEN[name]
    audit = audit_task(task, runner, determinism=False)
    failed = {g.name for g in audit.gates if not g.passed}
    assert not audit.ok
    assert gate in failed, audit.to_json()
    # a weak verifier also lets every partial solution through; a bad oracle makes the rest meaningless
    allowed = {"weak-verifier": {"noop_fails", "no_shortcut"}}.get(name, {gate})
    assert failed <= allowed or name == "bad-oracle", f"{name} failed other gates too: {failed}"


@pytest.mark.slow
def test_cli_on_formats_and_exit_codes(tmp_path, capsys):
    good, bad = tmp_path / "good", tmp_path / "bad"
    write_terminal_bench(good)
    write_harbor(good)
    write_terminal_bench(bad, leak=True)
    write_task(BROKEN["weak-verifier"][0], bad / "weak")  # the own format
    try:
        code = main(["tasks", str(good), "--json"])
    except Exception as exc:
        pytest.skip(f"the local sandbox cannot run here: {exc}")
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["tasks"] == 2 and out["failed"] == []
    assert {a["source_format"] for a in out["audits"]} == {"terminal-bench", "harbor"}

    assert main(["tasks", str(bad), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["failed"]) == ["tb-leaky", "weak-verifier"]
    assert out["gate_failures"]["no_leakage"] == 1 and out["gate_failures"]["noop_fails"] == 1
    leak = next(a for a in out["audits"] if a["task_id"] == "tb-leaky")
    assert "/app/tests/test_outputs.py" in leak["gates"]["no_leakage"]["detail"]

    assert main(["tasks", str(bad)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_cli_bad_dir(tmp_path, capsys):
    assert main(["tasks", str(tmp_path / "none")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_hidden_requirement_heuristic():
    task = own_task("h", instruction="Write ok to report.txt in /app.",
                    test="def test_a():\n    assert open('/app/report.txt').read()\n"
                         "    assert open('/app/extra/notes.md').read()\n    import os.path\n")
    assert hidden_requirements(task) == ["/app/extra/notes.md"]
    # a file the environment gives the agent is not hidden
    given = own_task("g", instruction="Sort the input.", files={"/app/in.txt": "b\na\n"},
                     test="def test_a():\n    assert open('/app/in.txt').read()\n")
    assert hidden_requirements(given) == []


def test_shortcut_variants_skip_harmless_steps():
    variants = shortcut_variants(["cd /app", "echo ok > a", "ls", "cp a b"])
    assert "drop[0]" not in variants and "drop[2]" not in variants
    assert variants["drop[1]"] == ["cd /app", "ls", "cp a b"]
    assert variants["drop[3]"] == ["cd /app", "echo ok > a", "ls"]


def test_oracle_steps_of_a_script():
    task = own_task("s").model_copy(update={"oracle": Oracle(script="#!/bin/bash\necho a > x \\\n  && true\ncp x y\n")})
    assert [" ".join(step.split()) for step in oracle_steps(task)] == ["echo a > x && true", "cp x y"]
    heredoc = own_task("s").model_copy(update={"oracle": Oracle(script="cat > f <<EOF\nhi\nEOF\n")})
    assert oracle_steps(heredoc) == ["cat > f <<EOF\nhi\nEOF\n"]


def test_script_oracle_lines_share_one_shell(runner, tmp_path):
    # a Terminal-Bench style solution.sh whose later lines depend on an earlier cd
    task = own_task("script").model_copy(update={"oracle": Oracle(
        script="#!/bin/bash\nmkdir -p /app/archive\ncd /app\necho ok > report.txt\ncp report.txt archive/\n")})
    audit = audit_task(task, runner, determinism=False)
    assert audit.ok, audit.to_json()
    assert audit.soft["oracle_steps"] == 4


def test_tests_directory_visible_to_the_agent_is_a_leak(runner):
    task = own_task("tests-dir", files={"/tests/test_outputs.py": GOOD_TEST})
    audit = audit_task(task, runner, determinism=False)
    leak = next(g for g in audit.gates if g.name == "no_leakage")
    assert not leak.passed and "LEAK" not in leak.detail and "/tests" in leak.detail


def test_the_new_synthetic_kinds_pass_every_gate(runner, tmp_path):
    """Recovery, nested and composite tasks, written to disk in the project's own format and read back,
    pass t1-audit's executed gates (oracle passes, no-op fails, no shortcut, no leakage, no hidden
    requirement): for a recovery task, skipping its mkdir is one of the shortcuts tried, and it fails."""
    from t1_actors.tasks import load_tasks
    from t1_actors.tasks.synthetic import generate_composite, generate_nested, generate_recovery

    tasks = (generate_recovery("train", 2, seed=9) + generate_recovery("eval", 2, seed=9)[1:]
             + generate_nested("train", 1, seed=9) + generate_composite("eval", 1, seed=9))
    for task in tasks:
        write_task(task, tmp_path / "good" / task.id)
    for task in load_tasks(tmp_path / "good"):
        audit = audit_task(task, runner, determinism=False)
        assert audit.ok, audit.to_json()
    # A nested SFT twin whose oracle first makes sure of its (existing) directory has a step it does not
    # need, and the audit says so: dropping the mkdir -p still passes. That is the design, nothing hidden.
    [twin] = generate_nested("train", 1, seed=9, mkdir_share=1.0)
    audit = audit_task(twin, runner, determinism=False)
    assert {g.name for g in audit.gates if not g.passed} == {"no_shortcut"}
    assert "drop[0]" in next(g.detail for g in audit.gates if g.name == "no_shortcut")
