"""``[slurm]`` and ``t1-actor launch --slurm --dry-run``, without a cluster: what ``check`` refuses, the script that
would be submitted (one component per distinct set of requirements, one step per host, the key through a file),
and the run key's file (``T1_RUN_KEY_FILE``) refused when others can read it. tests/test_slurm.py submits to a
real Slurm."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fixtures.campaign import ROOT, micro_config_data, write_config

from t1_actors.job.config import parse_config
from t1_actors.job.resume import differing_keys
from t1_actors.job.slurm.script import plan
from t1_actors.runtime.config import ConfigError

PLACEMENT = {"staleness-0": "ctl", "verifier-0": "ctl", "sandbox-0": "ctl", "sampler-0": "gpu-0",
             "sampler-1": "gpu-1", "learner-0": "train", "critic-0": "train"}
SLURM = {"partition": "batch", "cpus": 8, "mem": "32G", "time": "04:00:00",
         "hosts": {"gpu-0": {"gpus": 1, "constraint": "h100"}, "gpu-1": {"gpus": 1, "constraint": "h100"},
                   "train": {"gpus": 4, "mem": "200G", "constraint": "h100"}}}


def _data(tmp_path, **slurm) -> dict:
    data = micro_config_data(tmp_path, actors=[{"name": n, "role": n.split("-")[0], "host": h}
                                               for n, h in PLACEMENT.items()])
    data["slurm"] = {**SLURM, **slurm}
    data.pop("quick")  # the file's [quick.*] tables; parse_config takes a config as --quick or not leaves it
    return data


def _t1(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "t1_actors.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


def test_hosts_with_equal_requirements_share_a_component_and_the_control_host_comes_first(tmp_path):
    config = parse_config(_data(tmp_path))
    the_plan = plan(config)
    assert the_plan.control == "ctl"  # the staleness controller's host
    assert [c.hosts for c in the_plan.components] == [["ctl"], ["gpu-0", "gpu-1"], ["train"]]
    assert the_plan.components[2].requirements.model_dump() == {"partition": "batch", "cpus": 8, "mem": "200G",
                                                                "gpus": 4, "constraint": "h100"}
    same = parse_config({**_data(tmp_path), "slurm": {"constraint": "any"}})
    assert [c.hosts for c in plan(same).components] == [["ctl", "gpu-0", "gpu-1", "train"]]  # one allocation


def test_check_refuses_a_slurm_host_no_actor_runs_on(tmp_path):
    data = _data(tmp_path, hosts={"gpu-9": {"gpus": 1}})
    with pytest.raises(ConfigError, match=r"\[slurm.hosts.gpu-9\]: no \[\[actors\]\] entry has host = 'gpu-9'"):
        parse_config(data)
    with pytest.raises(ConfigError, match=r"control_host = 'nowhere'"):
        parse_config(_data(tmp_path, control_host="nowhere"))
    with pytest.raises(ConfigError, match=r"\[slurm\] mem"):
        parse_config(_data(tmp_path, mem="lots"))


def test_dry_run_prints_a_heterogeneous_job_with_one_step_per_host_and_writes_nothing(tmp_path):
    config = write_config(tmp_path / "c.toml", _data(tmp_path))
    run_dir = tmp_path / "run"
    done = _t1("launch", "--config", str(config), "--run-dir", str(run_dir), "--slurm", "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:]
    script = done.stdout
    assert not run_dir.exists()
    assert script.count("#SBATCH hetjob") == 2
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --partition=batch\n#SBATCH --cpus-per-task=8\n" \
           "#SBATCH --mem=32G\n#SBATCH --gres=gpu:1\n#SBATCH --constraint=h100" in script
    assert "#SBATCH --gres=gpu:4" in script and "#SBATCH --time=04:00:00" in script
    steps = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(steps) == 4 and all("--overlap" in s and "--nodelist=" in s for s in steps)
    assert "--het-group=1" in steps[1] and "--het-group=1" in steps[2] and "--het-group=2" in steps[3]
    assert script.count("--join &") == 3 and "--host ctl &" in script  # the control host runs the job
    assert f"export T1_RUN_KEY_FILE={run_dir}/slurm/run.key" in script and "unset T1_RUN_KEY\n" in script


def test_slurm_refuses_addresses_written_in_the_config(tmp_path):
    data = _data(tmp_path)
    data["actors"][3]["address"] = "tcp://gpu-node-7:7000"
    config = write_config(tmp_path / "c.toml", data)
    done = _t1("launch", "--config", str(config), "--run-dir", str(tmp_path / "run"), "--slurm", "--dry-run")
    assert done.returncode == 2
    assert "sampler-0: address = 'tcp://gpu-node-7:7000'" in done.stderr and "[slurm] port" in done.stderr


def test_the_run_key_file_must_be_private(tmp_path, monkeypatch):
    config = parse_config(_data(tmp_path))
    key = tmp_path / "run.key"
    key.write_text("k" * 40 + "\n")
    monkeypatch.delenv("T1_RUN_KEY", raising=False)
    monkeypatch.setenv("T1_RUN_KEY_FILE", str(key))
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=r"mode 0644.*chmod 600"):
        config.hmac_key()
    key.chmod(0o600)
    assert config.hmac_key() == b"k" * 40


def test_a_resubmitted_run_may_get_other_nodes_so_other_addresses(tmp_path):
    first = parse_config(_data(tmp_path))
    data = _data(tmp_path)
    for i, spec in enumerate(data["actors"]):
        spec["address"] = f"tcp://10.0.0.{i + 1}:7000"
    data["supervisor"] = {"address": "tcp://10.0.0.1:6999"}
    data["slurm"]["port"] = 7100
    assert differing_keys(first.to_jsonable(), parse_config(data).to_jsonable()) == []
    data["actors"][6]["host"] = "ctl"  # where an actor runs is not an address
    assert differing_keys(first.to_jsonable(), parse_config(data).to_jsonable()) == ["actors[critic-0].host"]
