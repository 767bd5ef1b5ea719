"""The synthetic corpus: deterministic by seed, splits disjoint by construction, shaped for a tiny policy."""

from __future__ import annotations

import ast
import os
import statistics
import subprocess
import sys

import pytest

from t1_actors.tasks import FAMILIES, TESTS_DIR, available_families, generate, oracle_trajectory, split_of
from t1_actors.tasks.synthetic import EVAL_PERCENT
from t1_actors.tasks.synthetic._draft import NAMES, WORDS


@pytest.fixture(scope="module")
def train():
    return generate("train", 40 * len(FAMILIES), seed=0)


@pytest.fixture(scope="module")
def evaluation():
    return generate("eval", 10 * len(FAMILIES), seed=0)


def test_same_seed_same_tasks():
    assert generate("train", 50, seed=11) == generate("train", 50, seed=11)


def test_same_tasks_in_every_process():
    """No set or hash order leaks into a task: other hash seeds, same ids (ids fingerprint the content)."""
    script = "from t1_actors.tasks import generate; print([t.id for t in generate('train', 48, seed=9)])"
    ids = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": str(hash_seed)}).stdout for hash_seed in (1, 2)]
    assert ids[0] == ids[1] == f"{[t.id for t in generate('train', 48, seed=9)]}\n"


def test_other_seed_other_tasks():
    first, second = generate("train", 50, seed=11), generate("train", 50, seed=12)
    assert len({t.id for t in first} & {t.id for t in second}) < 5


def test_prefix_is_stable():
    """Asking for more tasks extends the list; the first ones do not change."""
    assert generate("eval", 60, seed=5)[:30] == generate("eval", 30, seed=5)


def test_splits_are_disjoint_whatever_the_seeds():
    train = {t.instruction for seed in range(3) for t in generate("train", 400, seed=seed)}
    evaluation = {t.instruction for seed in range(3) for t in generate("eval", 400, seed=seed)}
    assert not train & evaluation
    assert len(train) > 1000 and len(evaluation) > 1000


def test_split_follows_the_hash(train, evaluation):
    assert all(split_of(t.family, t.instruction) == t.split == "train" for t in train)
    assert all(split_of(t.family, t.instruction) == t.split == "eval" for t in evaluation)


def test_eval_share_of_the_hash_space():
    draws = [split_of("family", f"instruction {i}") for i in range(4000)]
    assert abs(draws.count("eval") / len(draws) - EVAL_PERCENT / 100) < 0.03


def test_ids_and_instructions_unique(train, evaluation):
    tasks = train + evaluation
    assert len({t.id for t in tasks}) == len(tasks)
    assert len({t.instruction for t in train}) == len(train)


def test_families_taken_in_turn(train):
    counts = {name: sum(t.family == name for t in train) for name in FAMILIES}
    assert set(counts.values()) == {40}
    assert all(t.metadata["area"] == FAMILIES[t.family].area for t in train)


def test_family_selection():
    tasks = generate("train", 6, seed=1, families=["head_tail", "cleanup"])
    assert [t.family for t in tasks] == ["head_tail", "cleanup"] * 3
    weighted = generate("train", 6, seed=1, families=["head_tail", "head_tail", "cleanup"])
    assert [t.family for t in weighted] == ["head_tail", "head_tail", "cleanup"] * 2
    with pytest.raises(ValueError, match="unknown synthetic families.*'nope'"):
        generate("train", 2, families=["nope"])


def test_bad_arguments_named():
    with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
        generate("test", 3)
    with pytest.raises(ValueError, match="n must be >= 0"):
        generate("train", -1)


def test_git_family_only_where_git_exists(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda tool: None)
    assert "git_commit" not in available_families()
    assert "head_tail" in available_families()


def test_instructions_short_and_formulaic(train):
    for task in train:
        assert len(task.instruction.split()) <= 40, task.instruction
        assert task.instruction.endswith(".")


def test_oracle_is_two_to_three_short_commands(train):
    for task in train:
        commands = oracle_trajectory(task)
        assert 2 <= len(commands) <= 4, task.id
        assert all(len(command) <= 90 for command in commands), commands
        assert task.oracle.script.splitlines()[2:] == commands


def test_paths_in_commands_are_copied_from_the_instruction(train):
    """The probe's lesson: the policy copies a parameter that sits verbatim in the instruction."""
    for task in train:
        for command in task.oracle.commands:
            for word in command.replace("'", " ").split():
                if word.startswith("/app/"):
                    assert word.split("*")[0].rstrip("/") in task.instruction, (word, task.instruction)


def test_check_count_distribution(train):
    checks = [t.metadata["checks"] for t in train]
    assert 4 <= statistics.median(checks) <= 6
    assert min(checks) >= 4 and max(checks) <= 20
    assert sum(c >= 10 for c in checks) >= len(checks) // 20  # some large verifiers, like T1-15k


def test_tests_are_valid_pytest_modules_with_one_function_per_check(train):
    for task in train[: 3 * len(FAMILIES)]:
        (name, source), = task.tests.files.items()
        module = ast.parse(source)
        functions = [node.name for node in module.body if isinstance(node, ast.FunctionDef)]
        tests = [name for name in functions if name.startswith("test_")]
        assert len(tests) == len(set(tests)) == task.metadata["checks"]
        assert task.tests.targets == [name] and task.tests.command == f"pytest -rA {TESTS_DIR}/{name}"


def test_files_live_under_app(train):
    assert all(path.startswith("/app/") for t in train for path in t.environment.files)


def test_vocabularies_small_and_unambiguous():
    """grep and sed match substrings: no word may hide inside another, or checks would disagree."""
    assert 50 <= len(NAMES) <= 200 and 40 <= len(WORDS) <= 200
    for vocabulary in (NAMES, WORDS):
        assert len(set(vocabulary)) == len(vocabulary)
        assert not [(a, b) for a in vocabulary for b in vocabulary if a != b and a in b]


def test_recovery_tasks_hide_a_missing_directory_and_hold_out_families():
    from t1_actors.tasks.synthetic import generate_nested, generate_recovery
    from t1_actors.tasks.synthetic._recovery import recovery_split

    train, evaluation = generate_recovery("train", 40, seed=1), generate_recovery("eval", 40, seed=1)
    assert {t.family for t in train} == {"recovery_seen"}
    assert {t.family for t in evaluation} == {"recovery_seen", "recovery_heldout"}
    assert all(recovery_split(t.metadata["parts"][0]) == "train" for t in train)
    for task in train + evaluation:
        mkdir, *rest = task.oracle.commands
        directory = mkdir.split()[-1]
        assert mkdir == f"mkdir -p {directory}" and any(f"{directory}/" in c for c in rest)
        assert not any(path.startswith(directory + "/") for path in task.environment.files)  # really missing
        assert "mkdir" not in task.instruction and f"{directory}/" in task.instruction
    nested = generate_nested("train", 40, seed=1, mkdir_share=0.25)
    for task in nested:  # the SFT twin: the directory exists; some oracles make sure of it first
        assert any(path.endswith("/.keep") for path in task.environment.files)
    creating = sum(task.oracle.commands[0].startswith("mkdir -p ") for task in nested)
    assert 4 <= creating <= 18
    assert not any(c.startswith("mkdir") for t in generate_nested("train", 20, seed=1) for c in t.oracle.commands)
    assert not {t.instruction for t in train} & {t.instruction for t in evaluation}


def test_composite_tasks_prefix_each_part_and_hold_out_pairings():
    from t1_actors.tasks.synthetic import generate_composite
    from t1_actors.tasks.synthetic._composite import MAX_CHECKS, pairing_split

    train, evaluation = generate_composite("train", 20, seed=2), generate_composite("eval", 20, seed=2)
    assert all(pairing_split(*t.metadata["parts"]) == "train" for t in train)
    assert {len(t.metadata["parts"]) for t in evaluation} == {2, 3}
    assert all(pairing_split(*t.metadata["parts"]) == "eval" for t in evaluation if len(t.metadata["parts"]) == 2)
    for task in train + evaluation:
        assert task.metadata["checks"] <= MAX_CHECKS
        assert task.instruction.startswith("Task 1: ")
        body = task.tests.files["test_outputs.py"]
        assert all(f"def test_p{i}_" in body for i in range(1, len(task.metadata["parts"]) + 1))
