"""The docs cannot drift from the tool: the options reference and the estimator table are
generated from the real CLI, the dump examples are real runs, the README's console examples run
here and print what they show, and the Python examples run."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_docs_from_python_examples_run(monkeypatch):
    page = (ROOT / "docs" / "python.md").read_text()
    section = page.split("## From Python", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]
    assert len(blocks) >= 4  # pyarrow, polars, pandas, datasets
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {}
    exec(compile("\n".join(blocks), "docs/python.md (From Python)", "exec"), namespace)
    assert namespace["table"].column_names[-2:] == ["advantage", "group_active"]  # type: ignore[attr-defined]
    assert namespace["lazy"].select("group_active").collect()["group_active"].sum() == 168  # type: ignore[attr-defined]


def test_readme_dump_examples_are_real_output():
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_dump_examples.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_readme_python_example_runs(monkeypatch):
    readme = (ROOT / "README.md").read_text()
    [block] = [part.split("```", 1)[0] for part in readme.split("```python\n")[1:]]
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["out"].columns[-2:] == ["advantage", "group_active"]  # type: ignore[attr-defined]


def _masked(line: str) -> str:
    """A printed line without what changes from run to run or machine to machine."""
    if line.startswith("time "):
        return "time ..."
    return re.sub(r"\(\d+ shard\(s\), [\d.]+ [KMG]?i?B", "(N shard(s), SIZE", line.rstrip())


def _console_examples(text: str) -> list[tuple[str, list[str]]]:
    """Each ``$ command`` of a ``console`` block with the lines shown after it."""
    examples: list[tuple[str, list[str]]] = []
    for block in text.split("```console\n")[1:]:
        for line in block.split("\n```", 1)[0].splitlines():
            if line.startswith("$ "):
                examples.append((line[2:].split("  #", 1)[0].strip(), []))
            elif examples:
                examples[-1][1].append(line)
    return examples


def _matches(shown: list[str], printed: list[str]) -> bool:
    """Whether ``printed`` is ``shown``, where a ``...`` line stands for any lines."""
    if not shown:
        return not printed
    if shown[0] == "...":
        return any(_matches(shown[1:], printed[i:]) for i in range(len(printed) + 1))
    return bool(printed) and _masked(shown[0]) == _masked(printed[0]) and _matches(shown[1:], printed[1:])


def test_readme_console_examples_print_what_they_show(tmp_path):
    """Every ``grpo-cli`` example of the README (on the sample data it ships) runs, in order, in a
    folder of its own (no collision with a clone's files), and prints the lines it shows
    (standard output and error as a terminal interleaves them; times and sizes masked); ``$ echo
    $?`` shows the exit code of the command before it."""
    shutil.copytree(ROOT / "sample_data", tmp_path / "sample_data")
    (tmp_path / "out").mkdir()
    ran, last_code = [], 0
    for command, shown in _console_examples((ROOT / "README.md").read_text()):
        if command == "echo $?":
            assert shown == [str(last_code)], f"exit code {last_code}, the README shows {shown}"
            continue
        if not command.startswith("grpo-cli "):
            continue
        done = subprocess.run(
            [sys.executable, "-m", "grpo_cli", *shlex.split(command)[1:]],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        last_code = done.returncode
        printed = done.stdout.splitlines()
        assert _matches(shown, printed), f"$ {command}\nprinted:\n{done.stdout}"
        ran.append(command)
    assert len(ran) >= 7, ran
    print("ran:", *ran, sep="\n  ")


@pytest.mark.parametrize(
    ("shown", "printed", "matches"),
    [
        (["a", "...", "c"], ["a", "b", "b", "c"], True),
        (["a", "c"], ["a", "b", "c"], False),
        (["time 0.02 s (in-memory, cpu)"], ["time 1.5 s (in-memory, cpu)"], True),
        (["...", "FAIL x"], ["PASS x"], False),
    ],
)
def test_the_example_matcher_fails_what_differs(shown, printed, matches):
    assert _matches(shown, printed) is matches


def test_every_docs_example_uses_options_the_cli_has():
    """A ``$ grpo-cli ...`` line anywhere in the README or the docs names only options the CLI
    takes (docs/storage.md showed ``--min-active-fraction``, which never existed), and each
    runs where its files are shipped (the README's: above)."""
    from grpo_cli.options.catalog import OPTIONS

    flags = {flag for row in OPTIONS.values() for flag in row.flags} | {"--help", "--version", "-h"}
    wrong = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for command, _ in _console_examples(page.read_text()):
            if command.startswith("grpo-cli "):
                used = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", command)
                wrong += [f"{page.name}: {flag} in $ {command}" for flag in used if flag not in flags]
    assert not wrong, wrong
