"""``@trio_test``: run an async test function in a fresh trio loop (one helper for every test module)."""

from __future__ import annotations

import functools

import trio


def trio_test(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return trio.run(functools.partial(fn, *args, **kwargs))
    return run
