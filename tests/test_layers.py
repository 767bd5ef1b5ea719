"""The floors hold by code: the import contract in pyproject.toml ([tool.importlinter]) passes on the code as it
is, and fails, naming the import, when a lower floor imports a higher one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("schemas", "storage", "t1_actors", "tools")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), str(tree / "pyproject.toml"), "--no-cache"], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=300)


def copy_sources(dest: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "assets", "*.json"))
    return dest


def test_the_contract_holds_on_the_code_as_it_is():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract_naming_it(tmp_path):
    tree = copy_sources(tmp_path)
    kept = lint_imports(tree)
    assert kept.returncode == 0, kept.stdout + kept.stderr  # the copy itself keeps it
    writer = tree / "storage" / "_writer.py"
    writer.write_text(writer.read_text() + "\nfrom t1_actors.job import config as _upward  # the floor below the job\n")
    broken = lint_imports(tree)
    assert broken.returncode != 0
    assert "storage is not allowed to import t1_actors.job" in broken.stdout
    assert "storage._writer -> t1_actors.job.config" in broken.stdout


MAX_MODULE_LINES = 400  # small modules behind small public faces (docs/architecture.md)


def test_every_module_of_the_packages_stays_small():
    long = {str(path.relative_to(ROOT)): n for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them): {long}"
