"""Composite tasks: two to four requirements of different families in one instruction.

SFT only ever sees single-requirement tasks, which end with ``done`` after their own two or three
commands. A composite instruction asks for several of them in order ("Task 1: ... Task 2: ..."), each
part keeping its family's wording, files and checks (prefixed ``p1_``, ``p2_``, ...), so the dense
reward r = P / 20 credits every part on its own. What the SFT policy lacks is carrying on after the
first part instead of answering ``done``: a skill it can stumble on by sampling (each later part is a
single-task skill it has) and that RL can reinforce, not one a lower temperature can give it.

Which pairs of families RL may train on is fixed by a hash of the pair: ``pairing_split`` holds out
about a third of them, so the eval measures composition on pairings RL never saw, and on longer
compositions (3 parts) than RL trained on. Parts of a train composite are train-split drafts of their
family, parts of an eval or validation composite eval-split ones, so no instruction crosses splits.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

from t1_actors.tasks.synthetic._draft import Check, Draft, Family

MAX_CHECKS = 20  # S of the reward: a composite never has more checks than r = P / 20 can credit
HELD_OUT_PERCENT = 34  # share of family pairings kept for the eval (never in an RL composite)
_APP_ENTRY = re.compile(r"/app/([A-Za-z0-9_.\-]+)")


def pairing_split(a: str, b: str) -> str:
    """``"train"`` or ``"eval"`` for an unordered pair of families, fixed for ever by a hash."""
    first, second = sorted((a, b))
    digest = hashlib.sha256(f"pairing\n{first}\n{second}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % 100 < HELD_OUT_PERCENT else "train"


def composite_name(parts: Sequence[str]) -> str:
    """The family tag of a composite: ``composite<N>`` plus whether its pairings were held out."""
    if len(parts) == 2:
        return f"composite2_{'heldout' if pairing_split(*parts) == 'eval' else 'seen'}"
    return f"composite{len(parts)}"


def _entries(draft: Draft) -> set[str]:
    """The top-level /app entries a draft names anywhere: two parts naming the same one would clash."""
    blob = " ".join([draft.instruction, *draft.commands, *draft.files, *(c.body for c in draft.checks)])
    return {match.group(1).split(".")[0] for match in _APP_ENTRY.finditer(blob)}


def compose(drafts: Sequence[Draft]) -> Draft | None:
    """One draft doing every part in order, or None when two parts touch the same /app entry or the
    checks would exceed ``MAX_CHECKS`` (the caller draws again)."""
    seen: set[str] = set()
    for draft in drafts:
        entries = _entries(draft)
        if entries & seen:
            return None
        seen |= entries
    if sum(len(d.checks) for d in drafts) > MAX_CHECKS:
        return None
    instruction = " ".join(f"Task {i}: {d.instruction}" for i, d in enumerate(drafts, 1))
    checks = [Check(f"p{i}_{c.name}", c.body) for i, d in enumerate(drafts, 1) for c in d.checks]
    merged = Draft(instruction=instruction, commands=[c for d in drafts for c in d.commands], checks=checks)
    for draft in drafts:
        merged.files.update(draft.files)
        merged.modes.update(draft.modes)
        merged.env.update(draft.env)
    return merged


def draw_parts(rng: random.Random, families: Sequence[Family], size: int, pairing: str | None) -> list[Family]:
    """``size`` distinct families in a random order; for two parts, a pairing of the asked split."""
    for _ in range(1000):
        parts = rng.sample(list(families), size)
        if size != 2 or pairing is None or pairing_split(parts[0].name, parts[1].name) == pairing:
            return parts
    raise RuntimeError(f"no pairing of split {pairing!r} among families {[f.name for f in families]}")
