"""What every loader shares: reading files with errors that name them, building a Task with errors
that name the field, and reading what a format's test runner script says about the tests."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from t1_actors.tasks.errors import TaskFormatError
from t1_actors.tasks.model import Task

_SKIPPED_NAMES = {"__pycache__", ".pytest_cache", ".git", ".DS_Store"}


def read_text(path: Path, *, field: str | None = None) -> str:
    if not path.is_file():
        raise TaskFormatError(path, field, "missing; the task format requires this file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFormatError(path, field, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_tree(root: Path) -> dict[str, str | bytes]:
    """Every regular file under ``root`` by relative posix path: text as str, anything else as bytes."""
    tree: dict[str, str | bytes] = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part in _SKIPPED_NAMES or part.endswith(".pyc") for part in relative.parts):
            continue
        if path.is_file() and not path.is_symlink():
            tree[relative.as_posix()] = decode_if_text(path.read_bytes())
    return tree


def decode_if_text(data: bytes) -> str | bytes:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def write_bytes(path: Path, content: str | bytes, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    if mode is not None:
        path.chmod(mode)


def build_task(file: Path, **fields: Any) -> Task:
    """``Task(**fields)``; a validation failure becomes a TaskFormatError naming ``file`` and the field."""
    try:
        return Task(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or None
        problem = error["msg"].removeprefix("Value error, ")
        raise TaskFormatError(file, field, problem) from None


def expect(value: Any, kind: type | tuple[type, ...], file: Path, field: str, hint: str) -> Any:
    if not isinstance(value, kind):
        got = type(value).__name__
        raise TaskFormatError(file, field, f"expected {hint}, got {got} {value!r:.60}")
    return value


# --- what a test runner script (run-tests.sh, test.sh) says -------------------------------------

_PIP_INSTALL = re.compile(r"(?:^|[;&|]\s*|\s)(?:uv\s+)?pip3?\s+install\s+([^\n;&|]+)")
_UV_ADD = re.compile(r"(?:^|[;&|]\s*|\s)uv\s+add\s+([^\n;&|]+)")
_UVX_WITH = re.compile(r"(?:-w|--with)\s+(\S+)")
_HARNESS_PACKAGES = {"pytest", "pytest-json-ctrf", "uv"}  # the verifier brings its own


def runner_dependencies(script: str) -> list[str]:
    """Requirements a runner script installs for its tests (pip / uv pip / uv add / uvx --with)."""
    found: list[str] = []
    for line in script.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0]
        words: list[str] = []
        for match in (*_PIP_INSTALL.finditer(line), *_UV_ADD.finditer(line)):
            words += _requirements(_shell_words(match.group(1)))
        if "uvx" in line:
            words += [m.group(1) for m in _UVX_WITH.finditer(line)]
        for word in words:
            name = re.split(r"[<>=!~\[ ;]", word, maxsplit=1)[0].lower()
            if name and name not in _HARNESS_PACKAGES and word not in found:
                found.append(word)
    return found


_OPTIONS_WITH_VALUE = {"-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url",
                       "--extra-index-url", "-f", "--find-links", "-p", "--python", "-t", "--target"}


def _requirements(words: list[str]) -> list[str]:
    """The package requirements among an install command's words (no options, files, URLs or variables)."""
    kept, skip_next = [], False
    for word in words:
        if skip_next:
            skip_next = False
        elif word in _OPTIONS_WITH_VALUE:
            skip_next = True
        elif not (word.startswith(("-", ".")) or "/" in word or "$" in word or word.endswith((".txt", ".whl"))):
            kept.append(word)
    return kept


def runner_targets(script: str, test_files: dict[str, Any]) -> list[str]:
    """Test files a runner script hands pytest by path ($TEST_DIR/x.py, /tests/x.py), in order."""
    targets: list[str] = []
    for match in re.finditer(r"(?:\$\{?TEST_DIR\}?|/tests)/([\w./-]+\.py)", script):
        name = match.group(1)
        if name in test_files and name not in targets:
            targets.append(name)
    return targets


def _shell_words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def dockerfile_facts(dockerfile: str) -> tuple[str | None, str | None]:
    """The first FROM image and the last absolute WORKDIR of a Dockerfile (the rest is the sandbox's)."""
    base_image = workdir = None
    for raw in dockerfile.replace("\\\n", " ").splitlines():
        words = raw.strip().split()
        if len(words) < 2:
            continue
        instruction = words[0].upper()
        if instruction == "FROM" and base_image is None:
            base_image = next((w for w in words[1:] if not w.startswith("--")), None)
        elif instruction == "WORKDIR" and words[1].startswith("/"):
            workdir = words[1].rstrip("/") or "/"
    return base_image, workdir
