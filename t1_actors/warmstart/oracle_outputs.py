"""The executed oracles' tool outputs, kept with the run that executed them (``RUN/oracle_outputs.jsonl.gz``) and
reused by a later run (``[campaign] oracle_pool_from = "runs/X"``).

Why: executing the SFT pool is the warm start's slow half on long tasks (~15 min of long.toml's 7,600 chats on 2
cores), while an SFT variant (steps, batch, learning rate, tokenizer, model size) changes none of it. The outputs
are kept as text, not token ids, so a variant with another tokenizer or template reuses them too.

Guarantees: an output is reused only for a task equal, field for field, to the one that produced it (``task_digest``:
same id, instruction, files, oracle and tests); any other task is executed as usual. The outputs are those of the
source run's sandbox backend. The file is written whole, then renamed: a reader never sees part of it.

An oracle whose sandbox's infrastructure failed (an environment that cannot be built, the disk budget spent) costs
its example, counted (``OracleOutputs.lost``, the first error kept): the warm start says how many, and fails with
that error when every oracle of its pool was lost (``OracleOutputs.check_losses``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
from pathlib import Path

from t1_actors.backends._sandbox.interface import SandboxInfraError
from t1_actors.tasks import oracle_trajectory

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
        self.lost = 0  # oracles not executed: their sandbox's infrastructure failed
        self.first_loss = ""  # the first such failure, "task: error"
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

    def execute(self, sandboxes, task) -> list[str] | None:
        """Run ``task``'s oracle in a fresh sandbox of the backend ``sandboxes``: its commands' outputs, in order.
        None when the sandbox's infrastructure failed (``SandboxInfraError``, an ``OSError``): counted (``lose``),
        one example lost, never the run; any other error propagates."""
        try:
            with sandboxes.open(task, f"sft-{task.id}") as sandbox:
                outputs = []
                for command in oracle_trajectory(task):
                    result = sandbox.exec(command)
                    outputs.append(result.stdout + result.stderr)
                return outputs
        except (SandboxInfraError, OSError) as error:
            self.lose(task, error)
            return None

    def lose(self, task, error: BaseException) -> None:
        """``task``'s oracle could not run: its sandbox's infrastructure failed (``error``). Safe from several threads."""
        with self._lock:
            self.lost += 1
            if not self.first_loss:
                self.first_loss = f"task {task.id}: {type(error).__name__}: {error}"

    def losses(self) -> str:
        """The warning line for the oracles lost to sandbox infrastructure errors; "" when none was."""
        if not self.lost:
            return ""
        return (f"oracle pool: {self.lost} example(s) lost to sandbox infrastructure errors (never trained on); "
                f"the first: {self.first_loss}")

    def check_losses(self, tasks: int) -> None:
        """Raise ``SandboxInfraError`` naming the first loss when all ``tasks`` oracles of the pool were lost."""
        if tasks and self.lost >= tasks:
            raise SandboxInfraError(f"oracle pool: every one of its {tasks} oracles was lost to sandbox infrastructure "
                                    f"errors, nothing to fine-tune on; the first: {self.first_loss}")
