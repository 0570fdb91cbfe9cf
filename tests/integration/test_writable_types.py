"""Every Arrow type a reader can hand over reaches every writer, or is refused in one line
before any work: never an internal error, never a Rust panic, never a half-written output."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from tests.conftest import assert_one_line_error

VALUES: dict[str, pa.Array] = {
    "int8": pa.array([1, -2], pa.int8()),
    "uint64": pa.array([2**64 - 1, 0], pa.uint64()),
    "float16": pa.array([0.5, 1.5], pa.float16()),
    "bool": pa.array([True, False]),
    "string": pa.array(["a", "b"]),
    "large_string": pa.array(["a", "b"], pa.large_string()),
    "string_view": pa.array(["a", "b"], pa.string_view()),
    "binary": pa.array([b"\x00", b"\xff"]),
    "fixed_binary": pa.array([b"ab", b"cd"], pa.binary(2)),
    "binary_view": pa.array([b"a", b"b"], pa.binary_view()),
    "date32": pa.array([datetime.date(2026, 1, 1)] * 2),
    "date64": pa.array([datetime.date(2026, 1, 1)] * 2, pa.date64()),
    "time32": pa.array([datetime.time(1, 2, 3)] * 2, pa.time32("ms")),
    "time64_ns": pa.array([1, 2], pa.time64("ns")),
    "timestamp_tz": pa.array([datetime.datetime(2026, 1, 1)] * 2, pa.timestamp("us", "UTC")),
    "timestamp_ns": pa.array([1, 2], pa.timestamp("ns")),
    "duration": pa.array([1, 2], pa.duration("ms")),
    "month_day_nano": pa.array([pa.MonthDayNano([1, 2, 3])] * 2, pa.month_day_nano_interval()),
    "decimal128": pa.array([decimal.Decimal("1.25"), decimal.Decimal("-3.50")], pa.decimal128(10, 2)),
    "decimal256": pa.array([decimal.Decimal("1.25"), decimal.Decimal("2.00")], pa.decimal256(40, 2)),
    "null": pa.nulls(2),
    "list": pa.array([[1, 2], []]),
    "large_list": pa.array([[1], [2]], pa.large_list(pa.int64())),
    "fixed_list": pa.array([[1, 2], [3, 4]], pa.list_(pa.int64(), 2)),
    "list_view": pa.array([[1], [2, 3]], pa.list_view(pa.int64())),
    "struct": pa.array([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]),
    "empty_struct": pa.array([{}, {}], pa.struct([])),
    "nested_empty_struct": pa.array([{"m": {}}, {"m": {}}], pa.struct([("m", pa.struct([]))])),
    "map": pa.array([[("k", 1)], [("j", 2)]], pa.map_(pa.string(), pa.int64())),
    "dictionary": pa.array(["a", "b"]).dictionary_encode(),
    "sparse_union": pa.UnionArray.from_sparse(
        pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["a", "b"])]
    ),
    "dense_union": pa.UnionArray.from_dense(
        pa.array([0, 0], pa.int8()), pa.array([0, 1], pa.int32()), [pa.array([1, 2])]
    ),
    "run_end": pa.RunEndEncodedArray.from_arrays([2], pa.array(["a"])),
    "uuid": pa.ExtensionArray.from_storage(pa.uuid(), pa.array([uuid.uuid4().bytes] * 2, pa.binary(16))),
}


POLARS_CANNOT_READ = {"decimal256", "list_view"}
"""Types polars reads from no file (precision over 38; list views): pyarrow and duckdb read them."""


def _input(tmp_path, name: str):
    """An Arrow IPC file (it holds every Arrow type) of two rows: one group, rewards 1 and 0."""
    table = pa.table({"group_id": [0, 0], "reward": [1.0, 0.0], "extra": VALUES[name]})
    path = tmp_path / f"{name}.arrow"
    feather.write_feather(table, path, compression="uncompressed")
    return path, table


@pytest.mark.parametrize("output", ["out.parquet", "out.jsonl"])
@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_type_is_written_or_refused_in_one_line(cli, tmp_path, name, output):
    path, table = _input(tmp_path, name)
    target = tmp_path / output
    result = cli("compute", path, "-o", target, "-q")
    if result.exit_code != 0:
        assert_one_line_error(result, f"{name}.arrow: column 'extra' ")
        assert not target.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.arrow"]
        return
    assert result.stderr == ""
    if output.endswith(".parquet"):
        written = pq.read_table(target)
        assert written.column("extra").to_pylist() == table.column("extra").to_pylist()
        if name not in POLARS_CANNOT_READ:
            assert pl.read_parquet(target).height == 2
        assert duckdb.execute(f"select count(*) from '{target}'").fetchall() == [(2,)]
    else:
        lines = [json.loads(line) for line in target.read_text().splitlines()]
        assert [line["advantage"] for line in lines] == pytest.approx([1.0, -1.0], abs=1e-5)
        assert pl.read_ndjson(target).height == 2


@pytest.mark.parametrize(
    ("name", "output"),
    [
        ("empty_struct", "out.parquet"),
        ("nested_empty_struct", "out.parquet"),
        ("month_day_nano", "out.parquet"),
        ("sparse_union", "out.parquet"),
        ("run_end", "out.jsonl"),
        ("decimal256", "out.jsonl"),
        ("list_view", "out.jsonl"),
        ("uuid", "out.jsonl"),
        ("month_day_nano", "out.jsonl"),
        ("dense_union", "out.jsonl"),
    ],
)
def test_the_types_a_format_cannot_hold_are_refused_before_any_work(cli, tmp_path, name, output):
    """Each of these was an internal error (exit 70) or a polars panic with 110 lines."""
    path, _ = _input(tmp_path, name)
    result = cli("compute", path, "-o", tmp_path / output)
    assert_one_line_error(result, "column 'extra' ", "cannot")


def test_an_empty_struct_from_json_lines_goes_to_json_lines(cli, tmp_path):
    """slime's samples carry "metadata": {}: Parquet cannot hold a struct without fields."""
    source = tmp_path / "es.jsonl"
    source.write_text('{"group_id":1,"reward":1.0,"meta":{}}\n{"group_id":1,"reward":0.0,"meta":{}}\n')
    result = cli("compute", source, "-o", tmp_path / "es.parquet")
    assert_one_line_error(
        result, "column 'meta' has type struct<>, which Parquet cannot hold", "-o FILE.jsonl"
    )
    assert cli("compute", source, "-o", tmp_path / "es_out.jsonl", "-q").exit_code == 0
    assert [json.loads(x)["meta"] for x in (tmp_path / "es_out.jsonl").read_text().splitlines()] == [{}, {}]


def test_duplicate_column_names_are_refused(cli, tmp_path):
    csv = tmp_path / "dup.csv"
    csv.write_text("group_id,reward,reward\n1,0,1\n1,1,0\n")
    parquet = tmp_path / "dup.parquet"
    pq.write_table(
        pa.Table.from_arrays(
            [pa.array([0, 0]), pa.array([1.0, 0.0]), pa.array(["a", "b"])], ["group_id", "x", "x"]
        ),
        parquet,
    )
    for path, name in ((csv, "reward"), (parquet, "x")):
        for command in ("compute", "check"):
            args = ["-o", tmp_path / "o.parquet"] if command == "compute" else []
            assert_one_line_error(cli(command, path, *args), f"2 columns named {name!r}")
    assert not (tmp_path / "o.parquet").exists()


def test_key_value_metadata_that_is_not_utf8(cli, tmp_path):
    """Parquet lets a key be any bytes: splice keeps it as it is; JSON lines drop it."""
    table = pa.table({"group_id": [0, 0], "reward": [1.0, 0.0]}).replace_schema_metadata(
        {b"\xff\xfek": b"v\xff"}
    )
    source = tmp_path / "meta.parquet"
    pq.write_table(table, source)
    spliced = tmp_path / "spliced.parquet"
    assert cli("compute", source, "-o", spliced, "-q").exit_code == 0
    assert pq.read_metadata(spliced).metadata[b"\xff\xfek"] == b"v\xff"
    assert duckdb.execute(f"select count(*) from '{spliced}'").fetchall() == [(2,)]
    lines = tmp_path / "out.jsonl"
    result = cli("compute", source, "-o", lines, "-q")
    assert result.exit_code == 0, result.stderr
    assert len(lines.read_text().splitlines()) == 2


def test_a_map_with_a_repeated_key_is_not_written_as_a_json_object(cli, tmp_path):
    """{"k": 1, "k": 2} cannot be read back (grpo-cli and pyarrow refuse it; others keep one value)."""
    repeated = pa.array([[("j", 0)], [("k", 1), ("k", 2)]], pa.map_(pa.string(), pa.int64()))
    source = tmp_path / "map.arrow"
    feather.write_feather(pa.table({"group_id": [0, 0], "reward": [1.0, 0.0], "m": repeated}), source)
    result = cli("compute", source, "-o", tmp_path / "o.jsonl")
    assert_one_line_error(result, "map.arrow: column 'm' holds a map with the key 'k' twice in a row")
    assert not (tmp_path / "o.jsonl").exists()
    parquet = tmp_path / "o.parquet"
    assert cli("compute", source, "-o", parquet, "-q").exit_code == 0  # Parquet keeps it as it is
    assert pq.read_table(parquet).column("m").to_pylist()[1] == [("k", 1), ("k", 2)]


def _twice(values: pa.Array) -> pa.Array:
    return pa.concat_arrays([values, values])


@pytest.mark.parametrize("output", ["out.parquet", "out.jsonl"])
@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_type_survives_a_row_filter_or_is_refused_in_one_line(cli, tmp_path, name, output):
    """Rows are taken and filtered too (--drop-inactive): pyarrow has no take kernel for some
    types (string and binary views), which ended a run with exit 70."""
    table = pa.table(
        {"group_id": [0, 0, 1, 1], "reward": [1.0, 0.0, 1.0, 1.0], "extra": _twice(VALUES[name])}
    )
    path = tmp_path / f"{name}.arrow"
    feather.write_feather(table, path, compression="uncompressed")
    target = tmp_path / output
    result = cli("compute", path, "-o", target, "-q", "--drop-inactive")
    if result.exit_code != 0:
        assert_one_line_error(result, f"{name}.arrow: column 'extra' ")
        assert not target.exists()
        return
    assert result.stderr == ""
    if output.endswith(".parquet"):
        written = pq.read_table(target)
        assert written.column("extra").to_pylist() == VALUES[name].to_pylist()
        pq.write_table(table, tmp_path / "pyarrow.parquet")  # Parquet's own type for it (date64 is date32)
        assert (
            written.schema.field("extra").type
            == pq.read_schema(tmp_path / "pyarrow.parquet").field("extra").type
        )
    else:
        assert [json.loads(line)["group_id"] for line in target.read_text().splitlines()] == [0, 0]


@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_type_groups_rows_as_a_key_or_is_refused_in_one_line(cli, tmp_path, name):
    """Each type as the group key, in a hashed and a dict path's run: the rows whose values are
    equal share a group, or the type is refused before any work."""
    values = _twice(VALUES[name])
    table = pa.table({"extra": values, "reward": [1.0, 0.0, 0.0, 1.0]})
    path = tmp_path / f"{name}.arrow"
    feather.write_feather(table, path, compression="uncompressed")
    result = cli("check", path, "-g", "extra", "--summary-json", "-", "-q")
    if result.exit_code != 0:
        assert_one_line_error(result, "group column 'extra' has type")
        return
    assert json.loads(result.stdout)["groups"] == len(VALUES[name]) - (name in EQUAL_PAIRS)


EQUAL_PAIRS = {
    "date32",
    "date64",
    "time32",
    "timestamp_tz",
    "month_day_nano",
    "uuid",
    "run_end",
    "empty_struct",
}
"""The types whose two values in VALUES are equal."""
