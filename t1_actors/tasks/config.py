"""The run config's [tasks] section, and the task sets it yields (looked up by id by the actors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from .formats import load_tasks
from .model import Split, Task
from .synthetic import generate


class TasksConfig(BaseModel):
    """Which tasks a run trains and evaluates on. Defaults: the tiny embedded run's synthetic corpus."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    train_size: int = Field(2000, ge=0)  # synthetic train tasks
    eval_size: int = Field(320, ge=0)  # synthetic eval tasks (under ~300 a gain of a few points is noise)
    families: list[str] | None = None  # synthetic families to draw from; None: every available one
    task_dirs: list[str] = []  # trees of own / Terminal-Bench / Harbor task directories, added to task_dirs_split
    task_dirs_split: Split = "eval"


@dataclass(frozen=True)
class TaskSets:
    train: list[Task]
    eval: list[Task]
    by_id: dict[str, Task] = field(default_factory=dict)

    def get(self, task_id: str) -> Task:
        try:
            return self.by_id[task_id]
        except KeyError:
            raise KeyError(f"unknown task id {task_id!r}; it is in neither the train nor the eval set") from None


def build_task_sets(config: TasksConfig) -> TaskSets:
    """The train and eval task lists the config asks for; task ids are unique across both."""
    train = generate("train", config.train_size, seed=config.seed, families=config.families)
    evaluation = generate("eval", config.eval_size, seed=config.seed, families=config.families)
    for root in config.task_dirs:
        loaded = load_tasks(root, split=config.task_dirs_split)
        (train if config.task_dirs_split == "train" else evaluation).extend(loaded)
    by_id: dict[str, Task] = {}
    for task in [*train, *evaluation]:
        if task.id in by_id:
            raise ValueError(f"task id {task.id!r} appears twice in the run's task sets; rename one")
        by_id[task.id] = task
    return TaskSets(train=train, eval=evaluation, by_id=by_id)
