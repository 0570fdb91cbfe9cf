"""output.py at its own level: atomic Parquet commits, shard naming, output figures."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.errors import GrpoError
from grpo_cli.inputs.protected import ProtectedInputs
from grpo_cli.inputs.sources import Shard
from grpo_cli.outputs.guard import WriteGuard
from grpo_cli.outputs.output import OutputTarget, ShardWriter, advantage_range, commit_directory, output_info

SCHEMA = pa.schema([("reward", pa.float64()), ("advantage", pa.float32()), ("group_active", pa.bool_())])


def shard(name: str) -> Shard:
    return Shard(Path("/data") / name, name, "parquet" if name.endswith(".parquet") else "jsonl", 0)


def batch(values: list[float]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array(values, pa.float64()),
            pa.array([v - 0.5 for v in values], pa.float32()),
            pa.array([True] * len(values)),
        ],
        schema=SCHEMA,
    )


@pytest.fixture
def guard():
    with WriteGuard(ProtectedInputs.of([])) as g:
        yield g


def test_single_file_appears_only_on_commit(tmp_path, guard):
    target_path = tmp_path / "out.parquet"
    target = OutputTarget(guard.claim(target_path, directory=False, force=False))
    writer = target.open_shard(shard("a.parquet"), SCHEMA, 2)
    writer.write(batch([1.0, 2.0]))
    writer = target.open_shard(shard("b.parquet"), SCHEMA, 2)  # same columns: appended
    writer.write(batch([3.0]))
    writer.close()
    assert not target_path.exists()
    info = target.commit()
    assert info == {
        "path": str(target_path),
        "shards": 1,
        "bytes": target_path.stat().st_size,
        "method": "rewrite",
        "shards_by_method": {"rewrite": 2},
        "format": "parquet",
    }
    assert pq.read_table(target_path).column("reward").to_pylist() == [1.0, 2.0, 3.0]
    assert pl.read_parquet(target_path).to_dicts() == pq.read_table(target_path).to_pylist()
    target.discard()  # a no-op after commit
    guard.close()  # releases the lock file
    assert target_path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet"]


def test_discard_leaves_nothing(tmp_path, guard):
    target = OutputTarget(guard.claim(tmp_path / "out.parquet", directory=False, force=False))
    target.open_shard(shard("a.parquet"), SCHEMA, 2).write(batch([1.0]))
    target.discard()
    guard.close()
    assert list(tmp_path.iterdir()) == []


def test_a_discarded_target_closes_its_files_and_takes_no_more_shards(tmp_path, guard):
    target = OutputTarget(guard.claim(tmp_path / "out.parquet", directory=False, force=False))
    writer = target.open_shard(shard("a.parquet"), SCHEMA, 2)
    writer.write(batch([1.0]))
    assert isinstance(writer, ShardWriter)
    parquet = writer._writer
    target.discard()
    assert not parquet.is_open
    # a write after discard() would leave a file where the temporary was removed
    with pytest.raises(AssertionError, match="discarded"):
        target.open_shard(shard("b.parquet"), SCHEMA, 2)
    guard.close()
    assert list(tmp_path.iterdir()) == []


def test_a_discarded_jsonl_target_closes_its_file(tmp_path, guard):
    target = OutputTarget(guard.claim(tmp_path / "out.jsonl", directory=False, force=False))
    target.open_shard(shard("a.parquet"), SCHEMA, 2).write(batch([1.0]))
    sink = target._jsonl
    assert sink is not None
    target.discard()
    assert sink._handle.closed
    guard.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("failing", "output_name", "spliced"),
    [
        ("grpo_cli.outputs.output._PrefixCopier.finish", "out.parquet", True),
        ("grpo_cli.outputs.splice.SplicedFile.abandon", "out.parquet", True),
        ("grpo_cli.outputs.output.SplicedShardWriter.abandon", "out.parquet", True),
        ("grpo_cli.outputs.output._WriterThread.finish", "out.parquet", False),
        ("pyarrow.parquet.ParquetWriter.close", "out.parquet", False),
        ("grpo_cli.outputs.output._JsonlSink.close", "out.jsonl", False),
    ],
)
def test_discard_goes_on_when_a_cleanup_step_fails(
    tmp_path, guard, monkeypatch, failing, output_name, spliced
):
    """discard() runs after a failure: an error in one cleanup step must neither replace
    the run's error nor stop the other steps (the temporary is still removed)."""
    from grpo_cli.inputs.sources import InputSet

    source = tmp_path / "in" / "a.parquet"
    source.parent.mkdir()
    pq.write_table(pa.table({"reward": [1.0, 2.0]}), source)
    with InputSet([str(source)]) as inputs:
        target = OutputTarget(guard.claim(tmp_path / output_name, directory=False, force=False))
        target.start_splices(inputs.shards, None if spliced else "re-encoded in this test")
        if failing.endswith("SplicedShardWriter.abandon"):
            assert target.open_spliced(inputs.shards[0], SCHEMA, 2) is not None
        elif not spliced:
            target.open_shard(inputs.shards[0], SCHEMA, 2).write(batch([1.0]))
        closed_for_real = failing.endswith(".close")
        real_method = _attribute(failing)

        def fail(*args, **kwargs):
            if closed_for_real:
                real_method(*args, **kwargs)
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(failing, fail)
        target.discard()
    guard.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def _attribute(dotted: str):
    import importlib

    module, owner, name = dotted.rsplit(".", 2)
    return getattr(getattr(importlib.import_module(module), owner), name)


def test_the_writer_thread_runs_nothing_after_a_failed_write():
    import threading

    from grpo_cli.outputs.output import _WriterThread

    thread = _WriterThread("out.parquet")
    release, ran = threading.Event(), []

    def full() -> None:
        raise OSError(28, "No space left on device")

    thread.submit(release.wait)  # holds the thread while the next two are queued
    thread.submit(full)
    thread.submit(lambda: ran.append("written after the failure"))
    release.set()
    with pytest.raises(GrpoError, match=r"^out\.parquet: cannot write the output \(No space left"):
        thread.finish()
    assert ran == []


def test_abandoning_the_writer_thread_skips_queued_writes_but_runs_cleanups():
    import threading

    from grpo_cli.outputs.output import _WriterThread

    thread = _WriterThread("out.parquet")
    release, ran = threading.Event(), []
    thread.submit(release.wait)  # holds the thread while the next two are queued
    thread.submit(lambda: ran.append("a write"))
    thread.submit(lambda: ran.append("a cleanup"), must_run=True)
    put = thread._queue.put

    def release_once_abandoning(item, *args, **kwargs):  # finish() has decided to abandon by now
        release.set()
        put(item, *args, **kwargs)

    thread._queue.put = release_once_abandoning  # type: ignore[method-assign]
    thread.finish(abandon=True)
    assert ran == ["a cleanup"]


def test_single_file_refuses_shards_with_other_columns(tmp_path, guard):
    target = OutputTarget(guard.claim(tmp_path / "out.parquet", directory=False, force=False))
    target.open_shard(shard("a.parquet"), SCHEMA, 2)
    other = SCHEMA.append(pa.field("extra", pa.int64()))
    with pytest.raises(
        GrpoError,
        match=r"b\.parquet: its columns differ from those of a\.parquet \(column .extra. is not there\); "
        r"write to a directory",
    ):
        target.open_shard(shard("b.parquet"), other, 2)
    target.discard()


def test_single_file_accepts_shards_whose_schemas_differ_only_in_metadata(tmp_path, guard):
    path = tmp_path / "out.parquet"
    target = OutputTarget(guard.claim(path, directory=False, force=False))
    target.open_shard(shard("a.parquet"), SCHEMA.with_metadata({b"writer": b"a"}), 2).write(batch([1.0]))
    writer = target.open_shard(shard("b.parquet"), SCHEMA.with_metadata({b"writer": b"b"}), 2)
    writer.write(batch([2.0]))
    writer.close()
    target.commit()
    assert pq.read_table(path).column("reward").to_pylist() == [1.0, 2.0]


def test_a_run_that_wrote_nothing_has_no_output(tmp_path, guard):
    target = OutputTarget(guard.claim(tmp_path / "out.parquet", directory=False, force=False))
    with pytest.raises(GrpoError, match=r"^no output was produced$"):
        target.commit()
    target.discard()


def test_a_failing_write_is_one_line_naming_the_output(tmp_path, guard, monkeypatch):
    from grpo_cli.outputs import output

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output, "_parquet_writer", full)
    path = tmp_path / "out.parquet"
    target = OutputTarget(guard.claim(path, directory=False, force=False))
    with pytest.raises(GrpoError) as raised:
        target.open_shard(shard("a.parquet"), SCHEMA, 2)
    assert (
        raised.value.message
        == f"{path}: cannot write the output (No space left on device); nothing was written"
    )
    target.discard()


def test_directory_names_shards_after_inputs_and_refuses_collisions(tmp_path, guard):
    out = tmp_path / "out"
    target = OutputTarget(guard.claim(out, directory=True, force=False))
    for name in ("a.parquet", "b.jsonl.gz"):
        writer = target.open_shard(shard(name), SCHEMA, 2)
        writer.write(batch([1.0]))
        writer.close()
    with pytest.raises(GrpoError, match=r"b\.jsonl and b\.jsonl\.gz would both be written to"):
        target.open_shard(shard("b.jsonl"), SCHEMA, 2)
    info = target.commit()
    assert sorted(p.name for p in out.iterdir()) == ["a.parquet", "b.parquet"]
    assert info["shards"] == 2 and info["bytes"] == sum(p.stat().st_size for p in out.iterdir())
    # every shard was closed (footer written) before the commit, though a writer is still referenced
    assert [pq.read_table(p).num_rows for p in sorted(out.iterdir())] == [1, 1]


def test_new_columns_are_not_dictionary_encoded(tmp_path, guard):
    path = tmp_path / "out.parquet"
    target = OutputTarget(guard.claim(path, directory=False, force=False))
    writer = target.open_shard(shard("a.parquet"), SCHEMA, 2)
    writer.write(batch([1.0, 1.0, 1.0, 2.0]))
    writer.close()
    target.commit()
    columns = pq.read_metadata(path).row_group(0)
    encodings = {columns.column(i).path_in_schema: columns.column(i).encodings for i in range(3)}
    assert any("DICTIONARY" in e for e in encodings["reward"])
    assert not any("DICTIONARY" in e for e in encodings["advantage"])


def test_commit_directory_moves_what_another_writer_wrote(tmp_path, guard):
    claim = guard.claim(tmp_path / "out", directory=True, force=False)
    temp = claim.temp_path()
    pq.write_table(pa.Table.from_batches([batch([1.0, 5.0])]), temp / "part-0.parquet")
    pq.write_table(pa.Table.from_batches([batch([-2.0])]), temp / "part-1.parquet")
    files = commit_directory(claim)
    assert [f.name for f in files] == ["part-0.parquet", "part-1.parquet"]
    assert output_info("out", files)["shards"] == 2
    assert advantage_range(files, "advantage") == (-2.5, 4.5)


def test_advantage_range_is_unknown_without_statistics(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.Table.from_batches([batch([1.0])]), path, write_statistics=False)
    assert advantage_range([path], "advantage") is None
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_batches([], schema=SCHEMA), empty)
    assert advantage_range([empty], "advantage") is None


@pytest.mark.parametrize(
    ("display", "name"),
    [
        ("<stdin>", "stdin.parquet"),
        ("rollouts.ndjson", "rollouts.parquet"),
        ("part-1.ndjson.zst", "part-1.parquet"),
        ("x.csv.gz", "x.parquet"),
        ("data.pq", "data.parquet"),
    ],
)
def testoutput_name_ofs_strip_the_whole_input_suffix(display, name):
    from grpo_cli.outputs.output import output_name_of

    assert output_name_of(Shard(Path(display), display, "jsonl", 0)) == name


@pytest.mark.parametrize(
    "data_type",
    [
        pa.binary(),
        pa.large_binary(),
        pa.binary(4),
        pa.list_(pa.binary()),
        pa.large_list(pa.binary()),
        pa.list_(pa.binary(), 2),
        pa.struct([("ok", pa.int64()), ("raw", pa.binary())]),
        pa.dictionary(pa.int32(), pa.binary()),
    ],
)
def test_jsonl_output_refuses_raw_bytes_wherever_they_are(data_type):
    from grpo_cli.outputs.output import _json_refusal

    refusal = _json_refusal(pa.schema([("text", pa.string()), ("blob", data_type)]))
    assert refusal is not None and refusal.startswith("column 'blob' holds raw bytes")


def test_jsonl_output_accepts_text_and_nested_text():
    from grpo_cli.outputs.output import _json_refusal

    schema = pa.schema(
        [
            ("text", pa.string()),
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("n", pa.int64())]))),
            ("source", pa.dictionary(pa.int32(), pa.string())),
        ]
    )
    assert _json_refusal(schema) is None


def test_advantage_range_of_one_value_is_that_value(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.Table.from_batches([batch([1.0, 1.0])]), path)
    assert advantage_range([path], "advantage") == (0.5, 0.5)


@pytest.mark.parametrize("directory", [False, True], ids=["file", "directory"])
def test_rewritten_shards_use_the_compression_asked_for(tmp_path, guard, directory):
    path = tmp_path / ("out" if directory else "out.parquet")
    target = OutputTarget(guard.claim(path, directory=directory, force=False), compression="zstd")
    writer = target.open_shard(shard("a.parquet"), SCHEMA, 2)
    writer.write(batch([1.0, 2.0]))
    writer.close()
    target.commit()
    group = pq.read_metadata(path / "a.parquet" if directory else path).row_group(0)
    assert {group.column(i).compression for i in range(3)} == {"ZSTD"}


def test_commit_directory_with_force_replaces_a_directory_that_filled_meanwhile(tmp_path, guard):
    out = tmp_path / "out"
    claim = guard.claim(out, directory=True, force=True)
    pq.write_table(pa.Table.from_batches([batch([1.0])]), claim.temp_path() / "new.parquet")
    out.mkdir()
    (out / "other.parquet").write_bytes(b"written by someone else while the run ran")
    files = commit_directory(claim)
    assert [f.name for f in files] == ["new.parquet"]


def test_advantage_range_reads_past_an_empty_row_group(tmp_path):
    path = tmp_path / "x.parquet"
    with pq.ParquetWriter(path, SCHEMA) as writer:
        writer.write_table(pa.Table.from_batches([batch([1.0])]))
        writer.write_table(pa.Table.from_batches([], schema=SCHEMA))
        writer.write_table(pa.Table.from_batches([batch([9.0])]))
    if pq.read_metadata(path).num_row_groups < 3:
        pytest.skip("this pyarrow does not write empty row groups")
    assert advantage_range([path], "advantage") == (0.5, 8.5)


def test_repeated_map_keys_are_looked_for_in_a_slices_own_rows_only() -> None:
    from grpo_cli.outputs.output import _refuse_repeated_map_keys

    maps = pa.array([[("a", 1)], [("b", 1)], [("c", 1), ("c", 2)]], type=pa.map_(pa.string(), pa.int64()))
    _refuse_repeated_map_keys(maps.slice(0, 2), "meta", "out.jsonl")  # the repeated key lies past it
    _refuse_repeated_map_keys(maps.slice(1, 1), "meta", "out.jsonl")
    with pytest.raises(GrpoError, match="column 'meta' holds a map with the key 'c' twice in a row"):
        _refuse_repeated_map_keys(maps.slice(1, 2), "meta", "out.jsonl")
