"""The verifier's forkserver: a trusted Python with pytest imported and warmed up once, which forks one
child per verification. The child enters fresh mount/pid/net/ipc/uts namespaces, stacks a throwaway
upper on the trial's final root, mounts the pristine tests read-only at /tests and the trusted Python
read-only at its own paths, pivots into that root, drops to Docker's capabilities and runs
``pytest.main`` with the outcome plugin writing to a pipe only this server reads.

Protocol: one JSON object per line. Requests on stdin; on stdout first ``{"ready": true}``, then one
response per request (``{"id", "tests", "collected", "tampered", "timed_out", "infra_error", "duration_s",
"log"}``; ``tampered``: the outcome recorder's findings, ``pytest_outcomes.py``),
in completion order. Run it as ``python -I -m t1_actors.backends._sandbox.verify_server``.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from t1_actors.backends._sandbox import linux
from t1_actors.backends._sandbox.cgroups import CgroupLimits, CommandCgroup
from t1_actors.backends._sandbox.layers import Layer, RootStack, remove_tree
from t1_actors.backends._sandbox.pytest_outcomes import OutcomeReporter, parse_outcomes

PYTEST_ARGS = ["-p", "no:cacheprovider", "-c", "/dev/null", "--rootdir", "/tests", "--confcutdir", "/tests",
               "-o", "addopts=", "-q", "--no-header", "-p", "no:stepwise",
               # both call gc.collect() twice per run, which in a forked child copies the whole heap
               "-p", "no:unraisableexception", "-p", "no:threadexception",
               # not needed to run a task's tests; each costs plugin registration per run
               "-p", "no:doctest", "-p", "no:pastebin", "-p", "no:junitxml", "-p", "no:setuponly",
               "-p", "no:setupplan", "-p", "no:faulthandler", "-p", "no:python_path"]
# not "-p no:debugging": pytest's unittest plugin reads its --trace option, and every unittest.TestCase test
# then errors (ValueError: no option named 'trace'), an honest solution scored 0
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def trusted_mounts(exclude: str | None = None) -> list[str]:
    """Host directories holding this interpreter and its packages: the verifier's trusted environment
    (``exclude``: the t1 project itself, already imported, which the tests have no business seeing)."""
    roots = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if not real or not os.path.isdir(real) or (exclude and real == os.path.realpath(exclude)):
            continue
        if not any(real == r or real.startswith(r + "/") for r in roots):
            roots.add(real)
    return sorted(roots)


def _warm_up() -> None:
    """One pytest run on a throwaway test, so every builtin plugin is imported before the first fork."""
    import pytest  # noqa: PLC0415 - pytest is a dev extra, not a t1 dependency; only the server runs it

    with tempfile.TemporaryDirectory(prefix="t1-verify-warmup-") as tmp:
        Path(tmp, "t1_verifier_warmup_test.py").write_text(
            "import pytest\n\ndef test_ok():\n    assert 1 + 1 == 2\n\n"
            "@pytest.mark.parametrize('x', [1])\ndef test_param(x):\n    assert x\n")
        with open(os.devnull, "wb") as sink:
            args = [a if a != "/tests" else tmp for a in PYTEST_ARGS]
            pytest.main([tmp, *args], plugins=[OutcomeReporter(sink.fileno())])
    for name in [m for m in sys.modules if m.startswith("t1_verifier_warmup")]:
        del sys.modules[name]


class _Job:
    def __init__(self, request: dict, pid: int, fd: int, cgroup: CommandCgroup):
        self.request = request
        self.pid = pid
        self.fd = fd
        self.cgroup = cgroup
        self.buffer = bytearray()
        self.start = time.monotonic()
        self.deadline = self.start + float(request["timeout_s"])
        self.timed_out = False


def main(project: str | None = None) -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints (pytest's) go to stderr, never into the protocol
    _warm_up()
    sys.stdout.flush()  # or the children inherit the warm-up's buffered output
    sys.stderr.flush()
    gc.freeze()  # the warm heap moves to the permanent generation: children's collections skip it (no COW)
    trusted = trusted_mounts(exclude=project)
    protocol.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    jobs: dict[int, _Job] = {}
    client_gone = False

    def send(record: dict) -> None:
        nonlocal client_gone
        if client_gone:
            return
        try:
            protocol.write(json.dumps(record) + "\n")
        except BrokenPipeError:  # the client died (its actor was killed): nobody wants the results in flight,
            client_gone = True   # but every job is still reaped and its cgroup removed before this server exits
            for job in jobs.values():
                job.cgroup.kill()
            try:
                protocol.close()
            except OSError:
                pass

    selector = selectors.DefaultSelector()
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    pending = bytearray()
    stdin_open = True
    while stdin_open or jobs:
        now = time.monotonic()
        for job in jobs.values():
            if not job.timed_out and now >= job.deadline:
                job.timed_out = True
                job.cgroup.kill()
        timeout = max(0.0, min((j.deadline for j in jobs.values() if not j.timed_out), default=now + 1.0) - now)
        for key, _ in selector.select(timeout=min(timeout, 1.0)):
            if key.fd == sys.stdin.fileno():
                data = os.read(key.fd, 1 << 16)
                if not data:
                    stdin_open = False
                    selector.unregister(key.fd)
                    continue
                pending.extend(data)
                while b"\n" in pending:
                    line, _, rest = bytes(pending).partition(b"\n")
                    pending = bytearray(rest)
                    job = _start(json.loads(line), trusted)
                    if isinstance(job, dict):
                        send(job)
                    else:
                        jobs[job.fd] = job
                        selector.register(job.fd, selectors.EVENT_READ)
            else:
                job = jobs[key.fd]
                data = os.read(key.fd, 1 << 16)
                if data:
                    job.buffer.extend(data)
                    continue
                selector.unregister(key.fd)
                del jobs[key.fd]
                send(_finish(job))


def _start(request: dict, trusted: list[str]) -> _Job | dict:
    try:
        cgroup = CommandCgroup(f"verify-{os.getpid()}-{request['id']}",
                               CgroupLimits(int(request["memory_bytes"]), int(request["pids"])))
    except Exception as exc:  # reported to the client as an infrastructure error
        return {"id": request["id"], "infra_error": f"verifier cgroup: {exc}"}
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns
        os.close(read_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the request pipe, and below the protocol pipe: the tests must reach neither
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, 1 << 16)
        code = 70
        try:
            cgroup.enter()
            code = _child(request, trusted, write_fd)
        except BaseException:  # whatever broke is reported through the pipe
            _emit(write_fd, infra_error=traceback.format_exc(limit=4)[-1500:])
        finally:
            os._exit(code)
    os.close(write_fd)
    return _Job(request, pid, read_fd, cgroup)


def _finish(job: _Job) -> dict:
    os.waitpid(job.pid, 0)
    job.cgroup.remove()
    os.close(job.fd)
    text = bytes(job.buffer).decode("utf-8", "replace")
    tests, collected, infra_error, tampered = parse_outcomes(text)
    phases: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('{"phase"'):  # timings, for diagnosis only
            try:
                record = json.loads(line)
                phases[str(record["phase"])] = round(float(record["t"]) - job.start, 4)
            except (ValueError, KeyError, TypeError):
                pass
    scratch = Path(job.request["scratch"])
    log = ""
    try:
        log = (scratch / "pytest.log").read_bytes()[-4000:].decode("utf-8", "replace")
    except OSError:
        pass
    phases["reaped"] = round(time.monotonic() - job.start, 4)
    remove_tree(scratch)
    phases["cleaned"] = round(time.monotonic() - job.start, 4)
    return {"id": job.request["id"], "phases": phases, "tests": tests, "collected": collected, "tampered": tampered,
            "timed_out": job.timed_out,
            "infra_error": infra_error, "duration_s": time.monotonic() - job.start, "log": log}


def _emit(fd: int, **record) -> None:
    os.write(fd, (json.dumps(record) + "\n").encode())


def _child(request: dict, trusted: list[str], result_fd: int) -> int:
    """Build the verification root in fresh namespaces and run pytest in it (pid 1 of its pid namespace)."""
    linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWPID | linux.CLONE_NEWNET | linux.CLONE_NEWIPC
                  | linux.CLONE_NEWUTS)
    linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
    pid = os.fork()  # the first child of a new pid namespace is its pid 1: all of it dies with it
    if pid:
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) & 0xFF
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    scratch = Path(request["scratch"])
    log_fd = os.open(scratch / "pytest.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    trial = request["trial_root"]
    stack = RootStack.from_json(trial["stack"])
    view = RootStack(stack.skeleton, (Layer(Path(trial["upper"])), *stack.layers), stack.system_dirs)
    root = scratch / "root"
    root.mkdir()
    view.mount(root, Layer(scratch / "upper").create(stack.system_dirs), scratch / "work")
    _plain_dir(root, "/tests")
    linux.bind(request["tests_dir"], str(root / "tests"), read_only=True)
    extra = [str(p) for p in request.get("extra_paths", [])]  # the verifier's installs of the tests' deps
    for path in [*trusted, *extra]:
        _plain_dir(root, path)
        linux.bind(path, str(root) + path, read_only=True, recursive=False)
    _mount_proc_dev(root)
    os.chdir(root)
    linux.pivot_root(".", ".")
    linux.umount(".")
    os.chdir("/")
    linux.set_loopback_up()
    linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    linux.limit_capabilities()
    workdir = request["workdir"] if os.path.isdir(request["workdir"]) else "/"
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update({**request["env"], "TEST_DIR": "/tests", "PYTHONDONTWRITEBYTECODE": "1",
                       "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.path[:] = [p for p in sys.path if p and any(p == t or p.startswith(t + "/") for t in trusted)] + extra
    sys.dont_write_bytecode = True
    import pytest  # noqa: PLC0415 - pytest is a dev extra, not a t1 dependency; only the server runs it

    targets = [f"/tests/{t}" for t in request["targets"]] or ["/tests"]
    _emit(result_fd, phase="setup", t=time.monotonic())
    reporter = OutcomeReporter(result_fd, "/tests")  # fingerprints pytest's reporting before collection
    code = pytest.main([*targets, *PYTEST_ARGS], plugins=[reporter])
    reporter.seal()
    _emit(result_fd, phase="pytest", t=time.monotonic())
    sys.stdout.flush()
    return int(code)


def _plain_dir(root: Path, path: str) -> None:
    """mkdir -p ``path`` inside ``root`` where no component may be a symlink (symlinks the agent planted
    are replaced, in the throwaway upper layer), so a bind never lands outside the root."""
    current = root
    for part in [p for p in path.split("/") if p]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
        if not current.exists():
            current.mkdir(mode=0o755)


def _mount_proc_dev(root: Path) -> None:
    _plain_dir(root, "/proc")
    linux.mount("proc", str(root / "proc"), "proc", linux.MS_NOSUID | linux.MS_NODEV)
    _plain_dir(root, "/dev")
    linux.mount("tmpfs", str(root / "dev"), "tmpfs", linux.MS_NOSUID, "mode=755,size=65536k")
    for name in _DEVICES:
        if os.path.exists(f"/dev/{name}"):
            (root / "dev" / name).touch()
            linux.bind(f"/dev/{name}", str(root / "dev" / name))
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, root / "dev" / name)
    (root / "dev" / "shm").mkdir()
    linux.mount("tmpfs", str(root / "dev" / "shm"), "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "mode=1777")
    for name in ("tmp",):
        _plain_dir(root, f"/{name}")


if __name__ == "__main__":
    main()
