"""The report of ``t1-actor ablate`` (``t1_actors.job.ablate``): D/ablation.json and D/ablation.md.

Per arm and seed (the losers included): the headline of ``t1_actors.job.seeds.seed_row`` (the RL policy at its
best temperature against the SFT policy at its best, paired on the eval split: resolved rates, gained / lost,
exact McNemar p, the reward change with its 95 % CI), the critic's explained variance over the learner steps
(first, min, last; the warm-up's before and after), the mean training-inference logprob gap, where the SFT
passes came from and the commit of the code that ran it.

Then every arm against the first (the arm the claim under test favours): per seed, paired on the same eval tasks
drawn with common random numbers (each arm's RL policy at its best temperature), and pooled over seeds, (seed,
task) pairs, judged by ``decision_rule``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from schemas import CriticWarmup, LearnerStep
from storage import EventLog
from t1_actors.job.seeds import seed_row
from t1_actors.layout import has_log, log_location
from t1_actors.stats import Outcome, first_attempts, labelled_attempts, mcnemar_exact_p, paired_mean_ci

ALPHA = 0.05  # the rule's significance level
MARGIN = 0.02  # +-2 points of resolved rate: a difference inside it is no difference worth the claim
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive at this size"


def decision_rule(first_only: int, arm_only: int, diff_ci95: tuple[float, float], *, alpha: float = ALPHA,
                  margin: float = MARGIN) -> str:
    """The verdict on a claim "the first arm resolves more eval tasks than this arm", stated before the runs
    (issue 36, item 4): pooled exact McNemar over (seed, task) pairs between the two arms at their best
    temperatures (``first_only``: pairs only the first arm resolved; ``arm_only``: only this arm);

    - "reproduced" when p < alpha (0.05) in the claim's direction (first_only > arm_only);
    - "not reproduced" when p < alpha the other way, or when the 95 % CI of the resolved-rate difference
      (first - arm, ``diff_ci95``) lies within +-margin (2 points): no difference of the claimed kind;
    - "inconclusive at this size" otherwise.
    """
    p = mcnemar_exact_p(first_only, arm_only)
    if p < alpha and first_only > arm_only:
        return REPRODUCED
    low, high = diff_ci95
    if (p < alpha and arm_only > first_only) or (-margin <= low and high <= margin):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def paired_arms(first: dict[str, Outcome], arm: dict[str, Outcome]) -> list[tuple[Outcome, Outcome]]:
    """The (first arm, this arm) outcomes of every eval task both evaluated, in task order."""
    return [(first[task], arm[task]) for task in sorted(set(first) & set(arm))]


def compare_arms(pairs: list[tuple[Outcome, Outcome]]) -> dict[str, Any]:
    """Two arms over paired outcomes (one seed's tasks, or every seed's (seed, task) pairs): resolved counts,
    discordant pairs, exact McNemar p, and the first-minus-arm differences of resolved rate and reward with their
    95 % CIs (``paired_mean_ci``)."""
    if not pairs:
        return {"pairs": 0}
    first_only = sum(a.resolved and not b.resolved for a, b in pairs)
    arm_only = sum(b.resolved and not a.resolved for a, b in pairs)
    rate, rate_half = paired_mean_ci([float(a.resolved) - float(b.resolved) for a, b in pairs])
    reward, reward_half = paired_mean_ci([a.reward - b.reward for a, b in pairs])
    return {"pairs": len(pairs), "first_resolved": sum(a.resolved for a, _ in pairs),
            "arm_resolved": sum(b.resolved for _, b in pairs), "first_only": first_only, "arm_only": arm_only,
            "mcnemar_p": mcnemar_exact_p(first_only, arm_only), "resolved_diff": rate,
            "resolved_diff_ci95": [rate - rate_half, rate + rate_half], "reward_diff": reward,
            "reward_diff_ci95": [reward - reward_half, reward + reward_half]}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _defined(value: float | None) -> float | None:
    """None for NaN: explained variance is undefined when a step's returns have no variance (every reward 0)."""
    return None if value is None or math.isnan(value) else value


def read_run(run_dir: Path, label: str | None) -> tuple[dict[str, Any], dict[str, Outcome]]:
    """From a run's log: the learner's dynamics (explained variance per step: first, min, last; the critic
    warm-up's before / after; the mean logprob gap of what it trained on, and each gap metric's mean) and the
    outcomes of its eval pass ``label`` (task -> sample 0's outcome)."""
    if not has_log(run_dir):
        return {}, {}
    log = EventLog.open(log_location(run_dir))
    steps, warmup, scored = [], None, []
    for _, event in log.events(kinds=["learner_step", "critic_warmup", "trial_issued", "verifier_result"]):
        if isinstance(event, LearnerStep):
            steps.append(event)
        elif isinstance(event, CriticWarmup):
            warmup = [event.explained_variance_before, event.explained_variance_after]
        else:
            scored.append(event)
    steps.sort(key=lambda e: e.step)
    ev = [_defined(e.metrics["explained_variance"]) for e in steps if "explained_variance" in e.metrics]
    defined = [v for v in ev if v is not None]
    trained = [e.metrics.get("logprob_gap_r3" if e.metrics.get("r3", 1.0) else "logprob_gap_no_r3") for e in steps]
    dynamics = {"learner_steps": len(steps), "ev_first": ev[0] if ev else None,
                "ev_min": min(defined) if defined else None, "ev_last": ev[-1] if ev else None,
                "ev_undefined_steps": len(ev) - len(defined),
                "critic_warmup_ev": [_defined(v) for v in warmup] if warmup else None,
                "logprob_gap": _mean([g for g in trained if g is not None]),
                **{f"mean_{key}": _mean([e.metrics[key] for e in steps if key in e.metrics])
                   for key in ("logprob_gap_r3", "logprob_gap_no_r3")}}
    attempts = labelled_attempts(scored).get(label, []) if label else []
    return dynamics, first_attempts(attempts)


def play_row(summary: dict[str, Any]) -> dict[str, Any]:
    """How a run's trials played, from its summary.json (None where it lacks the key): mean turns and tokens per
    trajectory in the paired eval passes before and after RL, RL's train trials' finishes by reason and context
    edits by strategy, and the long tasks' resolved counts at SFT's best and RL's best temperature."""
    def means(key: str) -> list[float | None] | None:
        q = summary.get(key)
        return [(q.get(when) or {}).get("mean") for when in ("before_rl", "after_rl")] if isinstance(q, dict) else None

    long = summary.get("eval_change_vs_sft_best_long")
    return {"turns": means("turns"), "tokens": means("tokens"),
            "train_finishes": (summary.get("finishes") or {}).get("train", {}),
            "train_context_edits": (summary.get("context_edits") or {}).get("train", {}),
            "long_resolved": [long["resolved_before"], long["resolved_after"], long["tasks"]] if long else None}


def run_rows(runs) -> tuple[list[dict[str, Any]], dict[tuple[str, int], dict[str, Outcome]]]:
    """One row per planned run (``PlannedRun``) and the RL-best outcomes of each finished arm run by (arm, seed)."""
    rows, outcomes = [], {}
    for run in runs:
        if not (run.run_dir / "summary.json").is_file():
            rows.append({"arm": run.arm, "seed": run.seed, "run": str(run.run_dir), "sft_passes": run.sft_passes,
                         "missing": "not run yet (or failed): the same command again runs it"})
            continue
        row = {"arm": run.arm, **seed_row(run.seed, run.run_dir), "sft_passes": run.sft_passes}
        summary = json.loads((run.run_dir / "summary.json").read_text())
        label = (summary.get("eval_rl_best") or {}).get("label")
        dynamics, outcome = read_run(run.run_dir, label)
        rows.append({**row, "rl_best_label": label, **dynamics, "play": play_row(summary)})
        if run.arm is not None and outcome:
            outcomes[(run.arm, run.seed)] = outcome
    return rows, outcomes


def comparisons(arms: list[str], seeds: list[int],
                outcomes: dict[tuple[str, int], dict[str, Outcome]]) -> list[dict[str, Any]]:
    """Every arm but the first against the first: per seed (where both finished) and pooled, with the verdict."""
    first, out = arms[0], []
    for arm in arms[1:]:
        per_seed, pooled = [], []
        for seed in seeds:
            if (first, seed) in outcomes and (arm, seed) in outcomes:
                pairs = paired_arms(outcomes[(first, seed)], outcomes[(arm, seed)])
                per_seed.append({"seed": seed, **compare_arms(pairs)})
                pooled += pairs
        together = compare_arms(pooled)
        verdict = (decision_rule(together["first_only"], together["arm_only"], together["resolved_diff_ci95"])
                   if pooled else None)
        out.append({"arm": arm, "against": first, "seeds": [s["seed"] for s in per_seed],
                    "per_seed": per_seed, "pooled": together, "verdict": verdict})
    return out


def _commit(row: dict[str, Any]) -> str:
    code = row.get("code") or {}
    return (code.get("commit") or "?")[:7] + ("+" if code.get("dirty") else "")


def _num(value: float | None, form: str = "+.2f") -> str:
    return "-" if value is None else format(value, form)


def _play_cells(play: dict[str, Any]) -> str:
    def arrow(pair: list[float | None] | None, form: str) -> str:
        return " -> ".join("-" if v is None else format(v, form) for v in pair) if pair else "-"

    def counts(by: dict[str, int]) -> str:
        return ", ".join(f"{k} {n}" for k, n in by.items()) or "none"

    long = play.get("long_resolved")
    return " | ".join([arrow(play.get("turns"), ".1f"), arrow(play.get("tokens"), ".0f"),
                       counts(play.get("train_finishes", {})), counts(play.get("train_context_edits", {})),
                       f"{long[0]} -> {long[1]} of {long[2]}" if long else "-"])


def markdown(report: dict[str, Any]) -> str:
    first = report["arms"][0]["name"]
    lines = [f"# Ablation of {report['config']}{' (--quick)' if report['quick'] else ''}: "
             f"{len(report['arms'])} arms x {report['seeds']} seed{'s' if report['seeds'] > 1 else ''}", "",
             f"Every run starts from the SFT policy of `{report['base']}` "
             f"({'trained here: the config as it is, seed 0' if report['base_trained_here'] else '--base'}). "
             f"Arms are compared with the first, `{first}` (the arm the claim under test favours).", "",
             "| arm | settings | SFT passes |", "|---|---|---|"]
    for arm in report["arms"]:
        lines.append(f"| {arm['name']} | {arm['describe']} | {arm['sft_passes']} |")
    lines += ["", "## Each run: RL at its best temperature against SFT at its best", "",
              "EV: the critic's explained variance over the learner steps (- where a step's returns had no "
              "variance, e.g. every reward 0); logprob gap: mean |learner - sampler| logprob on the tokens trained.",
              "",
              "| arm | seed | SFT best (T) | RL best (T) | gained / lost | McNemar p | reward change (95 % CI) "
              "| EV first / min / last | warm-up EV | logprob gap | commit |", "|---" * 11 + "|"]
    for r in report["runs"]:
        name = r["arm"] or "base"
        if "missing" in r:
            lines.append(f"| {name} | {r['seed']} | - | - | - | - | - | - | - | - | {r['missing']} |")
            continue
        low, high = r["reward_delta_ci95"]
        warm = r.get("critic_warmup_ev")
        lines.append(f"| {name} | {r['seed']} | {r['sft_best_rate']:.1%} ({r['sft_best_T']:g}) | "
                     f"{r['rl_best_rate']:.1%} ({r['rl_best_T']:g}) | {r['gained']} / {r['lost']} | "
                     f"{r['mcnemar_p']:.2g} | {r['reward_delta']:+.3f} ({low:+.3f} .. {high:+.3f}) | "
                     f"{_num(r.get('ev_first'))} / {_num(r.get('ev_min'))} / {_num(r.get('ev_last'))} | "
                     f"{_num(warm[0]) + ' -> ' + _num(warm[1]) if warm else '-'} | "
                     f"{_num(r.get('logprob_gap'), '.4f')} | {_commit(r)} |")
    lines += ["", "## How each run played", "",
              "Mean turns and tokens per trajectory in the paired eval passes (SFT policy -> RL policy, at the "
              "run's sampling temperature); RL's train trials by how they ended and the prompts a context "
              "strategy edited; the long tasks resolved at SFT's best -> RL's best temperature.", "",
              "| arm | seed | turns | tokens | train finishes | train context edits | long tasks |", "|---" * 7 + "|"]
    for r in report["runs"]:
        if "play" in r:
            lines.append(f"| {r['arm'] or 'base'} | {r['seed']} | {_play_cells(r['play'])} |")
    lines += ["", f"## The arms against `{first}`, per seed (same eval tasks, common random numbers)", "",
              f"| arm | seed | tasks | {first} resolved | arm resolved | {first} only / arm only | McNemar p |",
              "|---|---|---|---|---|---|---|"]
    for c in report["comparisons"]:
        for s in c["per_seed"]:
            lines.append(f"| {c['arm']} | {s['seed']} | {s['pairs']} | {s['first_resolved']} | {s['arm_resolved']} | "
                         f"{s['first_only']} / {s['arm_only']} | {s['mcnemar_p']:.2g} |")
    lines += ["", "## Pooled over seeds: the decision rule", "",
              f"Exact McNemar over (seed, task) pairs; \"{REPRODUCED}\" when p < {ALPHA} with `{first}` ahead, "
              f"\"{NOT_REPRODUCED}\" when p < {ALPHA} the other way or the 95 % CI of the resolved-rate difference "
              f"lies within +-{MARGIN * 100:g} points, \"{INCONCLUSIVE}\" otherwise.", "",
              f"| arm | seeds | pairs | {first} only / arm only | p | resolved-rate difference {first} - arm "
              "(95 % CI) | reward difference (95 % CI) | verdict |", "|---|---|---|---|---|---|---|---|"]
    for c in report["comparisons"]:
        p = c["pooled"]
        if not p["pairs"]:
            lines.append(f"| {c['arm']} | - | 0 | - | - | - | - | no finished pair of runs yet |")
            continue
        (rl, rh), (wl, wh) = p["resolved_diff_ci95"], p["reward_diff_ci95"]
        lines.append(f"| {c['arm']} | {len(c['seeds'])} | {p['pairs']} | {p['first_only']} / {p['arm_only']} | "
                     f"{p['mcnemar_p']:.2g} | {p['resolved_diff']:+.1%} ({rl:+.1%} .. {rh:+.1%}) | "
                     f"{p['reward_diff']:+.3f} ({wl:+.3f} .. {wh:+.3f}) | {c['verdict']} |")
    return "\n".join(lines) + "\n"


def write_ablation(out: Path, header: dict[str, Any], arms: list[dict[str, Any]], runs) -> dict[str, Any]:
    """D/ablation.json and D/ablation.md: ``header`` (config, quick, seeds, base ...), ``arms`` (name, settings,
    describe, sft_passes; the first is the one compared with) and the planned runs (``PlannedRun``: the finished
    ones' summaries and logs); returns the report."""
    rows, outcomes = run_rows(runs)
    report = {**header, "alpha": ALPHA, "margin": MARGIN, "arms": arms, "runs": rows,
              "comparisons": comparisons([arm["name"] for arm in arms], sorted({run.seed for run in runs}),
                                         outcomes)}
    (out / "ablation.json").write_text(json.dumps(report, indent=2))
    (out / "ablation.md").write_text(markdown(report))
    return report
