"""sources.py at its own level: INPUT to shards, schemas, batches, row descriptions."""

from __future__ import annotations

import gzip
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.errors import GrpoError
from grpo_cli.inputs import readers
from grpo_cli.inputs.readers import describe_row, estimated_memory_bytes, iter_batches, read_schema, row_count
from grpo_cli.inputs.readers.jsonl import unify_jsonl_schema
from grpo_cli.inputs.sources import InputSet, detect_format
from grpo_cli.options.config import ComputeConfig
from tests.conftest import write_jsonl, write_parquet

ROWS = [{"group_id": i // 2, "reward": float(i % 3)} for i in range(10)]


@pytest.mark.parametrize(
    ("name", "override", "expected"),
    [
        ("a.parquet", None, "parquet"),
        ("A.PQ", None, "parquet"),
        ("a.jsonl", None, "jsonl"),
        ("a.ndjson.gz", None, "jsonl"),
        ("a.json", None, "json"),
        ("a.csv.gz", None, "csv"),
        ("a.jsonl.zst", None, "jsonl"),
        ("a.feather", None, "arrow"),
        ("a.txt", None, None),
        ("a.txt", "jsonl", "jsonl"),
    ],
)
def test_detect_format(name, override, expected):
    assert detect_format(name, override) == expected


def test_a_file_is_one_shard(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", ROWS)
    with InputSet(str(path)) as inputs:
        (shard,) = inputs.shards
        assert (shard.format, shard.display, shard.size_bytes) == ("parquet", str(path), path.stat().st_size)
        assert inputs.total_bytes == path.stat().st_size
        assert not inputs.is_stdin


def test_a_directory_is_its_data_files_in_name_order(tmp_path):
    for shift, name in enumerate(("b.parquet", "a.parquet")):
        write_parquet(tmp_path / name, ROWS[shift:])
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".hidden.parquet").write_text("not read")
    (tmp_path / "README.txt").write_text("not data")
    with InputSet(str(tmp_path)) as inputs:
        assert [s.path.name for s in inputs.shards] == ["a.parquet", "b.parquet"]
        assert inputs.directories == [tmp_path]
        assert inputs.protected().conflict(tmp_path / "a.parquet") is not None


def test_a_glob_matches_files(tmp_path):
    for shift, name in enumerate(("x1.jsonl", "x2.jsonl", "y.jsonl")):
        write_jsonl(tmp_path / name, ROWS[shift:])
    with InputSet(str(tmp_path / "x*.jsonl")) as inputs:
        assert [s.path.name for s in inputs.shards] == ["x1.jsonl", "x2.jsonl"]
    with pytest.raises(GrpoError, match="the pattern matches no file of a format grpo-cli reads"):
        InputSet(str(tmp_path / "z*.jsonl"))


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: d / "missing.parquet", "no such file or directory"),
        (lambda d: (d / "a.txt").write_text("x") and d / "a.txt", "cannot tell the format from the name"),
        (lambda d: d, "the directory holds no file of a format grpo-cli reads"),
    ],
)
def test_unusable_inputs_are_refused_with_the_path(tmp_path, setup, message):
    spec = str(setup(tmp_path))
    with pytest.raises(GrpoError, match=message) as error:
        InputSet(spec)
    assert str(error.value).startswith(spec)


@pytest.mark.parametrize(("folders", "shown"), [(3, "a, b, c"), (4, "a, b, c, ...")])
def test_a_directory_with_data_in_subfolders_names_three_of_them(tmp_path, folders, shown):
    for i, name in enumerate("abcd"[:folders]):
        (tmp_path / name).mkdir()
        write_jsonl(tmp_path / name / "part.jsonl", ROWS[i:])
    with pytest.raises(GrpoError) as refused:
        InputSet(str(tmp_path))
    pattern = tmp_path / "**" / "*.jsonl"  # the files' own suffix: it was '*.parquet' for any data
    assert refused.value.message == (
        f"{tmp_path}: holds subfolders with data files ({shown}); grpo-cli reads the files of one "
        f"folder: pass a quoted glob such as '{pattern}' to read them all"
    )
    with InputSet(str(pattern)) as followed:  # the hint, followed, reads them all
        assert len(followed.shards) == folders


def test_a_data_file_of_another_format_in_a_directory_is_refused_not_skipped(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ROWS)
    (tmp_path / "b.orc").write_bytes(b"ORC")
    with pytest.raises(GrpoError) as refused:
        InputSet(str(tmp_path))
    assert refused.value.message == (
        f"{tmp_path}: the directory holds b.orc, a format grpo-cli does not read; move it out or name "
        "the files to read with a glob"
    )


def test_an_unknown_input_format_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", ROWS)
    with pytest.raises(
        GrpoError,
        match="--input-format must be one of parquet, jsonl, json, csv, arrow, json-columns, got 'orc'",
    ):
        InputSet(str(path), input_format="orc")  # type: ignore[arg-type]


def test_stdin_is_spooled_and_removed(tmp_path):
    data = "".join(json.dumps(row) + "\n" for row in ROWS).encode()
    with InputSet("-", stdin=io.BytesIO(data)) as inputs:
        (shard,) = inputs.shards
        spooled = shard.path
        assert (shard.display, shard.format, inputs.is_stdin) == ("<stdin>", "jsonl", True)
        assert spooled.read_bytes() == data
        assert inputs.protected().conflict(spooled) is None  # a private copy, not the user's file
    assert not spooled.exists()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "jsonl.gz"])
def test_batches_schema_and_counts(tmp_path, fmt):
    if fmt == "parquet":
        path = write_parquet(tmp_path / "a.parquet", ROWS)
    elif fmt == "jsonl":
        path = write_jsonl(tmp_path / "a.jsonl", ROWS)
    else:
        path = tmp_path / "a.jsonl.gz"
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in ROWS).encode()))
    with InputSet(str(path)) as inputs:
        (shard,) = inputs.shards
        assert read_schema(shard).names == ["group_id", "reward"]
        batches = list(iter_batches(shard, ["reward"], batch_rows=3))
        assert all(b.schema.names == ["reward"] for b in batches)
        assert pa.Table.from_batches(batches).column("reward").to_pylist() == [r["reward"] for r in ROWS]
        assert row_count(shard) == (10 if fmt == "parquet" else None)
        assert estimated_memory_bytes(shard) > 0
        if fmt == "parquet":
            assert [b.num_rows for b in batches] == [3, 3, 3, 1]


def test_an_empty_jsonl_file_has_no_columns_and_no_batches(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with InputSet(str(path)) as inputs:
        (shard,) = inputs.shards
        assert len(read_schema(shard)) == 0
        assert list(iter_batches(shard, None, batch_rows=10)) == []


def test_rows_are_described_as_rows_or_lines(tmp_path):
    parquet = write_parquet(tmp_path / "a.parquet", ROWS)
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("\n" + "".join(json.dumps(r) + "\n\n" for r in ROWS))  # blank lines between records
    with InputSet(str(parquet)) as p, InputSet(str(jsonl)) as j:
        assert describe_row(p.shards[0], 4) == f"{parquet}, row 4"
        assert describe_row(j.shards[0], 0) == f"{jsonl}, line 2"
        assert describe_row(j.shards[0], 3) == f"{jsonl}, line 8"


def test_a_type_change_after_the_first_block_is_settled_by_reading_the_whole_file(tmp_path, monkeypatch):
    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 1024)
    rows = [{"group_id": i, "reward": 1} for i in range(200)] + [{"group_id": 200, "reward": 0.5}]
    path = write_jsonl(tmp_path / "drift.jsonl", rows)
    with InputSet(str(path)) as inputs:
        (shard,) = inputs.shards
        with pytest.raises(readers.jsonl.JsonlSchemaDrift):
            list(iter_batches(shard, None, batch_rows=10))
        assert unify_jsonl_schema(shard).field("reward").type == pa.float64()
        values = pa.Table.from_batches(list(iter_batches(shard, ["reward"], batch_rows=10)))
        assert values.column("reward").to_pylist()[-2:] == [1.0, 0.5]


def _module_state() -> dict[str, int]:
    """The size of every mutable container held at module level by a grpo_cli module."""
    import sys

    state = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("grpo_cli"):
            for attribute, value in vars(module).items():
                if isinstance(value, dict | set | list) and not attribute.startswith("__"):
                    state[f"{name}.{attribute}"] = len(value)
    return state


def test_a_run_leaves_no_state_behind_for_the_next(tmp_path, monkeypatch):
    """What a run settles (a drifting file's types, its scanned integers, its longest line)
    lives on the run's shards: a later run in the same process reads the file afresh."""
    from grpo_cli.jobs import compute_dataset

    monkeypatch.setattr(readers.text, "JSONL_BLOCK_BYTES", 1024)
    rows = [{"group_id": i // 2, "reward": 1} for i in range(200)] + [{"group_id": 100, "reward": 0.5}]
    warm = write_jsonl(tmp_path / "warm.jsonl", rows)
    path = write_jsonl(tmp_path / "drift.jsonl", rows)
    config = ComputeConfig(rewards=("reward",))
    compute_dataset(warm, tmp_path / "warm.parquet", config, force=True)  # imports every module used
    before = _module_state()
    compute_dataset(path, tmp_path / "a.parquet", config, force=True)
    assert _module_state() == before
    with InputSet(str(path)) as inputs:
        (shard,) = inputs.shards
        assert shard.found.schema is None and not shard.found.exact_integers


# --------------------------------------------------------------------------- read-ahead


def test_read_ahead_keeps_order_and_raises_where_the_item_would_be():
    from grpo_cli.inputs.readers import read_ahead

    def items():
        yield from range(3)
        raise ValueError("corrupt at item 3")

    got: list[int] = []
    with pytest.raises(ValueError, match="corrupt at item 3"):
        got.extend(read_ahead(items()))
    assert got == [0, 1, 2]


def test_read_ahead_stops_and_closes_the_source_when_the_consumer_stops():
    import threading

    from grpo_cli.inputs.readers import read_ahead

    produced = []
    closed = threading.Event()

    def items():
        try:
            for i in range(1000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    reader = read_ahead(items(), depth=1)
    assert next(reader) == 0
    reader.close()
    assert closed.is_set(), "the source was not closed"
    assert len(produced) <= 3, f"the producer ran on to {len(produced)} items"


def test_read_ahead_stops_a_producer_that_waits_on_a_full_queue():
    """The consumer stops while the producer is blocked offering the next item: the producer
    must see the stop and end (a put with no timeout would wait for ever, and the consumer's
    join with it)."""
    import threading
    import time

    from grpo_cli.inputs.readers import read_ahead

    produced: list[int] = []

    def items():
        for i in range(1000):
            produced.append(i)
            yield i

    done = threading.Event()

    def consume():
        reader = read_ahead(items(), depth=1)
        next(reader)
        while len(produced) < 3:  # item 1 waits in the queue, item 2 is being offered
            time.sleep(0.01)
        time.sleep(0.2)
        reader.close()
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    assert done.wait(timeout=10), "the consumer's close waited for ever on the producer"


def test_read_ahead_waits_for_a_slow_consumer():
    """A consumer slower than the producer's poll still gets every item, in order."""
    import time

    from grpo_cli.inputs.readers import read_ahead

    got = []
    for item in read_ahead(iter(range(4)), depth=1):
        time.sleep(0.12)
        got.append(item)
    assert got == [0, 1, 2, 3]


class _Source:
    """An iterator with a close method, held by the test so that only read_ahead can close it."""

    def __init__(self, n: int) -> None:
        self.items = iter(range(n))
        self.closed = 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        return next(self.items)

    def close(self) -> None:
        self.closed += 1


def test_read_ahead_closes_its_source_when_the_source_ends():
    from grpo_cli.inputs.readers import read_ahead

    source = _Source(3)
    assert list(read_ahead(source)) == [0, 1, 2]
    assert source.closed >= 1


def test_read_ahead_takes_a_source_with_no_close_quietly(monkeypatch):
    import threading

    from grpo_cli.inputs.readers import read_ahead

    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    assert list(read_ahead(iter(range(3)))) == [0, 1, 2]
    assert raised == []


def test_read_ahead_runs_on_a_named_daemon_thread():
    """A reader left unclosed (an error on its way out) must not keep the process alive."""
    import threading

    from grpo_cli.inputs.readers import read_ahead

    before = set(threading.enumerate())  # another test's threads are not this one's
    reader = read_ahead(_Source(5))
    assert next(reader) == 0
    [thread] = [t for t in threading.enumerate() if t.name == "grpo-cli-reader" and t not in before]
    assert thread.daemon
    reader.close()
    assert not thread.is_alive()


def test_read_ahead_stops_the_source_when_the_consumer_fails(tmp_path):
    """An error in pass 1 (a bad key) leaves no reader thread behind."""
    import threading

    from grpo_cli.jobs import compute_dataset

    path = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"group_id": [None] + ["a"] * 99_999, "reward": [1.0] * 100_000}), path, row_group_size=1000
    )
    before = set(threading.enumerate())  # another test's threads are not this one's
    with pytest.raises(GrpoError, match="null"):
        compute_dataset(path, tmp_path / "out.parquet", ComputeConfig(batch_rows=1000))
    assert not [t for t in threading.enumerate() if t not in before and t.name.startswith("grpo-cli")]


def test_jobs_run_in_a_loop_keep_no_thread(tmp_path):
    """Issue #67 C.12: a library caller running compute_dataset in a loop (ten times here, each
    streaming, each failing half way or succeeding) ends with the threads it started with."""
    import threading

    from grpo_cli.jobs import compute_dataset

    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    rows = {
        "group_id": [f"g{i // 4}" for i in range(40_000)],
        "reward": [float(i % 2) for i in range(40_000)],
    }
    pq.write_table(pa.table(rows), good, row_group_size=1000)
    keys: list[str | None] = [f"g{i // 4}" for i in range(40_000)]
    keys[30_000] = None  # a null key, deep in the file: the run fails with its reader going
    pq.write_table(
        pa.table({**rows, "group_id": keys}),
        bad,
        row_group_size=1000,
    )
    before = set(threading.enumerate())
    for i in range(10):
        path = good if i % 2 else bad
        config = ComputeConfig(batch_rows=1000, memory_budget_bytes=0)
        if path is bad:
            with pytest.raises(GrpoError, match="null"):
                compute_dataset(path, tmp_path / f"out{i}.parquet", config)
        else:
            compute_dataset(path, tmp_path / f"out{i}.parquet", config)
    assert [t.name for t in threading.enumerate() if t not in before] == []


def test_a_copy_of_an_input_under_another_name_is_refused_naming_both(tmp_path):
    """Issue #67 D.16: a file copied beside itself doubled every row without a word. One file of
    the same bytes as another is refused with both names; files of one size but other bytes
    (at either end, or only in the middle) are read."""
    write_parquet(tmp_path / "a.parquet", ROWS)
    (tmp_path / "b.parquet").write_bytes((tmp_path / "a.parquet").read_bytes())
    with pytest.raises(GrpoError, match=r"b\.parquet: the same bytes as .*a\.parquet \(a copy\?\)"):
        InputSet(str(tmp_path))
    lines = tmp_path / "lines"
    lines.mkdir()
    first = b"".join(
        json.dumps({"group_id": 0, "reward": 1.0, "pad": "x" * 200_000}).encode() + b"\n" for _ in range(2)
    )
    at = first.index(b'"group_id": 0', len(first) // 2)  # the second line's: past the first 64 KiB
    second = first[:at] + b'"group_id": 1' + first[at + 13 :]  # the same size, other bytes in the middle
    assert len(first) == len(second) and 1 << 16 < at < len(first) - (1 << 16)
    (lines / "a.jsonl").write_bytes(first)
    (lines / "b.jsonl").write_bytes(second)
    with InputSet(str(lines)) as inputs:
        assert [s.path.name for s in inputs.shards] == ["a.jsonl", "b.jsonl"]


def test_a_consumer_that_fails_waits_for_the_item_in_hand_then_the_reader_is_gone():
    """The consumer gave the reader one second, then left it running: under load an item (a
    row group decoding) takes longer, and the thread outlived the job. Only a run stopped by
    Ctrl-C or SIGTERM leaves on time without it."""
    import threading
    import time

    from grpo_cli.inputs.readers import read_ahead
    from grpo_cli.inputs.readers.base import PRODUCER_GRACE_SECONDS

    class Slow(_Source):
        def __next__(self) -> int:
            time.sleep(PRODUCER_GRACE_SECONDS * 1.5)
            return super().__next__()

    source = Slow(3)
    before = set(threading.enumerate())
    reader = read_ahead(source)
    assert next(reader) == 0  # the producer is now on its second item
    reader.close()  # the consumer stops early (an error in pass 1)
    assert [t for t in threading.enumerate() if t not in before] == []
    assert source.closed >= 1
