"""A sandbox that cannot be opened (its infrastructure: an image that cannot be built, the disk budget spent) ends its
trial as an infrastructure failure, never scored or trained on, and the run goes on; a run where every open fails
stops with the sandbox's error instead of issuing such trials forever (t1_actors/rollout/opens.py).

Fake ports (a scripted agent that answers at once, sandboxes that are a set): no engine, no sandbox, no campaign."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import structlog
import trio
from _trio import trio_test

from schemas import (
    ErrorReply,
    EvalResult,
    SandboxOpen,
    StalenessDecision,
    TrajectoryAssembled,
    TrialEnded,
    TrialIssued,
    VerifierResult,
)
from t1_actors.backends.local_sandbox import DiskBudgetExceeded, SandboxBuildError, SandboxInfraError
from t1_actors.policy.generation import NO_PREFIX, Generation
from t1_actors.policy.tokenizer import special_token_ids, train_tokenizer
from t1_actors.rollout import RolloutLimits, ToolOutcome
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.rollout.endings import trial_endings
from t1_actors.rollout.eval_pass import run_eval
from t1_actors.rollout.opens import SANDBOX_NOT_OPENED, SandboxesUnavailable, SandboxOpens, SandboxUnavailable
from t1_actors.rollout.trials import BatchStats, TrialRunner, run_batches
from t1_actors.runtime.errors import RemoteError
from t1_actors.sandbox import SandboxActor
from t1_actors.staleness import ActorPorts
from t1_actors.tasks import generate
from t1_actors.warmstart.finetune import chat_corpus
from tools._replay.audit import audit_events

REFUSED = ("DiskBudgetExceeded: trial {trial} refused: its disk ([sandbox.local] disk_mb = 1024) does not fit; "
           "raise [sandbox.local] disk_total_mb")


@pytest.fixture(scope="module")
def world():
    tasks = generate("train", 4, seed=3)
    return {t.id: t for t in tasks}, train_tokenizer(chat_corpus(tasks), 512)


class FakePorts:
    """Sandboxes are a set; ``refuse(ports, trial_id, task_id)`` says why an open is refused (None: opened). The agent
    answers "done" at once (after ``turn_s``), the verifier passes every trial whose sandbox is open."""

    def __init__(self, tokenizer, refuse, turn_s: float = 0.0):
        self.tokenizer, self.refuse, self.turn_s = tokenizer, refuse, turn_s
        self.stop = special_token_ids(tokenizer)["<|im_end|>"]
        self.open: set[str] = set()
        self.events: list = []
        self.version = 0
        self.refused = 0

    async def open_sandbox(self, trial_id, task_id):
        why = self.refuse(self, trial_id, task_id)
        if why is None:
            self.open.add(trial_id)  # as the sandbox actor does, even when the caller is cut while it waits
        await trio.sleep(0)
        if why is not None:
            self.refused += 1
            raise SandboxUnavailable(why.format(trial=trial_id))

    async def execute(self, trial_id, turn, command, timeout_s):
        return ToolOutcome(0, "")

    async def close_sandbox(self, trial_id):
        self.open.discard(trial_id)

    async def generate(self, trial_id, turn, prompt_ids, seed=None, temperature=None, prefix=NO_PREFIX,
                       record_routing=True):
        await trio.sleep(self.turn_s)
        ids = np.asarray([*self.tokenizer.encode("done").ids, self.stop], np.int32)
        return Generation(len(prompt_ids), ids, np.full(len(ids), -0.1, np.float32), None, "stop", self.version)

    async def cancel(self, trial_id, *, sandbox_id=None):
        pass

    async def verify(self, trial_id, task_id, *, sandbox_id=None):
        assert (sandbox_id or trial_id) in self.open, f"{trial_id} verified without an open sandbox"
        event = VerifierResult(trial_id=trial_id, task_id=task_id, tests={"t": "passed"}, passed=1, total=1,
                               reward=0.05, reward_scale=20, verifier_sha256="")
        self.events.append(event)
        return event

    async def log(self, *events):
        self.events.extend(events)

    def learner_version(self):
        return self.version


def _runner(world, ports, **kwargs) -> TrialRunner:
    tasks, tokenizer = world
    return TrialRunner(ports, tasks, tokenizer, RolloutLimits(max_turns=2, max_new_tokens=24), **kwargs)


def _of(ports, kind) -> list:
    return [e for e in ports.events if isinstance(e, kind)]


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for inner in group.exceptions for leaf in _leaves(inner)]
    return [group]


BUILD_FAILED = "SandboxBuildError: task {trial}: apt-get exited 100"  # no other trial's end undoes it


def _every_third(ports, trial_id, task_id):
    return BUILD_FAILED if int(trial_id.rsplit("-", 1)[1]) % 3 == 1 else None


def test_a_refused_open_ends_the_train_trial_as_an_infra_failure_and_the_batch_refills(world):
    config = StalenessConfig(batch_size=3, oversample=1.0, max_in_flight=3, max_staleness=4)

    async def main():
        ports = FakePorts(world[1], _every_third)
        runner, stats, cycle = _runner(world, ports), BatchStats(), itertools.cycle(world[0])

        async def wait_for_learner(version):
            ports.version = max(ports.version, stats.batches)

        with trio.fail_after(30):
            await run_batches(runner, lambda: next(cycle), config, until=lambda: stats.batches >= 2,
                              wait_for_learner=wait_for_learner, stats=stats)
        return ports, stats

    ports, stats = trio.run(main)
    assert ports.refused >= 2 and stats.batches == 2 and stats.admitted == 6  # refilled: two full batches
    failed = {e.trial_id: e for e in _of(ports, TrialEnded) if e.finish == "infra_error"}
    assert len(failed) == ports.refused
    for ending in failed.values():
        assert ending.infra_error.startswith(f"{SANDBOX_NOT_OPENED}: SandboxBuildError: task {ending.trial_id}")
        assert ending.turns == 0
    # never verified, scored, decided or trained on
    touched = {e.trial_id for kind in (VerifierResult, StalenessDecision, TrajectoryAssembled) for e in _of(ports, kind)}
    assert not touched & set(failed)
    assert not ports.open, "every sandbox opened is closed"
    audit = audit_events((str(i), e) for i, e in enumerate(ports.events))
    assert audit.trials_unaccounted == 0 and audit.trials_final_twice == 0, audit.to_json()
    assert audit.final_states["failed"] == len(failed) and audit.final_states["admit"] == 6, audit.to_json()
    assert trial_endings((str(i), e) for i, e in enumerate(ports.events))["finishes"]["train"]["infra_error"] == len(
        failed)


def test_an_eval_pass_leaves_a_refused_attempt_out_of_its_scored_trials(world):
    refused_task = sorted(world[0])[0]

    async def main():
        ports = FakePorts(world[1], lambda ports, trial_id, task_id: BUILD_FAILED if task_id == refused_task else None)
        result = await run_eval(_runner(world, ports), sorted(world[0]), label="before", concurrency=2)
        return ports, result

    ports, result = trio.run(main)
    assert isinstance(result, EvalResult) and result.n == len(world[0]) - 1 and result.resolved == result.n
    [failed] = [e for e in _of(ports, TrialEnded) if e.finish == "infra_error"]
    issued = {e.trial_id: e.task_id for e in _of(ports, TrialIssued)}
    assert issued[failed.trial_id] == refused_task and failed.infra_error.startswith(SANDBOX_NOT_OPENED)
    assert failed.trial_id not in {e.trial_id for e in _of(ports, VerifierResult)}


def test_when_every_open_fails_the_run_stops_with_the_sandboxes_error(world):
    config = StalenessConfig(batch_size=4, oversample=1.0, max_in_flight=4)

    async def main():
        ports = FakePorts(world[1], lambda *_: BUILD_FAILED)
        runner, cycle = _runner(world, ports, max_open_failures=6), itertools.cycle(world[0])
        runner.opens.backoff_s = 0.01

        async def wait_for_learner(version):
            pass

        with trio.fail_after(30):  # not forever: a bounded number of trials, then the error
            try:
                await run_batches(runner, lambda: next(cycle), config, until=lambda: False,
                                  wait_for_learner=wait_for_learner)
            except BaseExceptionGroup as group:
                return ports, _leaves(group)
        raise AssertionError("run_batches returned")

    ports, errors = trio.run(main)
    [error] = errors  # raised once
    assert isinstance(error, SandboxesUnavailable), errors
    message = str(error)
    assert "sandbox opens in a row failed and none is open" in message
    assert "SandboxBuildError: task" in message and "disk_total_mb" in message and "--resume" in message
    issued = _of(ports, TrialIssued)
    assert 6 <= ports.refused <= len(issued) <= 12, (ports.refused, len(issued))
    assert not _of(ports, VerifierResult) and not _of(ports, StalenessDecision)


def test_an_eval_pass_where_every_open_fails_stops_too(world):
    async def main():
        ports = FakePorts(world[1], lambda *_: BUILD_FAILED)
        runner = _runner(world, ports, max_open_failures=3)
        try:
            await run_eval(runner, sorted(world[0]) * 3, label="before", concurrency=1)
        except BaseExceptionGroup as group:
            return ports, _leaves(group)
        raise AssertionError("run_eval returned")

    ports, errors = trio.run(main)
    # the third refusal ends the pass; an open already sent by then is answered first (opens are shielded)
    assert [type(e) for e in errors] == [SandboxesUnavailable] and 3 <= ports.refused <= 4
    assert not _of(ports, EvalResult)


def _two_at_most(ports, trial_id, task_id):
    return REFUSED if len(ports.open) >= 2 else None


def test_trials_refused_while_others_hold_the_disk_wait_for_their_share_throttled(world):
    """A disk budget of two sandboxes under six trials in flight: the other four are refused until one closes. A
    refused trial asks again (after a backoff, one at a time) instead of ending: the batches fill, no trial ends as an
    infrastructure failure, and the refusals stay few (without the throttle: one per round trip, thousands)."""
    config = StalenessConfig(batch_size=4, oversample=0.5, max_in_flight=6, max_staleness=8)

    async def main():
        ports = FakePorts(world[1], _two_at_most, turn_s=0.05)
        runner, stats, cycle = _runner(world, ports, max_open_failures=2), BatchStats(), itertools.cycle(world[0])
        runner.opens = SandboxOpens(2, backoff_s=0.01, backoff_max_s=0.04)

        async def wait_for_learner(version):
            ports.version = max(ports.version, stats.batches)

        with trio.fail_after(60):
            await run_batches(runner, lambda: next(cycle), config, until=lambda: stats.batches >= 2,
                              wait_for_learner=wait_for_learner, stats=stats)
        return ports, stats, runner

    ports, stats, runner = trio.run(main)
    assert stats.batches == 2 and ports.refused > 0
    assert ports.refused < 150, ports.refused
    assert runner.opens.failed == ports.refused
    ended = _of(ports, TrialEnded)
    assert ended and not [e for e in ended if e.finish == "infra_error"], ended
    audit = audit_events((str(i), e) for i, e in enumerate(ports.events))
    assert audit.trials_unaccounted == 0 and audit.final_states.get("failed", 0) == 0, audit.to_json()


def test_an_eval_pass_under_a_full_disk_budget_keeps_every_task(world):
    """Eval trials refused for a share others hold wait for it: every task of the pass is scored (n), none is left
    out as an infrastructure failure (which would unpair the pass from another policy's)."""
    tasks = sorted(world[0]) * 2

    async def main():
        ports = FakePorts(world[1], _two_at_most, turn_s=0.05)
        runner = _runner(world, ports)
        runner.opens = SandboxOpens(2, backoff_s=0.01, backoff_max_s=0.04)
        with trio.fail_after(60):
            await run_eval(runner, tasks, label="before", concurrency=4)
        return ports

    ports = trio.run(main)
    [result] = _of(ports, EvalResult)
    assert ports.refused > 0 and result.n == len(tasks), (ports.refused, result)
    assert not [e for e in _of(ports, TrialEnded) if e.finish == "infra_error"]


def test_a_refusal_others_cannot_undo_ends_the_trial_at_once(world):
    """An image that cannot be built is not waited for, even while other sandboxes are held: that trial ends as an
    infrastructure failure and the others go on."""

    def build_fails(ports, trial_id, task_id):
        return "SandboxBuildError: apt-get exited 100" if task_id == sorted(world[0])[0] else None

    async def main():
        ports = FakePorts(world[1], build_fails, turn_s=0.05)
        runner = _runner(world, ports)
        runner.opens = SandboxOpens(5, backoff_s=0.01, backoff_max_s=0.04)
        with trio.fail_after(60):
            await run_eval(runner, sorted(world[0]), label="before", concurrency=4)
        return ports

    ports = trio.run(main)
    [result] = _of(ports, EvalResult)
    assert ports.refused == 1 and result.n == len(world[0]) - 1, (ports.refused, result)


def test_the_sandbox_actor_marks_its_infrastructures_failures_and_the_controller_reads_the_mark():
    """SandboxActor.open answers an infra failure of any SandboxInfraError subclass with one marked ErrorReply;
    ActorPorts.open_sandbox turns that reply, and only it, into SandboxUnavailable."""

    class Backend:
        def __init__(self, error):
            self.error = error

        def open(self, task, trial_id):
            raise self.error

    def actor(error):
        tasks = SimpleNamespace(get=lambda task_id: {"t": "task"}[task_id])  # KeyError for an unknown task
        return SimpleNamespace(sandboxes={}, taken_over=set(), tasks=tasks, backend=Backend(error),
                               logger=structlog.get_logger())

    @trio_test
    async def opened(error, task_id="t"):
        return await SandboxActor.open(actor(error), SandboxOpen(trial_id="a", task_id=task_id))

    for error in (DiskBudgetExceeded("trial a refused: 0 MB left"), SandboxBuildError("task t: apt-get exited 100"),
                  SandboxInfraError("bubblewrap failed")):
        reply = opened(error)
        assert isinstance(reply, ErrorReply) and reply.error == "SandboxInfraError", reply
        assert reply.detail == f"{type(error).__name__}: {error}"
    with pytest.raises(KeyError):  # not the infrastructure's: the handler's usual ErrorReply ("KeyError")
        opened(DiskBudgetExceeded("never reached"), task_id="no-such-task")

    def ports(error: str):
        async def call_bulk(request):
            raise RemoteError("sandbox-0", "sandbox_open", error, "DiskBudgetExceeded: trial a refused")

        peer = SimpleNamespace(call_bulk=call_bulk)
        fake = SimpleNamespace(config=SimpleNamespace(transport=SimpleNamespace(control_deadline_s=5.0)),
                               peer=lambda role: peer)
        return ActorPorts(fake, None, 0)

    @trio_test
    async def open_with(error: str):
        await ports(error).open_sandbox("a", "t")

    with pytest.raises(SandboxUnavailable, match="^DiskBudgetExceeded: trial a refused$"):
        open_with("SandboxInfraError")
    for other in ("KeyError", "Cancelled", "ValueError"):
        with pytest.raises(RemoteError, match=other):
            open_with(other)
