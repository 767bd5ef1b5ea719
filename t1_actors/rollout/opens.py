"""Sandboxes that cannot be opened: the trial ends as an infrastructure failure, and the run does not spin on them.

The sandbox actor answers a ``SandboxOpen`` it cannot serve for a failure of its own infrastructure (an environment
that cannot be built, ``SandboxBuildError``; the disk budget spent, ``DiskBudgetExceeded``; any other
``SandboxInfraError``) with an error reply marked so; ``TrialPorts.open_sandbox`` raises ``SandboxUnavailable`` for
it, and only for it (any other failure of the open propagates). The trial then ends with
``TrialEnded(finish="infra_error", infra_error="sandbox not opened: ...")``: never played, verified, scored or
trained on. A train batch issues another trial in its place; an eval pass leaves it out of its ``n`` (its scored
attempts), as it does every infrastructure failure.

``SandboxOpens`` keeps such failures from becoming a loop:

- while opens fail and sandboxes are still held (or being opened), the next ones go one at a time, each after a
  backoff that doubles per failure (``backoff_s`` up to ``backoff_max_s``): a disk budget full of running trials
  frees up as they end, and meanwhile the controller does not issue a refused trial per round trip;
- a refusal that frees up as other trials end (``WAITS_FOR_OTHERS``: the disk budget) is asked again, after the
  backoff, for up to ``wait_s``: the trial waits for its share instead of ending (an eval pass would otherwise
  lose tasks to a full budget, and its pairing with them);
- ``limit`` failures in a row (no open succeeded in between) with no sandbox held or being opened end the run:
  every open fails, so nothing will free up. ``SandboxesUnavailable`` names the sandbox's last error and the fix.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

SANDBOX_NOT_OPENED = "sandbox not opened"  # TrialEnded.infra_error of a trial whose sandbox could not be opened
# the sandbox's refusals that other trials' ends undo (its reply's detail starts with the error's type name)
WAITS_FOR_OTHERS = ("DiskBudgetExceeded",)


class SandboxUnavailable(Exception):
    """The sandbox of a trial could not be opened: the sandbox's infrastructure failed (its error names what)."""


class SandboxesUnavailable(RuntimeError):
    """Every sandbox open fails: the run cannot play any trial."""


class SandboxOpens:
    """The sandbox opens of one runner's trials: the sandboxes held, the failures in a row, the backoff, the bound."""

    def __init__(self, limit: int = 10, *, backoff_s: float = 1.0, backoff_max_s: float = 30.0,
                 wait_s: float = 1800.0):
        if limit < 1:
            raise ValueError(f"max_open_failures = {limit}: at least 1")
        self.limit, self.backoff_s, self.backoff_max_s = limit, backoff_s, backoff_max_s
        self.wait_s = wait_s  # how long a trial refused for a share others hold asks again
        self.held: set[str] = set()  # sandboxes opened and not yet closed
        self.pending = 0  # opens asked for and not yet answered
        self.failed_in_row = 0  # failures since the last open that succeeded
        self.failed = 0  # all failures
        self.last_error = ""
        self.retry_at = 0.0  # trio time before which a throttled open waits
        self.exhausted: SandboxesUnavailable | None = None  # the bound was reached
        self._raised = False
        self._lock = trio.Lock()

    def throttled(self) -> bool:
        """Opens are failing while other sandboxes are held or on their way: one at a time, after the backoff."""
        return self.failed_in_row > 0 and bool(self.held or self.pending)

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait for this open's turn, then send it inside the block; a throttled one keeps the others waiting until
        it is answered (a success lets them all go at once)."""
        if self.throttled():
            async with self._lock:
                if self.throttled():
                    await trio.sleep_until(self.retry_at)
                    self.pending += 1
                    try:
                        yield
                    finally:
                        self.pending -= 1
                    return
        self.pending += 1
        try:
            yield
        finally:
            self.pending -= 1

    def may_wait(self, error: str, waited_s: float) -> bool:
        """Whether a trial refused with ``error`` ``waited_s`` ago asks again: a refusal other trials' ends undo,
        within ``wait_s``. The disk budget refuses only while other trials hold shares of it (the config check
        refuses a budget below one trial's disk), this runner's or another's, open or being deleted."""
        return error.startswith(WAITS_FOR_OTHERS) and waited_s < self.wait_s

    def succeeded(self, sandbox_id: str) -> None:
        self.held.add(sandbox_id)
        self.failed_in_row = 0

    def closed(self, sandbox_id: str) -> None:
        self.held.discard(sandbox_id)

    def fail(self, error: str) -> None:
        """Count a failed open (called inside its ``turn``, so ``pending`` still counts it)."""
        self.failed += 1
        self.failed_in_row += 1
        self.last_error = error
        self.retry_at = trio.current_time() + min(self.backoff_max_s, self.backoff_s * 2 ** min(self.failed_in_row - 1, 16))
        if self.failed_in_row >= self.limit and not self.held and self.pending <= 1 and self.exhausted is None:
            self.exhausted = SandboxesUnavailable(
                f"{self.failed_in_row} sandbox opens in a row failed and none is open: the sandbox actor cannot open "
                f"any; the last: {error}. Fix what it names (a task environment that cannot be built; the disk "
                "budget: [sandbox.local] disk_mb, disk_total_mb), then t1-actor launch --resume "
                "([staleness] max_open_failures bounds this)")

    def raise_if_exhausted(self) -> None:
        """Raise ``SandboxesUnavailable`` once (after the trial that reached the bound logged its ending)."""
        if self.exhausted is not None and not self._raised:
            self._raised = True
            raise self.exhausted
