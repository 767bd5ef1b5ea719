"""Shared output helpers of the t1 tools: one JSON object on stdout, or rich tables for people."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from rich.console import Console
from rich.text import Text


def console() -> Console:
    """A console that never reads markup: commands, test ids and task text contain brackets."""
    wide = None if sys.stdout.isatty() else 160  # piped output: do not squeeze tables into 80 columns
    return Console(file=sys.stdout, highlight=False, soft_wrap=True, width=wide, markup=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Plain and (text, style) parts as one rich Text: ``styled(("Trial", "bold"), " t-1")``."""
    return Text.assemble(*parts)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; null says "not measured"
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _clean(value.item())
    return value


def print_json(obj: dict) -> None:
    """Exactly one JSON object on stdout."""
    sys.stdout.write(json.dumps(_clean(obj), sort_keys=False) + "\n")
    sys.stdout.flush()


def fail(message: str, code: int = 2) -> int:
    """A clear error on stderr; the exit code for the caller to return."""
    sys.stderr.write(f"error: {message}\n")
    return code
