"""The long families (chain, pipeline, explore): 8-14 oracle turns, each step needing an earlier command's
output; drawn only by name, so the default corpus is what it was. Their oracles run in the project's local
sandbox and verifier, as in a campaign (LocalSandboxBackend.open -> exec per command -> Verifier.verify)."""

from __future__ import annotations

import ast
import re
import statistics

import pytest

from t1_actors.tasks import FAMILIES, Task, available_families, generate, split_of
from t1_actors.tasks.synthetic import LONG_FAMILIES, generate_nested
from t1_actors.tasks.synthetic._draft import NAMES, WORDS

LONG = sorted(LONG_FAMILIES)
TOOL_OUTPUT_CHARS = 240  # the harness's default cut ([campaign] tool_output_chars)
SHELL_WORDS = {"echo", "cat", "cp", "mkdir", "grep", "-l"}  # the programs the oracles run, known to any agent


@pytest.fixture(scope="module")
def drawn() -> dict[str, list[Task]]:
    return {name: generate("train", 40, seed=0, families=[name]) for name in LONG}


def test_long_families_are_drawn_only_by_name():
    assert LONG == ["chain", "explore", "pipeline"]
    assert not set(LONG) & set(FAMILIES)
    assert available_families() == list(FAMILIES)
    assert not {t.family for t in generate("train", 2 * len(FAMILIES), seed=0)} & set(LONG)
    assert available_families(["chain", "head_tail", "pipeline"]) == ["chain", "head_tail", "pipeline"]
    mixed = generate("train", 6, seed=1, families=["chain", "head_tail", "explore"])
    assert [t.family for t in mixed] == ["chain", "head_tail", "explore"] * 2
    # recovery and nested tasks wrap the single-turn families only, whatever the list names
    assert {t.metadata["parts"][0] for t in generate_nested("train", 4, seed=1, families=["chain", "head_tail"])} \
        == {"head_tail"}


def test_same_seed_same_tasks_other_seed_other_tasks():
    first = generate("train", 30, seed=4, families=LONG)
    assert first == generate("train", 30, seed=4, families=LONG)
    assert not {t.id for t in first} & {t.id for t in generate("train", 30, seed=5, families=LONG)}


def test_oracles_are_long_and_vary(drawn):
    for name, tasks in drawn.items():
        turns = [len(t.oracle.commands) for t in tasks]
        assert statistics.median(turns) >= 8 and min(turns) >= 8 and max(turns) <= 14, (name, turns)
        assert len(set(turns)) >= 3, (name, turns)
        assert all(t.oracle.script.splitlines()[2:] == t.oracle.commands for t in tasks)
        assert all(len(command) <= 72 for t in tasks for command in t.oracle.commands), name


def test_a_long_task_has_the_turns_its_oracle_and_answer_need(drawn):
    """A task's own turn cap wins over the run's: the default 8 would end every long oracle before its end."""
    for tasks in drawn.values():
        assert all(t.limits.max_turns >= len(t.oracle.commands) + 1 for t in tasks)
    assert all(t.limits.max_turns == 8 for t in generate("train", len(FAMILIES), seed=0))  # the others as they were


def test_checks_unique_and_within_the_reward_scale(drawn):
    for tasks in drawn.values():
        for task in tasks:
            (source,) = task.tests.files.values()
            tests = [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
            assert len(tests) == len(set(tests)) == task.metadata["checks"], task.id
            assert 5 <= task.metadata["checks"] <= 20, task.id


def test_instructions_unique_short_and_split_by_hash(drawn):
    for name, tasks in drawn.items():
        assert len({t.instruction for t in tasks}) == len(tasks), name
        assert all(len(t.instruction.split()) <= 45 and t.instruction.endswith(".") for t in tasks)
        assert all(split_of(t.family, t.instruction) == "train" for t in tasks)
    evaluation = generate("eval", 30, seed=0, families=LONG)
    assert not {t.instruction for ts in drawn.values() for t in ts} & {t.instruction for t in evaluation}


def test_small_vocabularies(drawn):
    """Every name and word of a task (paths, quoted words, file contents) comes from _draft's vocabularies."""
    known = set(NAMES) | set(WORDS) | {"app", "txt", "next", "end", "sort", "uniq", "head", "tail", "grep",
                                       "n", "r", "u", "v"}
    for tasks in drawn.values():
        for task in tasks:
            blob = " ".join([*task.environment.files, *(f.content for f in task.environment.files.values())])
            assert set(re.findall(r"[a-z]+", blob)) <= known, task.id


def test_instruction_does_not_reveal_the_way(drawn):
    """Stage names after the first, filters, end words and the files to copy are only in the task's files."""
    for task in drawn["chain"]:
        files = task.environment.files
        start = re.search(r"from (\S+):", task.instruction).group(1)
        assert start in files
        for path, spec in files.items():
            assert (path == start) == (path in task.instruction), task.id
            assert spec.content.split()[-1] not in task.instruction, task.id  # the next path, or the quoted word
    for task in drawn["pipeline"]:
        start = re.search(r"from (\S+):", task.instruction).group(1)
        stages = {p: f.content for p, f in task.environment.files.items() if p.startswith(start.rsplit("/", 1)[0])}
        assert [path for path in stages if path in task.instruction] == [start], task.id
        assert not any(body.splitlines()[0] in task.instruction for body in stages.values()), task.id
    for task in drawn["explore"]:
        assert not any(path.split("/")[3] in task.instruction or path.split("/")[4] in task.instruction
                       for path in task.environment.files), task.id


def test_no_pipeline_stage_filters_with_sed(drawn):
    """sed's words were no tokens the policy could copy (``s/door/`` is ``/d o or`` to the path-component
    tokenizer): no stage file, on the way or a decoy, gives a sed filter."""
    filters = [f.content.splitlines()[0] for task in drawn["pipeline"] for f in task.environment.files.values()]
    assert filters and not any(f.startswith("sed") for f in filters)


def _run(backend, verifier, task: Task, commands: list[str], label: str):
    with backend.open(task, f"{task.id}-{label}") as sandbox:
        results = [sandbox.exec(command) for command in commands]
        return results, verifier.verify(task, sandbox.trial_root)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Two train tasks and one eval task per long family, each run by its oracle, by no command, and by the
    first half of its oracle."""
    from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig, SandboxInfraError
    from t1_actors.verify.engine import Verifier, VerifierConfig

    base = tmp_path_factory.mktemp("long-tasks")
    try:
        backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(base / "sandbox")))
    except SandboxInfraError as exc:
        pytest.skip(f"no local sandbox on this machine: {exc}")
    tasks = generate("train", 2 * len(LONG), seed=8, families=LONG) + generate("eval", len(LONG), seed=8, families=LONG)
    variants = {"oracle": lambda c: c, "noop": lambda c: [], "half": lambda c: c[: len(c) // 2]}
    results = []
    with Verifier(VerifierConfig(base_dir=str(base / "verifier"))) as verifier:
        for task in tasks:
            for label, commands in variants.items():
                results.append((task, label, *_run(backend, verifier, task, commands(task.oracle.commands), label)))
    backend.close()
    return results


def test_every_long_family_is_run(outcomes):
    assert {task.family for task, *_ in outcomes} == set(LONG)


def test_oracle_passes_every_check_and_prints_short_outputs(outcomes):
    for task, label, results, verification in outcomes:
        assert verification.infra_error is None and not verification.tamper_flags, task.id
        if label == "oracle":
            assert [r.exit_code for r in results] == [0] * len(results), (task.id, results)
            assert all(len(r.stdout + r.stderr) <= TOOL_OUTPUT_CHARS for r in results), task.id
            assert verification.total == task.metadata["checks"], task.id
            assert verification.resolved and verification.passed == verification.total, (task.id, verification.tests)
            assert verification.reward == pytest.approx(verification.total / 20)


def test_doing_nothing_passes_no_check(outcomes):
    for task, label, _, verification in outcomes:
        if label == "noop":
            assert verification.total == task.metadata["checks"] and verification.passed == 0, (task.id,
                                                                                                 verification.tests)


def test_half_the_way_earns_partial_credit(outcomes):
    for task, label, _, verification in outcomes:
        if label == "half":
            assert 0 < verification.passed < verification.total, (task.id, verification.tests)


def test_each_step_needs_an_earlier_output(outcomes):
    """Each piece of an oracle command (a name, a word, a filter's count) is in the instruction or was printed
    by an earlier command (directly, or through an earlier command that copied it from an output), and at
    least half the commands hold a piece the instruction lacks: no agent writes them from the instruction."""
    for task, label, results, _ in outcomes:
        if label != "oracle":
            continue
        known, from_outputs = task.instruction, 0
        for command, result in zip(task.oracle.commands, results):
            pieces = [p for p in re.findall(r"[A-Za-z0-9_.-]+", command) if p not in SHELL_WORDS]
            assert all(piece in known for piece in pieces), (task.id, command)
            from_outputs += any(piece not in task.instruction for piece in pieces)
            known += "\n" + command + "\n" + result.stdout
        assert from_outputs >= len(task.oracle.commands) / 2, task.id


def test_explore_copies_in_the_order_grep_lists(outcomes):
    """The SFT chat is consistent: after each grep -l the oracle copies the files in the order it printed them."""
    for task, label, results, _ in outcomes:
        if label == "oracle" and task.family == "explore":
            commands, listed = task.oracle.commands, []
            for command, result in zip(commands, results):
                if command.startswith("grep"):
                    listed += result.stdout.split()
            assert listed == [c.split()[1] for c in commands if c.startswith("cp ")], task.id


def test_explore_lists_the_whole_tree_once_and_copies_far_from_it(outcomes):
    """One grep lists every file to copy as a whole path (what each ``cp`` copies), across 2-3 subdirectories."""
    for task, label, results, _ in outcomes:
        if label == "oracle" and task.family == "explore":
            commands = task.oracle.commands
            assert [c.split()[0] for c in commands] == ["mkdir", "grep"] + ["cp"] * (len(commands) - 2), task.id
            listed = results[1].stdout.split()
            assert 6 <= len(listed) <= 8 and len({path.split("/")[3] for path in listed}) >= 2, task.id


def test_t1_audit_passes_one_task_of_each_long_family():
    """t1-audit's executed gates: the oracle passes, the no-op fails, no dropped step or prefix passes (a
    plain grep, like cat, changes nothing and is not dropped), no check on a file the agent cannot know of."""
    from tools._audit.task_checks import audit_task
    from tools._audit.task_runner import LocalTrialRunner

    try:
        runner = LocalTrialRunner()
    except Exception as exc:
        pytest.skip(f"the local sandbox cannot run here: {exc}")
    try:
        for task in generate("eval", len(LONG), seed=3, families=LONG):
            audit = audit_task(task, runner, determinism=False)
            assert audit.ok, audit.to_json()
    finally:
        runner.close()


@pytest.mark.parametrize("quick", [False, True])
def test_long_toml_mixes_long_tasks_into_every_split(quick):
    """configs/long.toml: >= 40 turns, a 4096-token context with a context strategy, the long families in
    SFT's, RL's, validation's and eval's tasks beside the single-turn and recovery ones, and a validation probe
    during RL."""
    from pathlib import Path

    from t1_actors.job.config import load_config
    from t1_actors.schedule import CampaignConfig
    from t1_actors.tasks.config import TasksConfig, build_task_sets

    config = load_config(Path(__file__).resolve().parent.parent / "configs" / "long.toml", quick=quick)
    campaign = config.section(CampaignConfig)
    assert campaign.max_turns >= 40 and campaign.max_context >= 4096 and campaign.context_strategy != "end"
    assert campaign.sft_max_len >= 1024  # SFT keeps the long oracle chats (530-830 tokens + the system prompt)
    sets = build_task_sets(config.section(TasksConfig))
    for split in (sets.sft, sets.rl, sets.validation, sets.eval):
        families = {t.family for t in split}
        assert families & set(LONG) and families - set(LONG), families
    assert any(t.metadata["area"] == "recovery" for t in sets.eval) and any(t.metadata["area"] == "recovery"
                                                                           for t in sets.rl)
    # the resolved rate along RL: a probe every 10 of its 40 steps (one after step 2 of 3 with --quick) on the first
    # validation tasks, long ones among them
    from t1_actors.eval.protocol import EvalConfig, probe_due, probe_task_ids

    probe = config.section(EvalConfig)
    assert [k for k in range(campaign.rl_steps + 1) if probe_due(k, probe.probe_every, campaign.rl_steps)] == (
        [2] if quick else [10, 20, 30])
    probed = [sets.by_id[i].family for i in probe_task_ids([t.id for t in sets.validation], probe)]
    assert len(probed) == (4 if quick else 24) and set(probed) & set(LONG)
