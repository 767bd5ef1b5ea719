"""The few Linux calls the sandbox needs that Python 3.11's ``os`` lacks (mount, unshare, pivot_root,
capabilities), through libc. Each raises OSError with errno and the arguments on failure."""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import socket
import struct

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
_CAP_LAST = 40

# Docker's default capability set, less CAP_MKNOD (a device node would reach the host's disks).
DOCKER_DEFAULT_CAPS = {
    "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3, "CAP_FSETID": 4, "CAP_KILL": 5,
    "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_NET_BIND_SERVICE": 10, "CAP_NET_RAW": 13,
    "CAP_SYS_CHROOT": 18, "CAP_AUDIT_WRITE": 29, "CAP_SETFCAP": 31,
}


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                       ctypes.c_ulong(flags), data.encode() if data else None),
           f"mount {fstype or 'bind'} {source} on {target} ({data or ''})")


def umount(target: str, flags: int = MNT_DETACH) -> None:
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare {flags:#x}")


def pivot_root(new_root: str, put_old: str) -> None:
    _check(_libc.syscall(155, new_root.encode(), put_old.encode()), f"pivot_root {new_root}")  # SYS_pivot_root x86_64


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def mount_overlay(target: str, lowers: list[str], upper: str | None = None, work: str | None = None) -> None:
    """overlayfs at ``target``: ``lowers`` top first; read-only when there is no upper."""
    options = "lowerdir=" + ":".join(lowers)
    if upper is not None:
        options += f",upperdir={upper},workdir={work}"
    mount("overlay", target, "overlay", 0, options)


def bind(source: str, target: str, *, read_only: bool = False, recursive: bool = False) -> None:
    mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    if read_only:
        mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def limit_capabilities(keep: dict[str, int] = DOCKER_DEFAULT_CAPS) -> None:
    """Drop every capability not in ``keep``, from the bounding set too (so no exec regains it)."""
    kept = set(keep.values())
    for cap in range(_CAP_LAST + 1):
        if cap not in kept:
            try:
                prctl(PR_CAPBSET_DROP, cap)
            except OSError as exc:
                if exc.errno != 22:  # EINVAL: this kernel has no such capability
                    raise
    mask = sum(1 << c for c in kept)
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)(_CapData(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0), _CapData(mask >> 32, mask >> 32, 0))
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def set_loopback_up() -> None:
    """Bring ``lo`` up in a fresh network namespace (tests may serve on localhost)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, 0x8913, ifreq))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1))  # SIOCSIFFLAGS, IFF_UP


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


RESOLVE_IN_ROOT = 0x10
_SYS_OPENAT2 = 437


def openat2(dir_fd: int, path: str, flags: int, mode: int = 0, resolve: int = RESOLVE_IN_ROOT) -> int:
    """openat2(2): with RESOLVE_IN_ROOT, absolute paths and symlinks resolve inside ``dir_fd`` (a jail)."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & (os.O_CREAT | os.O_TMPFILE) else 0, resolve)
    return _check(_libc.syscall(_SYS_OPENAT2, dir_fd, path.encode(), ctypes.byref(how), ctypes.sizeof(how)),
                  f"openat2 {path}")
