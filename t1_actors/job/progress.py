"""What a campaign shows while it runs: progress bars on a terminal, a plain line every few percent
otherwise (a run writing to a file), and the actor phase followed from the log until the RL policy's
last eval pass. Off a terminal every line is printed whole, on one line: a log file keeps each line's
every figure (a PPO step's EV, an eval's CI) where one grep finds it."""

from __future__ import annotations

import time

import trio
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from schemas import EvalResult, LearnerStep, StalenessDecision, VerifierResult
from storage import EventLog
from storage.config import StorageConfig
from t1_actors.eval.protocol import probe_step
from t1_actors.job.config import CampaignConfig
from t1_actors.job.sft import warm_start
from t1_actors.runtime.supervisor import Supervisor


def say(console, text: str) -> None:
    """One progress line. On a terminal, ``console.log`` (the time beside it, wrapped to the window).
    Anywhere else (a file, a pipe) the line whole, its time in front: never wrapped or cut at the console's
    width (80 columns when rich cannot measure one), markup and highlighting off, so the text arrives as
    written."""
    if console.is_terminal:
        console.log(text)
    else:
        console.print(f"[{time.strftime('%H:%M:%S')}] {text}", soft_wrap=True, markup=False, highlight=False)


class _Milestones:
    """Plain progress lines for a console that is no terminal (a run writing to a file shows no bars):
    one line each time ``done / total`` passes another ``every`` (a tenth by default); none when total = 0."""

    def __init__(self, console, what: str, total: int, every: float = 0.1):
        self.console, self.what, self.total, self.every, self.next = console, what, total, every, every

    def __call__(self, done: int, info: str = "") -> None:
        if self.console.is_terminal or not self.total or done / self.total < self.next:
            return
        while done / self.total >= self.next:
            self.next += self.every
        say(self.console, f"{self.what}: {done}/{self.total} ({done / self.total:.0%}) {info}".rstrip())


def sft_with_progress(config, tasks, tokenizer, campaign, console):

    with Progress(TextColumn("[bold]3/5 {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False, console=console) as bar:
        pool = bar.add_task("oracle pool (executed oracle chats)", total=len(tasks.sft), info="")
        by_steps = campaign.sft_steps is not None
        total = campaign.sft_short_steps + campaign.sft_steps if by_steps else int(campaign.sft_seconds)
        sft = bar.add_task(f"SFT warm start ({'steps' if by_steps else 'seconds'})", total=total, info="", start=False)
        start = [0.0]
        pool_lines = _Milestones(console, "3/5 oracle pool", len(tasks.sft))
        sft_lines = _Milestones(console, f"3/5 SFT ({'steps' if by_steps else 'seconds'})", total, every=0.05)

        def pool_progress(done: int, total: int) -> None:
            bar.update(pool, completed=done)
            pool_lines(done)

        def progress(step: int, loss: float) -> None:
            if not start[0]:
                start[0] = time.monotonic()
                bar.start_task(sft)
            done = step if by_steps else min(int(time.monotonic() - start[0]), total)
            bar.update(sft, completed=done, info=f"step {step} loss {loss:.3f}")
            sft_lines(done, f"loss {loss:.3f}")

        return warm_start(config, tasks, tokenizer, pool_progress=pool_progress, progress=progress)


async def run_actors(config, campaign: CampaignConfig, console, hosts: set[str] | None = None) -> None:
    """Phase 4: the six actors under the supervisor until the staleness controller's final eval is logged.

    ``hosts``: the ``host`` names that are this machine (``t1-actor launch --host``; default its own names);
    actors of other hosts are started there (``t1-actor ROLE --config RUN/config.resolved.json --name N``)
    and only watched from here.

    SIGINT/SIGTERM reach the supervisor, which stops every actor cleanly; the summary is still written
    from whatever the log holds.
    """
    log = EventLog.open(config.log_location(), config=config.section(StorageConfig))
    # A deadline on the whole phase, so a wedged actor cannot hang the job: RL's bound, the last steps,
    # start-ups, and an hour for the eval protocol's passes (the default run's take ~15 min).
    budget = campaign.rl_seconds + campaign.finish_timeout_s + 2 * campaign.actor_ready_timeout_s + 3600
    supervisor = Supervisor(config, hosts=hosts)
    async with trio.open_nursery() as nursery:

        async def supervise(task_status=trio.TASK_STATUS_IGNORED) -> None:
            await supervisor.run(handle_signals=True, task_status=task_status)
            nursery.cancel_scope.cancel()  # stopped by a signal or a failure: nothing left to follow

        with trio.fail_after(campaign.actor_ready_timeout_s * 3):
            await nursery.start(supervise)
        say(console, f"actors up: {', '.join(sorted(supervisor.actors))}")
        try:
            with Progress(TextColumn("[bold]4/5 {task.fields[phase]}"), BarColumn(),
                          TextColumn("{task.fields[info]}")) as bar:
                job = bar.add_task("actors", total=None, phase="eval before", info="")
                with trio.fail_after(budget):
                    await _follow(log, bar, job, _Milestones(console, "4/5 PPO steps", campaign.rl_steps or 0,
                                                             every=0.05))
        finally:
            with trio.CancelScope(shield=True):
                await supervisor.shutdown("campaign finished")


def eval_line(event: EvalResult) -> str:
    """One eval pass's line: ``eval after: 9/56 resolved (...)``; a validation probe's ``probe s10: 9/56 resolved
    (..., policy v10)``."""
    figures = (f"{event.resolved}/{event.n} resolved ({event.resolved / max(event.n, 1):.1%}, "
               f"CI {event.ci_low:.1%}-{event.ci_high:.1%}), mean reward {event.mean_reward:.3f}")
    step = probe_step(event.label)
    if step is not None:
        return f"probe s{step}: {figures}, policy v{event.policy_version}"
    return f"eval {event.label}: {figures}"


async def _follow(log, bar, job, step_lines) -> None:
    """Show the campaign's progress from the log until the final eval appears."""
    cursor = log.cursor(kinds=["eval_result", "learner_step", "staleness_decision", "verifier_result",
                               "critic_warmup"])
    verified = admitted = 0
    phase, info = "eval before", ""
    while True:
        for _, event in await cursor.apoll():
            if isinstance(event, VerifierResult):
                verified += 1
            elif isinstance(event, StalenessDecision) and event.decision == "admit":
                admitted += 1
                phase = "asynchronous PPO"
            elif isinstance(event, LearnerStep):
                m = event.metrics
                info = (f"step {event.step} v{event.policy_version} loss {m.get('policy_loss', float('nan')):.3f} "
                        f"EV {m.get('explained_variance', float('nan')):.2f}")
                step_lines(event.policy_version, info)
            elif isinstance(event, EvalResult):
                say(bar.console, eval_line(event))
                if event.last and (event.label == "after" or event.label.startswith("rl_")):
                    return
                if probe_step(event.label) is None:  # a probe is one pause inside PPO
                    phase = "warm-up + PPO"
            elif event.kind == "critic_warmup":
                say(bar.console, f"critic warm-up: EV {event.explained_variance_before:.2f} -> "
                                 f"{event.explained_variance_after:.2f} on {event.trajectories} trajectories")
        bar.update(job, phase=phase, info=f"{verified} trials verified, {admitted} admitted {info}")
        await trio.sleep(0.5)
