"""How a run's trials ended, what was cut and what was edited, counted per split from the log alone.

    endings = trial_endings(log.events(kinds=ENDING_KINDS))
    endings["finishes"]["train"]["context"]        # trials of the train split that ran out of context
    endings["truncations"]["eval"]["tool_output"]  # tool outputs cut in eval trials
    endings["context_edits"]["train"]["window"]    # prompts the window strategy edited

Splits are ``train``, ``warmup`` and ``eval`` (``TrialIssued.split``); a trial whose issue is not in the events
counts under ``unknown``. These are ``summary.json``'s keys of the same names.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from schemas import ContextEdited, TrialEnded, TrialIssued

ENDING_KINDS = ["trial_issued", "trial_ended", "context_edited"]


def trial_endings(events: Iterable[tuple[Any, Any]]) -> dict[str, dict[str, dict[str, int]]]:
    """{"finishes" | "truncations" | "context_edits": {split: {reason: n}}} over ``(event_id, event)`` pairs."""
    split_of: dict[str, str] = {}
    counts: dict[str, dict[str, Counter[str]]] = {key: defaultdict(Counter)
                                                  for key in ("finishes", "truncations", "context_edits")}
    ended: list[TrialEnded] = []
    edits: list[ContextEdited] = []
    for _event_id, event in events:
        if isinstance(event, TrialIssued):
            split_of[event.trial_id] = event.split
        elif isinstance(event, TrialEnded):
            ended.append(event)
        elif isinstance(event, ContextEdited):
            edits.append(event)
    for end in ended:
        split = split_of.get(end.trial_id, "unknown")
        counts["finishes"][split][end.finish] += 1
        counts["truncations"][split].update(end.truncations)
    for edit in edits:
        counts["context_edits"][split_of.get(edit.trial_id, "unknown")][edit.strategy] += 1
    return {key: {split: dict(sorted(c.items())) for split, c in sorted(by_split.items())}
            for key, by_split in counts.items()}
