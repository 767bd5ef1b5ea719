"""The tests' own dependencies, from the verifier's trusted environment: what the verifier's interpreter
lacks is pip-installed once per requirement set into a directory of the verifier's own (the analogue
of run-tests.sh / test.sh installing them), mounted read-only into each verification. Never from the
agent's workspace or PATH."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from t1_actors.backends._sandbox.interface import SandboxInfraError


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[;@ ]", requirement.strip(), maxsplit=1)[0]


def missing_dependencies(requirements: list[str]) -> list[str]:
    """Requirements (pip names, versions ignored) not installed in this interpreter's environment."""
    missing = []
    for requirement in requirements:
        name = requirement_name(requirement)
        if not name:
            continue
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def ensure_dependencies(requirements: list[str], store: Path, *, install: bool, pip_args: list[str],
                        timeout_s: float = 600.0) -> list[str]:
    """Directories to add to the tests' sys.path so every requirement imports; installs what is missing."""
    missing = set(missing_dependencies(requirements))
    wanted = sorted(r.strip() for r in requirements if requirement_name(r) in missing)
    if not wanted:
        return []
    if not install:
        raise SandboxInfraError(f"test dependencies {sorted(missing)} are not installed in the verifier's environment "
                                f"({sys.prefix}); pip install them there or set [verifier] install_test_dependencies")
    key = hashlib.sha256("\n".join([*wanted, *pip_args]).encode()).hexdigest()[:16]
    target = store / key
    if (target / ".complete").is_file():
        return [str(target)]
    store.mkdir(parents=True, exist_ok=True)
    with open(store / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").is_file():
            return [str(target)]
        scratch = store / f".{key}.{secrets.token_hex(4)}"
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                   "--no-warn-script-location", "--target", str(scratch), *pip_args, *wanted]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                  env={**os.environ, "PIP_NO_INPUT": "1"})
        except subprocess.TimeoutExpired:
            shutil.rmtree(scratch, ignore_errors=True)
            raise SandboxInfraError(f"pip install of test dependencies {wanted} ran past {timeout_s:.0f} s") from None
        if done.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            raise SandboxInfraError(f"pip could not install test dependencies {wanted}: {done.stderr.strip()[-600:]}")
        (scratch / ".complete").write_text("\n".join(wanted))
        os.rename(scratch, target)
    return [str(target)]
