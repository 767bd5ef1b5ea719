"""Error-recovery tasks: a family's own task whose output files belong in a directory that does not exist yet.

The instruction reads like the family's (``... write the sum to /app/cedar/alpha.txt ...``) and never says
the directory is missing, so the first obvious command meets a real error (``bash: /app/cedar/alpha.txt:
No such file or directory``). Solving it takes a command the SFT demonstrations never pair with such an
output: ``mkdir /app/cedar``, then the write again. SFT only ever sees tool outputs of commands that
worked, so recovering is a skill the policy has to find by sampling and RL has to reinforce; a lower
temperature cannot give it (the greedy answer to an error is whatever SFT's habit is).

Which families RL may see as recovery tasks is fixed by a hash of the family (``recovery_split``): about
a third are held out, so the eval tells "learned to read an error and fix it" from "learned this family's
fix".
"""

from __future__ import annotations

import hashlib
import random
import re

from t1_actors.tasks.synthetic._draft import NAMES, Check, Draft

HELD_OUT_PERCENT = 34  # share of eligible families whose recovery tasks only the eval split has
_OUTPUT = re.compile(r">>?\s*(/app/[A-Za-z0-9_.\-]+)")
_APP_ENTRY = re.compile(r"/app/([A-Za-z0-9_.\-]+)")


def recovery_split(family: str) -> str:
    """``"train"`` or ``"eval"``: whether RL may see recovery tasks of ``family``, fixed by a hash."""
    digest = hashlib.sha256(f"recovery\n{family}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % 100 < HELD_OUT_PERCENT else "train"


def outputs(draft: Draft) -> list[str]:
    """The new top-level files a draft's oracle writes by redirection (``> /app/x.txt``), in order."""
    found: list[str] = []
    for command in draft.commands:
        for path in _OUTPUT.findall(command):
            if path not in draft.files and path not in found:
                found.append(path)
    return found


def eligible(draft: Draft) -> bool:
    return bool(outputs(draft))


def _move(text: str, moves: dict[str, str]) -> str:
    for old, new in moves.items():
        # the whole path only: not a prefix of a longer one (a sentence's closing period may follow)
        text = re.sub(re.escape(old) + r"(?![A-Za-z0-9_\-/]|\.[A-Za-z0-9])", new, text)
    return text


def with_missing_directory(draft: Draft, rng: random.Random, *, exists: bool = False,
                           creates: bool = True) -> Draft | None:
    """The draft with its output files moved into a new directory its oracle must create first
    (``mkdir -p D``); None when the draft writes no new file (or no free directory name is left).

    ``exists``: the SFT twin instead, whose directory is already there (it holds a hidden ``.keep``); its
    oracle starts with the harmless ``mkdir -p D`` only when ``creates``. SFT then learns to copy nested
    output paths and sometimes to make sure of the directory first, and never sees a write fail."""
    written = outputs(draft)
    if not written:
        return None
    blob = " ".join([draft.instruction, *draft.commands, *draft.files, *(c.body for c in draft.checks)])
    taken = {m.split(".")[0] for m in _APP_ENTRY.findall(blob)}
    free = [name for name in NAMES if name not in taken]
    if not free:
        return None
    directory = f"/app/{rng.choice(free)}"
    moves = {path: f"{directory}/{path.rsplit('/', 1)[1]}" for path in written}
    checks = [Check(c.name, _move(c.body, moves)) for c in draft.checks]
    files = {**draft.files, **({f"{directory}/.keep": ""} if exists else {})}
    commands = [_move(c, moves) for c in draft.commands]
    if creates or not exists:
        commands.insert(0, f"mkdir -p {directory}")
    return Draft(instruction=_move(draft.instruction, moves), commands=commands, checks=checks, files=files,
                 modes=dict(draft.modes), env=dict(draft.env))
