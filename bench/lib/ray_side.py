"""The comparison users know: the same round trip and the same bulk transfer through a Ray actor.

Round trip: ``ray.get(actor.echo.remote(payload))`` with the bench's 256-byte payload. Bulk: ``count``
arrays of the bench's bulk size passed to one Ray actor, which reads every byte (a sum over them: Ray
hands large arrays over zero-copy from its object store, so a receiver that did not read them would
measure nothing); MB/s from the first call until every call has returned.
"""

from __future__ import annotations

import time

import numpy as np


class RaySide:
    def __init__(self, ray, actor):
        self.ray, self.actor = ray, actor

    @classmethod
    def start(cls) -> tuple[RaySide | None, str | None]:
        """A local Ray with one echo actor, or (None, why not)."""
        try:
            import ray
        except ImportError:
            return None, "ray is not installed (pip install ray; it is in the dev extra)"
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 configure_logging=False)

        @ray.remote
        class Echo:
            def echo(self, payload: bytes) -> bytes:
                return payload

            def consume(self, array: np.ndarray) -> int:
                return int(array.sum(dtype=np.uint64))  # reads every byte

        actor = Echo.remote()
        ray.get(actor.echo.remote(b"warm"))
        return cls(ray, actor), None

    def rtt_block(self, payload: bytes, n: int) -> list[float]:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.ray.get(self.actor.echo.remote(payload))
            times.append(time.perf_counter() - t0)
        return times

    def bulk(self, blob: bytes, count: int) -> float:
        array = np.frombuffer(blob, dtype=np.uint8)
        t0 = time.perf_counter()
        self.ray.get([self.actor.consume.remote(array) for _ in range(count)])
        return len(blob) * count / (time.perf_counter() - t0) / 1e6

    def stop(self) -> None:
        self.ray.shutdown()
