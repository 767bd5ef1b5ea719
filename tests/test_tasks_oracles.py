"""Every synthetic family, through the project's local sandbox and verifier: the oracle passes every test,
a no-op passes at most half, and the oracle's first command alone earns partial credit (the dense
P / S reward has something to pay for). The tasks are laid down, run and verified exactly as in a
campaign: LocalSandboxBackend.open -> exec per command -> Verifier.verify."""

from __future__ import annotations

import pytest

from t1_actors.tasks import FAMILIES, Task, generate


def _run(backend, verifier, task: Task, commands: list[str], label: str):
    with backend.open(task, f"{task.id}-{label}") as sandbox:
        exits = [sandbox.exec(command).exit_code for command in commands]
        return exits, verifier.verify(task, sandbox.trial_root)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Per family, one train task run three ways: the oracle, no command, the oracle's first command."""
    try:
        from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig, SandboxInfraError
        from t1_actors.verify.engine import Verifier, VerifierConfig
    except ImportError as exc:  # the sandbox is another module's; say so rather than pass silently
        pytest.fail(f"the local sandbox / verifier cannot be imported: {exc}")
    base = tmp_path_factory.mktemp("tasks-sandbox")
    try:
        backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(base / "sandbox")))
    except SandboxInfraError as exc:
        pytest.skip(f"no local sandbox on this machine: {exc}")
    variants = {"oracle": lambda t: t.oracle.commands, "noop": lambda t: [], "first": lambda t: t.oracle.commands[:1]}
    results = []
    with Verifier(VerifierConfig(base_dir=str(base / "verifier"))) as verifier:
        for task in generate("train", len(FAMILIES), seed=7):
            for label, commands in variants.items():
                exits, verification = _run(backend, verifier, task, commands(task), label)
                results.append((task, label, exits, verification))
    backend.close()
    return results


def test_every_family_is_exercised(outcomes):
    assert {task.family for task, _, _, _ in outcomes} == set(FAMILIES)


def test_no_infrastructure_error_or_tamper_flag(outcomes):
    assert [(t.id, label, v.infra_error, v.tamper_flags) for t, label, _, v in outcomes
            if v.infra_error or v.tamper_flags] == []


def test_oracle_commands_succeed(outcomes):
    assert [(t.id, exits) for t, label, exits, _ in outcomes if label == "oracle" and any(exits)] == []


def test_oracle_passes_every_test(outcomes):
    for task, label, _, verification in outcomes:
        if label == "oracle":
            assert verification.total == task.metadata["checks"], task.id
            assert verification.passed == verification.total and verification.resolved, (task.id, verification.tests)
            assert verification.reward == pytest.approx(verification.total / 20)


def test_noop_passes_at_most_half(outcomes):
    for task, label, _, verification in outcomes:
        if label == "noop":
            assert verification.total == task.metadata["checks"], task.id
            assert verification.passed <= verification.total / 2, (task.id, verification.tests)


def test_first_command_alone_earns_partial_credit(outcomes):
    for task, label, _, verification in outcomes:
        if label == "first":
            assert 0 < verification.passed < verification.total, (task.id, verification.tests)


@pytest.fixture(scope="module")
def new_kinds(tmp_path_factory):
    """Recovery, nested and composite tasks (two of each side), each run by its oracle and by its oracle
    without the recovery's ``mkdir``."""
    from t1_actors.backends.local_sandbox import LocalSandboxBackend, LocalSandboxConfig, SandboxInfraError
    from t1_actors.tasks.synthetic import generate_composite, generate_nested, generate_recovery
    from t1_actors.verify.engine import Verifier, VerifierConfig

    base = tmp_path_factory.mktemp("new-kinds")
    try:
        backend = LocalSandboxBackend(LocalSandboxConfig(base_dir=str(base / "sandbox")))
    except SandboxInfraError as exc:
        pytest.skip(f"no local sandbox on this machine: {exc}")
    tasks = (generate_recovery("train", 9, seed=5) + generate_recovery("eval", 4, seed=5)
             + generate_nested("train", 9, seed=5) + generate_composite("train", 3, seed=5)
             + generate_composite("eval", 3, seed=5))
    results = []
    with Verifier(VerifierConfig(base_dir=str(base / "verifier"))) as verifier:
        for task in tasks:
            results.append((task, "oracle", *_run(backend, verifier, task, task.oracle.commands, "oracle")))
            if task.family.startswith("recovery"):
                results.append((task, "no_mkdir", *_run(backend, verifier, task, task.oracle.commands[1:], "skip")))
    backend.close()
    return results


def test_new_task_kinds_pass_their_oracles_and_recovery_needs_the_mkdir(new_kinds):
    for task, label, exits, verification in new_kinds:
        assert verification.infra_error is None and not verification.tamper_flags, task.id
        if label == "oracle":
            assert exits == [0] * len(exits), (task.id, exits)
            assert verification.resolved and verification.total == task.metadata["checks"], (task.id, verification.tests)
        else:  # the write into the missing directory fails: partial credit at most, never resolved
            assert any(exits) and not verification.resolved, task.id
