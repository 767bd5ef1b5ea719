"""runtime.reachability.PeerWatch: one ``unreachable`` event per outage longer than the timeout, then one
``reachable`` event when the peer answers again; short gaps and never-seen peers log nothing. The peer here
is a scripted call (answers, or misses its deadline, by trio's clock); the cross-host behaviour over real
links is tests/test_campaign_netns.py."""

from __future__ import annotations

import trio
import trio.testing

from schemas.events import ActorLifecycle
from t1_actors.runtime.errors import DeadlineExceeded
from t1_actors.runtime.reachability import PeerWatch


def _watch_over(outages: dict[str, list[tuple[float, float]]], run_for: float, timeout_s: float = 3.0):
    """Run a PeerWatch for ``run_for`` (virtual) seconds; peers miss every ping inside their outages."""
    logged: list[tuple[float, ActorLifecycle]] = []

    async def call(name: str, deadline_s: float):
        now = trio.current_time()
        if any(start <= now < end for start, end in outages[name]):
            await trio.sleep(deadline_s)
            raise DeadlineExceeded(name, "ping", deadline_s)
        await trio.sleep(0.001)

    async def log(event):
        logged.append((trio.current_time(), event))

    async def main():
        watch = PeerWatch("staleness-0", {name: "sampler" for name in outages}, call, log,
                          interval_s=0.5, timeout_s=timeout_s)
        with trio.move_on_after(run_for):
            await watch.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return [(round(t, 1), e.actor, e.state) for t, e in logged]


def test_an_outage_longer_than_the_timeout_is_logged_once_down_and_once_up():
    logged = _watch_over({"sampler-0": [(5.0, 15.0)], "sampler-1": []}, run_for=30.0)
    assert [(actor, state) for _, actor, state in logged] == [("sampler-0", "unreachable"), ("sampler-0", "reachable")]
    (down, _, _), (up, _, _) = logged
    assert 5.0 + 3.0 <= down <= 5.0 + 3.0 + 1.0  # noticed within a ping interval of the timeout
    assert 15.0 <= up <= 15.0 + 1.0


def test_short_gaps_and_peers_never_seen_log_nothing():
    logged = _watch_over({"sampler-0": [(5.0, 7.0), (10.0, 12.0)], "sampler-1": [(0.0, 60.0)]}, run_for=30.0)
    assert logged == []


def test_two_outages_give_two_pairs():
    logged = _watch_over({"sampler-0": [(2.0, 8.0), (12.0, 20.0)]}, run_for=30.0)
    assert [state for _, _, state in logged] == ["unreachable", "reachable", "unreachable", "reachable"]
