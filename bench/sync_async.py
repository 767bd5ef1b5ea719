"""Synchronous PPO (t1-probe) against the asynchronous campaign, from one SFT policy, at equal updates.

    python bench/sync_async.py [SEEDS_DIR] [--probe-seeds 1] [--threads 2]

SEEDS_DIR (default runs/seeds) is what ``t1-actor launch --seeds N`` wrote: its seeds.json names the
campaign runs (every seed's asynchronous RL from one SFT policy) and the run that SFT policy came from.
The bench runs ``t1-probe`` on that SFT policy with the campaign's schedule (``[campaign] rl_steps`` steps of
``[staleness] batch_size`` trials, the campaign's warm-up and RL task order for each probe seed, the same
``[ppo]``), evaluated under the same protocol, and compares the two paired gains over SFT at its best
temperature: the change of the resolved rate on the eval split, (gained - lost) / tasks.

The asynchronous path loses nothing measurable when every campaign seed's gain lies within the probe's
95 % CI (paired normal interval over the eval tasks; it covers the eval's sampling noise, not the spread
of RL seeds, which the seeds' own table shows). Last line: one JSON object with ``probe_gain``,
``probe_gain_ci95``, ``async_gains``, ``async_within_probe_ci`` (count), ``steps`` and both sides' steps per
minute (the probe's from its own step timings, the campaign's from the log's learner steps).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from t1_actors.rollout.admission import StalenessConfig
from t1_actors.schedule import CampaignConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def campaign_rate(run: Path) -> float | None:
    """PPO steps per minute of a campaign's RL phase, from its log (first to last learner step)."""
    from storage import EventLog

    stamps = [ts for _, ts in EventLog.open(run / "log").append_times(kinds=["learner_step"])]
    if len(stamps) < 2:
        return None
    seconds = stamps[-1] - stamps[0]
    return round(60 * (len(stamps) - 1) / seconds, 2) if seconds > 0 else None


def main(argv: list[str] | None = None) -> int:
    import trio

    from tools.probe import probe_config, run_probe

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seeds_dir", nargs="?", default="runs/seeds")
    parser.add_argument("--probe-seeds", type=int, default=1, help="probe runs (campaign seeds 0..N-1's task order)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--probe-report", action="append", default=[], metavar="JSON",
                        help="a `t1-probe BASE --json` report of the same base and schedule, instead of running "
                             "the probe here (repeatable: one per probe seed)")
    args = parser.parse_args(argv)
    seeds_dir = Path(args.seeds_dir)
    table_path = seeds_dir / "seeds.json"
    if not table_path.is_file():
        print(json.dumps({"error": f"{table_path}: not found; run `t1-actor launch --config configs/tiny.toml "
                                   f"--seeds N --run-dir {seeds_dir}` first"}))
        return 2
    rows = [r for r in json.loads(table_path.read_text())["rows"] if "missing" not in r]
    bases = {r["sft_passes_from"] or str(seeds_dir / "seed0") for r in rows}
    if len(bases) != 1:
        print(json.dumps({"error": f"the seeds start from different SFT runs: {sorted(bases)}"}))
        return 2
    base = Path(bases.pop())
    config = probe_config(base, [])

    probes = [json.loads(Path(p).read_text().strip().splitlines()[-1]) for p in args.probe_report]
    rl_steps = config.section(CampaignConfig).rl_steps
    for report in probes:
        if Path(report["run"]).resolve() != base.resolve() or len(report["steps"]) != rl_steps:
            print(json.dumps({"error": f"--probe-report of {report['run']} with {len(report['steps'])} steps is not "
                                       f"the probe of {base} at its campaign's {rl_steps} steps"}))
            return 2
    for seed in range(len(probes), args.probe_seeds if not probes else len(probes)):
        probe_args = argparse.Namespace(ckpt="weights/v00000", steps=config.section(CampaignConfig).rl_steps,
                                        tasks=config.section(StalenessConfig).batch_size
                                        // config.section(StalenessConfig).group_size,
                                        group=config.section(StalenessConfig).group_size, eval_tasks=10 ** 6,
                                        eval_every=0, seed=seed, threads=args.threads)
        report = trio.run(run_probe, probe_args, base, config, lambda line: print(line, file=sys.stderr))
        probes.append(report)
        print(json.dumps({"probe_seed": seed, "vs_sft_best": report["vs_sft_best"],
                          "logged_sft_agreement": report.get("logged_sft_agreement"),
                          "steps_per_minute": report["steps_per_minute"],
                          "off_policy_steps": report["off_policy_steps"]}), file=sys.stderr)

    first = probes[0]["vs_sft_best"]
    low, high = first["resolved_delta_ci95"]
    gains = [(r["gained"] - r["lost"]) / r["tasks"] for r in rows]
    result = {"bench": "sync_async", "base": str(base), "steps": first["step"],
              "probe_gain": first["resolved_delta"], "probe_gain_ci95": [low, high],
              "probe_gains": [p["vs_sft_best"]["resolved_delta"] for p in probes],
              "probe_best_T": [p["rl_best_T"] for p in probes], "sft_best_T": probes[0]["sft_best_T"],
              "logged_sft_agreement": probes[0].get("logged_sft_agreement"),
              "async_gains": gains, "async_seeds": [r["seed"] for r in rows],
              "async_best_T": [r["rl_best_T"] for r in rows],
              "async_within_probe_ci": sum(low <= g <= high for g in gains), "async_runs": len(gains),
              "probe_steps_per_minute": [p["steps_per_minute"] for p in probes],
              "async_steps_per_minute": [campaign_rate(Path(r["run"])) for r in rows],
              "probe_off_policy_steps": sum(len(p["off_policy_steps"]) for p in probes)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
