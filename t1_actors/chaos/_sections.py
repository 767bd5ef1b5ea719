"""The chaos report's sections beside the campaign: hostile commands in the sandbox and verifier tampering.

``run_sections(["sandbox", "tamper"])`` runs them (each needs root and the local sandbox's cgroups) and
returns their keys: ``sandbox_escapes_tried`` / ``sandbox_escapes_succeeded`` with ``sandbox_cases`` (each
case's outcome in the sandbox and its unconfined control), ``tamper_tried`` / ``tamper_undetected`` with
``tamper_methods``, ``positive_controls`` {tried, succeeded} over both, and ``not_tested`` entries for
what could not count as evidence. A section that was not selected, or cannot run here, has its keys in
``not_tested`` with the reason, never a figure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SECTIONS = ("campaign", "sandbox", "tamper")
SECTION_KEYS = {"sandbox": ("sandbox_escapes_tried", "sandbox_escapes_succeeded"),
                "tamper": ("tamper_tried", "tamper_undetected")}
ZEROS = {"sandbox": "sandbox_escapes_succeeded", "tamper": "tamper_undetected"}
TRIED = {"sandbox": "sandbox_escapes_tried", "tamper": "tamper_tried"}


def unavailable() -> str | None:
    """Why the sections cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root (the local sandbox: mounts and cgroups)"
    from ..backends._sandbox import cgroups

    return cgroups.available()


def run_sections(selected: list[str], directory: Path | None = None, say=lambda line: None) -> dict[str, Any]:
    """Run the selected sections (of ``sandbox``, ``tamper``); the report's keys for them."""
    report: dict[str, Any] = {}
    not_tested: list[dict[str, str]] = []
    controls = {"tried": 0, "succeeded": 0}
    problem = unavailable()
    for section in ("sandbox", "tamper"):
        if section not in selected or problem:
            reason = f"not run here: {problem}" if section in selected else "not selected (--only)"
            not_tested += [{"key": key, "reason": reason} for key in SECTION_KEYS[section]]
            continue
        where = directory / section if directory is not None else None
        if section == "sandbox":
            from ._hostile import run_hostile

            part = run_hostile(where, say=say)
        else:
            from ._tamper import run_tamper

            part = run_tamper(where, say=say)
        found = part.pop(f"{section}_positive_controls")
        controls = {k: controls[k] + found[k] for k in controls}
        not_tested += part.pop(f"{section}_not_tested")
        report.update(part)
    if controls["tried"]:
        report["positive_controls"] = controls
    else:
        not_tested.append({"key": "positive_controls", "reason": "they belong to the sandbox and tamper sections, "
                                                                 "none of which ran"})
    report["sections_not_tested"] = not_tested
    return report


def sections_clean(report: dict[str, Any], selected: list[str]) -> bool:
    """Every selected section ran with something checked (tried > 0) and its must-be-zero count is 0."""
    return all(report.get(TRIED[s], 0) > 0 and report.get(ZEROS[s]) == 0 for s in ("sandbox", "tamper")
               if s in selected)
