"""KV of finished turns, kept by session (trial) so that the next turn prefills only its new tokens.

A multi-turn rollout sends turn j+1 as ``prompt_j + output_j + tool response``: everything up to the
last sampled token was already fed to the model. Re-prefilling it every turn costs more than decoding
on CPU; keeping it (least recently used first out, bounded in tokens) avoids that. An entry is used
only when the new prompt starts with exactly the kept tokens and adds at least one; it is dropped
when used, when the policy changes (its KV belongs to the old weights) and under memory pressure.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class Retained:
    tokens: list[int]  # the ids whose keys/values are kept: prompt + output[:-1]
    keys: list[torch.Tensor]  # per layer [kv_heads, len(tokens), head_dim]
    values: list[torch.Tensor]
    routing: torch.Tensor | None  # [len(tokens), layers, k] as recorded when they were fed


class PrefixCache:
    """Least-recently-used store of ``Retained`` by session id, at most ``max_tokens`` tokens in all."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[str, Retained] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def put(self, session: str, entry: Retained) -> None:
        self._drop(session)
        if len(entry.tokens) > self.max_tokens:
            return
        self._entries[session] = entry
        self._tokens += len(entry.tokens)
        while self._tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def take(self, session: str, prompt: list[int]) -> Retained | None:
        """The session's entry if ``prompt`` extends its tokens (removed either way)."""
        entry = self._entries.get(session)
        if entry is None:
            return None
        self._drop(session)
        n = len(entry.tokens)
        if len(prompt) > n and prompt[:n] == entry.tokens:
            return entry
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def _drop(self, session: str) -> None:
        entry = self._entries.pop(session, None)
        if entry is not None:
            self._tokens -= len(entry.tokens)
