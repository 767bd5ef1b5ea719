"""A trial's own disk: a sparse ext4 image, loop-mounted in the trial's directory, that holds its upper layer.

Without it every write of a trial lands on the host's file system, capped per file (RLIMIT_FSIZE) but not in
total: an agent writing file after file fills the host's disk, and with it the run's log, the other trials
and the verifier's scratch (the chaos suite's ``disk_fill`` case). With it a trial's writes stop at ``size_mb``
with ENOSPC inside the trial, and nothing outside it notices. The image is sparse (it takes on the host only
what the trial wrote, plus ~4 MB of file-system metadata) and goes with the trial's directory; the mount is
``nodev,nosuid`` and set to auto-clear its loop device when unmounted. Making one takes ~25 ms here.

The images are sparse, so nothing in them stops the trials *together* from promising more than the host's disk
holds (4096 MB x 16 trials was more than this machine's free 37 GB). ``DiskBudget`` is that sum, per backend:
a trial reserves its disk's size before its image is made and gives it back once its root is deleted; one that
does not fit is refused (``DiskBudgetExceeded``, an infrastructure failure) before anything is made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from t1_actors.backends._sandbox.interface import SandboxInfraError

IMAGE = "disk.img"
MOUNTPOINT = "disk"
ENOSPC_MESSAGE = "No space left on device"  # strerror(ENOSPC), as coreutils, shells and Python print it
NEARLY_FULL_BYTES = 2 << 20
MARGIN_MIN_MB = 2048  # a derived budget leaves the host this much (or a tenth of the free space, if more)
TEARDOWN_WAIT_S = 60.0  # a reservation waits this long for closed trials' roots to be deleted


def available() -> str | None:
    """None when per-trial disks can be made here; otherwise why not, and the way out."""
    for tool in ("mkfs.ext4", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (e2fsprogs, util-linux)"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control is missing)"
    return None


def make_disk(directory: Path, size_mb: int) -> Path:
    """Make and mount a ``size_mb`` ext4 file system for one trial at ``directory/disk``; returns the mountpoint.
    Nothing stays mounted when it fails (SandboxInfraError, with the tool's own words)."""
    image, mountpoint = directory / IMAGE, directory / MOUNTPOINT
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    mountpoint.mkdir()
    steps = [["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",  # a throwaway fs: no journal, no reserve
              "-E", "lazy_itable_init=1,nodiscard", str(image)],
             ["mount", "-o", "loop,nodev,nosuid", str(image), str(mountpoint)]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise SandboxInfraError(f"cannot make the trial's disk ({' '.join(step[:1])}): {done.stderr.strip()[:300]}"
                                    f"; set [sandbox.local] disk_mb = 0 to write on the host's disk, uncapped")
    os.chmod(mountpoint, 0o700)
    (mountpoint / "lost+found").rmdir()  # never part of the trial's diff
    return mountpoint


def disk_full(mountpoint: Path, stderr: str = "") -> bool:
    """The trial's disk is what ended a command that failed on it: no free block left, or the command said
    ENOSPC with the disk nearly full. ext4 refuses a write with a few blocks still free (its allocator's
    preallocations and metadata reserve; a 16 MB disk has ended a write with ~1 MB free), so the message
    with little room left counts too; the message alone does not (the command may have filled another disk)."""
    try:
        fs = os.statvfs(mountpoint)
    except OSError:
        return False
    free, size = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
    return free == 0 or (ENOSPC_MESSAGE in stderr and free < max(NEARLY_FULL_BYTES, size // 20))


def image_mb(directory: Path) -> int:
    """The size of the disk of the trial root in ``directory`` (what it may hold), 0 when it has none."""
    try:
        return (directory / IMAGE).stat().st_size >> 20
    except OSError:
        return 0


def written_mb(directory: Path) -> int:
    """What the disk image in ``directory`` takes on the host now (its allocated blocks), 0 without one."""
    try:
        return ((directory / IMAGE).stat().st_blocks * 512) >> 20
    except OSError:
        return 0


def derived_budget(trials_dir: Path, leftover_mb: int = 0) -> tuple[int, str]:
    """The default budget (``[sandbox.local] disk_total_mb = 0``) and how it was reached: the space free to
    unprivileged writers on the file system of ``trials_dir`` now, plus ``leftover_mb`` (what the images of roots
    left by a dead process hold: taken over, each is charged its whole size; swept, they are freed), less a tenth
    (at least ``MARGIN_MIN_MB``) for the run's log, checkpoints, images and workspace snapshots."""
    fs = os.statvfs(trials_dir)
    free_mb = (fs.f_bavail * fs.f_frsize >> 20) + leftover_mb
    margin_mb = max(MARGIN_MIN_MB, free_mb // 10)
    leftover = f" (of which {leftover_mb} MB written by trials a dead process left)" if leftover_mb else ""
    return max(free_mb - margin_mb, 0), (f"is derived (disk_total_mb = 0): {free_mb} MB free on the file system of "
                                         f"{trials_dir} when the backend started{leftover}, less a {margin_mb} MB margin")


class DiskBudgetExceeded(SandboxInfraError):
    """A trial's disk does not fit its backend's disk budget: the trial is refused before anything is made. An
    infrastructure failure (a SandboxInfraError), never a task failure or a scored trial."""


class DiskBudget:
    """The disk of all trials of one backend. Guarantee: the sizes of the disks of the trials it opened and not
    yet deleted never sum past ``total_mb`` (an image takes on the host at most its size, plus what its directory
    holds beside it: the workspace snapshots, outside the budget). A trial reserves its disk's size before the
    image is made (``reserve``) and releases it when its root is deleted (``release``); a reservation that does not
    fit waits up to ``TEARDOWN_WAIT_S`` for trials closed and not yet deleted (``leaving``), then is refused. A
    root taken over after a restart is charged its disk's size (``charge``) even past the total, since its disk
    exists already: later reservations are refused until the sum is back under it.

    Thread-safe (a ``threading.Condition``, not a trio lock): the backend is called from worker threads
    (``trio.to_thread``, the SFT oracle pool) and its reaper thread releases."""

    def __init__(self, total_mb: int, origin: str):
        self.total_mb = total_mb
        self.origin = origin  # where total_mb came from, for the refusal
        self._held: dict[str, int] = {}
        self._leaving: set[str] = set()
        self._changed = threading.Condition()

    def held_mb(self) -> int:
        with self._changed:
            return sum(self._held.values())

    def reserve(self, key: str, size_mb: int, trial_id: str, wait_s: float = TEARDOWN_WAIT_S) -> None:
        """Hold ``size_mb`` for the root ``key`` of ``trial_id``, or raise DiskBudgetExceeded saying why."""
        deadline = time.monotonic() + wait_s
        with self._changed:
            while (held := sum(self._held.values())) + size_mb > self.total_mb:
                left = deadline - time.monotonic()
                if not self._leaving or left <= 0:
                    raise DiskBudgetExceeded(self._refusal(trial_id, size_mb, held, wait_s))
                self._changed.wait(left)
            self._held[key] = size_mb

    def charge(self, key: str, size_mb: int) -> None:
        """Count the existing disk of root ``key`` (taken over), whatever is left."""
        with self._changed:
            self._held[key] = size_mb

    def leaving(self, key: str) -> None:
        """Root ``key`` is closed: its release is coming, worth waiting for."""
        with self._changed:
            if key in self._held:
                self._leaving.add(key)

    def release(self, key: str) -> None:
        """Root ``key`` is deleted (or was never made). Idempotent."""
        with self._changed:
            self._held.pop(key, None)
            self._leaving.discard(key)
            self._changed.notify_all()

    def _refusal(self, trial_id: str, size_mb: int, held: int, wait_s: float) -> str:
        leaving = (f", {len(self._leaving)} of them closed and not yet deleted after {wait_s:g} s"
                   if self._leaving else "")
        return (f"trial {trial_id} refused: its disk ([sandbox.local] disk_mb = {size_mb}) does not fit this sandbox's "
                f"disk budget: {held} of {self.total_mb} MB are held by {len(self._held)} open trial(s){leaving}, "
                f"{max(self.total_mb - held, 0)} MB left; the budget {self.origin}. Raise [sandbox.local] "
                f"disk_total_mb (if the disk has room), lower disk_mb, or run fewer trials at once ([staleness] "
                f"max_in_flight, [campaign] eval_concurrency)")
