"""The campaign end to end on Qwen3's real tokenizer and chat template: `t1-actor launch --config
configs/qwen3-micro.toml --quick` samples, trains and replays a tiny Qwen3-MoE policy whose vocabulary is the
tokenizer's 151,669 ids, SFT'd first on oracle chats with <think> blocks (t1_actors/warmstart/chats.py), so that its
trajectories are multi-turn; then `t1-replay drift RUN --tokenizer DIR` reads the log back.

Checked: >= 20 multi-turn trajectories with a reasoning block in every turn the template re-renders were assembled (the
repair-case shares count only then), every boundary has a case and the shares cover them all, the loss region holds
exactly the sampled ids (drift 0), the sampler stopped on Qwen3's <|im_end|> and the tool calls it wrote in Qwen3's
format were run. A few minutes on 2 cores (marked slow; CI runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest
from _qwen3 import qwen3, qwen3_dir
from fixtures.campaign import ROOT, write_config

from schemas import SamplerTurn, TrajectoryAssembled
from storage import EventLog

CONFIG = ROOT / "configs" / "qwen3-micro.toml"
MIN_MULTI_TURN = 20  # issue 20: the repair-case shares count only over at least this many

# its campaign launch may take 1800 s (a 151k-id head on 2 shared cores): pytest-timeout must not cut it at 900
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def qwen3_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qwen3")
    data = tomllib.loads(CONFIG.read_text())
    data["campaign"]["tokenizer"] = str(qwen3_dir())  # checked: present, sha256-pinned (fails, never skips)
    data["sandbox"] = {"local": {"base_dir": str(tmp / "sandbox")}}
    data["verifier"] = {"base_dir": str(tmp / "verifier")}
    config = write_config(tmp / "qwen3-micro.toml", data)
    run_dir = tmp / "run"
    launched = subprocess.run([sys.executable, "-m", "t1_actors.cli", "launch", "--config", str(config), "--quick",
                               "--run-dir", str(run_dir)], cwd=ROOT, env=dict(os.environ), capture_output=True,
                              text=True, timeout=1800)
    assert launched.returncode == 0, (launched.stdout + launched.stderr)[-4000:]
    replay = subprocess.run([sys.executable, "-m", "tools.replay", "drift", str(run_dir), "--tokenizer",
                             str(qwen3_dir()), "--limit", "4", "--json"], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert replay.returncode == 0, replay.stderr[-4000:]
    (run_dir / "drift.json").write_text(replay.stdout)  # kept beside the run: docs/qwen3.md quotes it
    return run_dir, json.loads(replay.stdout)


def test_the_run_used_qwen3s_tokenizer_everywhere(qwen3_run):
    run_dir, _ = qwen3_run
    model = json.loads((run_dir / "weights" / "v00000" / "config.json").read_text())
    assert model["vocab_size"] == 151669  # the policy covers every id of the tokenizer
    kept = json.loads((run_dir / "tokenizer" / "tokenizer_config.json").read_text())
    assert kept == json.loads((qwen3_dir() / "tokenizer_config.json").read_text())  # template and special tokens
    assert (run_dir / "tokenizer" / "tokenizer.json").stat().st_size > 10_000_000
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["sft"]["distinct_examples"] > 0 and summary["events"]["learner_step"] >= 1


def test_enough_multi_turn_trajectories_with_reasoning_and_their_case_shares(qwen3_run):
    _, drift = qwen3_run
    b = drift["boundaries"]
    assert b["multi_turn_with_reasoning"] >= MIN_MULTI_TURN, b
    assert sum(b["repair_cases"].values()) == b["boundaries"] > 0
    assert abs(sum(s for s in b["repair_case_shares"].values()) - 1.0) < 1e-9
    assert b["template_changes"]["boundaries"] >= b["multi_turn"]  # every boundary of every multi-turn trial
    assert drift["drift_rate_loss"] == 0.0 and drift["trajectories"] >= 1


def test_sampled_turns_stop_on_im_end_and_their_tool_calls_ran(qwen3_run):
    """Independently of the replay tool: the log's trajectories hold exactly the sampled ids in their loss region,
    every turn that stopped ended on <|im_end|>, and each Qwen3-format tool call of a turn became a command."""
    from t1_actors.rollout import assistant_message

    run_dir, _ = qwen3_run
    tok = qwen3()
    im_end = tok.token_to_id("<|im_end|>")
    log = EventLog.open(run_dir / "log")
    chunks = {}
    for _, e in log.events(kinds=["trajectory"]):
        assert isinstance(e, TrajectoryAssembled)
        chunks.setdefault(e.trial_id, []).append(e)
    issued = [e for _, e in log.events(kinds=["trial_issued"])]
    continued = {e.trial_id for e in issued if e.resumed_from} | {e.resumed_from for e in issued if e.resumed_from}
    executed_calls = 0
    for trial_id, trial_chunks in chunks.items():
        events = [e for _, e in log.by_trial(trial_id)]
        if trial_id in continued:  # a continuation's turns and commands are logged under its original's id
            continue
        turns = sorted((e for e in events if isinstance(e, SamplerTurn)), key=lambda e: e.turn)
        trained = [int(x) for c in sorted(trial_chunks, key=lambda c: c.chunk)
                   for x, m in zip(c.token_ids, c.loss_mask) if m]
        assert trained == [int(x) for t in turns for x in t.sampled_ids]
        commands = [e.command for e in events if e.kind == "sandbox_exec"]
        sampled_commands = []
        for turn in turns:
            if turn.finish_reason == "stop":
                assert int(turn.sampled_ids[-1]) == im_end
                try:
                    message = assistant_message(tok.decode(turn.sampled_ids))
                except ValueError:
                    continue
                sampled_commands += [c["arguments"].get("command") for c in message.get("tool_calls", [])
                                     if isinstance(c["arguments"].get("command"), str) and c["arguments"]["command"].strip()]
        assert commands == sampled_commands[:len(commands)]
        executed_calls += len(commands)
    assert executed_calls >= MIN_MULTI_TURN
