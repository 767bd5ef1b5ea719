"""How well the SFT policy imitates oracle chats it never trained on: teacher-forced, per task family.

Each held-out chat (the validation split's oracles, executed like the SFT pool's) is fed whole; at every assistant
token the policy's most likely next token is compared with the oracle's. A turn is right when all its tokens are,
a chat when all its turns are. Why: a chat right teacher-forced is one the greedy policy would play to its end
(given the same tool outputs), so from one forward pass per chat it tells how far the SFT policy is from the
resolved rates its eval passes measure, and per family and turn where imitation fails (on long.toml the long
families' turns, while the single-turn ones were right: docs/long_horizons.md). An HF template's chat may come as
several sequences (``warmstart.chats``): each counts as a chat here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

Example = tuple[np.ndarray, np.ndarray]  # token ids, assistant-token mask (as warmstart.finetune.Example)


def turns_right(predicted: np.ndarray, target: np.ndarray, mask: np.ndarray) -> list[bool]:
    """Per assistant turn (a maximal run of masked positions), whether every one of its tokens was predicted."""
    right: list[bool] = []
    current: bool | None = None
    for ok, taken in zip(predicted == target, mask > 0, strict=True):
        if taken:
            current = bool(ok) if current is None else current and bool(ok)
        elif current is not None:
            right.append(current)
            current = None
    if current is not None:
        right.append(current)
    return right


@torch.no_grad()
def imitation(policy, chats: Iterable[tuple[str, Example]]) -> dict[str, Any]:
    """Teacher-forced greedy imitation of ``chats`` ((family, example) pairs): per family the turns and chats
    right, and over all of them ``turn_accuracy`` and ``chat_accuracy``. Logits only at assistant positions
    (a 151k-id head at every position of a long chat would dwarf the trunk)."""
    policy.eval()
    families: dict[str, dict[str, int]] = defaultdict(lambda: {"turns": 0, "turns_right": 0, "chats": 0,
                                                                "chats_right": 0})
    for family, (ids, mask) in chats:
        tokens = torch.as_tensor(np.asarray(ids, dtype=np.int64))[None]
        taken = torch.as_tensor(np.asarray(mask)[1:] > 0)
        hidden = policy.model(tokens[:, :-1]).hidden_states[0]
        predicted = np.zeros(len(ids) - 1, dtype=np.int64)
        predicted[taken.numpy()] = policy.lm_head(hidden[taken]).argmax(-1).numpy()
        right = turns_right(predicted, np.asarray(ids)[1:], np.asarray(mask)[1:])
        counts = families[family]
        counts["turns"] += len(right)
        counts["turns_right"] += sum(right)
        counts["chats"] += 1
        counts["chats_right"] += all(right)
    turns = sum(c["turns"] for c in families.values())
    chats = sum(c["chats"] for c in families.values())
    return {"turn_accuracy": round(sum(c["turns_right"] for c in families.values()) / max(turns, 1), 4),
            "chat_accuracy": round(sum(c["chats_right"] for c in families.values()) / max(chats, 1), 4),
            "chats": chats, "families": dict(sorted(families.items()))}
