"""Several RL seeds from one SFT policy, one after another, and the table that says how many beat it.

    t1-actor launch --config configs/tiny.toml --seeds 5 [--base RUN] [--run-dir DIR] [--quick]

Seed 0 is the whole campaign (DIR/seed0: corpus, tokenizer, SFT, the SFT policy's eval passes, RL, the RL
policy's passes) unless ``--base RUN`` names a finished run to start from; every other seed s is the RL
phase alone (DIR/seed{s}): ``[campaign] seed = s`` (the warm-up and RL task order), warm-started from the
base's tokenizer and SFT policy, with the SFT policy's eval passes read from the base's log
(``[eval] sft_passes = "warm_start"``: the same policy, tasks and eval seeds give the same draws, so every
seed is paired against one SFT pass). A seed whose summary.json exists is not run again.

The table (DIR/seeds.json, DIR/seeds.md) has one row per seed, the ones that lost included: the RL policy at
its best temperature against the SFT policy at its best, paired on the eval split (gained / lost, exact
McNemar p, reward change with its 95 % CI), and the commit of the code that ran it. A seed "beats SFT" when
it resolves more eval tasks than SFT at its best temperature with p < 0.05.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from storage.config import StorageConfig
from t1_actors.job.config import parse_config
from t1_actors.job.main import _jsonable, run_campaign
from t1_actors.job.sft import check_warm_start_passes
from t1_actors.layout import has_log

ALPHA = 0.05


def seed_config(config, *, seed: int, run_dir: Path, base: Path | None, reuse_sft_passes: bool = True):
    """The campaign config of one seed: its own run dir and ``[campaign] seed``; warm-started from ``base``
    (its tokenizer, SFT policy and, with ``reuse_sft_passes``, its SFT eval passes; else this seed plays them)
    unless ``base`` is None."""
    data = _jsonable(config)
    data["run"]["dir"] = str(run_dir)
    if config.section(StorageConfig).url:  # each seed's log under a prefix of its own
        data["storage"] = {**data.get("storage", {}), "url": f"{config.section(StorageConfig).url}/seed{seed}"}
    data["campaign"] = {**data.get("campaign", {}), "seed": seed}
    if base is not None:
        data["campaign"]["warm_start_from"] = str(base)
        data["eval"] = {**data.get("eval", {}), "sft_passes": "warm_start" if reuse_sft_passes else "run"}
    return parse_config(data, f"seed {seed}")


def beats(change: dict[str, Any]) -> bool:
    """A paired comparison's verdict: more gained than lost, and exact McNemar p < ALPHA."""
    return change["gained"] > change["lost"] and change["mcnemar_p"] < ALPHA


def seed_row(seed: int, run_dir: Path) -> dict[str, Any]:
    """One seed's row, from its summary.json."""
    summary = json.loads((run_dir / "summary.json").read_text())
    sft, rl, change = summary.get("eval_sft_best"), summary.get("eval_rl_best"), summary.get("eval_change_vs_sft_best")
    row: dict[str, Any] = {"seed": seed, "run": str(run_dir), "code": summary.get("code"),
                           "sft_passes_from": summary.get("sft_passes_from")}
    if not (sft and rl and change):
        return {**row, "beats_sft_best": False, "missing": "the run has no RL-vs-SFT comparison (did it finish?)"}
    if long := summary.get("eval_change_vs_sft_best_long"):  # the long families' eval tasks alone (issue 33)
        row["long"] = {"tasks": long["tasks"], "gained": long["gained"], "lost": long["lost"],
                       "mcnemar_p": long["mcnemar_p"], "beats_sft_best": beats(long)}
    return {**row, "sft_best_T": sft["temperature"], "sft_best_rate": sft["resolved_rate"],
            "rl_best_T": rl["temperature"], "rl_best_rate": rl["resolved_rate"], "tasks": change["tasks"],
            "gained": change["gained"], "lost": change["lost"], "mcnemar_p": change["mcnemar_p"],
            "reward_delta": change["reward_delta"], "reward_delta_ci95": change["reward_delta_ci95"],
            "beats_sft_best": beats(change)}


def run_once(config, run_dir: Path, title: str, *, console, write_report=None) -> bool:
    """One campaign of a series (a seed, an ablation's arm): skipped when its summary.json exists (finished);
    refused when its directory holds a log but no summary.json (unfinished: the finished ones are kept). Returns
    whether it ran."""
    if (run_dir / "summary.json").is_file():
        return False
    console.rule(title)
    if has_log(run_dir):
        raise FileExistsError(f"{run_dir} holds an unfinished run (a log, no summary.json); move it away "
                              "and run again: the finished runs are kept")
    run_campaign(config, console=console, write_report=write_report)
    return True


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| seed | SFT best (T) | RL best (T) | gained / lost | McNemar p | reward change (95 % CI) "
             "| beats SFT | commit |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        commit = ((r.get("code") or {}).get("commit") or "?")[:7] + ("+" if (r.get("code") or {}).get("dirty") else "")
        if "missing" in r:
            lines.append(f"| {r['seed']} | - | - | - | - | - | no ({r['missing']}) | {commit} |")
            continue
        low, high = r["reward_delta_ci95"]
        lines.append(f"| {r['seed']} | {r['sft_best_rate']:.1%} ({r['sft_best_T']:g}) | "
                     f"{r['rl_best_rate']:.1%} ({r['rl_best_T']:g}) | {r['gained']} / {r['lost']} | "
                     f"{r['mcnemar_p']:.2g} | {r['reward_delta']:+.3f} ({low:+.3f} .. {high:+.3f}) | "
                     f"{'yes' if r['beats_sft_best'] else 'no'} | {commit} |")
    long_rows = [r for r in rows if "long" in r]
    if long_rows:  # the long families' eval tasks alone
        lines += ["", "| seed | long tasks | gained / lost | McNemar p | beats SFT on them |", "|---|---|---|---|---|"]
        lines += [f"| {r['seed']} | {r['long']['tasks']} | {r['long']['gained']} / {r['long']['lost']} | "
                  f"{r['long']['mcnemar_p']:.2g} | {'yes' if r['long']['beats_sft_best'] else 'no'} |"
                  for r in long_rows]
    return "\n".join(lines) + "\n"


def write_table(out: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    table = {"seeds": len(rows), "beat_sft_best": sum(r["beats_sft_best"] for r in rows), "alpha": ALPHA,
             "rows": rows}
    (out / "seeds.json").write_text(json.dumps(table, indent=2))
    (out / "seeds.md").write_text(markdown(rows))
    return table


def run_seeds(config, *, seeds: int, out: Path, base: Path | None = None, console=None,
              write_report=None) -> dict[str, Any]:
    """Run seeds 0..seeds-1 (see the module doc) and write the table; returns it."""
    console = console or Console(stderr=True)
    if seeds < 1:
        raise ValueError(f"--seeds {seeds}: run at least one seed")
    if base is not None and not (base / "summary.json").is_file():
        raise FileNotFoundError(f"--base {base}: no summary.json there; name a run directory whose campaign "
                                "finished (its SFT policy and SFT eval passes are what every seed starts from)")
    out.mkdir(parents=True, exist_ok=True)
    # every seed's config is built and validated before the first one starts
    plan = []
    for seed in range(seeds):
        run_dir = out / f"seed{seed}"
        start_from = base if base is not None else (None if seed == 0 else out / "seed0")
        seed_cfg = seed_config(config, seed=seed, run_dir=run_dir, base=start_from)
        if base is not None:
            check_warm_start_passes(base, seed_cfg)
        plan.append((seed, run_dir, seed_cfg))
    rows = []
    for seed, run_dir, seed_cfg in plan:
        run_once(seed_cfg, run_dir, f"seed {seed} of {seeds}: {run_dir}", console=console, write_report=write_report)
        rows.append(seed_row(seed, run_dir))
        write_table(out, rows)  # the table so far survives a later seed's failure
    table = write_table(out, rows)
    console.print(markdown(rows))
    console.print(f"{table['beat_sft_best']} of {seeds} seeds beat the SFT policy at its best temperature "
                  f"(p < {ALPHA}); table: {out / 'seeds.md'}")
    return table
