"""``--from TRAINER`` on dump folders damaged the ways real folders get damaged (issue #67 D):
an empty step file, a copied step file, two files of one step, a link to nothing, link loops
under a ``**`` glob, a 50 MB line, a folder named one level too high. Each damage on every
layout it applies to, from the committed dumps (written by the trainers' own writer code)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import assert_one_line_error
from tests.oracles.test_dumps import DUMP_ROOT, FROM, TRUTH, folder_of

# Where one more step's file goes, as each trainer names it (relative to its dump folder).
NEW_STEP = {
    "verl": "4.jsonl",
    "verl-v1": "4.jsonl",
    "trl": "completions/completions_00040.parquet",
    "nemo-rl": "train_data_step4.jsonl",
    "roll": "rollout_dump_data.step_3.jsonl",
    "slime": "3.pt",
    "skyrl": "dumped_evals/global_step_20_evals/math500.jsonl",
    "prime-rl": "rollouts/step_4/train/effective/traces.jsonl",
    "areal": "4/200.jsonl",
    "open-instruct": "grpo_run_rollouts_000001.jsonl",
}
# A second name for a step a file already holds, as a copy under another spelling would have.
SAME_STEP = {
    "trl": ("completions/completions_00010.parquet", "completions/completions_010.parquet"),
    "roll": ("rollout_dump_data.step_1.jsonl", "rollout_dump_data.step_01.jsonl"),
    "nemo-rl": ("train_data_step1.jsonl", "train_data_step01.jsonl"),
    "slime": ("1.pt", "01.pt"),
    "verl": ("1.jsonl", "01.jsonl"),
    "verl-v1": ("1.jsonl", "01.jsonl"),
}


def copied(name: str, tmp_path: Path) -> Path:
    """A private copy of the committed dump's folder (the one ``--from`` reads)."""
    folder = tmp_path / name
    shutil.copytree(folder_of(name), folder, symlinks=True)
    return folder


def run(cli: Any, name: str, folder: Path | str, *extra: str) -> Any:
    return cli("check", str(folder), "--from", FROM[name], *extra)


def first_file(name: str, folder: Path) -> Path:
    files: dict[str, Any] = TRUTH[name]["files"]
    return folder / next(iter(files))


@pytest.mark.parametrize("name", list(TRUTH))
def test_an_empty_step_file_is_named_as_empty(name: str, cli: Any, tmp_path: Path) -> None:
    """Four adapters crashed (exit 70: verl v1's ``uid``, NeMo-RL's ``rewards``, AReaL's
    ``seqlen``) and the others named it as something else. prime-rl writes an empty
    ``traces.jsonl`` for a step that shipped nothing: skipped, with a note saying so."""
    folder = copied(name, tmp_path)
    empty = folder / NEW_STEP[name]
    empty.parent.mkdir(parents=True, exist_ok=True)
    if name == "trl":  # a Parquet file of no rows
        table = pq.read_table(first_file(name, folder))
        pq.write_table(table.slice(0, 0), empty)
    else:
        empty.write_bytes(b"" if name != "verl" else b"\n\n")  # white space alone is empty too
    result = run(cli, name, folder, "--summary-json", "-")
    if name == "prime-rl":
        assert result.exit_code == 0, result.stderr
        notes = json.loads(result.stdout)["input"]["from"]["notes"]
        assert any(note.startswith(f"skipped {empty}: empty") for note in notes), notes
        return
    assert_one_line_error(result, f"{empty}: an empty ", "dump file (")


def test_a_prime_rl_score_that_is_not_a_number_is_named_by_line(cli: Any, tmp_path: Path) -> None:
    """A trace whose reward has a null score gave ``TypeError: NoneType * float`` (exit 70);
    verifiers' ``Reward.score`` is a float, so such a record is refused with its line."""
    folder = copied("prime-rl", tmp_path)
    path = first_file("prime-rl", folder)
    lines = path.read_text().splitlines()
    record = json.loads(lines[1])
    first_reward = next(iter(record["traces"][0]["rewards"]))
    record["traces"][0]["rewards"][first_reward]["score"] = None
    lines[1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    assert_one_line_error(
        run(cli, "prime-rl", folder), f"{path}, line 2: trace 0's reward", "no numeric score"
    )


@pytest.mark.parametrize("name", list(TRUTH))
def test_a_copied_step_file_is_refused_naming_both(name: str, cli: Any, tmp_path: Path) -> None:
    """``completions_010.parquet`` beside ``completions_00010.parquet``: every group counted
    twice, 2,048 rows where there are 1,536, without a word. A copy under any name is refused."""
    folder = copied(name, tmp_path)
    original = first_file(name, folder)
    copy = folder / NEW_STEP[name]  # the next step's name, the bytes of the first
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(original, copy)
    result = run(cli, name, folder)
    assert_one_line_error(result, "(a copy?); its rows would be read twice")
    assert original.name in result.stderr and copy.name in result.stderr


@pytest.mark.parametrize("name", sorted(SAME_STEP))
def test_two_files_of_one_step_are_refused_naming_both(name: str, cli: Any, tmp_path: Path) -> None:
    """``rollout_dump_data.step_01.jsonl`` beside ``..._step_1.jsonl`` with other rows: a trainer
    that writes one file a step wrote neither of them twice; one is another run's or a copy."""
    folder = copied(name, tmp_path)
    original, other = folder / SAME_STEP[name][0], folder / SAME_STEP[name][1]
    write_fewer_rows(original, other)  # step 1's file less a row: other bytes, the same step
    result = run(cli, name, folder)
    assert_one_line_error(result, ": holds step ", "writes one file a step")
    assert original.name in result.stderr and other.name in result.stderr


def write_fewer_rows(source: Path, target: Path) -> None:
    """``source``'s records less its last, written to ``target`` as the trainer's format holds them."""
    if source.suffix == ".parquet":
        table = pq.read_table(source)
        pq.write_table(table.slice(0, table.num_rows - 1), target)
    elif source.suffix == ".pt":
        import torch

        data = torch.load(source, weights_only=True)
        data["samples"] = data["samples"][:-1]
        torch.save(data, target)
    else:
        text = source.read_text()
        if text.lstrip().startswith("{") and "\n" not in text.strip():  # ROLL: one object of columns
            columns = json.loads(text)
            target.write_text(json.dumps({k: v[:-1] for k, v in columns.items()}))
        else:
            target.write_text("\n".join(text.splitlines()[:-1]) + "\n")


@pytest.mark.parametrize("name", list(TRUTH))
def test_a_link_to_nothing_among_the_files_is_refused(name: str, cli: Any, tmp_path: Path) -> None:
    """A file that is a link to itself was passed over without a word (TRL, SkyRL, AReaL): its
    step would be missing. It is refused, by name, in a folder and under a glob."""
    folder = copied(name, tmp_path)
    link = folder / NEW_STEP[name]
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(link.name, link)  # a link to itself
    assert_one_line_error(run(cli, name, folder), f"{link}: a link that leads to no file")


LOOP_GLOBS = {"areal": "**/*.jsonl", "prime-rl": "**/traces.jsonl", "skyrl": "**/global_step_*/*gsm8k.jsonl"}


@pytest.mark.parametrize("name", sorted(LOOP_GLOBS))
def test_a_glob_over_link_loops_ends_visiting_each_folder_once(name: str, tmp_path: Path) -> None:
    """``ln -s . rollout/loop; ln -s .. rollout/2/up`` under ``'**/*.jsonl'``: Python's recursive
    glob yielded 11.9M paths in 60 s and the run grew 55 MB/s until killed. Each real folder is
    visited once: the run reads the dump's own files, once each, in a few seconds."""
    folder = copied(name, tmp_path)
    first = first_file(name, folder)
    os.symlink(".", folder / "loop")
    os.symlink("..", first.parent / "up")
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli",
            "check",
            f"{folder}/{LOOP_GLOBS[name]}",
            "--from",
            FROM[name],
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 60


def test_a_glob_over_link_loops_of_plain_shards_reads_each_shard_once(cli: Any, tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    (shards / "sub").mkdir(parents=True)
    table = pq.read_table(DUMP_ROOT.parent / "rollouts.parquet")
    pq.write_table(table, shards / "a.parquet")
    pq.write_table(table.slice(0, 100), shards / "sub" / "b.parquet")
    os.symlink(".", shards / "loop")
    os.symlink("..", shards / "sub" / "up")
    result = cli("check", f"{shards}/**/*.parquet", "-r", "correct", "--summary-json", "-")
    assert result.exit_code == 0, result.stderr
    rows = (
        pq.read_metadata(shards / "a.parquet").num_rows
        + pq.read_metadata(shards / "sub" / "b.parquet").num_rows
    )
    assert json.loads(result.stdout)["rows"] == rows


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["nemo-rl", "areal", "prime-rl", "verl", "verl-v1", "open-instruct", "skyrl", "roll"]
)
def test_a_50_mb_line_is_read(name: str, cli: Any, tmp_path: Path) -> None:
    """A 50 MB line was refused ("straddling object straddles two block boundaries") for the
    dumps read whole into a private file (NeMo-RL, AReaL, prime-rl), where the README promises
    a read block that holds the longest line. Every layout of lines (ROLL's: one object of
    columns, a line of its own) reads one."""
    folder = copied(name, tmp_path)
    path = first_file(name, folder)
    lines = path.read_text().splitlines()
    record = json.loads(lines[0])
    if name == "roll":  # one object of columns: a column whose first value is the long one
        rows = len(next(iter(record.values())))
        record["padding_field_of_50_mb"] = ["x" * (50 << 20)] + [""] * (rows - 1)
    else:
        record["padding_field_of_50_mb"] = "x" * (50 << 20)
    lines[0] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    result = run(cli, name, folder, "--summary-json", "-")
    assert result.exit_code == 0, result.stderr
    expected = json.loads(run(cli, name, folder_of(name), "--summary-json", "-").stdout)["rows"]
    assert json.loads(result.stdout)["rows"] == expected
