"""`t1-actor run-task TASK_DIR [--oracle] [--json]`: one task, one local sandbox, then the verifier.

Runs the task's oracle solution with ``--oracle`` (nothing otherwise: a no-op agent), then the task's own
tests from the verifier, and prints the tests' total, P, the reward P/S and whether it is resolved.
Exit status: 0 resolved, 1 not resolved, 2 the task or the arguments are bad, 3 infrastructure failure.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time

from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig, SandboxInfraError
from t1_actors.tasks.errors import TaskFormatError
from t1_actors.tasks.formats import load_task

ORACLE_PATH = "/tmp/t1-oracle/solve.sh"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="t1-actor run-task", description=__doc__.splitlines()[0])
    parser.add_argument("task_dir", metavar="TASK_DIR", help="a task directory (own, Terminal-Bench or Harbor format)")
    parser.add_argument("--oracle", action="store_true", help="run the task's oracle solution before verifying")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--sandbox-dir", default=LocalSandboxConfig().base_dir, help="local sandbox base directory")
    parser.add_argument("--verifier-dir", default=None, help="verifier base directory (pristine tests, scratch)")
    args = parser.parse_args(argv)

    from t1_actors.verify.engine import Verifier, VerifierConfig  # noqa: PLC0415 - keeps run-task --help free of torch (verify.engine: 1.6 s importtime)

    try:
        task = load_task(args.task_dir)
    except TaskFormatError as exc:
        print(f"run-task: {exc}", file=sys.stderr)
        return 2
    if args.oracle and task.oracle is None:
        print(f"run-task: task {task.id} has no oracle solution (Harbor: solution/solve.sh; Terminal-Bench: "
              f"solution.sh); run without --oracle", file=sys.stderr)
        return 2

    start = time.monotonic()
    report: dict = {"task_id": task.id, "format": task.source_format, "oracle": args.oracle}
    verifier = Verifier(VerifierConfig(**({"base_dir": args.verifier_dir} if args.verifier_dir else {})))
    try:
        backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=args.sandbox_dir))
        with backend.open(task, f"run-task-{task.id}-{secrets.token_hex(3)}") as sandbox:
            report["build"] = {"base_image": sandbox.build.base_image, "unhonoured": sandbox.build.unhonoured,
                               "cached": sandbox.build.cached}
            if args.oracle:
                script, files = task.oracle.layout(ORACLE_PATH)
                for path, data in files.items():
                    sandbox.write_file(path, data, 0o755)
                ran = sandbox.exec(f"if command -v bash >/dev/null; then bash {script}; else sh {script}; fi",
                                   timeout_s=task.limits.agent_timeout_s)
                report["oracle_exit_code"] = ran.exit_code
                report["oracle_output_tail"] = (ran.stdout + ran.stderr)[-2000:]
            outcome = verifier.verify(task, sandbox.trial_root)
    except SandboxInfraError as exc:
        report.update(tests_total=0, passed=0, reward=0.0, resolved=False, infra_error=str(exc))
        return _finish(report, args.json, 3)
    finally:
        verifier.close()
    report.update(tests_total=outcome.total, passed=outcome.passed, reward=outcome.reward,
                  reward_scale=outcome.reward_scale, resolved=outcome.resolved, tests=outcome.tests,
                  tamper_flags=outcome.tamper_flags, infra_error=outcome.infra_error,
                  verifier_sha256=outcome.verifier_sha256, duration_s=round(time.monotonic() - start, 3))
    code = 3 if outcome.infra_error else 0 if outcome.resolved else 1
    return _finish(report, args.json, code)


def _finish(report: dict, as_json: bool, code: int) -> int:
    if as_json:
        print(json.dumps(report, sort_keys=True))
        return code
    print(f"task        {report['task_id']} ({report['format']}){'  oracle' if report['oracle'] else ''}")
    if report.get("build", {}).get("unhonoured"):
        print("not honoured: " + "; ".join(report["build"]["unhonoured"]))
    if "oracle_exit_code" in report:
        print(f"oracle exit {report['oracle_exit_code']}")
    for nodeid, outcome in sorted(report.get("tests", {}).items()):
        print(f"  {outcome:8s} {nodeid}")
    print(f"tests       {report['tests_total']}")
    print(f"passed (P)  {report['passed']}")
    print(f"reward      {report['reward']:.4f}  (P / {report.get('reward_scale', 20)})")
    print(f"resolved    {'yes' if report['resolved'] else 'no'}")
    if report.get("tamper_flags"):
        print("tampering   " + ", ".join(report["tamper_flags"]))
    if report.get("infra_error"):
        print(f"infra error {report['infra_error']}")
    return code


if __name__ == "__main__":
    sys.exit(main())
