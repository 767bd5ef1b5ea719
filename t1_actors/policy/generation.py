"""One generation as the sampler returns and records it, and what its prompt shares with the trial's previous turn.

``Generation`` is a finished sequence (sampled ids, logprobs at temperature T, routing of the fed tokens);
``TurnPrefix`` names the prefix a turn's prompt repeats, so the turn's record (``SamplerTurn``) and the sampler's
reply carry only what is new; ``RoutingRows`` keeps a trial's rows in one growing buffer, each turn's rows a view.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from schemas import GenerateReply, SamplerTurn

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True)
class TurnPrefix:
    """What a turn's prompt repeats of its trial's previous turn (that turn's prompt ++ sampled ids): the first
    ``shared`` ids, of which the first ``rows`` have routing rows recorded under policy ``version``. The turn's
    record (``SamplerTurn``) and the sampler's reply then carry only what is new: a trial of N turns stores and
    sends each position once, not about N/2 times."""

    shared: int = 0
    rows: int = 0
    version: int | None = None

    @classmethod
    def after(cls, prompt_ids: np.ndarray, sampled_ids: np.ndarray, routing: np.ndarray | None, version: int,
              next_prompt: np.ndarray) -> TurnPrefix:
        """The prefix ``next_prompt`` shares with a turn that saw ``prompt_ids``, sampled ``sampled_ids`` and
        recorded ``routing`` (all its rows) under ``version``."""
        shared, parts = 0, (prompt_ids, sampled_ids)
        same_start = (prompt_ids.base is not None and prompt_ids.base is next_prompt.base
                      and prompt_ids.ctypes.data == next_prompt.ctypes.data and prompt_ids.dtype == next_prompt.dtype)
        if same_start and len(next_prompt) >= len(prompt_ids):  # rollout.prompt's buffer is never rewritten
            shared, parts = len(prompt_ids), (sampled_ids,)
        for part in parts:  # the stream p ++ a, compared piece by piece (no copy of it)
            n = min(len(part), len(next_prompt) - shared)
            differ = np.flatnonzero(part[:n] != next_prompt[shared:shared + n])
            if len(differ):
                shared += int(differ[0])
                break
            shared += n
            if n < len(part):
                break
        return cls(shared, min(shared, len(routing)) if routing is not None else 0, version)

    def routing_start(self, version: int, routing: np.ndarray | None) -> int:
        """The first row a turn served under ``version`` must record itself: the prefix's rows are the previous
        turn's when they were computed under the same version, else (new weights, a new prefill) none are."""
        return self.rows if routing is not None and self.version == version else 0


NO_PREFIX = TurnPrefix()  # a trial's first turn, or a caller that stores whole records


@dataclass
class Generation:
    """One finished sequence: sampled ids, their logprobs at temperature T, routing of the fed tokens from
    position ``routing_start`` on (0: all of them; a reply of a turn that shares its prefix carries only the
    new rows, ``RoutingRows.full`` puts the previous turn's back)."""

    prompt_len: int
    output_ids: np.ndarray  # int32 [n]
    logprobs: np.ndarray  # float32 [n]
    routing: np.ndarray | None  # [prompt_len + n - 1 - routing_start, layers, k] in routing_dtype(num_experts)
    finish_reason: FinishReason
    policy_version: int = 0  # set by the backend that served it
    error: str | None = None  # finish_reason 'error': why the engine failed (an infrastructure failure)
    routing_start: int = 0

    def _new_rows(self, prefix: TurnPrefix) -> tuple[int, np.ndarray | None]:
        start = max(prefix.routing_start(self.policy_version, self.routing), self.routing_start)
        rows = None if self.routing is None else self.routing[start - self.routing_start:]
        return start, rows

    def to_reply(self, trial_id: str, turn: int, prefix: TurnPrefix = NO_PREFIX) -> GenerateReply:
        """The sampler actor's answer to a ``GenerateRequest`` (the prompt stays with the caller, and so do the
        prefix's routing rows)."""
        start, rows = self._new_rows(prefix)
        return GenerateReply(trial_id=trial_id, turn=turn, output_ids=self.output_ids, logprobs=self.logprobs,
                             routing=rows, routing_start=start, policy_version=self.policy_version,
                             finish_reason=self.finish_reason, error=self.error)

    def to_event(self, trial_id: str, turn: int, prompt_ids: np.ndarray, *, temperature: float, top_p: float,
                 sampler_id: str, engine=None, prefix: TurnPrefix = NO_PREFIX,
                 record_routing: bool = True) -> SamplerTurn:
        """The log's record of this turn, stored once: the prompt ids after the ``prefix`` it shares with the
        trial's previous turn, what it sampled, the routing rows the previous turn did not record under this
        version (none with ``record_routing`` False: the trial's trajectory stores them), and the engine (a
        ``backends.sampler_backend.EngineInfo``) that served it."""
        named = {} if engine is None else dict(engine=engine.name, engine_version=engine.version,
                                               engine_start_id=engine.start_id)
        start, rows = self._new_rows(prefix) if record_routing else (0, None)
        return SamplerTurn(trial_id=trial_id, turn=turn, prompt_ids=np.asarray(prompt_ids, np.int32)[prefix.shared:],
                           prefix_len=prefix.shared, sampled_ids=self.output_ids, sampler_logprobs=self.logprobs,
                           routing=rows, routing_start=start, policy_version=self.policy_version,
                           finish_reason=self.finish_reason, temperature=temperature, top_p=top_p,
                           sampler_id=sampler_id, error=self.error, **named)

    @classmethod
    def from_reply(cls, reply: GenerateReply, prompt_len: int) -> Generation:
        return cls(prompt_len, reply.output_ids, reply.logprobs, reply.routing, reply.finish_reason,
                   reply.policy_version, reply.error, reply.routing_start)


class RoutingRows:
    """A trial's routing rows by stream position, in one growing buffer: every turn's rows are a view of it, so a
    trial's turns hold O(its tokens) rows instead of a copy of the whole prefix each (O(turns x tokens)).

    ``full(generation, previous_rows)`` returns the generation with every row (``routing_start`` 0): the rows before
    its ``routing_start`` are ``previous_rows``' (the trial's previous turn, as ``full`` returned it). A turn that
    extends the buffer's end is written in place; one whose new rows start earlier (a re-rendered prefix, a new
    policy version) starts a new buffer, the earlier views untouched."""

    def __init__(self) -> None:
        self._buffer: np.ndarray | None = None
        self._filled = 0

    def full(self, generation: Generation, previous_rows: np.ndarray | None) -> Generation:
        new, start = generation.routing, generation.routing_start
        if new is None:
            return generation
        if start and (previous_rows is None or len(previous_rows) < start):
            raise ValueError(f"a reply starting at routing row {start} needs the previous turn's rows")
        end = start + len(new)
        in_place = (previous_rows is not None and self._buffer is not None and previous_rows.base is self._buffer
                    and start == len(previous_rows) == self._filled and self._buffer.shape[1:] == new.shape[1:]
                    and self._buffer.dtype == new.dtype)
        if not in_place or self._buffer is None or end > len(self._buffer):
            buffer = np.empty((max(2 * end, 1024), *new.shape[1:]), new.dtype)
            if start:
                assert previous_rows is not None
                buffer[:start] = previous_rows[:start]
            self._buffer = buffer
        self._buffer[start:end] = new
        self._filled = end
        return replace(generation, routing=self._buffer[:end], routing_start=0)
