"""What an eval's log says: one row per (task, attempt), the summary the paper's tables are made of, the
markdown table, and the paired comparison of two evals. Everything is read from the log; nothing here
runs a task.

Failure classes are kept apart: ``agent`` (the tests ran and failed), ``timeout`` (a command or the whole
agent loop ran out of time and the tests then failed), ``infrastructure`` (the sandbox could not be built
or failed, or the verifier could not run: excluded from the rate and counted, never the agent's fault).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from schemas import SandboxExec, TrialEnded, TrialIssued, VerifierResult
from t1_actors.stats import Outcome, paired_change, pass_at_k, wilson_interval

EVAL_SPLIT = "eval"
FAILURE_CLASSES = ("agent", "timeout", "infrastructure")


def attempt_rows(log) -> dict[tuple[str, int], dict[str, Any]]:
    """(task id, attempt) -> its row, for every attempt the log holds a verification (or an
    infrastructure failure) of. An attempt played twice (a crash between its end and the next start)
    keeps its first finished trial."""
    issued: dict[str, TrialIssued] = {}
    ended: dict[str, TrialEnded] = {}
    results: dict[str, VerifierResult] = {}
    timed_out: set[str] = set()
    for _, event in log.events(kinds=["trial_issued", "trial_ended", "verifier_result", "sandbox_exec"]):
        if isinstance(event, TrialIssued) and event.split == EVAL_SPLIT:
            issued[event.trial_id] = event
        elif isinstance(event, TrialEnded):
            ended[event.trial_id] = event
        elif isinstance(event, VerifierResult):
            results[event.trial_id] = event
        elif isinstance(event, SandboxExec) and event.timed_out:
            timed_out.add(event.trial_id)
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for trial_id, trial in issued.items():
        key = (trial.task_id, trial.sample)
        end, result = ended.get(trial_id), results.get(trial_id)
        if key in rows or end is None:
            continue  # a later duplicate, or an attempt that never finished (resumed: played again)
        infra = end.infra_error or (result.infra_error if result is not None else "no verification")
        resolved = bool(result is not None and not infra and result.resolved)
        if infra:
            failure = "infrastructure"
        elif resolved:
            failure = None
        elif end.finish == "timeout" or trial_id in timed_out:
            failure = "timeout"
        else:
            failure = "agent"
        rows[key] = {"task": trial.task_id, "attempt": trial.sample, "trial_id": trial_id,
                     "passed": result.passed if result else 0, "tests_total": result.total if result else 0,
                     "tests": dict(result.tests) if result else {}, "reward": result.reward if result else 0.0,
                     "resolved": resolved, "failure_class": failure, "finish": end.finish, "turns": end.turns,
                     "infra_error": infra or None, "duration_s": round(end.duration_s, 3),
                     "unhonoured": list(end.unhonoured)}
    return rows


def _rate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [r for r in rows if r["failure_class"] != "infrastructure"]
    resolved = sum(r["resolved"] for r in scored)
    low, high = wilson_interval(resolved, len(scored))
    return {"resolved": resolved, "n_scored": len(scored),
            "resolved_rate": resolved / len(scored) if scored else 0.0, "ci95": [low, high]}


def summarise(rows: dict[tuple[str, int], dict[str, Any]], tasks: dict[str, Any], *, header: dict[str, Any]
              ) -> dict[str, Any]:
    """The eval's summary: overall, per category and per difficulty (resolved rate with its 95 % Wilson
    interval over the scored attempts), mean reward, pass@k when there are several attempts, the failure
    classes, the Dockerfile steps each task could not honour, and every attempt's row."""
    ordered = [rows[key] for key in sorted(rows)]
    for row in ordered:
        meta = tasks[row["task"]].metadata if row["task"] in tasks else {}
        row["category"] = str(meta.get("category", "unknown"))
        row["difficulty"] = str(meta.get("difficulty", "unknown"))
    overall = _rate(ordered)
    scored = [r for r in ordered if r["failure_class"] != "infrastructure"]
    summary: dict[str, Any] = {**header, **overall, "n": len(ordered),
                               "mean_reward": sum(r["reward"] for r in scored) / len(scored) if scored else 0.0,
                               "infra_failures": sum(r["failure_class"] == "infrastructure" for r in ordered),
                               "failure_classes": {c: sum(r["failure_class"] == c for r in ordered)
                                                   for c in FAILURE_CLASSES}}
    for field, key in (("category", "by_category"), ("difficulty", "by_difficulty")):
        groups: dict[str, list] = defaultdict(list)
        for row in ordered:
            groups[row[field]].append(row)
        summary[key] = {name: _rate(group) for name, group in sorted(groups.items())}
    attempts = header.get("attempts", 1)
    summary["pass_at_k"] = pass_at_k_table(scored, attempts) if attempts > 1 else None
    summary["tasks"] = ordered
    return summary


def pass_at_k_table(rows: list[dict[str, Any]], attempts: int) -> dict[int, float] | None:
    """Mean over tasks of the unbiased pass@k, k = 1..attempts, over tasks with every attempt scored."""
    by_task: dict[str, list[bool]] = defaultdict(list)
    for row in rows:
        by_task[row["task"]].append(row["resolved"])
    complete = [results for results in by_task.values() if len(results) == attempts]
    if not complete:
        return None
    return {k: sum(pass_at_k(attempts, sum(r), k) for r in complete) / len(complete) for k in range(1, attempts + 1)}


def markdown(summary: dict[str, Any]) -> str:
    """The paper's table: resolved % with its 95 % CI, overall, per category and per difficulty."""
    def line(name: str, rate: dict[str, Any]) -> str:
        if not rate["n_scored"]:  # every attempt an infrastructure failure: no rate to give
            return f"| {name} | 0 / 0 | - | - |"
        low, high = rate["ci95"]
        return (f"| {name} | {rate['resolved']} / {rate['n_scored']} | {rate['resolved_rate']:.1%} | "
                f"{low:.1%} - {high:.1%} |")

    out = [f"policy `{summary['policy']}`, {summary['attempts']} attempt(s) per task, T = {summary['temperature']}",
           "", "| | resolved | rate | 95 % CI |", "|---|---|---|---|", line("**all**", summary)]
    out += [line(f"category: {name}", rate) for name, rate in summary["by_category"].items()]
    out += [line(f"difficulty: {name}", rate) for name, rate in summary["by_difficulty"].items()]
    classes = summary["failure_classes"]
    out += ["", f"mean reward {summary['mean_reward']:.3f} (r = P / 20); failures: agent {classes['agent']}, "
                f"timeout {classes['timeout']}, infrastructure {classes['infrastructure']} (excluded from the rate)"]
    if summary.get("pass_at_k"):
        out.append("pass@k: " + ", ".join(f"k={k} {v:.1%}" for k, v in summary["pass_at_k"].items()))
    infra = [row for row in summary["tasks"] if row["failure_class"] == "infrastructure"]
    if infra:
        out += ["", "infrastructure failures (the harness's or the task's, never the policy's):"]
        out += [f"- {row['task']} attempt {row['attempt']}: {_first_line(row.get('infra_error'))}" for row in infra]
    unhonoured = summary.get("unhonoured") or {}
    if unhonoured:
        out += ["", "not honoured by the local sandbox:"]
        out += [f"- {task}: {'; '.join(steps)}" for task, steps in sorted(unhonoured.items())]
    return "\n".join(out) + "\n"


def _first_line(text: str | None, width: int = 200) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return (lines[0] if len(lines) == 1 else " / ".join(lines[:1] + lines[-1:]))[:width] if lines else "?"


def compare(rows_a: dict, rows_b: dict) -> dict[str, Any]:
    """Two evals paired by (task, attempt), infrastructure failures left out on either side: tasks
    flipped each way, the exact McNemar p and the reward change with its CI (``t1_actors.stats.paired_change``)."""
    def outcomes(rows: dict) -> dict[str, Outcome]:
        return {f"{task}#{attempt}": Outcome(row["resolved"], row["reward"]) for (task, attempt), row in rows.items()
                if row["failure_class"] != "infrastructure"}

    change = paired_change(outcomes(rows_a), outcomes(rows_b)).as_dict()
    a, b = outcomes(rows_a), outcomes(rows_b)
    common = sorted(set(a) & set(b))
    change["gained_tasks"] = [k for k in common if not a[k].resolved and b[k].resolved]
    change["lost_tasks"] = [k for k in common if a[k].resolved and not b[k].resolved]
    return change
