"""Phase 5 of the campaign: ``RUN/summary.json`` and the plots, both read from the log alone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from storage import EventLog
from storage.config import StorageConfig
from t1_actors.backends.sampler_backend import SamplerConfig
from t1_actors.eval.skills import EvalPasses, scored, skill_report
from t1_actors.job.dynamics import DYNAMICS_KINDS, Dynamics
from t1_actors.job.local_sglang import sampler_engine
from t1_actors.job.progress import say
from t1_actors.job.sft import sft_passes_log
from t1_actors.rollout.admission import StalenessConfig
from t1_actors.schedule import CampaignConfig
from t1_actors.stats import eval_outcomes, first_attempts, paired_change
from t1_actors.train.ppo import PPOConfig
from t1_actors.train.reward import REWARD_SCALE
from t1_actors.verify.engine import VerifierConfig


def code_version() -> dict[str, Any] | None:
    """The commit the run's code came from (and whether the tree had changes): which code a figure is of."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None  # not a git checkout (an installed wheel)
    return {"commit": commit, "dirty": bool(dirty)}


def write_summary(run_dir: Path, *, eval_before, eval_after, actors: list[str], counts: dict[str, int],
                  extra: dict[str, Any]) -> dict[str, Any]:

    summary = {"eval_before": scored(eval_before), "eval_after": scored(eval_after), "actors": actors,
               "events": counts, **extra}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary


def eval_change(log, sft_log=None, passes=None) -> dict[str, Any] | None:
    """The paired before/after comparison over the eval tasks (None until both evals are in the log).

    Eval trials carry the label of their pass (``before`` / ``after``); in logs written before labels
    existed they are told apart by the learner's version they were issued at (version 0 before, any later
    one after). ``sft_log``: the log the SFT policy's passes are read from (``[eval] sft_passes``);
    ``passes``: those logs' ``EvalPasses`` when the caller has read them already."""
    attempts = (passes or EvalPasses.read(log, sft_log)).attempts
    if "before" in attempts and "after" in attempts:
        return paired_change(first_attempts(attempts["before"]), first_attempts(attempts["after"])).as_dict()
    if attempts or sft_log is not None:
        return None
    by_version = eval_outcomes(e for _, e in log.events(kinds=["trial_issued", "verifier_result"]))
    versions = sorted(by_version)
    if len(versions) < 2:
        return None
    after: dict = {}
    for version in versions[1:]:
        after.update(by_version[version])
    return paired_change(by_version[versions[0]], after).as_dict()


def dynamics_line(summary: dict[str, Any]) -> str:
    """One console line: turns and tokens per trajectory before and after RL, and over the learner's steps."""
    def mean(key: str, name: str) -> str:
        q = summary[key].get(name)
        return f"{q['mean']:.3g}" if q else "-"

    steps = [s for s in summary["tokens"]["per_step"] if s.get("mean") is not None]
    over = f"; tokens over {len(steps)} steps {steps[0]['mean']:.3g} -> {steps[-1]['mean']:.3g}" if steps else ""
    return (f"per trajectory, before -> after RL: turns {mean('turns', 'before_rl')} -> {mean('turns', 'after_rl')}, "
            f"tokens {mean('tokens', 'before_rl')} -> {mean('tokens', 'after_rl')}{over}")


def summarise(run_dir: Path, config, *, sft: dict, timings: dict, console, write_report=None,
              code: dict[str, Any] | None = None) -> dict[str, Any]:
    """Phase 5: summary.json and the plots, both from the log alone."""
    log = EventLog.open(config.log_location(), config=config.section(StorageConfig))
    sft_log = sft_passes_log(config)
    passes = EvalPasses.read(log, sft_log)
    evals = passes.results
    counts = log.counts()
    roles = sorted({spec.role for spec in config.actors})
    report: dict[str, Any] = {}
    try:
        report = write_report(run_dir) if write_report is not None else {}
        report.pop("dynamics", None)  # summary.json has them at the top (turns, tokens, per_step, probe)
    except Exception as exc:  # plots must never cost the run its summary
        say(console, f"plots failed: {exc!r}")
    ppo_cfg, staleness = config.section(PPOConfig), config.section(StalenessConfig)
    recipe = {"advantage_estimator": ppo_cfg.advantage_estimator, "group_size": staleness.group_size,
              "actor_params": list(ppo_cfg.actor_params),
              "reward": f"P / {REWARD_SCALE}" if config.section(VerifierConfig).reward == "dense" else "1[P = N]"}
    skill = skill_report(passes, run_temperature=config.section(SamplerConfig).temperature, recipe=recipe)
    skill["kl_rl_sft"] = report.get("kl_rl_sft") if isinstance(report, dict) else None
    dynamics = Dynamics.fold(log.events(kinds=DYNAMICS_KINDS))
    dynamic = dynamics.summary(Dynamics.fold(sft_log.events(kinds=DYNAMICS_KINDS)) if sft_log is not None else None)
    dynamic["turns"] = {**skill.pop("turns"), **dynamic["turns"]}  # beside the eval passes' mean turns (sft, rl)
    summary = write_summary(run_dir, eval_before=evals.get("before"), eval_after=evals.get("after"), actors=roles,
                            counts=counts, extra={"sft": sft, "timings_s": {k: round(v, 1) for k, v in timings.items()},
                                                  "report": report, "eval_change": eval_change(log, sft_log, passes),
                                                  "code": code,
                                                  "sft_passes_from": config.section(CampaignConfig).warm_start_from
                                                  if sft_log is not None else None,
                                                  "sampler_engine": sampler_engine(log), **skill, **dynamic,
                                                  **dynamics.endings.counts(dynamics.endings.split_of)})
    for key in ("finishes", "truncations", "context_edits"):  # nothing is cut or edited silently
        counted = "; ".join(f"{split} " + ", ".join(f"{reason} {n}" for reason, n in by_reason.items())
                            for split, by_reason in summary[key].items() if by_reason)
        say(console, f"{key.replace('_', ' ')}: {counted or 'none'}")
    say(console, dynamics_line(summary))
    before, after, change = summary["eval_before"], summary["eval_after"], summary["eval_change"]
    if before and after:
        say(console, f"eval resolved: {before['resolved_rate']:.1%} -> {after['resolved_rate']:.1%} "
                    f"(n={after['n']}); mean reward {before['mean_reward']:.3f} -> {after['mean_reward']:.3f}")
    if change:
        low, high = change["reward_delta_ci95"]
        say(console, f"paired over {change['tasks']} eval tasks: {change['gained']} newly resolved, {change['lost']} "
                    f"lost (exact McNemar p = {change['mcnemar_p']:.3g}); reward change {change['reward_delta']:+.3f} "
                    f"(95 % CI {low:+.3f} .. {high:+.3f})")
    vs_best = summary.get("eval_change_vs_sft_best")
    if vs_best and summary.get("eval_sft_best") and summary.get("eval_rl_best"):
        s, r = summary["eval_sft_best"], summary["eval_rl_best"]
        low, high = vs_best["reward_delta_ci95"]
        say(console, f"RL at its best T = {r['temperature']:g} vs SFT at its best T = {s['temperature']:g}: "
                    f"{s['resolved_rate']:.1%} -> {r['resolved_rate']:.1%}; {vs_best['gained']} gained, "
                    f"{vs_best['lost']} lost (exact McNemar p = {vs_best['mcnemar_p']:.3g}); reward change "
                    f"{vs_best['reward_delta']:+.3f} (95 % CI {low:+.3f} .. {high:+.3f})")
    if long := summary.get("eval_change_vs_sft_best_long"):
        say(console, f"  on the {long['tasks']} long tasks: {long['resolved_before']} -> {long['resolved_after']} "
                    f"resolved; {long['gained']} gained, {long['lost']} lost (exact McNemar p = "
                    f"{long['mcnemar_p']:.3g}); reward change {long['reward_delta']:+.3f}")
    say(console, f"summary: {run_dir / 'summary.json'}")
    return summary
