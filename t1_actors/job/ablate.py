"""Single-axis ablations from one SFT policy: arms that differ by a few config keys, N seeds each, paired.

    t1-actor ablate --config F [--base RUN] --arm NAME:KEY=VALUE[;KEY=VALUE] ... --seeds N [--quick] [--run-dir D]

An arm is a name and settings: ``KEY`` is ``section.key`` (``sandbox.local.pids_max`` for a nested table),
``VALUE`` a TOML value, a bare word being a string (``--arm binary:verifier.reward=binary``); ``--arm dense:``
is the config as it is. Every run of every arm starts from the same SFT policy: ``--base RUN`` (a finished run),
else the config as it is trained once here, seed 0 (the first arm with no settings is that run, ``D/NAME/seed0``;
with none, ``D/base``). Arm ``a``'s seed ``s`` is ``D/a/seed{s}``: ``[campaign] seed = s`` (the same warm-up and RL
task orders in every arm), warm-started from the base, the same eval protocol (``t1_actors.job.seeds``).

Keys that would change the SFT phase, the tasks or the eval protocol are refused naming the key (``refusal``).
Keys that change how a trial is played or scored (the sampler, the sandbox, the verifier's limits, the turn,
token and context budgets, the context strategy: ``plays_own_sft_passes``) are allowed, but the base's SFT passes
were played under other settings: such an arm plays the SFT policy's passes itself in its seed 0 (same policy,
its own rollout) and its later seeds read them from there. The others read the base's.

Everything is validated before anything starts: the arms' syntax, every key, every arm's config for every seed
(each error names the arm, the key and the fix). Finished runs (a summary.json) are skipped, so the same command
again resumes; an unfinished one (a log, no summary) is refused, as ``launch --seeds`` refuses it. The report:
``t1_actors.job.ablation`` (D/ablation.md, D/ablation.json).
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console

from storage.config import StorageConfig
from t1_actors.job.ablation import write_ablation
from t1_actors.job.config import RunConfig, parse_config
from t1_actors.job.seeds import run_once, seed_config
from t1_actors.job.sft import check_warm_start_passes, decides_sft_draws
from t1_actors.layout import has_log
from t1_actors.runtime.config import ConfigError, read_config_data


class ArmError(ConfigError):
    """An arm that cannot run: bad syntax, an unknown or refused key, a value the config refuses (nothing ran)."""


ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
KEY = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+")
BARE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")  # a VALUE that is no TOML value but a word: a string
RESERVED_NAMES = {"base"}  # D/base: the base run when no arm is the config as it is

# [section] (None: all its keys) -> why an arm may not set it
_REFUSED: dict[tuple[str, str | None], str] = {
    ("run", None): "each run's identity and directory are ablate's (--run-dir D: D/ARM/seedS)",
    ("storage", None): "each run's log location is ablate's (a [storage] url gets a prefix per arm and seed)",
    ("actors", None): "every arm runs the config's actors",
    ("model", None): "it shapes the SFT policy, which every arm shares",
    ("tasks", None): "every arm trains and is evaluated on the same tasks",
    ("eval", None): "every arm is evaluated by the same protocol (RL at its best temperature against SFT at its best)",
    ("campaign", "seed"): "--seeds sets it: seed s has the same warm-up and RL task orders in every arm",
    ("campaign", "warm_start_from"): "every arm starts from the same SFT policy: pass --base RUN instead",
    ("campaign", "tokenizer"): "it is the SFT phase's tokenizer, which every arm shares",
    ("campaign", "tokenizer_vocab"): "it is the SFT phase's tokenizer, which every arm shares",
}
_SFT_PREFIX = "sft_"  # [campaign] sft_*: the SFT phase
# sections every key of which changes how a trial is played or scored ([verifier] reward only what RL trains on)
_ROLLOUT_SECTIONS = ("sampler", "sandbox", "verifier")
_TRAINING_ONLY = {("verifier", "reward")}


@dataclass(frozen=True)
class Arm:
    """One arm: a name and its settings, ``(("ppo.old_logprobs", "recompute"), ...)`` in the order given."""

    name: str
    settings: tuple[tuple[str, Any], ...] = ()

    def describe(self) -> str:
        return "; ".join(f"{key} = {json.dumps(value)}" for key, value in self.settings) or "(the config as it is)"


def split_settings(text: str) -> list[str]:
    """``KEY=VALUE;KEY=VALUE`` split at the ``;`` outside quotes and brackets (a TOML string or array may hold one)."""
    parts, current, quote, depth = [], [], "", 0
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == ";" and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_value(text: str, where: str) -> Any:
    """A TOML value (``0.5``, ``true``, ``"a b"``, ``[1, 2]``); a bare word that is none is the string itself."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        if BARE_WORD.fullmatch(text):
            return text
        raise ArmError(f"{where}: {text!r} is neither a TOML value nor a bare word; quote a string "
                       "('KEY=\"a b\"') or write the value as TOML") from None


def parse_arm(text: str) -> Arm:
    """``NAME:KEY=VALUE[;KEY=VALUE]`` (``NAME:`` alone: the config as it is) -> ``Arm``; ``ArmError`` naming the
    arm and the fix otherwise."""
    name, colon, rest = text.partition(":")
    name = name.strip()
    if not colon:
        raise ArmError(f"--arm {text!r}: no ':'; write NAME:KEY=VALUE[;KEY=VALUE], or NAME: for the config as it is")
    if not ARM_NAME.fullmatch(name) or name in RESERVED_NAMES:
        raise ArmError(f"--arm {text!r}: the name {name!r} must be 1-64 letters, digits, '.', '_' or '-' (starting "
                       f"with a letter or digit) and not {', '.join(sorted(RESERVED_NAMES))}: it names the arm's "
                       "directory")
    settings: dict[str, Any] = {}
    for part in split_settings(rest):
        key, equals, value = (s.strip() for s in part.partition("="))
        where = f"--arm {name}: {part!r}"
        if not equals or not value:
            raise ArmError(f"{where}: write KEY=VALUE (e.g. ppo.old_logprobs=recompute), settings separated by ';'")
        if not KEY.fullmatch(key):
            raise ArmError(f"{where}: KEY {key!r} must be section.key in lower case (e.g. campaign.max_turns)")
        if key in settings:
            raise ArmError(f"{where}: {key} is set twice in this arm; keep one")
        settings[key] = parse_value(value, where)
    return Arm(name, tuple(settings.items()))


def parse_arms(texts: list[str]) -> list[Arm]:
    """Every ``--arm``, in order (the first is the one the others are compared with); at least two, names unique,
    no two with the same settings."""
    arms = [parse_arm(text) for text in texts]
    if len(arms) < 2:
        raise ArmError(f"ablate needs at least two arms (got {len(arms)}): e.g. --arm dense: "
                       "--arm binary:verifier.reward=binary")
    seen: dict[str, Arm] = {}
    for arm in arms:
        if arm.name in seen:
            raise ArmError(f"--arm {arm.name}: the name is given twice; every arm needs its own")
        twin = next((a for a in seen.values() if dict(a.settings) == dict(arm.settings)), None)
        if twin is not None:
            raise ArmError(f"--arm {arm.name}: the same settings as arm {twin.name} ({arm.describe()}); drop one")
        seen[arm.name] = arm
    return arms


def refusal(section: str, key: str) -> str | None:
    """Why an arm may not set ``[section] key`` (None: it may): the SFT phase, the tasks, the eval protocol, and
    what ablate sets itself."""
    reason = _REFUSED.get((section, key)) or _REFUSED.get((section, None))
    if reason is None and section == "campaign" and key.startswith(_SFT_PREFIX):
        reason = "it is the SFT phase's, and every arm shares one SFT policy"
    return reason


def plays_own_sft_passes(section: str, key: str) -> bool:
    """Whether an arm setting ``[section] key`` changes how a trial is played or scored, so that the SFT
    policy's passes must be played under the arm's own settings (not read from the base's log): every key of
    ``[sampler]``, ``[sandbox]`` and ``[verifier]`` but the training reward, and every other key that decides the
    SFT passes' draws (``t1_actors.job.sft.decides_sft_draws``: the turn, token and context budgets, the context
    strategy)."""
    if (section, key) in _TRAINING_ONLY:
        return False
    return section in _ROLLOUT_SECTIONS or decides_sft_draws(section, key)


def _section_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def check_key(arm: str, key: str) -> None:
    """``key`` names a field of the run config (``section.key``, ``section.table.key``) that an arm may set;
    ``ArmError`` naming the arm, the key and the fix otherwise."""
    parts = key.split(".")
    model: type[BaseModel] | None = RunConfig
    for depth, part in enumerate(parts):
        fields = model.model_fields if model is not None else {}
        if part not in fields:
            close = difflib.get_close_matches(part, list(fields), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(fields) or 'none'}"
            where = f"[{'.'.join(parts[:depth])}]" if depth else "the config"
            raise ArmError(f"--arm {arm}: {key}: {where} has no key {part!r} ({hint}; docs/config.md lists them)")
        model = _section_model(fields[part].annotation)
    reason = refusal(parts[0], parts[1])
    if reason is not None:
        raise ArmError(f"--arm {arm}: {key} is refused: {reason}. An arm may change how RL trains or plays trials, "
                       "never the SFT phase, the tasks or the eval protocol; set it in the config itself (then it "
                       "holds in every arm)")
    if model is not None:
        raise ArmError(f"--arm {arm}: {key} is a table; set its keys one by one ({key}.KEY=VALUE)")


def arm_data(raw: dict[str, Any], arm: Arm) -> dict[str, Any]:
    """The config's raw mapping (``[quick.*]`` applied) with the arm's settings written in; a key left unset
    keeps following what it follows (``[ppo] temperature`` follows ``[sampler] temperature``)."""
    data = copy.deepcopy(raw)
    for key, value in arm.settings:
        *tables, last = key.split(".")
        node = data
        for table in tables:
            node = node.setdefault(table, {})
        node[last] = value
    return data


def arm_config(raw: dict[str, Any], arm: Arm):
    """The arm's validated config; an ``ArmError`` naming the arm, its keys and the fix when the config refuses
    a value (every section and every rule across sections, as ``t1-actor check``)."""
    for key, _ in arm.settings:
        check_key(arm.name, key)
    try:
        return parse_config(arm_data(raw, arm), f"--arm {arm.name}")
    except ConfigError as error:
        keys = ", ".join(key for key, _ in arm.settings)
        raise ArmError(f"{error} (the arm sets {keys}; fix its value, or what it needs beside it in the same arm "
                       "with ';')") from None


def own_sft_passes(arm: Arm) -> bool:
    """Whether the arm plays the SFT policy's passes itself (``plays_own_sft_passes`` for any of its keys)."""
    return any(plays_own_sft_passes(*key.split(".")[:2]) for key, _ in arm.settings)


@dataclass(frozen=True)
class PlannedRun:
    """One run of the ablation: its arm (None: the base run of the config as it is), seed, directory and config,
    and where its SFT passes come from (``"played"`` here, or the run directory whose log holds them)."""

    arm: str | None
    seed: int
    run_dir: Path
    config: Any
    sft_passes: str


def _with_storage_prefix(config, prefix: str):
    url = config.section(StorageConfig).url
    if not url:
        return config
    data = config.to_jsonable()
    if config.run.hmac_key is not None:
        data["run"]["hmac_key"] = config.run.hmac_key.get_secret_value()
    data["storage"] = {**data["storage"], "url": f"{url}/{prefix}"}
    return parse_config(data, prefix)


def plan_ablation(raw: dict[str, Any], arms: list[Arm], *, seeds: int, out: Path,
                  base: Path | None) -> tuple[Path, list[PlannedRun]]:
    """The base run directory and every run, in the order they run (the base first when trained here, then seed
    by seed, arm by arm), each config built and validated: nothing starts unless every one is sound."""
    if seeds < 1:
        raise ArmError(f"--seeds {seeds}: run at least one seed")
    configs = {arm.name: arm_config(raw, arm) for arm in arms}  # every arm's keys and values first
    if base is not None and not (base / "summary.json").is_file():
        raise ArmError(f"--base {base}: no summary.json there; name a run directory whose campaign finished (its "
                       "SFT policy and SFT eval passes are what every arm starts from)")
    as_is = next((arm for arm in arms if not arm.settings), None)
    runs: list[PlannedRun] = []
    if base is None:
        name = as_is.name if as_is is not None else "base"
        base = out / name / "seed0" if as_is is not None else out / "base"
        config = _with_storage_prefix(parse_config(copy.deepcopy(raw), "the config"), name)
        runs.append(PlannedRun(as_is.name if as_is is not None else None, 0, base,
                               seed_config(config, seed=0, run_dir=base, base=None), "played"))
    for seed in range(seeds):
        for arm in arms:
            run_dir = out / arm.name / f"seed{seed}"
            if run_dir == base:
                continue
            own = own_sft_passes(arm)
            start, reuse = (base, not own) if seed == 0 or not own else (out / arm.name / "seed0", True)
            config = _with_storage_prefix(configs[arm.name], arm.name)
            try:
                run_config = seed_config(config, seed=seed, run_dir=run_dir, base=start, reuse_sft_passes=reuse)
                if reuse and start.joinpath("summary.json").is_file():
                    check_warm_start_passes(start, run_config)
            except (ConfigError, ValueError) as error:
                raise ArmError(f"--arm {arm.name}, seed {seed}: {error}") from None
            runs.append(PlannedRun(arm.name, seed, run_dir, run_config, str(start) if reuse else "played"))
    unfinished = [str(r.run_dir) for r in runs if has_log(r.run_dir) and not (r.run_dir / "summary.json").is_file()]
    if unfinished:
        raise ArmError(f"unfinished runs (a log, no summary.json): {', '.join(unfinished)}; move them away and run "
                       "again: the finished runs are kept")
    return base, runs


PLAN_FILE = "ablation.plan.json"


def check_plan(out: Path, arms: list[Arm], base: Path, quick: bool) -> dict[str, Any]:
    """``D/ablation.plan.json``: the arms' settings, the base and --quick of the runs already in D; a rerun may add
    arms and seeds but not give a name other settings, another base or another --quick (its finished runs would
    then be of another ablation)."""
    path, where = out / PLAN_FILE, str(base.resolve())
    plan = json.loads(path.read_text()) if path.is_file() else {"arms": {}, "base": where, "quick": quick}
    for arm in arms:
        settings = [[key, value] for key, value in arm.settings]
        if plan["arms"].setdefault(arm.name, settings) != settings:
            raise ArmError(f"--arm {arm.name}: {out} holds this arm with settings {plan['arms'][arm.name]}; give "
                           "the new settings another name, or use another --run-dir")
    if plan["base"] != where or plan["quick"] != quick:
        raise ArmError(f"{out} holds runs from base {plan['base']} (--quick {plan['quick']}); this call asks for "
                       f"{base} (--quick {quick}); use another --run-dir")
    return plan


def run_ablation(config_path: str | Path, arm_texts: list[str], *, seeds: int, out: Path, base: Path | None = None,
                 quick: bool = False, console=None, write_report=None) -> dict[str, Any]:
    """Validate every arm and run, then run what is not finished (see the module doc) and write the report
    after each run (it survives a later run's failure); returns the report."""
    console = console or Console(stderr=True)
    raw = read_config_data(config_path, quick=quick)
    arms = parse_arms(arm_texts)
    base_dir, runs = plan_ablation(raw, arms, seeds=seeds, out=out, base=base)
    out.mkdir(parents=True, exist_ok=True)
    plan = check_plan(out, arms, base_dir, quick)
    (out / PLAN_FILE).write_text(json.dumps(plan, indent=2))
    header = {"config": str(config_path), "quick": quick, "seeds": seeds, "base": str(base_dir),
              "base_trained_here": base is None}
    described = [{"name": arm.name, "settings": dict(arm.settings), "describe": arm.describe(),
                  "sft_passes": ("its own: played in its seed 0 under its settings, read by its later seeds"
                                 if own_sft_passes(arm) else f"the base's ({base_dir})")} for arm in arms]
    for i, run in enumerate(runs):
        title = f"{run.arm or 'base'} seed {run.seed} ({i + 1} of {len(runs)}): {run.run_dir}"
        if run_once(run.config, run.run_dir, title, console=console, write_report=write_report):
            write_ablation(out, header, described, runs)  # the report so far survives a later run's failure
    report = write_ablation(out, header, described, runs)
    console.print((out / "ablation.md").read_text())
    return report
