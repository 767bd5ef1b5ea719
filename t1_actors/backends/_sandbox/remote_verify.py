"""Verification inside a sandbox the verifier cannot mount (Daytona), through the Sandbox face only.

The verifier ships its own pytest: a zip of pytest and its dependencies from the verifier's trusted
environment plus the outcome plugin, uploaded with the pristine tests only now, run by the sandbox's
``python3 -I`` (no PYTHONPATH, no user site, no cwd on sys.path) with the same flags as the local
forkserver (``-c /dev/null --rootdir /tests --confcutdir /tests``, plugin autoload off). Outcomes go to
a file under a random directory and are downloaded. Tamper flags come from a ``find`` for the same
suspicious names among files changed since the environment was laid down (``ENV_READY_MARKER``).

Weaker than the local path, and said so: the interpreter is the sandbox's own, and the agent had the
whole machine, so a replaced ``python3`` or a planted ``sitecustomize`` could still lie (they are flagged;
such code runs before the outcome recorder fingerprints pytest, so its in-process checks do not cover it).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import secrets
import shlex
import zipfile
from pathlib import Path
from typing import Any

from packaging.markers import Marker

from t1_actors.backends._sandbox.interface import SandboxInfraError
from t1_actors.backends._sandbox.pytest_outcomes import FILE_PLUGIN, parse_outcomes
from t1_actors.backends._sandbox.verify_server import PYTEST_ARGS

ENV_READY_MARKER = "/tmp/.t1-env-ready"  # touched by a backend when the task's environment is laid down
_SUSPICIOUS = ["conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "sitecustomize.py", "usercustomize.py",
               "*.pth", "pytest", "py.test", "pytest.py", "_pytest", "reward.txt", "reward.json", "results.json",
               "result.json", "ctrf.json"]


def pytest_bundle(cache_dir: Path) -> bytes:
    """A zip of pytest, its dependencies and the outcome plugin, importable from sys.path (cached on disk)."""
    version = importlib.metadata.version("pytest")
    recorder = hashlib.sha256(Path(__file__).with_name("pytest_outcomes.py").read_bytes()).hexdigest()[:12]
    path = cache_dir / f"pytest-bundle-{version}-{recorder}.zip"
    if path.is_file():
        return path.read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name in _with_requirements("pytest"):
            distribution = importlib.metadata.distribution(name)
            for file in distribution.files or []:
                parts = Path(str(file)).parts
                metadata = not parts or parts[0].endswith((".dist-info", ".egg-info")) or ".." in parts
                if metadata or "__pycache__" in parts or not str(file).endswith((".py", ".typed")):
                    continue
                bundle.write(distribution.locate_file(file), str(file))
        bundle.write(Path(__file__).with_name("pytest_outcomes.py"), "t1_pytest_outcomes.py")
        bundle.writestr("t1_outcomes_plugin.py", FILE_PLUGIN)
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".{secrets.token_hex(4)}")
    scratch.write_bytes(buffer.getvalue())
    scratch.rename(path)
    return buffer.getvalue()


def _with_requirements(name: str, seen: set[str] | None = None) -> set[str]:
    seen = set() if seen is None else seen
    key = name.lower().replace("_", "-")
    if key in seen:
        return seen
    seen.add(key)
    for requirement in importlib.metadata.requires(name) or []:
        if "extra ==" in requirement:
            continue
        if ";" in requirement and not _marker_holds(requirement.split(";", 1)[1]):
            continue
        dependency = requirement.split(";")[0].split("[")[0]
        for stop in "<>=!~ (":
            dependency = dependency.split(stop)[0]
        try:
            importlib.metadata.distribution(dependency)
        except importlib.metadata.PackageNotFoundError:
            continue
        _with_requirements(dependency, seen)
    return seen


def _marker_holds(marker: str) -> bool:
    return Marker(marker.strip()).evaluate()


def verify_in_sandbox(sandbox: Any, task: Any, tests_files: dict[str, bytes], bundle: bytes) -> dict:
    """Run ``task``'s tests inside ``sandbox``; returns {tests, collected, timed_out, tamper_flags, log, infra_error}."""
    base = f"/tmp/.t1-verify-{secrets.token_hex(8)}"
    flags = _tamper_flags(sandbox)
    sandbox.exec("rm -rf /tests", 30)
    sandbox.write_file(f"{base}/pytest.zip", bundle, 0o600)
    for rel, data in tests_files.items():
        sandbox.write_file(f"/tests/{rel}", data, 0o444)
    targets = [f"/tests/{t}" for t in task.tests.targets] or ["/tests"]
    runner = (f"import sys; sys.path[:0] = [{base + '/pytest.zip'!r}]; import pytest; "
              f"sys.exit(pytest.main({[*targets, *PYTEST_ARGS, '-p', 't1_outcomes_plugin']!r}))")
    env = {**task.environment.env, **task.tests.env, "TEST_DIR": "/tests", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "T1_OUTCOMES": f"{base}/outcomes.jsonl"}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = (f"cd {shlex.quote(task.environment.workdir)} 2>/dev/null || cd /; "
               f"env {exports} python3 -I -c {shlex.quote(runner)}")
    result = sandbox.exec(command, task.limits.verifier_timeout_s)
    if result.exit_code == 127:
        raise SandboxInfraError(f"the sandbox of task {task.id} has no python3 to run its tests")
    try:
        text = sandbox.read_file(f"{base}/outcomes.jsonl").decode("utf-8", "replace")
    except SandboxInfraError:
        text = ""
    sandbox.exec(f"rm -rf {base} /tests", 30)
    tests, collected, infra_error, tampered = parse_outcomes(text)
    return {"tests": tests, "collected": collected, "timed_out": result.timed_out, "tamper_flags": flags + tampered,
            "log": (result.stdout + result.stderr)[-4000:], "infra_error": infra_error}


def _tamper_flags(sandbox: Any) -> list[str]:
    names = " -o ".join(f"-name {shlex.quote(n)}" for n in _SUSPICIOUS)
    probe = (f"test -e /tests && echo 'test_path_written:/tests'; "
             f"test -e {ENV_READY_MARKER} && newer='-newer {ENV_READY_MARKER}' || newer=''; "
             f"find / -xdev \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o \\( {names} \\) $newer -print "
             f"2>/dev/null | head -200")
    result = sandbox.exec(probe, 60)
    flags = []
    for line in result.stdout.splitlines():
        if line.startswith("test_path_written:"):
            flags.append(line)
            continue
        name = line.rsplit("/", 1)[-1]
        kind = ("conftest_planted" if name == "conftest.py" else
                "pytest_config_planted" if name in ("pytest.ini", ".pytest.ini", "tox.ini") else
                "sitecustomize_planted" if name.endswith("customize.py") else
                "pth_planted" if name.endswith(".pth") else
                "reward_file_written" if name.startswith(("reward", "result", "ctrf")) else "fake_pytest")
        flags.append(f"{kind}:{line}")
    return flags
