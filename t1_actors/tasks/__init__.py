"""Tasks: one model for every task format, the loaders, and the synthetic training corpus.

    from t1_actors.tasks import Task, load_task, load_tasks, write_task, generate, oracle_trajectory

- ``Task`` (model.py): instruction, environment (workdir, files at absolute paths, setup, env, Dockerfile
  to replay), oracle (script + one command per turn), tests (pytest files laid down under ``TESTS_DIR``
  at verification time, their dependencies), limits.
- ``load_task(dir)`` reads the own format (t1-task.toml), Terminal-Bench (task.yaml) or Harbor
  (task.toml + instruction.md); ``load_tasks(root)`` every task under a tree; ``write_task`` writes the
  own format. A malformed task raises ``TaskFormatError`` naming the file and the field.
- ``generate(split, n, seed)``: the synthetic corpus (families of shell work, multi-test verifiers);
  train and eval are disjoint by construction. ``oracle_trajectory(task)``: the commands SFT imitates.
- ``TasksConfig`` / ``build_task_sets(config)``: the run config's [tasks] section and what it yields.
- ``EXAMPLES_DIR``: a few small Terminal-Bench and Harbor tasks that need no network.
"""

from pathlib import Path

from t1_actors.tasks.config import TasksConfig, TaskSets, build_task_sets
from t1_actors.tasks.errors import TaskFormatError
from t1_actors.tasks.formats import detect_format, load_task, load_tasks, write_task
from t1_actors.tasks.model import (
    DEFAULT_WORKDIR,
    TESTS_DIR,
    Environment,
    FileSpec,
    Limits,
    Oracle,
    Task,
    Tests,
    oracle_trajectory,
)
from t1_actors.tasks.synthetic import FAMILIES, available_families, generate, split_of

EXAMPLES_DIR = Path(__file__).parent / "examples"

__all__ = [
    "DEFAULT_WORKDIR", "EXAMPLES_DIR", "FAMILIES", "TESTS_DIR", "Environment", "FileSpec", "Limits", "Oracle",
    "Task", "TaskFormatError", "TaskSets", "TasksConfig", "Tests", "available_families", "build_task_sets",
    "detect_format", "generate", "load_task", "load_tasks", "oracle_trajectory", "split_of", "write_task",
]
