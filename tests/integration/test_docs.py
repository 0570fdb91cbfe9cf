"""The README's options reference and docs/cli.md are generated from the real CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_is_current():
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_cli_reference.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_readme_quick_start_is_two_make_commands():
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("##", 1)[0]
    assert "$ make demo" in quick_start and "$ make test" in quick_start
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_from_python_examples_run(monkeypatch):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]
    assert len(blocks) >= 4  # pyarrow, polars, pandas, datasets
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {}
    exec(compile("\n".join(blocks), "README.md (From Python)", "exec"), namespace)
    assert namespace["table"].column_names[-2:] == ["advantage", "group_active"]  # type: ignore[attr-defined]
    assert namespace["lazy"].select("group_active").collect()["group_active"].sum() == 168  # type: ignore[attr-defined]


def test_readme_dump_examples_are_real_output():
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_dump_examples.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
