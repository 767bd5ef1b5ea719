"""``[slurm]``: what each config host asks of its Slurm node, for ``t1-actor launch --slurm``.

Every ``[[actors]] host`` becomes one node of one Slurm job. A host's requirements are the section's defaults
(``partition``, ``cpus``, ``mem``, ``gpus``, ``constraint``) overridden by its own ``[slurm.hosts.NAME]`` table.
Hosts with equal requirements share one allocation (one component); hosts whose requirements differ make a
heterogeneous job, one component per distinct set (Slurm never puts two components on one node). Roles land
on the right nodes by ``constraint`` (node features): a GPU-less test cluster's nodes tagged ``gpu`` stand in
for GPU nodes. No node name or address is written here: they come from the allocation when the job starts.

Checked by ``t1-actor check`` (``RunConfig``): every ``[slurm.hosts]`` name and ``control_host`` is an
``[[actors]] host``; ``t1-actor launch --slurm`` refuses, before submitting, an actor or the supervisor with an
address of its own (the allocation decides them).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MEM_PATTERN = r"^[0-9]+[KMGT]?$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class SlurmHost(BaseModel):
    """One config host's node: its keys override the ``[slurm]`` defaults of the same name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = Field(None, description="sbatch --partition for this host's node")
    cpus: int | None = Field(None, ge=1, description="CPUs for this host's step (--cpus-per-task)")
    mem: str | None = Field(None, pattern=MEM_PATTERN, description="memory of this host's node (--mem, e.g. 64G)")
    gpus: int | None = Field(None, ge=0, description="GPUs of this host's node (--gres=gpu:N; samplers, learners)")
    constraint: str | None = Field(None, description="node features this host needs (--constraint, e.g. 'gpu&h100')")


class SlurmConfig(BaseModel):
    """``t1-actor launch --slurm``: one Slurm job, a node and a step per ``[[actors]] host`` (docs/scale.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_name: str | None = Field(None, pattern=NAME_PATTERN, description="sbatch --job-name; default t1-<run id>")
    partition: str | None = Field(None, description="default --partition of every host's node")
    cpus: int | None = Field(None, ge=1, description="default CPUs of every host's step (--cpus-per-task)")
    mem: str | None = Field(None, pattern=MEM_PATTERN, description="default memory of every host's node (--mem)")
    gpus: int = Field(0, ge=0, description="default GPUs of every host's node (--gres=gpu:N when > 0)")
    constraint: str | None = Field(None, description="default node features (--constraint) of every host's node")
    time: str | None = Field(None, description="sbatch --time of the job (e.g. '12:00:00'); default the partition's")
    account: str | None = Field(None, description="sbatch --account")
    control_host: str | None = Field(None, description="the host whose step runs the job itself (corpus, tokenizer, "
                                     "SFT, the supervisor); default the staleness controller's host")
    port: int = Field(7400, ge=1024, le=65000, description="first tcp port on the nodes: the supervisor's; actor i "
                      "listens on port + 2 + 2i (control) and the next one (bulk); a one-host config keeps ipc://")
    python: str | None = Field(None, description="the Python that runs t1 on the nodes; default the one that "
                               "submits (a shared venv)")
    hosts: dict[str, SlurmHost] = Field(default_factory=dict, description="per config host: its own requirements "
                                        "([slurm.hosts.NAME]), over the defaults above")

    def requirements(self, host: str) -> SlurmHost:
        """``host``'s requirements: its own table's keys over the section's defaults."""
        own = self.hosts.get(host, SlurmHost())
        defaults = {"partition": self.partition, "cpus": self.cpus, "mem": self.mem, "gpus": self.gpus,
                    "constraint": self.constraint}
        return SlurmHost(**{key: getattr(own, key) if getattr(own, key) is not None else value
                            for key, value in defaults.items()})
