"""The readers' hardening one piece at a time: what each scan finds, the line it names, and the
one-line refusals of files that cannot be read.

Written against the mutants ``make mutation`` found alive in grpo_cli/inputs/readers/.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest

from grpo_cli.errors import GrpoError
from grpo_cli.file_names import PROVENANCE_KEY
from grpo_cli.inputs import readers
from grpo_cli.inputs.sources import Shard
from tests.conftest import assert_one_line_error


def shard_of(path: Path, fmt: str, *, compression: str | None = None, record_word: str = "line") -> Shard:
    return Shard(path, path.name, fmt, path.stat().st_size, compression=compression, record_word=record_word)


def gzipped(tmp_path: Path, name: str, data: bytes, fmt: str) -> Shard:
    path = tmp_path / name
    path.write_bytes(gzip.compress(data))
    return shard_of(path, fmt, compression="gzip")


def message(call) -> str:
    with pytest.raises(GrpoError) as caught:
        call()
    return caught.value.message


# --------------------------------------------------------------------------- JSON nesting


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"{}", 1),
        (b'{"a": 1}', 1),
        (b'{"a": [1, {"b": 2}]}', 3),
        (b'{"a": [1], "b": [2], "c": {"d": [3]}}', 3),  # closing brackets bring the depth down
        (b'{"a": "[[[[{{{{"}', 1),  # brackets inside a string do not nest
        (b'{"a": "say \\"[[[\\" twice", "b": [[1]]}', 3),  # nor after an escaped quote
        (b'{"a": "\\\\", "b": [[[1]]]}', 4),  # an escaped backslash ends its escape
        (b'["]", [[0]]]', 3),  # a closing bracket inside a string does not close
        (b'[{"a":"}"},{"b":[]}]', 3),
        (b"[1, 2, 3]", 1),
        (b"[[[1], [[2]]]]", 4),  # a closing bracket takes one level off, not all but one
        (b"7", 0),
    ],
)
def test_json_depth_counts_nesting_outside_strings(text, depth):
    assert readers.jsonl._json_depth(text) == depth


def _jsonl(tmp_path: Path, lines: list[str], name: str = "r.jsonl") -> Shard:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return shard_of(path, "jsonl")


def test_a_line_with_many_brackets_in_its_strings_is_not_too_deep(tmp_path):
    """The vectorised count flags a line with more than 64 brackets; the scan of that line then
    skips its strings and finds it one level deep."""
    shard = _jsonl(tmp_path, [json.dumps({"group_id": 1, "text": "[{" * 100})])
    readers.jsonl._check_jsonl_nesting(shard)  # no refusal
    deep = "[" * 65 + "]" * 65
    shard = _jsonl(tmp_path, ['{"a": 1}', "{}", '{"a": ' + deep + "}"], "deep.jsonl")
    assert message(lambda: readers.jsonl._check_jsonl_nesting(shard)) == (
        "deep.jsonl, line 3: a value nests 66 levels deep; grpo-cli reads at most 64"
    )


# --------------------------------------------------------------------------- malformed JSON lines


@pytest.mark.parametrize(
    ("lines", "found"),
    [
        (['{"a": 1}', '{"a": 2', '{"a": 3}'], (2, "Expecting ',' delimiter at column 8")),
        (['{"a": 1}', "", "   ", "[1, 2]"], (4, "expected a JSON object, got list")),  # blanks skipped
        (['{"a": 1}', "", '"text"'], (3, "expected a JSON object, got str")),
        (['{"a": "\\ud800"}'], (1, "a string escapes a lone UTF-16 surrogate (not valid Unicode)")),
        (['{"a": {"\\udfff": 1}}'], (1, "a string escapes a lone UTF-16 surrogate (not valid Unicode)")),
        (
            ['{"a": [1, ["x", "\\ud83d"]]}'],
            (1, "a string escapes a lone UTF-16 surrogate (not valid Unicode)"),
        ),
        (['{"a": 1}', '{"a": "\\ud83d\\ude00"}'], None),  # a surrogate pair is one character
        (['{"a": 1}X'], (1, "Extra data at column 9")),  # only the line's end is trimmed
    ],
)
def test_the_first_bad_json_line_and_why(tmp_path, lines, found):
    assert readers.jsonl._first_bad_jsonl_line(_jsonl(tmp_path, lines)) == found


def test_invalid_utf8_is_placed_at_its_byte(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": "ok\xff"}\n')
    assert readers.jsonl._first_bad_jsonl_line(shard_of(path, "jsonl")) == (
        3,
        "invalid UTF-8 at byte 10 of the line",
    )


def test_a_malformed_json_array_element_is_named_as_an_element(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": \n')
    element = shard_of(path, "jsonl", record_word="element")
    assert readers.jsonl._jsonl_error(element, pa.ArrowInvalid("x")).message == (
        "r.jsonl, element 2: malformed JSON array (Expecting value at column 7)"
    )
    line = shard_of(path, "jsonl")
    assert readers.jsonl._jsonl_error(line, pa.ArrowInvalid("x")).message == (
        "r.jsonl, line 2: malformed JSONL (Expecting value at column 7)"
    )


def test_a_jsonl_error_without_a_bad_line_says_what_failed(tmp_path):
    shard = gzipped(tmp_path, "r.jsonl.gz", b'{"a": 1}\n', "jsonl")
    assert readers.jsonl._jsonl_error(shard, OSError("stream ended early")).message == (
        "r.jsonl.gz: not a readable gzip file (stream ended early)"
    )
    assert readers.jsonl._jsonl_error(shard, pa.ArrowInvalid("odd")).message == (
        "r.jsonl.gz: cannot read the JSONL file (odd)"
    )
    plain = _jsonl(tmp_path, ['{"a": 1}'])
    assert (
        readers.jsonl._jsonl_error(plain, OSError("disk gone")).message
        == "r.jsonl: cannot read the JSONL file (disk gone)"
    )


# --------------------------------------------------------------------------- integers JSON makes floats

BIG = 2**53 + 1  # the first integer float64 rounds


@pytest.mark.parametrize(
    ("value", "data_type", "found"),
    [
        (BIG, pa.float64(), BIG),
        (5, pa.float64(), None),
        (-5, pa.float64(), None),
        (2**53, pa.float64(), None),  # a power of two is exact
        (-(2**63), pa.float64(), None),  # the least int64, exact as a float
        (2**63, pa.float64(), 2**63),  # past int64: pyarrow made it a float, exact or not
        (-(2**63) - 2048, pa.float64(), -(2**63) - 2048),
        (BIG, pa.int64(), None),  # an integer column keeps it
        (True, pa.float64(), None),
        (None, pa.float64(), None),
        (
            {"a": 1, "b": {"c": BIG}},
            pa.struct([("a", pa.float64()), ("b", pa.struct([("c", pa.float64())]))]),
            BIG,
        ),
        ({"a": 1, "b": BIG}, pa.struct([("a", pa.float64()), ("b", pa.int64())]), None),
        ({"a": BIG}, pa.float64(), None),  # an object where the column holds no struct
        (BIG, pa.struct([("a", pa.float64())]), None),  # a number where the column holds a struct
        ([1.5, 2, BIG], pa.list_(pa.float64()), BIG),
        ([1.5, [BIG]], pa.large_list(pa.large_list(pa.float64())), BIG),
        ([1, 2], pa.list_(pa.float64()), None),
        ([BIG], pa.float64(), None),  # a list where the column holds no list
    ],
)
def test_an_integer_is_inexact_only_where_its_column_is_floating_and_rounds_it(value, data_type, found):
    assert readers.jsonl._inexact_integer(value, data_type) == found


# --------------------------------------------------------------------------- JSON types across a file


def _read_all(reader: pa_json.JSONStreamingReader) -> None:
    for _ in reader:
        pass


def _drift(rows: list[dict[str, object]]) -> str:
    """What pyarrow's streaming reader raises where a later block does not fit the first's types."""
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    reader = pa_json.open_json(pa.BufferReader(data), read_options=pa_json.ReadOptions(block_size=64))
    with pytest.raises(pa.ArrowInvalid) as caught:
        _read_all(reader)
    return str(caught.value)


PAD = "x" * 40


@pytest.mark.parametrize(
    "later",
    [
        {"x": "a", "pad": PAD},  # number, then string
        {"x": {"y": 1}, "pad": PAD},  # number, then object
        {"x": 1, "z": 2, "pad": PAD},  # a new field
        {"x": 1.5, "pad": PAD},  # an integer column, then a float
    ],
)
def test_each_kind_of_type_drift_pyarrow_reports_is_known(later):
    exc = _drift([{"x": 1, "pad": PAD}] * 3 + [later])
    assert readers.text._is_schema_drift(pa.ArrowInvalid(exc)), exc


def test_a_parse_error_is_not_a_type_drift():
    assert not readers.text._is_schema_drift(
        pa.ArrowInvalid("JSON parse error: Missing a name for object member.")
    )


def test_unified_types_span_every_chunk_blank_ones_included(tmp_path):
    """The file is typed chunk by chunk: a chunk of blank lines is skipped, not the end, and an
    integer column that holds a float in a later chunk becomes a float column."""
    lines = ['{"x": 1}'] * 3 + [""] * 30 + ['{"x": 2.5, "y": "new"}']
    shard = _jsonl(tmp_path, lines)
    schema = readers.jsonl.unify_jsonl_schema(shard, chunk_bytes=1)  # a chunk a line
    assert schema.field("x").type == pa.float64()
    assert schema.field("y").type == pa.string()
    assert shard.found.schema == schema


def test_incompatible_types_across_chunks_are_refused_in_one_line(tmp_path):
    shard = _jsonl(tmp_path, ['{"x": 1}'] * 3 + ['{"x": [1]}'])
    text = message(lambda: readers.jsonl.unify_jsonl_schema(shard, chunk_bytes=1))
    assert text.startswith("r.jsonl: a column holds values of incompatible types (Unable to merge: Field x")


def test_a_type_drift_in_a_file_is_settled_and_read_in_the_unified_types(tmp_path):
    lines = ['{"group_id": 1, "reward": 1}'] * 5 + ['{"group_id": 1, "reward": 0.5, "note": "n"}']
    shard = _jsonl(tmp_path, lines)
    shard.found.longest_line = 0
    readers.jsonl.unify_jsonl_schema(shard)
    batches = list(readers.iter_batches(shard, ["reward"], 100))
    assert pa.Table.from_batches(batches).column("reward").to_pylist() == [1.0] * 5 + [0.5]


# --------------------------------------------------------------------------- CSV


def _csv(tmp_path: Path, text: str | bytes, name: str = "r.csv") -> Shard:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return shard_of(path, "csv")


def test_csv_batches_hold_the_columns_asked_for(tmp_path):
    shard = _csv(tmp_path, "group_id,reward,text\n1,0.5,a\n2,1,b\n")
    (batch,) = readers.iter_batches(shard, ["reward"], 100)
    assert batch.schema.names == ["reward"] and batch.column(0).to_pylist() == ["0.5", "1"]


def test_a_bad_csv_record_is_named_by_the_line_an_editor_shows(tmp_path):
    """A byte-order mark, a quoted cell across lines (CRLF) and invalid UTF-8 before it: the
    record with a third cell is on line 5."""
    text = b'\xef\xbb\xbfgroup_id,reward\r\n1,"0.5\r\nstill the cell"\r\n2,\xff\xfe\r\n3,1,extra\r\n4,1\r\n'
    shard = _csv(tmp_path, text)
    assert readers.csv._csv_line_of_bad_record(shard) == 5
    assert readers.csv.csv_line_of_record(shard, 0) == 2
    assert readers.csv.csv_line_of_record(shard, 1) == 4
    assert readers.csv.csv_line_of_record(shard, 3) == 6
    assert readers.csv.csv_line_of_record(shard, 9) is None


def test_a_csv_cell_longer_than_pythons_field_limit_does_not_break_the_line_search(tmp_path):
    shard = _csv(tmp_path, "a,b\n1," + "z" * 200_000 + "\n2,3,4\n")
    assert readers.csv._csv_line_of_bad_record(shard) is None  # Python's csv stops at the long cell


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "r.csv: an empty CSV file (not even a header line)"),
        ("a,b\n1,2\n3,4,5\n", "r.csv, line 3: malformed CSV (CSV parse error: Expected 2 columns, got 3)"),
    ],
)
def test_csv_errors_in_one_line(tmp_path, text, expected):
    shard = _csv(tmp_path, text)
    assert message(lambda: list(readers.iter_batches(shard, None, 100))) == expected


def test_a_csv_error_with_no_record_to_blame_names_no_line(tmp_path):
    shard = _csv(tmp_path, "a,b\n1,2\n")
    assert str(readers.csv._csv_error(shard, pa.ArrowInvalid("CSV conversion error"))) == (
        "r.csv: malformed CSV (CSV conversion error)"
    )
    compressed = gzipped(tmp_path, "r.csv.gz", b"a,b\n1,2\n", "csv")
    assert str(readers.csv._csv_error(compressed, OSError("truncated"))) == (
        "r.csv.gz: not a readable gzip file (truncated)"
    )
    assert str(readers.csv._csv_error(compressed, pa.ArrowInvalid("CSV conversion error"))) == (
        "r.csv.gz: malformed CSV (CSV conversion error)"
    )


def test_a_malformed_csv_record_past_the_first_block_is_named_with_its_line(tmp_path):
    """pyarrow reads CSV 8 MiB at a time: a bad record in a later block fails while batches
    are read, and is named as one in the first block is."""
    rows = "".join(f"{i},0.5\n" for i in range(1_000_000))
    shard = _csv(tmp_path, "group_id,reward\n" + rows + "7,1,extra\n" + "8,1\n")
    assert message(lambda: list(readers.iter_batches(shard, None, 1 << 20))) == (
        "r.csv, line 1000002: malformed CSV (CSV parse error: Expected 2 columns, got 3)"
    )


def test_a_csv_header_with_a_quoted_newline_names_the_column(tmp_path):
    shard = _csv(tmp_path, '"group\nid",reward\n1,0.5\n')
    assert readers.read_schema(shard).names == ["group\nid", "reward"]
    (batch,) = readers.iter_batches(shard, None, 100)
    assert batch.column(1).to_pylist() == ["0.5"]


def test_a_csv_header_or_record_longer_than_pyarrows_default_block_is_read(tmp_path):
    """pyarrow's default CSV block is 1 MiB; grpo-cli reads 8 MiB blocks, so a cell (or a column
    name) of 2 MB is read, as one across quoted newlines is."""
    name = "n" * (2 << 20)
    cell = "line\n" * (2 << 18)
    shard = _csv(tmp_path, f'group_id,{name}\n1,"{cell}"\n2,x\n')
    assert readers.read_schema(shard).names == ["group_id", name]
    table = pa.Table.from_batches(list(readers.iter_batches(shard, None, 100)))
    assert table.column(1).to_pylist() == [cell, "x"]


# --------------------------------------------------------------------------- Parquet


def _crc_parquet(tmp_path: Path) -> Path:
    """A Parquet file with page CRCs and one byte flipped in the reward column's page."""
    import struct

    path = tmp_path / "crc.parquet"
    table = pa.table({"group_id": [0, 0, 1, 1], "reward": [1.0, 0.0, 0.5, 0.25]})
    pq.write_table(table, path, write_page_checksum=True, compression="none", use_dictionary=False)
    data = bytearray(path.read_bytes())
    data[data.find(struct.pack("<d", 0.25))] ^= 0x01
    path.write_bytes(bytes(data))
    return path


def test_a_page_that_fails_its_checksum_is_refused_when_the_file_is_read_whole(cli, tmp_path):
    """--rewrite of a small file reads it whole (pyarrow decodes row groups in parallel): the CRCs
    are checked on that path too."""
    path = _crc_parquet(tmp_path)
    result = cli("compute", path, "-o", tmp_path / "out.parquet", "--rewrite")
    assert_one_line_error(result, "crc.parquet: corrupt Parquet data (could not verify page")
    assert not (tmp_path / "out.parquet").exists()
    assert message(lambda: readers.read_table(shard_of(path, "parquet"))).startswith(
        "crc.parquet: corrupt Parquet data (could not verify page"
    )


def test_a_page_that_fails_its_checksum_is_refused_when_the_file_is_read_in_batches(tmp_path):
    """The streaming read (every compute and check past the small-file path) checks the CRCs too."""
    shard = shard_of(_crc_parquet(tmp_path), "parquet")
    assert message(lambda: list(readers.iter_batches(shard, ["reward"], 2))).startswith(
        "crc.parquet: corrupt Parquet data (could not verify page"
    )


def test_a_parquet_file_that_stops_opening_is_refused_in_one_line(tmp_path, monkeypatch):
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"a": [1]}), path)
    shard = shard_of(path, "parquet")

    def gone(*args, **kwargs):
        raise OSError("the file went away")

    monkeypatch.setattr(pq, "ParquetFile", gone)
    assert message(lambda: list(readers.iter_batches(shard, None, 10))) == (
        "r.parquet: not a readable Parquet file (the file went away)"
    )


NOT_PARQUET = "notes.parquet: not a readable Parquet file (Parquet magic bytes not found in footer."


@pytest.mark.parametrize(
    "ask",
    [
        lambda reader, shard: reader.schema(shard),
        lambda reader, shard: reader.memory_bytes(shard),
        lambda reader, shard: reader.provenance(shard),
        lambda reader, shard: list(reader.batches(shard, None, 10)),
    ],
    ids=["schema", "memory", "provenance", "batches"],
)
def test_a_file_that_is_not_parquet_is_named_by_every_parquet_read(tmp_path, ask):
    path = tmp_path / "notes.parquet"
    path.write_bytes(b"these are notes, not a Parquet file")
    shard = shard_of(path, "parquet")
    got = message(lambda: ask(readers.parquet.ParquetReader(), shard))
    assert got.startswith(NOT_PARQUET), got
    # a row count is only a hint for the progress bar
    assert readers.parquet.ParquetReader().rows(shard) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Parquet file is encrypted",
            "x.parquet: an encrypted Parquet file; grpo-cli reads no encrypted data",
        ),
        (
            "Decryption failed: no key",
            "x.parquet: an encrypted Parquet file; grpo-cli reads no encrypted data",
        ),
        ("CRYPTO metadata unknown", "x.parquet: an encrypted Parquet file; grpo-cli reads no encrypted data"),
        ("bad magic bytes", "x.parquet: unreadable (bad magic bytes)"),
    ],
)
def test_a_read_error_says_encrypted_whichever_part_failed(text, expected):
    assert readers.base.read_error("x.parquet", OSError(text), "unreadable").message.startswith(expected)


def test_validate_pages_counts_every_row_group_and_skips_other_formats(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"a": np.arange(30), "b": np.arange(30) * 0.5}), good, row_group_size=10)
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text('{"a": 1}\n')
    shards = [
        shard_of(jsonl, "jsonl"),
        shard_of(good, "parquet"),
        shard_of(_crc_parquet(tmp_path), "parquet"),
    ]
    assert readers.validate_pages(shards[:2]) == {"row_groups": 3, "column_chunks": 6, "error": None}
    found = readers.validate_pages(shards)
    assert found["row_groups"] == 3 and found["column_chunks"] == 7
    assert found["error"].startswith(
        "crc.parquet: row group 0, column 'reward': does not decode (could not verify page integrity"
    )


def test_validate_pages_names_a_file_that_does_not_open(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 not really parquet")
    assert readers.validate_pages([shard_of(path, "parquet")]) == {
        "row_groups": 0,
        "column_chunks": 0,
        "error": "bad.parquet: unreadable (Parquet magic bytes not found in footer. Either the file is "
        "corrupted or this is not a parquet file.)",
    }


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (b"{not json", "r.parquet: its grpo-cli provenance entry is not valid JSON"),
        (b"[1, 2]", "r.parquet: its grpo-cli provenance entry is not a JSON object"),
    ],
)
def test_an_edited_provenance_entry_is_refused_in_one_line(tmp_path, entry, expected):
    path = tmp_path / "r.parquet"
    table = pa.table({"a": [1]}).replace_schema_metadata({PROVENANCE_KEY: entry})
    pq.write_table(table, path)
    assert message(lambda: readers.read_provenance(shard_of(path, "parquet"))) == expected


# --------------------------------------------------------------------------- tables and sizes


def test_a_tables_batches_hold_the_columns_and_rows_asked_for():
    table = pa.table({"a": np.arange(25), "b": np.arange(25) * 2})
    shard = Shard(Path("<table>"), "<table>", "table", 0, table=table)
    batches = list(readers.iter_batches(shard, ["b"], 10))
    assert [b.num_rows for b in batches] == [10, 10, 5]
    assert all(b.schema.names == ["b"] for b in batches)


def test_a_text_files_memory_is_estimated_from_its_size(tmp_path):
    """Decoded text takes about twice its bytes; a compressed file about six times."""
    shard = _jsonl(tmp_path, ['{"a": 1}'])
    assert readers.estimated_memory_bytes(shard) == 2 * shard.size_bytes
    compressed = gzipped(tmp_path, "r.jsonl.gz", b'{"a": 1}\n', "jsonl")
    assert readers.estimated_memory_bytes(compressed) == 6 * compressed.size_bytes


# --------------------------------------------------------------------------- row ranges (Ray's reads)


@pytest.fixture
def grouped_file(tmp_path: Path) -> Path:
    path = tmp_path / "part.parquet"
    table = pa.table({"x": pa.array(range(10), pa.int32()), "y": [f"v{i}" for i in range(10)]})
    pq.write_table(table, path, row_group_size=4, write_page_checksum=True)
    return path


@pytest.mark.parametrize(("start", "stop"), [(0, 10), (3, 9), (4, 8), (0, 4), (9, 10), (5, 6), (0, 1)])
def test_a_row_range_is_those_rows_whichever_row_groups_hold_them(grouped_file, start, stop):
    table = readers.parquet_row_range(str(grouped_file), "part.parquet", ["x"], start, stop)
    assert table.column_names == ["x"]
    assert table.column("x").to_pylist() == list(range(start, stop))


def test_a_row_range_keeps_every_column_in_the_files_types(grouped_file):
    with pa.OSFile(str(grouped_file)) as handle:
        table = readers.parquet_row_range(handle, "part.parquet", None, 2, 7)
    assert table.schema.types == [pa.int32(), pa.string()]
    assert table.column("y").to_pylist() == ["v2", "v3", "v4", "v5", "v6"]


def test_an_empty_row_range_has_the_columns(grouped_file):
    for columns in (["y"], None):
        table = readers.parquet_row_range(str(grouped_file), "part.parquet", columns, 10, 10)
        assert table.num_rows == 0 and table.column_names == (columns or ["x", "y"])


@pytest.mark.parametrize(
    ("start", "stop", "groups"),
    [(0, 4, [0]), (4, 8, [1]), (3, 5, [0, 1]), (4, 4, []), (7, 9, [1, 2]), (8, 10, [2])],
)
def test_a_row_range_decodes_only_the_row_groups_holding_it(grouped_file, monkeypatch, start, stop, groups):
    """Each Ray block reads its own rows: a range that decoded every row group would read the
    whole file once per block."""
    asked: list[list[int]] = []
    real = pq.ParquetFile.read_row_groups

    def spy(self, row_groups, *args, **kwargs):
        asked.append(list(row_groups))
        return real(self, row_groups, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    readers.parquet_row_range(str(grouped_file), "g.parquet", ["x"], start, stop)
    assert asked == ([groups] if groups else [])


def _invalid_batch() -> pa.RecordBatch:
    """Offsets that pass the cheap checks (sizes) and fail the full ones (they go backwards)."""
    offsets = pa.py_buffer(np.array([0, 3, 1], dtype=np.int32).tobytes())
    strings = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"abcd")])
    return pa.record_batch([strings], names=["s"])


@pytest.mark.parametrize(
    "error", [pa.ArrowInvalid("page 3 does not decode"), OSError("page 3 does not decode")]
)
def test_a_batch_that_does_not_decode_is_named_with_its_file(error):
    def batches():
        yield pa.record_batch({"s": ["ab"]})
        raise error

    shard = Shard(Path("x.parquet"), "x.parquet", "parquet", 0)
    checked = readers.base._checked(shard, batches(), "Parquet")
    next(checked)
    with pytest.raises(GrpoError) as caught:
        next(checked)
    assert caught.value.message == "x.parquet: corrupt Parquet data (page 3 does not decode)"


def test_a_batch_with_bad_offsets_is_refused_before_anything_reads_it():
    shard = Shard(Path("x.arrow"), "x.arrow", "arrow", 0)
    good = pa.record_batch({"s": ["ab", "c"]})
    checked = readers.base._checked(shard, iter([good, _invalid_batch()]), "Arrow")
    assert next(checked) is good
    with pytest.raises(GrpoError) as caught:
        next(checked)
    assert caught.value.message == (
        "x.arrow: corrupt Arrow data (In column 0: Invalid: Offset invariant failure: "
        "non-monotonic offset at slot 2: 1 < 3)"
    )


def test_a_row_range_of_a_bad_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    assert message(lambda: readers.parquet_row_range(str(bad), "bad.parquet", None, 0, 1)).startswith(
        "bad.parquet: not a readable Parquet file (Parquet magic bytes not found in footer."
    )
    crc = _crc_parquet(tmp_path)
    assert message(lambda: readers.parquet_row_range(str(crc), "crc.parquet", ["reward"], 0, 4)).startswith(
        "crc.parquet: corrupt Parquet data (could not verify page"
    )


# --------------------------------------------------------------------------- a column's values of two types


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (  # within the first block, which opening the file infers from
            [{"group_id": 1, "reward": 1}, {"group_id": 1, "reward": "a"}],
            "r.jsonl, line 2: column 'reward' holds a string where line 1 holds a number",
        ),
        (  # in a later block: found while typing the whole file, placed on its line
            [{"group_id": 1, "reward": 1, "pad": "x" * 100}] * 90_000
            + [{"group_id": 1, "reward": {"a": 1}}]
            + [{"group_id": 1, "reward": 0}],
            "r.jsonl, line 90001: column 'reward' holds an object where line 1 holds a number",
        ),
        (  # a nested field
            [{"group_id": 1, "meta": {"score": [1]}}, {"group_id": 1, "meta": {"score": True}}],
            "r.jsonl, line 2: column 'meta.score' holds a boolean where line 1 holds an array",
        ),
        (  # a list's elements, on a later line: pyarrow names the record 0-based ("in row 2")
            [{"group_id": 1, "mask": [1]}, {"group_id": 1, "mask": [1]}, {"group_id": 1, "mask": ["x"]}],
            "r.jsonl, line 3: column 'mask[]' holds a string where line 1 holds a number",
        ),
        (  # within one line
            [{"group_id": 1, "mask": []}, {"group_id": 1, "mask": [1, True]}],
            "r.jsonl, line 2: column 'mask[]' holds a boolean where the same line, before it, holds a number",
        ),
        (  # a list of lists (NeMo-RL's token masks), and a field of a list's structs
            [{"group_id": 1, "mask": [[1, 0]], "m": [{"s": 1}]}, {"group_id": 1, "mask": [[True]], "m": []}],
            "r.jsonl, line 2: column 'mask[][]' holds a boolean where line 1 holds a number",
        ),
        (
            [{"group_id": 1, "m": [{"s": 1}, {"t": 2}]}, {"group_id": 1, "m": [{"s": "x"}]}],
            "r.jsonl, line 2: column 'm[].s' holds a string where line 1 holds a number",
        ),
    ],
)
def test_a_column_whose_values_change_type_is_placed_on_its_line(cli, tmp_path, rows, expected):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = cli("compute", path, "-o", tmp_path / "out.parquet")
    assert_one_line_error(result, expected, "a column's values must share a type")
    assert not (tmp_path / "out.parquet").exists()


def test_a_type_change_no_line_shows_keeps_pyarrows_words(tmp_path):
    shard = _jsonl(tmp_path, ['{"a": 1}'])
    words = "JSON parse error: Column(/b) changed from number to string in row 0"
    assert readers.jsonl._jsonl_error(shard, pa.ArrowInvalid(words)).message == (
        f"r.jsonl: cannot read the JSONL file ({words})"
    )


# --------------------------------------------------------------------------- scans over chunks


def test_the_scans_number_lines_across_chunks(tmp_path):
    """Both whole-file scans read line-aligned chunks: a line is numbered across them, and the
    longest line (its newline counted) is noted for pyarrow's block."""
    rows = [json.dumps({"group_id": i, "reward": 0.5}) for i in range(40)]
    rows[33] = json.dumps({"group_id": 33, "reward": BIG})
    shard = _jsonl(tmp_path, ["", *rows])  # a blank first line counts
    schema = pa.schema([("group_id", pa.int64()), ("reward", pa.float64())])
    text = message(lambda: readers.jsonl._check_exact_integers(shard, schema, chunk_bytes=100))
    assert text.startswith(f"r.jsonl, line 35: the integer {BIG} in column 'reward' cannot be kept exactly")
    deep = "[" * 70 + "]" * 70
    lines = [*rows[:20], '{"a": ' + deep + "}", *rows[20:]]
    shard = _jsonl(tmp_path, lines, "deep.jsonl")
    text = message(lambda: readers.jsonl._check_jsonl_nesting(shard, chunk_bytes=100))
    assert text == "deep.jsonl, line 21: a value nests 71 levels deep; grpo-cli reads at most 64"
    shard = _jsonl(tmp_path, rows, "ok.jsonl")
    readers.jsonl._check_jsonl_nesting(shard, chunk_bytes=100)
    assert shard.found.longest_line == max(len(line) for line in rows) + 1


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("[" * 63 + "]" * 63 + ', "c": [], "d": []', False),  # 64 levels, 66 brackets: as deep as may go
        ("[" * 64 + "]" * 64, True),  # 65 levels
    ],
)
def test_sixty_four_levels_are_read_and_sixty_five_refused(tmp_path, value, refused):
    shard = _jsonl(tmp_path, ['{"a": 1, "b": ' + value + "}"])
    if refused:
        assert "nests 65 levels deep" in message(lambda: readers.jsonl._check_jsonl_nesting(shard))
    else:
        readers.jsonl._check_jsonl_nesting(shard)


def test_a_deep_line_is_measured_on_its_own_and_at_the_end_of_the_file(tmp_path):
    """An unclosed deep line followed by more brackets: only its own depth is counted; a deep last
    line with no newline after it is refused too."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"[" * 70 + b"\n[[[1]]]\n")
    text = message(lambda: readers.jsonl._check_jsonl_nesting(shard_of(path, "jsonl")))
    assert text == "r.jsonl, line 1: a value nests 70 levels deep; grpo-cli reads at most 64"
    path.write_bytes(b'{"a": 1}\n' + b"[" * 66 + b"]" * 66)
    text = message(lambda: readers.jsonl._check_jsonl_nesting(shard_of(path, "jsonl")))
    assert text == "r.jsonl, line 2: a value nests 66 levels deep; grpo-cli reads at most 64"


def test_the_long_integer_lines_of_a_chunk(tmp_path):
    first = b'{"a": 12345678901234567, "b": 98765432109876543}'
    second = b'{"a": 1, "b": 2}'
    third = b'{"a": 11112222333344445}'
    chunk = b"\n" + first + b"\n" + second + b"\n" + third  # no newline after the last line
    assert readers.jsonl._long_integer_lines(chunk, 10) == [(12, first), (14, third)]


def test_a_column_that_becomes_floating_after_settling_is_checked_again(cli, tmp_path, monkeypatch):
    """The exact-integer scan is skipped for a schema it passed: a file whose 'id' column is read as
    int64 (2**53 + 1 kept) until a later block holds 1.5 is typed again as float64, where 2**53 + 1
    would round, and scanned again under those types."""
    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 4096)
    rows = [{"group_id": i // 4, "reward": 0.5, "id": i} for i in range(400)]
    rows[10]["id"] = BIG
    rows[390]["id"] = 1.5
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = cli("compute", path, "-o", tmp_path / "out.parquet")
    assert_one_line_error(
        result, f"ids.jsonl, line 11: the integer {BIG} in column 'id' cannot be kept exactly"
    )


# --------------------------------------------------------------------------- the stream pyarrow reads


def test_the_scanned_stream_reads_what_it_is_asked_for(tmp_path, monkeypatch):
    monkeypatch.setattr(readers.jsonl, "SCAN_CHUNK_BYTES", 8)
    shard = _jsonl(tmp_path, ['{"a": 1}', '{"a": 22}', '{"a": 333}'])
    data = shard.path.read_bytes()
    scanner = readers.jsonl._ScannedJsonl(shard)
    assert scanner.read(0) == b""
    assert scanner.read(1) == data[:1]
    assert scanner.read(5) == data[1:6]
    assert scanner.read(-1) == data[6:]
    assert scanner.read(4) == b""
    assert scanner.longest == len('{"a": 333}') + 1
    scanner.close()


def test_a_scanned_stream_told_to_stop_ends_at_the_first_line_end_past_its_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(readers.jsonl, "SCAN_CHUNK_BYTES", 10)
    lines = [json.dumps({"a": i}) + "\n" for i in range(100)]  # 9 or 10 bytes each
    shard = _jsonl(tmp_path, [line.rstrip("\n") for line in lines])
    scanner = readers.jsonl._ScannedJsonl(shard, stop_after=50)
    data = scanner.read(-1)
    scanner.close()
    assert data.endswith(b"\n") and 50 <= len(data) < 50 + 10 + 11
    assert data == "".join(lines).encode()[: len(data)]
    whole = readers.jsonl._ScannedJsonl(shard)
    assert whole.read(-1) == "".join(lines).encode()
    whole.close()


def test_a_streamed_schema_reads_only_the_first_block(tmp_path, monkeypatch):
    """However far pyarrow's own read-ahead gets before the stream is closed."""
    monkeypatch.setattr(readers.text, "TEXT_IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(readers.jsonl, "SCAN_CHUNK_BYTES", 1024)
    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 4096)
    shard = _jsonl(tmp_path, [json.dumps({"group_id": i, "reward": 0.5}) for i in range(20_000)])
    handed: list[int] = []
    real = readers.jsonl._ScannedJsonl.close

    def close(self):
        handed.append(self.handed_out)
        real(self)

    monkeypatch.setattr(readers.jsonl._ScannedJsonl, "close", close)
    assert readers.read_schema(shard).names == ["group_id", "reward"]
    assert handed and max(handed) < 4096 + 1024 + 64, handed


def test_a_truncated_gzip_file_past_the_budget_is_refused_not_cut_short(cli, tmp_path, monkeypatch):
    """The scanned stream meets the broken end of a gzip file after the schema was read: the run
    must refuse it, not end the file there and compute on the rows before."""
    monkeypatch.setattr(readers.text, "TEXT_IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(readers.jsonl, "SCAN_CHUNK_BYTES", 4096)
    rows = "".join(
        json.dumps({"group_id": i // 4, "reward": float(i % 2), "t": i * 7}) + "\n" for i in range(20_000)
    )
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress(rows.encode())[:-40])
    result = cli("compute", path, "-o", tmp_path / "out.parquet", "--memory-limit-mb", "0")
    assert_one_line_error(
        result,
        "r.jsonl.gz: not a readable gzip file "
        "(Compressed file ended before the end-of-stream marker was reached)",
    )
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize(("name", "fmt"), [("r.jsonl", "jsonl"), ("r.data", "jsonl"), ("r.csv", "csv")])
def test_a_gzip_file_told_by_its_bytes_streams_decompressed_past_the_budget(
    cli, tmp_path, monkeypatch, name, fmt
):
    """The compression sniffed from the bytes reaches the streamed reads, whatever the file's name
    says (pyarrow's own guess goes by the suffix)."""
    monkeypatch.setattr(readers.text, "TEXT_IN_MEMORY_BYTES", 0)
    if fmt == "csv":
        rows = "group_id,reward\n" + "".join(f"{i // 4},{float(i % 3 == 0)}\n" for i in range(400))
    else:
        rows = "".join(
            json.dumps({"group_id": i // 4, "reward": float(i % 3 == 0)}) + "\n" for i in range(400)
        )
    plain, packed = tmp_path / f"plain.{fmt}", tmp_path / name
    plain.write_text(rows)
    packed.write_bytes(gzip.compress(rows.encode()))
    args = ["--memory-limit-mb", "0", "--input-format", fmt]
    assert cli("compute", plain, "-o", tmp_path / "a.parquet", *args).exit_code == 0
    result = cli("compute", packed, "-o", tmp_path / "b.parquet", *args)
    assert result.exit_code == 0, result.output
    assert pq.read_table(tmp_path / "b.parquet").equals(pq.read_table(tmp_path / "a.parquet"))


@pytest.mark.parametrize(
    ("exc", "compression", "expected"),
    [
        (FileNotFoundError("gone"), "gzip", "x: cannot read the file (gone)"),
        (PermissionError("denied"), None, "x: cannot read the file (denied)"),
        (EOFError("cut"), "gzip", "x: not a readable gzip file (cut)"),
        (OSError("bad"), None, "x: cannot read the file (bad)"),
    ],
)
def test_a_file_read_error_says_which(exc, compression, expected):
    shard = Shard(Path("x"), "x", "jsonl", 0, compression=compression)
    assert readers.text._file_error(shard, exc).message == expected


def test_a_text_stream_closes_twice_quietly(tmp_path):
    stream = readers.jsonl._JsonlStream(_jsonl(tmp_path, ['{"a": 1}']))
    with stream as reader:
        assert reader.schema.names == ["a"]
    stream.close()


def test_pyarrows_json_block_grows_in_powers_of_two_past_the_longest_line(tmp_path):
    shard = _jsonl(tmp_path, ['{"a": 1}'])
    for longest, block in ((0, 8), ((8 << 20) - 1, 8), (8 << 20, 16), (20 << 20, 32), (40 << 20, 64)):
        shard.found.longest_line = longest
        assert readers.text.jsonl_block_bytes(shard) == block << 20


@pytest.mark.parametrize(
    ("lines", "before", "after", "found"),
    [
        (['{"x": "a"}', '{"x": 1}', '{"x": "b"}'], "number", "string", (3, 2)),  # a string before any number
        (['{"x": 1}', "", '{"x": "b"}'], "number", "string", (3, 1)),  # past a blank line
        (['{"m": 5}', '{"m": {"s": [1]}}', '{"m": {"s": true}}'], "array", "boolean", (3, 2)),
        (['{"x": [1]}', '{"x": 2}', '{"x": [2, "a"]}'], "number", "string", (3, 1)),  # a list's elements
        (['{"x": []}', '{"x": ["a", 1, "b"]}'], "number", "string", (2, 2)),  # within one line
        (['{"x": [{"y": 1}]}', '{"x": [{"z": "a"}]}'], "number", "string", None),  # another field
    ],
)
def test_the_line_where_a_column_changes_type(tmp_path, lines, before, after, found):
    path = ["m", "s"] if lines[0].startswith('{"m"') else ["x"]
    if "[" in lines[0]:
        path = ["x", "[]", "y"] if "y" in lines[0] else ["x", "[]"]
    assert readers.jsonl._type_change_line(_jsonl(tmp_path, lines), path, before, after) == found


def test_a_column_path_reads_as_its_fields_and_list_elements():
    assert readers.jsonl._path_text(["reward"]) == "reward"
    assert readers.jsonl._path_text(["meta", "score"]) == "meta.score"
    assert readers.jsonl._path_text(["mask", "[]", "[]"]) == "mask[][]"
    assert readers.jsonl._path_text(["m", "[]", "s", "[]"]) == "m[].s[]"


def test_json_kinds_are_pyarrows_words():
    values: list[object] = [None, True, 1, 1.5, "s", {}, []]
    assert [readers.jsonl._json_kind(v) for v in values] == [
        "null",
        "boolean",
        "number",
        "number",
        "string",
        "object",
        "array",
    ]


# --------------------------------------------------------------------------- Arrow batches


def test_small_arrow_batches_are_combined_to_about_the_batch_size():
    def batches(*sizes: int):
        return iter(pa.record_batch({"a": list(range(n)), "b": list(range(n))}) for n in sizes)

    def sizes(out):
        return [b.num_rows for b in out]

    assert sizes(readers.arrow_ipc._rebatched(batches(3, 3, 5, 1), None, 7)) == [11, 1]
    assert sizes(readers.arrow_ipc._rebatched(batches(3, 4, 2), None, 7)) == [7, 2]
    assert sizes(readers.arrow_ipc._rebatched(batches(9), None, 7)) == [9]
    # counting restarts at 0
    assert sizes(readers.arrow_ipc._rebatched(batches(3, 4, 3, 3, 1), None, 7)) == [7, 7]
    out = list(readers.arrow_ipc._rebatched(batches(2, 2), ["b"], 3))
    assert sizes(out) == [4] and out[0].schema.names == ["b"]


def test_an_arrow_files_batches_hold_the_columns_asked_for(tmp_path):
    import pyarrow.feather as feather

    path = tmp_path / "r.arrow"
    feather.write_feather(pa.table({"a": [1, 2, 3], "b": [4, 5, 6]}), path, compression="uncompressed")
    (batch,) = readers.iter_batches(shard_of(path, "arrow"), ["b"], 10)
    assert batch.schema.names == ["b"] and batch.column(0).to_pylist() == [4, 5, 6]


def test_a_scanned_stream_stops_only_once_its_bytes_reach_stop_after(tmp_path, monkeypatch):
    monkeypatch.setattr(readers.jsonl, "SCAN_CHUNK_BYTES", 10)
    text = "".join(json.dumps({"a": i}) + "\n" for i in range(100)).encode()
    shard = _jsonl(tmp_path, [line for line in text.decode().splitlines()])
    ends: list[int] = []
    source = io.BytesIO(text)  # each chunk: 10 bytes, then the rest of its line
    while chunk := source.read(10):
        chunk += source.readline()
        ends.append((ends[-1] if ends else 0) + len(chunk))
    for stop_after, expected in ((ends[3], ends[3]), (ends[3] + 1, ends[4])):
        scanner = readers.jsonl._ScannedJsonl(shard, stop_after=stop_after)
        assert len(scanner.read(-1)) == expected, stop_after
        scanner.close()


def test_the_nesting_scan_measures_each_line_and_reads_a_line_of_exactly_the_limit(tmp_path):
    """The longest line counts its newline (the first line too; a last line without one as if it
    had one); a line holding more brackets than the limit but nesting exactly 64 deep is read;
    a deep line is named by its number in the file (one line before the chunk here)."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"{}\n")
    shard = shard_of(path, "jsonl")
    assert readers.jsonl._scan_nesting(shard, b"abc\nde", 0) == 4
    assert readers.jsonl._scan_nesting(shard, b"a\nbcdefg", 0) == 7  # as if it ended in one
    assert readers.jsonl._scan_nesting(shard, b"abcdef\n", 0) == 7
    at_the_limit = b"[" * 64 + b"]" * 64 + b", [1]"
    assert readers.jsonl._scan_nesting(shard, b"{}\n" + at_the_limit + b"\n", 0) == len(at_the_limit) + 1
    with pytest.raises(GrpoError, match="line 4: a value nests 65 levels deep"):
        readers.jsonl._scan_nesting(shard, b"{}\n" + at_the_limit + b"\n" + b"[" * 65 + b"]" * 65, 1)
