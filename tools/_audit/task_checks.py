"""Executed audit of tasks: the paper's hard gates and soft dimensions.

Hard gates (any failure fails the task):

- ``oracle_passes``: the oracle solution passes every test (and there is at least one).
- ``noop_fails``: doing nothing does not pass every test (else the verifier is weak).
- ``no_shortcut``: partial or mutated oracles (a prefix of the oracle commands, or the oracle with one
  command dropped) do not pass every test (else the verifier accepts an incomplete solution).
- ``no_leakage``: during the agent's turns the tests are not visible: no ``/tests`` directory, no test
  file by name and no test source by content anywhere the agent can read (probed inside the sandbox).
- ``no_hidden_requirement`` (heuristic): every path and file name the tests mention appears in the
  instruction, or is a file the environment gives the agent.

Soft dimensions (reported, never failing): instruction length, number of tests, the no-op's reward,
whether the oracle is deterministic (two runs, same outcome per test), and partial credit (share of
mutated oracles that earn some but not all tests: the dense P/S reward pays for partial progress).

Execution goes through a ``TrialRunner`` (one fresh sandbox per run, then the task's own verifier):
``tools._audit.task_runner.LocalTrialRunner`` uses the local bubblewrap sandbox and the verifier.
"""

from __future__ import annotations

import ast
import io
import posixpath
import re
import shlex
import tarfile
import zipfile
from dataclasses import dataclass, field
from typing import Protocol

from t1_actors.tasks.model import TESTS_DIR, Task

MAX_MUTANTS = 8  # mutated oracles per task (each costs a sandbox + a verification)


@dataclass(frozen=True)
class RunOutcome:
    """One run of a task: commands executed in a fresh sandbox, then the task's tests."""

    tests: dict[str, str]  # test id -> outcome
    passed: int
    total: int
    probe_output: str = ""  # stdout of the probe script, when one was asked for
    error: str | None = None  # infrastructure failure (never a task verdict)

    @property
    def all_passed(self) -> bool:
        return self.error is None and self.total > 0 and self.passed == self.total


class TrialRunner(Protocol):
    def run(self, task: Task, commands: list[str], *, probe: str | None = None) -> RunOutcome:
        """Run ``commands`` as agent turns in a fresh sandbox; then, still during the agent's phase,
        ``probe`` (a shell script, its stdout returned); then verify with the task's tests."""


@dataclass
class Gate:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class TaskAudit:
    task_id: str
    source_format: str
    gates: list[Gate] = field(default_factory=list)
    soft: dict[str, float | int | bool | None] = field(default_factory=dict)
    runs: dict[str, dict] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(g.passed for g in self.gates)

    def to_json(self) -> dict:
        return {"task_id": self.task_id, "source_format": self.source_format, "ok": self.ok,
                "gates": {g.name: {"passed": g.passed, "detail": g.detail} for g in self.gates},
                "soft": self.soft, "runs": self.runs, "error": self.error}


# ---------------------------------------------------------------- static checks


_QUIET = re.compile(r"^\s*(cd\b|#|set\s|true\b|:|ls\b|pwd\b|(echo|cat|printf|grep)\b[^>|]*$)")


def oracle_steps(task: Task) -> list[str]:
    """The oracle as separate steps: its per-turn commands, else the script's top-level lines."""
    if task.oracle is None:
        return []
    if task.oracle.commands:
        return list(task.oracle.commands)
    lines, pending = [], ""
    for raw in task.oracle.script.splitlines():
        if raw.startswith("#!"):
            continue
        pending += raw.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip():
            lines.append(pending)
        pending = ""
    if pending.strip():
        lines.append(pending)
    if _has_compound(lines):
        return [task.oracle.script]  # here-docs, functions, loops: cannot be cut safely into lines
    return lines


def _has_compound(lines: list[str]) -> bool:
    text = "\n".join(lines)
    return bool(re.search(r"<<-?\s*['\"]?\w+|\b(then|do|esac)\b|\{\s*$|^\s*\}", text, re.M))


def shortcut_variants(steps: list[str]) -> dict[str, list[str]]:
    """Partial and mutated oracles: every proper prefix, and the oracle with one effectful step dropped.

    Steps that cannot change the workspace (cd, comments, set, plain echo/cat/grep/ls) are never dropped:
    leaving them out is not a shortcut.
    """
    variants: dict[str, list[str]] = {}
    effectful = [i for i, s in enumerate(steps) if not _QUIET.match(s)]
    for i in effectful:
        variants[f"drop[{i}]"] = steps[:i] + steps[i + 1:]
    for n in range(1, len(steps)):
        prefix = steps[:n]
        if any(prefix == v for v in variants.values()):
            continue
        if any(i < n for i in effectful) and any(i >= n for i in effectful):
            variants[f"prefix[{n}]"] = prefix
    return dict(list(variants.items())[:MAX_MUTANTS])


_PATHLIKE = re.compile(r"^(/[\w.@+-]+)+/?$|^[\w.@+-]+(/[\w.@+-]+)+$|^[\w@+-][\w.@+-]*\.[A-Za-z][\w]{0,5}$")
_SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib", "/proc/", "/sys/", "/dev/", "/etc/", "/tmp", "/var/",
                    "/opt/conda", "/root/.", TESTS_DIR)
_NOT_FILES = {"os.path", "sys.path", "pathlib.Path", "subprocess.run", "re.match", "shutil.which"}


def mentioned_paths(source: str) -> set[str]:
    """Paths and file names in the string literals of a Python test file (docstrings are prose, not checks:
    left out)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        literals = re.findall(r"""["']([^"'\n]{1,200})["']""", source)
    else:
        prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        literals = [n.value for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in prose]
    found = set()
    for literal in literals:
        for token in re.split(r"[\s,;=:'\"()]+", literal):
            token = token.strip().rstrip(".")
            if not token or token in _NOT_FILES or "://" in literal:
                continue
            if _PATHLIKE.match(token) and not re.fullmatch(r"[\d.]+", token):
                found.add(token)
    return found


def hidden_requirements(task: Task, visible: set[str] = frozenset()) -> list[str]:
    """Paths/file names the tests check that the instruction never mentions and the agent is not given.

    A path is accounted for when the instruction holds its full path, its path relative to the workdir,
    its file name, or its name without a leading dot as a word (``.git`` of "a git repository"); or when
    a file of that name is given to the agent: an environment file, a member of a given archive, or
    ``visible`` (paths the agent can see before its first turn, listed inside the sandbox). System paths
    and the tests' own files are ignored.
    """
    given = set(task.environment.files) | set(visible)
    given_names = {posixpath.basename(p.rstrip("/")) for p in given} | _archive_members(task)
    test_names = {posixpath.basename(p) for p in task.tests.files}
    instruction = task.instruction
    words = set(re.findall(r"[\w.-]+", instruction.lower()))
    hidden = set()
    for name, content in task.tests.files.items():
        if not name.endswith(".py"):
            continue
        text = content.decode(errors="replace") if isinstance(content, bytes) else content
        for path in mentioned_paths(text):
            absolute = path if path.startswith("/") else posixpath.join(task.environment.workdir, path)
            base = posixpath.basename(path.rstrip("/"))
            if path.startswith(_SYSTEM_PREFIXES) or base in test_names or absolute in given or base in given_names:
                continue
            if base.endswith(".py") and not path.startswith("/") and "/" not in path:
                continue  # module-like names (conftest.py, helpers.py) rather than workspace files
            relative = posixpath.relpath(absolute, task.environment.workdir)
            if any(form in instruction for form in {path, absolute, relative, base}) or base.lstrip(".").lower() in words:
                continue
            hidden.add(path)
    return sorted(hidden)


def _archive_members(task: Task) -> set[str]:
    """File names inside the tar/zip archives the environment gives the agent."""
    names = set()
    for path, spec in task.environment.files.items():
        data = spec.data
        try:
            if zipfile.is_zipfile(io.BytesIO(data)):
                names |= {posixpath.basename(n.rstrip("/")) for n in zipfile.ZipFile(io.BytesIO(data)).namelist()}
            elif path.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
                with tarfile.open(fileobj=io.BytesIO(data)) as archive:
                    names |= {posixpath.basename(m.name.rstrip("/")) for m in archive.getmembers()}
        except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError):
            continue
    return names


def visible_paths(probe_output: str) -> set[str]:
    """Paths the leakage probe listed as present before the agent's first turn."""
    return {line[len("FILE "):] for line in probe_output.splitlines() if line.startswith("FILE ")}


AGENT_READABLE_DIRS = ("/app", "/tmp", "/root", "/home", "/opt", "/srv", "/data", "/mnt", "/var/tmp", "/workspace")


def leakage_probe(task: Task) -> str:
    """A shell script that, run as the agent, prints ``LEAK <what>`` for every trace of the tests it can see.

    It looks for the tests directory, test files by name and test sources by content (their most
    distinctive line) in the directories an agent works in. Pass it as a command, never as a file in
    the sandbox (it contains the markers it greps for).
    """
    names = sorted({posixpath.basename(p) for p in task.tests.files})
    markers = sorted({m for content in task.tests.files.values() if (m := _marker_line(content))})
    dirs = " ".join(shlex.quote(d) for d in sorted({task.environment.workdir, *AGENT_READABLE_DIRS}))
    lines = [f'for d in {shlex.quote(TESTS_DIR)} "${{TEST_DIR:-}}"; do '
             '[ -n "$d" ] && [ -n "$(ls -A "$d" 2>/dev/null)" ] && echo "LEAK directory $d (not empty)"; done',
             f"dirs=; for d in {dirs}; do [ -d \"$d\" ] && dirs=\"$dirs $d\"; done"]
    if names:
        name_expr = " -o ".join(f"-name {shlex.quote(n)}" for n in names)
        lines.append(f"[ -n \"$dirs\" ] && find $dirs -type f \\( {name_expr} \\) 2>/dev/null "
                     "| head -20 | sed 's/^/LEAK file /'")
    for marker in markers:
        lines.append(f"[ -n \"$dirs\" ] && grep -rlF -e {shlex.quote(marker)} $dirs 2>/dev/null "
                     "| head -20 | sed 's/^/LEAK content /'")
    # what the agent is given (for the hidden-requirement check): files at the start, archive members
    lines.append('[ -n "$dirs" ] && find $dirs -maxdepth 4 2>/dev/null | head -2000 | sed "s/^/FILE /"')
    lines.append('[ -n "$dirs" ] && find $dirs -maxdepth 4 -type f \\( -name "*.tar" -o -name "*.tar.gz" -o '
                 '-name "*.tgz" \\) 2>/dev/null | head -20 | while read -r a; do tar -tf "$a" 2>/dev/null; done '
                 '| head -2000 | sed "s/^/FILE /"')
    lines.append("true")
    return "\n".join(lines)


def _marker_line(content: str | bytes) -> str | None:
    """The most distinctive line of a test file: the longest one that defines or asserts something."""
    text = content.decode(errors="replace") if isinstance(content, bytes) else content
    candidates = [ln.strip() for ln in text.splitlines()
                  if ln.strip().startswith(("def test", "assert ")) and len(ln.strip()) >= 16]
    return max(candidates, key=len) if candidates else None


# ---------------------------------------------------------------- the executed audit


def audit_task(task: Task, runner: TrialRunner, *, determinism: bool = True) -> TaskAudit:
    """Every gate and soft dimension of one task, by running it. ``determinism=False`` skips the second
    oracle run (the soft ``oracle_deterministic`` is then None)."""
    audit = TaskAudit(task_id=task.id, source_format=task.source_format)
    if task.oracle is None:
        audit.error = "task has no oracle solution; the gates need one (Harbor: add solution/solve.sh)"
        audit.gates.append(Gate("oracle_passes", False, "no oracle"))
        return audit
    steps = oracle_steps(task)
    turns = _as_turns(task)

    oracle = runner.run(task, turns(steps))
    oracle_again = runner.run(task, turns(steps)) if determinism else None
    noop = runner.run(task, [], probe=leakage_probe(task))
    for label, outcome in (("oracle", oracle), ("oracle_rerun", oracle_again), ("noop", noop)):
        if outcome is not None:
            audit.runs[label] = _run_json(outcome)
    infra = [o.error for o in (oracle, oracle_again, noop) if o is not None and o.error]
    if infra:
        audit.error = f"infrastructure failure: {infra[0]}"

    audit.gates.append(Gate("oracle_passes", oracle.all_passed,
                            f"oracle passed {oracle.passed}/{oracle.total}"))
    audit.gates.append(Gate("noop_fails", not noop.all_passed and noop.error is None,
                            f"no-op passed {noop.passed}/{noop.total}"
                            + (" (weak verifier: doing nothing passes)" if noop.all_passed else "")))

    mutants = shortcut_variants(steps)
    shortcuts, partial = [], 0
    for label, commands in mutants.items():
        outcome = runner.run(task, turns(commands))
        audit.runs[label] = _run_json(outcome)
        if outcome.all_passed:
            shortcuts.append(label)
        elif 0 < outcome.passed < outcome.total:
            partial += 1
    if mutants:
        detail = (f"{len(mutants)} partial/mutated oracles; passing all tests: {', '.join(shortcuts)}"
                  if shortcuts else f"{len(mutants)} partial/mutated oracles, none passes all tests")
    else:
        detail = "oracle has a single step: no partial solution to try"
    audit.gates.append(Gate("no_shortcut", not shortcuts, detail))

    leaks = [ln.removeprefix("LEAK ") for ln in noop.probe_output.splitlines() if ln.startswith("LEAK ")]
    audit.gates.append(Gate("no_leakage", not leaks and noop.error is None,
                            "; ".join(leaks[:5]) if leaks else "tests not visible during the agent's turns"))

    hidden = hidden_requirements(task, visible_paths(noop.probe_output))
    audit.gates.append(Gate("no_hidden_requirement", not hidden,
                            ("tests check, instruction never mentions: " + ", ".join(hidden)) if hidden
                            else "every path the tests check is in the instruction"))

    audit.soft = {
        "instruction_words": len(task.instruction.split()),
        "tests": oracle.total,
        "oracle_steps": len(steps),
        "noop_pass_share": noop.passed / noop.total if noop.total else None,
        "oracle_deterministic": None if oracle_again is None else oracle.tests == oracle_again.tests,
        "partial_credit_share": partial / len(mutants) if mutants else None,
    }
    return audit


def _as_turns(task: Task):
    """How steps run as agent turns: per-turn oracle commands one turn each; the lines of an oracle
    script together in one turn (a script's lines share one shell: cd, variables), under its shebang."""
    if task.oracle is None or task.oracle.commands:
        return lambda steps: list(steps)
    first = task.oracle.script.lstrip().splitlines()[0] if task.oracle.script.strip() else ""
    shebang = first if first.startswith("#!") else ""
    return lambda steps: ["\n".join([shebang, *steps]).lstrip("\n")] if steps else []


def _run_json(outcome: RunOutcome) -> dict:
    return {"passed": outcome.passed, "total": outcome.total, "tests": outcome.tests, "error": outcome.error}
