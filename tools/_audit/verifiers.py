"""`t1-audit verifiers RUN`: re-check recorded verifier checksums against the task sources, list tamper flags."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table
from rich.text import Text

from t1_actors.tasks.errors import TaskFormatError
from tools._audit.verifier_checks import CONFIG_NAMES, audit_verifiers, task_sources
from tools._output import console, fail, print_json, styled
from tools._replay.run import RunError, RunView


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verifiers", help="verifier checksums vs task sources, consistency, tamper flags",
                       description=__doc__)
    p.add_argument("run", help="run directory (RUN/log) or event log directory")
    p.add_argument("--tasks", action="append", default=None,
                   help="task source directory (repeatable; default RUN/tasks when it exists)")
    p.add_argument("--config", default=None,
                   help="the run's config (TOML/JSON); its [tasks] section regenerates the synthetic corpus "
                        "(default RUN/config.toml or RUN/config.json when present)")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    try:
        view = RunView.open(args.run)
    except RunError as exc:
        return fail(str(exc))
    dirs = [Path(d) for d in args.tasks] if args.tasks else [d for d in [view.root / "tasks"] if d.is_dir()]
    config = Path(args.config) if args.config else next(
        (view.root / n for n in CONFIG_NAMES if (view.root / n).is_file()), None)
    if config is not None and not config.is_file():
        return fail(f"--config {config}: no such file")
    try:
        expected, sources = task_sources(dirs, config)
    except (TaskFormatError, ValueError) as exc:
        return fail(str(exc))
    audit = audit_verifiers(view, expected)
    out = {"run": str(view.root), "task_sources": sources, **audit.to_json()}
    if args.json:
        print_json(out)
    else:
        _render(out)
    return 0 if audit.ok else 1


def _render(out: dict) -> None:
    c = console()
    c.print(styled(("Verifiers", "bold"), f" {out['run']}: {out['results']} results, {out['checksums_checked']} "
                   f"checksums checked against "
                   f"{out['task_sources'] or 'no task source (pass --tasks DIR or --config RUN_CONFIG)'}"))
    if out["checksum_mismatches"]:
        table = Table("trial", "task", "recorded sha256", "source sha256", title="checksum mismatches")
        for m in out["checksum_mismatches"]:
            table.add_row(m["trial_id"], m["task_id"], m["recorded"][:16], m["source"][:16])
        c.print(table)
    for item in out["inconsistent"]:
        c.print(styled(("inconsistent", "red"), f" {item['trial_id']} ({item['task_id']}): {'; '.join(item['problems'])}"))
    if out["tamper_flags"]:
        table = Table("trial", "task", "tamper flags", title="tamper flags")
        for t in out["tamper_flags"]:
            table.add_row(t["trial_id"], t["task_id"], ", ".join(t["flags"]))
        c.print(table)
    else:
        c.print("no tamper flags")
    if out["tasks_without_source"]:
        c.print(f"tasks without a source: {len(out['tasks_without_source'])}")
    if out["problem"]:
        c.print(Text(out["problem"], "red"))
    c.print(f"infrastructure errors: {out['infra_errors']}; log integrity: {out['log_integrity']}")
    c.print(Text("ok", "green") if out["ok"] else Text("FAILED", "red"))
