"""Input formats beyond Parquet and JSONL, several INPUTs, and nested reward and key fields.

Every format must give bit-for-bit the advantages of the same rows as Parquet.
"""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_cli.errors import GrpoError
from grpo_cli.inputs import readers
from grpo_cli.inputs.sources import InputSet
from tests.conftest import one_line_error, rollout_cases, rollout_rows, write_case, write_jsonl, write_parquet

ROWS = rollout_rows(n_groups=20, seed=3)


def advantages(path):
    return pq.read_table(path).column("advantage").to_pylist()


@pytest.fixture
def expected(cli, tmp_path):
    source = write_parquet(tmp_path / "reference.parquet", ROWS)
    result = cli("compute", source, "-o", tmp_path / "reference_out.parquet", "-q")
    assert result.exit_code == 0, result.stderr
    return advantages(tmp_path / "reference_out.parquet")


def _json_array(path, rows):
    path.write_text(json.dumps(rows, indent=2))  # pretty-printed: elements span lines


def _json_lines(path, rows):
    write_jsonl(path, rows)


def _jsonl_zst(path, rows):
    with pa.output_stream(str(path), compression="zstd") as out:
        out.write("".join(json.dumps(r) + "\n" for r in rows).encode())


def _json_array_gz(path, rows):
    path.write_bytes(gzip.compress(json.dumps(rows).encode()))


def _csv(path, rows):
    pl.DataFrame(rows).write_csv(path)


def _csv_gz(path, rows):
    path.write_bytes(gzip.compress(pl.DataFrame(rows).write_csv().encode()))


def _feather(path, rows):
    feather.write_feather(pa.Table.from_pylist(rows), str(path))


def _arrow_stream(path, rows):
    table = pa.Table.from_pylist(rows)
    with pa.ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=7)  # many small batches, as datasets writes


def _polars_arrow(path, rows):
    pl.DataFrame(rows).write_ipc(path)  # text as string views, which pyarrow's take does not take


def _save_to_disk(path, rows):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(path), max_shard_size="2KB")


WRITERS = {
    "rollouts.json": _json_array,
    "lines.json": _json_lines,
    "rollouts.jsonl.zst": _jsonl_zst,
    "rollouts.json.gz": _json_array_gz,
    "rollouts.csv": _csv,
    "rollouts.csv.gz": _csv_gz,
    "rollouts.feather": _feather,
    "rollouts.arrow": _arrow_stream,
    "polars.arrow": _polars_arrow,
    "saved": _save_to_disk,
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_each_input_format_gives_the_parquet_advantages(cli, tmp_path, expected, name):
    source = tmp_path / name
    WRITERS[name](source, ROWS)
    out = tmp_path / "out.parquet"
    result = cli("compute", source, "-o", out, "-q")
    assert result.exit_code == 0, result.stderr
    assert advantages(out) == expected
    assert pq.read_table(out).column("text").to_pylist() == [r["text"] for r in ROWS]
    assert source.exists()  # never touched


def test_text_written_as_string_views_is_read_as_the_same_text(cli, tmp_path):
    """Polars writes text to Arrow files as string views: a key cut at a separator, JSON text,
    a finish reason and a batch key of that type compute as the same strings do."""
    rows = [
        {
            "uid": f"p{i // 4}_{i}",
            "step": f"s{i // 8}",
            "metrics": json.dumps({"r": 1.0 if i < 4 else float(i * 7 % 3 == 0)}),  # p0: all right
            "finish": "length" if i % 5 == 0 and i >= 4 else "stop",
        }
        for i in range(24)
    ]
    options = ["-g", "uid", "--key-before", "_", "--json-col", "metrics", "-r", "metrics.r"]
    options += ["--batch-col", "step", "--truncated-col", "finish", "--stop-properly", "0", "-q"]
    views, plain = tmp_path / "views.arrow", tmp_path / "plain.arrow"
    pl.DataFrame(rows).write_ipc(views)
    assert pa.ipc.open_file(views).schema.field("uid").type == pa.string_view()
    feather.write_feather(pa.Table.from_pylist(rows), str(plain))
    for source in (views, plain):
        result = cli("compute", source, *options, "-o", tmp_path / f"{source.stem}.parquet")
        assert result.exit_code == 0, result.stderr
    assert advantages(tmp_path / "views.parquet") == advantages(tmp_path / "plain.parquet")
    kept = tmp_path / "kept.parquet"
    dropped = cli("compute", views, *options, "--drop-inactive", "--summary-json", "-", "-o", kept)
    assert dropped.exit_code == 0, dropped.stderr
    written = pq.read_table(kept)
    assert written.schema.field("uid").type == pa.string_view()  # the type that went in
    inactive = json.loads(dropped.stdout)["inactive_groups"]
    assert inactive > 0 and written.num_rows == len(rows) - 4 * inactive
    expected = [r["uid"] for r, a in zip(rows, advantages(tmp_path / "views.parquet"), strict=True) if a != 0]
    assert written.column("uid").to_pylist() == expected
    untruncated = cli("compute", views, *options[:-5], "-q", "-o", tmp_path / "untruncated.parquet")
    assert untruncated.exit_code == 0, untruncated.stderr
    assert advantages(tmp_path / "untruncated.parquet") != advantages(tmp_path / "views.parquet")


def test_a_saved_dataset_is_read_in_its_state_files_order(tmp_path):
    _save_to_disk(tmp_path / "saved", ROWS)
    state = json.loads((tmp_path / "saved" / "state.json").read_text())
    with InputSet(str(tmp_path / "saved")) as inputs:
        assert [s.path.name for s in inputs.shards] == [f["filename"] for f in state["_data_files"]]
        assert len(inputs.shards) > 1
        assert {s.format for s in inputs.shards} == {"arrow"}


def test_a_saved_dataset_dict_asks_for_a_split(cli, tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "dd"))
    one_line_error(
        cli("compute", tmp_path / "dd", "-o", tmp_path / "o.parquet"), 2, "splits train", "dd/train"
    )


def test_a_json_array_larger_than_a_read_chunk(cli, tmp_path):
    rows = [dict(r, text=r["text"] * 4000) for r in ROWS]  # about 6 MB: elements cross chunk ends
    _json_array(tmp_path / "big.json", rows)
    write_parquet(tmp_path / "big.parquet", rows)
    for name in ("big.json", "big.parquet"):
        assert cli("compute", tmp_path / name, "-o", tmp_path / f"{name}.out.parquet", "-q").exit_code == 0
    assert advantages(tmp_path / "big.json.out.parquet") == advantages(tmp_path / "big.parquet.out.parquet")


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ('[{"group_id": 1, "reward": 1},\n {"group_id": 1, "reward": }]', ["line 2", "malformed JSON array"]),
        ('[{"group_id": 1, "reward": 1}\n {"group_id": 1}]', ["line 2", "expected , or ]"]),
        ('[{"group_id": 1, "reward": 1}, 7]', ["element 2 is int"]),
        ('[{"group_id": 1, "reward": 1}', ["ends before the closing ]"]),
        ('[{"group_id": 1, "reward": 1}] x', ["after the closing ]"]),
        ('[{"group_id": 1, "reward": 1},\n{"group_id": 1, "reward": null}]', ["element 2", "reward is null"]),
        ("[]", ["no rows"]),
    ],
    ids=["bad-value", "no-comma", "not-an-object", "truncated", "trailing", "null-reward", "empty"],
)
def test_json_array_errors_are_one_line(cli, tmp_path, text, fragments):
    source = tmp_path / "bad.json"
    source.write_text(text)
    out = tmp_path / "o.parquet"
    one_line_error(cli("compute", source, "-o", out), 2, "bad.json", *fragments)
    assert not out.exists()


def test_a_json_array_on_standard_input(cli, tmp_path, expected):
    out = tmp_path / "o.parquet"
    result = cli("compute", "-", "-o", out, "-q", input=json.dumps(ROWS).encode())
    assert result.exit_code == 0, result.stderr
    assert advantages(out) == expected


def test_csv_columns_come_out_as_the_text_that_went_in(cli, tmp_path, monkeypatch):
    """Type inference merged the keys 007, 07 and 7 (and True/TRUE/1, 1/1.0/1e0, 2**53 and
    2**53 + 1 once a 1.5 widened the column), turned N/A into a null and 001 into 1.0."""
    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 64)  # many blocks: no later block can differ
    keys = ["007", "07", "7", "True", "TRUE", "1", "1.0", "1e0", "9007199254740993", "9007199254740992"]
    lines = ["group_id,reward,note"]
    for k, key in enumerate(keys):
        lines += [f"{key},0,N/A", f"{key},{1 if k % 2 else 0.5},001"]
    lines += ["1.5,0,NA", "1.5,1,null"]
    (tmp_path / "ids.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "o.parquet"
    result = cli("compute", tmp_path / "ids.csv", "-o", out, "-q")
    assert result.exit_code == 0, result.stderr
    table = pq.read_table(out)
    assert table.schema.field("group_id").type == pa.string()
    assert table.column("group_id").to_pylist() == [key for key in keys for _ in "ab"] + ["1.5", "1.5"]
    assert table.column("note").to_pylist() == ["N/A", "001"] * len(keys) + ["NA", "null"]
    assert table.column("reward").to_pylist()[:4] == ["0", "0.5", "0", "1"]
    assert table.column("advantage").to_pylist() == pytest.approx([-1.0, 1.0] * (len(keys) + 1), rel=1e-5)
    summary = json.loads(cli("check", tmp_path / "ids.csv", "--summary-json", "-", "-q").stdout)
    assert summary["groups"] == len(keys) + 1


@pytest.mark.parametrize(
    ("cell", "fragment"),
    [
        ("abc", "r.csv, line 3: column 'reward' holds 'abc', which is not a number"),
        ("0x10", "holds '0x10', which is not a number"),
        ("9007199254740993", "the integer 9007199254740993, which float64 cannot hold exactly"),
    ],
)
def test_a_csv_reward_that_is_no_exact_number_is_refused(cli, tmp_path, cell, fragment):
    (tmp_path / "r.csv").write_text(f"group_id,reward\n1,0\n1,{cell}\n")
    one_line_error(cli("compute", tmp_path / "r.csv", "-o", tmp_path / "o.parquet"), 2, fragment)
    assert not (tmp_path / "o.parquet").exists()


def test_csv_empty_key_cells_are_null_keys_and_a_header_alone_is_no_rows(cli, tmp_path):
    """An unquoted empty cell is a null, refused as a key as a JSONL null is; a quoted "" is
    the empty string. A header-only file has no rows (check: exit 1), not a null-typed key."""
    (tmp_path / "e.csv").write_text("group_id,reward\n,0\n,1\n")
    one_line_error(cli("check", tmp_path / "e.csv"), 2, "group key 'group_id' is null")
    (tmp_path / "q.csv").write_text('group_id,reward\n"",0\n"",1\n')
    summary = json.loads(cli("check", tmp_path / "q.csv", "--summary-json", "-", "-q").stdout)
    assert (summary["groups"], summary["active_groups"]) == (1, 1)
    (tmp_path / "h.csv").write_text("group_id,reward\n")
    result = cli("check", tmp_path / "h.csv", "--summary-json", "-", "-q")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["rows"] == 0


def test_malformed_csv_is_one_line_without_the_raw_row(cli, tmp_path):
    (tmp_path / "bad.csv").write_text("group_id,reward\n1,0\n1,0,\x00\x01junk\n")
    line = one_line_error(cli("compute", tmp_path / "bad.csv", "-o", tmp_path / "o.parquet"), 2, "bad.csv")
    assert "Expected 2 columns, got 3" in line and "junk" not in line


def test_the_content_must_match_a_forced_format(cli, tmp_path):
    source = write_parquet(tmp_path / "r.parquet", ROWS)
    one_line_error(
        cli("compute", source, "-o", tmp_path / "o.parquet", "--input-format", "csv"), 2, "content is Parquet"
    )


@pytest.mark.parametrize(
    ("writer", "name", "words"),
    [(_feather, "r.parquet", "Arrow, not parquet"), (write_parquet, "r.arrow", "Parquet, not arrow")],
)
def test_the_content_must_match_the_name(cli, tmp_path, writer, name, words):
    writer(tmp_path / name, ROWS)
    one_line_error(cli("check", tmp_path / name), 2, f"{tmp_path / name}: its content is {words}")


def test_a_compressed_name_must_hold_compressed_data(cli, tmp_path):
    (tmp_path / "plain.csv.gz").write_text(pl.DataFrame(ROWS).write_csv())
    one_line_error(cli("compute", tmp_path / "plain.csv.gz", "-o", tmp_path / "o.parquet"), 2, "gzip")


# --------------------------------------------------------------------------- several INPUTs


def test_several_inputs_are_one_dataset(cli, tmp_path):
    write_parquet(tmp_path / "a.parquet", ROWS[:30])
    write_jsonl(tmp_path / "b.jsonl", ROWS[30:])
    write_parquet(tmp_path / "all.parquet", ROWS)
    assert cli("compute", tmp_path / "all.parquet", "-o", tmp_path / "one.parquet", "-q").exit_code == 0
    result = cli("compute", tmp_path / "a.parquet", tmp_path / "b.jsonl", "-o", tmp_path / "two", "-q")
    assert result.exit_code == 0, result.stderr
    two = pl.concat([pl.read_parquet(tmp_path / "two" / f"{n}.parquet") for n in ("a", "b")])
    assert two["advantage"].to_list() == advantages(tmp_path / "one.parquet")  # groups span the files


def test_an_input_named_twice_is_refused(cli, tmp_path):
    source = write_parquet(tmp_path / "a.parquet", ROWS)
    one_line_error(cli("compute", source, tmp_path, "-o", tmp_path / "o"), 2, "named twice", "read twice")
    (tmp_path / "link.parquet").hardlink_to(source)
    with pytest.raises(GrpoError, match="named twice"):
        InputSet([str(source), str(tmp_path / "link.parquet")])
    with pytest.raises(GrpoError, match="more than once"):
        InputSet(["-", "-"])


def test_output_shards_of_same_named_inputs_do_not_overwrite_each_other(cli, tmp_path):
    for shift, folder in enumerate(("x", "y")):  # other rows in each: a copy is refused as one
        (tmp_path / folder).mkdir()
        write_parquet(tmp_path / folder / "part.parquet", ROWS[shift:])
    result = cli("compute", tmp_path / "x", tmp_path / "y" / "part.parquet", "-o", tmp_path / "out")
    one_line_error(result, 2, "would both be written to")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- nested fields


def nested(rows):
    return [
        {
            "prompt": [{"role": "user", "content": f"question {r['group_id']}"}],
            "meta": {"prompt_id": r["group_id"], "split": "train"},
            "reward": {"score": r["reward"], "format": 0.5},
            "text": r["text"],
        }
        for r in rows
    ]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_nested_reward_and_key_fields(cli, tmp_path, expected, fmt):
    rows = nested(ROWS)
    source = (
        write_parquet(tmp_path / "n.parquet", rows)
        if fmt == "parquet"
        else write_jsonl(tmp_path / "n.jsonl", rows)
    )
    out = tmp_path / "o.parquet"
    result = cli("compute", source, "-o", out, "-r", "reward.score", "-g", "meta.prompt_id", "-q")
    assert result.exit_code == 0, result.stderr
    assert advantages(out) == expected
    assert pq.read_table(out).column("reward").to_pylist() == [r["reward"] for r in rows]  # kept whole


@pytest.mark.parametrize("hashed", [False, True], ids=["exact", "hashed"])
def test_a_chat_prompt_is_a_group_key_on_its_exact_value(cli, tmp_path, expected, monkeypatch, hashed):
    if hashed:
        from grpo_cli.arrow import keys
        from grpo_cli.engines import local

        monkeypatch.setattr(local.engine, "SMALL_INPUT_ROWS", 0)
        monkeypatch.setattr(keys, "EXACT_MAX_KEYS", 0)
    source = write_parquet(tmp_path / "n.parquet", nested(ROWS))
    out = tmp_path / "o.parquet"
    result = cli("compute", source, "-o", out, "-r", "reward.score", "-g", "prompt", "-q")
    assert result.exit_code == 0, result.stderr
    assert advantages(out) == expected


def test_messages_that_differ_in_one_field_are_two_groups(cli, tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": "q"}], "reward": 1.0},
        {"prompt": [{"role": "user", "content": "q"}], "reward": 0.0},
        {"prompt": [{"role": "system", "content": "q"}], "reward": 1.0},
        {"prompt": [{"role": "system", "content": "q"}], "reward": 1.0},
    ]
    source = write_parquet(tmp_path / "c.parquet", rows)
    out = tmp_path / "o.parquet"
    assert cli("compute", source, "-o", out, "-g", "prompt", "-q").exit_code == 0
    assert pq.read_table(out).column("group_active").to_pylist() == [True, True, False, False]


@pytest.mark.parametrize(
    ("option", "fragments"),
    [
        (["-r", "reward.scor"], ["no column 'reward.scor'", "has fields score, format"]),
        (["-g", "text.id"], ["no column 'text.id'", "'text' is string, not a struct"]),
        (["-r", "reward"], ["reward column 'reward'", "must be numeric"]),
    ],
)
def test_a_missing_nested_field_is_one_line(cli, tmp_path, option, fragments):
    source = write_parquet(tmp_path / "n.parquet", nested(ROWS))
    one_line_error(
        cli("compute", source, "-o", tmp_path / "o.parquet", "-g", "meta.prompt_id", *option), 2, *fragments
    )


def test_a_top_level_column_with_a_dot_wins(cli, tmp_path):
    rows = [dict(r, **{"reward.score": r["reward"]}, reward={"score": 0.0}) for r in ROWS]
    source = write_parquet(tmp_path / "d.parquet", rows)
    out = tmp_path / "o.parquet"
    assert cli("compute", source, "-o", out, "-r", "reward.score", "-q").exit_code == 0
    assert pq.read_table(out).column("group_active").to_pylist() != [False] * len(ROWS)


# --------------------------------------------------------------------------- JSON lines out


def read_jsonl_rows(data: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in data.decode().splitlines()]


@pytest.mark.parametrize("name", ["out.jsonl", "out.ndjson", "out.jsonl.gz", "out.jsonl.zst"])
def test_jsonl_output_keeps_every_column(cli, tmp_path, expected, name):
    source = write_parquet(tmp_path / "r.parquet", ROWS)
    out = tmp_path / name
    result = cli("compute", source, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert "JSON lines" in result.stderr
    compression = {".gz": "gzip", ".zst": "zstd"}.get(out.suffix)
    with pa.input_stream(str(out), compression=compression) as stream:
        rows = read_jsonl_rows(stream.read())
    assert [r["advantage"] for r in rows] == expected  # floats round-trip exactly
    assert [{k: r[k] for k in ROWS[0]} for r in rows] == ROWS
    assert list(rows[0]) == [*ROWS[0], "advantage", "group_active"]
    if compression is None:  # a second reader
        assert pl.read_ndjson(out)["advantage"].to_list() == expected


def test_jsonl_to_standard_output_keeps_the_summary_on_stderr(cli, tmp_path, expected):
    source = write_parquet(tmp_path / "r.parquet", ROWS)
    result = cli("compute", source, "-o", "-")
    assert result.exit_code == 0, result.stderr
    rows = read_jsonl_rows(result.stdout_bytes)
    assert [r["advantage"] for r in rows] == expected
    assert "rows" in result.stderr and "standard output" in result.stderr


def test_a_failed_run_writes_nothing_to_standard_output(cli, tmp_path):
    rows = [*ROWS, {**ROWS[0], "reward": None}]
    source = write_parquet(tmp_path / "r.parquet", rows)
    result = cli("compute", source, "-o", "-")
    one_line_error(result, 2, "reward is null")
    assert result.stdout_bytes == b""


def test_stdout_is_claimed_once(cli, tmp_path):
    source = write_parquet(tmp_path / "r.parquet", ROWS)
    one_line_error(
        cli("compute", source, "-o", "-", "--summary-json", "-"), 2, "both write to standard output"
    )


def test_raw_bytes_cannot_go_to_json(cli, tmp_path):
    source = write_parquet(tmp_path / "r.parquet", [dict(r, blob=b"\x00\x01") for r in ROWS])
    out = tmp_path / "o.jsonl"
    one_line_error(cli("compute", source, "-o", out), 2, "'blob' holds raw bytes", "write Parquet")
    assert not out.exists() and list(tmp_path.iterdir()) == [source]


def test_jsonl_output_of_several_inputs_with_different_columns(cli, tmp_path):
    write_parquet(tmp_path / "a.parquet", [dict(r, extra=1) for r in ROWS[:30]])
    write_jsonl(tmp_path / "b.jsonl", ROWS[30:])
    out = tmp_path / "o.jsonl"
    result = cli("compute", tmp_path / "a.parquet", tmp_path / "b.jsonl", "-o", out, "-q")
    assert result.exit_code == 0, result.stderr
    rows = read_jsonl_rows(out.read_bytes())
    assert len(rows) == len(ROWS) and "extra" in rows[0] and "extra" not in rows[-1]


def test_python_m_grpo_cli_pipes_json_lines(tmp_path, expected):
    import subprocess
    import sys

    source = write_parquet(tmp_path / "r.parquet", ROWS)
    done = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "compute", str(source), "-o", "-", "-q"],
        capture_output=True,
        check=True,
    )
    assert [r["advantage"] for r in read_jsonl_rows(done.stdout)] == expected
    assert done.stderr == b""


def test_a_json_array_element_that_repeats_a_field_is_refused(cli, tmp_path):
    """Python's dict kept the last value silently; JSON lines (pyarrow) refuse it already."""
    (tmp_path / "rep.json").write_text(
        '[{"group_id":1,"reward":0.0},{"group_id":1,"reward":1.0,"reward":0.0}]'
    )
    one_line_error(
        cli("compute", tmp_path / "rep.json", "-o", tmp_path / "o.parquet"),
        2,
        "element 2 gives the field reward twice",
    )
    (tmp_path / "rep.jsonl").write_text('{"group_id":1,"reward":1.0,"reward":0.0}\n')
    one_line_error(cli("compute", tmp_path / "rep.jsonl", "-o", tmp_path / "o.parquet"), 2, "twice")
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("depth", [65, 1000, 5000])
@pytest.mark.parametrize("name", ["deep.jsonl", "deep.json"])
def test_json_nested_deeper_than_grpo_cli_reads_is_one_line(cli, tmp_path, name, depth):
    """1,000 and 5,000 levels were RecursionErrors (exit 70) in the array reader and in the
    long-integer scan."""
    record = '{"group_id":1,"reward":1.0,"x":' + "[" * depth + "]" * depth + "}"
    (tmp_path / name).write_text(f"[{record}]" if name.endswith(".json") else record + "\n")
    for command in ("compute", "check"):
        args = ["-o", tmp_path / "o.parquet"] if command == "compute" else []
        result = cli(command, tmp_path / name, *args)
        assert result.exit_code == 2 and "Traceback" not in result.stderr
        assert "nest" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_json_nested_64_deep_is_read(cli, tmp_path):
    record = '{"group_id":1,"reward":1.0,"x":' + "[" * 63 + "]" * 63 + "}"
    (tmp_path / "ok.jsonl").write_text(record + "\n" + record.replace("1.0", "0.0") + "\n")
    assert cli("compute", tmp_path / "ok.jsonl", "-o", tmp_path / "o.parquet", "-q").exit_code == 0


def test_csv_cells_with_newlines_across_read_blocks(cli, tmp_path, monkeypatch):
    """A valid CSV whose quoted cells hold newlines was 'malformed' past one 8 MiB block."""
    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 64)
    lines = ["group_id,reward,text"] + [f'{i // 2},{i % 2},"first line\nsecond line {i}"' for i in range(40)]
    (tmp_path / "n.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "o.parquet"
    result = cli("compute", tmp_path / "n.csv", "-o", out, "-q")
    assert result.exit_code == 0, result.stderr
    assert pq.read_table(out).column("text").to_pylist()[3] == "first line\nsecond line 3"


def test_csv_on_standard_input_needs_no_input_format(cli, tmp_path):
    result = cli("compute", "-", "-o", "-", "-q", input=b"group_id,reward\n1,0\n1,1\n")
    assert result.exit_code == 0, result.stderr
    assert [json.loads(x)["advantage"] for x in result.stdout.splitlines()] == pytest.approx(
        [-1, 1], abs=1e-5
    )


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bom.json", '[{"group_id":1,"reward":0.0},{"group_id":1,"reward":1.0}]'),
        ("bom.csv", "group_id,reward\n1,0\n1,1\n"),
        ("bom.jsonl", '{"group_id":1,"reward":0.0}\n{"group_id":1,"reward":1.0}\n'),
    ],
)
def test_a_byte_order_mark_is_read_past(cli, tmp_path, name, text):
    """A JSON array with a BOM was refused where JSON lines with one were read."""
    (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
    result = cli("compute", tmp_path / name, "-o", "-", "-q")
    assert result.exit_code == 0, result.stderr
    assert [json.loads(x)["group_id"] for x in result.stdout.splitlines()] in ([1, 1], ["1", "1"])


def test_a_json_line_longer_than_a_read_block_is_read(cli, tmp_path, monkeypatch):
    """A row over the 8 MiB block failed with pyarrow's 'straddling object' and no way out."""
    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 1024)
    rows = [{"group_id": 1, "reward": 1.0, "text": "x" * 5000}, {"group_id": 1, "reward": 0.0, "text": "y"}]
    write_jsonl(tmp_path / "long.jsonl", rows * 3)
    out = tmp_path / "o.parquet"
    result = cli("compute", tmp_path / "long.jsonl", "-o", out, "-q")
    assert result.exit_code == 0, result.stderr
    assert pq.read_table(out).column("text").to_pylist()[4] == "x" * 5000


def test_csv_errors_name_the_line_an_editor_shows(cli, tmp_path):
    """They named no line (a malformed record) or a 0-based row (a bad value)."""
    (tmp_path / "m.csv").write_text("group_id,reward\n1,0\n1,0,junk\n")
    one_line_error(
        cli("check", tmp_path / "m.csv"), 2, "m.csv, line 3: malformed CSV (CSV parse error: Expected 2"
    )
    (tmp_path / "v.csv").write_text('group_id,reward,t\n1,0,"a\nb"\n1,abc,x\n')
    one_line_error(cli("check", tmp_path / "v.csv"), 2, "v.csv, line 4: column 'reward' holds 'abc'")


# --------------------------------------------------------------------------- columns of only nulls


def _with_null_rewards(rows, groups):
    """``rows`` with every reward of ``groups`` null."""
    return [{**row, "reward": None} if row["group_id"] in groups else row for row in rows]


@pytest.mark.parametrize("writer", ["jsonl", "parquet", "csv"])
def test_a_shard_whose_rewards_are_all_null_is_null_rewards_not_a_type_error(cli, tmp_path, writer):
    """The JSON lines reader types a column of only nulls ``null`` (so may a Parquet writer),
    and a CSV column of only empty cells is text with no value: its rewards are null, as a
    float column's nulls are. ``--nan ignore`` leaves them out and the run goes on, ``--nan
    error`` names the first. A step whose reward model failed is one such shard beside the
    others; it was refused as a column that must be numeric (CSV: "holds None")."""
    groups = {row["group_id"] for row in ROWS[:12]}
    null_shard = [row for row in ROWS if row["group_id"] in groups]
    rest = [row for row in ROWS if row["group_id"] not in groups]
    typed = write_parquet(tmp_path / "typed.parquet", _with_null_rewards(rest + null_shard, groups))
    expected = cli("compute", typed, "-o", tmp_path / "typed_out.parquet", "--nan", "ignore", "-q")
    assert expected.exit_code == 0, expected.stderr
    folder = tmp_path / "dump"
    folder.mkdir()
    if writer == "jsonl":
        write_jsonl(folder / "a.jsonl", rest)
        write_jsonl(folder / "b.jsonl", _with_null_rewards(null_shard, groups))
        assert pa.types.is_null(pa_json.read_json(folder / "b.jsonl").schema.field("reward").type)
    elif writer == "parquet":
        write_parquet(folder / "a.parquet", rest)
        write_parquet(folder / "b.parquet", _with_null_rewards(null_shard, groups))
        assert pa.types.is_null(pq.read_schema(folder / "b.parquet").field("reward").type)
    else:
        (folder / "a.csv").write_text(pl.DataFrame(rest).write_csv())
        (folder / "b.csv").write_text(pl.DataFrame(_with_null_rewards(null_shard, groups)).write_csv())
        assert ",," in (folder / "b.csv").read_text() or ",\n" in (folder / "b.csv").read_text()
    result = cli("compute", folder, "-o", tmp_path / "out", "--nan", "ignore", "-q")
    assert result.exit_code == 0, result.stderr
    got = pl.concat([pl.read_parquet(tmp_path / "out" / f"{name}.parquet") for name in ("a", "b")])
    want = pl.read_parquet(tmp_path / "typed_out.parquet")
    assert got["advantage"].to_list() == want["advantage"].to_list()
    assert got["group_active"].to_list() == want["group_active"].to_list()
    assert not any(pl.read_parquet(tmp_path / "out" / "b.parquet")["group_active"])
    one_line_error(cli("check", folder, "-q"), 2, f"b.{writer}", "reward is null", "--nan ignore")


def test_a_key_or_length_column_of_only_nulls_is_one_line(cli, tmp_path):
    rows = [{"uid": None, "reward": 1.0, "n": None}, {"uid": None, "reward": 0.0, "n": None}]
    source = write_jsonl(tmp_path / "nulls.jsonl", rows)
    one_line_error(
        cli("check", source, "-g", "uid"), 2, "group column 'uid' has type null: it holds only nulls"
    )
    keyed = write_jsonl(tmp_path / "keyed.jsonl", [{**row, "uid": 1} for row in rows])
    result = cli(
        "compute",
        keyed,
        "-g",
        "uid",
        "--estimator",
        "reinforce_plus_plus_baseline",
        "--length-col",
        "n",
        "-o",
        tmp_path / "o.parquet",
    )
    one_line_error(result, 2, "column 'n' holds only nulls")
    assert not (tmp_path / "o.parquet").exists()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=rollout_cases(),
    preset=st.sampled_from([None, "trl", "nemo-rl", "areal"]),
    stats_cols=st.booleans(),
    suffix=st.sampled_from([".jsonl", ".jsonl.gz"]),
    drop_inactive=st.booleans(),
)
def test_a_json_lines_output_holds_the_parquet_outputs_values(
    tmp_path_factory, case, preset, stats_cols, suffix, drop_inactive
):
    """Every row and column of ``-o x.jsonl`` reads back as the Parquet output's: the same keys
    in order, the same values; a float32 as the shortest decimal of the same float32 (read back
    as float32, its bits), NaN and infinities as null."""
    from grpo_cli.jobs import compute_dataset
    from grpo_cli.options.advantage import AdvantageOptions
    from grpo_cli.options.config import ComputeConfig

    tmp = tmp_path_factory.mktemp("jsonl_out")
    source, _ = write_case(tmp, case)
    config = ComputeConfig(
        group_cols=("uid",),
        advantage=AdvantageOptions.resolve(preset=preset, nan="ignore"),
        stats_cols=stats_cols,
        drop_inactive=drop_inactive,
    )
    compute_dataset(source, tmp / "out.parquet", config)
    compute_dataset(source, tmp / f"out{suffix}", config)
    table = pq.read_table(tmp / "out.parquet")
    float32 = {f.name for f in table.schema if f.type == pa.float32()}
    with (gzip.open if suffix.endswith(".gz") else open)(tmp / f"out{suffix}", "rt") as lines:
        written = [json.loads(line) for line in lines]
    assert len(written) == table.num_rows
    for expected, got in zip(table.to_pylist(), written, strict=True):
        assert list(got) == list(expected)
        for name, value in expected.items():
            if isinstance(value, float) and not math.isfinite(value):
                assert got[name] is None, name
            elif name in float32 and value is not None:
                assert np.float32(got[name]).tobytes() == np.float32(value).tobytes(), name
            else:
                assert got[name] == value and type(got[name]) is type(value), name


@pytest.mark.parametrize("output", ["out.jsonl", "out.parquet", "-"])
def test_inputs_whose_columns_differ_are_refused_alike_for_every_one_file_output(output, cli, tmp_path):
    """Issue #67 C.11: a CSV (its columns text) beside JSON lines (numbers) with ``-o out.jsonl``
    wrote a ``reward`` field of text on some lines and numbers on others, which grpo-cli then
    refused to read back; ``-o out.parquet`` refused. One rule, before any work, naming the
    column; the hint (a directory) followed writes one shard per input."""
    (tmp_path / "x.csv").write_text("group_id,reward\na,1\na,0\nb,0.5\nb,0.25\n")
    write_jsonl(tmp_path / "y.jsonl", [{"group_id": "c", "reward": 1.0}, {"group_id": "c", "reward": 0.0}])
    target = output if output == "-" else tmp_path / output
    result = cli("compute", tmp_path / "x.csv", tmp_path / "y.jsonl", "-o", target)
    one_line_error(
        result,
        2,
        "y.jsonl: column 'reward' is double here and string in",
        "x.csv; one output file holds one type a column: write to a directory",
    )
    assert result.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["x.csv", "y.jsonl"]
    followed = cli("compute", tmp_path / "x.csv", tmp_path / "y.jsonl", "-o", tmp_path / "out")
    assert followed.exit_code == 0, followed.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["x.parquet", "y.parquet"]
