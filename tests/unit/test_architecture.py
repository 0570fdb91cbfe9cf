"""The module map in docs/architecture.md matches the code's imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "grpo_cli"
MAP = ROOT / "docs" / "architecture.md"
NAMESPACES = {"engines", "options", "inputs", "outputs", "results", "run", "trainers", "arrow"}
"""Folders whose ``__init__`` holds a docstring alone: their modules are mapped one by one."""
NOT_MAPPED = {"__init__", "__main__", *NAMESPACES}  # re-exports, the entry point, namespaces


def documented_map() -> dict[str, set[str]]:
    """Module -> the project modules it may import, from the table in docs/architecture.md."""
    rows = re.findall(r"^\| `([\w.]+)` \| .+? \| (.+) \|$", MAP.read_text(), flags=re.MULTILINE)
    assert rows, "no module table found in docs/architecture.md"
    return {module: set(re.findall(r"`([\w.]+)`", allowed)) for module, allowed in rows}


def project_modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        if name not in NOT_MAPPED:
            modules[name] = path
    return modules


def imported(path: Path) -> set[str]:
    """Every grpo_cli module (or package attribute) ``path`` imports, at any level."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("grpo_cli")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grpo_cli"):
            if node.module == "grpo_cli" or node.module.removeprefix("grpo_cli.") in NAMESPACES:
                names |= {f"{node.module}.{a.name}" for a in node.names}
            else:
                names.add(node.module)
    return {name.removeprefix("grpo_cli.") for name in names}


def test_every_module_is_on_the_map_and_nothing_else():
    assert set(documented_map()) == set(project_modules())


@pytest.mark.parametrize("module", sorted(project_modules()))
def test_module_imports_only_what_the_map_allows(module):
    allowed = documented_map()[module]
    extra = imported(project_modules()[module]) - allowed
    assert not extra, f"{module} imports {sorted(extra)}, which docs/architecture.md does not allow"


@pytest.mark.parametrize("module", sorted(project_modules()))
def test_every_allowance_on_the_map_is_used(module):
    unused = documented_map()[module] - imported(project_modules()[module])
    assert not unused, f"docs/architecture.md lets {module} import {sorted(unused)}, which it does not"


def test_engines_are_siblings_and_only_jobs_runs_them():
    engines = ("engines.local", "engines.ray")

    def engine_of(module: str) -> str | None:
        return next(
            (engine for engine in engines if module == engine or module.startswith(f"{engine}.")), None
        )

    importers = {
        module
        for module, path in project_modules().items()
        for used in imported(path)
        if engine_of(used) is not None and engine_of(used) != engine_of(module)
    }
    assert importers == {"jobs"}


@pytest.mark.parametrize("path", sorted((PACKAGE / "kernel").glob("*.py")), ids=lambda path: path.stem)
def test_kernel_imports_only_torch_and_the_vocabulary(path):
    tree = ast.parse(path.read_text())
    top_level = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            top_level |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            top_level.add(node.module.split(".")[0] if node.level == 0 else node.module)
    standard = {"__future__", "math", "threading", "collections", "dataclasses", "typing", "grpo_cli"}
    third_party = top_level - standard
    assert third_party <= {"torch"}
    ours = {name for name in imported(path) if not name.startswith("kernel.")}
    assert ours <= {"choices"}, ours
