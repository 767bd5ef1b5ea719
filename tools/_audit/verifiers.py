"""`t1-audit verifiers RUN`: re-check recorded verifier checksums against the task sources, list tamper flags."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from tools._output import console, fail, print_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verifiers", help="verifier checksums vs task sources, consistency, tamper flags",
                       description=__doc__)
    p.add_argument("run", help="run directory (RUN/log) or event log directory")
    p.add_argument("--tasks", action="append", default=None,
                   help="task source directory (repeatable; default RUN/tasks when it exists)")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from t1_actors.tasks.errors import TaskFormatError
    from tools._replay.run import RunError, RunView
    from tools.verifier_audit import audit_verifiers

    try:
        view = RunView.open(args.run)
    except RunError as exc:
        return fail(str(exc))
    dirs = [Path(d) for d in args.tasks] if args.tasks else [d for d in [view.root / "tasks"] if d.is_dir()]
    try:
        audit = audit_verifiers(view, dirs)
    except TaskFormatError as exc:
        return fail(str(exc))
    out = {"run": str(view.root), "task_sources": [str(d) for d in dirs], **audit.to_json()}
    if args.json:
        print_json(out)
    else:
        _render(out)
    return 0 if audit.ok else 1


def _render(out: dict) -> None:
    c = console()
    c.print(f"[bold]Verifiers[/bold] {out['run']}: {out['results']} results, {out['checksums_checked']} checksums "
            f"checked against {out['task_sources'] or 'no task source (pass --tasks DIR)'}")
    if out["checksum_mismatches"]:
        table = Table("trial", "task", "recorded sha256", "source sha256", title="checksum mismatches")
        for m in out["checksum_mismatches"]:
            table.add_row(m["trial_id"], m["task_id"], m["recorded"][:16], m["source"][:16])
        c.print(table)
    for item in out["inconsistent"]:
        c.print(f"[red]inconsistent[/red] {item['trial_id']} ({item['task_id']}): {'; '.join(item['problems'])}")
    if out["tamper_flags"]:
        table = Table("trial", "task", "tamper flags", title="tamper flags")
        for t in out["tamper_flags"]:
            table.add_row(t["trial_id"], t["task_id"], ", ".join(t["flags"]))
        c.print(table)
    else:
        c.print("no tamper flags")
    if out["tasks_without_source"]:
        c.print(f"tasks without a source: {len(out['tasks_without_source'])}")
    c.print(f"infrastructure errors: {out['infra_errors']}; log integrity: {out['log_integrity']}")
    c.print("[green]ok[/green]" if out["ok"] else "[red]FAILED[/red]")
