"""`t1-actor`: launch actors (roles arrive with the runtime)."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="t1-actor", description="Launch and run t1 actors.")
    parser.add_argument("--version", action="version", version=f"t1 {__version__}")
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
