"""What summary.json says about skill versus sharpening, folded from the log's eval passes (``t1_actors.eval.protocol``).

Keys, beside today's ``eval_before`` / ``eval_after`` / ``eval_change``:
``eval_sft_best`` / ``eval_rl_best`` (the eval shape plus ``temperature``), ``eval_change_vs_sft_best``
(the RL policy at its best temperature against the SFT policy at its best, paired task by task),
``eval_change_vs_sft_best_long`` (the same over the eval tasks of the long families only; None without any),
``temperature_grid`` {"sft": {T: rate}, "rl": {T: rate}} on the validation split, ``pass_at_k``
{"sft": {k: rate}, "rl": {k: rate}}, ``per_position`` (composite tasks: the share of attempts whose i-th
requirement passes, at each policy's best temperature), ``turns`` (mean assistant turns per eval trial of each
policy's run-temperature and best passes; summary.json's ``turns`` adds before_rl / after_rl / per_step beside
them: ``t1_actors.job.dynamics``) and ``recipe``. A key whose passes are not in the log is None.

With ``[eval] sft_passes = "warm_start"`` the SFT policy's passes are read from the warm-start run's log
(``sft_log``) and everything else from this run's: ``EvalPasses`` is that union, one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas import EvalResult
from t1_actors.eval.protocol import AT_RUN_TEMPERATURE, POLICIES, label
from t1_actors.stats import first_attempts, labelled_attempts, paired_change, pass_at_k_curve, per_position_rates
from t1_actors.tasks.synthetic import is_long_task


def scored(e: EvalResult | None) -> dict[str, Any] | None:
    """One eval pass in summary.json's shape."""
    if e is None:
        return None
    return {"resolved": e.resolved, "n": e.n, "resolved_rate": e.resolved / e.n if e.n else 0.0,
            "mean_reward": e.mean_reward, "ci95": [e.ci_low, e.ci_high], "policy_version": e.policy_version,
            "per_family": e.per_family}


def best_label(evals: dict[str, EvalResult], policy: str) -> str | None:
    """The eval pass of ``policy`` at its best temperature: ``<policy>_best``, or the run-temperature pass
    when the best was the run's (the protocol does not repeat that draw)."""
    for name in (label(policy, "best"), label(policy, "run")):
        if name in evals:
            return name
    return None


def is_sft_label(name: str) -> bool:
    """Whether an eval pass's label names a pass of the SFT policy (``sft_*`` or ``before``)."""
    return name.startswith("sft_") or name == AT_RUN_TEMPERATURE["sft"]


@dataclass(frozen=True)
class EvalPasses:
    """The eval passes of a run (label -> ``EvalResult``) and their attempts (label -> attempts)."""

    results: dict[str, EvalResult]
    attempts: dict[str, list]

    @classmethod
    def read(cls, log, sft_log=None) -> EvalPasses:
        """From ``log``; with ``sft_log``, the SFT policy's passes from there instead (none from ``log``)."""
        def passes(source, keep) -> tuple[dict, dict]:
            results = {e.label: e for _, e in source.events(kinds=["eval_result"])
                       if isinstance(e, EvalResult) and keep(e.label)}
            attempts = labelled_attempts(e for _, e in source.events(kinds=["trial_issued", "verifier_result"]))
            return results, {name: a for name, a in attempts.items() if keep(name)}

        if sft_log is None:
            return cls(*passes(log, lambda name: True))
        results, attempts = passes(log, lambda name: not is_sft_label(name))
        sft_results, sft_attempts = passes(sft_log, is_sft_label)
        return cls({**sft_results, **results}, {**sft_attempts, **attempts})


def skill_report(passes: EvalPasses, *, run_temperature: float, recipe: dict[str, Any]) -> dict[str, Any]:
    evals, attempts = passes.results, passes.attempts
    report: dict[str, Any] = {"recipe": recipe}
    best = {policy: best_label(evals, policy) for policy in POLICIES}
    for policy in POLICIES:
        name = best[policy]
        entry = scored(evals.get(name)) if name else None
        if entry is not None:
            entry["temperature"] = evals[name].temperature or run_temperature
            entry["label"] = name
        report[f"eval_{policy}_best"] = entry
    report["eval_change_vs_sft_best"] = report["eval_change_vs_sft_best_long"] = None
    if best["sft"] in attempts and best["rl"] in attempts:
        sft, rl = first_attempts(attempts[best["sft"]]), first_attempts(attempts[best["rl"]])
        report["eval_change_vs_sft_best"] = paired_change(sft, rl).as_dict()
        long_sft, long_rl = ({t: o for t, o in outcomes.items() if is_long_task(t)} for outcomes in (sft, rl))
        if set(long_sft) & set(long_rl):
            report["eval_change_vs_sft_best_long"] = paired_change(long_sft, long_rl).as_dict()
    prefix = {policy: f"{policy}_val_T" for policy in POLICIES}
    report["temperature_grid"] = {
        policy: {name[len(prefix[policy]):]: e.resolved / max(e.n, 1) for name, e in sorted(evals.items())
                 if name.startswith(prefix[policy])} or None for policy in POLICIES}
    report["pass_at_k"] = {policy: pass_at_k_curve(attempts.get(label(policy, "passk"), [])) or None
                           for policy in POLICIES}
    report["per_position"] = {policy: per_position_rates(attempts.get(best[policy], [])) or None
                              for policy in POLICIES}
    report["turns"] = {policy: {name: evals[name].mean_turns for name in (AT_RUN_TEMPERATURE[policy], best[policy])
                                if name in evals} or None for policy in POLICIES}
    return report
