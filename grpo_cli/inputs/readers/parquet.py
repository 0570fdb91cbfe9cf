"""Parquet: the footer's row counts held to the pages', every page's CRC verified where the
writer stored one, damaged files refused with the row group and column."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from grpo_cli.errors import GrpoError
from grpo_cli.file_names import PROVENANCE_KEY
from grpo_cli.inputs.readers.base import _checked, _Rows, read_error
from grpo_cli.inputs.sources import Shard


class ParquetReader(_Rows):
    """Parquet, every page's CRC verified where the writer stored one."""

    def schema(self, shard: Shard) -> pa.Schema:
        try:
            return pq.read_schema(shard.path)
        except (pa.ArrowException, OSError) as exc:
            raise read_error(shard.display, exc, "not a readable Parquet file") from None

    def provenance(self, shard: Shard) -> dict[str, Any] | None:
        raw = self._metadata(shard).metadata or {}
        entry = raw.get(PROVENANCE_KEY)
        if entry is None:
            return None
        try:
            record = json.loads(entry)
        except ValueError:
            raise GrpoError(f"{shard.display}: its grpo-cli provenance entry is not valid JSON") from None
        if not isinstance(record, dict):
            raise GrpoError(f"{shard.display}: its grpo-cli provenance entry is not a JSON object")
        return record

    def memory_bytes(self, shard: Shard) -> int:
        meta = self._metadata(shard)
        return int(sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)))

    def rows(self, shard: Shard) -> int | None:
        try:
            return int(pq.read_metadata(shard.path).num_rows)
        except (pa.ArrowException, OSError):
            return None

    def batches(self, shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        yield from _parquet_batches(shard, columns, batch_rows)

    @staticmethod
    def _metadata(shard: Shard) -> pq.FileMetaData:
        try:
            return pq.read_metadata(shard.path)
        except (pa.ArrowException, OSError) as exc:
            raise read_error(shard.display, exc, "not a readable Parquet file") from None


def validate_pages(shards: Sequence[Shard]) -> dict[str, Any]:
    """Decode every page of every Parquet shard, verifying each page's CRC where the writer
    stored one: ``row_groups`` and ``column_chunks`` decoded, and ``error`` (the first failure,
    naming its file, row group and column) or ``None``. Other formats were decoded whole by the run.
    """
    row_groups = chunks = 0
    for shard in shards:
        if shard.format != "parquet":
            continue
        try:
            file = pq.ParquetFile(shard.path, page_checksum_verification=True, pre_buffer=False)
        except (pa.ArrowException, OSError) as exc:
            return {
                "row_groups": row_groups,
                "column_chunks": chunks,
                "error": read_error(shard.display, exc, "unreadable").message,
            }
        with file:
            names = file.schema_arrow.names
            declared = file.metadata.num_rows
            rows = 0
            for group in range(file.num_row_groups):
                group_rows = file.metadata.row_group(group).num_rows
                for name in names:
                    where = f"row group {group}, column {name!r}"
                    try:
                        values = file.read_row_group(group, columns=[name], use_threads=False).num_rows
                    except (pa.ArrowException, OSError) as exc:
                        error = read_error(shard.display, exc, f"{where}: does not decode").message
                        return {"row_groups": row_groups, "column_chunks": chunks, "error": error}
                    if values != group_rows:  # pyarrow takes a short column chunk without a word
                        error = (
                            f"{shard.display}: {where}: decodes to {values:,} values where the row group "
                            f"declares {group_rows:,} rows"
                        )
                        return {"row_groups": row_groups, "column_chunks": chunks, "error": error}
                    chunks += 1
                row_groups += 1
                rows += group_rows
            if rows != declared:
                error = _rows_short(shard.display, declared, rows, "its footer").message
                return {"row_groups": row_groups, "column_chunks": chunks, "error": error}
    return {"row_groups": row_groups, "column_chunks": chunks, "error": None}


def read_table(shard: Shard) -> pa.Table:
    """A whole Parquet shard, decoded in parallel."""
    try:
        with pq.ParquetFile(shard.path, page_checksum_verification=True) as file:
            table = file.read(use_threads=True)
            declared = file.metadata.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise read_error(shard.display, exc, "corrupt Parquet data") from None
    if table.num_rows != declared:
        raise _damaged(shard, declared, table.num_rows)
    return table


def parquet_row_range(
    source: str | pa.NativeFile, display: str, columns: list[str] | None, start: int, stop: int
) -> pa.Table:
    """Rows ``[start, stop)`` of a Parquet file (a path, or a file opened on another file system),
    its columns (``None``: every one) in the file's own types, decoding only the row groups that
    hold them, page CRCs verified; one line on a bad file.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "part.parquet")
    >>> pq.write_table(pa.table({"x": range(10)}), path, row_group_size=4)
    >>> parquet_row_range(path, "part.parquet", ["x"], 3, 9).column("x").to_pylist()
    [3, 4, 5, 6, 7, 8]
    """
    try:
        file = pq.ParquetFile(source, pre_buffer=False, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as exc:
        raise read_error(display, exc, "not a readable Parquet file") from None
    with file:
        metadata = file.metadata
        first = 0
        groups, group_start = [], None
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group).num_rows
            if first < stop and first + rows > start:
                groups.append(group)
                group_start = first if group_start is None else group_start
            first += rows
        if not groups or group_start is None:
            empty = file.schema_arrow.empty_table()
            return empty if columns is None else empty.select(columns)
        try:
            table = file.read_row_groups(groups, columns=columns, use_threads=False)
        except (pa.ArrowException, OSError) as exc:
            raise read_error(display, exc, "corrupt Parquet data") from None
        declared = sum(metadata.row_group(group).num_rows for group in groups)
        if table.num_rows != declared:
            where = f"row groups {groups[0]} to {groups[-1]}" if len(groups) > 1 else f"row group {groups[0]}"
            raise _rows_short(display, declared, table.num_rows, where)
    return table.slice(start - group_start, stop - start)


def _parquet_batches(shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
    try:
        # pre_buffer would read the whole file ahead: memory must stay bounded by a batch.
        file = pq.ParquetFile(shard.path, pre_buffer=False, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as exc:
        raise read_error(shard.display, exc, "not a readable Parquet file") from None
    with file:
        declared = file.metadata.num_rows
        batches = file.iter_batches(batch_size=batch_rows, columns=columns, use_threads=True)
        rows = 0
        for batch in _checked(shard, batches, "Parquet"):
            rows += batch.num_rows
            yield batch
        if rows != declared:
            raise _damaged(shard, declared, rows)


def _damaged(shard: Shard, declared: int, decoded: int) -> GrpoError:
    """The error of a Parquet shard whose columns decoded to other than its rows: the row group
    and column at fault where :func:`validate_pages` finds them, else the totals."""
    found = validate_pages([shard])["error"]
    return GrpoError(found) if found is not None else _rows_short(shard.display, declared, decoded)


def _rows_short(display: str, declared: int, decoded: int, where: str = "its footer") -> GrpoError:
    """A Parquet file whose columns hold other than the rows its metadata declares: damaged."""
    return GrpoError(
        f"{display}: {where} declares {declared:,} rows but its columns decode to {decoded:,}; the file "
        "is damaged"
    )
