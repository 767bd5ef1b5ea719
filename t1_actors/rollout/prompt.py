"""A trial's prompts tokenized by what each turn adds, not from scratch: the harness's tokenizing cost per turn
follows the turn's new text instead of the whole chat's.

A chat template renders every turn as ``<|im_start|>ROLE ...``; ``<|im_start|>`` is an added (special) token, which
a tokenizer splits out before anything else, so the text on either side of it is tokenized independently. The ids of
a new prompt are then the previous prompt's ids up to the last ``<|im_start|>`` the two texts share, followed by the
ids of the text from there on. Where the template re-rendered history differently (a context edit, a template
that rewrites past turns), the shared part is shorter and more is tokenized: the ids are always exactly those of
tokenizing the whole text (tests/test_rollout_prompt.py checks it against full tokenization on both tokenizers).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy as np

from t1_actors.policy.chat_template import GENERATION_PROMPT, IM_START, render_chat, render_message


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (memcmp-speed: no Python loop over characters)."""
    n = min(len(a), len(b))
    if a.startswith(b) or b.startswith(a):  # the common case (a chat that grew): one memcmp, no copy
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid
    return low


class IncrementalTokens:
    """``tokens(text)``: the ids of ``encode(text)``, re-tokenizing only the text after the last turn boundary
    (``boundary``, a single added token) that ``text`` shares with the previous call's."""

    def __init__(self, encode: Callable[[str], list[int]], boundary: str = IM_START):
        self.encode = encode
        boundary_ids = encode(boundary)
        self.boundary, self.boundary_id = boundary, boundary_ids[0] if len(boundary_ids) == 1 else None
        self._text = ""
        self._ids = np.zeros(0, np.int32)
        self._buffer = np.zeros(0, np.int32)  # every prompt returned is a view of it; written only past _high
        self._high = 0
        self._cut_chars: list[int] = []  # where each boundary starts in the previous text ...
        self._cut_tokens: list[int] = []  # ... and its index in the previous ids
        self.tokenized_chars = 0  # characters this instance tokenized, over all calls (the harness's work)

    def __call__(self, text: str) -> np.ndarray:
        if self.boundary_id is None:  # no single-token boundary: every prompt from scratch
            self.tokenized_chars += len(text)
            return np.asarray(self.encode(text), dtype=np.int32)
        ids = self.after_shared(common_prefix(text, self._text), lambda start: text[start:], len(text))
        self._text = text
        return ids

    def after_shared(self, shared: int, text_from: Callable[[int], str], length: int) -> np.ndarray:
        """The ids of a text of ``length`` characters whose first ``shared`` equal the previous call's text
        (``text_from(c)``: the new text from character ``c`` on); only the text after the last boundary the two
        share is tokenized. A caller that knows ``shared`` (``IncrementalPrompt``) never builds the whole text."""
        k = bisect.bisect_right(self._cut_chars, shared)  # boundaries that start inside the shared text
        char, token = (self._cut_chars[k - 1], self._cut_tokens[k - 1]) if k else (0, 0)
        tail_text = text_from(char)
        tail = np.asarray(self.encode(tail_text), dtype=np.int32)
        self.tokenized_chars += length - char
        chars, start = [], 0
        while (found := tail_text.find(self.boundary, start)) >= 0:
            chars.append(char + found)
            start = found + len(self.boundary)
        tokens = (token + np.flatnonzero(tail == self.boundary_id)).tolist()
        ids = self._extend(token, tail)
        kept = max(k - 1, 0)  # the cut re-tokenized from is found again in the tail
        if len(chars) == len(tokens):
            self._cut_chars, self._cut_tokens = self._cut_chars[:kept] + chars, self._cut_tokens[:kept] + tokens
        else:  # the boundary's text did not become its id somewhere: no cut is trusted, the next call starts at 0
            self._cut_chars, self._cut_tokens = [], []
        self._ids = ids
        return ids

    def _extend(self, token: int, tail: np.ndarray) -> np.ndarray:
        """``ids[:token] ++ tail`` as a view of the buffer: in place when the buffer already holds ``tail``'s start
        where it would go (the earlier prompts' views never change), else in a new buffer (twice the size)."""
        end, overlap = token + len(tail), min(self._high, token + len(tail)) - token
        if overlap >= 0 and np.array_equal(self._buffer[token:token + overlap], tail[:overlap]) \
                and end <= len(self._buffer):
            self._buffer[token + overlap:end] = tail[overlap:]
        else:
            buffer = np.empty(max(2 * end, 1024), np.int32)
            buffer[:token] = self._ids[:token]
            buffer[token:end] = tail
            self._buffer, self._high = buffer, 0
        self._high = max(self._high, end)
        return self._buffer[:end]


class IncrementalRender:
    """``render(messages, add_generation_prompt=True)`` of a trial's growing chat, rendering only its new
    messages (and the last shared one, whose closing depends on what follows) when the template is t1's own
    (``render_chat``: message by message); any other template renders the whole chat, as before. The chat's
    messages are compared by identity: a message object the harness replaced (a context edit) is rendered anew."""

    def __init__(self, render: Callable[..., str]):
        self.render = render
        self.incremental = render is render_chat
        self._messages: list[dict[str, Any]] = []
        self._parts: list[str] = []
        self._starts: list[int] = [0]  # where each part starts in the rendered chat; the last: its end

    def __call__(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if not self.incremental:
            return self.render(messages, add_generation_prompt=add_generation_prompt)
        self.update(messages)
        return "".join(self._parts) + (GENERATION_PROMPT if add_generation_prompt else "")

    def update(self, messages: list[dict[str, Any]]) -> int:
        """Render what ``messages`` add to the previous chat (t1's template only); returns how many characters
        of the rendering are unchanged."""
        shared = 0
        for old, new in zip(self._messages, messages):
            if old is not new:
                break
            shared += 1
        start = max(shared - 1, 0)
        was = self._parts[start] if shared else ""  # the last shared message, as rendered before
        del self._parts[start:], self._starts[start + 1:]
        for i in range(start, len(messages)):
            self._parts.append(render_message(messages, i))
            self._starts.append(self._starts[-1] + len(self._parts[-1]))
        self._messages = list(messages)
        return self._starts[start] + (common_prefix(was, self._parts[start]) if start < len(self._parts) else 0)

    def text_from(self, char: int, add_generation_prompt: bool = True) -> str:
        """The rendering from character ``char`` (<= ``length``) on, joined from the parts it spans only."""
        i = bisect.bisect_right(self._starts, char) - 1
        head = self._parts[i][char - self._starts[i]:] if i < len(self._parts) else ""
        return head + "".join(self._parts[i + 1:]) + (GENERATION_PROMPT if add_generation_prompt else "")

    @property
    def length(self) -> int:
        return self._starts[-1]


class IncrementalPrompt:
    """A trial's prompt ids for its chat so far: ``prompt(messages)`` equals ``encode(render(messages,
    add_generation_prompt=True))``. With t1's own template, each call renders the new messages and tokenizes
    from the last turn boundary before them, without joining or comparing the whole chat: the harness's
    cost per turn follows the turn's new text. Any other template renders the whole chat and tokenizes
    from the last boundary it shares with the previous prompt (``IncrementalTokens``)."""

    def __init__(self, render: Callable[..., str], encode: Callable[[str], list[int]]):
        self.rendered = IncrementalRender(render)
        self.tokens = IncrementalTokens(encode)

    def __call__(self, messages: list[dict[str, Any]]) -> np.ndarray:
        if not self.rendered.incremental or self.tokens.boundary_id is None:
            return self.tokens(self.rendered(messages, add_generation_prompt=True))
        shared = self.rendered.update(messages)
        return self.tokens.after_shared(shared, self.rendered.text_from,
                                        self.rendered.length + len(GENERATION_PROMPT))
