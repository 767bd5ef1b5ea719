"""File access inside a sandbox root from the host, with every path and symlink resolved *inside* the
root (openat2 RESOLVE_IN_ROOT): a link to /etc/passwd in the trial reads the trial's, never the host's."""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path

from t1_actors.backends._sandbox import linux


class RootFS:
    def __init__(self, root: Path):
        self.root = root

    @contextmanager
    def _root_fd(self):
        fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    def read(self, path: str) -> bytes:
        with self._root_fd() as root:
            fd = linux.openat2(root, _rel(path), os.O_RDONLY)
            with os.fdopen(fd, "rb") as f:
                return f.read()

    def write(self, path: str, data: bytes, mode: int = 0o644, *, make_parents: bool = True) -> None:
        if make_parents:
            self.makedirs(os.path.dirname(path) or "/")
        with self._root_fd() as root:
            fd = linux.openat2(root, _rel(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                os.fchmod(f.fileno(), mode)

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        with self._root_fd() as root:
            parent = os.dup(root)
            try:
                for part in [p for p in _rel(path).split("/") if p and p != "."]:
                    try:
                        fd = linux.openat2(parent, part, os.O_PATH | os.O_DIRECTORY)
                    except OSError as exc:
                        if exc.errno != errno.ENOENT:
                            raise
                        os.mkdir(part, mode, dir_fd=parent)
                        fd = linux.openat2(parent, part, os.O_PATH | os.O_DIRECTORY)
                    os.close(parent)
                    parent = fd
            finally:
                os.close(parent)

    def copy_in(self, host_path: Path, dest: str, chmod: int | None = None) -> None:
        """Copy a host file, or a directory's contents, to ``dest`` (a file path, or a directory for a dir)."""
        if host_path.is_dir() and not host_path.is_symlink():
            self.makedirs(dest)
            for child in sorted(host_path.iterdir()):
                self.copy_in(child, f"{dest.rstrip('/')}/{child.name}", chmod)
            return
        if host_path.is_symlink():
            self.symlink(os.readlink(host_path), dest)
            return
        mode = chmod if chmod is not None else host_path.stat().st_mode & 0o7777
        self.write(dest, host_path.read_bytes(), mode)

    def symlink(self, target: str, path: str) -> None:
        self.makedirs(os.path.dirname(path) or "/")
        with self._root_fd() as root:
            parent = linux.openat2(root, _rel(os.path.dirname(path) or "/"), os.O_PATH | os.O_DIRECTORY)
            try:
                name = os.path.basename(path)
                try:
                    os.unlink(name, dir_fd=parent)
                except FileNotFoundError:
                    pass
                os.symlink(target, name, dir_fd=parent)
            finally:
                os.close(parent)

    def exists(self, path: str) -> bool:
        """Whether ``path`` names anything inside the root (a dangling symlink counts: it is there)."""
        with self._root_fd() as root:
            try:
                os.close(linux.openat2(root, _rel(path), os.O_PATH | os.O_NOFOLLOW))
                return True
            except OSError:
                return False

    def is_dir(self, path: str) -> bool:
        with self._root_fd() as root:
            try:
                os.close(linux.openat2(root, _rel(path), os.O_PATH | os.O_DIRECTORY))
                return True
            except OSError:
                return False


def _rel(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"sandbox path {path!r} must be absolute, e.g. /app/{path}")
    return path.lstrip("/") or "."
