"""`t1-actor eval` on the shipped example tasks (Terminal-Bench, Harbor) and own-format tasks: the oracle
resolves them, nothing does not, a task whose build fails is an infrastructure failure kept out of the rate,
a second run skips finished attempts, two evals pair. The `run:` policy is tested in test_campaign.py on
the quick campaign's run directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from t1_actors.task_eval import main

EXAMPLES = Path(__file__).resolve().parent.parent / "t1_actors" / "tasks" / "examples"


def _eval(capsys, *args: str) -> tuple[int, dict | None, str]:
    code = main([*args, "--json"])
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    return code, json.loads(lines[-1]) if lines else None, captured.err


@pytest.fixture(scope="module")
def task_set(tmp_path_factory) -> Path:
    """The shipped examples, two own-format synthetic tasks, and a copy of hello-world whose build fails."""
    from t1_actors.tasks.formats import write_task
    from t1_actors.tasks.synthetic import generate

    root = tmp_path_factory.mktemp("tasks")
    shutil.copytree(EXAMPLES, root / "examples")
    for task in generate("eval", 2, seed=5):
        write_task(task, root / "own" / task.id)
    broken = root / "broken" / "build-fails"
    shutil.copytree(EXAMPLES / "terminal-bench" / "hello-world", broken)
    dockerfile = broken / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN exit 3\n")
    return root


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("eval")
    return {"sandbox": str(base / "sandbox"), "verifier": str(base / "verifier"), "out": str(base)}


def _args(task_set: Path, dirs: dict, policy: str, out: str, *extra: str) -> list[str]:
    return ["--tasks", str(task_set), "--policy", policy, "--out", str(Path(dirs["out"]) / out),
            "--sandbox-dir", dirs["sandbox"], "--verifier-dir", dirs["verifier"], *extra]


@pytest.fixture(scope="module")
def oracle(task_set, dirs):
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(_args(task_set, dirs, "oracle", "oracle", "--json"))
    return code, json.loads(out.getvalue().strip().splitlines()[-1]), err.getvalue()


def test_the_oracle_resolves_every_task_that_builds_and_the_broken_build_is_infrastructure(oracle):
    code, summary, _ = oracle
    assert code == 0
    by_task = {row["task"]: row for row in summary["tasks"]}
    assert len(by_task) == 6 + 2 + 1 and summary["n"] == 9
    broken = by_task.pop("build-fails")
    assert broken["failure_class"] == "infrastructure" and "exit" in broken["infra_error"]
    assert all(row["resolved"] and row["failure_class"] is None for row in by_task.values()), by_task
    assert summary["infra_failures"] == 1 and summary["n_scored"] == 8 and summary["resolved"] == 8
    assert summary["resolved_rate"] == 1.0 and summary["ci95"][0] < 1.0 <= summary["ci95"][1] + 1e-12
    assert summary["by_difficulty"]["medium"]["n_scored"] >= 1 and "system-administration" in summary["by_category"]
    assert summary["pass_at_k"] is None  # one attempt
    assert all(row["tests_total"] == row["passed"] > 0 and row["duration_s"] > 0 for row in by_task.values())
    assert any("FROM" in step for steps in summary["unhonoured"].values() for step in steps)


def test_noop_resolves_nothing_and_reports_what_passes_without_a_solution(task_set, dirs, capsys):
    code, summary, _ = _eval(capsys, *_args(task_set, dirs, "noop", "noop", "--attempts", "2"))
    assert code == 0 and summary["resolved"] == 0 and summary["n"] == 18 and summary["n_scored"] == 16
    assert summary["failure_classes"] == {"agent": 16, "timeout": 0, "infrastructure": 2}
    assert summary["pass_at_k"] == {"1": 0.0, "2": 0.0}
    passed_alone = {row["task"]: row["passed"] for row in summary["tasks"] if row["failure_class"] == "agent"}
    assert passed_alone["hello-world"] == 0 and passed_alone["count-words"] >= 1  # a check that passes with nothing


def test_a_second_run_skips_finished_attempts_and_a_different_policy_is_refused(task_set, dirs, oracle, capsys):
    from storage import EventLog

    out = Path(dirs["out"]) / "oracle"
    before = EventLog.open(out / "log").counts()
    code, summary, err = _eval(capsys, *_args(task_set, dirs, "oracle", "oracle"))
    assert code == 0 and "9 of 9 attempts already finished" in err
    assert EventLog.open(out / "log").counts() == before and summary["resolved"] == oracle[1]["resolved"]
    code, _, err = _eval(capsys, *_args(task_set, dirs, "noop", "oracle"))
    assert code == 2 and "policy = 'oracle'" in err and EventLog.open(out / "log").counts() == before


def test_two_evals_pair_by_task_and_attempt(task_set, dirs, oracle, capsys):
    _eval(capsys, *_args(task_set, dirs, "noop", "noop-once"))
    code, change, _ = _eval(capsys, "--compare", str(Path(dirs["out"]) / "noop-once"), str(Path(dirs["out"]) / "oracle"))
    assert code == 0 and change["tasks"] == 8 and (change["gained"], change["lost"]) == (8, 0)
    assert change["mcnemar_p"] == pytest.approx(2 / 2 ** 8) and "hello-world#0" in change["gained_tasks"]


def test_filters_and_bad_input_get_clear_errors(task_set, dirs, capsys):
    code, summary, _ = _eval(capsys, *_args(task_set, dirs, "noop", "medium", "--filter", "difficulty=medium"))
    assert code == 0 and {row["difficulty"] for row in summary["tasks"]} == {"medium"}
    for policy, extra, message in (("hf:/x", [], "/x/config.json not found"), ("gpt", [], "use oracle | noop"),
                                   ("sglang:127.0.0.1:1", [], "write the server's URL"),
                                   ("sglang:http://127.0.0.1:1", [], "needs --tokenizer"),
                                   ("sglang:http://127.0.0.1:1", ["--tokenizer", str(task_set)], "no SGLang server"),
                                   ("noop", ["--tokenizer", str(task_set)], "only for model policies"),
                                   ("noop", ["--filter", "nokey"], "KEY=VALUE"),
                                   ("noop", ["--filter", "category=none"], "no task matches"),
                                   ("run:/no/such/run", [], "config.resolved.json not found")):
        code, _, err = _eval(capsys, "--tasks", str(task_set), "--policy", policy,
                             "--out", str(Path(dirs["out"]) / "bad"), *extra)
        assert code == 2 and message in err, (policy, extra, err)


def test_a_harbor_oracle_sees_its_whole_solution_directory_at_slash_solution(tmp_path, dirs, capsys):
    # Harbor uploads solution/ to /solution before running solve.sh; solutions that `cp /solution/x` rely on it
    task = tmp_path / "tasks" / "copies-its-answer"
    shutil.copytree(EXAMPLES / "harbor" / "count-words", task)
    (task / "solution" / "answer.py").write_text("print(len(open('/app/poem.txt').read().split()))\n")
    solve = task / "solution" / "solve.sh"
    solve.write_text("#!/bin/bash\nset -e\ncp /solution/answer.py /app/answer.py\n" + solve.read_text())
    code, summary, err = _eval(capsys, "--tasks", str(tmp_path / "tasks"), "--policy", "oracle",
                               "--out", str(tmp_path / "run"), "--sandbox-dir", dirs["sandbox"],
                               "--verifier-dir", dirs["verifier"])
    assert code == 0 and summary["resolved"] == 1, summary["tasks"]
    assert "[1/1] copies-its-answer attempt 0: resolved 4/4" in err  # no terminal: a line per finished attempt


def test_on_a_terminal_a_bar_advances_and_failures_stay_printed_above_it():
    import io

    from t1_actors.task_eval._progress import EvalProgress
    from t1_actors.task_eval._runner import AttemptOutcome

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    with EvalProgress(screen, total=3, done=1) as progress:
        progress.finished("fine", 0, AttemptOutcome("answered", None, 4, 4, True))
        progress.finished("broken", 0, AttemptOutcome("infra_error", "task broken: RUN exited 3\nmore"))
    text = screen.getvalue()
    assert "[3/3] broken attempt 0: infrastructure: task broken: RUN exited 3" in text and "3/3" in text
    assert "[2/3] fine" not in text  # a resolved attempt only advances the bar
