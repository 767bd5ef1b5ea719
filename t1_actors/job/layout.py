"""Where a run's files are, defined once: ``RUN/log`` (the event log), ``RUN/tokenizer.json`` (t1's own BPE) or
``RUN/tokenizer/`` (a copy of the HF tokenizer directory of ``[campaign] tokenizer``),
``RUN/weights/vNNNNN`` (a published policy version), ``RUN/checkpoints`` (actors' resumable state), and
the sha256 a published weights file is checked by."""

from __future__ import annotations

import hashlib
from pathlib import Path


def log_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "log"


def tokenizer_path(run_dir: str | Path) -> Path:
    """The run's tokenizer as ``policy.load_tokenizer`` takes it: the HF directory when the run has one, else
    t1's own ``tokenizer.json`` (where phase 2 writes it)."""
    directory = hf_tokenizer_dir(run_dir)
    return directory if directory.is_dir() else Path(run_dir) / "tokenizer.json"


def hf_tokenizer_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "tokenizer"


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
