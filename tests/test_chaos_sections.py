"""t1-actor chaos's hostile-command and tampering sections: every case contained, every tamper flagged with P
unchanged, and every positive control succeeding (the same command unconfined, the same tamper against a naive
verifier), so that each zero is one the suite could have failed to report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _chaos import run_chaos_cli

from t1_actors.backends._sandbox import cgroups
from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig
from t1_actors.tasks.model import Limits, Task
from t1_actors.tasks.model import Tests as TaskTests
from tools.chaos._hostile import CASES, run_hostile
from tools.chaos._sections import SECTION_KEYS
from tools.chaos._tamper import HONEST_P, METHODS, TOTAL

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or cgroups.available() is not None,
                                reason="the sandbox sections need root and cgroup v1 memory/pids")


def test_a_trial_cannot_write_more_than_its_disk_and_its_neighbour_keeps_writing(tmp_path):
    task = Task(id="disk", family="test", instruction="x", tests=TaskTests(files={"test_x.py": "def test_x(): pass\n"}),
                limits=Limits(command_timeout_s=30))
    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path / "sb"), file_size_mb=8, disk_mb=16))
    try:
        with backend.open(task, "filler") as filler, backend.open(task, "neighbour") as neighbour:
            result = filler.exec("for i in $(seq 8); do head -c 4M /dev/zero > /tmp/f$i || exit 1; done")
            assert result.exit_code != 0 and result.killed_by == "disk", result
            assert "No space left on device" in result.stderr
            written = int(filler.exec("du -sm /tmp | cut -f1").stdout)
            assert 8 <= written <= 16, written  # it wrote up to its disk, no further
            assert neighbour.exec("head -c 4M /dev/zero > /tmp/mine && echo ok").stdout == "ok\n"
            image = filler.directory / "disk.img"
            assert image.stat().st_blocks * 512 < 24 << 20  # sparse: what it wrote, plus metadata
            directory = filler.directory
        backend.wait_torn_down()
        assert not directory.exists()
        assert str(directory) not in Path("/proc/mounts").read_text()
    finally:
        backend.close()


def test_without_its_own_disk_the_disk_fill_case_escapes(tmp_path):
    """The suite catches the escape that the per-trial disk closed (as before it existed): disk_mb = 0."""
    report = run_hostile(tmp_path, cases=["disk_fill"], disk_mb=0)
    case = report["sandbox_cases"]["disk_fill"]
    assert case["evidence"] and case["escaped"] and report["sandbox_escapes_succeeded"] == 1
    contained = run_hostile(tmp_path / "again", cases=["disk_fill"])
    assert contained["sandbox_escapes_succeeded"] == 0 and contained["sandbox_escapes_tried"] == 1
    assert contained["sandbox_cases"]["disk_fill"]["outcome"].startswith("refused: the trial's disk is full")


SECCOMP_CASES = ["nested_user_namespace", "mount_in_user_namespace", "keyring_add_key", "perf_event_open"]


def test_the_seccomp_filter_contains_what_it_alone_refuses_and_without_it_each_case_escapes(tmp_path):
    """Nested namespaces, a mount in one, the kernel keyring, perf: refused (EPERM) under the filter; the same
    command in a trial with [sandbox.local] seccomp = false reaches its goal (each case's control)."""
    contained = run_hostile(tmp_path / "on", cases=SECCOMP_CASES)
    assert contained["sandbox_escapes_succeeded"] == 0 and contained["sandbox_escapes_tried"] == len(SECCOMP_CASES)
    assert contained["sandbox_not_tested"] == []
    for name in SECCOMP_CASES:
        case = contained["sandbox_cases"][name]
        assert case["evidence"] and case["control"]["goal_reached"] and not case["escaped"], (name, case)
        assert case["outcome"] == "refused (EPERM)", (name, case)
    open_ = run_hostile(tmp_path / "off", cases=SECCOMP_CASES, seccomp=False)
    assert open_["sandbox_escapes_succeeded"] == len(SECCOMP_CASES), open_["sandbox_cases"]


HOSTVIEW_CASES = ["read_host_shadow", "list_host_accounts", "read_host_var"]


def test_the_host_accounts_shadow_and_var_are_not_in_a_trial_and_each_control_reads_them(tmp_path):
    """The host's /etc/shadow lines, its own accounts, a secret planted under its /var/lib: not visible in a trial
    (the mask layer); the same command on the host reads each (the host has accounts a base image lacks)."""
    report = run_hostile(tmp_path, cases=HOSTVIEW_CASES)
    assert report["sandbox_escapes_succeeded"] == 0 and report["sandbox_not_tested"] == [], report["sandbox_cases"]
    assert report["sandbox_positive_controls"] == {"tried": 3, "succeeded": 3}
    for name in HOSTVIEW_CASES:
        case = report["sandbox_cases"][name]
        assert case["control"]["goal_reached"] and not case["sandbox"]["goal_reached"], (name, case)
    assert not list(Path("/var/lib").glob("t1-hostile-*"))  # the planted secret is removed


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    return run_hostile(tmp_path_factory.mktemp("hostile"))


@pytest.mark.slow
def test_every_hostile_command_is_contained_and_its_control_escapes(hostile):
    cases = hostile["sandbox_cases"]
    assert set(cases) == {case.name for case in CASES}  # network_outside included: its namespace was made
    assert hostile["sandbox_escapes_succeeded"] == 0, {n: c for n, c in cases.items() if c["escaped"]}
    assert hostile["sandbox_escapes_tried"] == len(CASES) > 0
    assert hostile["sandbox_positive_controls"] == {"tried": len(CASES), "succeeded": len(CASES)}
    assert hostile["sandbox_not_tested"] == []
    for name, case in cases.items():
        assert case["control"]["goal_reached"] and not case["sandbox"]["goal_reached"], name
        assert case["bystander_ok"] and case["attacker_serving"], name
    assert cases["fork_bomb"]["sandbox"]["killed_by"] == "pids"
    assert cases["memory_hog"]["sandbox"]["killed_by"] == "memory"
    assert cases["cpu_spin"]["sandbox"]["killed_by"] == "timeout"
    flood = cases["output_flood"]
    assert flood["sandbox"]["truncated"] and flood["sandbox"]["stdout_bytes"] == 64 << 10
    assert flood["control"]["stdout_bytes"] == 1_000_000_000
    assert cases["disk_fill"]["outcome"] == "refused: the trial's disk is full (ENOSPC)"
    for name in ("network_outside", "network_host_loopback", "network_host_unix_abstract", "mount",
                 "unshare_mount_namespace", "mknod_host_disk", *SECCOMP_CASES):
        assert cases[name]["outcome"].startswith("refused"), (name, cases[name])
    for name in ("read_key_proc_environ", "see_host_processes", "see_other_trial", "see_pristine_tests",
                 "ptrace_host_process", "symlink_read_out", "network_host_unix_path", *HOSTVIEW_CASES):
        assert cases[name]["outcome"].startswith("not visible"), (name, cases[name])
    assert "test_path_written:/tests" in cases["symlink_tests_dir"]["sandbox"]["note"]  # verified, and flagged


@pytest.fixture(scope="module")
def tamper_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tamper") / "run"
    code, report = run_chaos_cli("--only", "tamper", "--run-dir", str(run_dir), timeout=600)
    return code, report, run_dir


@pytest.mark.slow
def test_every_tamper_is_flagged_p_unchanged_and_fools_the_naive_verifier(tamper_run):
    code, report, run_dir = tamper_run
    methods = report["tamper_methods"]
    assert set(methods) == {m.name for m in METHODS}
    assert report["tamper_undetected"] == 0, {n: m for n, m in methods.items() if m["undetected"]}
    assert report["tamper_tried"] == len(METHODS) > 0
    assert report["positive_controls"] == {"tried": len(METHODS), "succeeded": len(METHODS)}
    expected_p = {m.name: m.expected_p for m in METHODS}
    assert {n for n, p in expected_p.items() if p == 0} == {  # forged in pytest's process: outcomes discarded
        "forged_report_factory", "forged_runner", "forged_makereport_hook", "rewritten_reports"}
    for name, method in methods.items():
        assert method["flagged"] and not method["p_moved"] and method["evidence"], (name, method)
        assert method["real"]["passed"] == expected_p[name] and method["real"]["total"] == TOTAL, (name, method)
        assert method["naive"]["passed"] > HONEST_P or method["naive"]["reward"] == 1.0, (name, method)
    baseline = report["tamper_baseline"]  # the verifiers score an honest agent as they should
    assert baseline["real_honest"]["passed"] == baseline["naive_honest"]["passed"] == 2
    assert baseline["real_noop"]["passed"] == baseline["naive_noop"]["passed"] == 1
    assert code == 0
    untested = {item["key"] for item in report["not_tested"]}
    assert {"campaign", *SECTION_KEYS["sandbox"]} <= untested  # not selected: named, never a figure
    assert not set(SECTION_KEYS["sandbox"]) & set(report)
    assert json.loads((run_dir / "chaos.json").read_text()) == report


_CLIENT = """
import json, sys, threading, time
from t1_actors.backends.local_sandbox import TrialRoot
from t1_actors.tasks.model import Task
from t1_actors.verify.engine import Verifier, VerifierConfig
task = Task.model_validate_json(sys.argv[1])
verifier = Verifier(VerifierConfig(base_dir=sys.argv[3]))
for trial in json.loads(sys.argv[2]):
    threading.Thread(target=verifier.verify, args=(task, TrialRoot.from_json(trial)), daemon=True).start()
while verifier._server is None:
    time.sleep(0.05)
print(verifier._server.proc.pid, flush=True)
time.sleep(600)
"""


def test_a_verify_server_whose_client_is_killed_mid_verification_leaves_no_cgroup(tmp_path):
    """Found by the chaos campaign (a verifier killed with verifications in flight left their cgroups): the
    server's first reply into the dead client's pipe raised BrokenPipeError and it exited before the jobs
    still running were reaped. Now it kills and reaps them, and removes every cgroup."""
    task = Task(id="slow", family="test", instruction="x", limits=Limits(verifier_timeout_s=60),
                tests=TaskTests(files={"test_s.py": "import time\n\ndef test_s():\n    time.sleep(4)\n"}))
    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path / "sb")))
    trials = [backend.open(task, f"slow-{i}") for i in range(3)]
    client = subprocess.Popen([sys.executable, "-c", _CLIENT, task.model_dump_json(),
                               json.dumps([t.trial_root.to_json() for t in trials]), str(tmp_path / "verifier")],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        server = int(client.stdout.readline())

        def cgroups_of_server() -> list[str]:
            return [p.name for controller in ("memory", "pids", "unified")
                    if (cgroups.ROOT / controller / "t1-sandbox").is_dir()
                    for p in (cgroups.ROOT / controller / "t1-sandbox").iterdir()
                    if p.name.startswith(f"verify-{server}-")]

        deadline = time.monotonic() + 60
        while len({name for name in cgroups_of_server()}) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(set(cgroups_of_server())) == 3  # three verifications in flight
        client.kill()
        client.wait()
        while Path(f"/proc/{server}").exists() and time.monotonic() < deadline + 60:
            time.sleep(0.1)
        assert not Path(f"/proc/{server}").exists(), "the verify server outlived its client by a minute"
        assert cgroups_of_server() == []
    finally:
        if client.poll() is None:
            client.kill()
        for trial in trials:
            trial.close()
        backend.close()
