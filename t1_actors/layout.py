"""Where a run's files are, defined once: the event log (``RUN/log``, or ``[storage] url`` on an object
store: ``log_location``), ``RUN/tokenizer.json`` (t1's own BPE) or ``RUN/tokenizer/`` (a copy of the HF
tokenizer directory of ``[campaign] tokenizer``), ``RUN/weights/vNNNNN`` (a published policy version),
``RUN/checkpoints`` (actors' resumable state), and the sha256 a published weights file is checked by.

With ``[storage] url = "s3://BUCKET/PREFIX"`` only the log moves: the run directory keeps the tokenizer,
weights, checkpoints, summary and report, and ``RUN/log.url`` names the log's URL so that anything given
only the run directory (``t1-replay``, the summary, a later run's ``warm_start_from``) finds it."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

LOG_URL_FILE = "log.url"


def log_path(run_dir: str | Path) -> Path:
    """The log's directory when it stays in the run directory (no ``[storage] url``)."""
    return Path(run_dir) / "log"


def log_location(run_dir: str | Path, url: str | None = None) -> str | Path:
    """Where a run's log is, decided here only: ``url`` (the run's ``[storage] url``) when given, else the
    URL recorded in ``RUN/log.url`` by the job that made the run, else ``RUN/log``."""
    if url:
        return url
    pointer = Path(run_dir) / LOG_URL_FILE
    if pointer.is_file():
        return pointer.read_text().strip()
    return log_path(run_dir)


def has_log(run_dir: str | Path) -> bool:
    """Has this run directory a log (its own ``log/``, or a recorded URL)? No network access."""
    return log_path(run_dir).exists() or (Path(run_dir) / LOG_URL_FILE).is_file()


def record_log_location(run_dir: str | Path, url: str | None) -> None:
    """Write ``RUN/log.url`` when the log lives off the run directory (atomically: a reader sees all of it)."""
    if not url:
        return
    pointer = Path(run_dir) / LOG_URL_FILE
    partial = pointer.with_suffix(".partial")
    partial.write_text(url + "\n")
    partial.replace(pointer)


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


def published_versions(run_dir: str | Path) -> list[int]:
    """The versions under ``RUN/weights``, ascending (a version appears there only once complete: the
    learner writes it under a temporary name and renames it)."""
    return sorted(int(p.name[1:]) for p in (Path(run_dir) / "weights").glob("v[0-9]*") if p.is_dir())


def run_dir_of_weights(location: str | Path) -> Path | None:
    """The run directory a published version's location (``RUN/weights/vNNNNN[/file]``) is in, when it is
    on this machine; None otherwise (a log read by URL elsewhere, weights published off the run dir)."""
    path = Path(location)
    if path.suffix:  # a file inside the version directory
        path = path.parent
    if path.parent.name == "weights" and re.fullmatch(r"v\d{5,}", path.name) and path.parent.parent.is_dir():
        return path.parent.parent
    return None


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
