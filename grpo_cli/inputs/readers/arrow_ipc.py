"""Arrow IPC files and streams, memory-mapped, every batch validated."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.inputs.readers.base import _checked, _Rows
from grpo_cli.inputs.sources import Shard


class ArrowReader(_Rows):
    """An Arrow IPC file or stream, memory-mapped, every batch validated."""

    def schema(self, shard: Shard) -> pa.Schema:
        with _arrow_batches(shard) as (schema, _):
            return schema

    def memory_bytes(self, shard: Shard) -> int:
        return shard.size_bytes

    def rows(self, shard: Shard) -> int | None:
        with _arrow_batches(shard) as (_, batches):  # memory-mapped: only the batches' headers are read
            return int(sum(batch.num_rows for batch in batches))

    def batches(self, shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        with _arrow_batches(shard) as (_, batches):
            yield from _rebatched(batches, columns, batch_rows)


def _rebatched(
    batches: Iterator[pa.RecordBatch], columns: list[str] | None, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """Batches of about ``batch_rows`` rows from smaller ones (``datasets`` writes 1,000-row batches)."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        pending.append(batch.select(columns) if columns is not None else batch)
        rows += batch.num_rows
        if rows >= batch_rows:
            yield from _combined(pending)
            pending, rows = [], 0
    if pending:
        yield from _combined(pending)


def _combined(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    if len(batches) == 1:
        return batches
    combined: list[pa.RecordBatch] = pa.Table.from_batches(batches).combine_chunks().to_batches()
    return combined


@contextlib.contextmanager
def _arrow_batches(shard: Shard) -> Iterator[tuple[pa.Schema, Iterator[pa.RecordBatch]]]:
    """An Arrow IPC file or stream, memory-mapped: its schema and its batches."""
    try:
        with pa.memory_map(str(shard.path), "r") as source:
            magic = source.read(6)
            source.seek(0)
            if magic.startswith(b"FEA1"):
                raise GrpoError(
                    f"{shard.display}: a Feather version 1 file; convert it to version 2 "
                    "(pyarrow.feather.write_feather) first"
                )
            if magic == b"ARROW1":
                file_reader = pa.ipc.open_file(source)
                batches = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
                yield file_reader.schema, _checked(shard, batches, "Arrow")
            else:
                stream_reader = pa.ipc.open_stream(source)
                yield stream_reader.schema, _checked(shard, iter(stream_reader), "Arrow")
    except (pa.ArrowException, OSError) as exc:
        raise GrpoError(f"{shard.display}: not a readable Arrow IPC file ({first_line(exc)})") from None
