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

``LONG_FAMILIES`` (``_long``: chain, pipeline, explore) take 8-14 turns, each step reading what an earlier
one printed; they are drawn only where ``families`` names them, never by default.
"""

from __future__ import annotations

import hashlib
import random
import shutil
from collections.abc import Iterable

from t1_actors.tasks.model import Split, Task
from t1_actors.tasks.synthetic._composite import compose, composite_name, draw_parts
from t1_actors.tasks.synthetic._draft import RENAMEABLE, Draft, Family, render_tests
from t1_actors.tasks.synthetic._files import FAMILIES as _FILE_FAMILIES
from t1_actors.tasks.synthetic._long import FAMILIES as _LONG_FAMILIES
from t1_actors.tasks.synthetic._recovery import recovery_split, with_missing_directory
from t1_actors.tasks.synthetic._text import FAMILIES as _TEXT_FAMILIES
from t1_actors.tasks.synthetic._tools import FAMILIES as _TOOL_FAMILIES

FAMILIES: dict[str, Family] = {f.name: f for f in (*_FILE_FAMILIES, *_TEXT_FAMILIES, *_TOOL_FAMILIES)}
# Long families (8-14 turns, each step reading an earlier output): drawn only when named ([tasks] families),
# so the default set, and every run that does not name them, stays as it was.
LONG_FAMILIES: dict[str, Family] = {f.name: f for f in _LONG_FAMILIES}
_KNOWN: dict[str, Family] = {**FAMILIES, **LONG_FAMILIES}
EVAL_PERCENT = 20  # share of each family's instruction space that belongs to the eval split
TEST_FILE = "test_outputs.py"
_MAX_ATTEMPTS = 500

__all__ = ["EVAL_PERCENT", "FAMILIES", "LONG_FAMILIES", "RENAMEABLE", "available_families", "generate", "generate_composite",
           "generate_nested", "generate_recovery", "is_long_task", "split_of"]


def split_of(family: str, instruction: str) -> Split:
    """The split a task belongs to: a hash of its family and instruction, fixed for ever."""
    digest = hashlib.sha256(f"{family}\n{instruction}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % 100 < EVAL_PERCENT else "train"


def is_long_task(task_id: str) -> bool:
    """Whether ``task_id`` names a task of a long family: a synthetic task's id is ``<family>-<fingerprint>``
    (``_task``), so a log's task ids tell the long tasks apart without the task set."""
    family, sep, _ = task_id.rpartition("-")
    return bool(sep) and family in LONG_FAMILIES


def available_families(families: Iterable[str] | None = None) -> list[str]:
    """The families asked for (default: all of ``FAMILIES``; a long one only by name) whose tools exist here
    (the sandbox root shares /usr)."""
    names = list(FAMILIES) if families is None else list(families)
    unknown = [name for name in names if name not in _KNOWN]
    if unknown:
        raise ValueError(f"unknown synthetic families {unknown}; known: {sorted(_KNOWN)}")
    return [name for name in names if all(shutil.which(tool) for tool in _KNOWN[name].needs)]


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
        family = _KNOWN[names[index % len(names)]]
        task = _draw_task(family, split, seed, index, seen)
        seen.add(task.instruction)
        tasks.append(task)
    return tasks


def _draw_task(family: Family, split: Split, seed: int, index: int, seen: set[str]) -> Task:
    for attempt in range(_MAX_ATTEMPTS):
        rng = random.Random(f"t1-synthetic/{seed}/{split}/{index}/{attempt}")
        draft = family.draw(rng)
        if split_of(family.name, draft.instruction) == split and draft.instruction not in seen:
            return _task(family.name, family.area, split, draft)
    raise RuntimeError(f"family {family.name!r}: no new {split} task after {_MAX_ATTEMPTS} draws; "
                       f"its parameter space is exhausted, ask for fewer tasks or add vocabulary")


def generate_composite(split: Split, n: int, seed: int = 0, families: Iterable[str] | None = None) -> list[Task]:
    """``n`` composite tasks of ``split`` (see ``_composite``), deterministic by seed.

    Train composites join two parts on the pairings RL may see; eval composites alternate two parts on
    held-out pairings and three parts on any families (longer than RL ever trained on). Each part is a
    draft of its family's own ``split``.
    """
    if n == 0:
        return []
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    pool = [_KNOWN[name] for name in available_families(families)]
    if len(pool) < 3:
        raise ValueError(f"composite tasks need at least 3 families, got {[f.name for f in pool]}")
    seen: set[str] = set()
    tasks = []
    for index in range(n):
        size, pairing = (2, "train") if split == "train" else ((2, "eval") if index % 2 == 0 else (3, None))

        # this iteration's size and pairing bound as defaults (draw runs within the iteration; binding says so)
        def draw(rng: random.Random, size: int = size, pairing: str | None = pairing,
                 ) -> tuple[Draft | None, list[str]]:
            parts = draw_parts(rng, pool, size, pairing)
            return compose([_draw_draft(family, split, rng) for family in parts]), [f.name for f in parts]

        draft, names = _new_draft(f"t1-composite/{seed}/{split}/{index}", draw, seen, f"composite {split} task")
        tasks.append(_task(composite_name(names), "composite", split, draft, parts=names))
    return tasks


def generate_nested(split: Split, n: int, seed: int = 0, families: Iterable[str] | None = None,
                    mkdir_share: float = 0.0) -> list[Task]:
    """``n`` tasks of ``split`` whose outputs go to an existing subdirectory (``/app/D/x.txt``): the SFT
    twins of the recovery tasks, every family that writes a file, in turn; deterministic by seed. A
    ``mkdir_share`` of their oracles first run the harmless ``mkdir -p D``."""
    if n == 0:
        return []
    usable = _writing_families(families)
    seen: set[str] = set()
    tasks = []
    for index in range(n):
        family = usable[index % len(usable)]

        def draw(rng: random.Random, family: Family = family) -> tuple[Draft | None, None]:
            return with_missing_directory(_draw_draft(family, split, rng), rng, exists=True,
                                          creates=rng.random() < mkdir_share), None

        draft, _ = _new_draft(f"t1-nested/{seed}/{split}/{index}", draw, seen, f"nested {split} task of {family.name!r}")
        tasks.append(_task(f"nested_{family.name}", family.area, split, draft, parts=[family.name]))
    return tasks


def generate_recovery(split: Split, n: int, seed: int = 0, families: Iterable[str] | None = None) -> list[Task]:
    """``n`` error-recovery tasks of ``split`` (see ``_recovery``), deterministic by seed.

    Train tasks come from the families RL may see as recovery tasks; eval tasks alternate those and the
    held-out ones. Each is a draft of its family's own ``split`` with its outputs in a missing directory.
    """
    if n == 0:
        return []
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    usable = _writing_families(families)
    seen_side = [f for f in usable if recovery_split(f.name) == "train"]
    held_out = [f for f in usable if recovery_split(f.name) == "eval"]
    if not seen_side or (split == "eval" and not held_out):
        raise ValueError(f"recovery tasks need families on both sides of the hold-out; got {[f.name for f in usable]}")
    seen: set[str] = set()
    tasks = []
    for index in range(n):
        side = seen_side if split == "train" or index % 2 == 0 else held_out
        family = side[(index // (1 if split == "train" else 2)) % len(side)]

        def draw(rng: random.Random, family: Family = family) -> tuple[Draft | None, None]:
            return with_missing_directory(_draw_draft(family, split, rng), rng), None

        draft, _ = _new_draft(f"t1-recovery/{seed}/{split}/{index}", draw, seen,
                              f"recovery {split} task of {family.name!r}")
        tag = f"recovery_{'seen' if recovery_split(family.name) == 'train' else 'heldout'}"
        tasks.append(_task(tag, "recovery", split, draft, parts=[family.name]))
    return tasks


def _new_draft(key: str, draw, seen: set[str], what: str):
    """``draw(rng) -> (draft or None, extra)`` with ``random.Random(f"{key}/{attempt}")`` until the draft is
    one whose instruction ``seen`` lacks (then added to it); returns ``(draft, extra)``."""
    for attempt in range(_MAX_ATTEMPTS):
        draft, extra = draw(random.Random(f"{key}/{attempt}"))
        if draft is not None and draft.instruction not in seen:
            seen.add(draft.instruction)
            return draft, extra
    raise RuntimeError(f"no new {what} after {_MAX_ATTEMPTS} draws")


def _writing_families(families: Iterable[str] | None) -> list[Family]:
    """The available single-turn families whose oracle writes a new file: the ones with recovery tasks and
    nested twins. Long families are their own kind of task and never wrapped so, whatever the list names."""
    probe = random.Random("t1-recovery/eligible")
    return [FAMILIES[name] for name in available_families(families)
            if name in FAMILIES and with_missing_directory(FAMILIES[name].draw(probe), probe) is not None]


def _draw_draft(family: Family, split: Split, rng: random.Random) -> Draft:
    """A draft of ``family`` whose own instruction belongs to ``split``."""
    for _ in range(_MAX_ATTEMPTS):
        draft = family.draw(rng)
        if split_of(family.name, draft.instruction) == split:
            return draft
    raise RuntimeError(f"family {family.name!r}: no {split} draft after {_MAX_ATTEMPTS} draws")


def _task(family: str, area: str, split: Split, draft: Draft, parts: list[str] | None = None) -> Task:
    tests = render_tests(draft.checks)
    files = {path: {"content": body, "mode": draft.modes.get(path, 0o644)} for path, body in draft.files.items()}
    fingerprint = hashlib.sha256(repr((family, draft.instruction, sorted(files.items()), tests)).encode())
    return Task(
        id=f"{family}-{fingerprint.hexdigest()[:12]}",
        family=family,
        split=split,
        instruction=draft.instruction,
        environment={"files": files, "env": draft.env},
        oracle={"script": "#!/bin/bash\nset -e\n" + "\n".join(draft.commands) + "\n", "commands": draft.commands},
        tests={"files": {TEST_FILE: tests}, "targets": [TEST_FILE]},
        source_format="synthetic",
        metadata={"area": area, "checks": len(draft.checks), **({"parts": parts} if parts else {})},
        limits=draft.limits,
    )
