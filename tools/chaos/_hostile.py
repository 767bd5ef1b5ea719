"""Hostile commands in the sandbox (issue 23 part 4): the agent is the attacker.

Each case is one shell command, run as the agent's tool calls run (``LocalSandbox.exec`` of a trial of the
local backend, no network), with a *goal* judged from the host's side wherever the host can see it (a
listener's accept count, a file on the host, a secret token in the command's output) and otherwise from a
token the command prints only when its own check succeeded (spelled so that it never appears in the
command's text, so an echoed error message cannot fake it). A case **escapes** when its goal is reached in
the sandbox, or when a bystander trial opened beside it (its own secret file, its own commands) or the
attacker's sandbox stops serving after it.

Every case is also its own **positive control**: the same command, run unconfined (a plain subprocess on
the host, as root, in a host scratch directory), must reach the same goal; for the symlink cases the
sandbox runs the command and a naive host-side reader or copier stands in for the verifier; for the cases
that only the seccomp filter contains (nested namespaces, keyrings, perf) the control is the same command in a
trial of the sandbox without the filter (``[sandbox.local] seccomp = false``). A case whose
control does not reach its goal proves nothing: it is not counted in ``sandbox_escapes_tried`` and is
reported under ``not_tested`` with the reason. Resource cases are bounded so that the unconfined control
is safe on a shared machine: the fork bomb doubles up to 4x the sandbox's process cap, the memory hog asks
for 4x the memory cap, the disk filler writes 4x its cap (never the whole disk).

The cases and the attacker's budgets are in ``_hostile_cases``, the host's listeners and secrets they aim
at in ``_hostile_targets``; this module runs each case in the sandbox and unconfined and writes the report.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from t1_actors.backends._sandbox.hostview import accounts
from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig
from t1_actors.runtime.config import RUN_KEY_ENV
from t1_actors.tasks.model import Limits, Task
from t1_actors.tasks.model import Tests as TaskTests
from tools.chaos._hostile_cases import (
    CASES,
    COMMAND_TIMEOUT_S,
    DISK_MB,
    FILE_SIZE_MB,
    MAX_OUTPUT,
    MEMORY_MB,
    PIDS_MAX,
    Case,
    cleanup_written,
)
from tools.chaos._hostile_targets import Listener, OutsideHost, Targets, reset_counts


@dataclass
class Outcome:
    """One run of a case's command: in the sandbox, or unconfined."""

    exit_code: int | None = None
    killed_by: str | None = None
    timed_out: bool = False
    truncated: bool = False
    stdout_bytes: int = 0
    goal_reached: bool = False
    duration_s: float = 0.0
    note: str = ""


@dataclass
class CaseReport:
    name: str
    goal: str
    sandbox: Outcome = field(default_factory=Outcome)
    control: Outcome = field(default_factory=Outcome)
    bystander_ok: bool = True  # the bystander trial still reads its secret (symlink cases: and the verifier held)
    attacker_serving: bool = True
    escaped: bool = False
    evidence: bool = False  # the control reached the goal: the case can fail
    outcome: str = ""  # in words: killed by, truncated, refused, ...



def _host_accounts() -> tuple[list[str], list[str]]:
    """(the host's account names a base image lacks, the host's /etc/shadow lines the sandbox's own lacks)."""
    passwd, _ = accounts()
    base = {line.split(":")[0] for line in passwd.splitlines() if line}
    names = [line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines() if line.strip()]
    try:
        shadow = [line for line in Path("/etc/shadow").read_text().splitlines() if line.strip()]
    except OSError:
        shadow = []
    return [n for n in names if n not in base], [line for line in shadow if line.split(":")[0] not in base]


def _unconfined(command: str, workdir: Path, timeout_s: float) -> tuple[int, bytes, int, float]:
    """The control: the command as a plain subprocess on the host, as this user (root), no sandbox. Output is
    counted as it streams (1 GB is counted, not held); the first 1 MB is kept for the goal's check."""
    start = time.monotonic()
    proc = subprocess.Popen(["/bin/sh", "-c", f"export W={workdir}; {command}"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dict(os.environ),
                            start_new_session=True)
    kept, total = bytearray(), 0
    while chunk := proc.stdout.read1(1 << 16):
        total += len(chunk)
        if len(kept) < 1 << 20:
            kept.extend(chunk)
        if time.monotonic() - start > timeout_s:
            os.killpg(proc.pid, 9)
            break
    code = proc.wait()
    return code, bytes(kept), total, time.monotonic() - start


# what the attacker's command was told, most telling first: the outcome of a case that ran to its end
_ERRORS = [("No space left on device", "refused: the trial's disk is full (ENOSPC)"),
           ("Operation not permitted", "refused (EPERM)"), ("Permission denied", "refused (EACCES)"),
           ("Network is unreachable", "refused (ENETUNREACH)"), ("Connection refused", "refused (ECONNREFUSED)"),
           ("No such process", "not visible (ESRCH)"), ("No such file or directory", "not visible (ENOENT)"),
           ("Directory nonexistent", "not visible (ENOENT)")]


def _describe(result, seen: str) -> str:
    if result.killed_by:
        return f"killed by {result.killed_by}"
    if result.stdout_truncated or result.stderr_truncated:
        return "truncated"
    for message, outcome in _ERRORS:
        if message.lower() in seen.lower():
            return outcome
    if result.exit_code != 0:
        return f"refused (exit {result.exit_code})"
    return "ran; goal not reached"


def run_hostile(directory: Path | None = None, *, say=lambda line: None, cases: list[str] | None = None,
                disk_mb: int = DISK_MB, seccomp: bool = True) -> dict[str, Any]:
    """Run every case (or those named in ``cases``) in a sandbox and unconfined; returns the report's section
    (see the module docstring). ``disk_mb``: the attacker's per-trial disk (0: none, as before it existed);
    ``seccomp``: the attacker's sandbox under the system-call filter (False: without, as before it existed)."""
    from t1_actors.verify.engine import PristineTests, Verifier, VerifierConfig  # noqa: PLC0415 - keeps chaos free of torch until this section runs (1.3 s)

    owned = directory is None
    directory = Path(tempfile.mkdtemp(prefix="t1-hostile-")) if owned else directory
    directory.mkdir(parents=True, exist_ok=True)
    host = directory / "host"
    host.mkdir(exist_ok=True)
    (host / "symlink-target").mkdir(exist_ok=True)
    token = os.urandom(8).hex()
    key = os.urandom(32).hex()
    marker_token = f"t1-hostile-marker-{token}"
    (host / "host-secret").write_text(marker_token + "\n")
    key_file = directory / "run" / "config.toml"
    key_file.parent.mkdir(exist_ok=True)
    key_file.write_text(f'[run]\nhmac_key = "{key}"\n')
    pristine_token = f"pristine-{token}"
    tests = {"test_outputs.py": f"# {pristine_token}\ndef test_free():\n    assert True\n"}
    task = Task(id="hostile", family="chaos", instruction="attack", tests=TaskTests(files=tests),
                limits=Limits(command_timeout_s=COMMAND_TIMEOUT_S, memory_mb=MEMORY_MB, max_output_bytes=MAX_OUTPUT,
                              verifier_timeout_s=60))
    pristine_dir, _ = PristineTests(directory / "verifier" / "tests").materialise(task)
    saved_key = os.environ.get(RUN_KEY_ENV)
    os.environ[RUN_KEY_ENV] = key  # as the sandbox actor holds it
    var_secret = Path(f"/var/lib/t1-hostile-{token}")  # the host's /var: a secret planted there, removed after
    var_secret.mkdir(exist_ok=True)
    (var_secret / "secret").write_text(f"t1-hostile-var-{token}\n")
    marker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", marker_token],
                              env={**os.environ, RUN_KEY_ENV: key}, stdin=subprocess.DEVNULL)
    listeners: list[Listener] = []
    not_tested: list[dict[str, str]] = []
    outside = None
    backend = None
    unfiltered = None
    verifier = None
    reports: list[CaseReport] = []
    try:
        listeners.append(Listener(socket.AF_INET, ("127.0.0.1", 0)))
        listeners.append(Listener(socket.AF_UNIX, f"/var/tmp/t1-hostile-{token}.sock"))
        listeners.append(Listener(socket.AF_UNIX, f"\0t1-hostile-{token}".encode()))
        try:
            outside = OutsideHost(host)
        except (OSError, FileNotFoundError) as exc:
            not_tested.append({"key": "sandbox:network_outside",
                               "reason": f"no outside address could be made here (a netns and a veth pair): {exc}"})
        backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(directory / "sandbox"), pids_max=PIDS_MAX,
                                                         file_size_mb=FILE_SIZE_MB, disk_mb=disk_mb,
                                                         seccomp=seccomp))
        unfiltered = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(directory / "sandbox-unfiltered"),
                                                            pids_max=PIDS_MAX, file_size_mb=FILE_SIZE_MB,
                                                            disk_mb=disk_mb, seccomp=False))
        verifier = Verifier(VerifierConfig(base_dir=str(directory / "verifier"), memory_mb=512))
        bystander = backend.open(task, "bystander")
        bystander_token = f"bystander-{token}"
        bystander.write_file("/app/secret", bystander_token.encode())
        dev = os.stat("/").st_dev
        targets = Targets(host, key, key_file, marker_token, marker.pid, pristine_dir / "test_outputs.py",
                           pristine_token, bystander_token, bystander.trial_root.upper.root() / "app" / "secret",
                           backend.trials_dir, listeners[0], listeners[1], listeners[2], outside,
                           (os.major(dev), os.minor(dev)), *_host_accounts(), f"t1-hostile-var-{token}")
        for case in CASES:
            if (case.name == "network_outside" and outside is None) or (cases is not None and case.name not in cases):
                continue
            reports.append(_run_case(case, targets, backend, task, bystander, verifier, say, unfiltered))
        bystander.close()
    finally:
        if verifier is not None:
            verifier.close()
        for opened in (backend, unfiltered):
            if opened is not None:
                opened.close()
        for listener in listeners:
            listener.close()
        Path(f"/var/tmp/t1-hostile-{token}.sock").unlink(missing_ok=True)
        shutil.rmtree(var_secret, ignore_errors=True)
        if outside is not None:
            outside.close()
        marker.kill()
        marker.wait()
        if saved_key is None:
            os.environ.pop(RUN_KEY_ENV, None)
        else:
            os.environ[RUN_KEY_ENV] = saved_key
        if owned:
            shutil.rmtree(directory, ignore_errors=True)
    for report in reports:
        if not report.evidence:
            not_tested.append({"key": f"sandbox:{report.name}",
                               "reason": f"its positive control (unconfined) did not reach the goal: "
                                         f"{report.control.note or report.control.exit_code}; not evidence"})
    evidence = [r for r in reports if r.evidence]
    return {
        "sandbox_escapes_tried": len(evidence),
        "sandbox_escapes_succeeded": sum(r.escaped for r in reports),
        "sandbox_cases": {r.name: {"goal": r.goal, "escaped": r.escaped, "outcome": r.outcome,
                                   "evidence": r.evidence, "bystander_ok": r.bystander_ok,
                                   "attacker_serving": r.attacker_serving,
                                   "sandbox": asdict(r.sandbox), "control": asdict(r.control)} for r in reports},
        "sandbox_limits": {"pids_max": PIDS_MAX, "memory_mb": MEMORY_MB, "file_size_mb": FILE_SIZE_MB,
                           "disk_mb": disk_mb, "seccomp": seccomp,
                           "max_output_bytes": MAX_OUTPUT, "command_timeout_s": COMMAND_TIMEOUT_S},
        "sandbox_positive_controls": {"tried": len(reports), "succeeded": len(evidence)},
        "sandbox_not_tested": not_tested,
    }


def _run_case(case: Case, t: Targets, backend, task, bystander, verifier, say, unfiltered) -> CaseReport:
    report = CaseReport(case.name, case.goal)
    command = case.command(t)
    # in the sandbox: a fresh trial per case, as the agent's tool call
    t.counts = {id(x): x.accepted for x in (t.loopback, t.unix_path, t.unix_abstract, t.outside) if x is not None}
    with backend.open(task, f"attacker-{case.name}") as trial:
        started = time.monotonic()
        result = trial.exec(f"export W=/tmp/w; mkdir -p $W; {command}", timeout_s=case.timeout_s)
        seen = result.stdout + result.stderr
        raw: Any = len(result.stdout.encode())
        if case.after_sandbox is not None:
            text, held = case.after_sandbox(t, trial, lambda: verifier.verify(task, trial.trial_root))
            seen += "\n" + text
            report.bystander_ok = held
        lines = seen.strip().splitlines()
        report.sandbox = Outcome(result.exit_code, result.killed_by, result.timed_out,
                                 result.stdout_truncated or result.stderr_truncated, raw,
                                 case.reached(t, seen, raw), round(time.monotonic() - started, 2),
                                 lines[-1][:200] if lines else "")
        report.attacker_serving = trial.exec("echo alive", timeout_s=10).stdout == "alive\n"
        report.outcome = _describe(result, seen) if not report.sandbox.goal_reached else "goal reached"
        if case.naive is not None:  # the control: the same plant, a naive host step
            reset_counts(t)
            trial.exec(f"export W=/tmp/w; mkdir -p $W; {command}", timeout_s=case.timeout_s)
            started = time.monotonic()
            try:
                text = case.naive(t, trial)
                code = 0
            except OSError as exc:
                text, code = f"naive step failed: {exc}", 1
            report.control = Outcome(code, None, False, False, len(text), case.reached(t, text, len(text)),
                                     round(time.monotonic() - started, 2), text.strip()[:200])
    probe = bystander.exec("cat /app/secret", timeout_s=10)
    report.bystander_ok = report.bystander_ok and probe.stdout == t.bystander_token
    cleanup_written(t)
    if case.control_without_filter:
        with unfiltered.open(task, f"control-{case.name}") as trial:
            result = trial.exec(f"export W=/tmp/w; mkdir -p $W; {command}", timeout_s=case.timeout_s)
        text = result.stdout + result.stderr
        lines = text.strip().splitlines()
        report.control = Outcome(result.exit_code, result.killed_by, result.timed_out, False, len(text),
                                 case.reached(t, text, len(text)), round(result.duration_s, 2),
                                 lines[-1][:200] if lines else "")
    elif case.naive is None:
        reset_counts(t)
        workdir = Path(tempfile.mkdtemp(prefix=f"ctl-{case.name}-", dir=t.host))
        try:
            code, out, total, duration = _unconfined(command, workdir, 120.0)
        finally:
            subprocess.run(["umount", "-q", str(workdir / "m")], capture_output=True)
            shutil.rmtree(workdir, ignore_errors=True)
        text = out.decode("utf-8", "replace")
        report.control = Outcome(code, None, False, False, total, case.reached(t, text, total), round(duration, 2),
                                 text.strip().splitlines()[-1][:200] if text.strip() else "")
        cleanup_written(t)
    for leftover in Path(t.host, "symlink-target").iterdir():
        leftover.unlink()
    report.evidence = report.control.goal_reached
    report.escaped = report.sandbox.goal_reached or not report.bystander_ok or not report.attacker_serving
    say(f"sandbox: {case.name}: {report.outcome}; escaped {report.escaped}; control reached "
        f"{report.control.goal_reached}")
    return report
