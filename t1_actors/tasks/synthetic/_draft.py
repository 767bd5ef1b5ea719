"""What a family draws: a ``Draft`` (instruction, files, oracle commands, checks), and the pytest file
its checks become. Each check is its own test function, so partial progress earns partial reward."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

# Small vocabularies, so the policy's BPE learns them: names of files and dirs, words inside files.
NAMES = (
    "alpha apple atlas badge basil berry birch blade bloom cabin cedar chalk cherry cloud cobalt comet coral "
    "crane delta dune eagle ember falcon fern flint frost garnet ginger glade grape harbor hazel heron indigo "
    "iris ivory jade jasper juniper kelp kite lemon lilac lotus lunar maple marble meadow mint moss nectar "
    "noble oak olive onyx orbit otter pearl pepper pine plum polar quartz raven reed river robin ruby sage "
    "salt sierra silver slate spruce stone storm sunny tango thorn tiger topaz tulip umber valley velvet "
    "violet walnut willow winter zephyr"
).split()
WORDS = (
    "red blue green black white gold pink gray cat dog fox owl bee ant cow pig hen sun moon star rain snow "
    "wind fire ice tea milk corn bread cake salt box cup pen map key door lamp ship car bus road hill "
    "lake sea rock tree leaf seed root song game book"
).split()
EXTENSIONS = ("tmp", "bak", "log", "old", "csv", "md")
# What SFT may rename at random in an oracle chat (warmstart.rename): each list permuted within itself. Left out:
# words that are also shell commands or paths (cat, tree, root, key, map) and the one word in both lists (salt).
_NOT_RENAMED = {"cat", "salt", "root", "tree", "key", "map"}
RENAMEABLE = (tuple(w for w in NAMES if w not in _NOT_RENAMED), tuple(w for w in WORDS if w not in _NOT_RENAMED))


@dataclass(frozen=True)
class Check:
    """One test: ``name`` (a Python identifier suffix) and the body of the test function."""

    name: str
    body: str


@dataclass
class Draft:
    instruction: str
    commands: list[str]
    checks: list[Check]
    files: dict[str, str | bytes] = field(default_factory=dict)  # absolute path -> content
    modes: dict[str, int] = field(default_factory=dict)  # absolute path -> mode, when not 0o644
    env: dict[str, str] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)  # the task's Limits, where not the defaults (8 turns)


@dataclass(frozen=True)
class Family:
    """A family of tasks: its tag, its area of shell work, the tools it needs, and its drawing function."""

    name: str
    area: str
    draw: Callable[[random.Random], Draft]
    needs: tuple[str, ...] = ()


def distinct(rng: random.Random, pool: tuple[str, ...] | list[str], k: int) -> list[str]:
    return rng.sample(list(pool), k)


def lines_of_words(rng: random.Random, count: int, words: tuple[str, ...] | list[str] = WORDS) -> list[str]:
    """``count`` lines of one to three words each."""
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 3))) for _ in range(count)]


def text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def identifier(*parts: str) -> str:
    return re.sub(r"\W+", "_", "_".join(parts)).strip("_").lower()


_HEADER = '''"""Checks of a synthetic task: each test is one check, so partial progress earns partial reward."""

import os
import stat
import subprocess
import tarfile
from pathlib import Path


def read(path):
    return Path(path).read_text()


def lines(path):
    return Path(path).read_text().splitlines()


def number(path):
    return int(Path(path).read_text().strip())


def tar_files(path):
    """The regular files of a tar archive by their last two path parts (dir/name), with their text."""
    with tarfile.open(path) as archive:
        return {"/".join(m.name.split("/")[-2:]): archive.extractfile(m).read().decode()
                for m in archive.getmembers() if m.isfile()}


def git(repo, *args):
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", repo, *args],
                          capture_output=True, text=True, timeout=10)
'''


def render_tests(checks: list[Check]) -> str:
    """The pytest module of ``checks``: one ``test_<name>`` function each; names must be unique."""
    names = [check.name for check in checks]
    if len(set(names)) != len(names):
        raise ValueError(f"check names repeat: {sorted(n for n in names if names.count(n) > 1)}")
    functions = []
    for check in checks:
        body = "\n".join("    " + line if line else "" for line in check.body.strip("\n").splitlines())
        functions.append(f"\n\ndef test_{check.name}():\n{body}\n")
    return _HEADER + "".join(functions)
