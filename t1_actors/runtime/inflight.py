"""Requests in flight, by trial id, so that a ``Cancel`` can reach the handler serving a trial."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import trio

_REMEMBERED_CANCELS = 10_000


@dataclass(eq=False)
class InFlightRequest:
    trial_id: str | None
    graceful: bool
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    cancel_reason: str | None = None  # set when a Cancel (or shutdown) reached this request


class InFlight:
    """Handlers run inside ``track(trial_id)``; ``cancel(trial_id)`` cancels their scopes.

    A graceful handler (``@handles(..., graceful_cancel=True)``) is not cancelled: its
    ``cancel_reason`` is set and it is expected to check ``Actor.cancel_requested`` and return a
    partial result. A trial once cancelled stays cancelled: later requests for it are refused
    (the last 10,000 cancelled trial ids are remembered), which closes the race of a Cancel that
    overtakes its trial's request.
    """

    def __init__(self) -> None:
        self._by_trial: dict[str | None, set[InFlightRequest]] = {}
        self._cancelled: OrderedDict[str, str] = OrderedDict()
        self._waiters: dict[str, list[trio.Event]] = {}  # trial id -> tasks in ``wait_cancelled``

    @contextmanager
    def track(self, trial_id: str | None, graceful: bool) -> Iterator[InFlightRequest]:
        request = InFlightRequest(trial_id, graceful)
        if trial_id is not None and trial_id in self._cancelled:
            request.cancel_reason = self._cancelled[trial_id]
            request.scope.cancel()
        self._by_trial.setdefault(trial_id, set()).add(request)
        try:
            with request.scope:
                yield request
        finally:
            entries = self._by_trial[trial_id]
            entries.discard(request)
            if not entries:
                del self._by_trial[trial_id]

    def cancel(self, trial_id: str, reason: str) -> int:
        """Cancel the requests of ``trial_id`` (``'*'``: every request that has a trial id). Returns how many."""
        if trial_id == "*":
            targets = [r for key, rs in self._by_trial.items() if key is not None for r in rs]
        else:
            self._cancelled[trial_id] = reason
            self._cancelled.move_to_end(trial_id)
            while len(self._cancelled) > _REMEMBERED_CANCELS:
                self._cancelled.popitem(last=False)
            for waiter in self._waiters.pop(trial_id, ()):
                waiter.set()
            targets = list(self._by_trial.get(trial_id, ()))
        for request in targets:
            request.cancel_reason = reason
            if not request.graceful:
                request.scope.cancel()
        return len(targets)

    def cancel_all(self, reason: str) -> None:
        """Cancel everything in flight, graceful or not (shutdown)."""
        for requests in self._by_trial.values():
            for request in requests:
                request.cancel_reason = reason
                request.scope.cancel()

    def cancel_requested(self, trial_id: str) -> bool:
        return trial_id in self._cancelled

    async def wait_cancelled(self, trial_id: str) -> None:
        """Return once a Cancel for ``trial_id`` has arrived (at once if one already did). A wake-up, not a
        poll: a sampler waits so for each of its generations in flight."""
        if trial_id in self._cancelled:
            return
        waiter = trio.Event()
        self._waiters.setdefault(trial_id, []).append(waiter)
        try:
            await waiter.wait()
        finally:
            waiters = self._waiters.get(trial_id)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiters[trial_id]

    def __len__(self) -> int:
        return sum(len(rs) for rs in self._by_trial.values())
