"""Spliced Parquet output: the input's bytes kept, new columns appended, read back by three readers.

Every spliced output here is read with pyarrow, polars (an independent Rust reader) and
duckdb (a third, C++ reader of its own), and compared with the re-encoded (``--rewrite``)
output of the same run. The input file is never modified.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from thrift.Thrift import TType

from grpo_cli.file_names import PROVENANCE_KEY
from grpo_cli.jobs import compute_dataset
from grpo_cli.options.config import ComputeConfig
from grpo_cli.outputs.splice import Field, read_footer, read_struct, write_struct
from tests.conftest import digest, run_python

CONFIG = ComputeConfig(group_cols=("uid",))


def rollouts(rows: int, *, seed: int = 0, group_size: int = 4) -> pa.Table:
    rng = np.random.default_rng(seed)
    groups = np.arange(rows) // group_size
    return pa.table(
        {
            "uid": pa.array([f"p{g}" for g in groups]),
            "reward": (rng.random(rows) < 0.5).astype(np.float64),
            "completion": pa.array(["x" * int(n) for n in rng.integers(0, 40, rows)]),
            "n_tokens": rng.integers(1, 500, rows),
            "meta": pa.array([{"step": int(g % 3), "tags": ["a", "b"][: int(g % 3)]} for g in groups]),
            "scores": pa.array(
                [[("format", 0.5), ("answer", float(r))] for r in range(rows)],
                type=pa.map_(pa.string(), pa.float64()),
            ),
            "source": pa.array(np.array(["gsm8k", "math"])[groups % 2]).dictionary_encode(),
        }
    )


def spliced_and_rewritten(tmp_path: Path, source: Path, config: ComputeConfig = CONFIG) -> tuple[Path, Path]:
    before = digest(source)
    spliced, rewritten = tmp_path / "spliced.parquet", tmp_path / "rewritten.parquet"
    summary = compute_dataset(source, spliced, config)
    assert summary.output is not None and summary.output["method"] == "splice", summary.output
    summary = compute_dataset(source, rewritten, ComputeConfig(**{**config.__dict__, "rewrite": True}))
    assert summary.output is not None and summary.output["method"] == "rewrite"
    assert digest(source) == before, "the input was modified"
    return spliced, rewritten


def duckdb_rows(query: str) -> list[Any]:
    return duckdb.execute(query).fetchall()


def assert_three_readers_agree(spliced: Path, rewritten: Path, source: Path) -> None:
    expected = pq.read_table(rewritten)
    got = pq.read_table(spliced)
    assert got.schema.remove_metadata() == expected.schema.remove_metadata()
    assert got.equals(expected), "pyarrow reads different data"
    assert json.loads(got.schema.metadata[PROVENANCE_KEY]) == json.loads(
        expected.schema.metadata[PROVENANCE_KEY]
    )
    polars_got, polars_expected = pl.read_parquet(spliced), pl.read_parquet(rewritten)
    assert polars_got.equals(polars_expected), "polars reads different data"
    for column in ("advantage", "group_active"):
        query = f"select {column} from read_parquet('{{}}')"
        assert duckdb_rows(query.format(spliced)) == duckdb_rows(query.format(rewritten))
    count = "select count(*) from read_parquet('{}')"
    assert duckdb_rows(count.format(spliced)) == duckdb_rows(count.format(source))
    # The input's bytes come first, unchanged: its column chunks did not move.
    prefix = read_footer(source.open("rb")).start
    assert spliced.read_bytes()[:prefix] == source.read_bytes()[:prefix]


WRITERS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "page-index-stats-v2-zstd": {
        "write_page_index": True,
        "data_page_version": "2.0",
        "compression": "zstd",
        "write_statistics": True,
    },
    "plain-gzip-no-dictionary": {"use_dictionary": False, "compression": "gzip"},
    "uncompressed-small-row-groups": {"compression": "none", "row_group_size": 7},
    "bloom-filters": {"bloom_filter_options": {"uid": True}}
    if "bloom_filter_options" in pq.write_table.__doc__
    else {},
}


@pytest.mark.parametrize("options", list(WRITERS.values()), ids=list(WRITERS))
def test_pyarrow_written_inputs(tmp_path: Path, options: dict[str, Any]) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(rollouts(103), source, **{"row_group_size": 40, **options})
    spliced, rewritten = spliced_and_rewritten(tmp_path, source)
    assert_three_readers_agree(spliced, rewritten, source)
    meta = pq.read_metadata(spliced)
    assert meta.num_row_groups == pq.read_metadata(source).num_row_groups
    index = meta.schema.to_arrow_schema().get_field_index("advantage")
    assert meta.row_group(0).column(index).statistics.has_min_max
    source_meta = pq.read_metadata(source)
    for group in range(meta.num_row_groups):
        old, new = source_meta.row_group(group), meta.row_group(group)
        added = [new.column(c) for c in range(old.num_columns, new.num_columns)]
        assert new.total_byte_size - old.total_byte_size == sum(c.total_uncompressed_size for c in added)
        assert new.num_rows == old.num_rows


def test_polars_and_duckdb_written_inputs(tmp_path: Path) -> None:
    table = rollouts(64).drop_columns(["scores"])
    by_polars = tmp_path / "polars.parquet"
    pl.from_arrow(table).write_parquet(by_polars, row_group_size=20)  # type: ignore[union-attr]
    by_duckdb = tmp_path / "duckdb.parquet"
    arrow_table = table  # noqa: F841 (read by duckdb's replacement scan)
    duckdb.sql(f"copy (select * from arrow_table) to '{by_duckdb}' (format parquet, row_group_size 16)")
    for source in (by_polars, by_duckdb):
        folder = tmp_path / source.stem
        folder.mkdir()
        spliced, rewritten = spliced_and_rewritten(folder, source)
        assert_three_readers_agree(spliced, rewritten, source)


def test_unknown_footer_fields_pass_through(tmp_path: Path) -> None:
    """Fields of a newer format version (here an invented field 63) are kept byte for byte."""
    source = tmp_path / "in.parquet"
    pq.write_table(rollouts(40), source, row_group_size=16)
    with source.open("rb") as handle:
        footer = read_footer(handle)
    future = Field(63, TType.STRING, b"\x05hello")  # a binary field no reader here knows
    body = source.read_bytes()[: footer.start]
    encoded = write_struct([*footer.fields, future])
    source.write_bytes(body + encoded + len(encoded).to_bytes(4, "little") + b"PAR1")
    spliced = tmp_path / "out.parquet"
    compute_dataset(source, spliced, CONFIG)
    with spliced.open("rb") as handle:
        fields = read_footer(handle).fields
    assert [f for f in fields if f.fid == 63] == [future]
    assert pq.read_table(spliced).num_rows == 40


def test_a_directory_of_shards_gives_a_directory_of_spliced_shards(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    table = rollouts(96)
    for i in range(3):
        pq.write_table(table.slice(32 * i, 32), shards / f"part-{i}.parquet", row_group_size=10)
    out = tmp_path / "out"
    summary = compute_dataset(shards, out, CONFIG)
    assert summary.output is not None
    assert summary.output["method"] == "splice" and summary.output["shards_by_method"] == {"splice": 3}
    whole = tmp_path / "whole.parquet"
    pq.write_table(table, whole)
    expected = pq.read_table(compute_dataset(whole, tmp_path / "w.parquet", CONFIG).output["path"])  # type: ignore[index]
    got = pl.read_parquet(out / "*.parquet")
    assert got["advantage"].to_list() == expected.column("advantage").to_pylist()


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ({"drop_inactive": True}, "rows are filtered, so every column is re-encoded"),
        ({"keep_mean_range": (0.1, 0.9)}, "rows are filtered, so every column is re-encoded"),
        ({"rewrite": True}, "--rewrite re-encodes every column"),
    ],
)
def test_row_filters_and_rewrite_take_the_rewrite_path(
    tmp_path: Path, setting: dict[str, Any], reason: str
) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(rollouts(40), source)
    summary = compute_dataset(source, tmp_path / "o.parquet", ComputeConfig(**{**CONFIG.__dict__, **setting}))
    assert summary.output is not None and summary.output["method"] == "rewrite"
    assert summary.output["rewrite_reason"] == f"{source}: {reason}"


def test_jsonl_input_and_several_shards_into_one_file_are_rewritten(tmp_path: Path) -> None:
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"uid": "a", "reward": r}) + "\n" for r in (0.0, 1.0)))
    summary = compute_dataset(jsonl, tmp_path / "j.parquet", CONFIG)
    assert summary.output is not None
    assert summary.output["rewrite_reason"] == f"{jsonl}: only Parquet input can be spliced"
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(rollouts(8), mixed / "day1.parquet")
    (mixed / "day2.jsonl").write_text(jsonl.read_text())
    summary = compute_dataset([mixed / "day1.parquet", mixed / "day2.jsonl"], tmp_path / "mixed_out", CONFIG)
    assert summary.output is not None
    assert summary.output["rewrite_reason"] == (
        f"{mixed / 'day1.parquet'}: {mixed / 'day2.jsonl'} is jsonl input, and a run is spliced only when "
        "every input is Parquet"
    )
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(2):
        pq.write_table(rollouts(8, seed=i), shards / f"p{i}.parquet")
    summary = compute_dataset(shards, tmp_path / "one.parquet", CONFIG)
    assert summary.output is not None
    assert summary.output["rewrite_reason"] == (
        f"{shards / 'p0.parquet'}: several input shards into one file are re-encoded "
        "(write to a directory to splice)"
    )


def test_parquet_on_standard_input_is_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import sys

    data = io.BytesIO()
    pq.write_table(rollouts(8), data)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data.getvalue())))
    summary = compute_dataset("-", tmp_path / "o.parquet", CONFIG)
    assert summary.output is not None and summary.output["method"] == "rewrite"
    assert (
        summary.output["rewrite_reason"]
        == "<stdin>: standard input is re-encoded (only Parquet files are spliced)"
    )


def test_empty_row_group_falls_back_to_rewrite(tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    table = rollouts(12)
    with pq.ParquetWriter(source, table.schema) as writer:
        writer.write_table(table.slice(0, 8))
        writer.write_table(table.slice(8, 0))
        writer.write_table(table.slice(8))
    if pq.read_metadata(source).num_row_groups < 3:
        pytest.skip("this pyarrow does not write empty row groups")
    summary = compute_dataset(source, tmp_path / "o.parquet", CONFIG)
    assert summary.output is not None and summary.output["method"] == "rewrite"
    assert "empty row group" in summary.output["rewrite_reason"]
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 12


def test_a_failed_splice_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_cli.outputs import splice

    source = tmp_path / "in.parquet"
    pq.write_table(rollouts(40), source, row_group_size=10)
    before = digest(source)

    def broken(self: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(splice.SplicedFile, "close", broken)
    from grpo_cli.errors import GrpoError

    with pytest.raises(GrpoError, match="No space left on device"):
        compute_dataset(source, tmp_path / "out.parquet", CONFIG)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]
    assert digest(source) == before


def test_struct_fields_round_trip_raw() -> None:
    fields = [
        Field(1, TType.I32, b"\x04"),
        Field(2, TType.BOOL, True),
        Field(4, TType.STRING, b"\x02ab"),
        Field(40, TType.BOOL, False),
        Field(41, TType.LIST, b"\x15\x02"),
    ]
    assert read_struct(write_struct(fields)) == fields


column_types = st.sampled_from(
    [
        pa.int32(),
        pa.float32(),
        pa.string(),
        pa.bool_(),
        pa.list_(pa.int64()),
        pa.struct([("a", pa.int16()), ("b", pa.string())]),
        pa.timestamp("us"),
    ]
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    types=st.lists(column_types, min_size=0, max_size=4),
    rows=st.integers(min_value=1, max_value=60),
    row_group_size=st.integers(min_value=1, max_value=64),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_random_schemas_and_row_group_layouts(
    tmp_path_factory: pytest.TempPathFactory,
    types: list[pa.DataType],
    rows: int,
    row_group_size: int,
    seed: int,
) -> None:
    tmp_path = tmp_path_factory.mktemp("random")
    rng = np.random.default_rng(seed)
    columns: dict[str, Any] = {
        "uid": pa.array([f"g{i}" for i in rng.integers(0, max(rows // 3, 1), rows)]),
        "reward": rng.random(rows),
    }
    for i, data_type in enumerate(types):
        arrays = pa.array([None] * rows, type=data_type) if i % 2 else pa.nulls(rows, data_type)
        columns[f"c{i}"] = arrays
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table(columns), source, row_group_size=row_group_size)
    spliced, rewritten = spliced_and_rewritten(tmp_path, source)
    assert_three_readers_agree(spliced, rewritten, source)


@pytest.mark.parametrize("kernel", ["refuses", "absent", "stops-half-way"])
def test_copy_falls_back_to_user_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    import os

    from grpo_cli.outputs import splice

    source = tmp_path / "in.bin"
    source.write_bytes(bytes(range(256)) * 1000)
    real = getattr(os, "copy_file_range", None)

    def half_then_refuse(src: int, dst: int, count: int, offset_src: int, offset_dst: int) -> int:
        if offset_src:
            raise OSError(18, "Invalid cross-device link")
        assert real is not None
        return int(real(src, dst, count // 2, offset_src, offset_dst))

    def refuse(*args: Any) -> int:
        raise OSError(38, "Function not implemented")

    if kernel == "absent":
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    else:
        monkeypatch.setattr(
            os, "copy_file_range", refuse if kernel == "refuses" else half_then_refuse, raising=False
        )
    with source.open("rb") as src, (tmp_path / "out.bin").open("wb") as dst:
        splice.copy_range(src, dst, 200_001)
        assert dst.tell() == 200_001
    assert (tmp_path / "out.bin").read_bytes() == source.read_bytes()[:200_001]


# --------------------------------------------------------------------------- the early copy


def test_job_modules_do_not_import_torch() -> None:
    """The spliced bytes are copied while torch is imported: nothing before the engine may need it."""

    code = (
        "import sys, grpo_cli.jobs, grpo_cli.outputs.output, grpo_cli.options.config, grpo_cli.cli; "
        "print('torch' in sys.modules)"
    )
    result = run_python(code, check=True)
    assert result.stdout.strip() == "False"


REWARD_KINDS = {
    "float64": lambda rng, n: pa.array((rng.random(n) < 0.5).astype(np.float64)),
    "int64": lambda rng, n: pa.array(rng.integers(0, 2, n)),
    "bool": lambda rng, n: pa.array(rng.random(n) < 0.5),
    "float32 with nulls": lambda rng, n: pa.array(
        rng.random(n).astype(np.float32), mask=np.arange(n) % 97 == 5, type=pa.float32()
    ),
    "int64 with nulls": lambda rng, n: pa.array(rng.integers(0, 2, n), mask=np.arange(n) % 89 == 3),
}


@pytest.mark.parametrize("command", ["compute", "check"])
@pytest.mark.parametrize("kind", REWARD_KINDS)
def test_a_run_imports_neither_pandas_nor_polars(tmp_path: Path, command: str, kind: str) -> None:
    """Each costs a quarter of a second of start-up: pyarrow imports pandas (where it is
    installed) for ``pa.array``, ``pa.scalar``, ``to_numpy`` and a Python number handed to a
    compute function, and hashing keys imports polars (not needed for few keys). The sample's
    reward column is an int64, so every reward type a file may hold is run, both commands."""

    rng = np.random.default_rng(0)
    table = rollouts(4000).set_column(1, "reward", REWARD_KINDS[kind](rng, 4000))
    source = tmp_path / "in.parquet"
    pq.write_table(table, source, row_group_size=1000)
    out = tmp_path / "out.parquet"
    arguments = [str(source), "-g", "uid", "--nan", "ignore", "-q"]
    arguments += ["-o", str(out)] if command == "compute" else ["--min-groups", "1"]
    code = (
        "import sys; from grpo_cli.cli import app\n"
        f"try: app([{command!r}, *{arguments!r}])\n"
        "except SystemExit as done: assert done.code in (0, None), done.code\n"
        "print(sorted(m for m in ('pandas', 'polars') if m in sys.modules))"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_the_prefix_is_copied_before_the_engine_runs(tmp_path: Path) -> None:
    from grpo_cli.inputs.sources import InputSet
    from grpo_cli.outputs.guard import WriteGuard
    from grpo_cli.outputs.output import open_output

    source = tmp_path / "in.parquet"
    pq.write_table(rollouts(40), source, row_group_size=10)
    footer_start = read_footer(source.open("rb")).start
    with InputSet([str(source)]) as inputs, WriteGuard(inputs.protected()) as guard:
        claim = guard.claim(tmp_path / "out.parquet", directory=False, force=False)
        target = open_output(claim, CONFIG, inputs.shards)
        target._copier.finish()
        copied = claim.temp_path().read_bytes()
        assert copied == source.read_bytes()[:footer_start]
        target.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


def test_discarding_a_target_closes_its_opened_splices(tmp_path: Path) -> None:
    from grpo_cli.inputs.sources import InputSet
    from grpo_cli.outputs.guard import WriteGuard
    from grpo_cli.outputs.output import open_output

    source = tmp_path / "in.parquet"
    pq.write_table(rollouts(40), source, row_group_size=10)
    schema = pq.read_schema(source).append(pa.field("advantage", pa.float64()))
    schema = schema.append(pa.field("group_active", pa.bool_()))
    with InputSet([str(source)]) as inputs, WriteGuard(inputs.protected()) as guard:
        claim = guard.claim(tmp_path / "out.parquet", directory=False, force=False)
        target = open_output(claim, CONFIG, inputs.shards)
        writer = target.open_spliced(inputs.shards[0], schema, 2)
        assert writer is not None
        target.discard()  # the run failed before the writer was closed
        assert writer._handle.closed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


def test_a_failing_prefix_flush_is_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from grpo_cli.errors import GrpoError

    source = tmp_path / "in.parquet"
    pq.write_table(rollouts(40), source, row_group_size=10)
    before = digest(source)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", full, raising=False)
    with pytest.raises(GrpoError, match=r"out\.parquet: cannot write the output \(No space left on device\)"):
        compute_dataset(source, tmp_path / "out.parquet", CONFIG)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]
    assert digest(source) == before


def test_bad_input_stops_the_copy_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reward column of text is found after the copies started: they stop at the next piece.
    (A missing column is refused from the footers before any copy starts.)"""
    from grpo_cli.errors import GrpoError
    from grpo_cli.outputs import splice

    monkeypatch.setattr(splice, "COPY_PIECE_BYTES", 1024)
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        pq.write_table(rollouts(400, seed=i), shards / f"p{i}.parquet", row_group_size=100)
    pieces: list[int] = []
    real = splice.copy_range

    def held_at_the_second_piece(*args: Any, cancelled: Any, **kwargs: Any) -> None:
        def asked() -> bool:
            pieces.append(1)
            deadline = time.monotonic() + 5
            while len(pieces) == 2 and not cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            return bool(cancelled())

        real(*args, cancelled=asked, **kwargs)

    monkeypatch.setattr(splice, "copy_range", held_at_the_second_piece)
    with pytest.raises(GrpoError, match="reward column 'completion' has type string"):
        compute_dataset(shards, tmp_path / "out", ComputeConfig(group_cols=("uid",), rewards=("completion",)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]
    # Held at the second piece of the first file; then each of the other two stops at its first.
    assert len(pieces) == 4, f"the copy went on for {len(pieces)} pieces after the run failed"


def test_a_run_that_settles_a_type_starts_on_a_fresh_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that restarts (a JSON lines column whose type settles late) writes to a fresh target."""
    from grpo_cli.inputs import readers

    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 1024)
    jsonl = tmp_path / "in.jsonl"
    records = [{"uid": f"g{i // 2}", "reward": float(i % 2), "extra": 1} for i in range(3000)]
    records[-1]["extra"] = 1.5
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "out.parquet").write_bytes(b"an earlier output, replaced with --force")
    config = ComputeConfig(group_cols=("uid",), compression="zstd")
    summary = compute_dataset(jsonl, tmp_path / "out.parquet", config, force=True)
    assert summary.output is not None and summary.output["method"] == "rewrite"
    assert pq.read_table(tmp_path / "out.parquet").column("extra")[-1].as_py() == 1.5
    assert pq.read_metadata(tmp_path / "out.parquet").row_group(0).column(0).compression == "ZSTD"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.parquet"]


def test_a_directory_of_spliced_and_rewritten_shards_says_mixed(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    table = rollouts(16)
    pq.write_table(table.slice(0, 8), shards / "a.parquet")
    with pq.ParquetWriter(shards / "b.parquet", table.schema) as writer:
        writer.write_table(table.slice(8, 4))
        writer.write_table(table.slice(12, 0))
        writer.write_table(table.slice(12))
    if pq.read_metadata(shards / "b.parquet").num_row_groups < 3:
        pytest.skip("this pyarrow does not write empty row groups")
    summary = compute_dataset(shards, tmp_path / "out", CONFIG)
    assert summary.output is not None
    assert summary.output["method"] == "mixed"
    assert summary.output["shards_by_method"] == {"rewrite": 1, "splice": 1}


def test_spliced_columns_use_the_compression_asked_for(tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(rollouts(40), source, compression="snappy")
    out = tmp_path / "out.parquet"
    summary = compute_dataset(source, out, ComputeConfig(group_cols=("uid",), compression="zstd"))
    assert summary.output is not None and summary.output["method"] == "splice"
    group = pq.read_metadata(out).row_group(0)
    codecs = {group.column(i).path_in_schema: group.column(i).compression for i in range(group.num_columns)}
    assert codecs["advantage"] == codecs["group_active"] == "ZSTD"
    assert codecs["reward"] == "SNAPPY"  # the input's chunks, copied as they were


def test_a_slow_prefix_copy_is_waited_for_at_commit_not_cancelled(tmp_path: Path, monkeypatch) -> None:
    """The commit waits for every copy: the writes that need a prefix may still be queued."""
    from grpo_cli.outputs.splice import SplicedFile

    source = tmp_path / "in.parquet"
    pq.write_table(rollouts(40), source, row_group_size=40)
    compute_dataset(str(source), str(tmp_path / "expected.parquet"), CONFIG)
    copy_prefix = SplicedFile.copy_prefix

    def slow_copy_prefix(self, **kwargs):
        time.sleep(0.5)  # the run reaches its commit before the copy begins
        copy_prefix(self, **kwargs)

    monkeypatch.setattr(SplicedFile, "copy_prefix", slow_copy_prefix)
    summary = compute_dataset(str(source), str(tmp_path / "out.parquet"), CONFIG)
    assert summary.output is not None and summary.output["method"] == "splice"
    assert pq.read_table(tmp_path / "out.parquet").equals(pq.read_table(tmp_path / "expected.parquet"))


def test_rewrite_keeps_int96_timestamps(cli: Any, tmp_path: Path) -> None:
    """Impala's and Spark's INT96 timestamps came back as INT64 nanosecond timestamps
    (duckdb: TIMESTAMP became TIMESTAMP_NS)."""
    import datetime

    table = pa.table(
        {
            "group_id": [0, 0, 1, 1],
            "reward": [1.0, 0.0, 1.0, 1.0],
            "ts": pa.array([datetime.datetime(2026, 1, 1, 12, 30)] * 4, pa.timestamp("ns")),
        }
    )
    source = tmp_path / "int96.parquet"
    pq.write_table(table, source, use_deprecated_int96_timestamps=True)
    for args in (["--rewrite"], ["--drop-inactive"]):
        out = tmp_path / f"out{len(args[0])}.parquet"
        assert cli("compute", source, "-o", out, "-q", *args).exit_code == 0
        physical = {c.name: c.physical_type for c in pq.read_metadata(out).schema}
        assert physical["ts"] == "INT96"
        assert duckdb_rows(f"describe select ts from '{out}'")[0][1] == "TIMESTAMP"
        assert pq.read_table(out).column("ts").to_pylist()[0] == datetime.datetime(2026, 1, 1, 12, 30)


PARQUET_TESTING = ("apache/parquet-testing", "1a2a75127be06fc0123f03ebd36c966f7beda27d")


REENCODED_DIFFERENTLY = {
    # its embedded Arrow schema gives the timestamps a time zone that its Parquet types do not
    # (isAdjustedToUTC=false); pyarrow reads, and so writes, what the Arrow schema says
    "data/nested_structs.rust.parquet",
}


def _duckdb_types(path: Path) -> list[Any] | None:
    try:
        return [row[:2] for row in duckdb_rows(f"describe select * from '{path}'")]
    except duckdb.Error:
        return None  # a file duckdb does not read: nothing to compare


def test_reencoding_keeps_or_refuses_every_parquet_type_of_other_writers(tmp_path: Path) -> None:
    """Over apache/parquet-testing's files (parquet-mr, Impala, Spark, arrow-rs), read from a local
    mirror (skips without one): a file is refused for re-encoding exactly when it holds a
    GEOMETRY, GEOGRAPHY or VARIANT column, and one re-encoded keeps every column's type as pyarrow
    and duckdb see it (INT96 timestamps included; a decimal's physical storage and a list's inner
    names may differ, as they do between writers)."""
    import subprocess

    from grpo_cli.inputs.sources import Shard
    from grpo_cli.outputs.output import _parquet_writer, reencoding_refusal
    from tests.trainer_source import source

    source(PARQUET_TESTING, "README.md")  # skips where no mirror is present
    git = ["git", "--git-dir", "/work/.mirror/apache+parquet-testing/repo"]
    names = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", PARQUET_TESTING[1]], capture_output=True, text=True
    )
    checked = refused = 0
    for name in names.stdout.split():
        if not name.endswith(".parquet"):
            continue
        data = subprocess.run([*git, "show", f"{PARQUET_TESTING[1]}:{name}"], capture_output=True).stdout
        path = tmp_path / name.replace("/", "_")
        path.write_bytes(data)
        try:
            table = pq.read_table(path)
            before = str(pq.read_metadata(path).schema)
        except Exception:
            continue  # encrypted, corrupt on purpose, or a type pyarrow does not read
        refusal, int96 = reencoding_refusal(Shard(path, name, "parquet", len(data)))
        special = any(f"({kind}" in before for kind in ("Geometry", "Geography", "Variant"))
        assert (refusal is not None) == special, (name, refusal)
        if refusal is not None:
            refused += 1
            continue
        out = tmp_path / "out.parquet"
        writer = _parquet_writer(out, table.schema, 0, "snappy", int96)
        writer.write_table(table)
        writer.close()
        seen_before = _duckdb_types(path)
        same = pq.read_schema(out).equals(pq.read_schema(path), check_metadata=False) and (
            seen_before is None or _duckdb_types(out) == seen_before
        )
        assert same or name in REENCODED_DIFFERENTLY, name
        assert not same or name not in REENCODED_DIFFERENTLY, f"{name} is re-encoded alike now"
        checked += 1
    assert checked > 20 and refused >= 3
