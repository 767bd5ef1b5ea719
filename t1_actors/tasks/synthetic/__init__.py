"""The synthetic training corpus: a laptop-scale analogue of the paper's T1-15k.

Families of shell work (files and directories, text, search and replace, counting, aggregation,
archives, permissions, scripts, git) draw templated parameters from small vocabularies. Each task
has a short formulaic instruction whose parameters appear verbatim in its 2-3 oracle commands, and a
pytest verifier of 4-18 separate checks, so partial progress earns partial reward r = P / 20.

Copyability, after the probe in DESIGN.md: a tiny policy copies a parameter that is the same token
in instruction and command. Paths are (``/app/NAME.txt`` both places); a bare word is not (BPE reads
``Ġpink`` after a space but ``pink`` after ``/`` in ``s/pink/song/``), so literal words are quoted
in both: ``replace every 'pink' with 'song'`` -> ``sed -i 's/pink/song/g'``, ``grep 'song'``.

Splits are disjoint by construction: a task belongs to the split its (family, instruction) hashes
to, so no instruction of the train split ever appears in the eval split, whatever the seeds.
Generation is deterministic in (split, n, seed, families).
"""

from __future__ import annotations

import hashlib
import random
import shutil
from collections.abc import Iterable

from ..model import Split, Task
from ._draft import Draft, Family, render_tests
from ._files import FAMILIES as _FILE_FAMILIES
from ._text import FAMILIES as _TEXT_FAMILIES
from ._tools import FAMILIES as _TOOL_FAMILIES

FAMILIES: dict[str, Family] = {f.name: f for f in (*_FILE_FAMILIES, *_TEXT_FAMILIES, *_TOOL_FAMILIES)}
EVAL_PERCENT = 20  # share of each family's instruction space that belongs to the eval split
TEST_FILE = "test_outputs.py"
_MAX_ATTEMPTS = 500

__all__ = ["EVAL_PERCENT", "FAMILIES", "available_families", "generate", "split_of"]


def split_of(family: str, instruction: str) -> Split:
    """The split a task belongs to: a hash of its family and instruction, fixed for ever."""
    digest = hashlib.sha256(f"{family}\n{instruction}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % 100 < EVAL_PERCENT else "train"


def available_families(families: Iterable[str] | None = None) -> list[str]:
    """The families asked for (default: all) whose tools exist here (the sandbox root shares /usr)."""
    names = list(FAMILIES) if families is None else list(families)
    unknown = [name for name in names if name not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown synthetic families {unknown}; known: {sorted(FAMILIES)}")
    return [name for name in names if all(shutil.which(tool) for tool in FAMILIES[name].needs)]


def generate(split: Split, n: int, seed: int = 0, families: Iterable[str] | None = None) -> list[Task]:
    """``n`` tasks of ``split``, families taken in turn, no instruction twice; deterministic by seed.

    ``families`` picks and weights them: ``["head_tail", "head_tail", "cleanup"]`` draws two head_tail
    tasks for each cleanup task. Default: every available family once.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    names = available_families(families)
    if not names:
        raise ValueError("no synthetic family is available (git-only selection without git?)")
    seen: set[str] = set()
    tasks = []
    for index in range(n):
        family = FAMILIES[names[index % len(names)]]
        task = _draw_task(family, split, seed, index, seen)
        seen.add(task.instruction)
        tasks.append(task)
    return tasks


def _draw_task(family: Family, split: Split, seed: int, index: int, seen: set[str]) -> Task:
    for attempt in range(_MAX_ATTEMPTS):
        rng = random.Random(f"t1-synthetic/{seed}/{split}/{index}/{attempt}")
        draft = family.draw(rng)
        if split_of(family.name, draft.instruction) == split and draft.instruction not in seen:
            return _task(family, split, draft)
    raise RuntimeError(f"family {family.name!r}: no new {split} task after {_MAX_ATTEMPTS} draws; "
                       f"its parameter space is exhausted, ask for fewer tasks or add vocabulary")


def _task(family: Family, split: Split, draft: Draft) -> Task:
    tests = render_tests(draft.checks)
    files = {path: {"content": body, "mode": draft.modes.get(path, 0o644)} for path, body in draft.files.items()}
    fingerprint = hashlib.sha256(repr((family.name, draft.instruction, sorted(files.items()), tests)).encode())
    return Task(
        id=f"{family.name}-{fingerprint.hexdigest()[:12]}",
        family=family.name,
        split=split,
        instruction=draft.instruction,
        environment={"files": files, "env": draft.env},
        oracle={"script": "#!/bin/bash\nset -e\n" + "\n".join(draft.commands) + "\n", "commands": draft.commands},
        tests={"files": {TEST_FILE: tests}, "targets": [TEST_FILE]},
        source_format="synthetic",
        metadata={"area": family.area, "checks": len(draft.checks)},
    )
