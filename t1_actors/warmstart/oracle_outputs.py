"""The executed oracles' tool outputs, kept with the run that executed them (``RUN/oracle_outputs.jsonl.gz``) and
reused by a later run (``[campaign] oracle_pool_from = "runs/X"``).

Why: executing the SFT pool is the warm start's slow half on long tasks (~15 min of long.toml's 7,600 chats on 2
cores), while an SFT variant (steps, batch, learning rate, tokenizer, model size) changes none of it. The outputs
are kept as text, not token ids, so a variant with another tokenizer or template reuses them too.

Guarantees: an output is reused only for a task equal, field for field, to the one that produced it (``task_digest``:
same id, instruction, files, oracle and tests); any other task is executed as usual. The outputs are those of the
source run's sandbox backend. The file is written whole, then renamed: a reader never sees part of it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
from pathlib import Path

OUTPUTS_FILE = "oracle_outputs.jsonl.gz"


def outputs_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / OUTPUTS_FILE


def task_digest(task) -> str:
    """sha256 of the whole task (the ``repr`` of ``Task.model_dump``: files may be bytes, which JSON cannot hold):
    equal digests, equal tasks, equal oracle outputs."""
    return hashlib.sha256(repr(task.model_dump()).encode()).hexdigest()


def write_outputs(run_dir: str | Path, outputs: dict[str, tuple[str, list[str]]]) -> Path:
    """``outputs``: task id -> (its ``task_digest``, the outputs of its oracle's commands, in order)."""
    path = outputs_path(run_dir)
    partial = path.with_name(path.name + ".partial")
    with gzip.open(partial, "wt", encoding="utf-8") as out:
        for task_id in sorted(outputs):
            digest, texts = outputs[task_id]
            out.write(json.dumps({"task": task_id, "digest": digest, "outputs": texts}) + "\n")
    partial.replace(path)
    return path


def read_outputs(run_dir: str | Path) -> dict[str, tuple[str, list[str]]]:
    """What ``write_outputs`` wrote in ``run_dir``; ``FileNotFoundError`` naming the file and the fix when it has
    none (a run made before outputs were kept, or one that warm-started from another)."""
    path = outputs_path(run_dir)
    if not path.is_file():
        raise FileNotFoundError(f"[campaign] oracle_pool_from = {str(run_dir)!r}: no {path.name} there; point it at "
                                "a run that executed its SFT pool (not one that warm-started from another)")
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    return {r["task"]: (r["digest"], list(r["outputs"])) for r in records}


class OracleOutputs:
    """The outputs this run's oracles produced (``executed``), with those of a previous run used where its task is
    this one (``reused``: how many)."""

    def __init__(self, previous: dict[str, tuple[str, list[str]]] | None = None):
        self.previous = previous or {}
        self.kept: dict[str, tuple[str, list[str]]] = {}
        self.reused = 0
        self._lock = threading.Lock()

    def outputs(self, task, execute) -> list[str] | None:
        """The outputs of ``task``'s oracle: the previous run's when it had this very task, else ``execute(task)``
        (None: the execution failed; nothing is kept). Safe from several threads."""
        digest = task_digest(task)
        hit = self.previous.get(task.id)
        reuse = hit is not None and hit[0] == digest
        result = hit[1] if hit is not None and reuse else execute(task)
        with self._lock:
            self.reused += reuse
            if result is not None:
                self.kept[task.id] = (digest, result)
        return result
