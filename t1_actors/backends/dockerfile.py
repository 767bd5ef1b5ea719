"""Replay plan of a Dockerfile for a sandbox without a Docker engine.

``plan_dockerfile(text, context_dir)`` parses the Dockerfile (comments, parser directives, backslash
continuation, heredocs ``<<EOT`` / ``<<-EOT`` / ``<<'EOT'``, JSON exec form) and resolves it, top to
bottom, into concrete steps with the state Docker would have at each one:

- ``FROM`` is noted, never pulled: the sandbox stands on the host's system. Terminal-Bench base images
  imply ``WORKDIR /app``. Stages of a multi-stage build share one root (``COPY --from`` reads it).
- ``ARG`` / ``ENV`` are tracked and substituted (``$VAR``, ``${VAR}``, ``${VAR:-word}``, ``${VAR:+word}``)
  where Docker substitutes: ADD, COPY, ENV, WORKDIR, ...; RUN sees them as environment variables.
- ``WORKDIR`` resolves relative to the previous one; ``SHELL`` changes the shell of later RUNs.
- ``COPY`` / ``ADD`` resolve their sources in the build context (globs, directories copy their
  contents, ``COPY <<EOT /dest`` heredocs become inline files, ``ADD`` unpacks local tar archives);
  ``--chmod`` and ``--chown`` are kept.
- ``RUN`` keeps its script (heredocs included: the shell reads them as it would in BuildKit).

Everything it cannot honour (``USER``, ``CMD``, ``ENTRYPOINT``, ``EXPOSE``, ``VOLUME``, ``ADD <url>``,
...) lands in ``BuildPlan.unhonoured`` by name, with its line. Hand-written rather than
``dockerfile-parse`` because the replay needs heredocs and BuildKit's COPY/ADD semantics, which it lacks.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from t1_actors.backends._sandbox.profiles import IMAGE_ENV, profile_for

DEFAULT_SHELL = ("/bin/sh", "-c")
_HEREDOC = re.compile(r"<<(-?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
_VAR = re.compile(r"\\\$|\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_IGNORED = {"CMD", "ENTRYPOINT", "EXPOSE", "VOLUME", "USER", "LABEL", "MAINTAINER", "HEALTHCHECK",
            "STOPSIGNAL", "ONBUILD"}


class DockerfileError(ValueError):
    """The Dockerfile cannot be replayed; the message names the line and the fix."""


@dataclass(frozen=True)
class Instruction:
    """One parsed instruction: its name, the raw argument text, the heredoc bodies it carries."""

    name: str
    args: str
    line: int
    heredocs: tuple[tuple[str, str, bool], ...] = ()  # (name, body, expand variables)
    raw: str = ""  # the instruction text as written (first line + heredoc lines), for RUN


@dataclass(frozen=True)
class CopySource:
    """A host file or directory of the build context, or inline content (a heredoc)."""

    name: str
    host_path: str | None = None  # in the build context
    content: bytes | None = None  # a heredoc
    root_path: str | None = None  # COPY --from=stage: a path of the root being built (stages share it)


@dataclass(frozen=True)
class RunStep:
    argv: tuple[str, ...]  # what to exec: the shell + script, or the exec-form argv
    env: dict[str, str]
    workdir: str
    line: int
    stdin: bytes | None = None


@dataclass(frozen=True)
class CopyStep:
    sources: tuple[CopySource, ...]
    dest: str  # absolute; a directory when it ends with '/' or there are several sources
    workdir: str
    chmod: int | None = None
    chown: str | None = None
    unpack_archives: bool = False  # ADD: local tar archives are unpacked
    line: int = 0

    @property
    def dest_is_dir(self) -> bool:
        return self.dest.endswith("/") or len(self.sources) > 1 or any(
            s.host_path is not None and os.path.isdir(s.host_path) for s in self.sources)


@dataclass(frozen=True)
class WorkdirStep:
    path: str
    line: int


@dataclass
class BuildPlan:
    base_images: list[str] = field(default_factory=list)
    steps: list[RunStep | CopyStep | WorkdirStep] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    unhonoured: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- parsing

def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions of a Dockerfile: continuation lines joined, comments dropped, heredocs collected."""
    lines = text.splitlines()
    escape = "\\"
    for line in lines:  # parser directives: only at the very top, as comments
        match = re.match(r"^\s*#\s*(\w+)\s*=\s*(\S+)\s*$", line)
        if not match:
            break
        if match.group(1).lower() == "escape":
            escape = match.group(2)
    instructions: list[Instruction] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        start = i
        parts = []
        raw_lines = [lines[i]]
        current = lines[i].rstrip()
        while current.endswith(escape) and i + 1 < len(lines):
            parts.append(current[: -len(escape)])
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
                i += 1  # comments and blank lines inside a continuation are dropped
            if i >= len(lines):
                current = ""
                break
            raw_lines.append(lines[i])
            current = lines[i].rstrip()
        parts.append(current)
        joined = " ".join(p.strip() for p in parts if p.strip()) if len(parts) > 1 else parts[0].strip()
        i += 1
        name, _, args = joined.partition(" ")
        name = name.upper()
        heredocs = []
        if name in ("RUN", "COPY", "ADD"):
            for strip_tabs, quote, marker in _HEREDOC.findall(args):
                body = []
                while i < len(lines) and lines[i].strip() != marker:
                    line = lines[i]
                    body.append(line.lstrip("\t") if strip_tabs else line)
                    raw_lines.append(lines[i])
                    i += 1
                if i >= len(lines):
                    raise DockerfileError(f"line {start + 1}: heredoc <<{marker} is never closed; "
                                          f"end it with a line holding just {marker}")
                raw_lines.append(lines[i])
                i += 1
                heredocs.append((marker, "\n".join(body) + "\n", not quote))
        raw = "\n".join([joined] + raw_lines[len(parts):]) if heredocs else joined
        instructions.append(Instruction(name, args.strip(), start + 1, tuple(heredocs), raw))
    return instructions


def expand(text: str, env: dict[str, str]) -> str:
    """Docker's variable substitution: ``$V``, ``${V}``, ``${V:-word}``, ``${V:+word}``, ``\\$`` literal."""

    def one(match: re.Match) -> str:
        if match.group(0) == "\\$":
            return "$"
        name = match.group(1) or match.group(4)
        value = env.get(name)
        if match.group(2) == "-":
            return value if value else match.group(3)
        if match.group(2) == "+":
            return match.group(3) if value else ""
        return value or ""

    return _VAR.sub(one, text)


# --------------------------------------------------------------------------------------------- replay

def plan_dockerfile(text: str, context_dir: str | os.PathLike | None, *,
                    build_args: dict[str, str] | None = None) -> BuildPlan:
    """Resolve a Dockerfile into concrete replay steps (see the module docstring)."""
    plan = BuildPlan()
    context = Path(context_dir) if context_dir is not None else None
    args: dict[str, str] = {}
    env: dict[str, str] = {}
    inherited: dict[str, str] = {}  # the base image's environment: ${PATH} in an ENV line reads it
    shell: tuple[str, ...] = DEFAULT_SHELL
    given = dict(build_args or {})
    workdir = "/"
    for ins in parse_dockerfile(text):
        where = f"line {ins.line}"
        scope = {**inherited, **args, **env}
        if ins.name == "FROM":
            words = expand(ins.args, scope).split()
            words = [w for w in words if not w.startswith("--platform")]
            if not words:
                raise DockerfileError(f"{where}: FROM names no image; write e.g. FROM python:3.13-slim")
            plan.base_images.append(words[0])
            if len(plan.base_images) == 1:
                inherited = dict(IMAGE_ENV)
                profile = profile_for(words[0])  # the image's WORKDIR where its profile knows it
                workdir = profile.workdir if profile is not None and profile.workdir else "/"
            else:
                plan.unhonoured.append(f"{where}: multi-stage FROM {words[0]} (stages share one root)")
        elif ins.name == "ARG":
            for word in shlex.split(ins.args):
                name, eq, default = word.partition("=")
                args[name] = given.get(name, expand(default, scope) if eq else args.get(name, ""))
        elif ins.name == "ENV":
            env.update(_env_pairs(ins, scope))
        elif ins.name == "WORKDIR":
            workdir = os.path.normpath(os.path.join(workdir, expand(ins.args, scope)))
            plan.steps.append(WorkdirStep(workdir, ins.line))
        elif ins.name == "SHELL":
            shell = tuple(_json_argv(ins, where))
        elif ins.name == "RUN":
            plan.steps.append(_run_step(ins, shell, {**args, **env}, workdir, plan, where))
        elif ins.name in ("COPY", "ADD"):
            step = _copy_step(ins, scope, workdir, context, plan, where)
            if step is not None:
                plan.steps.append(step)
        elif ins.name in _IGNORED:
            plan.unhonoured.append(f"{where}: {ins.name} {ins.args[:60]}".rstrip())
        else:
            raise DockerfileError(f"{where}: unknown instruction {ins.name!r}; check its spelling")
    plan.env = env
    plan.workdir = workdir
    return plan


def _env_pairs(ins: Instruction, scope: dict[str, str]) -> dict[str, str]:
    words = shlex.split(ins.args, posix=True)
    if words and "=" not in words[0]:  # legacy form: ENV KEY the rest of the line
        key, _, rest = ins.args.partition(" ")
        return {key: expand(rest.strip(), scope)}
    pairs = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            raise DockerfileError(f"line {ins.line}: ENV {word!r} has no '='; write ENV {word}=value")
        pairs[key] = expand(value, {**scope, **pairs})
    return pairs


def _json_argv(ins: Instruction, where: str) -> list[str]:
    try:
        argv = json.loads(ins.args)
    except json.JSONDecodeError:
        raise DockerfileError(f"{where}: {ins.name} needs a JSON array, e.g. {ins.name} [\"/bin/bash\", \"-c\"]") from None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise DockerfileError(f"{where}: {ins.name} needs a non-empty JSON array of strings")
    return argv


def _flags(args: str) -> tuple[dict[str, str], str]:
    flags: dict[str, str] = {}
    while args.startswith("--"):
        flag, _, args = args.partition(" ")
        key, _, value = flag[2:].partition("=")
        flags[key] = value
        args = args.lstrip()
    return flags, args


def _run_step(ins: Instruction, shell: tuple[str, ...], env: dict[str, str], workdir: str,
              plan: BuildPlan, where: str) -> RunStep:
    flags, body = _flags(ins.args)
    for flag in flags:
        plan.unhonoured.append(f"{where}: RUN --{flag}")
    if body.startswith("[") and not ins.heredocs:
        return RunStep(tuple(_json_argv(Instruction("RUN", body, ins.line), where)), env, workdir, ins.line)
    if ins.heredocs and re.fullmatch(r"<<-?(['\"]?)\w+\1", body.strip()):
        script = ins.heredocs[0][1]  # RUN <<EOF: the heredoc is the script
        if script.startswith("#!"):  # BuildKit executes a heredoc with a shebang as a file
            runner = 'f=$(mktemp) && cat > "$f" && chmod +x "$f" && "$f"; rc=$?; rm -f "$f"; exit $rc'
            return RunStep((*DEFAULT_SHELL, runner), env, workdir, ins.line, stdin=script.encode())
        return RunStep((*shell, script), env, workdir, ins.line)
    script = ins.raw.partition(" ")[2] if ins.heredocs else body
    if flags and ins.heredocs:
        script = _flags(script)[1]
    return RunStep((*shell, script), env, workdir, ins.line)


def _copy_step(ins: Instruction, scope: dict[str, str], workdir: str, context: Path | None,
               plan: BuildPlan, where: str) -> CopyStep | None:
    flags, body = _flags(ins.args)
    for flag in flags:
        if flag not in ("chmod", "chown", "from", "link"):
            plan.unhonoured.append(f"{where}: {ins.name} --{flag}")
    if body.startswith("["):
        words = _json_argv(Instruction(ins.name, body, ins.line), where)
    else:
        words = shlex.split(body)
    words = [expand(w, scope) for w in words]
    if len(words) < 2:
        raise DockerfileError(f"{where}: {ins.name} needs a source and a destination, e.g. {ins.name} app.py /app/")
    *sources, dest = words
    heredocs = {name: (body_text, expand_vars) for name, body_text, expand_vars in ins.heredocs}
    resolved: list[CopySource] = []
    for source in sources:
        if source.startswith("<<"):
            name = source.lstrip("<-").strip("'\"")
            text, expand_vars = heredocs[name]
            resolved.append(CopySource(name, content=(expand(text, scope) if expand_vars else text).encode()))
        elif re.match(r"^[a-z]+://", source) or source.startswith("git@"):
            plan.unhonoured.append(f"{where}: {ins.name} {source} (remote sources are not fetched)")
        elif "from" in flags:
            resolved.append(CopySource(os.path.basename(source.rstrip("/")) or "/", root_path=source))
        else:
            resolved.extend(_context_sources(source, context, where, ins.name))
    if not resolved:
        return None
    is_dir = dest.endswith("/") or dest in (".", "./")
    dest = os.path.normpath(dest if dest.startswith("/") else os.path.join(workdir, dest))
    if is_dir:
        dest = dest.rstrip("/") + "/"
    chmod = int(flags["chmod"], 8) if flags.get("chmod") else None
    return CopyStep(tuple(resolved), dest, workdir, chmod, flags.get("chown") or None,
                    unpack_archives=ins.name == "ADD", line=ins.line)


def _context_sources(pattern: str, context: Path | None, where: str, name: str) -> list[CopySource]:
    if context is None:
        raise DockerfileError(f"{where}: {name} {pattern} needs a build context; set the task's context_dir")
    root = context.resolve()
    pattern = os.path.normpath(pattern.lstrip("/")) if pattern not in (".", "./") else "."
    if pattern == ".":
        return [CopySource(".", host_path=str(root))]
    if pattern == ".." or pattern.startswith("../"):
        raise DockerfileError(f"{where}: {name} source {pattern!r} leaves the build context {root}; "
                              f"put the file inside it")
    matches = [p for p in _glob(root, pattern)]
    if not matches:
        raise DockerfileError(f"{where}: {name} source {pattern!r} matches nothing in the build context {root}")
    out = []
    for path in matches:
        real = path.resolve()
        if root not in (real, *real.parents):
            raise DockerfileError(f"{where}: {name} source {pattern!r} leaves the build context {root}")
        out.append(CopySource(path.name, host_path=str(path)))
    return out


def _glob(root: Path, pattern: str) -> list[Path]:
    if not any(ch in pattern for ch in "*?["):
        target = root / pattern
        return [target] if target.exists() or target.is_symlink() else []
    current = [root]
    for part in pattern.split("/"):
        nxt = []
        for base in current:
            if not base.is_dir():
                continue
            nxt.extend(sorted(base / name for name in os.listdir(base) if fnmatch.fnmatchcase(name, part)))
        current = nxt
    return current
