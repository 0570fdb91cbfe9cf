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
    """A printed line without what changes from run to run or machine to machine: times and sizes.

    >>> _masked("uploaded 9.7 MiB in 1 object(s); 10.4 MiB of the input's column chunks copied")
    "uploaded SIZE in 1 object(s); SIZE of the input's column chunks copied"
    """
    if line.startswith("time "):
        return "time ..."
    return re.sub(r"\b\d+(\.\d+)? [KMG]?i?B\b", "SIZE", line.rstrip())


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
    """Every example of the README (on the sample data it ships) runs, in order, in a folder of
    its own (no collision with a clone's files), and prints the lines it shows (standard output
    and error as a terminal interleaves them, at 200 columns; times and sizes masked)."""
    (tmp_path / "out").mkdir()  # the quick start's `make demo` writes there
    ran, not_run = _run_examples(ROOT / "README.md", tmp_path, columns=200)
    assert len(ran) >= 7 and all(reason.endswith("(sets up .venv)") for reason in not_run), (ran, not_run)
    print("ran:", *ran, sep="\n  ")


NOT_RUN = {
    "--ray-address": "joins a running Ray cluster",
    "pip install": "installs packages",
    "ray start": "starts a Ray cluster's machines",
    "ray stop": "stops a Ray cluster's machines",
    "make demo": "sets up .venv",
    "make test": "sets up .venv",
}
"""Docs examples that name these are shown, not run here, for the reason given."""

SHELL_TOOLS = {"grpo-cli", "echo", "cat", "mkdir", "cp", "touch", "gzip", "head", "tail", "jq"}
"""What a docs example may run: grpo-cli and the tools that make its input or read its output."""

DOCS_PAGES = sorted(
    page.name
    for page in (ROOT / "docs").glob("*.md")
    if any(command.startswith("grpo-cli ") for command, _ in _console_examples(page.read_text()))
)


def _tools(command: str) -> set[str]:
    """The programs a shell line runs (the first word of each command of its pipelines).

    >>> sorted(_tools("cat a | grpo-cli compute - -o x -q && jq -c '.a | .b' x"))
    ['cat', 'grpo-cli', 'jq']
    """
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tools, starts = set(), True
    for token in lexer:
        if token in {"|", "||", "&&", ";"}:
            starts = True
        elif starts:
            tools.add(token)
            starts = False
    return tools


def _not_run(command: str) -> str | None:
    for needle, reason in NOT_RUN.items():
        if needle in command:
            return reason
    return None


def _run_examples(
    page: Path, folder: Path, *, columns: int, stores: dict[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """Run ``page``'s ``$`` examples in order in ``folder`` (given a copy of the shipped sample
    data): an example that shows output must print it (times and sizes masked; ``...`` any
    lines), one that shows none must succeed; ``$ echo $?`` shows the exit code before it.
    ``stores``: the environment that points the object stores at loopback servers (which
    hold what the examples read). Returns the examples run and those :data:`NOT_RUN` names,
    with the reason."""
    shutil.copytree(ROOT / "sample_data", folder / "sample_data")
    bin_dir = str(Path(sys.executable).parent)  # grpo-cli's entry point, installed beside python
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, **(stores or {}), "COLUMNS": str(columns), "NO_COLOR": "1", "PATH": path}
    examples = _console_examples(page.read_text())
    needed = {tool for command, _ in examples if _not_run(command) is None for tool in _tools(command)}
    missing = sorted(tool for tool in needed & SHELL_TOOLS if shutil.which(tool, path=path) is None)
    if missing:
        pytest.skip(f"{page.name}'s examples run {', '.join(missing)}, which this machine lacks")
    ran, not_run, last_code = [], [], 0
    for command, shown in examples:
        reason = _not_run(command)
        if reason is not None:
            not_run.append(f"{command}  ({reason})")
            continue
        if command == "echo $?":
            assert shown == [str(last_code)], f"{page.name}: exit code {last_code}, the page shows {shown}"
            continue
        tools = _tools(command)
        assert tools <= SHELL_TOOLS, f"{page.name}: $ {command} runs {sorted(tools - SHELL_TOOLS)}"
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        last_code = done.returncode
        if shown:
            assert _matches(shown, done.stdout.splitlines()), (
                f"{page.name}: $ {command}\nprinted:\n{done.stdout}"
            )
        else:
            assert done.returncode == 0, f"{page.name}: $ {command}\nprinted:\n{done.stdout}"
        ran.append(command)
    return ran, not_run


STORE_SCHEMES = ("s3://", "gs://", "hf://")


@pytest.mark.slow
@pytest.mark.parametrize("page", DOCS_PAGES)
def test_docs_console_examples_print_what_they_show(page, tmp_path, request):
    """Each docs page's examples run as the README's do (:func:`_run_examples`), at the 100
    columns the generated examples are drawn at: the files an example uses are shipped, or an
    earlier example of the page makes them; a page that names buckets runs against loopback
    servers that hold them (:func:`loopback_stores`). Only those :data:`NOT_RUN` names are left
    out, each with its reason; the test lists both."""
    text = (ROOT / "docs" / page).read_text()
    runs_on_stores = any(
        scheme in command and _not_run(command) is None
        for command, _ in _console_examples(text)
        for scheme in STORE_SCHEMES
    )
    stores = request.getfixturevalue("loopback_stores") if runs_on_stores else None
    ran, not_run = _run_examples(ROOT / "docs" / page, tmp_path, columns=100, stores=stores)
    assert ran, f"{page}: no example ran"
    print(f"{page}: ran", *ran, sep="\n  ")
    print(f"{page}: not run", *not_run, sep="\n  ")


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


@pytest.fixture
def loopback_stores(s3, s3_server, gcs, gcs_server, hub, tmp_path):
    """The buckets and the repo docs/storage.md's examples name, on loopback servers, holding
    the shipped sample data: ``s3://bucket/run/`` and ``gs://bucket/run/`` four shards of
    ``sample_data/steps.parquet`` (two steps each), ``s3://bucket/dumps/verl/`` the verl dump,
    ``s3://rollouts/run/`` four shards of text past 5 MiB each and
    ``s3://rollouts/big/sorted.parquet`` a million rows of sorted integer IDs,
    ``hf://datasets/me/rollouts/data/train.parquet`` the steps file. The
    environment that points grpo-cli at them, with no credential of this machine's (the
    ``s3``, ``gcs`` and ``hub`` fixtures' fresh servers, with this process pointed at them)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    steps = pq.read_table(ROOT / "sample_data" / "steps.parquet")
    shards = {}
    for index in range(4):
        keep = pa.compute.is_in(steps.column("step"), pa.array([2 * index + 1, 2 * index + 2]))
        path = tmp_path / f"step-{index + 1}.parquet"
        pq.write_table(steps.filter(keep), path)
        shards[f"run/step-{index + 1}.parquet"] = path.read_bytes()
    ids = np.arange(1_000_000) // 8  # with float64 rewards, past S3's 5 MiB least part: copied in the store
    big = tmp_path / "sorted.parquet"
    pq.write_table(pa.table({"group_id": ids, "reward": np.random.default_rng(0).random(ids.size)}), big)
    dump = {
        f"dumps/verl/{p.name}": p.read_bytes() for p in sorted((ROOT / "sample_data/dumps/verl").iterdir())
    }
    rng = np.random.default_rng(1)
    with_text = {}  # four shards past 5 MiB, mostly their text: a spliced output copies it in the store
    for index in range(4):
        rows = 48_000
        raw = rng.bytes(rows * 64)
        completion = pa.array([raw[at : at + 64].hex() for at in range(0, len(raw), 64)])
        uid = pa.array([f"prompt-{index}-{n // 8}" for n in range(rows)])
        reward = (rng.random(rows) < 0.5).astype(np.float32)
        path = tmp_path / f"text-{index}.parquet"
        pq.write_table(pa.table({"uid": uid, "completion": completion, "reward": reward}), path)
        with_text[f"run/part-{index}.parquet"] = path.read_bytes()

    for bucket, objects in (
        ("bucket", {**shards, **dump}),
        ("rollouts", {**with_text, "big/sorted.parquet": big.read_bytes()}),
    ):
        if bucket != "rollouts":  # the fixture's own bucket
            s3.create_bucket(Bucket=bucket)
        for key, data in objects.items():
            s3.put_object(Bucket=bucket, Key=key, Body=data)
    gcs.mkdir("bucket")
    for key, data in shards.items():
        gcs.pipe(f"bucket/{key}", data)
    train = (ROOT / "sample_data" / "steps.parquet").read_bytes()
    hub.repos["me/rollouts"] = {"main": {"README.md": b"# rollouts\n", "data/train.parquet": train}}
    return {
        **s3_server.env,
        **gcs_server.env,
        "HF_ENDPOINT": hub.endpoint,
        "HF_TOKEN_PATH": str(tmp_path / "no-hf-token"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


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
