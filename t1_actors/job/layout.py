"""Where a run's files are, defined once: ``RUN/log`` (the event log), ``RUN/tokenizer.json``,
``RUN/weights/vNNNNN`` (a published policy version), ``RUN/checkpoints`` (actors' resumable state), and
the sha256 a published weights file is checked by."""

from __future__ import annotations

import hashlib
from pathlib import Path


def log_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "log"


def tokenizer_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "tokenizer.json"


def version_dirname(version: int) -> str:
    """Directory name of a published policy version (the run's ``weights/vNNNNN``)."""
    return f"v{version:05d}"


def weights_dir(run_dir: str | Path, version: int) -> Path:
    return Path(run_dir) / "weights" / version_dirname(version)


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def sha256_file(*paths: str | Path) -> str:
    """sha256 of the files' bytes, concatenated in order (one file: its usual checksum)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
