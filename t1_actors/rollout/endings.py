"""How a run's trials ended, what was cut and what was edited, counted per split from the log alone.

    endings = trial_endings(log.events(kinds=ENDING_KINDS))
    endings["finishes"]["train"]["context"]        # trials of the train split that ran out of context
    endings["truncations"]["eval"]["tool_output"]  # tool outputs cut in eval trials
    endings["context_edits"]["train"]["window"]    # prompts the window strategy edited

Splits are ``train``, ``warmup`` and ``eval`` (``TrialIssued.split``); a trial whose issue is not in the events
counts under ``unknown``. These are ``summary.json``'s keys of the same names. ``Endings`` is the one fold of
these facts; ``Endings.counts`` groups them any other way (per learner step: ``t1_actors.job.dynamics``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas import ContextEdited, TrialEnded, TrialIssued

ENDING_KINDS = ["trial_issued", "trial_ended", "context_edited"]
ENDING_KEYS = ("finishes", "truncations", "context_edits")


@dataclass
class Endings:
    """The trials' issues (split and label by trial), endings and context edits, in log order."""

    issued: dict[str, TrialIssued] = field(default_factory=dict)
    ended: list[TrialEnded] = field(default_factory=list)
    edits: list[ContextEdited] = field(default_factory=list)

    def add(self, event: Any) -> None:
        """Fold one event in (any other kind is ignored)."""
        if isinstance(event, TrialIssued):
            self.issued[event.trial_id] = event
        elif isinstance(event, TrialEnded):
            self.ended.append(event)
        elif isinstance(event, ContextEdited):
            self.edits.append(event)

    def split_of(self, trial_id: str) -> str:
        issue = self.issued.get(trial_id)
        return issue.split if issue is not None else "unknown"

    def counts(self, group_of: Callable[[str], Any]) -> dict[str, dict[Any, dict[str, int]]]:
        """{"finishes" | "truncations" | "context_edits": {group: {reason: n}}}, a trial in the group
        ``group_of(trial_id)`` names (None: left out). Finishes count ``TrialEnded.finish``, truncations its
        ``truncations``, context edits each ``ContextEdited`` by strategy; groups and reasons sorted."""
        counts: dict[str, dict[Any, Counter[str]]] = {key: defaultdict(Counter) for key in ENDING_KEYS}
        for end in self.ended:
            group = group_of(end.trial_id)
            if group is not None:
                counts["finishes"][group][end.finish] += 1
                counts["truncations"][group].update(end.truncations)
        for edit in self.edits:
            group = group_of(edit.trial_id)
            if group is not None:
                counts["context_edits"][group][edit.strategy] += 1
        return {key: {group: dict(sorted(c.items())) for group, c in sorted(by_group.items())}
                for key, by_group in counts.items()}


def trial_endings(events: Iterable[tuple[Any, Any]]) -> dict[str, dict[str, dict[str, int]]]:
    """{"finishes" | "truncations" | "context_edits": {split: {reason: n}}} over ``(event_id, event)`` pairs."""
    endings = Endings()
    for _event_id, event in events:
        endings.add(event)
    return endings.counts(endings.split_of)
