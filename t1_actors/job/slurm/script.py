"""The sbatch script of ``t1-actor launch --slurm``: one job, one node per config host, one step per host.

``plan(config)`` groups the config's hosts by their ``[slurm]`` requirements: one group is one allocation of that
many nodes; several make a heterogeneous job, one component per group (Slurm never shares a node between
components, which is also why hosts with equal requirements are not split into components). ``render(...)`` writes
the script:

1. ``#SBATCH`` lines per component: ``--nodes`` (its hosts), ``--ntasks-per-node=1``, and what the hosts ask
   (``--partition``, ``--cpus-per-task``, ``--mem``, ``--gres=gpu:N``, ``--constraint``);
2. ``T1_RUN_KEY_FILE``: the run key reaches each step through a file of mode 0600 in the run directory, never a
   command line or the environment sbatch records at submission (slurmctld keeps it);
3. ``t1_actors.job.slurm.place`` on the job's first node: which allocated node plays which host, and the config
   with each actor's ``tcp://`` address on its node (nothing of the allocation is known at submission);
4. one ``srun --overlap --nodes=1 --ntasks=1 --nodelist=NODE`` step per host, in the background: the control host's
   runs the campaign (``t1-actor launch --host H``: corpus, tokenizer, SFT, the supervisor, its own actors),
   every other host's joins it (``t1-actor launch --host H --join``: that host's actors under its own supervisor);
5. the job's lifetime: it ends with the control host's step, whose exit status is the job's. Any other step
   ending first (a host's supervisor died, its node rebooted) ends the job failed with one line naming the host
   and its node; the remaining steps get SIGTERM (``scancel --signal=TERM``) and stop their actors cleanly.
   ``scancel`` signals every step itself; a lost node ends the job ``NODE_FAIL`` (Slurm's own doing).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from t1_actors.job.slurm.config import SlurmConfig, SlurmHost

KEY_FILE = "run.key"          # RUN/slurm/run.key, mode 0600
SUBMITTED_CONFIG = "config.toml"  # RUN/slurm/config.toml: the config as submitted (mode 0600)


@dataclass
class Component:
    """One allocation: its hosts (one node each) and what each of their nodes must offer."""

    requirements: SlurmHost
    hosts: list[str] = field(default_factory=list)


@dataclass
class Plan:
    control: str                  # the host whose step runs the job itself
    components: list[Component]   # one: a plain job; several: a heterogeneous job

    @property
    def hosts(self) -> list[str]:
        return [host for component in self.components for host in component.hosts]

    def component_of(self, host: str) -> int:
        return next(i for i, c in enumerate(self.components) if host in c.hosts)


def config_hosts(config) -> list[str]:
    """The config's hosts in the order their first actor appears."""
    return list(dict.fromkeys(spec.host for spec in config.actors))


def control_host(config) -> str:
    """``[slurm] control_host``, else the staleness controller's host, else the first host."""
    slurm: SlurmConfig = config.slurm
    if slurm.control_host is not None:
        return slurm.control_host
    staleness = config.actors_of("staleness")
    return staleness[0].host if staleness else config_hosts(config)[0]


def plan(config) -> Plan:
    """The hosts grouped into components by equal requirements; the control host first (its component is the job's
    first, whose first node runs the batch script)."""
    control = control_host(config)
    hosts = [control] + [h for h in config_hosts(config) if h != control]
    components: list[Component] = []
    for host in hosts:
        wants = config.slurm.requirements(host)
        same = next((c for c in components if c.requirements == wants), None)
        if same is None:
            components.append(same := Component(wants))
        same.hosts.append(host)
    return Plan(control=control, components=components)


def sbatch_options(requirements: SlurmHost, nodes: int) -> list[str]:
    out = [f"--nodes={nodes}", "--ntasks-per-node=1"]
    if requirements.partition:
        out.append(f"--partition={requirements.partition}")
    if requirements.cpus:
        out.append(f"--cpus-per-task={requirements.cpus}")
    if requirements.mem:
        out.append(f"--mem={requirements.mem}")
    if requirements.gpus:
        out.append(f"--gres=gpu:{requirements.gpus}")
    if requirements.constraint:
        out.append(f"--constraint={requirements.constraint}")
    return out


def step_options(requirements: SlurmHost) -> list[str]:
    """What one host's step asks of its node: its CPUs and GPUs (a step gets one CPU and no GPU otherwise)."""
    out = []
    if requirements.cpus:
        out.append(f"--cpus-per-task={requirements.cpus}")
    if requirements.gpus:
        out.append(f"--gres=gpu:{requirements.gpus}")
    return out


_LIFETIME = r"""
# the job's lifetime: it ends with the control host's step (its exit status is the job's); a step of another host
# ending first ends the job, failed, with one line naming the host and its node; the other steps then get SIGTERM
# and stop their actors (Shutdown, SIGTERM, SIGKILL after [supervisor] shutdown_grace_s each). scancel signals
# every step itself (SIGKILL after KillWait); a lost node ends the job NODE_FAIL.
stopping=""
status=0
trap 'stopping="job cancelled"' TERM INT
while [ ${#STEP[@]} -gt 0 ]; do
  for pid in "${!STEP[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    wait "$pid"
    code=$?
    host=${STEP[$pid]}
    unset "STEP[$pid]"
    [ -z "$stopping" ] || continue
    if [ "$host" != "$CONTROL" ] || [ "$code" -ne 0 ]; then
      echo "t1-slurm: job $SLURM_JOB_ID failed: the step of host $host on node ${NODE[$host]} exited with code $code" >&2
      status=1
    fi
    stopping="step of host $host ended"
    [ ${#STEP[@]} -eq 0 ] || scancel --signal=TERM "$SLURM_JOB_ID"
  done
  [ ${#STEP[@]} -eq 0 ] || { sleep 1 & wait $!; }
done
exit $status
"""


def render(the_plan: Plan, *, run_dir: Path, workdir: Path, python: str, job_name: str, quick: bool, resume: bool,
           time: str | None = None, account: str | None = None, source: str = "") -> str:
    """The sbatch script (module docstring). ``run_dir`` and ``workdir`` absolute; ``python`` the interpreter on
    the nodes; ``source`` the config file named in its comment."""
    slurm_dir = run_dir / "slurm"
    lines = ["#!/bin/bash",
             f"# t1-actor launch --slurm: {source or 'a campaign'}{' --quick' if quick else ''} into {run_dir}"
             f"{' (resumed from its log)' if resume else ''}"]
    for i, component in enumerate(the_plan.components):
        roles = ", ".join(f"{h} (the job)" if h == the_plan.control else h for h in component.hosts)
        lines.append(f"# component {i}: {roles}")
    # --no-requeue: Slurm requeues a batch job whose node failed by default (JobRequeue=1), and the rerun script
    # would start the campaign over on a run directory that has a log: a lost job is resubmitted with --resume
    head = [f"--job-name={job_name}", f"--output={slurm_dir}/slurm-%j.out", "--open-mode=append", "--no-requeue"]
    if time:
        head.append(f"--time={time}")
    if account:
        head.append(f"--account={account}")
    for i, component in enumerate(the_plan.components):
        if i:
            lines.append("#SBATCH hetjob")
        options = (head if i == 0 else []) + sbatch_options(component.requirements, len(component.hosts))
        lines += [f"#SBATCH {option}" for option in options]
    het = len(the_plan.components) > 1
    q = shlex.quote
    placed = f"{q(str(slurm_dir))}/job-$SLURM_JOB_ID"
    groups = " ".join(f"{q(h)}={the_plan.component_of(h)}" for h in the_plan.hosts)
    lines += [
        "set -uo pipefail",
        f"cd {q(str(workdir))}",
        "unset T1_RUN_KEY",
        f"export T1_RUN_KEY_FILE={q(str(slurm_dir / KEY_FILE))}  # the run key: a file of mode 0600, read by each step",
        f"T1=({q(python)} -m t1_actors.cli)",
        f"PLACED={placed}",
        f"CONTROL={q(the_plan.control)}",
        "declare -A NODE STEP",
        "# which allocated node plays which config host, and the config with the actors' addresses on those nodes",
        f"{q(python)} -m t1_actors.job.slurm.place --config {q(str(slurm_dir / SUBMITTED_CONFIG))}"
        f"{' --quick' if quick else ''} --run-dir {q(str(run_dir))} --out \"$PLACED\" {groups} || exit 1",
        '. "$PLACED/nodes.sh"',
    ]
    for host in the_plan.hosts:
        component = the_plan.components[the_plan.component_of(host)]
        srun = ["srun"] + ([f"--het-group={the_plan.component_of(host)}"] if het else [])
        srun += ["--overlap", "--nodes=1", "--ntasks=1", f'--nodelist="${{NODE[{q(host)}]}}"',
                 f"--job-name={q(host)}", f'--output="$PLACED/{q(host)}.out"']
        srun += step_options(component.requirements)
        launch = ['"${T1[@]}"', "launch", "--config", '"$PLACED/config.toml"', "--host", q(host)]
        if host == the_plan.control:
            launch += ["--resume"] if resume else []
        else:
            launch.append("--join")
        lines += [" ".join(srun) + " \\", "  " + " ".join(launch) + " &", f"STEP[$!]={q(host)}"]
    return "\n".join(lines) + "\n" + _LIFETIME.lstrip("\n")
