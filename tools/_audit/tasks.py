"""`t1-audit tasks DIR`: executed audit of every task under DIR (own, Terminal-Bench or Harbor format)."""

from __future__ import annotations

import argparse

from rich.table import Table
from rich.text import Text

from t1_actors.tasks import load_tasks
from t1_actors.tasks.errors import TaskFormatError
from tools._audit.task_checks import audit_task
from tools._audit.task_runner import LocalTrialRunner
from tools._output import console, fail, print_json, styled

GATES = ("oracle_passes", "noop_fails", "no_shortcut", "no_leakage", "no_hidden_requirement")
HEADERS = ("oracle", "no-op", "shortcut", "leakage", "hidden req.")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tasks", help="executed audit of tasks: hard gates and soft dimensions",
                       description=__doc__)
    p.add_argument("dir", help="a task directory or a tree of them")
    p.add_argument("--task", action="append", default=None, help="only this task id (repeatable)")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    try:
        tasks = load_tasks(args.dir)
    except TaskFormatError as exc:
        return fail(str(exc))
    if args.task:
        unknown = set(args.task) - {t.id for t in tasks}
        if unknown:
            return fail(f"no task {sorted(unknown)} under {args.dir} (found {len(tasks)}: "
                        f"{', '.join(t.id for t in tasks[:5])}{'…' if len(tasks) > 5 else ''})")
        tasks = [t for t in tasks if t.id in args.task]
    if not tasks:
        return fail(f"no tasks under {args.dir}")
    with LocalTrialRunner() as runner:
        audits = [audit_task(task, runner) for task in tasks]
    failed = [a.task_id for a in audits if not a.ok]
    out = {"dir": str(args.dir), "tasks": len(audits), "passed": len(audits) - len(failed), "failed": failed,
           "gate_failures": {g: sum(1 for a in audits for x in a.gates if x.name == g and not x.passed) for g in GATES},
           "audits": [a.to_json() for a in audits]}
    if args.json:
        print_json(out)
    else:
        _render(audits, out)
    return 1 if failed else 0


def _render(audits, out: dict) -> None:
    c = console()
    table = Table("task", "format", *HEADERS, "words", "tests", "no-op",
                  "determ.", "partial")
    for a in audits:
        gates = {g.name: g.passed for g in a.gates}
        s = a.soft
        table.add_row(a.task_id, a.source_format,
                      *[(Text("ok", "green") if gates[g] else Text("FAIL", "red")) if g in gates else "-" for g in GATES],
                      str(s.get("instruction_words", "-")), str(s.get("tests", "-")),
                      _share(s.get("noop_pass_share")), str(s.get("oracle_deterministic", "-")),
                      _share(s.get("partial_credit_share")))
    c.print(table)
    for a in audits:
        for g in a.gates:
            if not g.passed:
                c.print(styled((a.task_id, "red"), f" {g.name}: {g.detail}"))
        if a.error:
            c.print(styled((a.task_id, "red"), f" error: {a.error}"))
    c.print(f"{out['passed']}/{out['tasks']} tasks pass every gate")


def _share(value) -> str:
    return "-" if value is None else f"{value:.2f}"
