"""Data parallel across hosts: two learner ranks in two network namespaces (tests/_netns.py), joined by
torch.distributed's gloo over tcp between them, train STEPS PPO steps on the same batches. Both ranks must
hold bit-identical policy and critic weights afterwards (the all-reduced gradients are the same bytes on
each rank, and so are the updates), and each within 1e-5 of one process training on whole batches (the
sum runs in another order, so the last bits differ). Root only (skipped otherwise; as root without ``ip``
it fails): CI runs it."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _learner_data import TINY, sample_trajectories, tiny_policy
from _netns import namespace_hosts

from t1_actors.backends.torch_learner import TorchCritic, TorchLearner, collate, data_parallel_group, shard
from t1_actors.train.ppo import PPOConfig

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(600)]

CFG = PPOConfig(max_grad_norm=1e6)
STEPS = 4
TESTS = Path(__file__).resolve().parent
PORT = 29517


def _batches():
    policy = tiny_policy()
    return [collate(sample_trajectories(policy, 6, seed=11 + step), None, num_layers=TINY.num_layers,
                    top_k=TINY.top_k) for step in range(STEPS)]


def train(rank: int | None, world: int, out: str) -> None:
    """STEPS learner steps on this rank's shards (``rank=None``: one process, whole batches); weights saved."""
    torch.set_num_threads(1)
    policy = tiny_policy()
    learner = TorchLearner(policy, CFG, critic=TorchCritic.for_policy(policy, CFG))
    for batch in _batches():
        learner.step(batch if rank is None else shard(batch))
    torch.save({"policy": {k: v.clone() for k, v in policy.state_dict().items()},
                "critic": {k: v.clone() for k, v in learner.critic.model.state_dict().items()}}, out)


def rank_main(rank: int, world: int, master: str, out: str) -> None:
    """One rank on one host: the process group over tcp to rank 0's host, then ``train``."""
    with data_parallel_group("gloo", init_method=f"tcp://{master}:{PORT}", rank=rank, world_size=world,
                             timeout=datetime.timedelta(seconds=120)):
        train(rank, world, out)


def _max_abs(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def test_two_learner_ranks_on_two_hosts_agree_bitwise_and_match_one_process(tmp_path):
    with namespace_hosts(["learner-a", "learner-b"], subnet=242) as hosts:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
        procs = []
        for rank, host in enumerate(("learner-a", "learner-b")):
            code = (f"import test_learner_dp_netns as m; m.rank_main({rank}, 2, {hosts.address['learner-a']!r}, "
                    f"{str(tmp_path / f'rank{rank}.pt')!r})")
            procs.append(subprocess.Popen(hosts.exec(host, [sys.executable, "-c", code]),
                                          env={**env, "GLOO_SOCKET_IFNAME": hosts.interface[host]},
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [proc.communicate(timeout=500)[0] for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)

    train(None, 1, str(tmp_path / "single.pt"))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    single = torch.load(tmp_path / "single.pt")
    figures = {}
    for part in ("policy", "critic"):
        for key, value in ranks[0][part].items():
            assert torch.equal(value, ranks[1][part][key]), f"{part} {key}: the ranks diverged"
        assert _max_abs(ranks[0][part], ranks[1][part]) == 0.0
        figures[part] = _max_abs(ranks[0][part], single[part])
        assert figures[part] <= 1e-5, (part, figures[part])
        assert _max_abs(ranks[0][part], _initial(part)) > 1e-4  # the steps did move the weights
    print(json.dumps({"dp_netns_steps": STEPS, "max_abs_dw_vs_one_process": figures}))


def _initial(part: str) -> dict:
    policy = tiny_policy()
    if part == "policy":
        return policy.state_dict()
    return TorchCritic.for_policy(policy, CFG).model.state_dict()
