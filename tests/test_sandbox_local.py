"""The local sandbox: containment, limits, Dockerfile replay into a private copy-on-write root."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from t1_actors.backends._sandbox import cgroups
from t1_actors.backends.local_sandbox import (
    LocalSandboxBackend,
    LocalSandboxConfig,
    SandboxBuildError,
    SandboxInfraError,
    locate_trial,
)
from t1_actors.tasks.model import Environment, FileSpec, Limits, Task
from t1_actors.tasks.model import Tests as TaskTests

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or cgroups.available() is not None,
                                reason="the local sandbox needs root and cgroup v1 memory/pids")


def make_task(task_id: str = "t", **environment) -> Task:
    return Task(id=task_id, family="test", instruction="do it", tests=TaskTests(files={"test_x.py": "def test_x(): pass\n"}),
                environment=Environment(**environment),
                limits=Limits(command_timeout_s=10, memory_mb=256, max_output_bytes=4096, build_timeout_s=60))


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path_factory.mktemp("sandbox")), pids_max=64))
    yield backend
    backend.close()


@pytest.fixture
def sandbox(backend):
    with backend.open(make_task(files={"/app/in.txt": FileSpec(content="hello\n")}), "trial-a") as sandbox:
        yield sandbox


def test_exec_returns_exit_code_streams_and_duration(sandbox):
    result = sandbox.exec("cat in.txt; echo oops >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "hello\n", "oops\n")
    assert result.duration_s > 0 and not result.timed_out and not result.stdout_truncated


def test_state_persists_between_calls_and_starts_in_workdir(sandbox):
    sandbox.exec("echo 1 > made.txt && mkdir -p /opt/tool /data && echo x > /opt/tool/x")
    assert sandbox.exec("pwd; cat /app/made.txt /opt/tool/x").stdout == "/app\n1\nx\n"


def test_removing_the_workdir_is_the_agents_business_not_an_infra_error(backend):
    with backend.open(make_task("rmwd"), "rmwd") as sandbox:
        assert sandbox.exec("rm -rf /app").exit_code == 0
        assert sandbox.exec("pwd").stdout == "/\n"


def test_no_network_during_agent_turns(sandbox):
    result = sandbox.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"")
    assert result.exit_code != 0 and "unreachable" in result.stderr.lower()
    assert sandbox.exec("cat /proc/net/dev | grep -c ':'").stdout.strip() == "1"  # only lo


def test_writes_never_reach_the_host(sandbox, tmp_path):
    marker = f"t1-escape-{os.getpid()}"
    result = sandbox.exec(f"echo pwned > /etc/{marker}; echo pwned > /usr/local/bin/{marker}; "
                          f"echo pwned > /tmp/{marker}; echo pwned > /root/{marker}; echo pwned > /var/{marker}; "
                          f"rm -f /etc/hostname; ls /work /proc/1/root/work 2>&1 | head -2")
    assert result.exit_code == 0
    for directory in ("/etc", "/usr/local/bin", "/tmp", "/root", "/var"):
        assert not Path(directory, marker).exists(), f"a sandbox write reached the host's {directory}"
    assert Path("/etc/hostname").exists() or not Path("/etc/hostname").exists()  # host untouched either way
    assert "No such file" in result.stdout  # the host's /work is not in the sandbox at all
    assert sandbox.exec(f"cat /etc/{marker}").stdout == "pwned\n"  # ...but the trial sees its own write


def test_host_system_files_read_but_not_modifiable_through_symlinks(sandbox):
    sandbox.exec("ln -s /etc/passwd /app/link")
    sandbox.write_file("/app/link", b"trial-only\n")  # follows the link inside the trial root
    assert b"trial-only" not in Path("/etc/passwd").read_bytes()
    assert sandbox.read_file("/etc/passwd") == b"trial-only\n"


def test_infinite_loop_is_killed_at_the_timeout_and_sandbox_keeps_serving(sandbox):
    result = sandbox.exec("while :; do :; done", timeout_s=1)
    assert result.timed_out and result.killed_by == "timeout" and result.exit_code == 128 + 9
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_background_children_die_with_the_timeout(sandbox):
    result = sandbox.exec("(sleep 30 &) ; sleep 30 & sleep 60", timeout_s=1)
    assert result.timed_out
    assert sandbox.exec("ps -e -o comm= | grep -c sleep || true").stdout.strip() == "0"


def test_fork_bomb_is_contained(sandbox):
    result = sandbox.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout_s=4)
    assert result.killed_by in ("pids", "timeout")
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_memory_hog_is_killed_by_the_memory_cap(sandbox):
    result = sandbox.exec("python3 -c \"x = bytearray(1 << 30); print('allocated')\"", timeout_s=10)
    assert result.exit_code != 0 and "allocated" not in result.stdout
    assert result.killed_by == "memory" or "MemoryError" in result.stderr
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_hundred_megabytes_of_output_are_truncated_with_a_flag(sandbox):
    result = sandbox.exec("head -c 100000000 /dev/zero | tr '\\0' a; echo done >&2", timeout_s=20)
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout_truncated and len(result.stdout) == 4096 and not result.stderr_truncated
    assert result.stderr == "done\n"


def test_file_size_cap(tmp_path):
    small = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path / "small"), file_size_mb=4))
    try:
        with small.open(make_task("fsize"), "trial-fsize") as sandbox:
            result = sandbox.exec(f"head -c {10 << 20} /dev/zero > /tmp/big", timeout_s=20)
            assert result.exit_code != 0 and result.killed_by == "file_size"
            assert sandbox.exec("stat -c %s /tmp/big").stdout.strip() == str(4 << 20)
    finally:
        small.close()


def test_no_capabilities_to_escape(sandbox):
    result = sandbox.exec("mount -t tmpfs none /mnt 2>&1; mknod /tmp/disk b 254 0 2>&1; echo $?")
    assert "permission denied" in result.stdout.lower() or "not permitted" in result.stdout.lower()
    assert result.stdout.strip().endswith("1")


def test_trials_are_isolated_from_each_other(backend):
    task = make_task("iso")
    with backend.open(task, "one") as one, backend.open(task, "two") as two:
        one.exec("echo mine > /app/secret")
        assert two.exec("cat /app/secret").exit_code != 0


def test_a_trial_id_open_twice_on_one_base_dir_is_never_located(backend, tmp_path):
    """Two runs sharing a base dir that issue one trial id (they did: run tags from the clock's second) must not
    have either root scored as the other's: the verifier's lookup refuses, as an infrastructure error."""
    task = make_task("twice")
    with backend.open(task, "same-id") as first:
        assert locate_trial(backend.base, "same-id").upper.root() == first.trial_root.upper.root()
        second = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(backend.base), pids_max=64))
        with second.open(task, "same-id"), pytest.raises(SandboxInfraError, match="not unique"):
            locate_trial(backend.base, "same-id")
        second.close()


def test_close_removes_the_root_and_later_calls_are_infra_errors(backend):
    sandbox = backend.open(make_task("close"), "closing")
    sandbox.exec("echo x > /app/x")
    directory = sandbox.directory
    sandbox.close()
    backend.wait_torn_down()
    assert not directory.exists()
    with pytest.raises(SandboxInfraError):
        sandbox.exec("true")


def test_concurrent_trials(backend):
    task = make_task("conc")
    errors = []

    def trial(i: int) -> None:
        try:
            with backend.open(task, f"c{i}") as sandbox:
                for j in range(3):
                    assert sandbox.exec(f"echo {i}-{j} >> /app/log; wc -l < /app/log").stdout.strip() == str(j + 1)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=trial, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


DOCKERFILE = r"""# syntax=docker/dockerfile:1
FROM ghcr.io/laude-institute/t-bench/python-3-13:20250620
ARG GREETING=hello
ENV APP_HOME=/app \
    LEVEL="two words"
WORKDIR /app
COPY data/*.csv /data/
COPY tool.sh /usr/local/bin/tool
COPY <<EOT /etc/myapp.conf
greeting=${GREETING}
EOT
RUN mkdir -p /opt/build /protected && \
    echo "$GREETING $LEVEL" > /opt/build/out.txt && \
    chmod 700 /protected
RUN <<EOF
echo heredoc-ran > /app/heredoc.txt
EOF
WORKDIR sub
RUN pwd > /app/where.txt
USER nobody
CMD ["bash"]
"""


def test_dockerfile_replay_builds_into_the_root_and_is_cached(backend, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.csv").write_text("a\n")
    (tmp_path / "data" / "b.csv").write_text("b\n")
    (tmp_path / "data" / "skip.txt").write_text("no\n")
    (tmp_path / "tool.sh").write_text("#!/bin/sh\necho tool-ok\n")
    os.chmod(tmp_path / "tool.sh", 0o755)
    task = make_task("docker", dockerfile=DOCKERFILE, context_dir=str(tmp_path), workdir="/app")
    with backend.open(task, "d1") as sandbox:
        assert not sandbox.build.cached
        assert any("USER nobody" in item for item in sandbox.build.unhonoured)
        assert any("CMD" in item for item in sandbox.build.unhonoured)
        assert any(item.startswith("FROM ghcr.io/laude-institute") for item in sandbox.build.unhonoured)
        out = sandbox.exec("ls /data; tool; cat /etc/myapp.conf /opt/build/out.txt /app/heredoc.txt /app/where.txt; "
                           "stat -c %a /protected; echo $APP_HOME $LEVEL").stdout
        assert out.split("\n") == ["a.csv", "b.csv", "tool-ok", "greeting=hello", "hello two words", "heredoc-ran",
                                   "/app/sub", "700", "/app two words", ""]
    assert not Path("/opt/build").exists() and not Path("/protected").exists()
    with backend.open(task, "d2") as sandbox:
        assert sandbox.build.cached
        assert sandbox.exec("cat /opt/build/out.txt").stdout == "hello two words\n"


def test_failing_build_step_is_an_infra_error_naming_the_line(backend):
    task = make_task("broken", dockerfile="FROM ubuntu:24.04\nRUN echo about to fail && false\n")
    with pytest.raises(SandboxBuildError, match="line 2"):
        backend.open(task, "b1")


def test_setup_commands_and_files_are_laid_before_the_first_turn(backend):
    task = make_task("setup", files={"/srv/in.txt": FileSpec(content="x", mode=0o600)},
                     setup=["cp /srv/in.txt /srv/copy.txt"], env={"MY_VAR": "42"})
    with backend.open(task, "s1") as sandbox:
        assert sandbox.exec("stat -c %a /srv/in.txt; cat /srv/copy.txt; echo; echo $MY_VAR").stdout == "600\nx\n42\n"


def test_stale_trials_of_a_dead_owner_are_swept(backend):
    sandbox = backend.open(make_task("stale"), "stale")
    (sandbox.directory / "owner").write_text("999999999")  # no such process
    assert backend.sweep_stale() >= 1
    assert not sandbox.directory.exists()


def test_copy_into_an_existing_directory_copies_into_it_as_docker_does(backend, tmp_path):
    # a t-bench image's WORKDIR /app exists before the first step: `COPY f /app` is /app/f, not a file /app
    (tmp_path / "notes.txt").write_text("n\n")
    task = make_task("copy-into", dockerfile="FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\n"
                                             "COPY notes.txt /app\n", context_dir=str(tmp_path), workdir="/app")
    with backend.open(task, "c1") as sandbox:
        assert sandbox.exec("cat /app/notes.txt").stdout == "n\n"
        assert any(item.startswith("profile t-bench: WORKDIR /app") for item in sandbox.build.unhonoured)


def test_a_python_image_profile_gives_python_and_a_system_wide_pip_in_the_trials_layer_only(backend, tmp_path):
    task = make_task("py-profile", dockerfile="FROM python:3.13-slim\nRUN python -c 'print(1)' > /srv/ran.txt\n",
                     workdir="/srv")
    with backend.open(task, "p1") as sandbox:
        out = sandbox.exec("cat /srv/ran.txt; python -c 'import sys; print(sys.version_info[0])'; "
                           "pip --version | cut -c1-4; echo $PIP_BREAK_SYSTEM_PACKAGES").stdout
        assert out.split("\n") == ["1", "3", "pip ", "1", ""]
        assert any("python -> the host's python3" in item for item in sandbox.build.unhonoured)
    assert not Path("/usr/local/bin/python").exists() or Path("/usr/local/bin/python").read_bytes() != \
        b"#!/bin/sh\nexec python3 \"$@\"\n", "the shim must stay in the task's layer"
    plain = make_task("no-profile", dockerfile="FROM alpine:3.20\nRUN true\n")  # not one the host can stand in for
    with backend.open(plain, "p2") as sandbox:
        assert not any(item.startswith("profile") for item in sandbox.build.unhonoured)


def test_apt_get_install_of_what_the_host_has_is_satisfied_by_it_whatever_the_pin(backend):
    # a pinned version the host does not hold (Docker: an install; here: a downgrade or "not found"), and a
    # package name whose command the host provides from another package (awk, from mawk: "virtual package"
    # to apt; npm from a NodeSource nodejs is the same case): both stand in, with no network, and say so
    task = make_task("apt-standin", dockerfile="FROM python:3.12-slim\nRUN apt-get install -y --no-install-recommends "
                                               "mawk=0.0-not-a-version awk && awk 'BEGIN{print 7}' > /srv/ok.txt\n",
                     workdir="/srv")
    with backend.open(task, "apt1") as sandbox:
        assert sandbox.exec("cat /srv/ok.txt").stdout == "7\n"
        text = "\n".join(sandbox.build.unhonoured)
        assert "apt-get install mawk=0.0-not-a-version: the host's mawk" in text
        assert "apt-get install awk: the host's /usr/bin/awk (from mawk)" in text
        assert sandbox.exec("/usr/bin/apt-get install -y mawk=0.0-not-a-version").exit_code != 0  # the real tool
    assert not Path("/usr/local/sbin/apt-get").exists(), "the wrapper stays in the task's layer"


def test_an_env_line_reading_path_keeps_the_images_default_path(backend):
    # ENV PATH="/root/.local/bin:${PATH}" reads the image's PATH (Docker's default), not an empty one
    task = make_task("env-path", dockerfile="FROM gcc:13.3.0-bookworm\nENV PATH=\"/root/.local/bin:${PATH}\"\n"
                                            "RUN cp /etc/hostname /srv/copied\n", workdir="/srv")
    with backend.open(task, "path1") as sandbox:
        assert sandbox.exec("test -f /srv/copied && echo $PATH").stdout.startswith("/root/.local/bin:/usr/local/sbin:")


def test_the_trial_sees_base_image_accounts_locked_shadow_and_a_fresh_var(sandbox):
    from t1_actors.backends._sandbox.hostview import VAR_KEPT, accounts
    passwd, _ = accounts()
    assert sandbox.exec("cat /etc/passwd").stdout == passwd
    shadow = sandbox.exec("cat /etc/shadow").stdout.splitlines()
    assert shadow and all(line.split(":")[1] == "*" for line in shadow)
    assert sandbox.exec("ls /etc/shadow- /etc/passwd- /etc/gshadow- 2>/dev/null | wc -l").stdout == "0\n"
    assert sandbox.exec("stat -c %a /var/tmp; find /var/tmp /var/log -mindepth 1 | wc -l").stdout == "1777\n0\n"
    kept = {k.split("/")[1] for k in VAR_KEPT if k.startswith("lib/")}
    assert set(sandbox.exec("ls /var/lib").stdout.split()) <= kept
    assert sandbox.exec("dpkg-query -W -f '${Status}' coreutils").stdout == "install ok installed"
    assert sandbox.exec("useradd -m agent && id -u agent && grep -c agent /etc/passwd").exit_code == 0
    # dpkg still installs (the host's statoverride lines naming the host's accounts would stop it): a local .deb
    package = ("mkdir -p /tmp/p/DEBIAN /tmp/p/usr/share/t1-probe && echo hi > /tmp/p/usr/share/t1-probe/x && "
               "printf 'Package: t1-probe\\nVersion: 1\\nArchitecture: all\\nMaintainer: t1\\nDescription: p\\n' "
               "> /tmp/p/DEBIAN/control && dpkg-deb --build /tmp/p /tmp/p.deb >/dev/null && dpkg -i /tmp/p.deb "
               ">/dev/null && dpkg-query -W -f '${Status}' t1-probe")
    result = sandbox.exec(package)
    assert result.stdout == "install ok installed", result


_SYSCALL_PROBE = r"""
import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    ret = libc.syscall(nr, *args)
    return "ok" if ret >= 0 else os.strerror(ctypes.get_errno())
out = {
    "clone3": call(435, None, 0),
    "x32_getpid": call(0x40000000 | 39),
    "io_uring_setup": call(425, 1, ctypes.create_string_buffer(120)),
    "personality_query": call(135, ctypes.c_ulong(0xFFFFFFFF)),
    "personality_no_aslr": call(135, ctypes.c_ulong(0x0040000)),
    "vsock": call(41, 40, 1, 0),
}
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = "ok" if os.waitpid(pid, 0)[1] >> 8 == 7 else "failed"
t = threading.Thread(target=lambda: None); t.start(); t.join()
out["thread"] = "ok"
for key, value in sorted(out.items()):
    print(key, value.replace(" ", "_"))
"""


def _probe(sandbox) -> dict[str, str]:
    sandbox.write_file("/tmp/probe.py", _SYSCALL_PROBE.encode())
    result = sandbox.exec("python3 /tmp/probe.py")
    assert result.exit_code == 0, result
    return dict(line.split() for line in result.stdout.splitlines())


def test_the_seccomp_filter_refuses_what_docker_refuses_and_lets_fork_threads_and_queries_through(sandbox, tmp_path):
    """clone3 answers ENOSYS (glibc falls back to clone), another architecture's call, io_uring, a personality
    without ASLR and AF_VSOCK are refused; fork, threads and the personality query work. Control: with
    ``seccomp = false`` each refused call is answered otherwise (by the kernel)."""
    seen = _probe(sandbox)
    assert seen == {"clone3": "Function_not_implemented", "x32_getpid": "Operation_not_permitted",
                    "io_uring_setup": "Operation_not_permitted", "personality_query": "ok",
                    "personality_no_aslr": "Operation_not_permitted", "vsock": "Operation_not_permitted",
                    "fork": "ok", "thread": "ok"}, seen
    unfiltered = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(tmp_path / "sb"), seccomp=False, disk_mb=0))
    try:
        with unfiltered.open(make_task(), "unfiltered") as trial:
            control = _probe(trial)
    finally:
        unfiltered.close()
    refused = [key for key, value in seen.items() if value != "ok"]
    assert refused and all(control[key] != seen[key] for key in refused), (seen, control)
