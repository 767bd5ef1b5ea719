"""Routing capture and R3 replay."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures.models import tiny_model_config

from t1_actors.policy import MoEPolicy, r3_gate, topk_gate
from t1_actors.policy.routing import routing_from_numpy, routing_to_numpy

torch.set_num_threads(1)

CONFIG = tiny_model_config(vocab_size=64, num_layers=3)


def _model() -> MoEPolicy:
    torch.manual_seed(0)
    model = MoEPolicy(CONFIG).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 1.0)
    return model


def test_r3_gate_takes_selection_from_record_and_normalises_over_it():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    recorded = torch.tensor([[3, 1]])  # not the live top-2
    probs = torch.softmax(logits, -1)
    gates = r3_gate(logits, recorded, norm_topk_prob=True)
    torch.testing.assert_close(gates, probs[:, [3, 1]] / probs[:, [3, 1]].sum())
    torch.testing.assert_close(r3_gate(logits, recorded, norm_topk_prob=False), probs[:, [3, 1]])
    live_gates, live = topk_gate(logits, 2, True)
    assert live.tolist() == [[0, 1]] and torch.allclose(live_gates.sum(), torch.tensor(1.0))
    with pytest.raises(ValueError, match="expert ids outside"):
        r3_gate(logits, torch.tensor([[4, 0]]), True)


def test_replay_uses_recorded_experts_after_router_perturbation():
    model = _model()
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        record = model(ids, capture_routing=True).routing
        for layer in model.model.layers:  # the policy moved on: perturb every router
            layer.mlp.gate.weight.add_(torch.randn_like(layer.mlp.gate.weight))
        live = model(ids, capture_routing=True)
        replayed = model(ids, routing_replay=record)
    assert not torch.equal(live.routing, record), "perturbation should change the live routing"
    assert torch.equal(replayed.routing, record)
    assert not torch.allclose(replayed.logits, live.logits)

    # the gates used under replay are the live softmax renormalised over the recorded experts
    seen = []
    hook = model.model.layers[0].mlp.experts.register_forward_hook(lambda m, i, o: seen.append(i))
    with torch.no_grad():
        model(ids, routing_replay=record)
    hook.remove()
    x, experts, gates = seen[0]
    layer0 = model.model.layers[0].mlp
    assert torch.equal(experts.view(2, 24, -1), record[:, :, 0])
    probs = torch.softmax(layer0.gate(x), -1).gather(-1, experts)
    torch.testing.assert_close(gates, probs / probs.sum(-1, keepdim=True))
    torch.testing.assert_close(gates.sum(-1), torch.ones(len(gates)))


def test_replay_of_own_record_reproduces_logits_and_router_gets_gradient():
    model = _model()
    ids = torch.randint(0, 64, (1, 10))
    record = model(ids, capture_routing=True)
    replay = model(ids, routing_replay=record.routing)
    torch.testing.assert_close(replay.logits, record.logits)
    replay.logits.logsumexp(-1).sum().backward()
    assert all(layer.mlp.gate.weight.grad.abs().sum() > 0 for layer in model.model.layers)


def test_routing_record_is_one_byte_per_id():
    record = torch.tensor([[[1, 7], [0, 3]]])
    packed = routing_to_numpy(record, num_experts=8)
    assert packed.dtype == np.uint8 and packed.nbytes == 4
    assert torch.equal(routing_from_numpy(packed), record)


def test_replay_is_bit_exact_whatever_the_order_inside_each_set():
    """The log returns each selection sorted by expert id: R3 must not care (top-8: float sums of the
    gate normaliser would otherwise round differently per order)."""
    config = CONFIG.model_copy(update={"num_experts": 64, "top_k": 8})
    torch.manual_seed(0)
    model = MoEPolicy(config).eval()
    ids = torch.randint(0, CONFIG.vocab_size, (2, 64))
    with torch.no_grad():
        live = model(ids, capture_routing=True)
        by_id = model(ids, routing_replay=torch.sort(live.routing, dim=-1).values).logits
        shuffled = model(ids, routing_replay=live.routing[..., torch.randperm(8)]).logits
    assert torch.equal(by_id, live.logits) and torch.equal(shuffled, live.logits)
