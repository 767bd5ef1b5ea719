"""The main job on a REAL SGLang server: `t1-actor launch --quick` with `[sampler] backend = "sglang"` and
`sglang_server = "local"` (the campaign starts the server through the launcher, for version 0, and stops it).

The tests' micro campaign (tests/fixtures/campaign.py) with only the sampler's backend changed, warm-started from
the session's quick campaign (its tokenizer and SFT policy). What must hold on the real engine: the campaign
completes, every event kind is logged, the log's audit is clean, every turn was served by the run's one SGLang
start (never a silent fallback to torch), the learner's published versions reached the server (turns at later
versions), and `t1-replay drift` finds SGLang's logprobs and routing equal to what t1's own policy recomputes
from the log. The SGLang venv comes from CI's set-up (.ci/setup-sglang):
missing, this FAILS saying so, it never skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections import Counter

import pytest
from fixtures.campaign import ROOT, launch, micro_config

from storage import EventLog
from t1_actors.backends.sglang_server import check_venv, sglang_venv
from tools._replay.audit import audit_log

pytestmark = [pytest.mark.slow, pytest.mark.sglang_venv]


@pytest.fixture(scope="module")
def sglang_run(tmp_path_factory, quick_campaign):
    check_venv(sglang_venv())  # a clear failure naming .ci/setup-sglang, before a campaign is started
    tmp = tmp_path_factory.mktemp("campaign-sglang")
    run_dir = tmp / "run"
    # the server's context and the trials as before the long-horizon settings of the micro config; warm-started
    # from the session's quick campaign (its tokenizer and SFT policy: what is under test is the sampler)
    campaign = {"max_turns": 3, "max_context": 768, "context_strategy": "end", "tool_output_chars": 240,
                "warm_start_from": str(quick_campaign.run_dir)}
    process = launch(micro_config(tmp, sampler={"backend": "sglang", "sglang_server": "local"}, campaign=campaign),
                     run_dir)
    output, _ = process.communicate(timeout=1200)
    assert process.returncode == 0, output[-4000:]
    return run_dir


def test_a_quick_campaign_runs_end_to_end_on_a_real_sglang_server(sglang_run):
    run_dir = sglang_run
    summary = json.loads((run_dir / "summary.json").read_text())
    engine = json.loads((run_dir / "sglang" / "engine.json").read_text())
    assert summary["sampler_engine"] == {"name": "sglang", "version": engine["version"]}
    assert engine["context_length"] == 768 and engine["max_concurrent"] >= 12  # sized from the config
    for label in ("eval_before", "eval_after"):
        assert summary[label]["n"] == 12

    log = EventLog.open(run_dir / "log")
    audit = audit_log(log, run_dir)
    assert audit.clean, audit.to_json()
    counts = log.counts()
    assert counts["learner_step"] >= 1 and counts["weights_published"] >= 2
    from schemas import events as event_module
    kinds = {cls.kind for cls in vars(event_module).values()
             if isinstance(cls, type) and issubclass(cls, event_module.Event) and cls.kind}
    # a context edit needs a trial that outgrows its context: this config ends such trials instead (the default)
    never = kinds - set(counts) - {"sandbox_exec", "context_edited", "workspace_recovered"}
    # (a workspace_recovered needs its sandbox actor killed: tests/test_sandbox_reattach.py and the chaos run)
    assert never == set(), f"never logged: {sorted(never)}"

    turns = [turn for _, turn in log.events(kinds=["sampler_turn"])]
    served_by = Counter((t.engine, t.engine_version, t.engine_start_id) for t in turns)
    assert served_by == Counter({("sglang", engine["version"], engine["start_id"]): len(turns)}), served_by
    assert not [t for t in turns if t.finish_reason == "error"]
    versions = Counter(t.policy_version for t in turns)
    assert max(versions) >= 1, versions  # /update_weights_from_disk reached the server: later versions served
    for t in turns:  # stored once: the prompt after its shared prefix, the rows of its version's new positions
        if len(t.sampled_ids) and t.routing is not None:
            assert t.routing.shape[0] == t.prefix_len + len(t.prompt_ids) + len(t.sampled_ids) - 1 - t.routing_start

    # The server was the campaign's own: it is gone with the campaign.
    with pytest.raises(OSError):
        urllib.request.urlopen(engine["url"] + "/health", timeout=5)
    assert (run_dir / "sglang" / "server.log").stat().st_size > 0


def test_replay_drift_finds_sglangs_logprobs_and_routing_equal_to_t1s_policy(sglang_run):
    out = subprocess.run([sys.executable, "-m", "tools.replay", "drift", str(sglang_run), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    drift = json.loads(out.stdout.strip().splitlines()[-1])
    assert drift["trajectories"] >= 1 and drift["loss_tokens"] > 0
    assert drift["logprob_record_mismatch"] == 0 and drift["out_of_vocab_tokens"] == 0
    assert all(drift["checksums"].values()) and len(drift["versions"]) >= 2
    # SGLang's logprobs against t1's recompute from the log (same weights, float32 both sides): the engines
    # agree (measured 2.4e-7 mean; a wrong temperature, weight version or token alignment gives > 0.01).
    assert drift["gap_tito"] < 1e-3, drift
    # With SGLang's routing replayed (R3). One routing record per position cannot serve both turns of a
    # trajectory whose turns ran different versions (the later turn recomputed the prefix under new weights):
    # those carry the mean's 1.5e-4 (docs/sglang.md); single-turn trajectories match as closely as without R3.
    assert drift["gap_r3_tito"] < 0.01, drift
    if "single_turn" in drift["gap_r3_tito_by_case"]:
        assert drift["gap_r3_tito_by_case"]["single_turn"] < 1e-3, drift["gap_r3_tito_by_case"]
    # Live routing differs from SGLang's record on few (token, layer) pairs (measured 0.24 %).
    assert drift["routing_mismatch"]["mean"] < 0.05, drift["routing_mismatch"]


def test_a_dead_server_is_restarted_and_an_eval_that_lost_it_resumes(sglang_run, tmp_path):
    """A local server under ``ServerWatch`` (what a campaign's ``sglang_server = "local"`` runs) killed while
    `t1-actor eval --policy sglang:URL --tokenizer RUN` plays the run's version 0 through the campaign's agent
    loop on the shipped tasks: the eval ends with one line naming the URL and the resume command, keeping its
    finished attempts; the server comes back on the same URL as a new start; the resume command finishes the
    eval (the new start's turns named by its start id); every turn is SGLang's at version 0 with t1's policy's
    logprobs; past ``sglang_restart_limit`` the watch gives up. (One server for both: each start costs ~30 s.)"""
    import shlex
    import time

    import numpy as np

    from t1_actors import tito
    from t1_actors.backends.sglang_server import SGLangServer
    from t1_actors.job.local_sglang import ServerWatch
    from t1_actors.layout import weights_dir
    from t1_actors.policy import MoEPolicy
    from tools._replay.drift import token_logprobs

    def start(version: int, port: int | None) -> SGLangServer:
        return SGLangServer.start(weights_dir(sglang_run, version), context_length=768, max_concurrent=4, port=port,
                                  weight_version=version, log_path=tmp_path / "server.log")

    def wait_for(what, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while not (found := what()):
            assert time.monotonic() < deadline, f"not within {timeout_s} s"
            time.sleep(0.5)
        return found

    journal = tmp_path / "restarts.jsonl"
    out = tmp_path / "eval"

    def events() -> list[dict]:
        return [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []

    with ServerWatch(start(0, None), start, latest=lambda: 0, journal=journal, limit=1, backoff_s=0.5) as watch:
        first = watch.server
        eval_args = ["--tasks", str(ROOT / "t1_actors/tasks/examples"), "--policy", f"sglang:{first.url}",
                     "--tokenizer", str(sglang_run), "--max-turns", "8", "--concurrency", "1", "--out", str(out),
                     "--sandbox-dir", str(tmp_path / "sandbox"), "--verifier-dir", str(tmp_path / "verifier")]
        process = subprocess.Popen([sys.executable, "-m", "t1_actors.cli", "eval", *eval_args], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        def an_attempt_ended() -> bool:
            try:  # the eval's log is being written: a read may find a segment mid-write
                return bool(EventLog.open(out / "log").counts().get("trial_ended", 0))
            except Exception:
                return False

        wait_for(an_attempt_ended, 300)
        first.kill()
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 3, stderr[-3000:]
        line = stderr.strip().splitlines()[-1]
        assert line.startswith("t1-actor eval: the policy's server stopped serving") and first.url in line, line
        resume = shlex.split(line.split("resume with: ", 1)[1])
        assert resume[:2] == ["t1-actor", "eval"] and resume[resume.index("--out") + 1] == str(out)

        restarted = wait_for(lambda: [e for e in events() if e["event"] == "restarted"], 400)[0]
        assert [e["event"] for e in events()] == ["died", "restarted"] and restarted["version"] == 0
        second = watch.server
        assert second.url == first.url and second.engine.start_id != first.engine.start_id
        done = subprocess.run([sys.executable, "-m", "t1_actors.cli", *resume[1:], "--json"], cwd=ROOT,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["n"] == 6 and summary["infra_failures"] == 0
        assert summary["policy"] == f"sglang:{first.url}"
        turns = [turn for _, turn in EventLog.open(out / "log").events(kinds=["sampler_turn"])]
        assert len(turns) >= 6 and {(t.engine, t.policy_version) for t in turns} == {("sglang", 0)}
        starts = {t.engine_start_id for t in turns}
        assert second.engine.start_id in starts and starts <= {first.engine.start_id, second.engine.start_id}
        policy = MoEPolicy.load(weights_dir(sglang_run, 0)).eval()
        by_trial: dict[str, list] = {}
        for turn in turns:
            by_trial.setdefault(turn.trial_id, []).append(turn)
        whole = [t for trial in by_trial.values() for t in tito.expand_turns(sorted(trial, key=lambda t: t.turn))]
        for turn in whole:  # each turn as the sampler saw it (the log stores what is new since the previous turn)
            ids = np.concatenate([turn.prompt_ids, turn.sampled_ids])
            ours = token_logprobs(policy, ids, temperature=turn.temperature)[0][len(turn.prompt_ids):]
            assert np.abs(ours - turn.sampler_logprobs).max() < 1e-3, turn.trial_id

        second.kill()  # the limit (1) is reached: no second restart
        wait_for(lambda: [e for e in events() if e["event"] == "gave_up"], 60)
        assert not second.alive() and watch.restarts == 1
