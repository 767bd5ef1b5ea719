"""Data parallel across hosts: two learner ranks in two network namespaces (tests/_netns.py), joined by
torch.distributed's gloo over tcp between them, train STEPS PPO steps on the same batches. Both ranks must
hold bit-identical policy and critic weights afterwards (the all-reduced gradients are the same bytes on
each rank, and so are the updates), and each within 1e-5 of one process training on whole batches (the
sum runs in another order, so the last bits differ). Root only (skipped otherwise; as root without ``ip``
it fails): CI runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from _learner_data import tiny_policy
from _netns import namespace_hosts
from fixtures.campaign import TESTS
from fixtures.dp_ranks import CFG, STEPS, train

from t1_actors.backends.torch_learner import TorchCritic

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(600)]

def _max_abs(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def test_two_learner_ranks_on_two_hosts_agree_bitwise_and_match_one_process(tmp_path):
    with namespace_hosts(["learner-a", "learner-b"], subnet=242) as hosts:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
        procs = []
        for rank, host in enumerate(("learner-a", "learner-b")):
            code = (f"from fixtures.dp_ranks import rank_main; rank_main({rank}, 2, {hosts.address['learner-a']!r}, "
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
