"""The actor base class in one process: event handlers and the in-flight cancellation waiters."""

from __future__ import annotations

import trio
import trio.testing


def test_on_event_handlers_give_the_followed_kinds_and_dispatch_in_order():
    import pytest
    import trio

    from schemas import LearnerStep, TrialIssued
    from t1_actors.runtime import Actor, on_event

    class Follower(Actor):
        role = "follower"

        def __init__(self):  # no runtime context needed to dispatch
            self.seen = []

        @on_event(TrialIssued)
        async def _issued(self, event):
            self.seen.append(("issued", event.trial_id))

        @on_event(TrialIssued, LearnerStep)
        async def _any(self, event):
            self.seen.append(("any", event.kind))

    class Child(Follower):
        @on_event(LearnerStep)
        async def _stepped(self, event):
            self.seen.append(("stepped", event.step))

    assert Follower.followed_kinds() == ["learner_step", "trial_issued"]
    actor = Child()
    events = [TrialIssued(trial_id="t", task_id="x", policy_version_wanted=0),
              LearnerStep(step=3, policy_version=4, trials=["t"], metrics={})]

    async def feed():
        for event in events:
            await actor.on_logged(event)

    trio.run(feed)
    assert actor.seen == [("issued", "t"), ("any", "trial_issued"), ("any", "learner_step"), ("stepped", 3)]
    with pytest.raises(TypeError, match="on_event"):
        on_event(int)


def test_wait_cancelled_wakes_on_the_cancel_of_its_trial_only():
    from t1_actors.runtime.inflight import InFlight

    async def main():
        inflight = InFlight()
        woke: list[str] = []

        async def waiter(trial: str) -> None:
            await inflight.wait_cancelled(trial)
            woke.append(trial)

        async with trio.open_nursery() as nursery:
            for trial in ("t1", "t1", "t2"):
                nursery.start_soon(waiter, trial)
            await trio.testing.wait_all_tasks_blocked()
            assert woke == [] and sorted(inflight._waiters) == ["t1", "t2"]
            inflight.cancel("t1", "stale")
            await trio.testing.wait_all_tasks_blocked()
            assert woke == ["t1", "t1"] and list(inflight._waiters) == ["t2"]
            nursery.cancel_scope.cancel()  # a waiter cancelled itself leaves nothing behind
        assert inflight._waiters == {}
        with trio.fail_after(1):
            await inflight.wait_cancelled("t1")  # already cancelled: returns at once

    trio.run(main)
