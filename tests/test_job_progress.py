"""A campaign's progress lines when its output is no terminal (a run writing to a log file): each line whole,
on one line, whatever the console's width, so the PPO steps keep their EV and the evals their CI."""

from __future__ import annotations

import io
import re

import trio
from rich.console import Console
from rich.progress import Progress

from schemas import CriticWarmup, EvalResult, LearnerStep
from storage import EventLog
from t1_actors.job.progress import _follow, _Milestones, say

STAMP = r"\[\d\d:\d\d:\d\d\] "


def _file_console() -> tuple[Console, io.StringIO]:
    """A console writing to a file, as a run's redirected stderr is: not a terminal, 80 columns."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    assert not console.is_terminal and console.width == 80  # the width the lines used to be cut at
    return console, out


def test_a_line_longer_than_the_console_is_printed_whole_on_one_line():
    console, out = _file_console()
    text = "4/5 PPO steps: 3/5 (60%) step 2 v3 loss 0.123 EV 0.45 " + "figure " * 20
    say(console, text)
    assert len(text) > 2 * console.width
    assert re.fullmatch(STAMP + re.escape(text) + "\n", out.getvalue()), out.getvalue()


def test_milestones_print_every_step_line_whole_and_none_on_a_terminal():
    console, out = _file_console()
    lines = _Milestones(console, "4/5 PPO steps", 4, every=0.25)
    for version in range(1, 5):
        lines(version, f"step {version - 1} v{version} loss 0.123 EV -0.{version}5 " + "x" * 60)
    printed = out.getvalue().splitlines()
    assert len(printed) == 4
    for version, line in enumerate(printed, 1):
        assert re.fullmatch(STAMP + rf"4/5 PPO steps: {version}/4 \({version * 25}%\) step {version - 1} "
                            rf"v{version} loss 0\.123 EV -0\.{version}5 x{{60}}", line), line
    terminal = io.StringIO()
    bars_shown = _Milestones(Console(file=terminal, force_terminal=True), "4/5 PPO steps", 4, every=0.25)
    bars_shown(4, "EV 0.9")
    assert terminal.getvalue() == ""  # a terminal has the progress bars instead


def test_the_followed_log_prints_each_eval_probe_and_the_critic_warm_up_whole(tmp_path):
    log = EventLog.open(tmp_path / "log", create=True)
    with log.writer("campaign") as writer:
        writer.append(EvalResult(label="before", policy_version=0, n=160, resolved=17, mean_reward=0.1234,
                                 ci_low=0.0671, ci_high=0.1658))
        writer.append(CriticWarmup(epochs=1, trajectories=96, explained_variance_before=-31.25,
                                   explained_variance_after=0.4321))
        writer.append(LearnerStep(step=0, policy_version=1, trials=["t0"],
                                  metrics={"policy_loss": 0.0123, "explained_variance": 0.5678}))
        writer.append(EvalResult(label="probe_s1", policy_version=1, n=56, resolved=9, mean_reward=0.0981,
                                 ci_low=0.0871, ci_high=0.2786, temperature=1.0))
        writer.append(EvalResult(label="after", policy_version=1, n=160, resolved=23, mean_reward=0.1567,
                                 ci_low=0.0957, ci_high=0.2086, last=True))
        writer.commit()
    console, out = _file_console()
    steps, steps_out = _file_console()

    async def follow() -> None:
        with trio.fail_after(30):  # _follow returns at the RL policy's last eval pass
            await _follow(log, bar, job, _Milestones(steps, "4/5 PPO steps", 1))

    with Progress(console=console) as bar:
        job = bar.add_task("actors", total=None, phase="eval before", info="")
        trio.run(follow)
    lines = [line for line in out.getvalue().splitlines() if re.match(STAMP, line)]
    assert [re.sub(STAMP, "", line) for line in lines] == [
        "eval before: 17/160 resolved (10.6%, CI 6.7%-16.6%), mean reward 0.123",
        "critic warm-up: EV -31.25 -> 0.43 on 96 trajectories",
        "probe s1: 9/56 resolved (16.1%, CI 8.7%-27.9%), mean reward 0.098, policy v1",  # the validation probe
        "eval after: 23/160 resolved (14.4%, CI 9.6%-20.9%), mean reward 0.157",
    ]
    assert re.fullmatch(STAMP + r"4/5 PPO steps: 1/1 \(100%\) step 0 v1 loss 0\.012 EV 0\.57\n",
                        steps_out.getvalue()), steps_out.getvalue()
