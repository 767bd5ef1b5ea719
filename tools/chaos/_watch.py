"""What ``t1-actor chaos`` reads from the campaign's log while it runs: the phase, each role's current process,
the trials issued and the learner steps taken."""

from __future__ import annotations

import time
from pathlib import Path

from t1_actors.backends._sandbox.owner import alive

PHASES = ("eval", "warm-up", "RL", "final eval")
SETTLE_S = 2.0  # a fault hits a process that has been serving this long (past its setup, doing work)


class _Watch:
    """What the log says now: the phase, and each role's current process (pid, and since when it serves)."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.cursor = None
        self.phase = PHASES[0]
        self.done = False  # the RL policy's last eval pass is logged: the campaign is finishing
        self.spawned: dict[str, int] = {}  # role -> the pid the supervisor spawned last
        self.serving: dict[int, float] = {}  # pid -> monotonic time its "serving" event was first seen
        self.phase_started = time.monotonic()
        self.rl_started = False
        self.trial_ids: list[str] = []
        self.learner_steps = 0

    def poll(self) -> None:
        from storage import EventLog  # noqa: PLC0415 - keeps chaos --help free of the log (storage: 0.6 s importtime)

        if self.cursor is None:
            if not self.log_dir.exists():
                return
            try:
                self.cursor = EventLog.open(self.log_dir).cursor(
                    kinds=["actor_lifecycle", "trial_issued", "eval_result", "learner_step"])
            except Exception:  # the campaign has not created it yet
                return
        for _, event in self.cursor.poll():
            if event.kind == "actor_lifecycle":
                # the supervisor's spawn: "started" (reason "process spawned"; the actor's own "started" says
                # "serving") or "restarted" (any reason). Matching a restart by its reason missed every
                # restarted process once the supervisor stopped writing one: no role could be hit twice.
                if event.state == "restarted" or (event.state == "started" and event.reason == "process spawned"):
                    self.spawned[event.role] = event.pid
                elif event.state == "started" and event.reason == "serving":
                    self.serving.setdefault(event.pid, time.monotonic())
            elif event.kind == "trial_issued":
                self.trial_ids.append(event.trial_id)
                phase = {"warmup": "warm-up", "train": "RL"}.get(event.split)
                if event.split == "train":
                    self.rl_started = True
                if event.split == "eval" and self.rl_started:
                    phase = "final eval"
                if phase is not None and PHASES.index(phase) > PHASES.index(self.phase):
                    self.phase, self.phase_started = phase, time.monotonic()
            elif event.kind == "learner_step":
                self.rl_started = True
                self.learner_steps += 1
            elif event.kind == "eval_result" and event.last and (event.label == "after"
                                                                 or event.label.startswith("rl_")):
                self.done = True

    def live_pid(self, role: str) -> int | None:
        """The role's current process, once it has served SETTLE_S; None while it starts or restarts."""
        pid = self.spawned.get(role)
        if pid is None or pid not in self.serving or time.monotonic() - self.serving[pid] < SETTLE_S:
            return None
        return pid if alive(pid) else None
