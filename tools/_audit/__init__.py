"""Subcommands of ``t1-audit``; each module has ``add_parser(subparsers)`` and ``run(args) -> int``."""
