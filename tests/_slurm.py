"""A real Slurm for tests: munged, slurmctld and one slurmd per node, started by hand under one directory.

``slurm_cluster(root)`` is one node (``n1``, this machine, 127.0.0.1); ``slurm_cluster(root, hosts=hosts)``
one node per network-namespace host of ``tests/_netns.py`` (``n1``, ``n2``, ... in ``hosts.address``'s
order), each slurmd in its host's namespace (``nsenter --net=... unshare --uts``: not ``ip netns exec``,
which remounts /sys and slurmd then finds no cgroup mount), slurmctld and munged in the root namespace on
the bridge's address. ``features`` gives nodes their Slurm features (what ``--constraint`` selects).

Everything lives under ``root`` (state, logs, pid files; munge's key and socket in a directory of its own
under /tmp, removed at the end) with Debian's ``slurm-wlm`` and
``munge`` binaries (``.ci/setup``): no systemd, no /etc. The recipe: munge's key mode 0400 and its socket
directory 0711, ``AuthInfo=socket=...``, ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``
(no cgroup set-up), ``SchedulerParameters=bf_interval=1`` (heterogeneous jobs are placed by backfill only),
``ReturnToService=2``, ``MailProg=/bin/true``. The cluster is idle in a few seconds.

On exit every job is cancelled and waited for, then slurmd, slurmctld and munged are stopped (SIGTERM,
then SIGKILL), then any process left that carries this cluster's ``SLURM_CONF`` in its environment (a step's
slurmstepd outliving its slurmd) is killed: nothing of the cluster survives the test.

Needs root (slurmd runs jobs as their user; the nodes are namespaces). Not root: skipped. Root without the
binaries: the test fails naming the package, so CI never silently skips it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BINARIES = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client",
            "srun": "slurm-client", "scontrol": "slurm-client", "squeue": "slurm-client", "scancel": "slurm-client"}
KILL_WAIT_S = 30  # slurm.conf KillWait: SIGTERM to a cancelled job's processes, SIGKILL this long after
READY_TIMEOUT_S = 60.0


def require_slurm() -> None:
    """Skip without root; fail as root when a binary is missing (the package named)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (slurmd runs jobs as their user; the nodes are network namespaces)")
    missing = sorted({package for binary, package in BINARIES.items() if shutil.which(binary) is None})
    if missing:
        pytest.fail(f"running as root but {', '.join(missing)} is not installed: run .ci/setup (apt-get install "
                    "--no-install-recommends slurm-wlm munge); these tests must run where CI runs them")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    nodes: dict[str, str]                    # node name -> its address (NodeAddr)
    env: dict[str, str] = field(default_factory=dict)  # os.environ + SLURM_CONF: for sbatch, srun, scontrol
    munge: Path | None = None                # munged's key and socket (under /tmp: see slurm_cluster)
    namespaces: dict[str, str | None] = field(default_factory=dict)  # node name -> its netns (None: this one)
    daemons: list[subprocess.Popen] = field(default_factory=list)     # munged, slurmctld, then every slurmd

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o ID`` as key -> value (a heterogeneous job's first component)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout.splitlines()[0]
        return dict(re.findall(r"(\S+?)=(\S*)", out))

    def job_state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "?")

    def wait_job(self, job_id: str, timeout_s: float, states=("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL",
                                                                "TIMEOUT", "OUT_OF_MEMORY")) -> str:
        """The job's state once it is one of ``states`` (its end, by default); fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        pytest.fail(f"job {job_id} is still {self.job_state(job_id)} after {timeout_s:g} s (want {states})")

    def node_state(self, node: str) -> str:
        out = self.run("scontrol", "show", "node", "-o", node).stdout
        return dict(re.findall(r"(\S+?)=(\S*)", out)).get("State", "?")

    def down(self, node: str, reason: str = "test: node lost") -> None:
        """The node lost now (``scontrol update State=DOWN``: what slurmctld does ~25 s after a node dies)."""
        self.run("scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={reason}")

    def start_slurmd(self, node: str) -> None:
        argv = ["slurmd", "-D", "-N", node, "-f", str(self.conf)]
        ns = self.namespaces[node]
        if ns is not None:
            argv = ["nsenter", f"--net=/run/netns/{ns}", "--", "unshare", "--uts", "--", *argv]
        self.daemons.append(subprocess.Popen(argv, env=self.env, stdout=(self.root / f"slurmd-{node}.out").open("a"),
                                             stderr=subprocess.STDOUT))

    def lose(self, node: str) -> list[int]:
        """Node ``node`` lost: every process in its network namespace (its slurmd, the steps' slurmstepd, their
        tasks and every actor they started) SIGKILLed at once, as a power cut would, then the node marked DOWN
        (slurmctld would find it ~25 s later by itself). The pids killed."""
        ns = self.namespaces[node]
        assert ns is not None, "only a namespace node can be lost"
        inode = os.stat(f"/run/netns/{ns}").st_ino
        killed = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "ns" / "net") != f"net:[{inode}]":
                    continue
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except OSError:
                continue
        self.down(node)
        return killed

    def restore(self, node: str) -> None:
        """A lost node back: its slurmd started again; idle once it registers (ReturnToService=2)."""
        self.start_slurmd(node)
        self.wait_idle([node])

    def wait_idle(self, nodes: list[str] | None = None, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        nodes = nodes or list(self.nodes)
        while time.monotonic() < deadline:
            states = {node: self.node_state(node) for node in nodes}
            if all(state.split("+")[0] == "IDLE" for state in states.values()):
                return
            time.sleep(0.2)
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.root.glob("*.log")))
        pytest.fail(f"Slurm nodes not idle after {timeout_s:g} s: {states}\n{logs}")


def _conf(root: Path, munge: Path, nodes: dict[str, str], features: dict[str, str], controller: str, ports: tuple[int, int],
          cpus: int) -> str:
    lines = [
        "ClusterName=t1test",
        f"SlurmctldHost={socket.gethostname()}({controller})",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge / 'munge.socket.2'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root / 'ctld'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU_Memory",
        "ReturnToService=2",
        "MailProg=/bin/true",
        f"KillWait={KILL_WAIT_S}",
        "InactiveLimit=0",
        "MinJobAge=600",  # a finished job stays visible to scontrol show job for the test's checks
    ]
    for node, address in nodes.items():
        feature = f" Features={features[node]}" if features.get(node) else ""
        lines.append(f"NodeName={node} NodeAddr={address} CPUs={cpus} RealMemory=2000{feature} State=UNKNOWN")
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES")
    return "\n".join(lines) + "\n"


@contextmanager
def slurm_cluster(root: Path, *, hosts=None, features: dict[str, str] | None = None) -> Iterator[SlurmCluster]:
    """A running Slurm under ``root``: one node ``n1`` on loopback, or one node per namespace host of ``hosts``
    (``n1``.. in order); ``features``: node -> its comma-separated Slurm features."""
    require_slurm()
    root.mkdir(parents=True, exist_ok=True)
    namespaces: dict[str, str | None]
    if hosts is None:
        nodes, namespaces, controller = {"n1": "127.0.0.1"}, {"n1": None}, "127.0.0.1"
    else:
        nodes = {f"n{i + 1}": address for i, address in enumerate(hosts.address.values())}
        namespaces = {f"n{i + 1}": ns for i, ns in enumerate(hosts.namespace.values())}
        controller = hosts.gateway
    conf = root / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for var in [v for v in env if v.startswith("SLURM_") and v != "SLURM_CONF"]:
        env.pop(var)  # a test run inside a Slurm job must not aim this cluster's clients at its own job
    cluster = SlurmCluster(root=root, conf=conf, nodes=nodes, env=env, namespaces=namespaces)
    daemons = cluster.daemons
    try:
        # munged wants every directory above its socket searchable by all (pytest's tmp_path is 0700): its own
        munge = Path(tempfile.mkdtemp(prefix="t1-munge-"))
        os.chmod(munge, 0o711)
        cluster.munge = munge
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        daemons.append(subprocess.Popen(
            ["munged", "--foreground", f"--socket={munge / 'munge.socket.2'}", f"--key-file={key}",
             f"--pid-file={munge / 'munged.pid'}",
             f"--seed-file={munge / 'munged.seed'}"], env=env, stdout=(root / "munged.log").open("w"),
            stderr=subprocess.STDOUT))  # in the foreground munged logs to stderr
        _wait_for_path(munge / "munge.socket.2", daemons[-1], root / "munged.log")
        for sub in ("ctld", "spool"):
            (root / sub).mkdir()
        conf.write_text(_conf(root, munge, nodes, features or {}, controller, (_free_port(), _free_port()),
                              cpus=os.cpu_count() or 1))
        daemons.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env,
                                        stdout=(root / "slurmctld.out").open("w"), stderr=subprocess.STDOUT))
        for node in namespaces:
            cluster.start_slurmd(node)
        _wait_for_controller(cluster, daemons[1])
        cluster.wait_idle()
        yield cluster
    finally:
        _teardown(cluster, daemons)


def _wait_for_path(path: Path, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            text = log.read_text()[-2000:] if log.exists() else "(no log)"
            pytest.fail(f"{process.args[0]} did not make {path} (exit {process.poll()}): {text}")
        time.sleep(0.05)


def _wait_for_controller(cluster: SlurmCluster, slurmctld: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while cluster.run("scontrol", "ping", check=False).stdout.find("UP") < 0:
        if slurmctld.poll() is not None or time.monotonic() > deadline:
            log = cluster.root / "slurmctld.log"
            pytest.fail(f"slurmctld did not come up (exit {slurmctld.poll()}): "
                        f"{(log.read_text() if log.exists() else '')[-2000:]}")
        time.sleep(0.1)


def _teardown(cluster: SlurmCluster, daemons: list[subprocess.Popen]) -> None:
    if len(daemons) > 1 and daemons[1].poll() is None:  # slurmctld up: cancel every job, wait for their end
        cluster.run("scancel", "--user=root", check=False)
        deadline = time.monotonic() + KILL_WAIT_S + 15
        while time.monotonic() < deadline:
            if not cluster.run("squeue", "-h", check=False).stdout.strip():
                break
            time.sleep(0.5)
    for process in reversed(daemons):  # slurmd first, munged last
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in reversed(daemons):
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
    for pid in _processes_of(cluster.conf):  # a slurmstepd or a task that outlived its slurmd
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if cluster.munge is not None:
        shutil.rmtree(cluster.munge, ignore_errors=True)


def _processes_of(conf: Path) -> list[int]:
    """Processes whose environment names this cluster's slurm.conf: its daemons' children, nothing else."""
    return processes_with_env(f"SLURM_CONF={conf}")


def processes_with_env(entry: str) -> list[int]:
    """Processes (this one excepted) whose environment holds ``entry`` (``NAME=VALUE``) exactly."""
    marker = entry.encode()
    found = []
    for process in Path("/proc").iterdir():
        if not process.name.isdigit() or int(process.name) == os.getpid():
            continue
        try:
            if marker in (process / "environ").read_bytes().split(b"\0"):
                found.append(int(process.name))
        except OSError:
            continue
    return found
