"""Harbor task directories (Terminal-Bench 2.0 and the Harbor registry).

    task.toml                 version, [metadata], [verifier] timeout_sec/env, [agent] timeout_sec,
                              [environment] build_timeout_sec, cpus, memory_mb (or memory = "2G"), docker_image
    instruction.md            the instruction
    environment/Dockerfile    the environment; environment/ is the build context
    solution/solve.sh         optional: the oracle (solution/ is laid at /solution, as Harbor does)
    tests/test.sh             the test runner (its installs are the tests' dependencies) + pytest files
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from t1_actors.tasks.errors import TaskFormatError
from t1_actors.tasks.formats._common import (
    build_task,
    dockerfile_facts,
    expect,
    read_text,
    read_tree,
    runner_dependencies,
    runner_targets,
)
from t1_actors.tasks.model import DEFAULT_WORKDIR, Task

MARKER = "task.toml"
SOLUTION_DIR = "/solution"  # where Harbor's oracle agent uploads solution/ before running solve.sh
_METADATA_TYPES = (str, int, float, bool)


def is_harbor(path: Path) -> bool:
    return (path / MARKER).is_file() and (path / "instruction.md").is_file()


def load_harbor(path: Path, *, split: str = "eval") -> Task:
    config_file = path / MARKER
    try:
        config = tomllib.loads(read_text(config_file))
    except tomllib.TOMLDecodeError as exc:
        raise TaskFormatError(config_file, None, f"not valid TOML: {exc}") from None
    sections = {name: _table(config, name, config_file) for name in ("metadata", "verifier", "agent", "environment")}

    instruction = read_text(path / "instruction.md", field=None)
    environment = sections["environment"]
    dockerfile_path = path / "environment" / "Dockerfile"
    if dockerfile_path.is_file():
        dockerfile = read_text(dockerfile_path)
        base_image, workdir = dockerfile_facts(dockerfile)
    elif isinstance(environment.get("docker_image"), str):
        dockerfile, base_image, workdir = None, environment["docker_image"], None
    else:
        raise TaskFormatError(dockerfile_path, None, "missing; add environment/Dockerfile "
                              "(or [environment] docker_image in task.toml)")

    solve = path / "solution" / "solve.sh"
    oracle = None
    if solve.is_file():  # Harbor's oracle sees the whole solution/ directory at /solution
        others = {name: body for name, body in read_tree(path / "solution").items() if name != "solve.sh"}
        oracle = {"script": read_text(solve), "directory": SOLUTION_DIR, "files": others}

    tests_dir = path / "tests"
    runner = read_text(tests_dir / "test.sh", field=None)  # Harbor's verifier entry point is required
    test_files = {name: body for name, body in read_tree(tests_dir).items() if name != "test.sh"}
    if not test_files:
        raise TaskFormatError(tests_dir, None, "holds no test files besides test.sh; add the pytest file(s)")

    metadata: dict[str, Any] = {}
    for key, value in sections["metadata"].items():
        if isinstance(value, _METADATA_TYPES):
            metadata[key] = value
        elif isinstance(value, list):
            metadata[key] = [str(item) for item in value]
    if "version" in config:
        metadata["format_version"] = str(config["version"])
    services = _compose_services(path / "environment")
    if services:
        metadata["services"] = services  # sidecars: the local sandbox names them as not honoured

    return build_task(
        config_file,
        id=path.name,
        family=str(metadata.get("category") or "harbor"),
        split=split,
        instruction=instruction,
        environment={
            "workdir": workdir or DEFAULT_WORKDIR,
            "dockerfile": dockerfile,
            "base_image": base_image,
            "context_dir": str((path / "environment").resolve()) if dockerfile else None,
        },
        oracle=oracle,
        tests={
            "files": test_files,
            "targets": runner_targets(runner, test_files),
            "dependencies": runner_dependencies(runner),
            "env": _string_map(sections["verifier"].get("env", {}), config_file, "verifier.env"),
            "script": runner,
        },
        limits=_limits(sections, config_file),
        source_format="harbor",
        metadata=metadata,
    )


def _compose_services(environment: Path) -> list[str]:
    """Services besides Harbor's agent container ('main') in environment/docker-compose.yaml."""
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        file = environment / name
        if file.is_file():
            try:
                compose = yaml.safe_load(read_text(file))
            except yaml.YAMLError as exc:
                raise TaskFormatError(file, None, f"not valid YAML: {exc}") from None
            services = expect((compose or {}).get("services", {}), dict, file, "services", "a mapping of services")
            return sorted(name for name in services if name != "main")
    return []


def _table(config: dict[str, Any], name: str, file: Path) -> dict[str, Any]:
    return expect(config.get(name, {}), dict, file, name, f"a [{name}] table")


def _string_map(value: Any, file: Path, field: str) -> dict[str, str]:
    expect(value, dict, file, field, "a table of strings")
    return {str(k): str(v) for k, v in value.items()}


def _limits(sections: dict[str, dict[str, Any]], file: Path) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    seconds = (("agent", "timeout_sec", "agent_timeout_s"), ("verifier", "timeout_sec", "verifier_timeout_s"),
               ("environment", "build_timeout_sec", "build_timeout_s"))
    for section, key, field in seconds:
        if key in sections[section]:
            limits[field] = expect(sections[section][key], (int, float), file, f"{section}.{key}", "seconds")
    environment = sections["environment"]
    if "cpus" in environment:
        limits["cpus"] = expect(environment["cpus"], (int, float), file, "environment.cpus", "a number of CPUs")
    if "memory_mb" in environment:
        limits["memory_mb"] = expect(environment["memory_mb"], int, file, "environment.memory_mb", "megabytes")
    elif "memory" in environment:
        limits["memory_mb"] = _megabytes(environment["memory"], file, "environment.memory")
    return limits


def _megabytes(value: Any, file: Path, field: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(value), re.IGNORECASE)
    if not match:
        raise TaskFormatError(file, field, f"{value!r} is not a size; write e.g. \"2G\" or \"512M\"")
    scale = {"": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 2**20}[match.group(2).upper()]
    return max(1, int(float(match.group(1)) * scale))
