"""Loading and writing task directories: the project's own format, Terminal-Bench and Harbor.

``load_task(path)`` tells the format by its marker file: ``t1-task.toml`` (own), ``task.yaml``
(Terminal-Bench), ``task.toml`` + ``instruction.md`` (Harbor). ``write_task`` writes the own format.
"""

from __future__ import annotations

from pathlib import Path

from t1_actors.tasks.errors import TaskFormatError
from t1_actors.tasks.formats.harbor import is_harbor, load_harbor
from t1_actors.tasks.formats.own import is_own, load_own, write_own
from t1_actors.tasks.formats.terminal_bench import is_terminal_bench, load_terminal_bench
from t1_actors.tasks.model import SourceFormat, Task

__all__ = ["detect_format", "load_task", "load_tasks", "write_task"]


def detect_format(path: str | Path) -> SourceFormat | None:
    """'t1', 'terminal-bench' or 'harbor' for a task directory; None when ``path`` is not one."""
    path = Path(path)
    if is_own(path):
        return "t1"
    if is_terminal_bench(path):
        return "terminal-bench"
    if is_harbor(path):
        return "harbor"
    return None


def load_task(path: str | Path, *, split: str = "eval") -> Task:
    """The task in directory ``path``. ``split`` applies to TB / Harbor tasks (the own format records it)."""
    path = Path(path)
    if not path.is_dir():
        raise TaskFormatError(path, None, "is not a directory; pass a task directory")
    kind = detect_format(path)
    if kind == "t1":
        return load_own(path)
    if kind == "terminal-bench":
        return load_terminal_bench(path, split=split)
    if kind == "harbor":
        return load_harbor(path, split=split)
    if (path / "task.toml").is_file():
        raise TaskFormatError(path / "instruction.md", None, "missing; a Harbor task needs instruction.md")
    raise TaskFormatError(path, None, "is not a task directory: found none of t1-task.toml (own format), "
                                      "task.yaml (Terminal-Bench), task.toml + instruction.md (Harbor)")


def load_tasks(root: str | Path, *, split: str = "eval") -> list[Task]:
    """Every task directory under ``root`` (``root`` itself may be one), sorted by id; ids must be unique."""
    root = Path(root)
    if not root.is_dir():
        raise TaskFormatError(root, None, "is not a directory; pass a directory of task directories")
    found: dict[str, Task] = {}
    for directory in _task_dirs(root):
        task = load_task(directory, split=split)
        if task.id in found:
            raise TaskFormatError(directory, "id", f"duplicate task id {task.id!r}; rename one of the directories")
        found[task.id] = task
    return [found[key] for key in sorted(found)]


def write_task(task: Task, directory: str | Path) -> Path:
    """Write ``task`` in the project's own format; ``load_task`` reads it back equal."""
    return write_own(task, directory)


def _task_dirs(root: Path):
    if detect_format(root) is not None:
        yield root
        return
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        yield from _task_dirs(child)
