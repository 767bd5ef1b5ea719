"""The main job end to end: `t1-actor launch --config ... --quick` with all six actors as processes.

Two real campaigns, each a few minutes on 2 cores (marked slow; CI runs them):
- a plain one, the session's shared ``quick_campaign`` (tests/conftest.py): every actor ran, the log holds
  every event type, summary and plots exist, and nothing (actor process, sandbox mount, trial root) is left
  behind; the other campaign, the seeds and `t1-actor eval` start from it;
- a hostile one: a deliberately slow sampler with max_staleness = 0 makes stale trajectories, which are
  dropped and recorded; the learner is killed with SIGKILL mid-campaign, the supervisor restarts it,
  and the campaign completes with no learner step or weight version lost or duplicated.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest
from fixtures.campaign import MICRO_CONTEXT, ROOT, TINY, launch, micro_config, with_tests_on_path

from schemas import ActorLifecycle, LearnerStep, StalenessDecision, WeightsPublished
from storage import EventLog
from tools._replay.audit import audit_log

pytestmark = pytest.mark.slow


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    pairs = list(zip(map(int, out[0::2]), map(int, out[1::2])))
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in pairs:
            if ppid == parent:
                found.append(child)
                frontier.append(child)
    return found


def _actor_processes(run_dir: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout.splitlines()
    return [line for line in out if str(run_dir) in line and "t1_actors.cli" in line and "launch" not in line]


def test_campaign_runs_all_six_actors_and_logs_every_event_type(quick_campaign):
    code, output, run_dir, _ = quick_campaign
    assert code == 0, output[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(summary["actors"]) == ["critic", "learner", "sampler", "sandbox", "staleness", "verifier"]
    held_out = summary["sft"]["imitation"]  # the 8 validation tasks' executed oracles, teacher-forced
    assert held_out["chats"] == 8 == sum(family["chats"] for family in held_out["families"].values())
    assert all(family["turns"] >= 2 * family["chats"] for family in held_out["families"].values())  # command + done
    assert 0 <= held_out["chat_accuracy"] <= held_out["turn_accuracy"] <= 1
    for label in ("eval_before", "eval_after"):
        assert summary[label]["n"] == 12 and 0 <= summary[label]["resolved"] <= 12
        assert {"resolved", "n", "mean_reward"} <= set(summary[label])
    _the_skill_keys_are_filled(summary)
    audit = audit_log(EventLog.open(run_dir / "log"), run_dir)
    assert audit.clean, audit.to_json()  # every trial, step and version accounted for; no fact logged twice
    counts = EventLog.open(run_dir / "log").counts()
    assert summary["events"] == counts
    # Every event kind of schemas/events.py is a fact this campaign produces. A sandbox_exec needs the
    # 40-second policy to emit a well-formed tool call, so it is checked against what was sampled instead; a
    # context_edited needs a second turn (_nothing_was_cut_or_edited_silently checks that edits happened).
    from schemas import events as event_module
    event_kinds = {cls.kind for cls in vars(event_module).values()
                   if isinstance(cls, type) and issubclass(cls, event_module.Event) and cls.kind}
    never = event_kinds - set(counts) - {"sandbox_exec", "context_edited", "workspace_recovered"}
    # (a workspace_recovered needs its sandbox actor killed: tests/test_sandbox_reattach.py and the chaos run)
    assert never == set(), f"never logged: {sorted(never)}"
    assert counts["learner_step"] >= 1 and counts["weights_published"] >= 2
    _nothing_was_cut_or_edited_silently(summary, counts, EventLog.open(run_dir / "log"))
    change = summary["eval_change"]  # paired over the same 12 eval tasks, before and after RL
    assert change["tasks"] == 12 and change["resolved_before"] == summary["eval_before"]["resolved"]
    assert change["resolved_after"] == summary["eval_after"]["resolved"] and 0 < change["mcnemar_p"] <= 1
    _every_sampled_command_of_an_eval_trial_was_executed(EventLog.open(run_dir / "log"), run_dir)


def _nothing_was_cut_or_edited_silently(summary, counts, log):
    """A context smaller than a second turn needs: no prompt over the budget was ever sampled (edited to fit, or
    the trial ended "context"), outputs were dropped to fit (a run of this policy plays ~50 trials of two turns
    or more, ~40 of them edited), every edit made its prompt fit and is a logged event, and every finish, cut
    and edit is counted per split in summary.json, adding up to the log's events."""
    budget = MICRO_CONTEXT - 48  # max_context - [quick.campaign] max_new_tokens
    for _, turn in log.events(kinds=["sampler_turn"]):
        assert turn.prefix_len + len(turn.prompt_ids) <= budget, (turn.trial_id, turn.turn)
    for edit in (e for _, e in log.events(kinds=["context_edited"])):
        assert edit.tokens_after <= budget < edit.tokens_before and edit.turn >= 1
    edits = summary["context_edits"]
    assert sum(n for by_strategy in edits.values() for n in by_strategy.values()) == counts.get("context_edited", 0)
    assert {strategy for by_strategy in edits.values() for strategy in by_strategy} == {"drop_old_outputs"}
    assert counts["context_edited"] >= 1
    finishes = summary["finishes"]
    assert set(finishes) <= {"train", "warmup", "eval"}
    assert sum(sum(f.values()) for f in finishes.values()) == counts["trial_ended"]
    assert set().union(*finishes.values()) <= {"answered", "turn_tokens", "max_turns", "context", "token_budget",
                                                "cancelled", "sampler_error", "infra_error", "timeout", "abandoned"}
    assert set().union(*summary["truncations"].values()) <= {"tool_output", "turn_tokens"}


def _the_skill_keys_are_filled(summary):
    """The eval protocol ran for both policies: every key the skill-vs-sharpening comparison reads."""
    grid = summary["temperature_grid"]
    assert set(grid["sft"]) == set(grid["rl"]) == {"0.5", "1"}
    for policy in ("sft", "rl"):
        best = summary[f"eval_{policy}_best"]
        assert best["n"] == 12 and best["temperature"] in (0.5, 1.0)
        assert sorted(summary["pass_at_k"][policy]) == ["1", "2", "3", "4"]
        assert summary["turns"][policy]
    change = summary["eval_change_vs_sft_best"]
    assert change["tasks"] == 12 and {"gained", "lost", "mcnemar_p", "reward_delta", "reward_delta_ci95"} <= set(change)
    assert summary["recipe"] == {"advantage_estimator": "gae", "group_size": 1, "actor_params": ["*"],
                                 "reward": "P / 20"}
    assert "kl_rl_sft" in summary


def _every_sampled_command_of_an_eval_trial_was_executed(log, run_dir):
    """Eval trials are never cancelled: each tool call the sampler produced ran once, in order, as a
    SandboxExec of that trial and turn."""
    from tokenizers import Tokenizer

    from t1_actors.rollout import assistant_message

    tokenizer = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    eval_trials = [e.trial_id for _, e in log.events(kinds=["trial_issued"]) if e.split == "eval"]
    assert eval_trials
    for trial in eval_trials:
        events = [e for _, e in log.by_trial(trial)]
        turns = sorted((e for e in events if e.kind == "sampler_turn"), key=lambda e: e.turn)
        executed = [(e.turn, e.command) for e in events if e.kind == "sandbox_exec"]
        sampled = []
        for turn in turns:
            try:
                message = assistant_message(tokenizer.decode(turn.sampled_ids.tolist(), skip_special_tokens=False))
            except ValueError:
                continue
            if turn.finish_reason != "stop":
                continue
            sampled += [(turn.turn, c["arguments"].get("command", "")) for c in message.get("tool_calls", [])
                        if isinstance(c["arguments"].get("command"), str) and c["arguments"]["command"].strip()]
        assert executed == sampled, (trial, sampled, executed)
    for name in ("overview.png",):
        assert (run_dir / "report" / name).stat().st_size > 1000


def test_replay_drift_reads_the_long_horizon_run_with_zero_loss_region_drift(quick_campaign):
    """`t1-replay drift` on the micro campaign (a context it edits): every trial's chunks replay, the loss region
    equals what the sampler sampled, and the gaps of trials that span versions are reported apart."""
    from tools._replay.drift import drift_of_run
    from tools._replay.run import RunView

    code, output, run_dir, _ = quick_campaign
    assert code == 0, output[-4000:]
    view = RunView.open(run_dir)
    out = drift_of_run(view, tokenizer=view.tokenizer(None))
    assert out["trajectories"] >= 1 and out["drift_rate_loss"] == 0.0 and out["logprob_record_mismatch"] == 0
    assert set(out["gap_by_versions"]) <= {"single_version", "multi_version"} and out["gap_by_versions"]


def test_validation_probes_ran_between_steps_with_that_steps_policy_and_never_reached_the_learner(quick_campaign):
    """``[eval] probe_every = 2``, ``probe_tasks = 6`` (fixtures.campaign.QUICK) over 5 PPO steps: a probe after
    steps 2 and 4 (not 5, RL's last), each on the first 6 validation tasks, every turn of it sampled by that step's
    policy, played while no train trial was issued, printed, and no probe trial admitted, valued or trained."""
    from fixtures.campaign import QUICK

    from t1_actors.eval.protocol import EvalConfig, probe_task_ids
    from t1_actors.job.config import load_config
    from t1_actors.tasks.config import TasksConfig, build_task_sets

    code, output, run_dir, _ = quick_campaign
    assert code == 0, output[-4000:]
    log = EventLog.open(run_dir / "log")
    config = load_config(run_dir / "config.resolved.json")
    probe = config.section(EvalConfig)
    assert (probe.probe_every, probe.probe_tasks) == (QUICK["eval"]["probe_every"], QUICK["eval"]["probe_tasks"])
    validation = probe_task_ids([t.id for t in build_task_sets(config.section(TasksConfig)).validation], probe)
    last = max(e.version for _, e in log.events(kinds=["weights_published"]))
    steps = sorted(int(e.label[len("probe_s"):]) for _, e in log.events(kinds=["eval_result"])
                   if e.label.startswith("probe_s"))
    # each due step RL went past has its probe (RL's clock may stop it early: no probe after its last step)
    assert [k for k in (2, 4) if k < last] == [k for k in steps if k < last] and set(steps) <= {2, 4}
    assert steps, f"no probe ran: RL stopped at version {last}"
    controller = [(event_id, e) for event_id, e in log.events(kinds=["trial_issued", "eval_result",
                                                                     "staleness_decision"])]
    writers = {event_id.rsplit(":", 1)[0] for event_id, e in controller if e.kind == "eval_result"}
    assert len(writers) == 1  # the staleness controller's segment: its own order
    ordered = [e for _, e in sorted(((i, e) for i, e in controller if i.rsplit(":", 1)[0] in writers),
                                    key=lambda item: int(item[0].rsplit(":", 1)[1]))]
    probe_trials: set[str] = set()
    batch = config.staleness.batch_size
    for step in steps:
        name = f"probe_s{step}"
        issued = [i for i, e in enumerate(ordered) if e.kind == "trial_issued" and e.label == name]
        [done] = [i for i, e in enumerate(ordered) if e.kind == "eval_result" and e.label == name]
        trials = {ordered[i].trial_id for i in issued}
        probe_trials |= trials
        assert sorted(ordered[i].task_id for i in issued) == sorted(validation) and len(validation) == 6
        assert {ordered[i].policy_version_wanted for i in issued} == {step} and issued[-1] < done
        assert ordered[done].policy_version == step
        assert {t.policy_version for _, t in log.events(kinds=["sampler_turn"]) if t.trial_id in trials} == {step}
        admitted = sum(e.kind == "staleness_decision" and e.decision == "admit" for e in ordered[:issued[0]])
        assert admitted == step * batch  # after step K's batch, before any of the next one's
        assert not [e for e in ordered[issued[0]:done] if e.kind == "trial_issued" and e.split == "train"]
        assert re.search(rf"probe s{step}: \d+/\d+ resolved \(.*\), mean reward [\d.]+, policy v{step}", output)
    trained = {t for _, e in log.events(kinds=["learner_step"]) for t in e.trials}
    for kind in ("trajectory", "staleness_decision", "critic_values"):
        assert not {e.trial_id for _, e in log.events(kinds=[kind])} & probe_trials, kind
    assert not trained & probe_trials


def test_campaign_leaves_no_process_sandbox_or_mount_behind(quick_campaign):
    _, _, run_dir, tmp = quick_campaign
    assert _actor_processes(run_dir) == []
    mounts = Path("/proc/mounts").read_text()
    assert str(tmp / "sandbox") not in mounts, "a trial root is still mounted"
    trials = tmp / "sandbox" / "trials"
    assert not trials.exists() or list(trials.iterdir()) == [], "a trial's throwaway root was not removed"
    log = EventLog.open(run_dir / "log")
    cancelled = [e for _, e in log.events(kinds=["staleness_decision"]) if e.decision == "cancel"]
    stopped = [e for _, e in log.events(kinds=["actor_lifecycle"]) if e.state == "stopped"]
    assert len({e.actor for e in stopped}) == 6
    assert all(e.reason for e in cancelled)


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory, quick_campaign):
    """Warm-started from the plain run's tokenizer and SFT policy ([campaign] warm_start_from)."""
    tmp = tmp_path_factory.mktemp("hostile")
    run_dir = tmp / "run"
    data = tomllib.loads(TINY.read_text())
    actors = data["actors"]
    for spec in actors:
        if spec["role"] == "sampler":
            spec["actor_class"] = "slow_sampler:SlowSampler"
    config = micro_config(tmp, actors=actors, staleness={"batch_size": 4, "max_staleness": 0, "oversample": 1.0},
                          # four steps: drops (lag 1 > 0) follow every step from the first on, and the learner
                          # is killed after the first; rl_seconds only bounds them
                          campaign={"rl_seconds": 300, "rl_steps": 4, "warm_start_from": str(quick_campaign.run_dir)},
                          eval={"sft_passes": "warm_start"})
    process = launch(config, run_dir, with_tests_on_path())
    killed = None
    deadline = time.monotonic() + 900
    while process.poll() is None and time.monotonic() < deadline and killed is None:
        time.sleep(1.0)
        log_dir = run_dir / "log"
        if not log_dir.exists():
            continue
        try:
            log = EventLog.open(log_dir)
            steps = [e for _, e in log.events(kinds=["learner_step"])]
            starts = [e for _, e in log.events(kinds=["actor_lifecycle"])
                      if e.role == "learner" and e.state in ("started", "restarted")]
        except Exception:
            continue
        if steps and starts:
            killed = starts[-1].pid
            os.kill(killed, signal.SIGKILL)
    output, _ = process.communicate(timeout=max(60, deadline - time.monotonic()))
    return process.returncode, output, run_dir, killed


def test_slow_sampler_makes_stale_trajectories_that_are_dropped_and_recorded(hostile_run):
    code, output, run_dir, _ = hostile_run
    assert code == 0, output[-4000:]
    log = EventLog.open(run_dir / "log")
    decisions = [e for _, e in log.events(kinds=["staleness_decision"]) if isinstance(e, StalenessDecision)]
    dropped = [d for d in decisions if d.decision == "drop" and d.lag > 0]
    assert dropped, Counter(d.decision for d in decisions)
    for d in dropped:
        assert d.lag > 0 and "max_staleness" in d.reason
        assert any(e.kind == "trajectory" for _, e in log.by_trial(d.trial_id)), "a dropped trajectory is kept"


def test_learner_killed_mid_campaign_is_restarted_and_nothing_is_lost_or_duplicated(hostile_run):
    code, output, run_dir, killed = hostile_run
    assert killed is not None, "the learner was never seen stepping"
    assert code == 0, output[-4000:]
    log = EventLog.open(run_dir / "log")
    lifecycle = [e for _, e in log.events(kinds=["actor_lifecycle"]) if isinstance(e, ActorLifecycle)]
    assert any(e.role == "learner" and e.state == "died" and e.pid == killed for e in lifecycle)
    assert any(e.role == "learner" and e.state == "restarted" for e in lifecycle)
    steps = [e for _, e in log.events(kinds=["learner_step"]) if isinstance(e, LearnerStep)]
    assert [s.step for s in steps] == list(range(len(steps))), "a step was lost or logged twice"
    trained = [t for s in steps for t in s.trials]
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    admitted = {e.trial_id for _, e in log.events(kinds=["staleness_decision"]) if e.decision == "admit"}
    assert set(trained) <= admitted
    versions = [e.version for _, e in log.events(kinds=["weights_published"]) if isinstance(e, WeightsPublished)]
    assert sorted(versions) == list(range(len(versions))), versions
    assert json.loads((run_dir / "summary.json").read_text())["eval_after"] is not None
    audit = audit_log(log, run_dir)
    assert audit.clean and audit.learner_steps == len(steps), audit.to_json()


def test_a_campaign_warm_started_from_another_reuses_its_tokenizer_and_sft_policy(quick_campaign, hostile_run):
    code, output, run_dir, _ = hostile_run
    assert code == 0, output[-4000:]
    source = quick_campaign.run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["sft"] == {"warm_start_from": str(source)}
    assert (run_dir / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    [published] = [e for _, e in EventLog.open(run_dir / "log").events(kinds=["weights_published"])
                   if e.version == 0]
    [original] = [e for _, e in EventLog.open(source / "log").events(kinds=["weights_published"]) if e.version == 0]
    assert published.sha256 == original.sha256, "version 0 must be the source run's SFT policy, bit for bit"
    # [eval] sft_passes = "warm_start": no SFT pass played here, the source's read and paired with this run's
    labels = {e.label for _, e in EventLog.open(run_dir / "log").events(kinds=["eval_result"])}
    assert labels and not any(name.startswith("sft_") or name == "before" for name in labels), labels
    assert summary["sft_passes_from"] == str(source)
    source_summary = json.loads((source / "summary.json").read_text())
    assert summary["eval_sft_best"] == source_summary["eval_sft_best"] and summary["eval_before"] is not None
    assert summary["eval_change_vs_sft_best"] is not None and summary["eval_change"] is not None


def test_seeds_run_from_one_sft_policy_write_their_table_and_resume(quick_campaign, tmp_path):
    """`t1-actor launch --seeds N --base RUN`: each seed's RL from the base's SFT policy, paired against the
    base's SFT passes; the table has a row per seed; a second launch runs nothing and writes the same table."""
    source = quick_campaign.run_dir
    config = micro_config(tmp_path, campaign={"rl_seconds": 40, "rl_steps": 3})
    out = tmp_path / "seeds"
    command = [sys.executable, "-m", "t1_actors.cli", "launch", "--config", str(config), "--quick", "--seeds", "1",
               "--base", str(source), "--run-dir", str(out)]
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-4000:]
    assert json.loads(first.stdout.strip().splitlines()[-1])["seeds"] == 1
    table = json.loads((out / "seeds.json").read_text())
    [row] = table["rows"]
    summary = json.loads((out / "seed0" / "summary.json").read_text())
    assert row["seed"] == 0 and row["sft_passes_from"] == str(source) and summary["sft_passes_from"] == str(source)
    assert row["gained"] == summary["eval_change_vs_sft_best"]["gained"] and "missing" not in row
    assert row["beats_sft_best"] == (row["gained"] > row["lost"] and row["mcnemar_p"] < 0.05)
    assert (out / "seeds.md").read_text().count("\n") == 3  # header, rule, one row
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads((out / "seeds.json").read_text()) == table


def test_ablate_runs_two_arms_from_one_sft_policy_writes_its_report_and_resumes(quick_campaign, tmp_path):
    """`t1-actor ablate --base RUN`: a bad arm is refused before anything runs; then two arms (the config as it is,
    the binary reward) of one seed, each RL from the base's SFT policy paired against the base's SFT passes and
    against each other; the binary arm's verifier logged 0/1 rewards of kind binary; a second call runs nothing."""
    source = quick_campaign.run_dir
    config = micro_config(tmp_path, campaign={"rl_seconds": 40, "rl_steps": 2})
    out = tmp_path / "ablation"
    command = [sys.executable, "-m", "t1_actors.cli", "ablate", "--config", str(config), "--quick", "--seeds", "1",
               "--base", str(source), "--run-dir", str(out)]
    refused = subprocess.run([*command, "--arm", "dense:", "--arm", "x:tasks.train_size=10"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--arm x: tasks.train_size is refused" in refused.stderr, refused.stderr
    assert not out.exists(), "nothing may run or be written before every arm is sound"
    arms = ["--arm", "dense:", "--arm", "binary:verifier.reward=binary"]
    first = subprocess.run([*command, *arms], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-4000:]
    printed = json.loads(first.stdout.strip().splitlines()[-1])
    assert printed["arms"] == ["dense", "binary"] and printed["seeds"] == 1
    report = json.loads((out / "ablation.json").read_text())
    assert report["base"] == str(source) and not report["base_trained_here"]
    dense, binary = report["runs"]
    for row, arm in ((dense, "dense"), (binary, "binary")):
        assert (row["arm"], row["seed"], row["sft_passes"]) == (arm, 0, str(source)) and "missing" not in row
        summary = json.loads((out / arm / "seed0" / "summary.json").read_text())
        assert row["gained"] == summary["eval_change_vs_sft_best"]["gained"] and row["code"] == summary["code"]
        assert 1 <= row["learner_steps"] <= 2 and row["logprob_gap"] is not None
        # EV per step, or undefined where a step's returns had no variance (the binary reward of a policy that
        # resolves nothing is 0 everywhere)
        assert (row["ev_last"] is not None) + row["ev_undefined_steps"] >= 1
    assert json.loads((out / "binary" / "seed0" / "summary.json").read_text())["recipe"]["reward"] == "1[P = N]"
    kinds = {}
    for arm in ("dense", "binary"):
        results = [e for _, e in EventLog.open(out / arm / "seed0" / "log").events(kinds=["verifier_result"])]
        kinds[arm] = {e.reward_kind for e in results}
        if arm == "binary":
            assert {e.reward for e in results} <= {0.0, 1.0}
    assert kinds == {"dense": {"dense"}, "binary": {"binary"}}
    [comparison] = report["comparisons"]
    [per_seed] = comparison["per_seed"]
    assert (comparison["arm"], comparison["against"], per_seed["pairs"]) == ("binary", "dense", 12)
    assert comparison["verdict"] in ("reproduced", "not reproduced", "inconclusive at this size")
    assert printed["verdicts"] == {"binary": comparison["verdict"]}
    text = (out / "ablation.md").read_text()
    assert "| binary | verifier.reward = \"binary\" |" in text and comparison["verdict"] in text
    finished = {arm: (out / arm / "seed0" / "summary.json").stat().st_mtime_ns for arm in ("dense", "binary")}
    again = subprocess.run([*command, *arms], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads((out / "ablation.json").read_text()) == report
    assert finished == {arm: (out / arm / "seed0" / "summary.json").stat().st_mtime_ns for arm in finished}


def test_t1_actor_eval_plays_a_run_policy_on_the_example_tasks(quick_campaign, tmp_path):
    """`t1-actor eval --policy run:RUN`: the quick campaign's final policy through the campaign's agent loop
    on the shipped Terminal-Bench and Harbor tasks, every turn in the eval's own log."""
    source = quick_campaign.run_dir
    examples = ROOT / "t1_actors" / "tasks" / "examples"
    out = tmp_path / "eval"
    command = [sys.executable, "-m", "t1_actors.cli", "eval", "--tasks", str(examples), "--policy", f"run:{source}",
               "--attempts", "2", "--out", str(out), "--sandbox-dir", str(tmp_path / "sandbox"),
               "--verifier-dir", str(tmp_path / "verifier"), "--json",
               # the shipped tasks' instructions need more than the micro campaign's long-horizon context
               "--max-context", "768", "--max-turns", "3"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["n"] == 12 and summary["temperature"] == 1.0 and set(summary["pass_at_k"]) == {"1", "2"}
    assert all(row["turns"] >= 1 for row in summary["tasks"] if row["failure_class"] != "infrastructure")
    log = EventLog.open(out / "log")
    counts = log.counts()
    assert counts["trial_issued"] == 12 and counts["trial_ended"] == 12 and counts["sampler_turn"] >= 12
    [version] = {e.policy_version for _, e in log.events(kinds=["sampler_turn"])}
    published = [e.version for _, e in EventLog.open(source / "log").events(kinds=["weights_published"])]
    assert version == max(published)  # the newest version by default
    # the same seed draws the same tokens: a second eval of version 0 twice pairs with no flips
    again = [*command[:7], f"run:{source}@0", *command[8:], "--concurrency", "1"]  # batch of one: bit-exact
    for name in ("v0-a", "v0-b"):
        again[again.index("--out") + 1] = str(tmp_path / name)
        assert subprocess.run(again, cwd=ROOT, capture_output=True, text=True, timeout=900).returncode == 0
    compared = subprocess.run([sys.executable, "-m", "t1_actors.cli", "eval", "--compare", str(tmp_path / "v0-a"),
                               str(tmp_path / "v0-b"), "--json"], cwd=ROOT, capture_output=True, text=True)
    change = json.loads(compared.stdout.strip().splitlines()[-1])
    assert change["tasks"] >= 10 and change["gained"] == change["lost"] == 0
    # `--policy hf:DIR`: version 0 written as a Hugging Face checkpoint (config.json + safetensors, the run's
    # tokenizer beside it) plays exactly as run:RUN@0 does, token for token, under the run's limits.
    from t1_actors.layout import weights_dir
    from t1_actors.policy import MoEPolicy
    from t1_actors.policy._hf import save_pretrained

    hf_dir = tmp_path / "hf-v0"
    save_pretrained(MoEPolicy.load(weights_dir(source, 0)), hf_dir)
    (hf_dir / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    campaign = json.loads((source / "config.resolved.json").read_text())["campaign"]
    # the limits a run: policy takes from its run, given to hf: (the turns and context: the command's own)
    limits = ["--max-new-tokens", str(campaign["max_new_tokens"]), "--context-strategy", campaign["context_strategy"],
              "--keep-last-turns", str(campaign["keep_last_turns"]),
              "--tool-output-chars", str(campaign["tool_output_chars"])]
    hf = [*command[:7], f"hf:{hf_dir}", *command[8:], "--concurrency", "1", *limits]
    hf[hf.index("--out") + 1] = str(tmp_path / "v0-hf")
    done = subprocess.run(hf, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]

    def sampled(run: Path) -> dict:
        log = EventLog.open(run / "log")
        issued = {e.trial_id: (e.task_id, e.sample) for _, e in log.events(kinds=["trial_issued"])}
        return {(*issued[t.trial_id], t.turn): t.sampled_ids.tolist() for _, t in log.events(kinds=["sampler_turn"])}

    assert sampled(tmp_path / "v0-hf") == sampled(tmp_path / "v0-a") != {}
