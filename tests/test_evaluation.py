"""The skill-vs-sharpening eval protocol (t1_actors.eval.protocol) on real engines in one process, and its
statistics (pass@k, per-position rates) and summary keys (t1_actors.eval.skills)."""

from __future__ import annotations

import json
import math

import pytest
from fixtures.trials import play_in_world
from hypothesis import given
from hypothesis import strategies as st

from schemas import EvalResult, TrialIssued, VerifierResult
from t1_actors.eval.protocol import EvalConfig, best_temperature, evaluate_policy, pass_k_subset
from t1_actors.eval.skills import EvalPasses, skill_report
from t1_actors.stats import Attempt, part_of, pass_at_k, pass_at_k_curve, per_position_rates


def _result(resolved, n, reward=0.0, label="x", temperature=None):
    return EvalResult(label=label, policy_version=0, n=n, resolved=resolved, mean_reward=reward, ci_low=0.0,
                      ci_high=1.0, temperature=temperature)


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(16, 0, 4) == 0.0 and pass_at_k(16, 16, 1) == 1.0
    assert pass_at_k(16, 4, 1) == pytest.approx(4 / 16)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


@given(st.integers(1, 20).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_rises_with_k(nc):
    n, c = nc
    curve = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(b >= a - 1e-12 for a, b in zip(curve, curve[1:]))
    assert curve[0] == pytest.approx(c / n)


def test_pass_at_k_curve_and_positions():
    attempts = [Attempt("a", s, s < 2, 0.1, {}) for s in range(4)] + [Attempt("b", s, False, 0.0, {}) for s in range(4)]
    curve = pass_at_k_curve(attempts)
    assert list(curve) == [1, 2, 3, 4] and curve[1] == pytest.approx(0.25) and curve[4] == pytest.approx(0.5)
    assert part_of("test_outputs.py::test_p2_first_line") == 2 and part_of("test_outputs.py::test_first") is None
    tests = {"t.py::test_p1_a": "passed", "t.py::test_p1_b": "passed", "t.py::test_p2_a": "failed"}
    assert per_position_rates([Attempt("c", 0, False, 0.1, tests)]) == {1: 1.0, 2: 0.0}


def test_best_temperature_prefers_resolved_then_reward_then_the_run_temperature():
    grid = {0.5: _result(8, 10, 0.3), 1.0: _result(6, 10, 0.4), 0.25: _result(8, 10, 0.2)}
    assert best_temperature(grid, 1.0) == 0.5
    tie = {0.5: _result(8, 10, 0.3), 1.0: _result(8, 10, 0.3)}
    assert best_temperature(tie, 1.0) == 1.0
    with pytest.raises(ValueError, match="temperatures"):
        EvalConfig(temperatures=[0.5, 0.5])


def test_pass_k_subset_takes_the_long_families_then_the_skill_kinds_first():
    class T:
        def __init__(self, i, family):
            self.id, self.family = i, family
    tasks = [T("s1", "head_tail"), T("c1", "composite3"), T("s2", "cleanup"), T("c2", "recovery_seen")]
    assert pass_k_subset(tasks, 3) == ["c1", "c2", "s1"]
    tasks += [T("l1", "explore"), T("l2", "chain")]
    assert pass_k_subset(tasks, 4) == ["l1", "l2", "c1", "c2"]


def test_the_protocol_runs_each_pass_once_with_labels_and_common_random_numbers(trial_world):
    config = EvalConfig(temperatures=[0.25, 1.0], pass_k_tasks=2, pass_k_samples=3)

    async def body(ports, runner, tasks):
        ids = [t.id for t in tasks]
        done: dict = {}
        best = await evaluate_policy(runner, "sft", validation_ids=ids[:4], eval_ids=ids[4:8], pass_k_ids=ids[8:10],
                                     config=config, run_temperature=1.0, concurrency=4, done=done)
        before = len(ports.events)
        again = await evaluate_policy(runner, "sft", validation_ids=ids[:4], eval_ids=ids[4:8],
                                      pass_k_ids=ids[8:10], config=config, run_temperature=1.0, concurrency=4,
                                      done=done)
        return ports, best, again, before

    ports, best, again, before = play_in_world(trial_world, body)
    assert best == again and len(ports.events) == before  # a pass already done is never run again
    results = {e.label: e for e in ports.events if isinstance(e, EvalResult)}
    expected = {"sft_val_T0.25", "sft_val_T1", "before", "sft_passk"} | ({"sft_best"} if best != 1.0 else set())
    assert set(results) == expected
    assert [name for name, e in results.items() if e.last] == ["sft_passk"]
    assert results["sft_passk"].n == 6 and results["sft_passk"].samples == 3
    issued = [e for e in ports.events if isinstance(e, TrialIssued)]
    assert {e.label for e in issued} == expected
    assert sorted(e.sample for e in issued if e.label == "sft_passk") == [0, 0, 1, 1, 2, 2]
    assert {e.temperature for e in issued if e.label == "sft_val_T0.25"} == {0.25}


class _Log:
    def __init__(self, events):
        self._events = events

    def events(self, kinds):
        return [(i, e) for i, e in enumerate(self._events) if e.kind in kinds]


def _pass(label, temperature, outcomes, samples=1, last=False):
    """Trials of one pass (task -> resolved list by sample) and its EvalResult."""
    events = []
    for task, by_sample in outcomes.items():
        for sample, ok in enumerate(by_sample):
            trial = f"{label}-{task}-{sample}"
            events.append(TrialIssued(trial_id=trial, task_id=task, split="eval", label=label, sample=sample,
                                      temperature=temperature, policy_version_wanted=0))
            tests = {"t.py::test_p1_a": "passed", "t.py::test_p2_a": "passed" if ok else "failed"}
            events.append(VerifierResult(trial_id=trial, task_id=task, tests=tests, passed=1 + ok, total=2,
                                         reward=(1 + ok) / 20, reward_scale=20, verifier_sha256="0" * 64))
    n = sum(len(v) for v in outcomes.values())
    resolved = sum(sum(v) for v in outcomes.values())
    events.append(EvalResult(label=label, policy_version=0, n=n, resolved=resolved, mean_reward=0.0, ci_low=0,
                             ci_high=1, temperature=temperature, samples=samples, last=last, mean_turns=2.0))
    return events


def _protocol_events():
    tasks = [f"t{i}" for i in range(6)]
    sft = (_pass("sft_val_T0.5", 0.5, {t: [i < 3] for i, t in enumerate(tasks)})
           + _pass("sft_val_T1", 1.0, {t: [i < 2] for i, t in enumerate(tasks)})
           + _pass("before", None, {t: [i < 2] for i, t in enumerate(tasks)})
           + _pass("sft_best", 0.5, {t: [i < 3] for i, t in enumerate(tasks)})
           + _pass("sft_passk", 0.5, {t: [i < 3, False] for i, t in enumerate(tasks)}, samples=2, last=True))
    rl = (_pass("rl_val_T1", 1.0, {t: [i < 5] for i, t in enumerate(tasks)})
          + _pass("after", None, {t: [i < 5] for i, t in enumerate(tasks)})
          + _pass("rl_passk", 1.0, {t: [i < 5, i < 4] for i, t in enumerate(tasks)}, samples=2, last=True))
    return sft, rl


def test_sft_passes_read_from_the_warm_start_log_give_the_same_report():
    """[eval] sft_passes = 'warm_start': the SFT passes come from the other log, and only from there."""
    from t1_actors.job.summary import eval_change

    sft, rl = _protocol_events()
    recipe = {"advantage_estimator": "gae"}
    one_log = skill_report(EvalPasses.read(_Log(sft + rl)), run_temperature=1.0, recipe=recipe)
    # the RL run's own log holds a stray SFT pass (e.g. of another policy): it must not be read
    stray = _pass("sft_best", 0.5, {f"t{i}": [True] for i in range(6)})
    two_logs = skill_report(EvalPasses.read(_Log(stray + rl), _Log(sft + rl)), run_temperature=1.0, recipe=recipe)
    assert two_logs == one_log and one_log["eval_change_vs_sft_best"]["gained"] == 2
    assert eval_change(_Log(rl), _Log(sft)) == eval_change(_Log(sft + rl))
    assert eval_change(_Log(rl), _Log([])) is None  # no SFT pass there: nothing to pair, no version fallback


def test_skill_report_pairs_the_best_passes_and_fills_every_key():
    tasks = [f"t{i}" for i in range(6)]
    events = (_pass("sft_val_T0.5", 0.5, {t: [i < 3] for i, t in enumerate(tasks)})
              + _pass("sft_val_T1", 1.0, {t: [i < 2] for i, t in enumerate(tasks)})
              + _pass("before", None, {t: [i < 2] for i, t in enumerate(tasks)})
              + _pass("sft_best", 0.5, {t: [i < 3] for i, t in enumerate(tasks)})
              + _pass("sft_passk", 0.5, {t: [i < 3, False] for i, t in enumerate(tasks)}, samples=2, last=True)
              + _pass("rl_val_T1", 1.0, {t: [i < 5] for i, t in enumerate(tasks)})
              + _pass("after", None, {t: [i < 5] for i, t in enumerate(tasks)})
              + _pass("rl_passk", 1.0, {t: [i < 5, i < 4] for i, t in enumerate(tasks)}, samples=2, last=True))
    report = skill_report(EvalPasses.read(_Log(events)), run_temperature=1.0, recipe={"advantage_estimator": "gae"})
    assert report["eval_sft_best"]["temperature"] == 0.5 and report["eval_sft_best"]["label"] == "sft_best"
    assert report["eval_rl_best"]["temperature"] == 1.0 and report["eval_rl_best"]["label"] == "after"
    change = report["eval_change_vs_sft_best"]
    assert (change["gained"], change["lost"], change["tasks"]) == (2, 0, 6)
    assert report["temperature_grid"]["sft"] == {"0.5": 0.5, "1": pytest.approx(1 / 3)}
    assert report["pass_at_k"]["rl"][1] == pytest.approx(9 / 12) and set(report["pass_at_k"]["sft"]) == {1, 2}
    assert report["per_position"]["rl"] == {1: 1.0, 2: pytest.approx(5 / 6)}
    assert report["turns"]["sft"] == {"before": 2.0, "sft_best": 2.0}
    assert report["eval_change_vs_sft_best_long"] is None  # no task of a long family


def test_skill_report_pairs_the_long_tasks_alone():
    """``eval_change_vs_sft_best_long``: the same pairing over the long families' eval tasks (ids
    ``chain-...``, ``pipeline-...``, ``explore-...``); a short task's flip does not count there."""
    tasks = ["chain-a1", "pipeline-b2", "explore-c3", "head_tail-d4", "recovery_seen-e5"]
    sft_ok = {"chain-a1": True, "pipeline-b2": False, "explore-c3": True, "head_tail-d4": False,
              "recovery_seen-e5": False}
    rl_ok = {"chain-a1": True, "pipeline-b2": True, "explore-c3": False, "head_tail-d4": True,
             "recovery_seen-e5": True}
    events = (_pass("sft_best", 0.5, {t: [sft_ok[t]] for t in tasks})
              + _pass("rl_best", 0.5, {t: [rl_ok[t]] for t in tasks}))
    report = skill_report(EvalPasses.read(_Log(events)), run_temperature=1.0, recipe={})
    every, long = report["eval_change_vs_sft_best"], report["eval_change_vs_sft_best_long"]
    assert (every["tasks"], every["gained"], every["lost"]) == (5, 3, 1)
    assert (long["tasks"], long["gained"], long["lost"]) == (3, 1, 1)
    assert (long["resolved_before"], long["resolved_after"]) == (2, 2)


def test_eval_change_pairs_the_labelled_before_and_after_passes():
    from t1_actors.job.summary import eval_change

    tasks = [f"t{i}" for i in range(5)]
    events = (_pass("before", None, {t: [i < 2] for i, t in enumerate(tasks)})
              + _pass("after", None, {t: [0 < i < 4] for i, t in enumerate(tasks)}))
    change = eval_change(_Log(events))
    assert (change["tasks"], change["gained"], change["lost"]) == (5, 2, 1)


def test_sft_passes_from_a_warm_start_are_refused_unless_the_draws_match(tmp_path):
    """The SFT passes of another run pair with this run's only when tasks, eval and rollout settings match."""
    import json
    import re
    from pathlib import Path

    from t1_actors.job.main import RunLocationError, load_campaign_config, run_campaign
    from t1_actors.job.sft import check_warm_start_passes
    from t1_actors.runtime.config import ConfigError

    text = (Path(__file__).resolve().parent.parent / "configs" / "tiny.toml").read_text()
    path = tmp_path / "run.toml"
    path.write_text(re.sub(r"(?m)^\[eval\].*$", '[eval]\nsft_passes = "warm_start"', text))
    with pytest.raises(ConfigError, match="warm_start_from is not set"):
        load_campaign_config(path)
    previous = tmp_path / "previous"
    previous.mkdir()
    path.write_text(path.read_text().replace("[campaign]\n", f'[campaign]\nwarm_start_from = "{previous}"\n'))
    config = load_campaign_config(path)
    theirs = config.to_jsonable()
    theirs["eval"]["temperatures"] = [0.5, 1.0]
    (previous / "config.resolved.json").write_text(json.dumps(theirs))
    with pytest.raises(ValueError, match=r"\[eval\] temperatures = \[0.5, 1.0\]"):
        check_warm_start_passes(previous, config)
    # `t1-actor launch` checks it before anything is built or written (the CLI's "config error")
    fresh = tmp_path / "fresh"
    path.write_text(re.sub(r'(?m)^dir = .*$', f'dir = "{fresh}"', path.read_text()))
    with pytest.raises(RunLocationError, match=r"\[eval\] temperatures = \[0.5, 1.0\]"):
        run_campaign(load_campaign_config(path))
    assert not fresh.exists()
    # the context strategy and the sampler's precision decide where a trial ends and what it draws: no sharing
    for section, key, value in (("campaign", "context_strategy", "window"), ("sampler", "dtype", "bfloat16")):
        other = config.to_jsonable()
        other[section][key] = value
        (previous / "config.resolved.json").write_text(json.dumps(other))
        with pytest.raises(ValueError, match=rf"its \[{section}\] {key} = '{value}'"):
            check_warm_start_passes(previous, config)
    # a validation probe during RL decides no SFT pass's draws: the two runs may differ there
    theirs["eval"] = {**config.to_jsonable()["eval"], "probe_every": 10, "probe_tasks": 8}
    (previous / "config.resolved.json").write_text(json.dumps(theirs))
    with pytest.raises(ValueError, match="has no log"):
        check_warm_start_passes(previous, config)


def test_a_pass_played_twice_is_counted_once():
    """A relaunched (or restarted) staleness controller that played a half-finished pass again from its start:
    the log holds the pass's attempts twice under one label. Each attempt (task, sample) counts once, the trial
    issued last (the one the pass's EvalResult counted): pass@k, the paired change and the per-position rates are
    those of one pass."""
    from t1_actors.job.summary import eval_change
    from t1_actors.stats import labelled_attempts

    tasks = [f"t{i}" for i in range(4)]
    before = _pass("before", None, {t: [i < 2] for i, t in enumerate(tasks)})
    first = _pass("rl_passk", 1.0, {t: [True, True] for t in tasks}, samples=2)[:-1]  # its EvalResult never logged
    first = [e.model_copy(update={"trial_id": "dead-" + e.trial_id}) for e in first]  # the dead controller's ids
    again = _pass("rl_passk", 1.0, {t: [i < 3, False] for i, t in enumerate(tasks)}, samples=2, last=True)
    after_first = [e.model_copy(update={"trial_id": "dead-" + e.trial_id}) for e in _pass("after", None, {"t0": [True]})
                   if not isinstance(e, EvalResult)]
    after = _pass("after", None, {t: [0 < i < 4] for i, t in enumerate(tasks)})
    once = labelled_attempts(before + again + after)
    twice = labelled_attempts(before + first + again + after_first + after)
    assert twice == once
    assert len(twice["rl_passk"]) == 8 and len(twice["after"]) == 4
    assert pass_at_k_curve(twice["rl_passk"]) == pytest.approx({1: 3 / 8, 2: 3 / 4})
    assert eval_change(_Log(before + after_first + after)) == eval_change(_Log(before + after))
    # the order the passes were played in decides which play counts: the last one issued
    assert pass_at_k_curve(labelled_attempts(again + first)["rl_passk"]) == {1: 1.0, 2: 1.0}


def test_a_seed_row_and_its_table_carry_the_long_tasks_comparison(tmp_path):
    from t1_actors.job.seeds import markdown, seed_row

    change = {"tasks": 48, "gained": 7, "lost": 0, "mcnemar_p": 0.0156, "reward_delta": 0.02,
              "reward_delta_ci95": [0.0, 0.04], "resolved_before": 12, "resolved_after": 19}
    summary = {"code": {"commit": "abcdef1234", "dirty": False},
               "eval_sft_best": {"temperature": 0.25, "resolved_rate": 0.4},
               "eval_rl_best": {"temperature": 0.25, "resolved_rate": 0.45},
               "eval_change_vs_sft_best": {**change, "tasks": 160, "gained": 9, "lost": 3, "mcnemar_p": 0.146},
               "eval_change_vs_sft_best_long": change}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    row = seed_row(0, tmp_path)
    assert not row["beats_sft_best"] and row["long"] == {"tasks": 48, "gained": 7, "lost": 0, "mcnemar_p": 0.0156,
                                                         "beats_sft_best": True}
    assert "| 0 | 48 | 7 / 0 | 0.016 | yes |" in markdown([row])
