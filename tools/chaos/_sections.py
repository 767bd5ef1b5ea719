"""The chaos report's sections beside the campaign: hostile commands in the sandbox and verifier tampering
(parts 4, 5), and the log's and the wire's faults (parts 2, 3: ``_log_faults``, ``_wire_faults``, each
``<section>_clean`` when its zeros are 0 over checked counts above 0 and its positive controls succeeded).

``run_sections(["sandbox", "tamper"])`` runs them (each needs root and the local sandbox's cgroups) and
returns their keys: ``sandbox_escapes_tried`` / ``sandbox_escapes_succeeded`` with ``sandbox_cases`` (each
case's outcome in the sandbox and its unconfined control), ``tamper_tried`` / ``tamper_undetected`` with
``tamper_methods``, ``positive_controls`` {tried, succeeded} over both, and ``not_tested`` entries for
what could not count as evidence. A section that was not selected, or cannot run here, has its keys in
``not_tested`` with the reason, never a figure.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from t1_actors.backends._sandbox import cgroups

SECTIONS = ("campaign", "sandbox", "tamper", "log", "wire")
SECTION_KEYS = {"sandbox": ("sandbox_escapes_tried", "sandbox_escapes_succeeded"),
                "tamper": ("tamper_tried", "tamper_undetected"),
                "log": ("writer_crash_points", "torn_reads", "enospc_lost_committed", "bitflips_undetected"),
                "wire": ("frames_fuzzed", "frames_accepted_forged", "hostile_peers", "heartbeats_missed")}
ZEROS = {"sandbox": "sandbox_escapes_succeeded", "tamper": "tamper_undetected"}
TRIED = {"sandbox": "sandbox_escapes_tried", "tamper": "tamper_tried"}
# log and wire (``_log_faults``, ``_wire_faults``; no root needed but for the full disk, which says so):
# what must be 0 (or false), each with the count that shows something was checked
FAULT_ZEROS = {"log": (("torn_reads", "reads_checked"), ("acked_lost", "reads_checked"),
                       ("enospc_lost_committed", "enospc_committed_checked"),
                       ("bitflips_undetected_data_changed", "bitflips_tried"), ("bitflips_misnamed", "bitflips_tried")),
               "wire": (("frames_accepted_forged", "frames_fuzzed"), ("heartbeats_missed", "pings_checked"),
                        ("actor_crashed", "pings_checked"))}


def unavailable() -> str | None:
    """Why the sections cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root (the local sandbox: mounts and cgroups)"

    return cgroups.available()


def run_sections(selected: list[str], directory: Path | None = None, say=lambda line: None) -> dict[str, Any]:
    """Run the selected sections (of ``sandbox``, ``tamper``, ``log``, ``wire``); the report's keys for them."""
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
            from tools.chaos._hostile import run_hostile  # noqa: PLC0415 - each section's module when it runs (keeps chaos --help at 0.3 s)

            part = run_hostile(where, say=say)
        else:
            from tools.chaos._tamper import run_tamper  # noqa: PLC0415 - each section's module when it runs (keeps chaos --help at 0.3 s)

            part = run_tamper(where, say=say)
        found = part.pop(f"{section}_positive_controls")
        controls = {k: controls[k] + found[k] for k in controls}
        not_tested += part.pop(f"{section}_not_tested")
        report.update(part)
    for section in ("log", "wire"):
        if section not in selected:
            not_tested += [{"key": key, "reason": "not selected (--only)"} for key in SECTION_KEYS[section]]
            continue

        where = directory / section if directory is not None else Path(tempfile.mkdtemp(prefix=f"t1-chaos-{section}-"))
        if section == "log":
            from tools.chaos._log_faults import log_faults  # noqa: PLC0415 - each section's module when it runs (keeps chaos --help at 0.3 s)

            part = log_faults(where, say=say)
        else:
            from tools.chaos._wire_faults import wire_faults  # noqa: PLC0415 - each section's module when it runs (keeps chaos --help at 0.3 s)

            part = wire_faults(where, say=say)
        found = part.pop(f"{section}_positive_controls")  # {control: succeeded}
        controls = {"tried": controls["tried"] + len(found), "succeeded": controls["succeeded"] + sum(found.values())}
        report.setdefault("positive_controls_each", {}).update(found)
        untested = part.pop(f"{section}_not_tested", [])
        not_tested += untested
        skipped = {entry["key"] for entry in untested}
        part[f"{section}_clean"] = (bool(found) and all(found.values())
                                    and all(not part.get(zero) and part.get(checked, 0) > 0
                                            for zero, checked in FAULT_ZEROS[section] if zero not in skipped))
        report.update(part)
    if controls["tried"]:
        report["positive_controls"] = controls
    else:
        not_tested.append({"key": "positive_controls", "reason": "they belong to the sandbox, tamper, log and "
                                                                 "wire sections, none of which ran"})
    report["sections_not_tested"] = not_tested
    return report


def sections_clean(report: dict[str, Any], selected: list[str]) -> bool:
    """Every selected section ran with something checked (tried > 0) and its must-be-zero count is 0."""
    return (all(report.get(TRIED[s], 0) > 0 and report.get(ZEROS[s]) == 0 for s in ("sandbox", "tamper")
                if s in selected)
            and all(report.get(f"{s}_clean") for s in ("log", "wire") if s in selected))
