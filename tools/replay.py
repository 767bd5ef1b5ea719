"""`t1-replay`: replay a run's event log to debug drift, read trajectories, plot and rebuild state.

    t1-replay drift RUN [--limit N] [--trial ID] [--tokenizer PATH] [--json]
    t1-replay show RUN --trial ID [--json]
    t1-replay report RUN [--out DIR] [--json]
    t1-replay state RUN [--at EVENT] [--json]
    t1-replay export --tensorboard DIR RUN [--json]

RUN is a run directory (RUN/log, RUN/weights/, RUN/tokenizer.json) or an event log directory.
Every command prints one JSON object with --json.
"""

from __future__ import annotations

import argparse
import sys

from rich.table import Table
from rich.text import Text

from tools._output import console, fail, print_json, styled
from tools._replay.audit import Audit, audit_events
from tools._replay.run import RunError, RunView
from tools._replay.state import fold_state


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t1-replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("drift", help="recompute learner logprobs with and without R3 and TITO")
    p.add_argument("run")
    p.add_argument("--limit", type=int, default=None, help="the first N trials (log order), each with all its chunks")
    p.add_argument("--trial", default=None, help="only this trial")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json or HF tokenizer directory (default: the run's)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("show", help="one trajectory, readable")
    p.add_argument("run")
    p.add_argument("--trial", required=True)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("report", help="PNG plots and a markdown summary")
    p.add_argument("run")
    p.add_argument("--out", default=None, help="output directory (default RUN/report)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("export", help="per-step scalars for TensorBoard (the tensorboard extra: t1[tensorboard])")
    p.add_argument("run")
    p.add_argument("--tensorboard", required=True, metavar="DIR",
                   help="directory of the event files (an earlier export's files there are replaced)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("audit", help="is every trial, learner step and weights version accounted for?")
    p.add_argument("run")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("state", help="state rebuilt by folding the log up to an event")
    p.add_argument("run")
    p.add_argument("--at", default=None, help="event id (writer:seq) or position in log order (default: end)")
    p.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"drift": _drift, "show": _show, "report": _report, "state": _state, "audit": _audit,
                "export": _export}[args.command](args)
    except RunError as exc:
        return fail(str(exc))


def _drift(args) -> int:
    import torch  # noqa: PLC0415 - keeps t1-replay free of torch but for drift (1.5 s importtime)

    from tools._replay.drift import drift_of_run  # noqa: PLC0415 - keeps t1-replay free of torch but for drift (1.6 s importtime)

    torch.set_num_threads(max(1, args.threads))
    view = RunView.open(args.run)
    out = drift_of_run(view, limit=args.limit, tokenizer=view.tokenizer(args.tokenizer), trial=args.trial)
    if args.json:
        print_json(out)
        return 0
    c = console()
    c.print(styled(("Drift", "bold"), f" {out['run']}: {out['trajectories']} trajectory chunks, "
                   f"{out['loss_tokens']} loss tokens, versions {out['versions']}"))
    table = Table("mode", "ids trained", "routing", "mean |dlogp|", "max |dlogp|")
    names = {"r3_tito": ("sampled (TITO)", "replayed (R3)"), "tito": ("sampled (TITO)", "live"),
             "r3": ("re-rendered", "replayed (R3)"), "none": ("re-rendered", "live")}
    for mode, (ids, routing) in names.items():
        table.add_row(mode, ids, routing, _num(out[f"gap_{mode}"]), _num(out[f"gap_{mode}_max"]))
    c.print(table)
    c.print(f"loss-region drift (TITO): {_pct(out['drift_rate_loss'])}; re-rendered: "
            f"{_pct(out['drift_rate_loss_rerendered'])}; retokenized share: {_pct(out['retokenized_share'])}; "
            f"logprob record mismatches: {out['logprob_record_mismatch']}")
    c.print(f"repair cases: {out['repair_cases']}")
    for span, gaps in out["gap_by_versions"].items():  # R3 must be exact across a trial's weight versions too
        c.print(f"{span.replace('_', '-')} trials ({out['loss_tokens_by_versions'].get(span, 0)} loss tokens): "
                + ", ".join(f"{mode} {_num(gap)}" for mode, gap in gaps.items()))
    b = out["boundaries"]
    shares = " ".join(f"{case}={share:.3f}" for case, share in b["repair_case_shares"].items() if share is not None)
    changes = b["template_changes"]
    c.print(f"all {b['trials']} assembled trials: {b['multi_turn']} multi-turn, {b['multi_turn_with_reasoning']} with "
            f"reasoning in every re-rendered turn ({b['multi_turn_reasoning_every_turn']} in every turn); "
            f"{b['boundaries']} boundaries: {shares or '-'}; template changed "
            f"{changes['changed']} of {changes['boundaries']} (diff tokens per boundary: mean "
            f"{_num(changes['diff_tokens']['mean'])}, max {changes['diff_tokens']['max']})")
    if b["classified_shares"]:
        c.print("with every repair allowed: "
                + " ".join(f"{case}={share:.3f}" for case, share in b["classified_shares"].items()))
    rm = out["routing_mismatch"]
    if rm["per_layer"]:
        c.print("routing mismatch without replay, per layer: "
                + " ".join(f"L{i}={v:.3f}" for i, v in enumerate(rm["per_layer"])) + f" (mean {rm['mean']:.3f})")
    if out["skipped"]:
        c.print(f"not measured: {out['skipped']}")
    if any(v is False for v in out["checksums"].values()):
        c.print(styled(("weights checksum mismatch", "red"), f": {out['checksums']}"))
    return 0


def _show(args) -> int:
    from tools._replay.show import trial_view  # noqa: PLC0415 - keeps t1-replay free of torch but for show (2.0 s importtime)

    view = RunView.open(args.run)
    out = trial_view(view, args.trial, tokenizer=view.tokenizer(args.tokenizer))
    if args.json:
        print_json(out)
        return 0
    c = console()
    c.print(styled((f"Trial {out['trial_id']}", "bold"), f" task {out['task_id']} reward {_num(out['reward'])}"
                   + (f" (continues {', '.join(out['continues'])})" if out["continues"] else "")))
    for chunk in out["trajectory"]:
        c.print(styled((f"chunk {chunk['chunk']}", "bold"), f": {chunk['tokens']} tokens, {chunk['loss_tokens']} in "
                       f"the loss region (marked ⟦…⟧), boundaries {chunk['boundary_cases']}, "
                       f"policy v{chunk['policy_version']}"))
        text = Text()
        for seg in chunk["segments"]:
            body = seg["text"] if seg["text"] is not None else " ".join(map(str, seg["ids"]))
            text.append(f"⟦{body}⟧" if seg["loss"] else body, style="bold green" if seg["loss"] else "")
        c.print(text)
    for turn in out["turns"]:
        top = ""
        if turn["routing"]:
            top = " top experts " + "; ".join(f"L{i}:" + ",".join(f"{e}x{n}" for e, n in layer["top"])
                                              for i, layer in enumerate(turn["routing"]["layers"]))
        inherited = f" [from {turn['trial_id']}]" if turn["trial_id"] != out["trial_id"] else ""
        c.print(f"turn {turn['turn']}{inherited}: v{turn['policy_version']} {turn['sampled_tokens']} tokens "
                f"({turn['finish_reason']}), logprob mean {_num(turn['logprob_mean'])} min {_num(turn['logprob_min'])}{top}")
    for cmd in out["commands"]:
        c.print(styled((f"$ {cmd['command']}", "bold"),
                       f"  (turn {cmd['turn']}, exit {cmd['exit_code']}, {cmd['duration_s']:.2f}s)"))
        if cmd["stdout"]:
            c.print(Text(cmd["stdout"].rstrip()))
        if cmd["stderr"]:
            c.print(Text(cmd["stderr"].rstrip(), style="red"))
    v = out["verifier"]
    if v:
        c.print(f"verifier: {v['passed']}/{v['total']} passed, reward {v['reward']:.3f} (S={v['reward_scale']}), "
                f"sha256 {v['verifier_sha256'][:12]}…, tamper flags {v['tamper_flags'] or 'none'}")
        for test, outcome in v["tests"].items():
            c.print(f"  {outcome:8s} {test}")
    for d in out["staleness"]:
        c.print(f"staleness: {d['decision']} (lag {d['lag']}, v{d['policy_version']}) {d['reason']}")
    return 0


def _report(args) -> int:
    from tools.report import write_report  # noqa: PLC0415 - keeps t1-replay free of torch but for report (2.0 s importtime)

    out = write_report(args.run, args.out)
    if args.json:
        print_json(out)
        return 0
    c = console()
    c.print(styled(("Report", "bold"), f" written: {out['markdown']}"))
    for path in out["figures"]:
        c.print(f"  {path}")
    c.print(f"mean reward {_num(out['mean_reward'])} (first quarter {_num(out['mean_reward_first_quarter'])}, last "
            f"{_num(out['mean_reward_last_quarter'])}); {out['learner_steps']} learner steps; staleness "
            f"{out['staleness_decisions']}; cancellations {out['cancellations']}")
    return 0


def _export(args) -> int:
    from tools._report.tensorboard import TensorBoardMissing, export_tensorboard  # noqa: PLC0415 - keeps t1-replay free of torch but for export (2.0 s importtime)

    view = RunView.open(args.run)
    try:
        out = export_tensorboard(view, args.tensorboard)
    except TensorBoardMissing as exc:
        return fail(str(exc))
    if args.json:
        print_json(out)
        return 0
    c = console()
    c.print(styled(("TensorBoard", "bold"), f" {out['scalars']} scalars of {len(out['tags'])} tags over "
                   f"{len(out['steps'])} steps: {', '.join(out['files'])}"
                   + (f" (replaced {len(out['removed'])} earlier)" if out["removed"] else "")))
    return 0


def _state(args) -> int:
    view = RunView.open(args.run)
    upto = view.index_of(args.at) if args.at is not None else None
    state = fold_state(view.events, upto)
    out = state.to_json()
    idx = upto if upto is not None else len(view.events) - 1
    out["at"] = ({"event": view.events[idx][0], "position": idx, "kind": view.events[idx][1].kind}
                 if view.events else None)
    if args.json:
        print_json(out)
        return 0
    c = console()
    at = out["at"]
    c.print(styled(("State", "bold"), f" after {out['events']} events"
                   + (f" (at {at['event']}, {at['kind']})" if at else "")))
    table = Table("quantity", "value")
    for key in ("policy_version", "learner_step", "critic_version", "trials", "in_flight_count",
                "staleness_decisions", "mean_reward", "verified", "actors", "last_eval", "counts"):
        table.add_row(key.replace("_", " "), str(out[key]))
    c.print(table)
    return 0


def _audit(args) -> int:
    """Exit 0 when clean (every count that must be 0 is, and something was checked), 1 otherwise."""
    view = RunView.open(args.run)
    audit = audit_events(view.events, weights_root=view.root)
    out = audit.to_json()
    if args.json:
        print_json(out)
        return 0 if audit.clean else 1
    c = console()
    c.print(styled(("Audit", "bold"), f" of {out['events_checked']} events, {out['trials_issued']} trials, "
                   f"{out['learner_steps']} learner steps, {out['versions_published']} versions: "),
            styled(("clean", "green") if audit.clean else ("NOT clean", "red bold")))
    table = Table("must be 0", "found", "e.g.")
    for key in Audit.MUST_BE_ZERO:
        table.add_row(key.replace("_", " "), str(out[key]), "; ".join(out["examples"].get(key, [])))
    c.print(table)
    c.print("final states: " + ", ".join(f"{k} {v}" for k, v in sorted(out["final_states"].items())))
    return 0 if audit.clean else 1


def _num(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.4f} %"


if __name__ == "__main__":
    sys.exit(main())
