"""Sandbox and verifier throughput, measured side by side in one run.

- tool calls/s on the local backend (bubblewrap + cgroup + rlimits + capped output) vs a bare
  ``subprocess.run(["/bin/sh", "-c", cmd])`` of the same commands on the host, interleaved call by
  call so both see the same load: ``exec_ratio``;
- sandbox open+close/s (overlay mounts over a cached image);
- verifications/s through the forkserver, with ``--workers`` concurrent callers, vs a cold
  ``python -m pytest`` subprocess of the same tests (no sandbox at all): ``verify_speedup_vs_cold_pytest``.

Usage: python bench/sandbox.py [--calls 200] [--verifications 40] [--workers 2]. Needs root (cgroups, mounts).
The last line is one JSON object (with the 1-minute load average, since the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig
from t1_actors.tasks.model import Environment, FileSpec, Task
from t1_actors.tasks.model import Tests as TaskTests
from t1_actors.verify.engine import Verifier, VerifierConfig

COMMANDS = ["echo hello", "ls /app", "cat /app/in.txt | wc -c", "mkdir -p /app/d && touch /app/d/f", "true"]
TESTS = "\n".join(f"def test_{i}():\n    assert open('/app/in.txt').read().startswith('line')\n" for i in range(4))


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def bench_exec(backend: LocalSandboxBackend, task: Task, calls: int) -> dict:
    """Bare and sandboxed calls interleaved one by one, so both see the same machine load."""
    bare_s = sandbox_s = 0.0
    with tempfile.TemporaryDirectory() as host_dir, backend.open(task, "bench-exec") as sandbox:
        Path(host_dir, "in.txt").write_text("line\n")
        bare_commands = [c.replace("/app", host_dir) for c in COMMANDS]
        sandbox.exec("true")
        for i in range(calls):
            start = time.perf_counter()
            subprocess.run(["/bin/sh", "-c", bare_commands[i % len(COMMANDS)]], capture_output=True)
            middle = time.perf_counter()
            result = sandbox.exec(COMMANDS[i % len(COMMANDS)])
            sandbox_s += time.perf_counter() - middle
            bare_s += middle - start
            assert result.exit_code == 0, result.stderr
    opens = max(10, calls // 10)
    start = time.perf_counter()
    for i in range(opens):
        backend.open(task, f"bench-open-{i}").close()
    bare, sandboxed = rate(calls, bare_s), rate(calls, sandbox_s)
    return {"bare_calls_per_s": round(bare, 1), "sandbox_calls_per_s": round(sandboxed, 1),
            "exec_ratio": round(sandboxed / bare, 3), "open_close_per_s": round(rate(opens, time.perf_counter() - start), 1)}


def bench_verify(backend: LocalSandboxBackend, verifier: Verifier, task: Task, count: int, workers: int) -> dict:
    with backend.open(task, "bench-verify") as sandbox:
        first = verifier.verify(task, sandbox.trial_root)  # starts the forkserver
        assert first.passed == 4, (first.infra_error, first.tests, first.log_tail)
        done = []
        lock = threading.Lock()

        def worker(n: int) -> None:
            for _ in range(n):
                outcome = verifier.verify(task, sandbox.trial_root)
                with lock:
                    done.append(outcome.passed)

        share = [count // workers + (1 if i < count % workers else 0) for i in range(workers)]
        threads = [threading.Thread(target=worker, args=(n,)) for n in share]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        per_s = rate(count, time.perf_counter() - start)
        assert done == [4] * count
    with tempfile.TemporaryDirectory() as tests_dir:
        Path(tests_dir, "test_outputs.py").write_text(TESTS.replace("/app/in.txt", f"{tests_dir}/in.txt"))
        Path(tests_dir, "in.txt").write_text("line\n")
        cold_runs = max(3, count // 10)
        start = time.perf_counter()
        for _ in range(cold_runs):
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests_dir],
                           capture_output=True, check=True)
        cold = rate(cold_runs, time.perf_counter() - start)
    return {"verify_per_s": round(per_s, 2), "cold_pytest_per_s": round(cold, 2),
            "verify_speedup_vs_cold_pytest": round(per_s / cold, 2), "verify_workers": workers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--verifications", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="t1-bench-") as base:
        backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=f"{base}/sandbox"))
        task = Task(id="bench", family="bench", instruction="-", tests=TaskTests(files={"test_outputs.py": TESTS}),
                    environment=Environment(files={"/app/in.txt": FileSpec(content="line\n")}))
        result = bench_exec(backend, task, args.calls)
        print(f"exec: bare {result['bare_calls_per_s']}/s, sandboxed {result['sandbox_calls_per_s']}/s "
              f"(ratio {result['exec_ratio']}), open+close {result['open_close_per_s']}/s", flush=True)
        with Verifier(VerifierConfig(base_dir=f"{base}/verifier")) as verifier:
            result.update(bench_verify(backend, verifier, task, args.verifications, args.workers))
        print(f"verify: {result['verify_per_s']}/s with {args.workers} workers, cold pytest "
              f"{result['cold_pytest_per_s']}/s (x{result['verify_speedup_vs_cold_pytest']})", flush=True)
        backend.close()
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
