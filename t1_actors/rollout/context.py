"""Context management: what the harness does when the next prompt would not fit the context.

    end               the trial ends with finish = "context" (nothing is edited)
    drop_old_outputs  tool outputs older than the last ``keep_last_turns`` turns become ``DROPPED_OUTPUT``
    window            the system prompt and the instruction stay, then the most recent turns that fit

Every edit is a ``ContextEdit`` the trial logs (an event of its own, counted in ``summary.json``); the edited
prompt no longer extends the stream TITO holds, so it opens a new chunk of the same trial (a ``split``
boundary), trained on exactly the context the sampler saw. A strategy never edits the instruction, and never
the last turn (the agent must see what its last command printed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Strategy = Literal["end", "drop_old_outputs", "window"]
STRATEGIES: tuple[Strategy, ...] = ("end", "drop_old_outputs", "window")
DROPPED_OUTPUT = "[output dropped to fit the context]"
FIRST_TURN = 2  # messages[0:2] are the system prompt and the instruction


@dataclass(frozen=True)
class ContextEdit:
    """One edit of a trial's chat before turn ``turn``: the prompt went from ``tokens_before`` to
    ``tokens_after`` tokens by ``strategy``, which replaced or removed ``messages_edited`` messages."""

    turn: int
    strategy: Strategy
    tokens_before: int
    tokens_after: int
    messages_edited: int


def turn_starts(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Indices of the assistant messages that open each played turn (a turn: assistant + its tool outputs)."""
    return [i for i in range(FIRST_TURN, len(messages)) if messages[i]["role"] == "assistant"]


def drop_old_outputs(messages: list[dict[str, Any]], keep_last_turns: int) -> tuple[list[dict[str, Any]], int]:
    """The chat with the tool outputs of every turn but the last ``keep_last_turns`` replaced by the marker;
    and how many outputs it replaced (0: nothing left to drop)."""
    starts = turn_starts(messages)
    if len(starts) <= keep_last_turns:
        return messages, 0
    cut = starts[-keep_last_turns] if keep_last_turns else len(messages)
    edited, n = [], 0
    for i, message in enumerate(messages):
        if i < cut and message["role"] == "tool" and message["content"] != DROPPED_OUTPUT:
            message, n = {**message, "content": DROPPED_OUTPUT}, n + 1
        edited.append(message)
    return edited, n


def window(messages: list[dict[str, Any]], fits: Callable[[list[dict[str, Any]]], bool]
           ) -> tuple[list[dict[str, Any]], int]:
    """The system prompt and the instruction, then the most recent whole turns that ``fits`` accepts (at least
    the last one); and how many messages it removed."""
    head, starts = list(messages[:FIRST_TURN]), turn_starts(messages)
    for start in starts[:-1]:  # from the oldest cut point on, the first tail that fits
        candidate = head + list(messages[start:])
        if fits(candidate):
            return candidate, start - FIRST_TURN
    last = starts[-1] if starts else len(messages)
    return head + list(messages[last:]), last - FIRST_TURN


def fit_context(messages: list[dict[str, Any]], prompt_of: Callable[[list[dict[str, Any]]], np.ndarray], *,
                budget: int, strategy: Strategy, keep_last_turns: int, turn: int
                ) -> tuple[list[dict[str, Any]], np.ndarray, ContextEdit | None] | None:
    """The chat and its prompt ids for the next turn, edited by ``strategy`` when the prompt is longer than
    ``budget`` tokens; None when nothing the strategy may do makes it fit (the trial ends: "context")."""
    prompt = prompt_of(messages)
    if len(prompt) <= budget:
        return messages, prompt, None
    if strategy == "end":
        return None
    if strategy == "drop_old_outputs":
        edited, n = drop_old_outputs(messages, keep_last_turns)
    else:
        edited, n = window(messages, lambda chat: len(prompt_of(chat)) <= budget)
    if n == 0:
        return None
    edited_prompt = prompt_of(edited)
    if len(edited_prompt) > budget:
        return None
    return edited, edited_prompt, ContextEdit(turn, strategy, len(prompt), len(edited_prompt), n)
