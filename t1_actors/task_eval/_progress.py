"""What `t1-actor eval` shows while attempts finish: a progress bar on a terminal, one line per finished
attempt otherwise (a run writing to a file or a pipe), each saying how the attempt ended."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def describe(outcome) -> str:
    """One attempt's ending in a few words: ``resolved 5/5``, ``not resolved 2/9``, ``timeout, 0/3``,
    ``infrastructure: <the error's first line>``."""
    if outcome.infra_error is not None:
        first = outcome.infra_error.strip().splitlines()[0] if outcome.infra_error.strip() else "?"
        return f"infrastructure: {first[:120]}"
    counts = f"{outcome.passed}/{outcome.total}"
    if outcome.finish == "timeout":
        return f"timeout, {counts}"
    return f"{'resolved' if outcome.resolved else 'not resolved'} {counts}"


class EvalProgress:
    """``finished(task, attempt, outcome)`` after each attempt: advances a rich bar when ``stream`` is a
    terminal (a failure is also printed above the bar, so it stays on screen), else writes one line
    ``[k/N] TASK attempt A: ENDING``. ``done`` attempts (a resumed eval's) count as finished from the start."""

    def __init__(self, stream: TextIO, total: int, done: int = 0):
        self.total, self.finished_count = total, done
        self.console = Console(file=stream)
        self._bar = self._job = None
        if self.console.is_terminal:
            self._bar = Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[last]}"), TimeElapsedColumn(), console=self.console)
            self._job = self._bar.add_task("eval", total=total, completed=done, last="")

    def __enter__(self) -> EvalProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def finished(self, task_id: str, attempt: int, outcome) -> None:
        self.finished_count += 1
        line = f"[{self.finished_count}/{self.total}] {task_id} attempt {attempt}: {describe(outcome)}"
        if self._bar is None:
            self.console.file.write(line + "\n")
            self.console.file.flush()
            return
        if not outcome.resolved:
            self._bar.console.print(line, markup=False, highlight=False)
        self._bar.update(self._job, advance=1, last=f"{task_id}: {describe(outcome)}"[:60])
