"""``t1-actor launch --config F --slurm [--quick] [--run-dir D] [--resume] [--dry-run] [-- SBATCH_OPTIONS]``.

Before anything is written or submitted: the config validates (``[slurm]`` included), no actor and not the
supervisor has an address of its own when the config has several hosts (the allocation decides them), the run
directory (or ``[storage] url``) holds no run yet, or with ``--resume`` holds one this config can go on with
(``t1_actors.job.resume``), and the cluster's ``KillWait`` leaves the supervisor its shutdown
(``control_deadline_s + 2 * shutdown_grace_s`` below it, so ``scancel`` stops every actor cleanly before Slurm's
SIGKILL).

``--dry-run`` prints the sbatch script and touches nothing. Otherwise, in ``RUN/slurm/`` (mode 0700):

- ``run.key`` (mode 0600): the run key, from ``$T1_RUN_KEY`` if set, else the one a previous submission of this run
  made, else a fresh one. The job reads it through ``T1_RUN_KEY_FILE``; ``T1_RUN_KEY`` is removed from the
  environment sbatch submits (slurmctld keeps a job's submitted environment);
- ``config.toml`` (mode 0600): the config file as submitted (the job reads it, not the original, which may change
  before the job starts);
- ``submit-<time>.sbatch``: the script, submitted with ``sbatch --parsable [SBATCH_OPTIONS]``.

The job's own output is ``RUN/slurm/slurm-<job id>.out``; each host's step writes ``RUN/slurm/job-<job id>/<host>.out``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from t1_actors.job.slurm.script import KEY_FILE, SUBMITTED_CONFIG, config_hosts, plan, render
from t1_actors.runtime.config import RUN_KEY_ENV, ConfigError, read_key_file


def check_addresses(config) -> None:
    """Several hosts: the allocation gives every actor and the supervisor its address; one written in the config
    would name a node before Slurm chose it."""
    if len(config_hosts(config)) < 2:
        return
    fixed = [f"[[actors]] {s.name}: address = {s.address!r}" for s in config.actors if s.address]
    fixed += [f"[[actors]] {s.name}: bulk_address = {s.bulk_address!r}" for s in config.actors if s.bulk_address]
    if config.supervisor.address:
        fixed.append(f"[supervisor] address = {config.supervisor.address!r}")
    if fixed:
        raise ConfigError(f"--slurm places every host on a node it allocates and derives the addresses from them; "
                          f"remove {'; '.join(fixed)} (ports come from [slurm] port)")


def kill_wait_s(env: dict[str, str]) -> float | None:
    """The cluster's KillWait (``scontrol show config``), or None when scontrol cannot tell."""
    try:
        done = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"^KillWait\s*=\s*(\d+)", done.stdout, re.MULTILINE)
    return float(match.group(1)) if match else None


def check_kill_wait(config, env: dict[str, str]) -> None:
    """The supervisor's longest stop (a Shutdown call up to ``control_deadline_s``, then SIGTERM after
    ``shutdown_grace_s``, then SIGKILL after as long again) ends before Slurm's SIGKILL at ``KillWait``."""
    wait = kill_wait_s(env)
    grace, deadline = config.supervisor.shutdown_grace_s, config.transport.control_deadline_s
    if wait is not None and deadline + 2 * grace >= wait:
        raise ConfigError(f"[supervisor] shutdown_grace_s = {grace:g} and [transport] control_deadline_s = "
                          f"{deadline:g}: the supervisor's stop (a Shutdown call of up to {deadline:g} s, then SIGTERM "
                          f"after {grace:g} s, then SIGKILL after {grace:g} s more) can outlast the cluster's KillWait = "
                          f"{wait:g} s, after which Slurm kills every process of a cancelled job; lower them so that "
                          "control_deadline_s + 2 * shutdown_grace_s < KillWait")


def run_key(slurm_dir: Path) -> str:
    """$T1_RUN_KEY, else the key a previous submission left, else a fresh one."""
    if os.environ.get(RUN_KEY_ENV):
        return os.environ[RUN_KEY_ENV]
    if (slurm_dir / KEY_FILE).is_file():
        return read_key_file(slurm_dir / KEY_FILE)
    return secrets.token_hex(32)


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, which no one but its owner can read at any moment (made 0600 before the write)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    tmp.replace(path)


def submit(config, config_path: str | Path, *, quick: bool, resume: bool, sbatch_args: list[str], dry_run: bool,
           check_location) -> int:
    """Check, write and submit (module docstring); ``check_location(config)`` is the job's own check of the run
    directory (or of ``--resume``). Returns the exit status; prints the script (``dry_run``) or the job id."""
    check_addresses(config)
    check_location(config)
    env = {k: v for k, v in os.environ.items() if k != RUN_KEY_ENV}
    if shutil.which("sbatch") is None and not dry_run:
        raise ConfigError("--slurm needs Slurm's sbatch on this machine's PATH (apt-get install slurm-client)")
    check_kill_wait(config, env)
    run_dir = Path(config.run.dir).resolve()
    slurm_dir = run_dir / "slurm"
    the_plan = plan(config)
    script = render(the_plan, run_dir=run_dir, workdir=Path.cwd(), python=config.slurm.python or sys.executable,
                    job_name=config.slurm.job_name or f"t1-{config.run.id}", quick=quick, resume=resume,
                    time=config.slurm.time, account=config.slurm.account, source=str(config_path))
    if dry_run:
        sys.stdout.write(script)
        print(f"t1-slurm: --dry-run: nothing written or submitted; would run: sbatch --parsable "
              f"{' '.join(sbatch_args) + ' ' if sbatch_args else ''}{slurm_dir}/submit-<time>.sbatch", file=sys.stderr)
        return 0
    slurm_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(slurm_dir, 0o700)
    write_private(slurm_dir / KEY_FILE, run_key(slurm_dir) + "\n")
    write_private(slurm_dir / SUBMITTED_CONFIG, Path(config_path).read_text())
    script_path = slurm_dir / f"submit-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    script_path.write_text(script)
    done = subprocess.run(["sbatch", "--parsable", *sbatch_args, str(script_path)], capture_output=True, text=True,
                          env=env, timeout=120)
    if done.returncode != 0:
        print(f"t1-actor: sbatch refused {script_path}: {done.stderr.strip()}", file=sys.stderr)
        return 1
    job_id = done.stdout.strip().split(";")[0]
    print(f"t1-slurm: submitted job {job_id} ({len(the_plan.hosts)} host(s): {', '.join(the_plan.hosts)}); "
          f"its output {slurm_dir}/slurm-{job_id}.out, each host's {slurm_dir}/job-{job_id}/HOST.out")
    print(job_id)
    return 0
