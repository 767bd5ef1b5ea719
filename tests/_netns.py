"""Hosts for tests: network namespaces on one bridge (ip netns + veth + a Linux bridge), as on a cluster's LAN.

``namespace_hosts(names)`` makes one namespace per name, each with one veth leg on a bridge in the root
namespace; the bridge holds the gateway address (where a test's S3 server listens: reachable from every
host, and from nothing outside this machine). ``hosts.cut(name)`` / ``hosts.mend(name)`` take a host's link
down and up (``ip link set ... down``): every path between that host and the others, the gateway included,
is gone until mended.

Needs root and iproute2. Not root: the test is skipped (it cannot make namespaces). Root without ``ip``,
or ``ip netns`` refused: the test fails, so CI (which runs as root) never silently skips these tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        pytest.fail(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def require_netns() -> None:
    """Skip without root; fail as root when namespaces cannot be made (the reason named)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (ip netns add)")
    if shutil.which("nsenter") is None:
        pytest.fail("running as root but util-linux `nsenter` is not installed: install it (apt-get install "
                    "util-linux); these tests must run where CI runs them")
    if shutil.which("ip") is None:
        pytest.fail("running as root but iproute2 `ip` is not installed: install it (apt-get install iproute2); "
                    "these tests must run where CI runs them")
    probe = f"t1probe{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        pytest.fail(f"running as root but `ip netns add` is refused: {made.stderr.strip()}")
    ip("netns", "del", probe, check=False)


@dataclass
class Hosts:
    gateway: str                                     # the bridge's address (root namespace)
    address: dict[str, str] = field(default_factory=dict)    # host name -> its address
    namespace: dict[str, str] = field(default_factory=dict)  # host name -> its netns
    link: dict[str, str] = field(default_factory=dict)       # host name -> its veth leg on the bridge
    interface: dict[str, str] = field(default_factory=dict)  # host name -> its own interface (inside its netns)

    def exec(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``name``'s network namespace, with this machine's mounts: nsenter, not
        ``ip netns exec`` (which remounts /sys, and so hides the cgroup hierarchy the sandboxes need)."""
        return ["nsenter", f"--net=/run/netns/{self.namespace[name]}", "--", *argv]

    def cut(self, name: str) -> None:
        ip("link", "set", self.link[name], "down")

    def mend(self, name: str) -> None:
        ip("link", "set", self.link[name], "up")


@contextmanager
def namespace_hosts(names: list[str], subnet: int):
    """Hosts ``names`` at 10.``subnet``.0.(11, 12, ...) on a bridge at 10.``subnet``.0.1; removed after."""
    require_netns()
    tag = f"{os.getpid() % 10000}{subnet % 100}"
    bridge = f"t1br{tag}"
    hosts = Hosts(gateway=f"10.{subnet}.0.1")
    made_bridge = False
    try:
        ip("link", "add", bridge, "type", "bridge")
        made_bridge = True
        ip("addr", "add", f"{hosts.gateway}/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        for i, name in enumerate(names):
            ns, leg, inner = f"t1{tag}h{i}", f"t1{tag}v{i}", f"t1{tag}i{i}"
            address = f"10.{subnet}.0.{11 + i}"
            ip("netns", "add", ns)
            hosts.namespace[name] = ns
            ip("link", "add", leg, "type", "veth", "peer", "name", inner)
            hosts.link[name] = leg
            ip("link", "set", inner, "netns", ns)
            ip("link", "set", leg, "master", bridge)
            ip("link", "set", leg, "up")
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
            ip("-n", ns, "link", "set", inner, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            hosts.address[name] = address
            hosts.interface[name] = inner
        yield hosts
    finally:
        for ns in hosts.namespace.values():
            ip("netns", "del", ns, check=False)  # takes its veth pair with it
        if made_bridge:
            ip("link", "del", bridge, check=False)
