"""What a trial sees of the host's /etc and /var: a read-only *mask* layer, stacked right above the host's
directories and below every image layer, so that the host's accounts and secrets never show.

Guarantees (for the host as it was when the backend started; the mask is remade at each start):

- ``/etc/passwd`` and ``/etc/group`` list only the accounts of a base Debian image (Debian's static
  ``base-passwd`` table: root, daemon, bin, ..., _apt, nobody; root and nobody alone where that table is
  absent), never the host's own (its users, its services' accounts); ``/etc/shadow`` and ``/etc/gshadow``
  hold those same accounts, locked (``*``), no host hash; the ``-`` backups, ``subuid``/``subgid`` and the
  host's ``machine-id`` are gone; ``/etc/hostname`` is the sandbox's (``sandbox``).
  An image's ``useradd`` adds to these as it would in Docker (its layer sits above the mask).
- no file of the host's /etc that the host keeps from its other users (not world-readable: SSH host keys,
  ``/etc/ssl/private``, database auth files) is there; such a directory shows empty.
- ``/etc/hosts`` names localhost and the sandbox's hostname; ``/etc/resolv.conf`` is the host's (builds
  reach package registries); ``/etc/nsswitch.conf`` reads files and DNS only (no host directory service).
- ``/var`` is a fresh skeleton: ``/var/tmp`` (1777), ``/var/log``, ``/var/spool``, ... empty; of the host's,
  only the package managers' state that ``apt-get`` / ``dpkg`` / ``pip`` need (``VAR_KEPT``), less its
  non-world-readable files (debconf's passwords, locks), and dpkg's ``statoverride`` less the lines that
  name a host account (dpkg would refuse every install over them).

Mechanism: overlayfs whiteouts (0/0 character devices) hide a lower entry, opaque directories
(``trusted.overlay.opaque``) hide a lower directory's contents. A host entry made after the backend
started is not masked until the next start.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

from t1_actors.backends._sandbox.layers import Layer

BASE_PASSWD = Path("/usr/share/base-passwd")
FALLBACK_PASSWD = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
FALLBACK_GROUP = "root:x:0:\nnogroup:x:65534:\n"
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n"
NSSWITCH = ("passwd: files\ngroup: files\nshadow: files\ngshadow: files\nhosts: files dns\nnetworks: files\n"
            "protocols: files\nservices: files\nethers: files\nrpc: files\nnetgroup: files\n")
ETC_REMOVED = ("passwd-", "group-", "shadow-", "gshadow-", "subuid", "subgid", "subuid-", "subgid-", "machine-id")
VAR_KEPT = ("lib/dpkg", "lib/apt", "lib/ucf", "lib/pam", "lib/python", "lib/sgml-base", "lib/xml-core",
            "lib/shells.state", "lib/misc", "lib/ca-certificates-java", "lib/systemd/deb-systemd-helper-enabled",
            "lib/systemd/deb-systemd-user-helper-enabled", "cache/debconf", "cache/apt", "cache/ldconfig")
"""The host's /var entries a trial sees (package state: dpkg's database, apt's lists, debconf's answers)."""

_WHITEOUT, _OPAQUE, _FILE = "whiteout", "opaque", "file"


def accounts() -> tuple[str, str]:
    """(passwd, group) of a base Debian image: base-passwd's master tables (with apt's _apt user, as images have)."""
    try:
        passwd = (BASE_PASSWD / "passwd.master").read_text()
        group = (BASE_PASSWD / "group.master").read_text()
    except OSError:
        return FALLBACK_PASSWD, FALLBACK_GROUP
    if not any(line.startswith("_apt:") for line in passwd.splitlines()):
        passwd += "_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\n"
    return passwd, group


def _names(table: str) -> list[str]:
    return [line.split(":")[0] for line in table.splitlines() if line.strip()]


def _plan_etc() -> list[tuple[str, str, int, int, int, str]]:
    """(path under /etc, op, mode, uid, gid, content) for every entry the mask lays."""
    passwd, group = accounts()
    shadow_gid = next((int(line.split(":")[2]) for line in group.splitlines() if line.startswith("shadow:")), 0)
    try:
        resolv = Path("/etc/resolv.conf").read_text()
    except OSError:
        resolv = ""
    ops: list[tuple[str, str, int, int, int, str]] = [
        ("passwd", _FILE, 0o644, 0, 0, passwd), ("group", _FILE, 0o644, 0, 0, group),
        ("shadow", _FILE, 0o640, 0, shadow_gid, "".join(f"{n}:*:19000:0:99999:7:::\n" for n in _names(passwd))),
        ("gshadow", _FILE, 0o640, 0, shadow_gid, "".join(f"{n}:*::\n" for n in _names(group))),
        ("hosts", _FILE, 0o644, 0, 0, HOSTS), ("resolv.conf", _FILE, 0o644, 0, 0, resolv),
        ("nsswitch.conf", _FILE, 0o644, 0, 0, NSSWITCH), ("hostname", _FILE, 0o644, 0, 0, "sandbox\n")]
    laid = {op[0] for op in ops}
    ops += [(name, _WHITEOUT, 0, 0, 0, "") for name in ETC_REMOVED if os.path.lexists(f"/etc/{name}")]
    laid.update(ETC_REMOVED)
    ops += [op for op in _private("/etc", "") if op[0] not in laid]
    return ops


def _private(host_dir: str, prefix: str) -> list[tuple[str, str, int, int, int, str]]:
    """Masks for what under ``host_dir`` is not world-readable: files whited out, directories emptied."""
    ops = []
    for top, dirs, files in os.walk(host_dir):
        rel_top = os.path.relpath(top, host_dir)
        rel = "" if rel_top == "." else rel_top + "/"
        for name in list(dirs):
            st = os.lstat(os.path.join(top, name))
            if stat.S_ISDIR(st.st_mode) and (st.st_mode & 0o005) != 0o005:
                ops.append((prefix + rel + name, _OPAQUE, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, ""))
                dirs.remove(name)
        for name in files:
            st = os.lstat(os.path.join(top, name))
            if not stat.S_ISLNK(st.st_mode) and not st.st_mode & 0o004:
                ops.append((prefix + rel + name, _WHITEOUT, 0, 0, 0, ""))
    return ops


def _plan_var() -> list[tuple[str, str, int, int, int, str]]:
    ops: list[tuple[str, str, int, int, int, str]] = []
    kept = set(VAR_KEPT)
    parents = {"/".join(k.split("/")[:i]) for k in VAR_KEPT for i in range(1, k.count("/") + 1)}

    def visit(rel: str) -> None:
        for name in sorted(os.listdir(f"/var/{rel}")):
            path = f"{rel}{name}"
            host = f"/var/{path}"
            st = os.lstat(host)
            if path in kept:
                ops.extend(_private(host, path + "/") if stat.S_ISDIR(st.st_mode) else
                           [] if st.st_mode & 0o004 else [(path, _WHITEOUT, 0, 0, 0, "")])
            elif path in parents and stat.S_ISDIR(st.st_mode):
                visit(path + "/")
            elif not rel and stat.S_ISLNK(st.st_mode):
                continue  # /var/run -> /run, /var/lock -> /run/lock: they point into the sandbox's own /run
            elif not rel and stat.S_ISDIR(st.st_mode):  # a top-level dir: there, empty (tmp: 1777)
                mode = 0o1777 if name == "tmp" else stat.S_IMODE(st.st_mode)
                ops.append((path, _OPAQUE, mode, st.st_uid, st.st_gid, ""))
            else:
                ops.append((path, _WHITEOUT, 0, 0, 0, ""))
    if os.path.isdir("/var"):
        visit("")
    ops += _statoverride()
    return ops


def _statoverride() -> list[tuple[str, str, int, int, int, str]]:
    """dpkg's statoverride less the lines naming an account the trial lacks (dpkg refuses to install anything
    while one names an unknown user or group; those are the host's: ``ssl-cert``, ``messagebus``)."""
    path = Path("/var/lib/dpkg/statoverride")
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    passwd, group = accounts()
    users, groups = set(_names(passwd)), set(_names(group))
    kept = [line for line in lines if len(line.split()) >= 4 and line.split()[0].lstrip("#") in users
            and line.split()[1].lstrip("#") in groups]
    ops = [("lib/dpkg/statoverride", _FILE, 0o644, 0, 0, "".join(line + "\n" for line in kept))]
    if os.path.lexists("/var/lib/dpkg/statoverride-old"):
        ops.append(("lib/dpkg/statoverride-old", _WHITEOUT, 0, 0, 0, ""))
    return ops


def make_mask(base: Path, system_dirs: tuple[str, ...]) -> Layer:
    """The mask layer of the host as it is now, under ``base`` (one per distinct content, shared, never changed
    once made: live trials keep theirs)."""
    plan = {"etc": _plan_etc() if "etc" in system_dirs else [], "var": _plan_var() if "var" in system_dirs else []}
    digest = hashlib.sha256(json.dumps([plan, list(system_dirs)]).encode()).hexdigest()[:24]
    final = base / digest
    if (final / "done").is_file():
        return Layer(final)
    scratch = base / f"{digest}.making-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    layer = Layer(scratch).create(system_dirs)
    for top, ops in plan.items():
        for path, op, mode, uid, gid, content in ops:
            target = layer.sys(top) / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if op == _WHITEOUT:
                os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))
            elif op == _OPAQUE:
                target.mkdir(exist_ok=True)
                os.setxattr(target, "trusted.overlay.opaque", b"y")
                os.chown(target, uid, gid)
                os.chmod(target, mode)
            else:
                target.write_text(content)
                os.chown(target, uid, gid)
                os.chmod(target, mode)
    (scratch / "done").write_text("")
    try:
        os.rename(scratch, final)
    except OSError:  # another process made it first
        shutil.rmtree(scratch, ignore_errors=True)
    return Layer(final)
