"""Messages that said the wrong thing (issue #67 C.13): each names what is wrong, where, and
never refuses what is fine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli import add_advantages, summarize
from grpo_cli.errors import GrpoError
from tests.conftest import assert_one_line_error, run_python, write_jsonl


@pytest.mark.slow
@pytest.mark.parametrize("quoted", [False, True], ids=["plain", "quoted-with-a-newline"])
def test_a_valid_csv_with_a_20_mib_cell_is_read(quoted: bool, cli: Any, tmp_path: Path) -> None:
    """It was called "malformed CSV (straddling object ...)" with advice no option could follow:
    the file is read again with a block that holds its longest record."""
    cell = "x" * (20 << 20)
    big = f'"{cell}\nmore"' if quoted else cell
    rows = ["group_id,reward,text"] + [f"g{i // 2},{i % 2},short" for i in range(10)]
    rows[3] = f"g1,0,{big}"
    path = tmp_path / "big.csv"
    path.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out.parquet"
    result = cli("compute", path, "-g", "group_id", "-o", out, "-q")
    assert result.exit_code == 0, result.stderr
    table = pq.read_table(out)
    assert table.num_rows == 10 and table.column("text")[2].as_py() == big.strip('"')


def test_a_json_array_escaping_a_lone_surrogate_says_so(cli: Any, tmp_path: Path) -> None:
    """An ASCII file with ``"\\udc80"`` was called "invalid UTF-8": its bytes are fine, its escape
    names no character. A pair that makes one character is read; bytes that are not UTF-8 are
    still named as such."""
    lone = tmp_path / "lone.json"
    lone.write_text(
        '[{"group_id": "a", "reward": 1.0}, {"group_id": "a", "reward": 0.0, "t": "bad \\udc80"}]'
    )
    assert_one_line_error(cli("check", lone), "element 2: a string escapes a lone UTF-16 surrogate")
    pair = tmp_path / "pair.json"
    pair.write_text(
        '[{"group_id": "a", "reward": 1.0, "t": "\\ud83d\\ude00"}, {"group_id": "a", "reward": 0.0}]'
    )
    assert cli("check", pair).exit_code == 0
    raw = tmp_path / "raw.json"
    raw.write_bytes(b'[{"group_id": "a", "reward": 1.0, "t": "\x80"}, {"group_id": "a", "reward": 0.0}]')
    assert_one_line_error(cli("check", raw), "invalid UTF-8")


@pytest.mark.parametrize(
    ("reward", "fragment"),
    [
        ("reward.fmt.y", "(struct 'reward.fmt' has fields x; 'y' is not one of them)"),
        ("reward.fmtt.x", "(struct 'reward' has fields fmt; 'fmtt' is not one of them)"),
        ("reward.fmt.x.z", "('reward.fmt.x' is double, not a struct with fields)"),
    ],
)
def test_a_nested_field_that_is_not_there_names_the_struct_it_is_missing_from(
    reward: str, fragment: str, cli: Any, tmp_path: Path
) -> None:
    """``-r reward.fmt.y`` was told ``'fmt.y'`` is not a field of ``reward``, though ``fmt`` is."""
    path = write_jsonl(tmp_path / "n.jsonl", [{"group_id": "a", "reward": {"fmt": {"x": 1.0}}}])
    assert_one_line_error(cli("check", path, "-r", reward), f"no column {reward!r} {fragment}")
    assert cli("check", path, "-r", "reward.fmt.x").exit_code == 0


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("group_cols", "g", "group_cols 'g', not a list of names"),  # read as the columns g: "no column 'g'"
        ("group_cols", 5, "group_cols 5, not a list of names"),
        ("group_size", "4", "group_size '4', not a whole number"),
        ("advantage_col", 3, "advantage_col 3, not text"),  # an internal error
        ("batch_col", ["s"], "batch_col ['s'], not text"),  # an internal error
        ("stats_cols", "yes", "stats_cols 'yes', not true or false"),  # taken as true
        ("keep_mean_range", "x", "keep_mean_range 'x', not a pair of numbers"),
        ("reward_cols", "r", "reward_cols 'r', not a list of columns"),
        ("reward_aggregation", "mean", "reward_aggregation 'mean', not one of its choices"),
    ],
)
def test_a_provenance_record_edited_to_a_wrong_type_names_the_option(
    key: str, value: Any, fragment: str, cli: Any, tmp_path: Path
) -> None:
    """A record edited by hand was blamed on a column ``g`` (``group_cols`` as text, read letter
    by letter), crashed with an internal error, or was taken as true."""
    out = tmp_path / "out.parquet"
    source = Path(__file__).resolve().parents[2] / "sample_data" / "rollouts.parquet"
    assert cli("compute", source, "-r", "correct", "-o", out, "-q").exit_code == 0
    table = pq.read_table(out)
    record = json.loads(table.schema.metadata[b"grpo_cli"])
    record["options"][key] = value
    edited = tmp_path / "edited.parquet"
    pq.write_table(
        table.replace_schema_metadata({**table.schema.metadata, b"grpo_cli": json.dumps(record)}), edited
    )
    assert_one_line_error(cli("check", edited, "--verify"), f"the recorded grpo-cli options hold {fragment}")


@pytest.mark.parametrize(
    "unused",
    [[1, "a", 2.5, None], np.array([1j, 2j, 3j, 4j]), [object()] * 4],
    ids=["mixed-object", "complex", "opaque-objects"],
)
def test_a_pandas_frame_is_not_refused_over_a_column_the_run_never_reads(unused: Any) -> None:
    """A pandas frame was refused whole when any column did not convert to Arrow; the run reads
    its reward and key columns, and the frame returned keeps every other column as it was."""
    import pandas as pd

    frame = pd.DataFrame({"group_id": [0, 0, 1, 1], "reward": [1.0, 0.0, 1.0, 0.0], "meta": unused})
    out = add_advantages(frame)
    assert list(out.columns) == ["group_id", "reward", "meta", "advantage", "group_active"]
    assert out["meta"].tolist() == frame["meta"].tolist()
    expected = add_advantages(pa.table({"group_id": [0, 0, 1, 1], "reward": [1.0, 0.0, 1.0, 0.0]}))
    assert out["advantage"].tolist() == expected.column("advantage").to_pylist()
    assert summarize(frame).groups == 2
    with pytest.raises(GrpoError, match="the pandas DataFrame's column 'reward' cannot be read as Arrow"):
        add_advantages(frame.assign(reward=[1, "a", 2.5, None]))
    with pytest.raises(GrpoError, match="the input already has a column 'advantage'"):
        add_advantages(frame.assign(advantage=[9, 9, 9, 9]))  # a column not read still keeps its name


def test_a_misspelt_column_of_a_parquet_input_is_refused_before_torch_loads(tmp_path):
    """The columns of a Parquet input are checked from its footer before the engine imports
    torch: the typo's one line (the same words the engine would give) comes at once."""

    probe = (
        "import sys, atexit\n"
        "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, file=sys.__stdout__))\n"
        "from grpo_cli.cli import main\n"
        "sys.argv = ['grpo-cli', 'compute', sys.argv[1], '-o', sys.argv[2], '-r', 'corect']\n"
        "main()\n"
    )
    out = tmp_path / "out.parquet"
    done = run_python(
        probe, "sample_data/rollouts.parquet", out, timeout=120, cwd=Path(__file__).resolve().parents[2]
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: sample_data/rollouts.parquet: no column 'corect'; did you mean 'correct'? "
        "(the columns are group_id, sample_index, prompt, completion, correct, reward)"
    )
    assert "torch loaded: False" in done.stdout
    assert not out.exists()
