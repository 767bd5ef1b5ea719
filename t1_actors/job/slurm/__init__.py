"""``t1-actor launch --config F --slurm``: a campaign placed by Slurm (docs/scale.md).

- ``config``: the ``[slurm]`` section (what each config host asks of its node);
- ``script``: the sbatch script, one ``srun --overlap -w NODE`` step per host and the job's lifetime;
- ``submit``: the key file, the script written into the run directory, ``sbatch``;
- ``place``: run by the job on its first node: which allocated node plays which host, and the config with the
  actors' addresses on those nodes.
"""
