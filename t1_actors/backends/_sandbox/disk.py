"""A trial's own disk: a sparse ext4 image, loop-mounted in the trial's directory, that holds its upper layer.

Without it every write of a trial lands on the host's file system, capped per file (RLIMIT_FSIZE) but not in
total: an agent writing file after file fills the host's disk, and with it the run's log, the other trials
and the verifier's scratch (the chaos suite's ``disk_fill`` case). With it a trial's writes stop at ``size_mb``
with ENOSPC inside the trial, and nothing outside it notices. The image is sparse (it takes on the host only
what the trial wrote, plus ~4 MB of file-system metadata) and goes with the trial's directory; the mount is
``nodev,nosuid`` and set to auto-clear its loop device when unmounted. Making one takes ~25 ms here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from t1_actors.backends._sandbox.interface import SandboxInfraError

IMAGE = "disk.img"
MOUNTPOINT = "disk"
ENOSPC_MESSAGE = "No space left on device"  # strerror(ENOSPC), as coreutils, shells and Python print it
NEARLY_FULL_BYTES = 2 << 20


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
