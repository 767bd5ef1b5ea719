"""Re-check a run's verifier results: checksums against the task sources, consistency, tamper flags.

For every ``VerifierResult`` in the log:

- ``verifier_sha256`` is recomputed from the task's test files as they are now
  (``t1_actors.verify.engine.tree_sha256``) - a mismatch means the tests the run was scored with are not
  the tests in the source (edited since, or the verifier's store was tampered with);
- the result is internally consistent: P equals the number of tests whose outcome is ``passed``, total the
  number of tests, reward = P / S with the recipe's fixed S (1[P = N] for a binary-reward run's results,
  ``reward_kind``);
- tamper flags (what the agent tried: edited tests, planted conftest.py, a fake pytest...) are listed.

The log's own chunk checksums are verified too (``EventLog.verify``).
"""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from schemas import VerifierResult
from storage import CorruptionError, EventLog
from t1_actors.tasks import TasksConfig, build_task_sets, load_tasks
from t1_actors.train.reward import REWARD_SCALE, task_reward
from t1_actors.verify.engine import tree_sha256

REWARD_TOLERANCE = 1e-6


@dataclass
class VerifierAudit:
    results: int = 0
    checked: int = 0
    mismatches: list[dict] = field(default_factory=list)
    inconsistent: list[dict] = field(default_factory=list)
    tampered: list[dict] = field(default_factory=list)
    infra_errors: int = 0
    no_source: Counter = field(default_factory=Counter)
    log_integrity: dict | str | None = None

    @property
    def ok(self) -> bool:
        """Nothing wrong found AND something was checked: results whose tasks no source holds prove nothing."""
        unchecked = self.results > 0 and self.checked == 0
        return not (self.mismatches or self.inconsistent or unchecked or isinstance(self.log_integrity, str))

    def to_json(self) -> dict:
        return {"ok": self.ok, "results": self.results, "checksums_checked": self.checked,
                "checksum_mismatches": self.mismatches, "inconsistent": self.inconsistent,
                "tamper_flags": self.tampered, "tamper_flag_counts": dict(Counter(f for t in self.tampered
                                                                                  for f in t["flags"])),
                "infra_errors": self.infra_errors, "tasks_without_source": dict(self.no_source),
                "problem": ("no result could be checked: no task source holds the run's task ids (pass --tasks "
                            "DIR or --config; a synthetic corpus regenerates only with the generator the run used)"
                            if self.results and not self.checked else None),
                "log_integrity": self.log_integrity}


def check_result(audit: VerifierAudit, event_id: str, result: VerifierResult, expected_sha: str | None,
                 reward_scale: int | None = None) -> None:
    """Add one VerifierResult to ``audit``. ``expected_sha``: the task source's tests checksum, if known."""
    audit.results += 1
    where = {"event": event_id, "trial_id": result.trial_id, "task_id": result.task_id}
    if result.infra_error:
        audit.infra_errors += 1
    if result.tamper_flags:
        audit.tampered.append({**where, "flags": list(result.tamper_flags)})
    if expected_sha is None:
        audit.no_source[result.task_id] += 1
    else:
        audit.checked += 1
        if expected_sha != result.verifier_sha256:
            audit.mismatches.append({**where, "recorded": result.verifier_sha256, "source": expected_sha})
    problems = []
    if result.infra_error is None:
        passed = sum(1 for outcome in result.tests.values() if outcome == "passed")
        if passed != result.passed:
            problems.append(f"P={result.passed} but {passed} tests passed")
        if len(result.tests) != result.total:
            problems.append(f"total={result.total} but {len(result.tests)} tests reported")
        expected = task_reward(result.reward_kind, result.passed, result.total, result.reward_scale)
        if abs(result.reward - expected) > REWARD_TOLERANCE:
            equation = (f"P/S = {result.passed}/{result.reward_scale}" if result.reward_kind == "dense"
                        else f"1[P = N] with P = {result.passed}, N = {result.total}")
            problems.append(f"reward {result.reward} != {equation} ({result.reward_kind} reward)")
    if reward_scale is not None and result.reward_scale != reward_scale:
        problems.append(f"S={result.reward_scale}, the recipe fixes S={reward_scale}")
    if problems:
        audit.inconsistent.append({**where, "problems": problems})


CONFIG_NAMES = ("config.resolved.json", "config.toml", "config.json")  # the campaign writes the first


def task_sources(tasks_dirs: list[Path], config: Path | None) -> tuple[dict[str, str], list[str]]:
    """Checksum of every task's tests by id, from task directories and the run config's [tasks] section
    (the synthetic corpus is regenerated from it, deterministically by seed). Also names the sources."""
    expected: dict[str, str] = {}
    names = []
    for directory in tasks_dirs:
        for task in load_tasks(directory):
            expected[task.id] = tree_sha256(task.tests.files)
        names.append(str(directory))
    if config is not None:
        raw = tomllib.loads(config.read_text()) if config.suffix == ".toml" else json.loads(config.read_text())
        section = raw.get("tasks", {})
        try:
            tasks_config = TasksConfig(**section)
        except ValueError as exc:
            raise ValueError(f"{config}: section [tasks] is not a valid TasksConfig: {exc}") from None
        for task_id, task in build_task_sets(tasks_config).by_id.items():
            expected[task_id] = tree_sha256(task.tests.files)
        names.append(f"{config} [tasks]")
    return expected, names


def audit_verifiers(view, expected: dict[str, str]) -> VerifierAudit:
    """Audit every VerifierResult of a run (``view``: a ``tools._replay.run.RunView``) against the
    tests checksums of the task sources (``task_sources``)."""
    audit = VerifierAudit()
    for event_id, result in view.of_kind(VerifierResult):
        check_result(audit, event_id, result, expected.get(result.task_id), REWARD_SCALE)
    try:
        chunks = EventLog.open(view.log_path).verify()
        audit.log_integrity = {"segments": len(chunks),
                               "chunks": sum(sum(arrays.values()) for arrays in chunks.values())}
    except CorruptionError as exc:
        audit.log_integrity = f"corrupted: {exc}"
    return audit
