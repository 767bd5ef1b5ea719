"""What a hostile command aims at, set up on the host: listeners that count the connections they accept (TCP on
127.0.0.1, a unix socket by path and an abstract one, an 'outside' address in a network namespace of our own) and
``Targets``, the record of every secret and address a case's command and goal are written against.

A listener's ``accepted`` only grows; ``reset_counts`` snapshots every listener's count before a run, so a case's
goal ("a connection was accepted") is judged on that run's connections alone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path


class Listener:
    """Counts connections accepted on a socket (TCP on 127.0.0.1, or a unix socket)."""

    def __init__(self, family: int, address):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(64)
        self.sock.settimeout(0.5)
        self.address = self.sock.getsockname()
        self.accepted = 0
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.thread.join(timeout=2)
        self.sock.close()


class OutsideHost:
    """An 'outside' address: a listener in a network namespace of our own, at the far end of a veth pair
    (10.253.N.2, the host's end 10.253.N.1). Reachable from the host's namespace, from nothing else."""

    def __init__(self, directory: Path):
        tag = os.getpid() % 100000
        self.netns, self.leg = f"t1hostile{tag}", f"t1h{tag}"
        subnet = tag % 250
        self.address, self.port = f"10.253.{subnet}.2", 18123
        self.log = directory / "outside-accepts"
        self.log.write_text("")
        self.proc = None
        steps = [["ip", "netns", "add", self.netns],
                 ["ip", "link", "add", self.leg + "h", "type", "veth", "peer", "name", self.leg + "n"],
                 ["ip", "link", "set", self.leg + "n", "netns", self.netns],
                 ["ip", "addr", "add", f"10.253.{subnet}.1/30", "dev", self.leg + "h"],
                 ["ip", "link", "set", self.leg + "h", "up"],
                 ["ip", "-n", self.netns, "addr", "add", f"{self.address}/30", "dev", self.leg + "n"],
                 ["ip", "-n", self.netns, "link", "set", self.leg + "n", "up"],
                 ["ip", "-n", self.netns, "link", "set", "lo", "up"]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                self.close()
                raise OSError(f"{' '.join(step)}: {done.stderr.strip()}")
        server = (f"import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                  f"s.bind(({self.address!r}, {self.port})); s.listen(16); print('up', flush=True)\n"
                  f"while True:\n    c, _ = s.accept(); open({str(self.log)!r}, 'a').write('x'); c.close()\n")
        self.proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{self.netns}", "--", sys.executable, "-c", server],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if self.proc.stdout.readline().strip() != b"up":
            self.close()
            raise OSError("the listener in the outside namespace did not start")

    @property
    def accepted(self) -> int:
        return len(self.log.read_text())

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        subprocess.run(["ip", "link", "del", self.leg + "h"], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


@dataclass
class Targets:
    """What the attacker aims at, set up on the host by the suite."""

    host: Path  # a host scratch directory (the controls' $W live under it)
    key: str  # the run's message key: in this process's environment, a host process's, a key file
    key_file: Path
    marker_token: str
    marker_pid: int
    pristine_file: Path
    pristine_token: str
    bystander_token: str
    bystander_file: Path  # the bystander trial's secret, by its host path (in its upper layer)
    trials_dir: Path
    loopback: Listener
    unix_path: Listener
    unix_abstract: Listener
    outside: OutsideHost | None
    root_device: tuple[int, int]
    host_accounts: list[str]  # the host's accounts that a base image lacks (its users, its services')
    host_shadow: list[str]  # lines of the host's /etc/shadow that the sandbox's own (locked base accounts) lacks
    var_secret_token: str  # in a file planted under the host's /var/lib for the run
    counts: dict[str, int] = field(default_factory=dict)  # listener accepts before the current run



def reset_counts(t: Targets) -> None:
    t.counts = {id(x): x.accepted for x in (t.loopback, t.unix_path, t.unix_abstract, t.outside) if x is not None}
