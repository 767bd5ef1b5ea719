"""The verifier engine: run a task's own tests against a trial's final root and count what passed.

Integrity, in the order it happens:

1. The tests the agent never saw: each task's test files are written once into the verifier's own store,
   read-only, named by the sha256 of the tree; the hash is recomputed from disk before every use (a
   mismatch is an infrastructure error, never a score), and reported in the event.
2. The agent's diff is the trial's upper layer. It is scanned for tampering: writes under /tests, reward
   or result files, planted conftest.py / pytest.ini / tox.ini / setup.cfg / pyproject [tool.pytest],
   sitecustomize / usercustomize / .pth, a fake ``pytest`` anywhere. Flagged, and none of it can move P:
3. The tests run from the verifier's forkserver (``_sandbox/verify_server.py``): a trusted interpreter
   with pytest already imported, its own packages mounted read-only at their own paths, the pristine
   tests mounted read-only at /tests only now, the tests' own dependencies (pip-installed once into the
   verifier's dir when its env lacks them) read-only, ``-c /dev/null --rootdir /tests --confcutdir /tests``
   so no workspace conftest or ini file loads, plugin autoload off, no network, a throwaway upper so
   the tests' writes never touch the trial.
4. P comes from pytest's own reports through a plugin writing to a pipe; only ``passed`` counts
   (skipped / xfailed / xpassed do not). reward = P / S, S = 20 fixed (``t1_actors.train.reward.reward``), or
   1[P = N] with ``[verifier] reward = "binary"`` (``binary_reward``); the event names which (``reward_kind``).
5. The code under test runs in pytest's process when the tests import it, and could patch pytest's
   reporting. The recorder (``_sandbox/pytest_outcomes.py``) fingerprints that machinery and the hook
   registry before collection and checks them before each pass it writes and at session finish, and
   checks each report against what it logged; a finding is a tamper flag (``FORGERY_KINDS``) and P = 0.

Trust boundary: pytest and the test files are trusted; code the tests *import* from the workspace shares
pytest's process, so the recorder catches the known ways of forging outcomes there, not every way (what
it still can do: docs/chaos.md). Tests that run the agent's programs as subprocesses are not exposed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import secrets
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from schemas import VerifierResult
from t1_actors.backends._sandbox.dependencies import ensure_dependencies, missing_dependencies  # noqa: F401 (re-export)
from t1_actors.backends._sandbox.interface import SandboxInfraError
from t1_actors.backends._sandbox.pytest_outcomes import is_forgery
from t1_actors.backends._sandbox.remote_verify import pytest_bundle, verify_in_sandbox
from t1_actors.backends.local_sandbox import TrialRoot
from t1_actors.train.reward import REWARD_SCALE, RewardKind, task_reward

if TYPE_CHECKING:
    from t1_actors.tasks.model import Task

class VerifierConfig(BaseModel):
    """The ``[verifier]`` section of the run config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_dir: str = Field("/tmp/t1-verifier", description="pristine tests store and per-run scratch")
    memory_mb: int = Field(2048, gt=0, description="memory cap of one verification (pytest + the code it runs)")
    pids_max: int = Field(256, gt=8, description="processes + threads of one verification (fork bombs stop here)")
    max_scan_entries: int = Field(200_000, gt=0, description="tamper scan stops (and flags) past this many paths")
    install_test_dependencies: bool = Field(True, description="pip-install test deps the verifier's env lacks "
                                                              "(once per requirement set, into base_dir/deps)")
    pip_args: list[str] = Field(default_factory=list, description="extra pip args, e.g. --no-index --find-links DIR")
    reward: RewardKind = Field("dense", description="the reward a verified trial earns, logged in its "
                                                    "verifier_result: dense = P / 20 (passing tests over a fixed "
                                                    "scale, the recipe); binary = 1 if every test passed, else 0. "
                                                    "Eval passes score the dense reward either way")


@dataclass(frozen=True)
class Verification:
    """One verification: per-test outcomes, P, total, the reward, integrity facts."""

    trial_id: str
    task_id: str
    tests: dict[str, str]
    passed: int
    total: int
    reward: float
    reward_scale: int
    verifier_sha256: str
    tamper_flags: list[str] = field(default_factory=list)
    infra_error: str | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    log_tail: str = ""
    phases: dict[str, float] = field(default_factory=dict)  # seconds from fork: setup, pytest, reaped, cleaned
    reward_kind: RewardKind = "dense"  # the equation of reward ([verifier] reward)

    @property
    def resolved(self) -> bool:
        return self.infra_error is None and self.total > 0 and self.passed == self.total

    def to_event(self) -> VerifierResult:
        return VerifierResult(trial_id=self.trial_id, task_id=self.task_id, tests=self.tests, passed=self.passed,
                              total=self.total, reward=self.reward, reward_scale=self.reward_scale,
                              verifier_sha256=self.verifier_sha256, tamper_flags=self.tamper_flags,
                              infra_error=self.infra_error, duration_s=self.duration_s,
                              reward_kind=self.reward_kind)


# ------------------------------------------------------------------------------------------ pristine tests

def tree_sha256(files: dict[str, str | bytes]) -> str:
    """sha256 of a tests tree: every relative path and its bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(files):
        data = files[path].encode() if isinstance(files[path], str) else files[path]
        digest.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _tree_on_disk(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class PristineTests:
    """The verifier's read-only copies of task tests, by sha256; re-hashed from disk before each use."""

    def __init__(self, store: Path):
        self.store = store
        store.mkdir(parents=True, exist_ok=True)
        os.chmod(store, 0o700)
        self._lock = threading.Lock()

    def materialise(self, task: Task) -> tuple[Path, str]:
        sha = tree_sha256(task.tests.files)
        target = self.store / sha
        with self._lock:
            if not target.is_dir():
                scratch = self.store / f".{sha}.{secrets.token_hex(4)}"
                for rel, content in task.tests.files.items():
                    path = scratch / rel
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(content.encode() if isinstance(content, str) else content)
                    os.chmod(path, 0o444)
                for directory in sorted((p for p in scratch.rglob("*") if p.is_dir()), reverse=True):
                    os.chmod(directory, 0o555)
                os.chmod(scratch, 0o555)
                os.rename(scratch, target)
        on_disk = tree_sha256(_tree_on_disk(target))
        if on_disk != sha:  # this verification fails as infra; the copy is set aside so the next one rebuilds
            with self._lock:
                if target.is_dir():
                    os.rename(target, self.store / f".corrupt-{sha[:16]}-{secrets.token_hex(4)}")
            raise SandboxInfraError(f"pristine tests of task {task.id} at {target} changed on disk "
                                    f"(sha256 {on_disk[:12]} != {sha[:12]}); set aside, rebuilt on next use")
        return target, sha


# ------------------------------------------------------------------------------------------ tamper scan

_REWARD_FILES = {"reward.txt", "reward.json", "result.json", "results.json", "ctrf.json", "report.xml",
                 "junit.xml", "test-results.xml"}
_PYTEST_CONFIGS = {"pytest.ini", ".pytest.ini", "tox.ini"}
_PYTEST_SECTIONS = {"setup.cfg": "[tool:pytest]", "pyproject.toml": "[tool.pytest"}
_FAKE_PYTEST = {"pytest", "py.test", "pytest.py", "_pytest", "py.py"}


def tamper_scan(upper_root: Path, upper_sys: dict[str, Path], max_entries: int = 200_000) -> list[str]:
    """Flags ``kind:/path`` for every tampering the agent's diff (its upper layer) shows."""
    flags: list[str] = []
    seen = 0
    tops = [(upper_root, "")] + [(path, f"/{name}") for name, path in sorted(upper_sys.items())]
    for top, prefix in tops:
        for dirpath, dirnames, filenames in os.walk(top):
            rel_dir = prefix + "/" + os.path.relpath(dirpath, top) if dirpath != str(top) else prefix
            rel_dir = os.path.normpath(rel_dir) if rel_dir else "/"
            for name in sorted(dirnames + filenames):
                seen += 1
                if seen > max_entries:
                    return flags + [f"scan_truncated:{max_entries}"]
                flag = _tamper_kind(os.path.join(dirpath, name), name, os.path.join(rel_dir, name))
                if flag:
                    flags.append(flag)
            dirnames[:] = [d for d in dirnames if d not in _FAKE_PYTEST]
    return flags


def _tamper_kind(host_path: str, name: str, path: str) -> str | None:
    info = os.lstat(host_path)
    if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
        return f"test_path_deleted:{path}" if path.startswith("/tests") else None  # an overlay whiteout
    if path == "/tests" or path.startswith("/tests/"):
        return f"test_path_written:{path}"
    if name in _REWARD_FILES or path.startswith("/logs/verifier/"):
        return f"reward_file_written:{path}"
    if name == "conftest.py":
        return f"conftest_planted:{path}"
    if name in _PYTEST_CONFIGS:
        return f"pytest_config_planted:{path}"
    if name in _PYTEST_SECTIONS and stat.S_ISREG(info.st_mode) and info.st_size < 1 << 20:
        with open(host_path, "rb") as f:
            if _PYTEST_SECTIONS[name].encode() in f.read():
                return f"pytest_config_planted:{path}"
    if name in ("sitecustomize.py", "usercustomize.py"):
        return f"sitecustomize_planted:{path}"
    if name.endswith(".pth"):
        return f"pth_planted:{path}"
    if name in _FAKE_PYTEST or re.fullmatch(r"pytest-?[0-9.]*|py\.test-?[0-9.]*", name):
        return f"fake_pytest:{path}"
    return None


# ------------------------------------------------------------------------------------------ forkserver

class _ForkServer:
    """Client of one verify_server process; thread-safe, requests run concurrently inside the server."""

    def __init__(self):
        project = str(Path(__file__).resolve().parents[2])  # the checkout holding t1_actors
        # first on the path: the server runs this checkout's code, not an installed copy's (an editable
        # install of another checkout would otherwise win)
        code = (f"import sys; sys.path.insert(0, {project!r}); "
                f"from t1_actors.backends._sandbox.verify_server import main; main({project!r})")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        ready = self.proc.stdout.readline()
        if not ready or not json.loads(ready).get("ready"):
            raise SandboxInfraError("the verifier forkserver did not start (run it by hand: python -m "
                                    "t1_actors.backends._sandbox.verify_server, and read its stderr)")
        self._ids = itertools.count()
        self._futures: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="t1-verify-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            reply = json.loads(line)
            with self._lock:
                future = self._futures.pop(reply["id"], None)
            if future is not None:
                future.set_result(reply)
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
        for future in futures:
            future.set_exception(SandboxInfraError("the verifier forkserver exited"))

    def submit(self, request: dict) -> Future:
        future: Future = Future()
        with self._lock:
            if self.proc.poll() is not None:
                raise SandboxInfraError("the verifier forkserver is not running")
            request = {**request, "id": next(self._ids)}
            self._futures[request["id"]] = future
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        return future

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)


# ------------------------------------------------------------------------------------------ the verifier

class Verifier:
    """Verifies trials of the local backend (same host: the trial's layers are on the shared disk)."""

    def __init__(self, config: VerifierConfig | None = None):
        self.config = config or VerifierConfig()
        self.base = Path(self.config.base_dir)
        self.pristine = PristineTests(self.base / "tests")
        self.scratch = self.base / "scratch"
        self.scratch.mkdir(parents=True, exist_ok=True)
        self._server: _ForkServer | None = None
        self._lock = threading.Lock()

    def _forkserver(self) -> _ForkServer:
        with self._lock:
            if self._server is None or self._server.proc.poll() is not None:
                self._server = _ForkServer()
            return self._server

    def verify(self, task: Task, trial: TrialRoot) -> Verification:
        """Run ``task``'s tests against ``trial``'s final root. Infrastructure failures come back as
        ``infra_error`` (reward 0, to be dropped by the consumer, never trained on as a 0)."""
        start = time.monotonic()
        sha = tree_sha256(task.tests.files)
        try:
            extra_paths = ensure_dependencies(task.tests.dependencies, self.base / "deps",
                                              install=self.config.install_test_dependencies,
                                              pip_args=list(self.config.pip_args))
            tests_dir, sha = self.pristine.materialise(task)
            upper_sys = {name: trial.upper.sys(name) for name in trial.stack.system_dirs}
            flags = tamper_scan(trial.upper.root(), upper_sys, self.config.max_scan_entries)
            scratch = self.scratch / f"{re.sub(r'[^A-Za-z0-9._-]', '_', trial.trial_id)[:48]}-{secrets.token_hex(4)}"
            scratch.mkdir(parents=True)
            reply = self._forkserver().submit({
                "trial_root": trial.to_json(), "tests_dir": str(tests_dir), "targets": list(task.tests.targets),
                "scratch": str(scratch), "timeout_s": task.limits.verifier_timeout_s,
                "memory_bytes": self.config.memory_mb << 20, "pids": self.config.pids_max,
                "env": {**trial.env, **task.tests.env}, "workdir": trial.workdir, "extra_paths": extra_paths,
            }).result(timeout=task.limits.verifier_timeout_s + 60)
        except SandboxInfraError as exc:
            return self._failed(task, trial, sha, str(exc), start)
        except Exception as exc:  # the verifier's own machinery broke: never a score
            return self._failed(task, trial, sha, f"{type(exc).__name__}: {exc}", start)
        return self._scored(task, trial, sha, {**reply, "tamper_flags": flags + reply.get("tampered", [])}, start)

    def verify_in_sandbox(self, task: Task, sandbox) -> Verification:
        """Verify a trial whose root this host cannot mount (a Daytona sandbox): the tests and a trusted
        pytest bundle go into the sandbox only now (see ``_sandbox/remote_verify.py`` for what is weaker)."""
        start = time.monotonic()
        sha = tree_sha256(task.tests.files)
        trial = _Named(sandbox.trial_id)
        try:
            tests_dir, sha = self.pristine.materialise(task)
            files = _tree_on_disk(tests_dir)
            reply = verify_in_sandbox(sandbox, task, files, pytest_bundle(self.base / "bundles"))
        except SandboxInfraError as exc:
            return self._failed(task, trial, sha, str(exc), start)
        except Exception as exc:  # the verifier's own machinery broke: never a score
            return self._failed(task, trial, sha, f"{type(exc).__name__}: {exc}", start)
        return self._scored(task, trial, sha, reply, start)

    def _scored(self, task: Task, trial, sha: str, reply: dict, start: float) -> Verification:
        if reply.get("infra_error"):
            return self._failed(task, trial, sha, reply["infra_error"], start, reply.get("tamper_flags"))
        tests = dict(reply["tests"])
        for nodeid in reply["collected"]:
            tests.setdefault(nodeid, "timeout" if reply["timed_out"] else "not_run")
        flags = list(reply.get("tamper_flags", []))
        # pytest's own reporting was altered in its process: no outcome it reported is evidence
        forged = any(is_forgery(flag) for flag in flags)
        passed = 0 if forged else sum(outcome == "passed" for outcome in tests.values())
        return Verification(trial.trial_id, task.id, tests, passed, len(tests),
                            task_reward(self.config.reward, passed, len(tests)), REWARD_SCALE, sha,
                            flags, None, bool(reply["timed_out"]),
                            time.monotonic() - start, reply.get("log", ""), reply.get("phases", {}),
                            reward_kind=self.config.reward)

    def _failed(self, task: Task, trial, sha: str, error: str, start: float,
                flags: list[str] | None = None) -> Verification:
        return Verification(trial.trial_id, task.id, {}, 0, 0, 0.0, REWARD_SCALE, sha, flags or [], error,
                            False, time.monotonic() - start, reward_kind=self.config.reward)

    def close(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.close()
                self._server = None

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class _Named:
    trial_id: str
