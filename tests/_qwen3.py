"""Qwen3's real tokenizer and chat template (``bash .ci/fetch-qwen3-tokenizer`` puts them in .cache/), for tests.

The fixture fails, never skips, when the files are missing: a test that silently skipped would hide that the
HF path is untested."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import pytest

from t1_actors.policy import ChatTokenizer, load_tokenizer

QWEN3_DIR = Path(__file__).resolve().parent.parent / ".cache" / "qwen3-tokenizer"
SHA256 = {"tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
          "tokenizer_config.json": "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"}


def qwen3_dir() -> Path:
    """The directory, checked: both files present with their pinned sha256 (pytest.fail otherwise)."""
    for name, digest in SHA256.items():
        path = QWEN3_DIR / name
        if not path.is_file():
            pytest.fail(f"{path} is missing: fetch Qwen3's tokenizer with `bash .ci/fetch-qwen3-tokenizer` "
                        "(.ci/setup runs it)", pytrace=False)
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            pytest.fail(f"{path} does not match its pinned sha256; delete {QWEN3_DIR} and run "
                        "`bash .ci/fetch-qwen3-tokenizer`", pytrace=False)
    return QWEN3_DIR


@functools.lru_cache(maxsize=1)
def _load(path: str) -> ChatTokenizer:
    return load_tokenizer(path)


def qwen3() -> ChatTokenizer:
    return _load(str(qwen3_dir()))
