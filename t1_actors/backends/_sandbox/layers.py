"""Copy-on-write roots from overlayfs layers, the way an image and a container stack up.

A root is a *skeleton* (fresh FHS dirs: /tmp, /root, /opt, /home, ...; the host's top-level symlinks
such as /bin -> usr/bin) under zero or more read-only *layers* (an image build), under one writable
*upper* layer (a trial). The host's system directories (/usr, /etc, /var, ...) are the bottom of their
own stacks, mounted at ``root/<dir>``: they are read, never written; every change lands in the upper.

A layer directory holds ``root/`` (changes at the top level: /app, /opt, /data, /tmp, ...) and
``sys/<dir>/`` (changes inside each host system directory), so the agent's whole diff is the trial's
upper layer: cheap to scan, and stackable under another upper (the verifier's throwaway one).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from t1_actors.backends._sandbox import linux

_CANDIDATE_SYSTEM_DIRS = ("usr", "etc", "var", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
FRESH_DIRS = {"tmp": 0o1777, "root": 0o700, "opt": 0o755, "srv": 0o755, "home": 0o755, "mnt": 0o755,
              "media": 0o755, "run": 0o755, "boot": 0o755, "proc": 0o555, "dev": 0o755, "sys": 0o555}


def host_system_dirs() -> tuple[tuple[str, ...], dict[str, str]]:
    """(the host's top-level system directories, its top-level symlinks among them -> their targets)."""
    dirs, links = [], {}
    for name in _CANDIDATE_SYSTEM_DIRS:
        path = Path("/") / name
        if path.is_symlink():
            links[name] = os.readlink(path)
        elif path.is_dir():
            dirs.append(name)
    return tuple(dirs), links


def make_skeleton(path: Path) -> tuple[str, ...]:
    """Write the skeleton root at ``path`` (idempotent); returns the system dirs it leaves mountpoints for."""
    system_dirs, links = host_system_dirs()
    path.mkdir(parents=True, exist_ok=True)
    for name, mode in FRESH_DIRS.items():
        (path / name).mkdir(exist_ok=True)
        os.chmod(path / name, mode)
    for name in system_dirs:
        (path / name).mkdir(exist_ok=True)
    for name, target in links.items():
        if not (path / name).is_symlink():
            os.symlink(target, path / name)
    return system_dirs


@dataclass(frozen=True)
class Layer:
    """One layer directory: ``root/`` and ``sys/<dir>/`` (see the module docstring)."""

    path: Path

    def root(self) -> Path:
        return self.path / "root"

    def sys(self, name: str) -> Path:
        return self.path / "sys" / name

    def create(self, system_dirs: tuple[str, ...]) -> Layer:
        self.root().mkdir(parents=True, exist_ok=True)
        for name in system_dirs:
            self.sys(name).mkdir(parents=True, exist_ok=True)
        return self


@dataclass(frozen=True)
class RootStack:
    """Everything below a trial's upper layer: skeleton, read-only image layers (top first), system dirs."""

    skeleton: Path
    layers: tuple[Layer, ...]
    system_dirs: tuple[str, ...]

    def mount(self, target: Path, upper: Layer | None, work: Path | None) -> list[str]:
        """Mount the stack at ``target`` (writable into ``upper``, read-only without one).

        Returns the mountpoints, deepest last, for ``unmount_all``. On failure nothing stays mounted.
        """
        mounted: list[str] = []
        try:
            lowers = [str(layer.root()) for layer in self.layers] + [str(self.skeleton)]
            self._mount_one(str(target), lowers, upper.root() if upper else None, work, "root")
            mounted.append(str(target))
            for name in self.system_dirs:
                lowers = [str(layer.sys(name)) for layer in self.layers] + [f"/{name}"]
                mountpoint = str(target / name)
                self._mount_one(mountpoint, lowers, upper.sys(name) if upper else None, work, f"sys-{name}")
                mounted.append(mountpoint)
        except OSError:
            unmount_all(mounted)
            raise
        return mounted

    @staticmethod
    def _mount_one(target: str, lowers: list[str], upper: Path | None, work: Path | None, tag: str) -> None:
        if upper is None:
            if len(lowers) == 1:  # overlayfs wants two lowers without an upper
                linux.bind(lowers[0], target, read_only=True)
            else:
                linux.mount_overlay(target, lowers)
            return
        workdir = work / tag
        workdir.mkdir(parents=True, exist_ok=True)
        linux.mount_overlay(target, lowers, str(upper), str(workdir))

    def to_json(self) -> dict:
        return {"skeleton": str(self.skeleton), "layers": [str(layer.path) for layer in self.layers],
                "system_dirs": list(self.system_dirs)}

    @classmethod
    def from_json(cls, data: dict) -> RootStack:
        return cls(Path(data["skeleton"]), tuple(Layer(Path(p)) for p in data["layers"]),
                   tuple(data["system_dirs"]))


def unmount_all(mountpoints: list[str]) -> None:
    for mountpoint in reversed(mountpoints):
        try:
            linux.umount(mountpoint)
        except OSError:
            pass


def mounts_under(prefix: Path) -> list[str]:
    """Mountpoints at or below ``prefix`` in this mount namespace (for sweeping a crashed run's leftovers)."""
    found = []
    text = Path("/proc/self/mountinfo").read_text()
    for line in text.splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == str(prefix) or point.startswith(str(prefix) + "/"):
            found.append(point)
    return sorted(found, key=len)


def remove_tree(path: Path) -> None:
    """rm -rf that never crosses into a mount left under ``path`` (it unmounts those first)."""
    unmount_all(mounts_under(path))
    shutil.rmtree(path, ignore_errors=True)
