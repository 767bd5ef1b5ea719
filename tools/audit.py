"""`t1-audit`: audit tasks and verifiers, and plan capacity.

    t1-audit capacity [--devices G --tp --pp --ep ...] [--json]
    t1-audit tasks DIR [--json]
    t1-audit verifiers RUN [--json]
"""

from __future__ import annotations

import argparse
import sys

from tools._audit import capacity


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1-audit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _subcommands():
        module.add_parser(sub)
    return parser


def _subcommands() -> list:
    return [capacity]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return args.run(args) if hasattr(args, "run") else _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    for module in _subcommands():
        if module.__name__.rsplit(".", 1)[-1] == args.command:
            return module.run(args)
    raise SystemExit(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
