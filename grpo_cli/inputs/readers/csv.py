"""CSV: every column read as its text, a record longer than the block read again with one that
holds it, errors on the line an editor shows."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.csv as pa_csv

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.inputs.readers.text import (
    SchemaDrift,
    _native_stream,
    _open_jsonl,
    _Text,
    _TextStream,
    jsonl_block_bytes,
)
from grpo_cli.inputs.sources import Shard


class CsvReader(_Text):
    """CSV, every column read as its text; errors on the line an editor shows."""

    def schema(self, shard: Shard) -> pa.Schema:
        with _CsvStream(shard) as reader:
            return reader.schema

    def batches(self, shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        yield from _csv_batches(shard, columns)

    def where(self, shard: Shard, row: int) -> str:
        line = csv_line_of_record(shard, row) if shard.path.is_file() else None
        return f"{shard.display}, line {line}" if line is not None else super().where(shard, row)


class _CsvStream(_TextStream["pa_csv.CSVStreamingReader"]):
    """Every CSV column is read as its text: type inference would merge the keys ``007``,
    ``07`` and ``7``, turn ``N/A`` into a null and ``001`` into ``1.0``. An unquoted empty
    cell is a null (a quoted ``""`` is the empty string); the columns grpo-cli computes
    from are parsed as numbers where they are read
    (:func:`~grpo_cli.run.reward_columns.numbers_from_text`)."""

    def _open(self, stream: pa.NativeFile) -> pa_csv.CSVStreamingReader:
        read_options = pa_csv.ReadOptions(block_size=jsonl_block_bytes(self.shard))  # a record fits
        # a quoted cell may hold newlines: a block may not be cut at one of them
        parse_options = pa_csv.ParseOptions(newlines_in_values=True)
        with _native_stream(self.shard) as header:
            names = pa_csv.open_csv(
                header, read_options=read_options, parse_options=parse_options
            ).schema.names
        return pa_csv.open_csv(
            stream,
            read_options=read_options,
            parse_options=parse_options,
            convert_options=pa_csv.ConvertOptions(
                column_types={name: pa.string() for name in names},
                null_values=[""],
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )

    def _error(self, exc: BaseException) -> Exception:
        return _csv_error(self.shard, exc)


def _csv_batches(shard: Shard, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    with _CsvStream(shard) as reader:
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as exc:
                raise _csv_error(shard, exc) from None
            yield batch.select(columns) if columns is not None else batch


class CsvLongRecord(SchemaDrift):
    """A CSV record (a cell of megabytes) longer than pyarrow's read block: its length is noted
    (``shard.found.longest_line``) and the run reads the file again with a block that holds it."""

    def settle(self) -> None:
        return None


def _longest_csv_record(shard: Shard) -> int:
    """The bytes of the longest CSV record (a quoted cell may span lines), as Python's csv reads it."""
    import csv

    consumed = 0

    def lines() -> Iterator[str]:
        nonlocal consumed
        for raw in handle:
            consumed += len(raw)
            yield raw.decode("utf-8", "replace")

    longest = start = 0
    limit = csv.field_size_limit(sys.maxsize)  # the csv module's 128 KiB a cell would stop it
    try:
        with _open_jsonl(shard) as handle:
            reader = csv.reader(lines())
            with contextlib.suppress(csv.Error):
                for _ in reader:
                    longest, start = max(longest, consumed - start), consumed
    finally:
        csv.field_size_limit(limit)
    return longest


def _csv_error(shard: Shard, exc: BaseException) -> Exception:
    text = first_line(exc)
    if "straddl" in text:  # a record longer than the block: read again with one that holds it
        longest = _longest_csv_record(shard)
        if longest >= jsonl_block_bytes(shard):
            shard.found.longest_line = longest
            return CsvLongRecord(shard)
    if shard.compression and isinstance(exc, OSError):
        return GrpoError(f"{shard.display}: not a readable {shard.compression} file ({text})")
    if "Empty CSV file" in text:
        return GrpoError(f"{shard.display}: an empty CSV file (not even a header line)")
    text = re.sub(r"(Expected \d+ columns?, got \d+).*", r"\1", text)  # not the row's raw bytes
    text = re.sub(r"Row #\d+: ", "", text)  # pyarrow numbers rows only when it parses serially
    line = _csv_line_of_bad_record(shard) if "Expected" in text else None
    where = f", line {line}" if line is not None else ""
    return GrpoError(f"{shard.display}{where}: malformed CSV ({text})")


def _csv_records(shard: Shard) -> Iterator[tuple[int, list[str]]]:
    """Each CSV record (the header first) with the line it ends on, as Python's csv reads it."""
    import csv

    with _open_jsonl(shard) as handle:
        text = io.TextIOWrapper(handle, encoding="utf-8-sig", errors="replace", newline="")
        reader = csv.reader(text)
        with contextlib.suppress(csv.Error):
            for record in reader:
                yield reader.line_num, record


def _csv_line_of_bad_record(shard: Shard) -> int | None:
    """The line of the first record whose field count differs from the header's."""
    width = None
    for line, record in _csv_records(shard):
        if width is None:
            width = len(record)
        elif record and len(record) != width:
            return line
    return None


def csv_line_of_record(shard: Shard, record: int) -> int | None:
    """The line the 0-based data ``record`` starts on (a quoted cell may hold newlines)."""
    previous_end = None
    for index, (line, _) in enumerate(_csv_records(shard)):
        if index == record + 1:
            return (previous_end or 0) + 1
        previous_end = line
    return None
