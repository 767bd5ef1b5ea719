"""t1-audit capacity: Proposition 7.1's per-device memory model."""

from __future__ import annotations

import json

import pytest

from t1_actors.policy.config import ModelConfig
from tools._audit import capacity_plan as cap
from tools.audit import main


def test_paper_shape_reproduces_published_totals():
    counts = cap.count_params(cap.PAPER_MODEL)
    assert round(counts.total / 1e9, 1) == 121.4
    assert round(counts.expert / 1e9, 1) == 116.0
    assert cap.PAPER_MODEL.num_layers == 48 and cap.PAPER_MODEL.num_experts == 256 and cap.PAPER_MODEL.top_k == 8


def test_expert_count_is_layers_experts_three_matrices():
    config = ModelConfig()
    counts = cap.count_params(config)
    assert counts.expert == config.num_layers * config.num_experts * 3 * config.hidden_size * config.moe_intermediate_size


def test_tiny_count_matches_the_real_policy():
    from t1_actors.policy.model import MoEPolicy

    config = ModelConfig()
    policy = MoEPolicy(config)
    real = sum(p.numel() for p in policy.parameters())
    assert cap.count_params(config).total == real


@pytest.mark.parametrize("devices", [8, 64, 96])
def test_expert_optimizer_state_depends_only_on_device_count(devices):
    actor = cap.from_totals(cap.PAPER_TOTAL_PARAMS, cap.PAPER_EXPERT_PARAMS)
    by_plan = cap.expert_optimizer_by_plan(actor, devices, critic=actor)
    assert len(by_plan) > 5
    expected = 2 * cap.PAPER_EXPERT_PARAMS * 12 / devices / cap.GIB
    for label, gib in by_plan.items():
        assert gib == pytest.approx(expected, rel=1e-12), label


def test_without_distributed_optimizer_expert_state_depends_on_the_plan():
    actor = cap.from_totals(cap.PAPER_TOTAL_PARAMS, cap.PAPER_EXPERT_PARAMS)
    values = set(round(v, 6) for v in cap.expert_optimizer_by_plan(actor, 64, distributed_optimizer=False).values())
    assert len(values) > 1
    # ...and equals X b_o / G exactly when experts are sharded over every device (EDP = 1)
    plan = cap.ParallelPlan(devices=64, tp=2, pp=2, ep=32, distributed_optimizer=False)
    assert plan.edp == 1
    got = cap.capacity(actor, plan).actor.expert_optimizer
    assert got == pytest.approx(cap.PAPER_EXPERT_PARAMS * 12 / 64)


def test_dense_state_scales_with_tensor_and_pipeline_parallel():
    actor = cap.ParamCounts(dense=1000, expert=0)
    nbytes = cap.ByteAssumptions(weight=2, grad=4, master=4, moments=8)
    one = cap.capacity(actor, cap.ParallelPlan(devices=8, tp=1, pp=1), nbytes=nbytes).actor
    four = cap.capacity(actor, cap.ParallelPlan(devices=8, tp=2, pp=2), nbytes=nbytes).actor
    assert one.dense_weights == 2000 and one.dense_grads == 4000 and one.dense_optimizer == 12000 / 8
    assert four.dense_weights == 500 and four.dense_optimizer == 12000 / 8


def test_invalid_plan_named():
    with pytest.raises(ValueError, match="TP x PP"):
        cap.ParallelPlan(devices=6, tp=4)
    with pytest.raises(ValueError, match="EP x ETP"):
        cap.ParallelPlan(devices=8, tp=1, pp=2, ep=8)
    with pytest.raises(ValueError, match="expert parameters"):
        cap.from_totals(1.0, 2.0)


def test_cli_json(capsys):
    assert main(["capacity", "--devices", "64", "--tp", "2", "--ep", "32", "--device-memory-gib", "141", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["expert_optimizer_only_depends_on_G"] is True
    assert round(out["actor_params"]["total"] / 1e9, 1) == 121.4
    assert out["per_device_gib"]["total"]["expert_optimizer"] == pytest.approx(out["expert_optimizer_gib_formula"])
    assert out["plan"]["dp"] == 32 and out["fits"] in (True, False)


def test_cli_totals_and_table(capsys):
    assert main(["capacity", "--total-params", "121.4e9", "--expert-params", "116e9", "--devices", "128"]) == 0
    text = capsys.readouterr().out
    assert "expert optimizer" in text and "depends only on G: True" in text


def test_cli_bad_plan_is_a_clear_error(capsys):
    assert main(["capacity", "--devices", "6", "--tp", "4"]) == 2
    assert "TP x PP" in capsys.readouterr().err


def test_cli_reads_a_saved_policy_config(tmp_path, capsys, tiny_model):
    import torch

    from t1_actors.policy.model import MoEPolicy

    torch.set_num_threads(1)
    config = tiny_model(wide=True, vocab_size=1024, num_layers=3, moe_intermediate_size=48)
    policy = MoEPolicy(config)
    policy.save(tmp_path / "v0")
    assert main(["capacity", "--model", str(tmp_path / "v0" / "config.json"), "--devices", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["actor_params"]["total"] == policy.num_parameters()
