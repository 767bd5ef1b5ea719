"""Campaigns submitted through a real Slurm (``t1-actor launch --slurm``; tests/_slurm.py starts the cluster).

- one node: a ``--quick`` campaign (warm-started from the session's quick campaign) submitted as one job;
  ``scancel`` at its first PPO step stops every process of the job and leaves the log consistent (every audit
  count at 0 but the trials then in flight, which have no final state yet), the run key nowhere in what
  slurmctld keeps; resubmitted with ``--resume`` it completes, the audit clean;
- three nodes (network namespaces, tests/_netns.py; the log on moto's S3 server on the bridge, since the
  namespaces share one disk): the hosts placed by features (``ctl`` on the node tagged ``ctl``, the sampler's
  and the learner's hosts on the two tagged ``gpu``: a heterogeneous job), each actor listening on its node's
  address; the sampler's node lost at the first PPO step ends the job ``NODE_FAIL``; resubmitted with ``--resume``
  on the same run directory it completes (its learner, killed on its node, restarted by that host's own
  supervisor), learner steps contiguous and the audit clean;
- three nodes, a host's step killed: the job fails with one line naming that host and its node.

Root only (skipped otherwise; as root without Slurm's binaries it fails: CI runs it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _netns import namespace_hosts
from _slurm import KILL_WAIT_S, processes_with_env, slurm_cluster
from fixtures.campaign import ROOT, SMALL, micro_config_data, write_config

from schemas import ActorLifecycle, LearnerStep
from storage import EventLog

# the three-node tests run alone (``netns``: tests/conftest.py); the one-node test shares the machine
# with the other worker's tests: nothing in it times a heartbeat, and its cluster's ports are free ones
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

KEY = "slurm-test-run-key-0123456789abcdef"
PLACEMENT = {"staleness-0": "ctl", "verifier-0": "ctl", "sandbox-0": "ctl", "sampler-0": "gpu-0",
             "learner-0": "gpu-1", "critic-0": "gpu-1"}
FEATURES = {"n1": "ctl", "n2": "gpu", "n3": "gpu"}


def _config(tmp: Path, quick_campaign, *, actors=None, slurm=None, **sections) -> Path:
    """The micro campaign (SMALL, warm-started from the session's quick campaign), ``[slurm]`` as given."""
    changes = {**SMALL, "campaign": {**SMALL["campaign"], "warm_start_from": str(quick_campaign.run_dir)}}
    for section, values in sections.items():
        changes[section] = {**changes.get(section, {}), **values}
    if actors is not None:
        changes["actors"] = actors
    data = micro_config_data(tmp, **changes)
    data["slurm"] = slurm or {}
    return write_config(tmp / "slurm.toml", data)


def _submit(cluster, config: Path, run_dir: Path, *flags: str, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "t1_actors.cli", "launch", "--config", str(config), "--quick",
                           "--run-dir", str(run_dir), "--slurm", *flags], cwd=ROOT, capture_output=True, text=True,
                          env={**cluster.env, **(env or {})}, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout.split()[-1]


def _outputs(run_dir: Path, job: str) -> str:
    """The job's output and each host step's, for failure messages."""
    parts = [run_dir / "slurm" / f"slurm-{job}.out", *sorted((run_dir / "slurm" / f"job-{job}").glob("*.out"))]
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in parts if p.exists())


def _wait_for(predicate, timeout_s: float, what: str, cluster, job: str, run_dir: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        state = cluster.job_state(job)
        if state not in ("PENDING", "RUNNING", "CONFIGURING"):
            pytest.fail(f"job {job} is {state} while waiting for {what}:\n{_outputs(run_dir, job)}")
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}:\n{_outputs(run_dir, job)}")


def _learner_steps(log) -> int:
    try:
        return EventLog.open(log).counts().get("learner_step", 0)
    except Exception:  # not made yet
        return 0


def _audit(run_dir: Path, *, clean: bool = True) -> dict:
    """``t1-replay audit RUN --json``; with ``clean`` it must be clean (exit 0)."""
    done = subprocess.run([sys.executable, "-m", "tools.replay", "audit", str(run_dir), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1) and (done.returncode == 0 or not clean), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


# what t1-replay audit requires to be 0 (tools/_replay/audit.py Audit.MUST_BE_ZERO), but for the trials in flight
# when every process stopped: they have no final state until a relaunch closes or resumes them
CONSISTENT = ("events_duplicated", "trials_final_twice", "trials_verified_twice", "continuations_unlinked",
              "learner_steps_gap", "trajectories_consumed_twice", "trajectories_consumed_unadmitted",
              "versions_out_of_order", "weights_mismatched", "chunks_misnumbered", "chunk_rewards_differ",
              "context_edits_uncounted")


def _job_processes(job: str) -> list[int]:
    """Processes that carry this job's id in their environment: its steps' tasks and every actor they started."""
    return processes_with_env(f"SLURM_JOB_ID={job}")


def _actor_pid(job: str, name: str) -> int | None:
    """The process of actor ``name`` in job ``job`` (``t1-actor ROLE --config ... --name NAME``)."""
    for pid in _job_processes(job):
        try:
            argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--name" in argv and name.encode() in argv and b"t1_actors.cli" in argv:
            return pid
    return None


def _lifecycle(log, writer: str, actor: str, state: str) -> bool:
    return any(eid.startswith(f"{writer}:") and e.actor == actor and e.state == state
               for eid, e in EventLog.open(log).events(kinds=["actor_lifecycle"]) if isinstance(e, ActorLifecycle))


def _steps(log) -> list[int]:
    return sorted(e.step for _, e in EventLog.open(log).events(kinds=["learner_step"]) if isinstance(e, LearnerStep))


def test_a_campaign_submitted_to_one_node_is_cancelled_cleanly_and_resumed_to_the_end(tmp_path, quick_campaign):
    run_dir = tmp_path / "run"
    config = _config(tmp_path, quick_campaign)
    with slurm_cluster(tmp_path / "slurm") as cluster:
        job = _submit(cluster, config, run_dir, env={"T1_RUN_KEY": KEY})  # the key the run is to use
        key_file = run_dir / "slurm" / "run.key"
        assert key_file.read_text().strip() == KEY and key_file.stat().st_mode & 0o777 == 0o600
        _wait_for(lambda: _learner_steps(run_dir / "log") >= 1, 600, "the first PPO step", cluster, job, run_dir)
        # the key reached the job through its file only: not in the script, not in the environment slurmctld keeps
        state_dir = tmp_path / "slurm" / "ctld"
        assert any(state_dir.rglob("environment")), "slurmctld keeps no job environment to check"
        kept = [p for p in state_dir.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
        assert not kept, kept
        cancelled = time.monotonic()
        cluster.run("scancel", job)
        assert cluster.wait_job(job, KILL_WAIT_S + 30) == "CANCELLED"
        while _job_processes(job) and time.monotonic() - cancelled < KILL_WAIT_S + 30:
            time.sleep(0.2)
        gone_s = time.monotonic() - cancelled
        assert not _job_processes(job), f"left after scancel: {_job_processes(job)}"
        cut = _audit(run_dir, clean=False)  # the log as the cancel left it: consistent, some trials in flight
        assert {k: cut[k] for k in CONSISTENT} == dict.fromkeys(CONSISTENT, 0), cut
        assert cut["learner_steps"] >= 1
        in_flight = [t.split()[0] for t in cut["examples"].get("trials_unaccounted", [])]

        resumed = _submit(cluster, config, run_dir, "--resume")
        state = cluster.wait_job(resumed, 900)
        assert state == "COMPLETED", _outputs(run_dir, resumed)
        audit = _audit(run_dir)  # clean: the trials in flight at the cancel closed (or resumed) by the relaunch
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_after"] is not None
    assert _steps(run_dir / "log") == [0, 1]  # steps 0..rl_steps-1: contiguous across the cancel, none trained twice
    print(json.dumps({"slurm_one_node": {"cancel_to_no_process_s": round(gone_s, 1),
                                         "learner_steps_at_cancel": cut["learner_steps"],
                                         "trials_in_flight_at_cancel": cut["trials_unaccounted"],
                                         "in_flight_examples": in_flight,
                                         "audit_after_resume": {k: audit[k] for k in ("events_checked",
                                                                                       "trials_issued",
                                                                                       "learner_steps")}}}))


def _three_node_config(tmp: Path, quick_campaign, url: str) -> Path:
    actors = [{"name": name, "role": name.split("-")[0], "host": host} for name, host in PLACEMENT.items()]
    slurm = {"constraint": "ctl", "port": 7600,
             "hosts": {"gpu-0": {"constraint": "gpu"}, "gpu-1": {"constraint": "gpu"}}}
    return _config(tmp, quick_campaign, actors=actors, slurm=slurm, storage={"url": url, "lease_s": 6.0},
                   transport={"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 4.0},
                   campaign={"rl_steps": 2, "rl_seconds": 900})


@pytest.fixture
def three_nodes(tmp_path, monkeypatch):
    """Three namespace hosts as Slurm nodes n1-n3 (features ctl, gpu, gpu) and moto's S3 server on the bridge;
    the AWS variables point at it (the job inherits them through sbatch)."""
    import boto3
    import s3fs
    from moto.server import ThreadedMotoServer

    with namespace_hosts(["n1", "n2", "n3"], subnet=239) as hosts:
        server = ThreadedMotoServer(ip_address=hosts.gateway, port=0, verbose=False)
        server.start()
        try:
            endpoint = "http://{}:{}".format(*server.get_host_and_port())
            for key, value in dict(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="t1", AWS_SECRET_ACCESS_KEY="t1",
                                   AWS_DEFAULT_REGION="us-east-1").items():
                monkeypatch.setenv(key, value)
            s3fs.S3FileSystem.clear_instance_cache()  # an earlier test's client points at another endpoint
            boto3.client("s3").create_bucket(Bucket="t1-slurm")
            with slurm_cluster(tmp_path / "slurm", hosts=hosts, features=FEATURES) as cluster:
                yield cluster, hosts
        finally:
            server.stop()


@pytest.mark.netns
def test_three_nodes_place_hosts_by_features_and_a_lost_node_is_resumed_from_the_log(tmp_path, quick_campaign,
                                                                                    three_nodes):
    cluster, hosts = three_nodes
    url = "s3://t1-slurm/campaign/log"
    run_dir = tmp_path / "run"
    config = _three_node_config(tmp_path, quick_campaign, url)
    job = _submit(cluster, config, run_dir)
    placement_file = run_dir / "slurm" / f"job-{job}" / "placement.json"
    placement = _wait_for(lambda: placement_file.is_file() and json.loads(placement_file.read_text()), 120,
                          "the placement", cluster, job, run_dir)
    assert placement["ctl"]["node"] == "n1"  # the only node with feature ctl
    assert {placement["gpu-0"]["node"], placement["gpu-1"]["node"]} == {"n2", "n3"}
    assert cluster.job(job).get("HetJobId") == job  # requirements differ: a heterogeneous job
    _wait_for(lambda: _learner_steps(url) >= 1, 900, "the first PPO step", cluster, job, run_dir)
    # every actor listens on its host's node: an address only that node's namespace holds
    resolved = json.loads((run_dir / "config.resolved.json").read_text())
    for spec in resolved["actors"]:
        node = placement[PLACEMENT[spec["name"]]]["node"]
        assert spec["address"].startswith(f"tcp://{cluster.nodes[node]}:"), (spec, placement)
    lost = placement["gpu-0"]["node"]  # the sampler's node
    cluster.lose(lost)
    assert cluster.wait_job(job, 120) == "NODE_FAIL", _outputs(run_dir, job)
    steps_before = _steps(url)
    cluster.restore(lost)

    resumed = _submit(cluster, config, run_dir, "--resume")
    # a dead actor of a joined host: that host's own supervisor restarts it
    learner = _wait_for(lambda: _actor_pid(resumed, "learner-0"), 300, "learner-0's process", cluster, resumed,
                        run_dir)
    os.kill(learner, signal.SIGKILL)
    _wait_for(lambda: _lifecycle(url, "supervisor-gpu-1", "learner-0", "restarted"), 120,
              "learner-0 restarted by gpu-1's supervisor", cluster, resumed, run_dir)
    state = cluster.wait_job(resumed, 1200)
    placement_again = json.loads((run_dir / "slurm" / f"job-{resumed}" / "placement.json").read_text())
    assert state == "COMPLETED", _outputs(run_dir, resumed)
    audit = _audit(run_dir)
    log = EventLog.open(url)
    events = list(log.events())
    segments = set(log.segments())
    assert _steps(url) == [0, 1]  # steps 0..rl_steps-1: contiguous across the lost node, none trained twice
    # each joined host's actors were started by that host's own supervisor
    started = {(eid.split(":")[0], e.actor) for eid, e in events if isinstance(e, ActorLifecycle)
               and e.state == "started"}
    for name, host in PLACEMENT.items():
        assert (("supervisor" if host == "ctl" else f"supervisor-{host}"), name) in started, (name, started)
    assert {"supervisor-gpu-0", "supervisor-gpu-1", "campaign"} <= segments
    print(json.dumps({"slurm_three_nodes": {
        "placement": {h: (p["node"], p["address"], p["actors"]) for h, p in placement.items()},
        "placement_after_resume": {h: p["node"] for h, p in placement_again.items()},
        "lost_node": lost, "learner_steps_before_loss": steps_before,
        "audit": {k: audit[k] for k in ("events_checked", "trials_issued", "learner_steps", "versions_published")},
        "final_states": audit["final_states"]}}))


@pytest.mark.netns
def test_a_dead_step_fails_the_job_with_one_line_naming_its_host_and_node(tmp_path, quick_campaign, three_nodes):
    cluster, hosts = three_nodes
    run_dir = tmp_path / "run"
    config = _three_node_config(tmp_path, quick_campaign, "s3://t1-slurm/dead-step/log")
    job = _submit(cluster, config, run_dir)
    placement_file = run_dir / "slurm" / f"job-{job}" / "placement.json"
    placement = _wait_for(lambda: placement_file.is_file() and json.loads(placement_file.read_text()), 120,
                          "the placement", cluster, job, run_dir)

    def joined_supervisor() -> int | None:  # gpu-1's step: t1-actor launch ... --host gpu-1 --join
        for pid in _job_processes(job):
            try:
                argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"t1_actors.cli" in argv and b"--join" in argv and b"gpu-1" in argv and not argv[0].endswith(b"srun"):
                return pid  # the step's task on gpu-1's node, not the srun that started it from the first node
        return None

    pid = _wait_for(joined_supervisor, 120, "gpu-1's supervisor", cluster, job, run_dir)
    os.kill(pid, signal.SIGKILL)
    assert cluster.wait_job(job, KILL_WAIT_S + 60) == "FAILED", _outputs(run_dir, job)
    output = (run_dir / "slurm" / f"slurm-{job}.out").read_text()
    lines = [line for line in output.splitlines() if line.startswith("t1-slurm: job")]
    node = placement["gpu-1"]["node"]
    assert len(lines) == 1 and re.search(rf"host gpu-1 on node {node} exited with code \d+", lines[0]), output
