"""`t1-actor ablate` below the campaign: the arm parser, the refusal list, the plan, the decision rule and the
report writer on constructed runs (t1_actors.job.ablate, t1_actors.job.ablation). The end-to-end smoke test of
the command is in tests/test_campaign.py (it starts from the session's quick campaign)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import CriticWarmup, LearnerStep, TrialIssued, VerifierResult
from storage import EventLog
from t1_actors.job.ablate import (
    Arm,
    ArmError,
    PlannedRun,
    check_key,
    check_plan,
    parse_arm,
    parse_arms,
    plan_ablation,
    plays_own_sft_passes,
    refusal,
)
from t1_actors.job.ablation import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, compare_arms, decision_rule, write_ablation
from t1_actors.runtime.config import read_config_data
from t1_actors.schedule import CampaignConfig
from t1_actors.stats import Outcome, mcnemar_exact_p

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


# ----------------------------------------------------------------------------------------------- the parser

def test_an_arm_is_a_name_and_toml_values_a_bare_word_being_a_string():
    assert parse_arm("dense:") == Arm("dense", ())
    assert parse_arm("binary:verifier.reward=binary").settings == (("verifier.reward", "binary"),)
    arm = parse_arm("tis: ppo.off_policy_correction=truncate; ppo.old_logprobs=recompute;")
    assert arm.settings == (("ppo.off_policy_correction", "truncate"), ("ppo.old_logprobs", "recompute"))
    arm = parse_arm('x:ppo.actor_lr=1e-4;learner.replay=false;campaign.tito_repairs=["retokenized", "normalized"];'
                    'staleness.max_staleness=4;run.id="a;b"')
    assert dict(arm.settings) == {"ppo.actor_lr": 1e-4, "learner.replay": False, "staleness.max_staleness": 4,
                                  "campaign.tito_repairs": ["retokenized", "normalized"], "run.id": "a;b"}
    assert arm.describe().startswith("ppo.actor_lr = 0.0001; learner.replay = false")
    assert Arm("dense").describe() == "(the config as it is)"


_WORDS = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda w: w not in ("true", "false", "inf", "nan"))
_VALUES = st.one_of(st.integers(-10**6, 10**6), st.booleans(), _WORDS,
                    st.floats(allow_nan=False, allow_infinity=False, width=32).filter(lambda f: f == f),
                    st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters='"\\'), max_size=12))


@given(st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,6}\.[a-z][a-z_]{0,8}", fullmatch=True), _VALUES, max_size=5))
def test_the_parser_reads_back_any_settings_written_as_toml(settings):
    def toml(value):
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return value if value and value[0].isalpha() and value.isidentifier() and value.islower() \
                and value not in ("true", "false", "inf", "nan") else json.dumps(value)
        return repr(value)

    text = "arm:" + ";".join(f"{key}={toml(value)}" for key, value in settings.items())
    assert dict(parse_arm(text).settings) == settings


@pytest.mark.parametrize(("text", "says"), [
    ("dense", "no ':'"),
    ("bad name!:ppo.actor_lr=1", "the name 'bad name!'"),
    ("base:ppo.actor_lr=1", "not base"),
    ("x:ppo.actor_lr", "write KEY=VALUE"),
    ("x:ppo.actor_lr=", "write KEY=VALUE"),
    ("x:actor_lr=1", "must be section.key"),
    ("x:PPO.actor_lr=1", "must be section.key"),
    ("x:ppo.actor_lr=1;ppo.actor_lr=2", "set twice"),
    ("x:ppo.actor_lr=[1,", "neither a TOML value nor a bare word"),
    ("x:ppo.actor_lr=a b", "neither a TOML value nor a bare word"),
])
def test_bad_arm_syntax_names_the_arm_and_the_fix(text, says):
    with pytest.raises(ArmError, match="--arm") as error:
        parse_arm(text)
    assert says in str(error.value)


def test_the_arms_are_at_least_two_with_names_and_settings_of_their_own():
    assert [a.name for a in parse_arms(["dense:", "binary:verifier.reward=binary"])] == ["dense", "binary"]
    with pytest.raises(ArmError, match="at least two arms"):
        parse_arms(["dense:"])
    with pytest.raises(ArmError, match="--arm a: the name is given twice"):
        parse_arms(["a:", "a:verifier.reward=binary"])
    with pytest.raises(ArmError, match="--arm b: the same settings as arm a"):
        parse_arms(["a:ppo.actor_lr=1e-4", "b: ppo.actor_lr = 0.0001"])


# ------------------------------------------------------------------------------------------ the refusals

@pytest.mark.parametrize("key", ["tasks.train_size", "tasks.seed", "model.hidden_size", "eval.temperatures",
                                 "eval.sft_passes", "eval.probe_every", "campaign.seed", "campaign.warm_start_from",
                                 "campaign.tokenizer", "campaign.tokenizer_vocab", "campaign.sft_steps",
                                 "campaign.sft_lr", "campaign.sft_length_buckets", "run.dir", "storage.url",
                                 "actors.name"])
def test_keys_of_the_sft_phase_the_tasks_and_the_eval_protocol_are_refused_naming_the_key(key):
    with pytest.raises(ArmError, match=f"--arm a: {key} is refused: ") as error:
        check_key("a", key)
    assert "set it in the config itself" in str(error.value)


def test_every_sft_key_of_campaign_is_refused_and_every_rl_key_allowed():
    for key in CampaignConfig.model_fields:
        sft_phase = key.startswith("sft_") or key in ("seed", "tokenizer", "tokenizer_vocab", "warm_start_from")
        assert (refusal("campaign", key) is not None) == sft_phase, key


@pytest.mark.parametrize(("key", "own"), [
    ("verifier.reward", False), ("ppo.off_policy_correction", False), ("ppo.old_logprobs", False),
    ("staleness.max_staleness", False), ("staleness.group_size", False), ("ppo.advantage_estimator", False),
    ("campaign.warmup_trials", False), ("critic.warmup_trajectories", False), ("learner.replay", False),
    ("campaign.tito_repairs", False), ("campaign.rl_steps", False),
    ("campaign.context_strategy", True), ("campaign.max_context", True), ("campaign.max_turns", True),
    ("campaign.keep_last_turns", True), ("campaign.max_total_new_tokens", True), ("sampler.temperature", True),
    ("sampler.backend", True), ("sandbox.local.pids_max", True), ("verifier.memory_mb", True),
])
def test_allowed_keys_and_which_make_the_arm_play_its_own_sft_passes(key, own):
    check_key("a", key)
    section, name = key.split(".")[:2]
    assert plays_own_sft_passes(section, name) is own


@pytest.mark.parametrize(("key", "says"), [
    ("ppo.old_logprob", "[ppo] has no key 'old_logprob' (did you mean old_logprobs"),
    ("nosuch.key", "the config has no key 'nosuch'"),
    ("sandbox.local", "is a table; set its keys one by one"),
    ("sandbox.local.nope", "[sandbox.local] has no key 'nope'"),
])
def test_an_unknown_key_is_named_with_a_suggestion(key, says):
    with pytest.raises(ArmError, match="--arm a: ") as error:
        check_key("a", key)
    assert says in str(error.value)


# ----------------------------------------------------------------------------------------------- the plan

def _raw():
    return read_config_data(TINY, quick=True)


def test_a_value_the_config_refuses_names_the_arm_the_key_and_the_fix(tmp_path):
    with pytest.raises(ArmError) as error:
        plan_ablation(_raw(), parse_arms(["a:", "tis:ppo.off_policy_correction=truncate"]), seeds=1, out=tmp_path,
                      base=None)
    text = str(error.value)
    assert "--arm tis" in text and "off_policy_correction" in text and 'old_logprobs = "recompute"' in text
    with pytest.raises(ArmError, match=r"--arm short: .*max_turns"):
        plan_ablation(_raw(), parse_arms(["a:", "short:campaign.max_turns=0"]), seeds=1, out=tmp_path, base=None)
    with pytest.raises(ArmError, match="--arm x: tasks.train_size is refused"):
        plan_ablation(_raw(), parse_arms(["a:", "x:tasks.train_size=10"]), seeds=1, out=tmp_path, base=None)
    assert not any(tmp_path.iterdir()), "nothing may be written before every arm is sound"


def test_every_arm_starts_from_one_sft_policy_and_an_arm_that_plays_trials_otherwise_plays_its_own_sft_passes(
        tmp_path):
    arms = parse_arms(["dense:", "binary:verifier.reward=binary", "window:campaign.context_strategy=window"])
    base, runs = plan_ablation(_raw(), arms, seeds=2, out=tmp_path, base=None)
    assert base == tmp_path / "dense" / "seed0"  # the config as it is, trained here first: the base
    assert [(r.arm, r.seed) for r in runs] == [("dense", 0), ("binary", 0), ("window", 0), ("dense", 1),
                                               ("binary", 1), ("window", 1)]
    by = {(r.arm, r.seed): r for r in runs}
    assert by[("dense", 0)].config.campaign.warm_start_from is None and by[("dense", 0)].sft_passes == "played"
    for arm, seed in [("dense", 1), ("binary", 0), ("binary", 1)]:
        config = by[(arm, seed)].config
        assert config.campaign.warm_start_from == str(base) and config.eval.sft_passes == "warm_start"
        assert config.campaign.seed == seed and Path(config.run.dir) == tmp_path / arm / f"seed{seed}"
    assert by[("binary", 1)].config.verifier.reward == "binary" and by[("dense", 1)].config.verifier.reward == "dense"
    window0, window1 = by[("window", 0)], by[("window", 1)]
    assert window0.config.campaign.warm_start_from == str(base) and window0.config.eval.sft_passes == "run"
    assert window0.sft_passes == "played" and window0.config.campaign.context_strategy == "window"
    assert window1.config.campaign.warm_start_from == str(tmp_path / "window" / "seed0")
    assert window1.config.eval.sft_passes == "warm_start" and window1.sft_passes == str(tmp_path / "window" / "seed0")
    # no arm is the config as it is: the base is a run of its own
    base, runs = plan_ablation(_raw(), arms[1:], seeds=1, out=tmp_path, base=None)
    assert base == tmp_path / "base" and (runs[0].arm, runs[0].run_dir) == (None, base)


def test_each_run_of_an_ablation_on_an_object_store_has_a_log_prefix_of_its_own(tmp_path):
    raw = {**_raw(), "storage": {"url": "s3://bucket/abl"}}
    _, runs = plan_ablation(raw, parse_arms(["dense:", "binary:verifier.reward=binary"]), seeds=2, out=tmp_path,
                            base=None)
    assert [r.config.storage.url for r in runs] == [f"s3://bucket/abl/{arm}/seed{seed}" for seed in (0, 1)
                                                    for arm in ("dense", "binary")]


def test_a_base_must_be_finished_and_an_unfinished_run_is_refused_before_anything_runs(tmp_path):
    arms = parse_arms(["dense:", "binary:verifier.reward=binary"])
    with pytest.raises(ArmError, match="--base .*no summary.json"):
        plan_ablation(_raw(), arms, seeds=1, out=tmp_path / "d", base=tmp_path / "nowhere")
    (tmp_path / "d" / "binary" / "seed0" / "log").mkdir(parents=True)
    with pytest.raises(ArmError, match="unfinished runs .*binary/seed0"):
        plan_ablation(_raw(), arms, seeds=1, out=tmp_path / "d", base=None)


def test_a_rerun_may_add_arms_but_not_change_one(tmp_path):
    arms = parse_arms(["dense:", "binary:verifier.reward=binary"])
    plan = check_plan(tmp_path, arms, tmp_path / "base", quick=True)
    (tmp_path / "ablation.plan.json").write_text(json.dumps(plan))
    check_plan(tmp_path, [*arms, parse_arm("cold:campaign.warmup_trials=0")], tmp_path / "base", quick=True)
    with pytest.raises(ArmError, match="--arm binary: .* holds this arm with settings"):
        check_plan(tmp_path, parse_arms(["dense:", "binary:ppo.actor_lr=1e-4"]), tmp_path / "base", quick=True)
    with pytest.raises(ArmError, match="use another --run-dir"):
        check_plan(tmp_path, arms, tmp_path / "other", quick=True)


# ------------------------------------------------------------------------------------------ the decision rule

def test_the_decision_rule_on_known_cases():
    assert decision_rule(12, 2, (0.02, 0.12)) == REPRODUCED  # p = 0.013, the first arm ahead
    assert decision_rule(2, 12, (-0.12, -0.02)) == NOT_REPRODUCED  # significant the other way
    assert decision_rule(5, 4, (-0.015, 0.019)) == NOT_REPRODUCED  # the CI within +-2 points: no difference
    assert decision_rule(5, 4, (-0.03, 0.05)) == INCONCLUSIVE
    assert decision_rule(0, 0, (0.0, 0.0)) == NOT_REPRODUCED  # no discordant pair, no width: nothing to claim


@given(st.integers(0, 300), st.integers(0, 300), st.floats(-1, 1), st.floats(0, 1))
def test_the_decision_rule_follows_its_statement(first_only, arm_only, centre, half):
    ci = (centre - half, centre + half)
    verdict = decision_rule(first_only, arm_only, ci)
    p = mcnemar_exact_p(first_only, arm_only)
    assert (verdict == REPRODUCED) == (p < 0.05 and first_only > arm_only)
    if verdict != REPRODUCED:
        within = -0.02 <= ci[0] and ci[1] <= 0.02
        assert (verdict == NOT_REPRODUCED) == ((p < 0.05 and arm_only > first_only) or within)
    # the claim reversed is never reproduced both ways
    assert not (verdict == REPRODUCED and decision_rule(arm_only, first_only, (-ci[1], -ci[0])) == REPRODUCED)


def test_two_arms_compared_over_pairs():
    pairs = [(Outcome(True, 0.5), Outcome(False, 0.1)), (Outcome(True, 0.4), Outcome(True, 0.4)),
             (Outcome(False, 0.0), Outcome(True, 0.3)), (Outcome(True, 0.2), Outcome(False, 0.2))]
    c = compare_arms(pairs)
    assert (c["pairs"], c["first_resolved"], c["arm_resolved"], c["first_only"], c["arm_only"]) == (4, 3, 2, 2, 1)
    assert c["resolved_diff"] == pytest.approx(0.25) and c["reward_diff"] == pytest.approx(0.1 / 4)
    assert c["resolved_diff_ci95"][0] < 0.25 < c["resolved_diff_ci95"][1]
    assert compare_arms([]) == {"pairs": 0}


# ---------------------------------------------------------------------------------------- the report writer

def _summary(rate_sft: float, rate_rl: float, gained: int, lost: int, label: str = "rl_best") -> dict:
    return {"code": {"commit": "abcdef1234", "dirty": False}, "sft_passes_from": "B",
            "eval_sft_best": {"temperature": 0.5, "resolved_rate": rate_sft},
            "eval_rl_best": {"temperature": 1.0, "resolved_rate": rate_rl, "label": label},
            "eval_change_vs_sft_best": {"tasks": 4, "gained": gained, "lost": lost, "mcnemar_p": 0.5,
                                        "reward_delta": 0.01, "reward_delta_ci95": [-0.1, 0.12]},
            "turns": {"before_rl": {"mean": 2.5}, "after_rl": {"mean": 3.25}},
            "tokens": {"before_rl": {"mean": 180.4}, "after_rl": {"mean": 201.0}},
            "finishes": {"train": {"answered": 5, "context": 3}}, "context_edits": {"train": {"window": 7}},
            "eval_change_vs_sft_best_long": {"resolved_before": 1, "resolved_after": 2, "tasks": 2, "gained": 1,
                                             "lost": 0, "mcnemar_p": 1.0}}


def _constructed_run(run_dir: Path, resolved: list[bool], evs: list[float], r3: bool = True) -> None:
    """A run directory with a summary.json and a log: eval trials of the RL-best pass (task k resolved or not),
    learner steps with their explained variance and logprob gaps, a critic warm-up."""
    run_dir.mkdir(parents=True)
    log = EventLog.open(run_dir / "log", create=True)
    with log.writer("campaign") as w:
        w.append(CriticWarmup(epochs=1, trajectories=8, explained_variance_before=-3.0,
                              explained_variance_after=0.5))
        for k, ok in enumerate(resolved):
            w.append(TrialIssued(trial_id=f"e{k}", task_id=f"t{k}", split="eval", label="rl_best",
                                 policy_version_wanted=3))
            w.append(VerifierResult(trial_id=f"e{k}", task_id=f"t{k}", tests={"a": "passed", "b": "passed"},
                                    passed=2 if ok else 1, total=2, reward=1.0 if ok else 0.0, reward_scale=20,
                                    verifier_sha256="0" * 64, reward_kind="binary"))
        for step, ev in enumerate(evs):
            gap = "logprob_gap_r3" if r3 else "logprob_gap_no_r3"
            w.append(LearnerStep(step=step, policy_version=step + 1, trials=[],
                                 metrics={"explained_variance": ev, gap: 0.01 * (step + 1), "r3": float(r3),
                                          **({"logprob_gap_no_r3": 0.5} if r3 else {})}))
        w.commit()
    gained = sum(resolved)
    (run_dir / "summary.json").write_text(json.dumps(_summary(0.25, gained / len(resolved), gained, 0)))


def test_the_report_has_every_run_every_pair_and_the_verdict(tmp_path):
    out = tmp_path / "d"
    _constructed_run(out / "dense" / "seed0", [True, True, True, False], [-2.0, 0.3, 0.6])
    _constructed_run(out / "binary" / "seed0", [False, True, False, False], [float("nan"), -0.5, 0.2], r3=False)
    _constructed_run(out / "dense" / "seed1", [True, True, False, True], [0.4, 0.5])
    runs = [PlannedRun("dense", 0, out / "dense" / "seed0", None, "played"),
            PlannedRun("binary", 0, out / "binary" / "seed0", None, "B"),
            PlannedRun("dense", 1, out / "dense" / "seed1", None, "B"),
            PlannedRun("binary", 1, out / "binary" / "seed1", None, "B")]  # not run yet
    arms = [{"name": "dense", "settings": {}, "describe": "(the config as it is)", "sft_passes": "the base's (B)"},
            {"name": "binary", "settings": {"verifier.reward": "binary"}, "describe": 'verifier.reward = "binary"',
             "sft_passes": "the base's (B)"}]
    header = {"config": "c.toml", "quick": True, "seeds": 2, "base": "B", "base_trained_here": True}
    report = write_ablation(out, header, arms, runs)
    assert json.loads((out / "ablation.json").read_text()) == report
    rows = report["runs"]
    assert [(r["arm"], r["seed"]) for r in rows] == [("dense", 0), ("binary", 0), ("dense", 1), ("binary", 1)]
    dense0, binary0 = rows[0], rows[1]
    assert (dense0["ev_first"], dense0["ev_min"], dense0["ev_last"]) == (-2.0, -2.0, 0.6)
    assert dense0["critic_warmup_ev"] == [-3.0, 0.5] and dense0["learner_steps"] == 3
    assert dense0["logprob_gap"] == pytest.approx(0.02) and dense0["mean_logprob_gap_no_r3"] == 0.5
    assert binary0["logprob_gap"] == pytest.approx(0.02) and binary0["mean_logprob_gap_r3"] is None
    # a step whose returns had no variance (every reward 0) has no explained variance: null, not NaN
    assert (binary0["ev_first"], binary0["ev_min"], binary0["ev_last"], binary0["ev_undefined_steps"]) == \
        (None, -0.5, 0.2, 1)
    assert "NaN" not in (out / "ablation.json").read_text()
    assert dense0["code"]["commit"] == "abcdef1234" and dense0["gained"] == 3 and dense0["rl_best_label"] == "rl_best"
    assert "missing" in rows[3] and rows[3]["sft_passes"] == "B"
    [c] = report["comparisons"]
    assert (c["arm"], c["against"], c["seeds"]) == ("binary", "dense", [0])  # seed 1 has one arm only
    [s] = c["per_seed"]
    assert (s["pairs"], s["first_resolved"], s["arm_resolved"], s["first_only"], s["arm_only"]) == (4, 3, 1, 2, 0)
    # eval scores the dense reward: P / S of the binary-reward results, not their 0 / 1
    assert c["pooled"]["reward_diff"] == pytest.approx(2 / 4 / 20)
    assert c["verdict"] == INCONCLUSIVE and c["pooled"]["mcnemar_p"] == 0.5
    text = (out / "ablation.md").read_text()
    assert "| binary | 0 | 25.0% (0.5) | 25.0% (1) | 1 / 0 |" in text
    assert "-2.00 / -2.00 / +0.60 | -3.00 -> +0.50 | 0.0200 | abcdef1 |" in text
    assert "| binary | 1 | - |" in text and "| binary | 1 | 4 | 2 / 0 | 0.5 |" in text and INCONCLUSIVE in text
    # how each finished run played: turns and tokens before -> after RL, finishes, context edits, long tasks
    assert dense0["play"] == {"turns": [2.5, 3.25], "tokens": [180.4, 201.0],
                              "train_finishes": {"answered": 5, "context": 3}, "train_context_edits": {"window": 7},
                              "long_resolved": [1, 2, 2]}
    assert "| dense | 0 | 2.5 -> 3.2 | 180 -> 201 | answered 5, context 3 | window 7 | 1 -> 2 of 2 |" in text
