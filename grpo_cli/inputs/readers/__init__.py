"""Reading shards: one reader per format behind one protocol, and the text formats' hardening.

:func:`reader_of` gives a shard's :class:`FormatReader` (Parquet, Arrow IPC, JSON lines, CSV,
or a table in memory); :func:`read_schema`, :func:`iter_batches`, :func:`describe_row` and the
other functions here ask it. Every read error becomes a :class:`~grpo_cli.errors.GrpoError`
naming the file (and the line, for text formats). The JSON-lines and CSV readers harden what
pyarrow's readers pass through or trip on: nesting deep enough to overflow its parser, integers
a float column would round, invalid UTF-8, a column whose type changes after the first block,
and the line (not the record) an error is on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from grpo_cli.inputs.readers.arrow_ipc import ArrowReader
from grpo_cli.inputs.readers.base import FormatReader, _Rows, read_ahead
from grpo_cli.inputs.readers.csv import CsvReader
from grpo_cli.inputs.readers.jsonl import JsonlReader
from grpo_cli.inputs.readers.parquet import ParquetReader, parquet_row_range, read_table, validate_pages
from grpo_cli.inputs.readers.text import MAX_TYPE_SETTLINGS, SchemaDrift, _text_bytes
from grpo_cli.inputs.sources import Shard

__all__ = [
    "MAX_TYPE_SETTLINGS",
    "READERS",
    "FormatReader",
    "SchemaDrift",
    "TableReader",
    "describe_row",
    "estimated_memory_bytes",
    "hold_text_within",
    "iter_batches",
    "parquet_row_range",
    "read_ahead",
    "read_provenance",
    "read_schema",
    "read_table",
    "reader_of",
    "row_count",
    "validate_pages",
]


class TableReader(_Rows):
    """A table in memory (the table API)."""

    def schema(self, shard: Shard) -> pa.Schema:
        assert shard.table is not None
        return shard.table.schema

    def memory_bytes(self, shard: Shard) -> int:
        assert shard.table is not None
        return int(shard.table.nbytes)

    def rows(self, shard: Shard) -> int | None:
        assert shard.table is not None
        return int(shard.table.num_rows)

    def batches(self, shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        assert shard.table is not None
        table = shard.table if columns is None else shard.table.select(columns)
        yield from table.to_batches(max_chunksize=batch_rows)


READERS: dict[str, FormatReader] = {
    "table": TableReader(),
    "parquet": ParquetReader(),
    "arrow": ArrowReader(),
    "jsonl": JsonlReader(),
    "csv": CsvReader(),
}
"""One reader per :attr:`Shard.format <grpo_cli.inputs.sources.Shard.format>`."""


def reader_of(shard: Shard) -> FormatReader:
    """The reader of ``shard``'s format (a table in memory has the format ``"table"``).

    >>> from pathlib import Path
    >>> type(reader_of(Shard(Path("a.csv"), "a.csv", "csv", 0))).__name__
    'CsvReader'
    """
    return READERS[shard.format]


def read_schema(shard: Shard) -> pa.Schema:
    """The shard's schema (for JSONL and CSV: as inferred from the first block)."""
    return reader_of(shard).schema(shard)


def read_provenance(shard: Shard) -> dict[str, Any] | None:
    """The ``grpo_cli`` provenance entry of a Parquet shard grpo-cli wrote, or ``None``."""
    return reader_of(shard).provenance(shard)


def estimated_memory_bytes(shard: Shard) -> int:
    """Roughly how much memory the shard takes once decoded."""
    return reader_of(shard).memory_bytes(shard)


def row_count(shard: Shard) -> int | None:
    """Rows in the shard when the file says so cheaply (Parquet, Arrow, a table), else ``None``."""
    return reader_of(shard).rows(shard)


def iter_batches(shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches of the shard, optionally only some columns."""
    return reader_of(shard).batches(shard, columns, batch_rows)


def describe_row(shard: Shard, row: int) -> str:
    """``data.parquet, row 17``, or ``data.jsonl, line 18`` and ``data.csv, line 19`` (the text
    formats name the line, 1-based, an editor shows) for error messages."""
    return reader_of(shard).where(shard, row)


def hold_text_within(shards: Sequence[Shard], budget: int) -> None:
    """Let a run's JSON-lines and CSV shards be read from disk once each, their bytes held for every
    scan and pass, where those bytes and every shard's decoded rows fit ``budget`` together (the
    rows are then kept for pass 2 anyway); otherwise a file past :data:`TEXT_IN_MEMORY_BYTES`
    streams from disk in each scan, in bounded memory."""
    text = [shard for shard in shards if shard.format in ("jsonl", "csv")]
    held = sum(_text_bytes(shard) for shard in text)
    if text and held + sum(estimated_memory_bytes(shard) for shard in shards) <= budget:
        for shard in text:
            shard.found.hold_up_to = max(shard.found.hold_up_to, budget)
