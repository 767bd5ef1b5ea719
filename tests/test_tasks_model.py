"""The Task model's validation, the oracle trajectory for SFT, and the [tasks] run-config section."""

from __future__ import annotations

import msgpack
import pytest
from pydantic import ValidationError

from t1_actors.tasks import (
    EXAMPLES_DIR,
    FAMILIES,
    TESTS_DIR,
    Task,
    TasksConfig,
    TaskSets,
    build_task_sets,
    generate,
    oracle_trajectory,
)

MINIMAL = {"id": "t", "family": "f", "instruction": "do it", "tests": {"files": {"test_x.py": "def test_x(): pass"}}}


def task(**changes) -> Task:
    return Task(**{**MINIMAL, **changes})


def test_defaults_suit_the_embedded_run():
    t = task()
    assert t.environment.workdir == "/app" and t.split == "eval" and t.source_format == "t1"
    assert t.limits.command_timeout_s == 10 and t.limits.max_turns == 8
    assert t.tests.command == f"pytest -rA {TESTS_DIR}" and t.oracle is None


@pytest.mark.parametrize("changes, message", [
    ({"id": "has space"}, "must match"),
    ({"id": "../escape"}, "must match"),
    ({"instruction": "   "}, "instruction is empty"),
    ({"split": "test"}, "'train' or 'eval'"),
    ({"environment": {"workdir": "app"}}, "absolute path"),
    ({"environment": {"files": {"data.txt": {"content": "x"}}}}, "absolute path inside the sandbox"),
    ({"environment": {"files": {"/app/../etc/passwd": {"content": "x"}}}}, "not normalised"),
    ({"environment": {"files": {"/app/x": {"content": "x", "mode": 0o17777}}}}, "less than or equal"),
    ({"tests": {"files": {}}}, "at least one test file"),
    ({"tests": {"files": {"/tests/test_x.py": ""}}}, "plain relative path"),
    ({"tests": {"files": {"../test_x.py": ""}}}, "plain relative path"),
    ({"tests": {"files": {"test_x.py": ""}, "targets": ["test_y.py"]}}, "not among the test files"),
    ({"oracle": {"script": "ls", "commands": ["ls", " "]}}, "oracle command 1 is empty"),
    ({"limits": {"command_timeout_s": 0}}, "greater than 0"),
    ({"surprise": 1}, "Extra inputs"),
])
def test_bad_tasks_rejected_with_the_reason(changes, message):
    with pytest.raises(ValidationError, match=message):
        task(**changes)


def test_tasks_are_frozen():
    with pytest.raises(ValidationError):
        task().instruction = "other"


def test_file_spec_bytes_and_text():
    t = task(environment={"files": {"/app/a": {"content": "é"}, "/app/b": {"content": b"\x00\xff", "mode": 0o755}}})
    assert t.environment.files["/app/a"].data == "é".encode() and t.environment.files["/app/b"].data == b"\x00\xff"
    assert t.environment.files["/app/b"].mode == 0o755


def test_oracle_trajectory_turns():
    split = task(oracle={"script": "a\nb\n", "commands": ["a", "b"]})
    whole = task(oracle={"script": "#!/bin/bash\nset -e\nmake\n"})
    assert oracle_trajectory(split) == ["a", "b"] == split.oracle_commands
    assert oracle_trajectory(whole) == ["#!/bin/bash\nset -e\nmake"] and whole.oracle_commands == []
    with pytest.raises(ValueError, match="has no oracle solution"):
        oracle_trajectory(task())


def test_tasks_travel_as_msgpack():
    """Actors on other hosts get tasks over the wire: a task's dump packs and rebuilds equal."""
    for t in generate("train", len(FAMILIES), seed=2):
        assert Task(**msgpack.unpackb(msgpack.packb(t.model_dump()), raw=False, strict_map_key=False)) == t


def test_task_sets_from_the_config(tmp_path):
    config = TasksConfig(train_size=32, eval_size=16, task_dirs=[str(EXAMPLES_DIR)])
    sets = build_task_sets(config)
    assert isinstance(sets, TaskSets) and len(sets.train) == 32 and len(sets.eval) == 16 + 6
    assert {t.split for t in sets.train} == {"train"} and {t.split for t in sets.eval} == {"eval"}
    assert sets.get("hello-world").source_format == "terminal-bench"
    assert sets.get(sets.train[3].id) == sets.train[3]
    with pytest.raises(KeyError, match="unknown task id 'nope'"):
        sets.get("nope")


def test_task_sets_choose_families_and_seed():
    sets = build_task_sets(TasksConfig(train_size=4, eval_size=2, families=["git_commit", "head_tail"], seed=3))
    assert {t.family for t in sets.train} == {"git_commit", "head_tail"}
    assert build_task_sets(TasksConfig(train_size=4, eval_size=2, seed=3)).train != \
        build_task_sets(TasksConfig(train_size=4, eval_size=2, seed=4)).train


def test_tasks_config_rejects_unknown_keys():
    with pytest.raises(ValidationError, match="Extra inputs"):
        TasksConfig(train_sizes=3)
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        TasksConfig(eval_size=-1)


def test_rl_size_carves_the_rl_tasks_out_of_the_sft_tasks():
    """SFT memorises its tasks, so RL gets train tasks the warm start never saw: disjoint, covering, stable."""
    whole = build_task_sets(TasksConfig(train_size=40, eval_size=4))
    carved = build_task_sets(TasksConfig(train_size=40, eval_size=4, rl_size=12))
    assert whole.sft == whole.rl == whole.train  # rl_size = 0: one list for both phases
    assert carved.train == whole.train  # the split does not change which tasks exist
    assert len(carved.sft) == 28 and len(carved.rl) == 12
    assert {t.id for t in carved.sft}.isdisjoint(t.id for t in carved.rl)
    assert carved.sft + carved.rl == carved.train
    # the same RL tasks whatever the eval size: they come by index
    assert build_task_sets(TasksConfig(train_size=40, eval_size=9, rl_size=12)).rl == carved.rl


def test_rl_size_must_leave_sft_tasks():
    with pytest.raises(ValidationError, match="rl_size = 40 leaves no train task for the SFT warm start"):
        TasksConfig(train_size=40, rl_size=40)
