"""`t1-audit`: audit tasks and verifiers, and plan capacity.

    t1-audit capacity [--devices G --tp --pp --ep ...] [--json]
    t1-audit tasks DIR [--json]
    t1-audit verifiers RUN [--json]
"""

from __future__ import annotations

import argparse
import sys

from tools._audit import capacity, tasks, verifiers

SUBCOMMANDS = {"capacity": capacity, "tasks": tasks, "verifiers": verifiers}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1-audit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return SUBCOMMANDS[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
