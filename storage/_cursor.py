"""Cursor: exactly-once consumption of the merged log from a saved position."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

import trio

from schemas.events import Event

if TYPE_CHECKING:
    from storage._log import EventLog


class Cursor:
    """Tails the log. ``position`` maps each writer id to the number of its events already consumed;
    it is plain JSON. Save it after handling a batch; a cursor made from it resumes right after."""

    def __init__(self, log: EventLog, position: Mapping[str, int] | None, *, kinds: frozenset[str] | None):
        self._log = log
        self._kinds = kinds
        self._position: dict[str, int] = {}
        for writer, seq in dict(position or {}).items():
            if not isinstance(writer, str) or not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                raise ValueError(f"bad cursor position entry {writer!r}: {seq!r} "
                                 "(expected writer id -> count of events consumed)")
            self._position[writer] = seq

    @property
    def position(self) -> dict[str, int]:
        return dict(self._position)

    def poll(self, max_events: int | None = None) -> list[tuple[str, Event]]:
        """Committed events not yet consumed (merged by append time), and advance past them.

        With ``max_events``, at most that many are returned (events of other kinds skipped on the way
        still count as consumed); the rest come with the next poll.
        """
        log = self._log
        with log._lock:
            log.refresh()
            fresh = []
            for writer, reader in log._segments.items():
                for seq in range(self._position.get(writer, 0), reader.event_count):
                    fresh.append((reader.meta[seq].ts, writer, seq))
            fresh.sort()  # per writer, append times never decrease: a prefix of this is a prefix per writer
            position = dict(self._position)
            chosen: list[tuple[str, int]] = []
            for _, writer, seq in fresh:
                if max_events is not None and len(chosen) >= max_events:
                    break
                position[writer] = seq + 1
                if self._kinds is None or log._segments[writer].meta[seq].kind in self._kinds:
                    chosen.append((writer, seq))
            batch = [(f"{w}:{s}", event) for (w, s), event in zip(chosen, log._load_many(chosen))]
            self._position = position  # only once every event of the batch was read and checked
            return batch

    async def apoll(self, max_events: int | None = None) -> list[tuple[str, Event]]:
        return await trio.to_thread.run_sync(self.poll, max_events)

    async def atail(self, *, interval: float = 0.05,
                    max_events: int | None = None) -> AsyncIterator[list[tuple[str, Event]]]:
        """Yield non-empty batches as they are committed, forever; stop it with a cancel scope
        (``with trio.move_on_after(...)``) or by breaking out of the loop."""
        while True:
            batch = await self.apoll(max_events)
            if batch:
                yield batch
            else:
                await trio.sleep(interval)
