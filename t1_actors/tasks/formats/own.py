"""The project's own task format: everything a Task holds, in plain files.

    t1-task.toml    id, family, split, instruction, source_format, [environment] (workdir, setup, env,
                    base_image, file_modes = {"/abs/path" = "755"}), [oracle] commands,
                    [tests] targets/dependencies/env, [limits], [metadata]
    files/          the files laid down, at their absolute path under files/ (files/app/x.txt -> /app/x.txt)
    solution.sh     the oracle script (absent when the task has none)
    tests/          the test files, laid down under /tests at verification time
    Dockerfile      optional, with its build context in context/ (written for TB / Harbor tasks)
    run-tests.sh    optional, the source format's test runner, kept for reference
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from t1_actors.tasks.errors import TaskFormatError
from t1_actors.tasks.formats._common import build_task, expect, read_text, read_tree, write_bytes
from t1_actors.tasks.model import Task

MARKER = "t1-task.toml"
_DEFAULT_MODE = 0o644


def is_own(path: Path) -> bool:
    return (path / MARKER).is_file()


def load_own(path: Path) -> Task:
    spec_file = path / MARKER
    try:
        spec = tomllib.loads(read_text(spec_file))
    except tomllib.TOMLDecodeError as exc:
        raise TaskFormatError(spec_file, None, f"not valid TOML: {exc}") from None

    environment = dict(expect(spec.pop("environment", {}), dict, spec_file, "environment", "a table"))
    modes = expect(environment.pop("file_modes", {}), dict, spec_file, "environment.file_modes", "a table")
    files_dir = path / "files"
    files = {}
    for relative, content in (read_tree(files_dir).items() if files_dir.is_dir() else ()):
        absolute = "/" + relative
        files[absolute] = {"content": content, "mode": _mode(modes.pop(absolute, None), spec_file, absolute)}
    if modes:
        raise TaskFormatError(spec_file, "environment.file_modes",
                              f"names files that are not under files/: {sorted(modes)}")
    environment["files"] = files
    if (path / "Dockerfile").is_file():
        environment["dockerfile"] = read_text(path / "Dockerfile")
        context = path / "context" if (path / "context").is_dir() else path
        environment["context_dir"] = str(context.resolve())

    oracle = dict(expect(spec.pop("oracle", {}), dict, spec_file, "oracle", "a table"))
    if (path / "solution.sh").is_file():
        oracle["script"] = read_text(path / "solution.sh")
        extra = path / "solution"  # the oracle's other files (laid in oracle.directory beside the script)
        if extra.is_dir():
            oracle["files"] = {str(f.relative_to(extra)): _text_or_bytes(f.read_bytes())
                               for f in sorted(extra.rglob("*")) if f.is_file()}
    elif oracle:
        raise TaskFormatError(path / "solution.sh", None, "missing while [oracle] is set; write the oracle script")

    tests = dict(expect(spec.pop("tests", {}), dict, spec_file, "tests", "a table"))
    tests_dir = path / "tests"
    if not tests_dir.is_dir():
        raise TaskFormatError(tests_dir, None, "missing; put the task's pytest files in tests/")
    tests["files"] = read_tree(tests_dir)
    if not tests["files"]:
        raise TaskFormatError(tests_dir, None, "holds no files; put the task's pytest files in tests/")
    if (path / "run-tests.sh").is_file():
        tests["script"] = read_text(path / "run-tests.sh")

    return build_task(spec_file, **spec, environment=environment, oracle=oracle or None, tests=tests)


def write_own(task: Task, directory: str | Path) -> Path:
    """Write ``task`` into ``directory`` (created; must be empty or absent) in the own format."""
    root = Path(directory)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty; write_task needs a fresh directory")
    root.mkdir(parents=True, exist_ok=True)

    env = task.environment
    for absolute, spec in env.files.items():
        write_bytes(root / "files" / absolute.lstrip("/"), spec.content)
    for relative, content in task.tests.files.items():
        write_bytes(root / "tests" / relative, content)
    if task.oracle is not None:
        write_bytes(root / "solution.sh", task.oracle.script, 0o755)
        for relative, content in task.oracle.files.items():
            write_bytes(root / "solution" / relative, content)
    if task.tests.script is not None:
        write_bytes(root / "run-tests.sh", task.tests.script, 0o755)
    if env.dockerfile is not None:
        write_bytes(root / "Dockerfile", env.dockerfile)
        if env.context_dir and Path(env.context_dir).is_dir():
            shutil.copytree(env.context_dir, root / "context", symlinks=True)

    spec: dict[str, Any] = {
        "id": task.id, "family": task.family, "split": task.split, "source_format": task.source_format,
        "instruction": task.instruction,
        "environment": _without_none({
            "workdir": env.workdir, "setup": env.setup, "env": env.env, "base_image": env.base_image,
            "file_modes": {path: f"{spec.mode:o}" for path, spec in env.files.items() if spec.mode != _DEFAULT_MODE},
        }),
        "tests": {"targets": task.tests.targets, "dependencies": task.tests.dependencies, "env": task.tests.env},
        "limits": task.limits.model_dump(),
        "metadata": task.metadata,
    }
    if task.oracle is not None:
        spec["oracle"] = _without_none({"commands": task.oracle.commands, "directory": task.oracle.directory})
    (root / MARKER).write_text(tomli_w.dumps(spec, multiline_strings=True), encoding="utf-8")
    return root


def _mode(value: Any, file: Path, path: str) -> int:
    if value is None:
        return _DEFAULT_MODE
    try:
        return int(str(value), 8)
    except ValueError:
        raise TaskFormatError(file, f"environment.file_modes.{path}",
                              f"{value!r} is not an octal mode; write e.g. \"755\"") from None


def _without_none(table: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in table.items() if value is not None and value != {}}


def _text_or_bytes(data: bytes) -> str | bytes:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data
