"""Where a local trial's root is recorded, and how another process on the host finds it by trial id.

Each trial's directory under ``<base_dir>/trials`` is named ``<trial id, made safe, at most 64 chars>-<8 hex>``
and holds ``trial.json``: its ``TrialRoot``, what the verifier needs to stack its own view on the trial's final
root. A trial id must name one open root on a base dir (``locate_trial`` refuses two).
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from t1_actors.backends._sandbox.interface import SandboxInfraError
from t1_actors.backends._sandbox.layers import Layer, RootStack

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
TRIAL_FILE = "trial.json"  # in each trial's directory: its TrialRoot, for the verifier


@dataclass(frozen=True)
class TrialRoot:
    """What the verifier needs to stack its own view on a trial's final root (same host, shared disk)."""

    trial_id: str
    stack: RootStack
    upper: Layer
    workdir: str
    env: dict[str, str]

    def to_json(self) -> dict:
        return {"trial_id": self.trial_id, "stack": self.stack.to_json(), "upper": str(self.upper.path),
                "workdir": self.workdir, "env": self.env}

    @classmethod
    def from_json(cls, data: dict) -> TrialRoot:
        return cls(data["trial_id"], RootStack.from_json(data["stack"]), Layer(Path(data["upper"])),
                   data["workdir"], data["env"])


def trial_dir_prefix(trial_id: str) -> str:
    """How a trial's directory (and its cgroups) is named, before its random suffix: the id with anything but
    ``[A-Za-z0-9._-]`` replaced by ``_``, cut at 64 characters, then ``-``."""
    return _SAFE.sub("_", trial_id)[:64] + "-"


def trial_roots(trials_dir: Path, trial_id: str) -> Iterator[tuple[Path, TrialRoot]]:
    """Each directory under ``trials_dir`` that records a root of ``trial_id``, with that root (a directory
    whose ``trial.json`` is missing, unreadable or another trial's is passed over)."""
    for directory in trials_dir.glob(f"{glob.escape(trial_dir_prefix(trial_id))}*"):
        try:
            root = TrialRoot.from_json(json.loads((directory / TRIAL_FILE).read_text()))
        except (OSError, ValueError, KeyError):
            continue
        if root.trial_id == trial_id:
            yield directory, root


def locate_trial(base_dir: str | os.PathLike, trial_id: str) -> TrialRoot:
    """The root of an open trial of the local backend whose base dir is ``base_dir`` (any process, same host):
    how the verifier actor finds what the sandbox actor built. SandboxInfraError when there is none."""
    trials = Path(base_dir) / "trials"
    found = [root for _, root in trial_roots(trials, trial_id)]
    if len(found) == 1:
        return found[0]
    if found:  # two runs issued one id: scoring either root could score the other run's work
        raise SandboxInfraError(f"{len(found)} open sandboxes of trial {trial_id} under {trials}: the trial id is "
                                "not unique on this host, so none of them is scored")
    raise SandboxInfraError(f"no open sandbox of trial {trial_id} under {trials}; the verifier must run on the "
                            f"sandbox's host with the same [sandbox.local] base_dir, before SandboxClose")
