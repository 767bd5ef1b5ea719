"""Entry point of a CPU SGLang server, run by the SGLang venv's Python (never imported by t1 itself).

``t1_actors.backends.sglang_server`` starts ``<sglang venv>/bin/python _sglang_boot.py ARGS...`` where ARGS are
``sglang.launch_server``'s. This file imports only the standard library and sglang, so it runs under
SGLang's own torch (t1's environment pins another one).

One patch, applied at import time of this module, never by editing site-packages: the routed-experts
capturer allocates its host buffer with pinned (CUDA-registered) memory, which fails on a machine with
no NVIDIA driver ("Found no NVIDIA driver"). On the CPU engine the buffer is plain host memory: pinning
only speeds up device-to-host copies, and there is no device. SGLang's scheduler runs in processes
started with the ``spawn`` method, which re-import this file as ``__mp_main__``; the patch therefore
lives at module level so every process of the server gets it.

The server stops with the process that started it, however that one ended: the launcher gives the server
its own session (a Ctrl-C aimed at the campaign must not reach it), so a campaign killed with SIGKILL, whose
atexit never runs, would otherwise leave a server holding gigabytes and a port.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


def _unpin_host_buffers() -> None:
    """Host caches on the CPU engine: allocated unpinned (the capturer asks for ``pin_memory=True``)."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        return
    from sglang.srt.mem_cache.pool_host import common  # noqa: PLC0415 - optional extra (runs in the sglang venv)

    def allocate_unpinned(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
        del pin_memory, registration_granularity_bytes  # no device: nothing to pin or register for
        if allocator is None:
            import torch  # noqa: PLC0415 - optional extra: an sglang hook, run in the sglang venv
            return torch.empty(dims, dtype=dtype, device=device)
        return allocator.allocate(dims, dtype=dtype, device=device)

    common.ALLOC_MEMORY_FUNCS["cpu"] = allocate_unpinned


_unpin_host_buffers()


def _stop_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """A daemon thread: once ``parent`` is no longer this process's parent (it died and we were re-parented),
    SIGKILL this server's whole process group. Nothing of a server needs saving, and its scheduler
    processes may not honour SIGTERM: a group SIGKILL is the one stop that always takes them all."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="t1-stop-with-parent", daemon=True).start()


def main(argv: list[str]) -> None:
    """What ``python -m sglang.launch_server ARGV`` does, with this file staying ``__main__`` (see above)."""
    from sglang.launch_server import run_server  # noqa: PLC0415 - optional extra (runs in the sglang venv)
    from sglang.srt.plugins import load_plugins  # noqa: PLC0415 - optional extra (runs in the sglang venv)
    from sglang.srt.server_args import prepare_server_args  # noqa: PLC0415 - optional extra (runs in the sglang venv)
    from sglang.srt.utils import kill_process_tree  # noqa: PLC0415 - optional extra (runs in the sglang venv)

    _stop_with_parent(os.getppid())
    load_plugins()
    server_args = prepare_server_args(argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
