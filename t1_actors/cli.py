"""`t1-actor`: run one actor, launch a whole run under a supervisor, check a config, run one task.

    t1-actor launch --config run.toml [--host NAME]   every actor of this host, supervised
    t1-actor launch --config run.toml --seeds N       N RL seeds from one SFT policy, and their table
    t1-actor launch --config run.toml --run-dir D --resume   go on with run D from its log after a whole-run kill
    t1-actor launch --config run.toml --slurm [--dry-run] [-- SBATCH_OPTIONS]   the campaign as one Slurm job
    t1-actor launch --config run.toml --host NAME --join   host NAME's actors in a run another host's job runs
    t1-actor ablate --config run.toml --arm A: --arm B:KEY=VALUE --seeds N   arms from one SFT policy, paired
    t1-actor <role> --config run.toml [--name NAME]   one actor (a cluster runs one per process/host)
    t1-actor check --config run.toml                  validate the config and every actor's class/options
    t1-actor run-task TASK_DIR [--oracle] [--json]    one task in a local sandbox, then its verifier
    t1-actor eval --tasks DIR --policy P [--attempts K] a policy on a task set: resolved rate, CI, pass@k
    t1-actor chaos --config run.toml [--quick] [--kills N] a campaign under kill -9 and pauses, then its audit
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from pathlib import Path

from t1_actors import __version__

_COMMANDS = ("launch", "ablate", "check", "run-task", "eval", "chaos")


def _role_table() -> dict[str, type]:
    # imported when a role, launch or --help (it lists the roles) needs it: run-task and chaos start without torch
    from t1_actors.job.roles import ROLES  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.roles: 1.8 s importtime)

    return ROLES


def _parser() -> argparse.ArgumentParser:
    roles = _role_table()
    epilog = "roles:\n" + "\n".join(f"  {role:<10} {cls.__module__}:{cls.__qualname__}"
                                   for role, cls in roles.items())
    epilog += ("\n\nany other role configured with actor_class = 'module:Class' runs the same way: "
               "t1-actor ROLE --config run.toml --name NAME")
    parser = argparse.ArgumentParser(prog="t1-actor", description="Launch and run t1 actors.", epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"t1 {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    launch = sub.add_parser("launch", help="start every actor of this host under a supervisor")
    launch.add_argument("--config", required=True, help="the run's TOML config")
    launch.add_argument("--host", action="append", default=None,
                        help="treat actors with this host as local (repeatable; default: this machine's names)")
    launch.add_argument("--quick", action="store_true",
                        help="campaign configs: apply the [quick.*] overrides (the <= 5 min CI run)")
    launch.add_argument("--run-dir", default=None, help="where the run goes (overrides [run] dir)")
    launch.add_argument("--resume", action="store_true",
                        help="campaign configs: go on with the run already in the run directory from its log (after "
                             "every process died at once); the config and --quick must be the first launch's")
    launch.add_argument("--until", choices=["sft"], default=None,
                        help="campaign configs: stop after the SFT policy is published (its imitation of the "
                             "validation oracles in RUN/sft.json); --resume later goes on with RL")
    launch.add_argument("--seeds", type=int, default=None, metavar="N",
                        help="campaign configs: N RL seeds one after another from one SFT policy (RUN_DIR/seed0 "
                             "trains it), then RUN_DIR/seeds.md: how many beat SFT at its best temperature")
    launch.add_argument("--base", default=None, metavar="RUN",
                        help="with --seeds: start every seed from this finished run's SFT policy and SFT passes")
    launch.add_argument("--slurm", action="store_true",
                        help="campaign configs: submit the campaign as one Slurm job, a node per config host ([slurm]; "
                             "sbatch options after --: t1-actor launch --config F --slurm -- --partition=gpu)")
    launch.add_argument("--dry-run", action="store_true", help="with --slurm: print the sbatch script, submit nothing")
    launch.add_argument("--join", action="store_true",
                        help="campaign configs, with one --host: wait for the supervisor of the host that runs the "
                             "job, then run this host's actors under a supervisor of their own (a Slurm step does this)")
    ablate = sub.add_parser("ablate", help="single-axis ablations: arms that differ by a few config keys, N seeds "
                                           "each, all from one SFT policy, paired against it and each other")
    ablate.add_argument("--config", required=True, help="the campaign's TOML config (every arm's starting point)")
    ablate.add_argument("--arm", action="append", required=True, metavar="NAME:KEY=VALUE[;KEY=VALUE]",
                        help="one arm per --arm (the first is the one the others are compared with); KEY is "
                             "section.key, VALUE a TOML value (a bare word is a string); NAME: is the config as it is")
    ablate.add_argument("--seeds", type=int, required=True, metavar="N", help="seeds 0..N-1 of every arm")
    ablate.add_argument("--base", default=None, metavar="RUN",
                        help="a finished run whose SFT policy (and SFT passes) every arm starts from; default: the "
                             "config as it is trained once first (seed 0)")
    ablate.add_argument("--quick", action="store_true", help="apply the config's [quick.*] overrides (CI-sized)")
    ablate.add_argument("--run-dir", default=None, metavar="D",
                        help="where the runs (D/ARM/seedS), D/ablation.md and D/ablation.json go (default: "
                             "[run] dir + '-ablation')")
    check = sub.add_parser("check", help="validate the config and every actor's class and options")
    check.add_argument("--config", required=True)
    check.add_argument("--quick", action="store_true", help="check with the [quick.*] overrides applied")
    sub.add_parser("run-task", help="run one task in a local sandbox and verify it (see run-task --help)",
                   add_help=False)
    sub.add_parser("eval", help="a policy (oracle, noop, run:RUN) on a task set (see eval --help)", add_help=False)
    sub.add_parser("chaos", help="a campaign under fault injection, then its log's audit (see chaos --help)",
                   add_help=False)
    for role in roles:
        _add_role(sub, role)
    return parser


def _add_role(sub, role: str) -> argparse.ArgumentParser:
    p = sub.add_parser(role, help=f"run one {role} actor")
    p.add_argument("--config", required=True, help="the run's TOML config")
    p.add_argument("--name", default=None, help="the [[actors]] name (needed when the role has several)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run-task":
        from t1_actors.run_task import main as run_task  # noqa: PLC0415 - each command imports only its own module (run_task: 0.16 s)

        return run_task(argv[1:])
    if argv and argv[0] == "eval":
        from t1_actors.task_eval import main as task_eval  # noqa: PLC0415 - keeps run-task/chaos free of torch (task_eval: 2.7 s importtime)

        return task_eval(argv[1:])
    if argv and argv[0] == "chaos":
        from tools.chaos import main as chaos  # noqa: PLC0415 - keeps run-task free of chaos (0.45 s importtime)

        return chaos(argv[1:])
    sbatch: list[str] = []
    if argv and argv[0] == "launch" and "--" in argv:  # launch --slurm ... -- SBATCH_OPTIONS
        sbatch, argv = argv[argv.index("--") + 1:], argv[:argv.index("--")]
    parser = _parser()
    if argv and not argv[0].startswith("-") and argv[0] not in _COMMANDS and argv[0] not in _role_table():
        _add_role(parser._subparsers._group_actions[0], argv[0])  # a role from actor_class in the config
    args = parser.parse_args(argv)
    args.sbatch = sbatch
    if args.command is None:
        parser.print_help()
        return 0
    from t1_actors.runtime.config import ConfigError  # noqa: PLC0415 - keeps run-task free of it (0.34 s importtime)

    try:
        if args.command == "launch":
            return _launch(args)
        if args.command == "ablate":
            return _ablate(args)
        if args.command == "check":
            return _check(args)
        return _run_one(args.command, args)
    except ConfigError as exc:
        print(f"t1-actor: config error: {exc}", file=sys.stderr)
        return 2


def _check_classes(config, specs) -> None:
    from t1_actors.runtime.roles import actor_class  # noqa: PLC0415 - keeps run-task free of it (0.36 s importtime)

    for spec in specs:
        actor_class(spec, _role_table()).validate_options(spec)


def _check(args) -> int:
    from t1_actors.job.config import load_config  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.config: 1.4 s importtime)

    config = load_config(args.config, quick=args.quick)
    _check_classes(config, config.actors)
    print(f"{args.config}{' (--quick)' if args.quick else ''}: ok ({len(config.actors)} actors: "
          f"{', '.join(f'{s.name} ({s.role})' for s in config.actors)})")
    return 0


def _is_campaign(path: str) -> bool:
    try:
        text = open(path).read()
        return "campaign" in (json.loads(text) if path.endswith(".json") else tomllib.loads(text))
    except (OSError, ValueError):  # TOMLDecodeError and JSONDecodeError are ValueErrors
        return False  # load_config reports it properly


def _campaign(args) -> int:
    from t1_actors.job.main import load_campaign_config, run_campaign  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.main: 1.6 s importtime)
    from t1_actors.runtime.config import ConfigError  # noqa: PLC0415 - keeps run-task free of it (0.34 s importtime)
    from t1_actors.runtime.logs import configure_logging  # noqa: PLC0415 - keeps run-task free of it (0.49 s importtime)

    config = load_campaign_config(args.config, quick=args.quick, run_dir=args.run_dir)
    _check_classes(config, config.actors)
    configure_logging(actor="campaign", role="campaign", run_id=config.run.id)
    from tools.report import write_report  # noqa: PLC0415 - keeps run-task/chaos free of torch (tools.report: 2.2 s importtime)

    if args.base is not None and args.seeds is None:
        raise ConfigError("--base goes with --seeds N (the seeds start from that run's SFT policy); for one "
                          "run from another's SFT policy set [campaign] warm_start_from")
    if args.resume and (args.seeds is not None or args.base is not None):
        raise ConfigError("--resume goes on with one run (its run directory); it does not take --seeds or --base")
    if args.until is not None and args.seeds is not None:
        raise ConfigError("--until stops one run before its RL; it does not take --seeds")
    if args.seeds is not None:
        from t1_actors.job.seeds import run_seeds  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.seeds: 1.7 s importtime)

        out = Path(args.run_dir) if args.run_dir else Path(str(config.run.dir) + "-seeds")
        try:
            table = run_seeds(config, seeds=args.seeds, out=out, base=Path(args.base) if args.base else None,
                              write_report=write_report)
        except (FileNotFoundError, FileExistsError, ValueError) as error:
            raise ConfigError(str(error)) from None
        print(json.dumps({k: table[k] for k in ("seeds", "beat_sft_best", "alpha")}))
        return 0
    from t1_actors.job.main import RunLocationError  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.main: 1.6 s importtime)

    try:
        summary = run_campaign(config, write_report=write_report, hosts=set(args.host) if args.host else None,
                               resume=args.resume, until=args.until)
    except RunLocationError as error:  # the run dir or [storage] url, checked before anything ran
        raise ConfigError(str(error)) from None
    if args.until is not None:
        return 0 if summary.get("until") == args.until else 1
    return 0 if summary.get("eval_after") is not None else 1


def _ablate(args) -> int:
    from t1_actors.job.ablate import run_ablation  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.ablate: 1.7 s importtime)
    from t1_actors.job.main import load_campaign_config  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.main: 1.6 s importtime)
    from t1_actors.runtime.config import ConfigError  # noqa: PLC0415 - keeps run-task free of it (0.34 s importtime)
    from t1_actors.runtime.logs import configure_logging  # noqa: PLC0415 - keeps run-task free of it (0.49 s importtime)

    if not _is_campaign(args.config):
        raise ConfigError(f"ablate needs a campaign config (one with a [campaign] section); {args.config} has none")
    config = load_campaign_config(args.config, quick=args.quick)
    _check_classes(config, config.actors)
    configure_logging(actor="campaign", role="campaign", run_id=config.run.id)
    from tools.report import write_report  # noqa: PLC0415 - keeps run-task/chaos free of torch (tools.report: 2.2 s importtime)

    out = Path(args.run_dir) if args.run_dir else Path(str(config.run.dir) + "-ablation")
    try:
        report = run_ablation(args.config, args.arm, seeds=args.seeds, out=out,
                              base=Path(args.base) if args.base else None, quick=args.quick, write_report=write_report)
    except (FileNotFoundError, FileExistsError, ValueError) as error:  # an ArmError is a ConfigError already
        raise ConfigError(str(error)) from None
    print(json.dumps({"arms": [arm["name"] for arm in report["arms"]], "seeds": report["seeds"],
                      "verdicts": {c["arm"]: c["verdict"] for c in report["comparisons"]},
                      "report": str(out / "ablation.md")}))
    return 0


def _slurm(args) -> int:
    from t1_actors.job.main import (  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.main: 1.6 s importtime)
        RunLocationError,
        check_oracle_pool,
        check_resumable,
        check_run_location,
        load_campaign_config,
    )
    from t1_actors.job.slurm.submit import submit  # noqa: PLC0415 - only --slurm needs it
    from t1_actors.runtime.config import ConfigError  # noqa: PLC0415 - keeps run-task free of it (0.34 s importtime)

    for flag, value in (("--seeds", args.seeds), ("--base", args.base), ("--until", args.until),
                        ("--host", args.host), ("--join", args.join or None)):
        if value is not None:
            raise ConfigError(f"--slurm submits one whole campaign; it does not take {flag}")
    config = load_campaign_config(args.config, quick=args.quick, run_dir=args.run_dir)
    _check_classes(config, config.actors)

    def check_location(config) -> None:
        try:
            if args.resume:
                check_resumable(config)
            else:
                check_run_location(config)
                check_oracle_pool(config)
        except RunLocationError as error:
            raise ConfigError(str(error)) from None

    return submit(config, args.config, quick=args.quick, resume=args.resume, sbatch_args=args.sbatch,
                  dry_run=args.dry_run, check_location=check_location)


def _join(args) -> int:
    import trio  # noqa: PLC0415 - keeps run-task free of it (0.05 s importtime)

    from t1_actors.job.config import load_config  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.config: 1.4 s importtime)
    from t1_actors.runtime.config import ConfigError  # noqa: PLC0415 - keeps run-task free of it (0.34 s importtime)
    from t1_actors.runtime.joined import JoinedSupervisor, wait_for_supervisor  # noqa: PLC0415 - only --join needs it
    from t1_actors.runtime.logs import configure_logging  # noqa: PLC0415 - keeps run-task free of it (0.49 s importtime)
    from t1_actors.runtime.supervisor import SupervisorError  # noqa: PLC0415 - keeps run-task free of it (0.35 s importtime)

    if not args.host or len(args.host) != 1:
        raise ConfigError("--join runs the actors of one host: pass it with --host NAME")
    for flag, value in (("--resume", args.resume or None), ("--seeds", args.seeds), ("--until", args.until)):
        if value is not None:
            raise ConfigError(f"--join starts one host's actors in a run another host's job runs; it does not take "
                              f"{flag} (give it to that host's launch)")
    host = args.host[0]
    config = load_config(args.config, quick=args.quick, run_dir=args.run_dir)
    if not any(spec.host == host for spec in config.actors):
        raise ConfigError(f"no actor of {args.config} runs on host {host!r}")
    key = config.hmac_key()
    logger = configure_logging(actor=f"supervisor-{host}", role="supervisor", run_id=config.run.id)
    try:
        waited = trio.run(wait_for_supervisor, config, key, config.supervisor.join_timeout_s)
        logger.info("joined", supervisor=config.supervisor_address, waited_s=round(waited, 1))
        resolved = Path(config.run.dir) / "config.resolved.json"  # the job's supervisor wrote it before serving
        joined = load_config(resolved)
        _check_classes(joined, [s for s in joined.actors if s.host == host])
        supervisor = JoinedSupervisor(joined, resolved, host=host, key=key, logger=logger)
        trio.run(lambda: supervisor.run(handle_signals=True))
    except SupervisorError as exc:
        logger.error("join_failed", error=str(exc))
        return 1
    return 0


def _launch(args) -> int:
    from t1_actors.runtime.config import ConfigError  # noqa: PLC0415 - keeps run-task free of it (0.34 s importtime)

    if args.sbatch and not args.slurm:
        raise ConfigError(f"options after -- ({' '.join(args.sbatch)}) are sbatch's: they go with --slurm")
    if args.dry_run and not args.slurm:
        raise ConfigError("--dry-run goes with --slurm (it prints the sbatch script)")
    if (args.slurm or args.join) and not _is_campaign(args.config):
        raise ConfigError(f"{'--slurm' if args.slurm else '--join'} needs a campaign config (one with a [campaign] "
                          f"section); {args.config} has none")
    if args.slurm:
        return _slurm(args)
    if args.join:
        return _join(args)
    if _is_campaign(args.config):
        return _campaign(args)

    if args.seeds is not None or args.base is not None:
        raise ConfigError(f"--seeds and --base need a campaign config (one with a [campaign] section); "
                          f"{args.config} has none")
    if args.quick or args.resume:
        flag = "--quick" if args.quick else "--resume"
        raise ConfigError(f"{flag} needs a campaign config (one with a [campaign] section); {args.config} has none"
                          + ("" if args.quick else " (a supervised actor set resumes from its log by itself)"))
    import trio  # noqa: PLC0415 - keeps run-task free of it (0.05 s importtime)

    from t1_actors.job.config import load_config  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.config: 1.4 s importtime)
    from t1_actors.runtime.logs import configure_logging  # noqa: PLC0415 - keeps run-task free of it (0.49 s importtime)
    from t1_actors.runtime.supervisor import LOCAL_HOSTS, Supervisor, SupervisorError  # noqa: PLC0415 - keeps run-task free of it (0.35 s importtime)

    config = load_config(args.config)
    hosts = set(args.host) if args.host else LOCAL_HOSTS
    local = [s for s in config.actors if s.host in hosts]
    if not local:
        print(f"t1-actor: no actor of {args.config} runs on {', '.join(sorted(hosts))} "
              "(set host = ... or pass --host)", file=sys.stderr)
        return 2
    _check_classes(config, local)  # every class and its options, before any process starts
    logger = configure_logging(actor="supervisor", role="supervisor", run_id=config.run.id)
    supervisor = Supervisor(config, hosts=hosts, logger=logger)
    try:
        trio.run(lambda: supervisor.run(handle_signals=True))
    except SupervisorError as exc:
        logger.error("launch_failed", error=str(exc))
        return 1
    return 0


def _run_one(role: str, args) -> int:
    from t1_actors.job.config import load_config  # noqa: PLC0415 - keeps run-task/chaos free of torch (job.config: 1.4 s importtime)
    from t1_actors.runtime.config import ConfigError  # noqa: PLC0415 - keeps run-task free of it (0.34 s importtime)
    from t1_actors.runtime.host import run_actor_process  # noqa: PLC0415 - keeps run-task free of it (0.40 s importtime)
    from t1_actors.runtime.roles import actor_class  # noqa: PLC0415 - keeps run-task free of it (0.36 s importtime)
    from t1_actors.runtime.supervisor import SUPERVISOR_PID_ENV  # noqa: PLC0415 - keeps run-task free of it (0.35 s importtime)

    config = load_config(args.config)
    if args.name is None:
        specs = config.actors_of(role)
        if len(specs) != 1:
            names = ", ".join(s.name for s in specs) or "none"
            raise ConfigError(f"role {role!r} has {len(specs)} actors in {args.config} ({names}); pick one with --name")
        spec = specs[0]
    else:
        spec = config.actor(args.name)
        if spec.role != role:
            raise ConfigError(f"actor {spec.name!r} has role {spec.role!r}, not {role!r}")
    cls = actor_class(spec, _role_table())
    cls.validate_options(spec)
    parent = os.environ.get(SUPERVISOR_PID_ENV)
    return run_actor_process(cls, config, spec.name, supervisor_pid=int(parent) if parent else None)


if __name__ == "__main__":
    sys.exit(main())
