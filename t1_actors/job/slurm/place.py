"""Run by the Slurm job on its first node, before any step: which allocated node plays which config host.

    python -m t1_actors.job.slurm.place --config RUN/slurm/config.toml [--quick] --run-dir RUN --out DIR \
        HOST=COMPONENT ...

The job's nodes come from Slurm (``SLURM_JOB_NODELIST``, or ``SLURM_JOB_NODELIST_HET_GROUP_K`` per component of a
heterogeneous job, expanded by ``scontrol show hostnames``); each component's hosts take its nodes in order, and
each node's address is its ``NodeAddr`` (``scontrol show node``). Written to ``DIR``:

- ``config.toml``: the config (``--quick`` applied, ``[run] dir`` set) with ``[supervisor] address`` and every
  actor's address ``tcp://NODEADDR:PORT`` on its host's node (ports from ``[slurm] port``); a one-host config
  keeps its ``ipc://`` sockets. Validated before it is written.
- ``nodes.sh``: ``NODE[host]=node`` lines the script sources; ``placement.json``: per host its node, address,
  component and actors.

A component with another number of nodes than hosts (an sbatch option overriding ``--nodes``) is refused, naming
both, and the job ends before any step starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomli_w

from t1_actors.job.config import parse_config
from t1_actors.runtime.config import ConfigError, read_config_data


class PlacementError(RuntimeError):
    """The allocation does not fit the config's hosts."""


def expand(nodelist: str) -> list[str]:
    """A Slurm node list (``n[1-3],gpu7``) as node names, by ``scontrol show hostnames``."""
    done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise PlacementError(f"scontrol show hostnames {nodelist}: {done.stderr.strip()}")
    return done.stdout.split()


def node_addresses(nodes: list[str]) -> dict[str, str]:
    """Each node's ``NodeAddr`` (the address its slurmd is reached at, which its actors listen on)."""
    done = subprocess.run(["scontrol", "show", "node", "-o", ",".join(nodes)], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise PlacementError(f"scontrol show node {','.join(nodes)}: {done.stderr.strip()}")
    found = {}
    for line in done.stdout.splitlines():
        fields = dict(re.findall(r"(\S+?)=(\S*)", line))
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return {node: found.get(node, node) for node in nodes}


def allocated_nodes(components: int, env: dict[str, str]) -> list[list[str]]:
    """The job's nodes per component, from the environment Slurm gives the batch script."""
    if components == 1:
        return [expand(env["SLURM_JOB_NODELIST"])]
    out = []
    for k in range(components):
        listed = env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{k}")
        if listed is None:
            raise PlacementError(f"no SLURM_JOB_NODELIST_HET_GROUP_{k}: this job is not the heterogeneous job of "
                                 f"{components} components the script was written for")
        out.append(expand(listed))
    return out


def assign(groups: dict[str, int], nodes: list[list[str]]) -> dict[str, str]:
    """host -> node: each component's hosts take its nodes in order."""
    placed: dict[str, str] = {}
    for k, component_nodes in enumerate(nodes):
        hosts = [h for h, g in groups.items() if g == k]
        if len(hosts) != len(component_nodes):
            raise PlacementError(f"component {k} has {len(component_nodes)} node(s) ({','.join(component_nodes)}) "
                                 f"for {len(hosts)} host(s) ({', '.join(hosts)}); one node per host: do not override "
                                 "--nodes")
        placed.update(zip(hosts, component_nodes))
    return placed


def placed_config(data: dict[str, Any], hosts: dict[str, str], addresses: dict[str, str], port: int) -> dict[str, Any]:
    """``data`` with the supervisor and every actor on its host's node (``tcp://ADDRESS:PORT``); unchanged for one
    host (its ``ipc://`` sockets). ``hosts``: host -> node, ``addresses``: node -> address."""
    if len(hosts) < 2:
        return data
    data = dict(data)
    actors = [dict(spec) for spec in data.get("actors", [])]
    for i, spec in enumerate(actors):
        address = addresses[hosts[spec.get("host", "localhost")]]
        spec["address"] = f"tcp://{address}:{port + 2 + 2 * i}"
        spec.pop("bulk_address", None)  # port + 1
    data["actors"] = actors
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t1_actors.job.slurm.place", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("hosts", nargs="+", metavar="HOST=COMPONENT")
    args = parser.parse_args(argv)
    groups = {h: int(k) for h, _, k in (item.rpartition("=") for item in args.hosts)}
    try:
        data = read_config_data(args.config, quick=args.quick, run_dir=Path(args.run_dir).resolve())
        config = parse_config(data, args.config)
        nodes = allocated_nodes(max(groups.values()) + 1, dict(os.environ))
        hosts = assign(groups, nodes)
        addresses = node_addresses(list(hosts.values()))
        data = placed_config(data, hosts, addresses, config.slurm.port)
        if len(hosts) > 1:
            control = next(iter(groups))  # the script lists the control host first
            data["supervisor"] = {**data.get("supervisor", {}),
                                  "address": f"tcp://{addresses[hosts[control]]}:{config.slurm.port}"}
        placed = parse_config(data, f"{args.config} (placed)")
    except (PlacementError, ConfigError, KeyError) as error:
        print(f"t1-slurm: placement failed: {error}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config_file = out / "config.toml"
    config_file.touch(mode=0o600)
    config_file.write_text(tomli_w.dumps(data))
    (out / "nodes.sh").write_text("".join(f"NODE[{shlex.quote(h)}]={shlex.quote(n)}\n" for h, n in hosts.items()))
    placement = {h: {"node": n, "address": addresses[n], "component": groups[h],
                     "actors": [s.name for s in placed.actors if s.host == h]} for h, n in hosts.items()}
    (out / "placement.json").write_text(json.dumps(placement, indent=2))
    for host, where in placement.items():
        print(f"t1-slurm: host {host} -> node {where['node']} ({where['address']}): {', '.join(where['actors'])}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
