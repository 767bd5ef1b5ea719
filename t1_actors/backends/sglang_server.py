"""Start and stop a real SGLang server on the CPU for a t1 policy directory (``t1-sglang-serve``).

SGLang lives in its own venv (``.ci/setup-sglang`` makes it: SGLang pins a torch that t1's environment
cannot share). Its place: ``$T1_SGLANG_VENV``, else ``.venv-sglang`` at the repository root.

    with SGLangServer.start("runs/R/weights/v00000", context_length=1024, max_concurrent=16) as server:
        ...  # server.url, server.engine (name, version, start id)
    # stopped here: SIGTERM to its process group, SIGKILL after a grace period

Guarantees:

- ``start`` returns only once ``GET /health`` answers 200; if the process exits first, or the deadline
  passes, the server is stopped and ``SGLangServerError`` names the URL and quotes the log's tail.
- The server runs in its own process group; ``stop`` ends the whole group (scheduler and detokenizer
  processes included) and is idempotent. A server started here is also stopped when this interpreter
  exits normally (atexit), so a crashed test or campaign does not leave one running.
- Flags: the CPU engine (``SGLANG_USE_CPU_ENGINE=1``, ``--device cpu``, torch-native attention, PyTorch
  sampling, no CUDA graphs), routed-experts capture, no tokenizer (t1 sends and receives token ids),
  ``--dtype`` from the checkpoint's config.json, ``--weight-version`` = the policy version it starts
  at, ``--context-length`` and ``--max-total-tokens`` = context length x concurrent requests (without
  it SGLang sizes its KV cache from free memory: ~14 GB here).
- Offline and quiet: Hugging Face hub offline, telemetry off. The stub ``libcuda.so.1`` the set-up built
  (SGLang's CUDA-only kernel package needs one to import) is on the server's ``LD_LIBRARY_PATH`` only.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from t1_actors.backends.sampler_backend import EngineInfo

REPO_ROOT = Path(__file__).resolve().parents[2]
BOOT = Path(__file__).with_name("_sglang_boot.py")
SETUP_HINT = "run `bash .ci/setup-sglang` (it makes the SGLang venv; `.ci/setup` calls it)"


class SGLangServerError(RuntimeError):
    """The SGLang server could not be started, died, or is not the one expected."""


def sglang_venv(override: str | Path | None = None) -> Path:
    """The SGLang venv: ``override``, else ``$T1_SGLANG_VENV``, else ``<repo>/.venv-sglang``."""
    chosen = override or os.environ.get("T1_SGLANG_VENV") or REPO_ROOT / ".venv-sglang"
    return Path(chosen).resolve()


def check_venv(venv: Path) -> Path:
    """The venv's python; ``SGLangServerError`` saying how to make it when it (or the stub) is missing."""
    python = venv / "bin" / "python"
    if not python.is_file():
        raise SGLangServerError(f"no SGLang venv at {venv} ({python} missing); {SETUP_HINT}")
    if not (venv / "t1-stub" / "libcuda.so.1").is_file():
        raise SGLangServerError(f"the SGLang venv at {venv} lacks t1-stub/libcuda.so.1; {SETUP_HINT}")
    return python


def server_env(venv: Path) -> dict[str, str]:
    """The server's environment: CPU engine, the stub driver library, offline, no telemetry, no t1 paths."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    stub = str(venv / "t1-stub")
    env.update(SGLANG_USE_CPU_ENGINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               DO_NOT_TRACK="1", PYTHONUNBUFFERED="1",
               LD_LIBRARY_PATH=":".join(p for p in (stub, os.environ.get("LD_LIBRARY_PATH", "")) if p))
    return env


def checkpoint_dtype(policy_dir: Path) -> str:
    """The dtype the checkpoint was written in (config.json ``torch_dtype``), what the server computes in."""
    config = json.loads((policy_dir / "config.json").read_text())
    return str(config.get("torch_dtype") or config.get("dtype") or "float32")


def server_args(policy_dir: Path, *, port: int, context_length: int, max_concurrent: int, dtype: str,
                weight_version: int, host: str = "127.0.0.1") -> list[str]:
    """``sglang.launch_server`` arguments of a CPU server for ``policy_dir``."""
    return ["--model-path", str(policy_dir), "--device", "cpu", "--attention-backend", "torch_native",
            "--sampling-backend", "pytorch", "--disable-cuda-graph", "--enable-return-routed-experts",
            "--skip-tokenizer-init", "--dtype", dtype, "--weight-version", str(weight_version),
            "--context-length", str(context_length), "--max-total-tokens", str(context_length * max_concurrent),
            "--max-running-requests", str(max_concurrent), "--host", host, "--port", str(port)]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def engine_from_server_info(reply: dict) -> EngineInfo:
    """Name, version and start id of a server from its ``GET /get_server_info`` answer.

    The start id hashes what differs between two starts of one server (its random seed, drawn at each
    start, its start-up timings, its port), so a restarted server, which has lost the weight versions it
    loaded, is told apart from the one that was running.
    """
    identity = json.dumps([reply.get("random_seed"), reply.get("startup_time"), reply.get("port")], sort_keys=True)
    return EngineInfo("sglang", str(reply.get("version", "unknown")), hashlib.sha256(identity.encode()).hexdigest()[:12])


def engine_info(url: str, timeout_s: float = 30.0) -> EngineInfo:
    """``engine_from_server_info`` of the server at ``url``."""
    try:
        response = httpx.get(f"{url}/get_server_info", timeout=timeout_s)
        response.raise_for_status()
        reply = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise SGLangServerError(f"SGLang server at {url} did not answer /get_server_info: {exc!r}") from exc
    if isinstance(reply, list) and reply:
        reply = reply[0]
    return engine_from_server_info(reply)


class SGLangServer:
    """A running SGLang server process group (see the module docstring for the guarantees)."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path):
        self.process, self.url, self.log_path = process, url, log_path
        self.engine: EngineInfo | None = None
        self.started_s = 0.0  # seconds from spawn to a healthy server

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, policy_dir: str | Path, *, context_length: int = 512, max_concurrent: int = 64,
              port: int | None = None, dtype: str | None = None, weight_version: int = 0,
              venv: str | Path | None = None, log_path: str | Path | None = None,
              start_timeout_s: float = 300.0) -> SGLangServer:
        """Spawn the server and wait for ``/health``; stopped again before any error is raised."""
        policy_dir = Path(policy_dir).resolve()
        if not (policy_dir / "config.json").is_file():
            raise SGLangServerError(f"{policy_dir} is not a policy directory (no config.json)")
        venv = sglang_venv(venv)
        python = check_venv(venv)
        port = port or free_port()
        url = f"http://127.0.0.1:{port}"
        if log_path is None:
            log_path = Path(tempfile.mkdtemp(prefix="t1-sglang-")) / "server.log"
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        args = server_args(policy_dir, port=port, context_length=context_length, max_concurrent=max_concurrent,
                           dtype=dtype or checkpoint_dtype(policy_dir), weight_version=weight_version)
        began = time.monotonic()
        with open(log_path, "ab") as log:
            process = subprocess.Popen([str(python), str(BOOT), *args], stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, env=server_env(venv), start_new_session=True)
        server = cls(process, url, log_path)
        _RUNNING.add(server)
        try:
            server._wait_healthy(start_timeout_s)
            server.engine = engine_info(url)
        except BaseException:
            server.stop()
            raise
        server.started_s = time.monotonic() - began
        return server

    def _wait_healthy(self, timeout_s: float) -> None:
        if (problem := wait_healthy(self.process, self.url, timeout_s)) is not None:
            raise SGLangServerError(f"SGLang server {problem}; log {self.log_path}:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL to whatever is left after ``grace_s``; idempotent."""
        _RUNNING.discard(self)
        stop_group(self.process, grace_s)

    def kill(self) -> None:
        """SIGKILL the whole group at once (a crash, as tests and fault drills need it)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        _RUNNING.discard(self)

    def __enter__(self) -> SGLangServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_healthy(process: subprocess.Popen, url: str, timeout_s: float) -> str | None:
    """Poll ``url``/health until it answers 200 (None), the process exits or ``timeout_s`` passes (what went
    wrong, as the end of a sentence naming the server)."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = process.poll()
        if code is not None:
            return f"for {url} exited with status {code} before it was healthy"
        try:
            if httpx.get(f"{url}/health", timeout=5.0).status_code == 200:
                return None
        except httpx.HTTPError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            return f"at {url} not healthy after {timeout_s:.0f} s"
        time.sleep(0.5)


def stop_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to ``process``'s group (it leads one: ``start_new_session``), SIGKILL to whatever is left after
    ``grace_s``; idempotent."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break  # the group is gone
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        if not group_alive(process.pid):
            break
        time.sleep(0.5)  # the leader exited; give its children a moment, then kill the rest
    process.poll()


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie does not: it only waits to be reaped, which
    a container's init may never do)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            return True
    return False


_RUNNING: set[SGLangServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop(grace_s=5.0)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t1-sglang-serve", description="Serve a t1 policy directory with SGLang on the "
                                "CPU until interrupted (Ctrl-C or SIGTERM stops the server's process group).")
    p.add_argument("policy_dir", help="an HF Qwen3-MoE directory (config.json + model.safetensors), e.g. RUN/weights/v00000")
    p.add_argument("--port", type=int, default=None, help="default: a free loopback port")
    p.add_argument("--context-length", type=int, default=512)
    p.add_argument("--max-concurrent", type=int, default=64, help="requests at once; KV cache = context x this")
    p.add_argument("--dtype", default=None, help="default: the checkpoint's torch_dtype")
    p.add_argument("--weight-version", type=int, default=0, help="the policy version the directory holds")
    p.add_argument("--venv", default=None, help="the SGLang venv (default $T1_SGLANG_VENV or .venv-sglang)")
    p.add_argument("--log", default=None, help="server log file (default: a temporary directory)")
    p.add_argument("--start-timeout-s", type=float, default=300.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    stop = {"asked": False}

    def ask_stop(*_):
        stop["asked"] = True

    signal.signal(signal.SIGTERM, ask_stop)
    signal.signal(signal.SIGINT, ask_stop)
    try:
        server = SGLangServer.start(args.policy_dir, context_length=args.context_length,
                                    max_concurrent=args.max_concurrent, port=args.port, dtype=args.dtype,
                                    weight_version=args.weight_version, venv=args.venv, log_path=args.log,
                                    start_timeout_s=args.start_timeout_s)
    except SGLangServerError as exc:
        print(f"t1-sglang-serve: {exc}", file=sys.stderr)
        return 1
    with server:
        print(json.dumps({"url": server.url, "pid": server.pid, "log": str(server.log_path),
                          "engine": server.engine.__dict__, "started_s": round(server.started_s, 1)}), flush=True)
        while not stop["asked"] and server.alive():
            time.sleep(0.5)
        if not server.alive():
            print(f"t1-sglang-serve: the server at {server.url} exited (status {server.process.returncode}); "
                  f"log {server.log_path}:\n{server.log_tail()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
