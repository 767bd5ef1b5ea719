"""Reuse of large buffers in a process that moves bulk messages (glibc's malloc only).

By default glibc serves blocks above a threshold (128 KiB, raised on the fly up to the largest block
freed so far) with a fresh mmap, and hands a free heap top larger than twice that back to the kernel.
A process that moves a stream of multi-MiB messages (nng's buffers, the decoder's bytes: weights,
trajectories) with several in flight then keeps unmapping and mapping them again, and the kernel
zero-fills every page of every message on first touch: measured here, ~200 page faults and 0.3-0.5 ms
of CPU per 4 MiB message, a sixth of what the whole transfer costs (bench/control_plane.py).
``keep_freed_buffers`` fixes both thresholds so that freed buffers stay in the heap for the next message.
The price: up to ``keep_bytes`` of freed memory stays resident instead of going back to the kernel.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_GLIBC_MAX_MMAP_THRESHOLD = 32 << 20  # mallopt refuses more on 64-bit glibc


def keep_freed_buffers(keep_bytes: int = 256 << 20) -> bool:
    """Blocks up to 32 MiB come from the heap and freed ones stay there (up to ``keep_bytes`` of free heap
    top). Returns False where the C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _GLIBC_MAX_MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, keep_bytes))
