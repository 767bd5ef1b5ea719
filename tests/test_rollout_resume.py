"""A restarted staleness controller resumes a train trial mid-trajectory from the log (t1_actors.rollout.resume).

The trial is played by a scripted agent (its tool calls are fixed, so the trial has several turns; its routing
and policy versions are per position and per turn) in a real local sandbox, with the turns and commands written
to a real event log as the sampler and sandbox actors write them. The controller is killed while a turn is in
flight; a new runner rebuilds the trial from the log and the first batch continues it. Its trajectory must be
the uninterrupted trial's: same tokens, loss mask, logprobs, per-token versions and routing rows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import trio

from schemas import SamplerTurn, SandboxExec, StalenessDecision, TrajectoryAssembled, TrialEnded, TrialIssued
from storage import EventLog, as_stored
from t1_actors import tito
from t1_actors.policy.generation import NO_PREFIX, Generation
from t1_actors.policy.tokenizer import special_token_ids
from t1_actors.rollout import RolloutLimits, ToolOutcome
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.rollout.inprocess import InProcessPorts
from t1_actors.rollout.recovery import open_trials
from t1_actors.rollout.resume import RESTARTED, WORKSPACE_LOST, resume_open_trials
from t1_actors.rollout.trials import BatchStats, TrialRunner, run_batches
from tools._replay.audit import audit_events

LAYERS, K, EXPERTS = 2, 2, 8
COMMANDS = [["echo one >> notes.txt && wc -l notes.txt"],  # turn 1 runs two commands, the second reads the first's
            ["echo two >> notes.txt && echo added", "cat notes.txt"], ["echo three >> notes.txt && wc -c notes.txt"]]
NEW_VERSION_AT = 2  # the learner publishes version 1 while turn 1 plays: the trial's turns span two versions


def tool_call(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"


def rows(start: int, end: int, version: int) -> np.ndarray:
    """Routing rows of stream positions start..end-1 under ``version``: a function of both, sets sorted."""
    p = np.arange(start, end)[:, None]
    first = (p * 3 + version + np.arange(LAYERS)[None, :]) % EXPERTS
    second = (first + 1 + p % 5) % EXPERTS
    return np.sort(np.stack([first, second], axis=-1), axis=-1).astype(np.uint8)


class LoggedPorts(InProcessPorts):
    """The in-process ports with a scripted agent for a sampler, writing to a real event log what the sampler
    actor (one ``SamplerTurn`` per turn, routing rows stored once) and the sandbox actor (one ``SandboxExec`` per
    command) write. ``hang_at``: the (trial, turn) whose generation, or the (trial, command) that never returns (what
    is in flight at a kill; such a command never starts)."""

    def __init__(self, tasks, sandbox, verifier, writer, tokenizer, stop_id):
        super().__init__(None, tasks, None, sandbox, verifier)
        self.writer, self.tokenizer, self.stop_id = writer, tokenizer, stop_id
        self.hang_at: tuple[str, int | str] | None = None
        self.cancelled: list[str] = []
        self.reached = trio.Event()

    async def generate(self, trial_id, turn, prompt_ids, seed=None, temperature=None, prefix=NO_PREFIX,
                       record_routing=True):
        if (trial_id, turn) == self.hang_at:
            self.reached.set()
            await trio.sleep_forever()
        text = "".join(tool_call(c) for c in COMMANDS[turn]) if turn < len(COMMANDS) else "done"
        ids = np.asarray([*self.tokenizer.encode(text), self.stop_id], np.int32)
        version = int(turn >= NEW_VERSION_AT)
        start = prefix.rows if prefix.version == version else 0  # a prefix-caching engine: only new rows
        end = len(prompt_ids) + len(ids) - 1
        generation = Generation(len(prompt_ids), ids, -0.01 * (turn + 1) - 0.001 * np.arange(len(ids), dtype=np.float32),
                                rows(start, end, version), "stop", version, routing_start=start)
        await self.log(generation.to_event(trial_id, turn, prompt_ids, temperature=1.0, top_p=1.0, sampler_id="s",
                                           prefix=prefix, record_routing=record_routing))
        return generation

    async def execute(self, trial_id, turn, command, timeout_s):
        if (trial_id, command) == self.hang_at:
            self.reached.set()
            await trio.sleep_forever()
        result = await trio.to_thread.run_sync(self.sandboxes[trial_id].exec, command, timeout_s)
        await self.log(SandboxExec(trial_id=trial_id, turn=turn, command=command, exit_code=result.exit_code,
                                   stdout=result.stdout, stderr=result.stderr, duration_s=result.duration_s))
        return ToolOutcome(result.exit_code, result.stdout + result.stderr)

    async def cancel(self, trial_id, *, sandbox_id=None):
        self.cancelled.append(trial_id)

    async def verify(self, trial_id, task_id, *, sandbox_id=None):
        event = await super().verify(trial_id, task_id, sandbox_id=sandbox_id)
        self.writer.append(event)
        self.writer.commit()
        return event

    async def log(self, *events):
        self.events.extend(events)
        for event in events:
            self.writer.append(event)
        self.writer.commit()


@pytest.fixture
def world(trial_world, tmp_path):
    """The trial world's tasks, sandbox and verifier; a fresh event log; a runner factory and its ports."""
    tasks, tokenizer, _model, sandbox, verifier = trial_world
    log = EventLog.open(str(tmp_path / "log"), create=True)
    writer = log.writer("controller", routing_shape=(LAYERS, K), num_experts=EXPERTS)
    stop = special_token_ids(tokenizer)["<|im_end|>"]
    by_id = {t.id: t for t in tasks}

    def runner_of(ports, tag):
        return TrialRunner(ports, by_id, tokenizer, RolloutLimits(max_turns=6, max_new_tokens=200, max_context=4096,
                                                                  tool_output_chars=400),
                           run_tag=tag, routing_in_turns=True)

    ports = LoggedPorts(by_id, sandbox, verifier, writer, runner_of(None, "x").tokenizer, stop)
    yield ports, runner_of, log, tasks[0].id
    writer.close()  # one writer per segment and process: the next test's log may get this store's id


def test_two_runners_of_one_run_tag_never_issue_the_same_trial_id(world):
    """Two runs of one config started in the same second (two controllers, two `t1-actor eval`s) share the
    host's sandbox base dir, where the trial id names the root: their ids must differ."""
    _, runner_of, _, _ = world
    first, second = runner_of(None, "long-staleness-0"), runner_of(None, "long-staleness-0")
    ids = [runner.new_trial_id(split) for runner in (first, second) for split in ("train", "eval") for _ in range(3)]
    assert len(set(ids)) == len(ids) and all(i.startswith("long-staleness-0-") for i in ids)


async def _trial_events_of(log):
    async def trial_events(trial_id):
        return [e for _, e in await log.aby_trial(trial_id)]
    return trial_events


def _play_until_killed(ports, runner, task_id, trial_id, in_flight):
    """Issue and play a train trial until ``in_flight`` (a turn number: that turn is being sampled; a command: it
    is about to run; None: its agent loop has ended, and nothing of its ending is logged yet) is reached, then kill
    the controller (its sandbox stays open at the sandbox actor)."""
    async def main():
        await ports.log(TrialIssued(trial_id=trial_id, task_id=task_id, split="train", policy_version_wanted=0))
        await ports.open_sandbox(trial_id, task_id)
        ports.hang_at, ports.reached = (trial_id, in_flight), trio.Event()

        async def play() -> None:
            await runner.play(trial_id, task_id, trained=True)
            ports.reached.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(play)
            with trio.fail_after(60):
                await ports.reached.wait()
            nursery.cancel_scope.cancel()  # the kill: the dead controller's memory is gone with it
        ports.hang_at = None

    trio.run(main)


def _uninterrupted(ports, runner, task_id):
    async def main():
        await ports.open_sandbox("U", task_id)
        try:
            rollout = await runner.play("U", task_id, trained=True)
            return rollout, await ports.verify("U", task_id)
        finally:
            await ports.close_sandbox("U")

    return trio.run(main)


def _stored(chunk):
    return as_stored(tito.to_event(chunk, trial_id="x", task_id="x"), num_experts=EXPERTS)


@pytest.mark.parametrize("in_flight", [NEW_VERSION_AT, COMMANDS[1][1], None],
                         ids=["turn-in-flight", "between-commands", "loop-ended"])
def test_a_trial_killed_mid_trajectory_continues_from_its_log_as_if_never_interrupted(world, in_flight):
    ports, runner_of, log, task_id = world
    uninterrupted, result = _uninterrupted(ports, runner_of(ports, "u"), task_id)
    assert len(uninterrupted.turns) == 4 and {t.policy_version for t in uninterrupted.turns} == {0, 1}
    ports.events.clear()

    _play_until_killed(ports, runner_of(ports, "dead"), task_id, "K", in_flight)
    restarted = runner_of(ports, "new")  # a new controller: nothing of the dead one's memory

    async def recover():
        pending = open_trials([e for _, e in log.events()])
        assert [t.trial_id for t in pending] == ["K"]
        flights, left = await resume_open_trials(
            pending, restarted, trial_events=await _trial_events_of(log),
            open_sandboxes=lambda ids: _held(ports, ids), close_sandbox=ports.close_sandbox, version=1,
            command_wait_s=0.3, poll_s=0.05)
        assert left == [] and [f.trial_id for f in flights] == ["K"]
        rebuilt = flights[0].rollout
        assert len(rebuilt.turns) == (4 if in_flight is None else NEW_VERSION_AT)  # the logged turns, all of them
        assert rebuilt.outputs_so_far == (["added\n"] if in_flight == COMMANDS[1][1] else [])
        assert flights[0].played == (in_flight is None)
        for got, want in zip(rebuilt.turns, uninterrupted.turns):
            assert np.array_equal(got.prompt_ids, want.prompt_ids)
            assert np.array_equal(got.sampled_ids, want.sampled_ids)
            assert np.array_equal(got.sampler_logprobs, want.sampler_logprobs)
            assert np.array_equal(got.routing, want.routing) and got.policy_version == want.policy_version
        ports.version = 1
        stats = BatchStats()

        async def learner_ready(version):
            pass

        await run_batches(restarted, lambda: task_id, StalenessConfig(batch_size=1, oversample=0, max_in_flight=1),
                          until=lambda: stats.batches >= 1, wait_for_learner=learner_ready, stats=stats,
                          resumed=flights)
        return stats

    stats = trio.run(recover)
    events = [e for _, e in log.events() if e.trial_id != "U"]  # the uninterrupted trial shares the log
    assert stats.admitted == 1 and stats.resumed == 1
    assert ports.cancelled == ["K"]  # the dead controller's turn in flight, should the sampler still play it
    decisions = [(e.trial_id, e.decision, e.reason) for e in events if isinstance(e, StalenessDecision)]
    assert decisions[0][:2] == ("K", "cancel") and RESTARTED in decisions[0][2]
    assert decisions[1][:2] == ("K", "resume") and "restart" in decisions[1][2] and "K~c1" in decisions[1][2]
    assert ("verified as it is" if in_flight is None else "sampled again" if in_flight == NEW_VERSION_AT
            else "commands from 'cat notes.txt' (its command 1) on run") in decisions[1][2], decisions[1][2]
    assert decisions[2][:2] == ("K~c1", "admit")
    # only the turn in flight was sampled again (none, when the loop had ended); no command of the logged turns
    # ran twice
    assert [(e.trial_id, e.turn) for e in events if isinstance(e, SamplerTurn)] == (
        [("K", 0), ("K", 1), ("K", 2), ("K", 3)] if in_flight is None else [("K", 0), ("K", 1), ("K~c1", 2), ("K~c1", 3)])
    assert [(e.trial_id, e.turn, e.command) for e in events if isinstance(e, SandboxExec)] == [
        ("K", turn, command) for turn in range(3) for command in COMMANDS[turn]]
    # the continuation's trajectory is the uninterrupted one: tokens, mask, logprobs, versions and routing
    got = [e for e in events if isinstance(e, TrajectoryAssembled)]
    want = [_stored(c) for c in tito.assemble(uninterrupted.turns, restarted.tokenizer, reward=result.reward)]
    assert len(got) == len(want) >= 2  # a chunk per policy version: R3 replays each with its own rows
    for g, w in zip(got, want):
        assert g.trial_id == "K~c1"
        for name in ("token_ids", "loss_mask", "sampler_logprobs", "token_versions", "routing"):
            assert np.array_equal(getattr(g, name), getattr(w, name)), name
        assert g.reward == w.reward
    audit = audit_events(enumerate(events))
    assert audit.trials_unaccounted == 0 and audit.continuations_unlinked == 0, audit.to_json()
    assert audit.final_states["cancelled, resumed"] == 1 and audit.final_states["admit"] == 1, audit.to_json()


async def _held(ports, ids):
    return {i for i in ids if i in ports.sandboxes}


def test_a_lost_sandbox_is_an_infrastructure_failure_and_a_command_running_at_the_kill_is_waited_for(world):
    ports, runner_of, log, task_id = world
    _play_until_killed(ports, runner_of(ports, "dead"), task_id, "gone", 1)
    _play_until_killed(ports, runner_of(ports, "dead"), task_id, "late", 1)
    _play_until_killed(ports, runner_of(ports, "dead"), task_id, "unstarted", COMMANDS[1][0])
    restarted = runner_of(ports, "new")
    reads = {"late": 0}

    async def recover():
        await ports.close_sandbox("gone")  # the sandbox actor lost it
        everything = await _trial_events_of(log)

        async def trial_events(trial_id):
            """The log as the restarted controller reads it: "late"'s turn-0 command was still running at the
            kill, and logs its output while the controller waits (by its third read)."""
            reads[trial_id] = reads.get(trial_id, 0) + 1
            hide = trial_id == "late" and reads["late"] < 3
            return [e for e in await everything(trial_id) if not (hide and isinstance(e, SandboxExec))]

        pending = open_trials([e for _, e in log.events()])
        return await resume_open_trials(pending, restarted, trial_events=trial_events,
                                        open_sandboxes=lambda ids: _held(ports, ids), close_sandbox=ports.close_sandbox,
                                        version=0, command_wait_s=1.0, poll_s=0.05)

    flights, left = trio.run(recover)
    assert left == [] and [f.trial_id for f in flights] == ["late", "unstarted"] and reads["late"] == 3
    late, unstarted = (f.rollout for f in flights)
    assert len(late.turns) == 1 and late.messages[-1]["role"] == "tool"  # its output arrived: turn 1 is next
    # "unstarted": its turn-1 command never started; the wait ran out, the continuation runs it (once)
    assert len(unstarted.turns) == 2 and unstarted.messages[-1]["role"] == "assistant"
    assert unstarted.outputs_so_far == []
    ended = {e.trial_id: e for _, e in log.events() if isinstance(e, TrialEnded)}
    assert set(ended) == {"gone"} and ended["gone"].finish == "infra_error"
    assert WORKSPACE_LOST in ended["gone"].infra_error and "no longer held" in ended["gone"].infra_error
    audit = audit_events(log.events())
    assert audit.trials_unaccounted == 0 and audit.final_states["failed"] == 1, audit.to_json()
    assert audit.final_states["cancelled, closed"] == 2, audit.to_json()  # resumed by run_batches, not here
    for trial_id in ("late", "unstarted"):
        trio.run(ports.close_sandbox, trial_id)
