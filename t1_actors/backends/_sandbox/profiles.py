"""Base-image profiles: what the local sandbox provides in place of a task's ``FROM`` image, in one place.

The local sandbox cannot pull images: the host's system stands in for every base image. A profile, keyed
on the ``FROM`` image (never on a task's name), says what that image provides that a task may rely on and
the host may lack, and the sandbox lays it into the task's own layer before the first Dockerfile step
(nothing reaches the host):

- ``workdir``: the image's WORKDIR, created as a directory (Terminal-Bench images: ``/app``; a later
  ``COPY file /app`` then copies into it, as Docker does);
- ``python``: a ``python`` command (the host's ``python3``) and ``pip`` / ``pip3``, as Python images have;
- ``pip_system_wide``: ``pip install`` into the system interpreter, as in an image: Debian's PEP 668 guard
  ("externally-managed-environment") is lifted with ``PIP_BREAK_SYSTEM_PACKAGES=1`` in the build's and the
  trial's environment (what pip installs lands in the trial's layer).

What a profile did is listed in the build report (``unhonoured``: ``profile NAME: ...``), so an eval shows
per task where the sandbox differs from the image. Not covered (reported by the build when it fails):
``apt-get install`` of a package the host holds in another version, and images of another distribution.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TBENCH = r"(t-bench|terminal-bench|laude-institute)"


@dataclass(frozen=True)
class ImageProfile:
    name: str
    pattern: str  # a regex searched in the FROM image reference
    workdir: str | None = None
    python: bool = False
    pip_system_wide: bool = False

    def matches(self, image: str) -> bool:
        return re.search(self.pattern, image, re.I) is not None

    def env(self) -> dict[str, str]:
        return {"PIP_BREAK_SYSTEM_PACKAGES": "1"} if self.pip_system_wide else {}

    def describe(self) -> str:
        parts = [f"WORKDIR {self.workdir}"] if self.workdir else []
        parts += ["python -> the host's python3, pip"] if self.python else []
        parts += ["pip installs system-wide (PIP_BREAK_SYSTEM_PACKAGES=1)"] if self.pip_system_wide else []
        return f"profile {self.name}: " + ", ".join(parts)


# first match wins: the specific before the general
PROFILES = (
    ImageProfile("t-bench-python", _TBENCH + r".*/python", workdir="/app", python=True, pip_system_wide=True),
    ImageProfile("t-bench", _TBENCH, workdir="/app"),
    ImageProfile("python", r"^(docker\.io/)?(library/)?python:", python=True, pip_system_wide=True),
)


def profile_for(image: str | None) -> ImageProfile | None:
    """The profile of a ``FROM`` image reference, or None (the host as it is)."""
    if not image:
        return None
    return next((p for p in PROFILES if p.matches(image)), None)


PYTHON_SHIMS = {  # path in the trial's layer -> script (the host's interpreter, whatever its minor version)
    "/usr/local/bin/python": "#!/bin/sh\nexec python3 \"$@\"\n",
    "/usr/local/bin/pip": "#!/bin/sh\nexec python3 -m pip \"$@\"\n",
    "/usr/local/bin/pip3": "#!/bin/sh\nexec python3 -m pip \"$@\"\n",
}
