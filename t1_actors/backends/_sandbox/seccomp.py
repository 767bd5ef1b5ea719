"""The system calls a sandboxed command may not make: a seccomp filter in the spirit of Docker's default
profile, compiled once per process with libseccomp (``pyseccomp``) and handed to ``bwrap --seccomp FD``
(bubblewrap loads it just before it execs the command, after it has made the namespaces it needs).

Guarantee: every command of a trial (and every environment build step) runs under this filter when
``[sandbox.local] seccomp = true`` (the default). A refused call fails with EPERM (``clone3``: ENOSYS, so
glibc falls back to ``clone``, whose flags the filter can read); a call of another architecture (i386
through ``int 0x80``, x32 numbers) fails with EPERM. What is refused, and why, is ``DENIED`` below:
no new namespaces (so no nested user namespace: ``unshare -Ur id`` is refused), no mounts, no kernel
keyrings, no bpf / perf / io_uring / userfaultfd, no modules, kexec, reboot, swap, clock or accounting
changes, no raw port I/O, no kernel log, and no ``personality`` flags that turn off ASLR.

How it differs from Docker's default profile: Docker's is an allow-list (every call not named is
refused), this is a deny-list (every call not named is allowed), so a system call that a future kernel
adds is allowed here until it is listed. Docker's lets calls through when the container holds the
capability that guards them (CAP_SYS_ADMIN, CAP_SYS_PTRACE, ...); the sandbox never grants those, so they
are refused outright. ``ptrace`` / ``process_vm_readv`` / ``kcmp`` are allowed, as in Docker >= 19.03 on
kernels >= 4.8 (the pid namespace leaves nothing but the trial's own processes to trace; ``strace`` and
``gdb`` work). Docker allows i386 and x32 calls; they are refused here.
"""

from __future__ import annotations

import errno
import os
import threading

from t1_actors.backends._sandbox.interface import SandboxInfraError

CLONE_NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                         "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                         "CLONE_NEWNET": 0x40000000}
# personality(2) flags that weaken the exec protections (ADDR_NO_RANDOMIZE: `setarch -R` turns off ASLR)
PERSONALITY_FLAGS = {"ADDR_NO_RANDOMIZE": 0x0040000, "MMAP_PAGE_ZERO": 0x0100000, "ADDR_COMPAT_LAYOUT": 0x0200000,
                     "READ_IMPLIES_EXEC": 0x0400000}
AF_VSOCK = 40

_NAMESPACES = "makes or joins namespaces (a nested user namespace hands back every capability)"
_MOUNTS = "changes mounts (CAP_SYS_ADMIN in Docker)"
_KEYS = "the kernel keyrings are not namespaced: keys are shared with the host"
_KERNEL = "changes the running kernel"
_HOST = "changes the whole host"
_CLOCK = "sets the host's clock"
_UNUSED = "obsolete or unimplemented; only an exploit calls it"

DENIED: dict[str, str] = {
    "unshare": _NAMESPACES, "setns": _NAMESPACES,
    "mount": _MOUNTS, "umount2": _MOUNTS, "pivot_root": _MOUNTS, "fsopen": _MOUNTS, "fsconfig": _MOUNTS,
    "fsmount": _MOUNTS, "fspick": _MOUNTS, "move_mount": _MOUNTS, "open_tree": _MOUNTS, "mount_setattr": _MOUNTS,
    "add_key": _KEYS, "request_key": _KEYS, "keyctl": _KEYS,
    "bpf": "loads programs into the kernel", "perf_event_open": "reads the host's performance counters",
    "userfaultfd": "stalls kernel page faults: the classic race-exploit helper",
    "io_uring_setup": "io_uring: a large attack surface (Docker refuses it since 25.0)",
    "io_uring_enter": "io_uring", "io_uring_register": "io_uring",
    "init_module": _KERNEL, "finit_module": _KERNEL, "delete_module": _KERNEL, "create_module": _KERNEL,
    "query_module": _UNUSED, "get_kernel_syms": _UNUSED, "kexec_load": _KERNEL, "kexec_file_load": _KERNEL,
    "reboot": _HOST, "swapon": _HOST, "swapoff": _HOST, "acct": _HOST, "quotactl": _HOST, "quotactl_fd": _HOST,
    "nfsservctl": _UNUSED, "syslog": "reads the kernel log", "vhangup": _HOST, "_sysctl": _UNUSED,
    "settimeofday": _CLOCK, "clock_settime": _CLOCK, "clock_adjtime": _CLOCK, "adjtimex": _CLOCK,
    "open_by_handle_at": "opens host files by handle, past the root (the 'shocker' escape)",
    "lookup_dcookie": "kernel profiling internals", "iopl": "raw I/O ports", "ioperm": "raw I/O ports",
    "vm86": "legacy x86 mode", "vm86old": "legacy x86 mode", "uselib": _UNUSED, "ustat": _UNUSED,
    "sysfs": _UNUSED, "afs_syscall": _UNUSED, "tuxcall": _UNUSED, "security": _UNUSED, "putpmsg": _UNUSED,
    "getpmsg": _UNUSED, "fanotify_init": "watches the host's filesystems (CAP_SYS_ADMIN)",
    "mbind": "NUMA policy (CAP_SYS_NICE in Docker)", "set_mempolicy": "NUMA policy", "move_pages": "NUMA policy",
    "migrate_pages": "NUMA policy",
}
"""Refused outright with EPERM: system call -> why (names this architecture lacks are skipped)."""

FLAG_DENIED: dict[str, str] = {
    "clone": f"refused when its flags ask for a namespace ({', '.join(CLONE_NAMESPACE_FLAGS)}): {_NAMESPACES}",
    "clone3": "answers ENOSYS: its flags sit in memory the filter cannot read, so glibc falls back to clone",
    "personality": f"refused with {', '.join(PERSONALITY_FLAGS)} (no ASLR, executable data)",
    "socket": "refused for AF_VSOCK (talks to the hypervisor)",
}
"""Refused depending on their arguments."""

_lock = threading.Lock()
_compiled: bytes | None = None


def _build() -> bytes:
    import pyseccomp as sc  # noqa: PLC0415 - loads libseccomp only when a sandbox is made

    deny = sc.ERRNO(errno.EPERM)
    flt = sc.SyscallFilter(sc.ALLOW)
    flt.set_attr(sc.Attr.ACT_BADARCH, deny)  # i386 / x32 calls: refused
    for name in DENIED:
        try:
            flt.add_rule(deny, name)
        except (OSError, ValueError):  # not a call of this architecture
            continue
    for bit in CLONE_NAMESPACE_FLAGS.values():
        flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
    for bit in PERSONALITY_FLAGS.values():  # bit 31 clear: personality(0xffffffff) only asks the current one
        flt.add_rule(deny, "personality", sc.Arg(0, sc.MASKED_EQ, bit | 0x80000000, bit))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    flt.add_rule(deny, "socket", sc.Arg(0, sc.EQ, AF_VSOCK))
    with os.fdopen(os.memfd_create("t1-seccomp-build"), "w+b") as sink:
        flt.export_bpf(sink)
        sink.seek(0)
        return sink.read()


def compiled() -> bytes:
    """The filter as classic BPF (what ``bwrap --seccomp`` reads), built once per process."""
    global _compiled
    with _lock:
        if _compiled is None:
            try:
                _compiled = _build()
            except (ImportError, OSError, AttributeError) as exc:  # no pyseccomp, or no libseccomp.so.2
                raise SandboxInfraError(f"the sandbox's seccomp filter cannot be built ({exc}): pip install "
                                        f"pyseccomp and apt-get install libseccomp2, or set [sandbox.local] "
                                        f"seccomp = false (no system-call filter)") from exc
        return _compiled


def filter_fd() -> int:
    """A fresh file descriptor holding the compiled filter, at offset 0, for one bwrap (the caller closes it)."""
    fd = os.memfd_create("t1-seccomp", 0)
    data = compiled()
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
