"""A JSON-lines or CSV input is read from disk once per run: its hardening scans (nesting, exact
integers, type settling), its schema and its data come from one read, where the file and its
decoded rows fit the run's memory budget (or the file is small); a larger one streams from disk
in each pass, with the same results and the same errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

import grpo_cli.inputs.readers as readers
from tests.conftest import one_line_error, rollout_rows


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every open of a text file's bytes on disk, by file name."""
    seen: list[str] = []
    original = readers.text._open_file

    def counting(shard: Any) -> Any:
        seen.append(Path(shard.display).name)
        return original(shard)

    for module in _holders_of_open_file():
        monkeypatch.setattr(module, "_open_file", counting)
    return seen


def _holders_of_open_file() -> list[Any]:
    """Every readers module that calls ``_open_file`` by its own name (each imports it)."""
    import pkgutil

    names = [info.name for info in pkgutil.iter_modules(readers.__path__)]
    holders = [getattr(readers, name) for name in names if hasattr(getattr(readers, name), "_open_file")]
    assert {module.__name__.rsplit(".", 1)[1] for module in holders} >= {"text", "jsonl"}
    return holders


def write_inputs(tmp_path: Path) -> dict[str, Path]:
    rows = rollout_rows()
    text = "".join(json.dumps(r) + "\n" for r in rows)
    drifting = (
        text + json.dumps({**rows[0], "group_id": rows[0]["group_id"], "reward": 0.5, "extra": "late"}) + "\n"
    )
    paths = {
        "jsonl": tmp_path / "in.jsonl",
        "gz": tmp_path / "in.jsonl.gz",
        "drift": tmp_path / "drift.jsonl",
        "csv": tmp_path / "in.csv",
        "csv_gz": tmp_path / "in.csv.gz",
    }
    paths["jsonl"].write_text(text)
    paths["gz"].write_bytes(gzip.compress(text.encode()))
    paths["drift"].write_text(drifting)
    pa_csv.write_csv(pa.Table.from_pylist(rows), paths["csv"])
    paths["csv_gz"].write_bytes(gzip.compress(paths["csv"].read_bytes()))
    return paths


@pytest.mark.parametrize("kind", ["jsonl", "gz", "drift", "csv"])
def test_a_small_text_input_is_opened_once_per_run(
    kind: str, cli: Any, tmp_path: Path, opens: list[str]
) -> None:
    path = write_inputs(tmp_path)[kind]
    for command in (["check", path], ["compute", path, "-o", tmp_path / f"{kind}.parquet"]):
        opens.clear()
        result = cli(*command, "-q")
        assert result.exit_code == 0, result.stderr
        assert opens == [path.name], opens  # the scans, the schema, type settling and the data: one read


@pytest.mark.parametrize("kind", ["jsonl", "gz", "drift", "csv", "csv_gz"])
def test_read_from_memory_or_streamed_from_disk_the_output_is_the_same(
    kind: str, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opens: list[str]
) -> None:
    path = write_inputs(tmp_path)[kind]
    in_memory, streamed = tmp_path / "memory.parquet", tmp_path / "disk.parquet"
    assert cli("compute", path, "-o", in_memory, "-q").exit_code == 0
    monkeypatch.setattr(readers.text, "TEXT_IN_MEMORY_BYTES", 0)
    opens.clear()
    assert cli("compute", path, "-o", streamed, "-q", "--memory-limit-mb", "0").exit_code == 0
    assert len(opens) > 1 or kind.startswith("csv")  # each scan reads again (CSV streams through pyarrow)
    assert pq.read_table(streamed).equals(pq.read_table(in_memory))


@pytest.mark.parametrize("limit", [None, 0])
def test_a_broken_gzip_stream_is_one_line_either_way(
    limit: int | None, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = [] if limit is None else ["--memory-limit-mb", str(limit)]
    source = tmp_path / "in.jsonl.gz"
    source.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rollout_rows()).encode())[:-20])
    monkeypatch.setattr(
        readers.text, "TEXT_IN_MEMORY_BYTES", 0 if limit is not None else readers.text.TEXT_IN_MEMORY_BYTES
    )
    one_line_error(cli("compute", source, "-o", tmp_path / "o.parquet", *streams), 2, "gzip")
    assert not (tmp_path / "o.parquet").exists()


def test_a_file_past_the_limit_is_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_cli.inputs.sources import InputSet

    path = write_inputs(tmp_path)["jsonl"]
    monkeypatch.setattr(readers.text, "TEXT_IN_MEMORY_BYTES", path.stat().st_size - 1)
    with InputSet([str(path)]) as inputs:
        assert readers.text._contents(inputs.shards[0]) is None
        assert inputs.shards[0].found.contents is None
    monkeypatch.setattr(readers.text, "TEXT_IN_MEMORY_BYTES", path.stat().st_size)
    with InputSet([str(path)]) as inputs:
        assert readers.text._contents(inputs.shards[0]) == path.read_bytes()


@pytest.mark.parametrize("kind", ["jsonl", "gz", "csv"])
def test_a_text_input_past_the_small_file_limit_is_read_once_where_the_run_fits_its_budget(
    kind: str, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opens: list[str]
) -> None:
    """A 116 MiB JSON-lines file was read four times (the nesting scan, the schema, the exact-integer
    scan, the data): its bytes and its decoded rows fit the default 1 GiB budget, so it is now held
    as a small file is; with a budget too small for both it streams, in bounded memory."""
    path = write_inputs(tmp_path)[kind]
    monkeypatch.setattr(readers.text, "TEXT_IN_MEMORY_BYTES", 0)  # every file is past the small-file limit
    held, streamed = tmp_path / "held.parquet", tmp_path / "streamed.parquet"
    opens.clear()
    assert cli("compute", path, "-o", held, "-q").exit_code == 0
    assert opens == [path.name], opens
    opens.clear()
    assert cli("compute", path, "-o", streamed, "-q", "--memory-limit-mb", "0").exit_code == 0
    assert len(opens) > 1 or kind == "csv", opens
    assert pq.read_table(streamed).equals(pq.read_table(held))


def test_hold_text_within_counts_the_text_and_every_shards_rows(tmp_path: Path) -> None:
    from grpo_cli.inputs.sources import InputSet

    paths = write_inputs(tmp_path)
    with InputSet([str(paths["jsonl"]), str(paths["gz"])]) as inputs:
        plain, compressed = inputs.shards
        need = (plain.size_bytes + 6 * compressed.size_bytes) + (
            2 * plain.size_bytes + 6 * compressed.size_bytes
        )
        readers.hold_text_within(inputs.shards, need - 1)
        assert plain.found.hold_up_to == compressed.found.hold_up_to == 0
        readers.hold_text_within(inputs.shards, need)
        assert plain.found.hold_up_to == compressed.found.hold_up_to == need


# --------------------------------------------------------------------------- a file past the budget


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Small scan chunks and read blocks, no file held in memory: a test file of a few hundred KiB
    streams as a file of gigabytes does. The options that keep the run from holding it."""
    monkeypatch.setattr(readers.text, "TEXT_IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(readers.jsonl, "SCAN_CHUNK_BYTES", 4096)
    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 16384)
    return ["--memory-limit-mb", "0"]


def _lines(tmp_path: Path, rows: list[dict[str, Any]], name: str = "big.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"group_id": i // 4, "reward": float(i % 3 == 0), "text": "t" * 40} for i in range(n)]


def test_a_streamed_file_is_read_once_per_pass(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streamed: list[str]
) -> None:
    """Past the budget, the nesting scan and the exact-integer scan run on the lines as pyarrow reads
    them (4.00 bytes read per byte of a 116 MiB file for check, now 1.21): here, the file once per
    pass and the schema's first block. pyarrow reads blocks ahead on its own threads, as many as
    time allows: the schema's read ends its stream past the first block, or this count would
    depend on the machine's load."""
    path = _lines(tmp_path, _rows(20_000))
    read: list[int] = []
    original = readers.text._open_file

    class Counting:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def read(self, size: int = -1) -> bytes:
            data: bytes = self.handle.read(size)
            read.append(len(data))
            return data

        def readline(self) -> bytes:
            data: bytes = self.handle.readline()
            read.append(len(data))
            return data

        def __iter__(self) -> Any:
            for line in self.handle:
                read.append(len(line))
                yield line

    import contextlib

    @contextlib.contextmanager
    def counting(shard: Any) -> Any:
        with original(shard) as handle:
            yield Counting(handle)

    for module in _holders_of_open_file():
        monkeypatch.setattr(module, "_open_file", counting)
    size = path.stat().st_size
    for command, passes in ((["check", path], 1), (["compute", path, "-o", tmp_path / "o.parquet"], 2)):
        read.clear()
        result = cli(*command, "-q", *streamed)
        assert result.exit_code == 0, result.stderr
        # the schema's read: pyarrow's first block, to the end of the scan chunk it ends in
        slack = readers.text.JSONL_BLOCK_BYTES + readers.jsonl.SCAN_CHUNK_BYTES + 200
        assert sum(read) <= passes * size + slack, (sum(read), size)


def test_a_streamed_file_gives_the_held_files_bits(cli: Any, tmp_path: Path, streamed: list[str]) -> None:
    path = _lines(tmp_path, _rows(5_000))
    assert cli("compute", path, "-o", tmp_path / "held.parquet", "-q").exit_code == 0
    assert cli("compute", path, "-o", tmp_path / "streamed.parquet", "-q", *streamed).exit_code == 0
    assert pq.read_table(tmp_path / "streamed.parquet").equals(pq.read_table(tmp_path / "held.parquet"))


def test_a_streamed_line_nested_too_deep_is_refused_before_pyarrow_parses_it(
    cli: Any, tmp_path: Path, streamed: list[str]
) -> None:
    rows = _rows(3_000)
    path = tmp_path / "deep.jsonl"
    deep = '{"group_id": 1, "reward": 1.0, "text": ' + "[" * 20_000 + "]" * 20_000 + "}"
    lines = [json.dumps(row) for row in rows]
    path.write_text("\n".join([*lines[:2_500], deep, *lines[2_500:]]) + "\n")
    for command in (["check", path], ["compute", path, "-o", tmp_path / "o.parquet"]):
        one_line_error(cli(*command, *streamed), 2, "deep.jsonl, line 2501: a value nests 20,001 levels deep")
    assert not (tmp_path / "o.parquet").exists()


def test_a_streamed_integer_a_float_column_would_round_is_refused_on_its_line(
    cli: Any, tmp_path: Path, streamed: list[str]
) -> None:
    rows = _rows(3_000)
    rows[2_800]["reward"] = 2**53 + 1  # the column is float: 2**53 + 1 would become 2**53
    path = _lines(tmp_path, rows)
    one_line_error(
        cli("check", path, *streamed),
        2,
        "big.jsonl, line 2801: the integer 9007199254740993 in column 'reward' cannot be kept exactly",
    )


def test_a_streamed_line_longer_than_the_read_block_is_read_with_a_larger_block(
    cli: Any, tmp_path: Path, streamed: list[str]
) -> None:
    """pyarrow refuses a line longer than its block ('straddling object'): the scan notes the
    line's length and the run reads the file again with a block that holds it."""
    rows = _rows(2_000)
    rows[1_500]["text"] = "x" * 100_000  # past the 16 KiB block and the 4 KiB scan chunk
    path = _lines(tmp_path, rows, "long.jsonl")
    assert cli("compute", path, "-o", tmp_path / "held.parquet", "-q").exit_code == 0
    result = cli("compute", path, "-o", tmp_path / "streamed.parquet", "-q", *streamed)
    assert result.exit_code == 0, result.stderr
    assert pq.read_table(tmp_path / "streamed.parquet").equals(pq.read_table(tmp_path / "held.parquet"))
