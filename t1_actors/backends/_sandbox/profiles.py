"""Base-image profiles: what the local sandbox provides in place of a task's ``FROM`` image, in one place.

The local sandbox cannot pull images: the host's system (Debian) stands in for every base image. A
profile, keyed on the ``FROM`` image (never on a task's name), says what that image provides that a task
may rely on and the host may lack, and the sandbox lays it into the task's own layer before the first
Dockerfile step (nothing reaches the host):

- ``workdir``: the image's WORKDIR, created as a directory (Terminal-Bench images: ``/app``; a later
  ``COPY file /app`` then copies into it, as Docker does);
- ``python``: a ``python`` command (the host's ``python3``) and ``pip`` / ``pip3``, as Python images have;
- ``pip_system_wide``: ``pip install`` into the system interpreter, as in an image: Debian's PEP 668 guard
  ("externally-managed-environment") is lifted with ``PIP_BREAK_SYSTEM_PACKAGES=1`` in the build's and the
  trial's environment (what pip installs lands in the trial's layer);
- ``apt_from_host``: ``apt-get install`` / ``apt install`` of a package the host already has is satisfied
  by the host's copy, whatever version the task pins (``git=1:2.39.5-0+deb12u2`` with the host at
  ``deb12u3`` would otherwise be refused as a downgrade), and so is a package whose command the host
  already provides from another package (``npm``, bundled with the host's NodeSource ``nodejs``, would
  otherwise fail with "held broken packages"). Packages the host lacks are installed from Debian, into
  the task's layer. What was satisfied so is listed in the build report. The stand-in is a small
  ``apt-get`` / ``apt`` wrapper in ``/usr/local/sbin`` (first on the default PATH), so a task's or an
  agent's later ``apt-get install`` behaves the same way; ``/usr/bin/apt-get`` stays the real one.

Every image, profiled or not, starts from Docker's default environment (``IMAGE_ENV``: ``PATH``), so a
Dockerfile's ``ENV PATH="/root/.local/bin:${PATH}"`` keeps ``/usr/bin`` as it does under Docker.

What a profile did is listed in the build report (``unhonoured``: ``profile NAME: ...``), so an eval shows
per task where the sandbox differs from the image. Not covered (reported by the build when it fails):
toolchains an image ships outside Debian's packages (``golang:*``'s ``/usr/local/go``: Debian 12 has Go
1.19; ``eclipse-temurin``'s JDK is the host's when it has one), other distributions (Alpine's ``apk``), and
Python versions (a ``python:3.12`` image runs on the host's ``python3``, whatever its minor version).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TBENCH = r"(t-bench|terminal-bench|laude-institute)"
_REGISTRY = r"^([\w.-]+\.[\w.-]+(:\d+)?/)?(docker/)?(library/)?"  # docker.io/library/, public.ecr.aws/docker/library/
_DEBIAN_FAMILY = _REGISTRY + r"(debian|ubuntu|buildpack-deps|gcc|golang|node|rust|openjdk|eclipse-temurin|r-base):"

DOCKER_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE_ENV = {"PATH": DOCKER_DEFAULT_PATH}
"""The environment every image starts with under Docker, for ``${VAR}`` in the Dockerfile's ENV lines."""

APT_STANDIN_LOG = "/var/log/t1-apt-standin.log"  # what the wrapper satisfied from the host, one line each


@dataclass(frozen=True)
class ImageProfile:
    name: str
    pattern: str  # a regex searched in the FROM image reference
    workdir: str | None = None
    python: bool = False
    pip_system_wide: bool = False
    apt_from_host: bool = False

    def matches(self, image: str) -> bool:
        return re.search(self.pattern, image, re.I) is not None

    def env(self) -> dict[str, str]:
        return {"PIP_BREAK_SYSTEM_PACKAGES": "1"} if self.pip_system_wide else {}

    def describe(self) -> str:
        parts = [f"WORKDIR {self.workdir}"] if self.workdir else []
        parts += ["python -> the host's python3, pip"] if self.python else []
        parts += ["pip installs system-wide (PIP_BREAK_SYSTEM_PACKAGES=1)"] if self.pip_system_wide else []
        parts += ["apt-get install: packages the host has are satisfied by its copy"] if self.apt_from_host else []
        return f"profile {self.name}: " + ", ".join(parts)


# first match wins: the specific before the general
PROFILES = (
    ImageProfile("t-bench-python", _TBENCH + r".*/python", workdir="/app", python=True, pip_system_wide=True,
                 apt_from_host=True),
    ImageProfile("t-bench", _TBENCH, workdir="/app", apt_from_host=True),
    ImageProfile("python", _REGISTRY + r"python:", python=True, pip_system_wide=True, apt_from_host=True),
    ImageProfile("debian-family", _DEBIAN_FAMILY, apt_from_host=True),
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

_APT_WRAPPER = r"""#!/bin/sh
# t1 local sandbox (t1_actors/backends/_sandbox/profiles.py, apt_from_host): the host stands in for the
# image, so `install` of a package the host already has is satisfied by the host's copy, whatever version
# is pinned, and so is a package whose command the host already provides; the rest goes to the real tool.
real=/usr/bin/REAL
installing=0
for word do case "$word" in install) installing=1; break ;; esac; done
[ "$installing" = 1 ] || exec "$real" "$@"
note() { echo "t1: apt $1" >&2; echo "$1" >> LOG 2>/dev/null || true; }
verb=0 takes_value=0
for word do
    shift
    if [ "$takes_value" = 1 ]; then takes_value=0; set -- "$@" "$word"; continue; fi
    case "$word" in
        -o|-c|-t|--option|--config-file|--target-release) takes_value=1; set -- "$@" "$word"; continue ;;
        install) verb=1; set -- "$@" "$word"; continue ;;
        -*|*/*|*'*'*|*'?'*) set -- "$@" "$word"; continue ;;
    esac
    if [ "$verb" = 0 ]; then set -- "$@" "$word"; continue; fi
    name=${word%%=*}; name=${name%%:*}
    have=$(dpkg-query -W -f='${db:Status-Status} ${Version}' "$name" 2>/dev/null)
    case "$have" in
        "installed "*) note "$word: the host's $name ${have#installed } stands in"; continue ;;
    esac
    command=$(command -v "$name" 2>/dev/null)
    if [ -n "$command" ] && owner=$(dpkg-query -S "$(readlink -f "$command")" 2>/dev/null); then
        note "$word: the host's $command (from ${owner%%:*}) stands in"; continue
    fi
    set -- "$@" "$word"
done
exec "$real" "$@"
"""

APT_SHIMS = {  # path in the task's layer -> the wrapper in front of the real tool of that name
    f"/usr/local/sbin/{tool}": _APT_WRAPPER.replace("REAL", tool).replace("LOG", APT_STANDIN_LOG)
    for tool in ("apt-get", "apt")
}
