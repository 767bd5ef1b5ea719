"""Environment images for the local sandbox: the task's Dockerfile replayed, its files laid down and its
setup commands run, into one read-only layer that every trial of the task stacks its upper on.

Built once per distinct environment (keyed by the sha256 of everything that goes into it) and cached
on disk; concurrent builders of one key (threads or processes) wait on a file lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from t1_actors.backends._sandbox.interface import BuildReport, ExecResult, SandboxInfraError
from t1_actors.backends._sandbox.layers import Layer, RootStack, remove_tree, unmount_all
from t1_actors.backends._sandbox.profiles import APT_SHIMS, APT_STANDIN_LOG, PYTHON_SHIMS, ImageProfile, profile_for
from t1_actors.backends._sandbox.rootfs import RootFS
from t1_actors.backends._sandbox.runner import BASE_ENV, ExecLimits, run_in_root
from t1_actors.backends.dockerfile import BuildPlan, CopyStep, RunStep, WorkdirStep, plan_dockerfile

if TYPE_CHECKING:
    from t1_actors.tasks.model import Task

_FORMAT = 3  # bump when the layout of an image changes (2: base-image profiles; 3: apt stand-in, image PATH)


class SandboxBuildError(SandboxInfraError):
    """The task's environment could not be built (a RUN failed, a COPY source is missing, ...)."""


@dataclass(frozen=True)
class Image:
    key: str
    layer: Layer
    env: dict[str, str]
    workdir: str
    report: BuildReport


def environment_plan(task: Task) -> BuildPlan:
    environment = task.environment
    if environment.dockerfile is None:
        return BuildPlan(workdir=environment.workdir)
    try:
        return plan_dockerfile(environment.dockerfile, environment.context_dir)
    except ValueError as exc:
        raise SandboxBuildError(f"task {task.id}: Dockerfile: {exc}") from exc


def image_key(task: Task, plan: BuildPlan, system_dirs: tuple[str, ...], base: tuple[str, ...] = ()) -> str:
    """``base``: the layers the image is built on (the host's mask), by name."""
    digest = hashlib.sha256()
    environment = task.environment
    digest.update(json.dumps({
        "format": _FORMAT, "dockerfile": environment.dockerfile, "setup": environment.setup,
        "env": environment.env, "workdir": environment.workdir, "system_dirs": system_dirs, "base": base,
        "files": {path: [spec.mode, hashlib.sha256(spec.data).hexdigest()]
                  for path, spec in sorted(environment.files.items())},
    }, sort_keys=True).encode())
    for step in plan.steps:
        if isinstance(step, CopyStep):
            for source in step.sources:
                if source.host_path:
                    _hash_tree(Path(source.host_path), digest)
    return digest.hexdigest()[:32]


def _hash_tree(path: Path, digest) -> None:
    digest.update(str(path).encode())
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.iterdir()):
            _hash_tree(child, digest)
    elif path.is_symlink():
        digest.update(os.readlink(path).encode())
    elif path.is_file():
        digest.update(path.read_bytes())


def build_image(task: Task, store: Path, stack: RootStack, limits: ExecLimits, network: bool, *,
                seccomp_filter: bool = True) -> Image:
    """The image of ``task``'s environment, from the cache or built now."""
    plan = environment_plan(task)
    key = image_key(task, plan, stack.system_dirs, tuple(layer.path.name for layer in stack.layers))
    final = store / key
    cached = _load(final)
    if cached is not None:
        return cached
    store.mkdir(parents=True, exist_ok=True)
    with open(store / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _load(final)
        if cached is not None:
            return cached
        scratch = store / f"{key}.building-{os.getpid()}"
        remove_tree(scratch)
        try:
            image = _build(task, plan, key, scratch, stack, limits, network, seccomp_filter)
            (scratch / "layer" / "meta.json").write_text(json.dumps(
                {"env": image.env, "workdir": image.workdir, "report": asdict(image.report)}))
            os.rename(scratch / "layer", final)
        finally:
            remove_tree(scratch)
    loaded = _load(final)
    assert loaded is not None
    return Image(key, loaded.layer, loaded.env, loaded.workdir,
                 BuildReport(**{**asdict(loaded.report), "cached": False}))


def _load(path: Path) -> Image | None:
    meta = path / "meta.json"
    if not meta.is_file():
        return None
    data = json.loads(meta.read_text())
    return Image(path.name, Layer(path), data["env"], data["workdir"], BuildReport(**{**data["report"], "cached": True}))


def _files_only(task: Task, plan: BuildPlan, system_dirs: tuple[str, ...]) -> bool:
    """True when the environment is just files outside the host's system dirs: no mount needed to build it."""
    return not plan.steps and not task.environment.setup and profile_for(
        plan.base_images[0] if plan.base_images else None) is None and all(
        path.split("/")[1] not in system_dirs for path in [*task.environment.files, task.environment.workdir])


def _build_files_only(task: Task, key: str, scratch: Path, stack: RootStack) -> Image:
    start = time.monotonic()
    layer = Layer(scratch / "layer").create(stack.system_dirs)
    root = RootFS(layer.root())  # a fresh layer has no symlinks to follow: plain writes are exact
    for path, spec in task.environment.files.items():
        root.write(path, spec.data, spec.mode)
    root.makedirs(task.environment.workdir)
    return Image(key, layer, dict(task.environment.env), task.environment.workdir,
                 BuildReport(None, 0, [], False, time.monotonic() - start))


def _build(task: Task, plan: BuildPlan, key: str, scratch: Path, stack: RootStack, limits: ExecLimits,
           network: bool, seccomp_filter: bool) -> Image:
    if _files_only(task, plan, stack.system_dirs):
        return _build_files_only(task, key, scratch, stack)
    start = time.monotonic()
    deadline = start + limits.timeout_s
    layer = Layer(scratch / "layer").create(stack.system_dirs)
    merged = scratch / "merged"
    merged.mkdir()
    mounted = stack.mount(merged, layer, scratch / "work")
    root = RootFS(merged)
    profile = profile_for(plan.base_images[0] if plan.base_images else None)
    image_env = {**(profile.env() if profile else {}), **plan.env, **task.environment.env}
    env = {**BASE_ENV, **image_env}

    def run(argv: tuple[str, ...] | list[str], step_env: dict[str, str], workdir: str, what: str,
            stdin: bytes | None = None) -> ExecResult:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SandboxBuildError(f"task {task.id}: environment build ran past {limits.timeout_s:.0f} s at {what}")
        root.makedirs(workdir)
        step_limits = ExecLimits(left, limits.memory_bytes, limits.pids, limits.cpus, limits.file_size_bytes,
                                 limits.max_output_bytes)
        result = run_in_root(merged, list(argv), env=step_env, workdir=workdir, limits=step_limits,
                             network=network, name=f"build-{key[:12]}", stdin=stdin, seccomp_filter=seccomp_filter)
        if result.exit_code != 0:
            tail = (result.stderr or result.stdout)[-800:]
            raise SandboxBuildError(f"task {task.id}: {what} exited {result.exit_code}"
                                    f"{' (timed out)' if result.timed_out else ''}: {tail}")
        return result

    try:
        if profile is not None:
            lay_profile(profile, root)
        for step in plan.steps:
            if isinstance(step, WorkdirStep):
                root.makedirs(step.path)
            elif isinstance(step, RunStep):
                run(step.argv, {**BASE_ENV, **(profile.env() if profile else {}), **step.env}, step.workdir,
                    f"Dockerfile line {step.line} RUN", step.stdin)
            elif isinstance(step, CopyStep):
                _copy(step, root, lambda argv, what, workdir=step.workdir: run(argv, env, workdir, what))
        for path, spec in task.environment.files.items():
            root.write(path, spec.data, spec.mode)
        root.makedirs(task.environment.workdir)
        for i, command in enumerate(task.environment.setup):
            run(["/bin/sh", "-c", command], env, task.environment.workdir, f"setup command {i}")
        satisfied = _apt_standins(root) if profile is not None and profile.apt_from_host else []
    except (OSError, ValueError) as exc:
        raise SandboxBuildError(f"task {task.id}: environment build failed: {exc}") from exc
    finally:
        unmount_all(mounted)
    shutil.rmtree(scratch / "work", ignore_errors=True)
    unhonoured = list(plan.unhonoured)
    if profile is not None:
        unhonoured[0:0] = [profile.describe(), *satisfied]
    if len(plan.base_images) > 0:
        unhonoured.insert(0, f"FROM {plan.base_images[0]} (the host system stands in for the image)")
    report = BuildReport(plan.base_images[0] if plan.base_images else None, len(plan.steps), unhonoured,
                         False, time.monotonic() - start)
    return Image(key, Layer(scratch / "layer"), image_env, task.environment.workdir, report)


def lay_profile(profile: ImageProfile, root: RootFS) -> None:
    """What the base image would have provided (``profiles``), laid into the task's layer."""
    if profile.workdir:
        root.makedirs(profile.workdir)
    if profile.python:
        for path, script in PYTHON_SHIMS.items():
            if not root.exists(path):
                root.write(path, script.encode(), 0o755)
    if profile.apt_from_host:
        for path, script in APT_SHIMS.items():
            root.write(path, script.encode(), 0o755)


def _apt_standins(root: RootFS) -> list[str]:
    """What the apt stand-in satisfied from the host during the build, one report line per package."""
    if not root.exists(APT_STANDIN_LOG):
        return []
    lines = dict.fromkeys(line for line in root.read(APT_STANDIN_LOG).decode(errors="replace").splitlines() if line)
    return [f"apt-get install {line}" for line in lines]


def _copy(step: CopyStep, root: RootFS, run) -> None:
    into_dir = step.dest_is_dir or root.is_dir(step.dest)  # Docker: COPY f /existing-dir copies into it
    for source in step.sources:
        target = f"{step.dest.rstrip('/')}/{source.name}" if into_dir else step.dest
        if source.content is not None:
            root.write(target, source.content, step.chmod if step.chmod is not None else 0o644)
        elif source.root_path is not None:  # COPY --from=stage: the stages share this root
            run(["cp", "-a", source.root_path, target if not into_dir else step.dest], f"line {step.line} COPY --from")
        else:
            host = Path(source.host_path)
            if step.unpack_archives and host.is_file() and tarfile.is_tarfile(host):
                scratch = f"/tmp/.t1-add-{os.getpid()}-{host.name}"
                root.write(scratch, host.read_bytes(), 0o600)
                root.makedirs(step.dest)
                run(["/bin/sh", "-c", f"tar -xf '{scratch}' -C '{step.dest}' && rm -f '{scratch}'"],
                    f"line {step.line} ADD {host.name}")
                continue
            if host.is_dir():
                root.copy_in(host, step.dest.rstrip("/") or "/", step.chmod)
            else:
                root.copy_in(host, target, step.chmod)
        if step.chown:
            run(["chown", "-R", step.chown, target if source.content is not None or not into_dir else step.dest],
                f"line {step.line} --chown")
