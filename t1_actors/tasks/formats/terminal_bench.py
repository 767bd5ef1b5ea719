"""Terminal-Bench (v1) task directories.

    task.yaml             instruction (or legacy descriptions[key=base]), difficulty, category, tags,
                          max_agent_timeout_sec, max_test_timeout_sec, ...
    docker-compose.yaml   optional: the client service (build.dockerfile, environment); other services
                          are noted in metadata['services'] (the local sandbox reports them unhonoured)
    Dockerfile            the environment, built with the task directory as context
    solution.sh | solution.yaml   the oracle (solution.yaml: a list of {command: ...} turns)
    run-tests.sh          optional: the test runner (its pip installs are the tests' dependencies)
    tests/                the pytest files, mounted at $TEST_DIR (/tests)
"""

from __future__ import annotations

from dataclasses import dataclass, field
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

MARKER = "task.yaml"
_HARNESS_ENV = {"TEST_DIR"}  # set by the harness (and by our verifier), not by the task


def is_terminal_bench(path: Path) -> bool:
    return (path / MARKER).is_file()


def load_terminal_bench(path: Path, *, split: str = "eval") -> Task:
    spec_file = path / MARKER
    spec = _yaml_mapping(spec_file)
    instruction = _instruction(spec, spec_file)

    compose_file = path / "docker-compose.yaml"
    if not compose_file.exists():
        compose_file = path / "docker-compose.yml"
    compose = _compose(compose_file) if compose_file.exists() else _Compose()
    context = (path / compose.context).resolve()
    dockerfile = read_text(context / compose.dockerfile, field=None)
    base_image, workdir = dockerfile_facts(dockerfile)

    script, commands = _solution(path)

    tests_dir = path / "tests"
    if not tests_dir.is_dir():
        raise TaskFormatError(tests_dir, None, "missing; put the pytest files (e.g. test_outputs.py) in tests/")
    test_files = read_tree(tests_dir)
    if not test_files:
        raise TaskFormatError(tests_dir, None, "holds no files; put the pytest files (e.g. test_outputs.py) in tests/")
    runner = read_text(path / "run-tests.sh") if (path / "run-tests.sh").is_file() else None

    metadata: dict[str, Any] = {
        key: spec[key] for key in ("difficulty", "category", "author_name", "author_email")
        if isinstance(spec.get(key), str)
    }
    if isinstance(spec.get("tags"), list):
        metadata["tags"] = [str(tag) for tag in spec["tags"]]
    if compose.services:
        metadata["services"] = compose.services

    limits: dict[str, Any] = {}
    for key, limit in (("max_agent_timeout_sec", "agent_timeout_s"), ("max_test_timeout_sec", "verifier_timeout_s")):
        if key in spec:
            limits[limit] = expect(spec[key], (int, float), spec_file, key, "a number of seconds")

    return build_task(
        spec_file,
        id=path.name,
        family=str(spec.get("category") or "terminal-bench"),
        split=split,
        instruction=instruction,
        environment={
            "workdir": workdir or DEFAULT_WORKDIR,
            "env": {k: v for k, v in compose.env.items() if k not in _HARNESS_ENV},
            "dockerfile": dockerfile,
            "base_image": base_image,
            "context_dir": str(context),
        },
        oracle={"script": script, "commands": commands},
        tests={
            "files": test_files,
            "targets": runner_targets(runner or "", test_files),
            "dependencies": runner_dependencies(runner or ""),
            "script": runner,
        },
        limits=limits,
        source_format="terminal-bench",
        metadata=metadata,
    )


def _yaml_mapping(file: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(read_text(file))
    except yaml.YAMLError as exc:
        raise TaskFormatError(file, None, f"not valid YAML: {exc}") from None
    return expect(data, dict, file, "(top level)", "a YAML mapping with an 'instruction' key")


def _instruction(spec: dict[str, Any], file: Path) -> str:
    if "instruction" in spec:
        return expect(spec["instruction"], str, file, "instruction", "the task's instruction as a string")
    descriptions = spec.get("descriptions")  # the older layout: a list of {key, description}
    if isinstance(descriptions, list):
        for entry in descriptions:
            if isinstance(entry, dict) and entry.get("key") == "base" and isinstance(entry.get("description"), str):
                return entry["description"]
    raise TaskFormatError(file, "instruction", "missing; add `instruction: |` followed by what the agent must do")


@dataclass(frozen=True)
class _Compose:
    """What the client service of a docker-compose file says; the other services are only named."""

    context: str = "."
    dockerfile: str = "Dockerfile"
    env: dict[str, str] = field(default_factory=dict)
    services: list[str] = field(default_factory=list)


def _compose(file: Path) -> _Compose:
    compose = _yaml_mapping(file)
    services = expect(compose.get("services"), dict, file, "services", "a mapping of services with a 'client'")
    client = services.get("client")
    if not isinstance(client, dict):
        raise TaskFormatError(file, "services.client", "missing; Terminal-Bench runs the agent in service 'client'")
    build = client.get("build") or {}
    if isinstance(build, str):  # `build: ./dir` is the context alone
        build = {"context": build}
    context, dockerfile = str(build.get("context", ".")), str(build.get("dockerfile", "Dockerfile"))
    env: dict[str, str] = {}
    raw_env = client.get("environment") or {}
    items = raw_env.items() if isinstance(raw_env, dict) else (str(e).partition("=")[::2] for e in raw_env)
    for key, value in items:
        env[str(key)] = "" if value is None else str(value)
    return _Compose(context, dockerfile, env, sorted(name for name in services if name != "client"))


def _solution(path: Path) -> tuple[str, list[str]]:
    if (path / "solution.sh").is_file():
        return read_text(path / "solution.sh"), []
    file = path / "solution.yaml"
    if not file.is_file():
        raise TaskFormatError(path / "solution.sh", None, "missing; write the oracle as solution.sh or solution.yaml")
    try:
        steps = yaml.safe_load(read_text(file))
    except yaml.YAMLError as exc:
        raise TaskFormatError(file, None, f"not valid YAML: {exc}") from None
    expect(steps, list, file, "(top level)", "a list of steps, each {command: ...}")
    commands = []
    for i, step in enumerate(steps):
        command = step.get("command") if isinstance(step, dict) else None
        if not isinstance(command, str) or not command.strip():
            raise TaskFormatError(file, f"[{i}].command", "missing or empty; each step needs `command: <shell>`")
        commands.append(command.rstrip("\n"))
    return "#!/bin/bash\n" + "\n".join(commands) + "\n", commands
