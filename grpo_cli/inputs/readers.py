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

import contextlib
import io
import json
import queue
import re
import sys
import threading
import zlib
from collections.abc import Generator, Iterator, Sequence
from typing import IO, Any, Generic, Protocol, TypeVar

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from grpo_cli.arrow.columns import MAX_NESTING, holds_type
from grpo_cli.errors import GrpoError, first_line
from grpo_cli.file_names import PROVENANCE_KEY
from grpo_cli.inputs.sources import Shard, decompressed
from grpo_cli.stages import timed_items

JSONL_BLOCK_BYTES = 8 << 20
MAX_TYPE_SETTLINGS = (
    64  # a run settles a text file's types at most this often: each widens a column's or unifies a file's
)


# --------------------------------------------------------------------------- schema and batches


class FormatReader(Protocol):
    """What grpo-cli asks of a format: each method takes the shard it reads."""

    def schema(self, shard: Shard) -> pa.Schema:
        """The columns (text formats: as inferred from the first block)."""

    def provenance(self, shard: Shard) -> dict[str, Any] | None:
        """grpo-cli's provenance entry, where the format can hold one."""

    def memory_bytes(self, shard: Shard) -> int:
        """Roughly how much memory the shard takes once decoded."""

    def rows(self, shard: Shard) -> int | None:
        """The row count, where the file says so cheaply."""

    def batches(self, shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Record batches of about ``batch_rows`` rows (text formats: one block each)."""

    def where(self, shard: Shard, row: int) -> str:
        """Where the 0-based data ``row`` is, as error messages name it."""


class _Rows:
    """Rows named by their index, no provenance: the base of every reader but the text ones' ``where``."""

    def provenance(self, shard: Shard) -> dict[str, Any] | None:
        return None

    def rows(self, shard: Shard) -> int | None:
        return None

    def where(self, shard: Shard, row: int) -> str:
        return f"{shard.display}, row {row}"


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


class _Text(_Rows):
    def memory_bytes(self, shard: Shard) -> int:
        return shard.size_bytes * (6 if shard.compression else 2)


class JsonlReader(_Text):
    """JSON lines (and JSON arrays, spooled as lines): nesting scanned, integers kept exact,
    types settled over the whole file when they drift, errors on the line."""

    def schema(self, shard: Shard) -> pa.Schema:
        if jsonl_is_empty(shard):
            return pa.schema([])
        stream = _JsonlStream(shard, read_ahead=False, first_block_only=True)  # held in memory: scanned
        with stream as reader:
            stream.refuse_what_the_scan_found()
            return reader.schema

    def batches(self, shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
        yield from _jsonl_batches(shard, columns)

    def where(self, shard: Shard, row: int) -> str:
        line = jsonl_line_of_record(shard, row)
        if line is not None:
            return f"{shard.display}, {shard.record_word} {line}"
        return f"{shard.display}, record {row}"


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


_Item = TypeVar("_Item")


def read_ahead(items: Iterator[_Item], *, depth: int = 1) -> Generator[_Item, None, None]:
    """``items``, produced on a second thread up to ``depth`` items ahead of the consumer.

    Decoding the next batch (pyarrow releases the GIL) overlaps the consumer's work on
    this one. The producer's exception is raised to the consumer where the item would
    have come; a consumer that stops early stops the producer, which closes ``items``.
    The consumer waits for the producer's current item, at most
    :data:`PRODUCER_GRACE_SECONDS` where the run was stopped by Ctrl-C or SIGTERM (it ends on
    time, whatever one item costs): the producer, a daemon thread, stops at its next item.

    >>> list(read_ahead(iter(range(5))))
    [0, 1, 2, 3, 4]
    """
    slots: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                slots.put(entry, timeout=0.05)
                return True
        return False

    def produce() -> None:
        try:
            for item in timed_items("read", items):
                if not offer((False, item)):
                    return
            offer((True, None))
        except BaseException as exc:  # raised again on the consumer's thread
            offer((True, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="grpo-cli-reader", daemon=True)
    thread.start()
    interrupted = False
    try:
        while True:
            finished, value = slots.get()
            if finished:
                if value is not None:
                    raise value
                return
            yield value
    except (KeyboardInterrupt, SystemExit):
        interrupted = True
        raise
    finally:
        stop.set()
        # Stopped by Ctrl-C or SIGTERM: end on time, the daemon stops at its next item.
        # Otherwise wait for it: a library caller running jobs in a loop keeps no thread.
        thread.join(PRODUCER_GRACE_SECONDS if interrupted else None)


PRODUCER_GRACE_SECONDS = 1.0


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


def _checked(shard: Shard, batches: Iterator[pa.RecordBatch], what: str) -> Iterator[pa.RecordBatch]:
    """``batches``, a decoding error becoming one line naming the shard."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            raise read_error(shard.display, exc, f"corrupt {what} data") from None
        try:
            # memory-mapped bytes from another writer: a bad offset would be read as an address
            batch.validate(full=True)
        except (pa.ArrowException, ValueError) as exc:
            raise GrpoError(f"{shard.display}: corrupt {what} data ({first_line(exc)})") from None
        yield batch


def read_error(display: str, exc: BaseException, what: str) -> GrpoError:
    """A read error of the file shown as ``display``, as one line; an encrypted file says so,
    whichever part of it failed."""
    text = first_line(exc)
    if "crypt" in text.lower():
        return GrpoError(
            f"{display}: an encrypted Parquet file; grpo-cli reads no encrypted data (decrypt it first)"
        )
    return GrpoError(f"{display}: {what} ({text})")


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


_Reader = TypeVar("_Reader")


class _TextStream(Generic[_Reader]):
    """A streaming reader of a text shard (JSON lines, CSV); its stream is closed on exit."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self._stream: Any = None

    def __enter__(self) -> _Reader:
        try:
            self._stream = self._source()
            return self._open(self._stream)
        except (pa.ArrowException, OSError) as exc:
            self.close()
            raise self._error(exc) from None

    def _source(self) -> pa.NativeFile:
        return _native_stream(self.shard)

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _open(self, stream: pa.NativeFile) -> _Reader:
        raise NotImplementedError

    def _error(self, exc: BaseException) -> Exception:
        raise NotImplementedError


def _native_stream(shard: Shard) -> pa.NativeFile:
    """The text shard's decompressed bytes as a pyarrow stream: from memory, or from its file."""
    contents = _contents(shard)
    if contents is not None:
        return pa.BufferReader(contents)
    return pa.input_stream(str(shard.path), compression=shard.compression)


def jsonl_block_bytes(shard: Shard) -> int:
    """pyarrow's read block for a JSON lines shard: 8 MiB, or a power of two that holds its
    longest line (a longer line is refused by pyarrow as a 'straddling object').

    >>> from pathlib import Path
    >>> shard = Shard(Path("r.jsonl"), "r.jsonl", "jsonl", 0)
    >>> jsonl_block_bytes(shard) == JSONL_BLOCK_BYTES
    True
    >>> shard.found.longest_line = 20 << 20
    >>> jsonl_block_bytes(shard) >> 20
    32
    """
    longest = shard.found.longest_line
    block = JSONL_BLOCK_BYTES
    while block <= longest:
        block *= 2
    return block


class _JsonlStream(_TextStream["pa_json.JSONStreamingReader"]):
    """pyarrow's streaming JSON reader over a JSON-lines shard: from memory where the run holds
    the file (scanned whole beforehand), else from disk through a :class:`_ScannedJsonl`, which
    scans each line as pyarrow reads it, so that one read of the file is the only one."""

    def __init__(self, shard: Shard, *, read_ahead: bool = True, first_block_only: bool = False) -> None:
        super().__init__(shard)
        self.scanner: _ScannedJsonl | None = None
        self.read_ahead = read_ahead
        self.first_block_only = first_block_only

    def _source(self) -> pa.NativeFile:
        if _contents(self.shard) is not None:
            if not self.shard.found.scanned:  # pyarrow's parser must not see a line nested too deep
                _check_jsonl_nesting(self.shard)
            return _native_stream(self.shard)
        # pyarrow infers the types from its first block; it also reads blocks ahead on its own
        # threads, as many as time allows before the stream is closed, so a schema read ends
        # the stream past the first block's lines: the same types, a bounded read
        stop_after = jsonl_block_bytes(self.shard) if self.first_block_only else None
        self.scanner = _ScannedJsonl(self.shard, stop_after=stop_after)
        return pa.PythonFile(self.scanner, mode="r")

    def refuse_what_the_scan_found(self, schema: pa.Schema | None = None) -> None:
        """Raise what the scan of the lines read so far found: a value nested too deep (the scan
        stopped the stream there), or, given the file's types, an integer a float column rounds."""
        if self.scanner is None:
            return
        if self.scanner.error is not None:
            raise self.scanner.error
        if schema is not None:
            self.scanner.check_integers(schema)

    def _open(self, stream: pa.NativeFile) -> pa_json.JSONStreamingReader:
        schema = self.shard.found.schema
        return pa_json.open_json(
            stream,
            read_options=pa_json.ReadOptions(
                block_size=jsonl_block_bytes(self.shard), use_threads=self.read_ahead
            ),
            parse_options=pa_json.ParseOptions(explicit_schema=schema) if schema is not None else None,
        )

    def _error(self, exc: BaseException) -> Exception:
        """What a read error means: what the scan found first (the scan stopped the stream at a
        line nested too deep; a line longer than pyarrow's block is read again with a larger one),
        then a line the standard library finds malformed. Opening infers the types of the first
        block, so a type error there is within one block, which settling cannot mend."""
        scanner = self.scanner
        if scanner is not None:
            if scanner.error is not None:
                return scanner.error
            if scanner.longest >= jsonl_block_bytes(self.shard):
                self.shard.found.longest_line = scanner.longest
                return JsonlLongLine(self.shard)
        return _jsonl_error(self.shard, exc)


SCAN_CHUNK_BYTES = 8 << 20


class _ScannedJsonl:
    """A JSON-lines file read from disk for pyarrow (through ``pa.PythonFile``), each line scanned
    before pyarrow parses it: a value nested deeper than :data:`~grpo_cli.arrow.columns.MAX_NESTING`
    ends the stream there (pyarrow's parser would overflow its stack) and its error is kept, the
    longest line is noted (pyarrow's block must hold it), and the lines holding long integer
    literals are kept for the exact-integer check (:meth:`check_integers`). Bounded memory: one
    chunk of whole lines. With ``stop_after``, the stream ends at the first line end at or past
    that many bytes."""

    def __init__(self, shard: Shard, *, stop_after: int | None = None) -> None:
        self.shard = shard
        self.stop_after = stop_after
        self.handed_out = 0  # bytes of the chunks scanned and given to the reader
        self._files = contextlib.ExitStack()
        self._chunks = _line_chunks(self._files.enter_context(_open_file(shard)), SCAN_CHUNK_BYTES)
        self._chunk = b""
        self._at = 0
        self.closed = False
        self.error: GrpoError | None = None
        self.longest = 0
        self.integer_lines: list[tuple[int, bytes]] = []

    def read(self, size: int = -1) -> bytes:
        parts = []
        while size != 0 and self.error is None:
            if self._at >= len(self._chunk) and not self._next_chunk():
                break
            end = len(self._chunk) if size < 0 else min(len(self._chunk), self._at + size)
            parts.append(self._chunk[self._at : end])
            size -= end - self._at if size > 0 else 0
            self._at = end
        return b"".join(parts)

    def _next_chunk(self) -> bool:
        if self.stop_after is not None and self.handed_out >= self.stop_after:
            return False
        try:
            line_offset, chunk = next(self._chunks, (0, b""))
        except _FILE_ERRORS as exc:
            self.error = _file_error(self.shard, exc)
            return False
        if not chunk:
            return False
        try:
            self.longest = max(self.longest, _scan_nesting(self.shard, chunk, line_offset))
        except GrpoError as error:
            self.error = error  # pyarrow is given nothing of this chunk
            return False
        self.integer_lines += _long_integer_lines(chunk, line_offset)
        self._chunk, self._at = chunk, 0
        self.handed_out += len(chunk)
        return True

    def check_integers(self, schema: pa.Schema) -> None:
        """Refuse an integer a floating column of ``schema`` rounds, in the lines scanned so far."""
        lines, self.integer_lines = self.integer_lines, []
        _check_integer_lines(self.shard, schema, lines)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._files.close()


TEXT_IN_MEMORY_BYTES = 64 << 20
"""A JSON-lines or CSV file up to this size (decompressed) is read from disk once per run and
scanned, typed and parsed from memory: its hardening scans would otherwise each read it again.
Small beside the memory a run takes anyway; a run whose inputs fit its memory budget with their
text held too lets a larger file be held (:func:`hold_text_within`)."""


def _text_bytes(shard: Shard) -> int:
    """A text shard's decompressed size, estimated from its size on disk."""
    return shard.size_bytes * (6 if shard.compression else 1)


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


def _contents(shard: Shard) -> bytes | None:
    """The text shard's decompressed bytes, read once and kept for the run, where they fit
    :data:`TEXT_IN_MEMORY_BYTES` or what the run lets it hold; ``None`` for a larger file (each
    pass streams it)."""
    found = shard.found
    if found.contents is not None:
        return found.contents
    limit = max(TEXT_IN_MEMORY_BYTES, found.hold_up_to)
    if shard.format not in ("jsonl", "csv") or _text_bytes(shard) > limit or not shard.path.is_file():
        return None
    with _open_file(shard) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        return None
    found.contents = data
    return data


@contextlib.contextmanager
def _open_jsonl(shard: Shard) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed (from memory where :func:`_contents` holds them); a corrupt
    gzip stream becomes one clear error."""
    contents = _contents(shard)
    if contents is not None:
        yield io.BytesIO(contents)
        return
    with _open_file(shard) as handle:
        yield handle


_FILE_ERRORS = (OSError, EOFError, zlib.error, pa.ArrowException)


@contextlib.contextmanager
def _open_file(shard: Shard) -> Iterator[IO[bytes]]:
    try:
        with decompressed(shard.path, shard.compression) as handle:
            yield handle
    except _FILE_ERRORS as exc:
        raise _file_error(shard, exc) from None


def _file_error(shard: Shard, exc: BaseException) -> GrpoError:
    if shard.compression and not isinstance(exc, FileNotFoundError | PermissionError):
        return GrpoError(f"{shard.display}: not a readable {shard.compression} file ({first_line(exc)})")
    return GrpoError(f"{shard.display}: cannot read the file ({first_line(exc)})")


def jsonl_is_empty(shard: Shard) -> bool:
    with _open_jsonl(shard) as handle:
        return all(not line.strip() for line in handle)


def _jsonl_batches(shard: Shard, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    if jsonl_is_empty(shard):
        return
    stream = _JsonlStream(shard)
    with stream as reader:
        schema = reader.schema
        if stream.scanner is None:
            _check_exact_integers(shard, schema)  # held in memory: scanned whole, from memory
        while True:
            try:
                batch = reader.read_next_batch()
                batch.validate(full=True)  # the JSON reader passes invalid UTF-8 through
            except StopIteration:
                stream.refuse_what_the_scan_found(schema)
                return
            except (pa.ArrowException, OSError) as exc:
                stream.refuse_what_the_scan_found()
                if _is_schema_drift(exc) and shard.found.schema is None:
                    raise JsonlSchemaDrift(shard) from None
                raise stream._error(exc) from None
            stream.refuse_what_the_scan_found(schema)
            yield batch.select(columns) if columns is not None else batch


class SchemaDrift(Exception):
    """A column's type, inferred from a text file's first block, does not fit a later block.

    The engine catches it, calls :meth:`settle` (which records the types to read the
    file with) and runs again; nothing was written by the failed attempt.
    """

    def __init__(self, shard: Shard) -> None:
        super().__init__(shard.display)
        self.shard = shard

    def settle(self) -> None:
        raise NotImplementedError


class JsonlLongLine(SchemaDrift):
    """A streamed JSON-lines file holds a line longer than pyarrow's read block: the scan noted its
    length (``shard.found.longest_line``), and the run reads the file again with a block that holds it."""

    def settle(self) -> None:
        return None


class JsonlSchemaDrift(SchemaDrift):
    """A JSONL column changed type, or a new field appeared: the whole file's types are
    inferred chunk by chunk and unified (:func:`unify_jsonl_schema`)."""

    def settle(self) -> None:
        unify_jsonl_schema(self.shard)


class _CsvStream(_TextStream["pa_csv.CSVStreamingReader"]):
    """Every CSV column is read as its text: type inference would merge the keys ``007``,
    ``07`` and ``7``, turn ``N/A`` into a null and ``001`` into ``1.0``. An unquoted empty
    cell is a null (a quoted ``""`` is the empty string); the columns grpo-cli computes
    from are parsed as numbers where they are read (:func:`~grpo_cli.run.rewards.numbers_from_text`)."""

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


def _line_chunks(handle: IO[bytes], chunk_bytes: int) -> Iterator[tuple[int, bytes]]:
    """A file of lines in chunks of whole lines (``chunk_bytes``, then the rest of the line it
    ends in), each with the number of lines before it.

    >>> list(_line_chunks(io.BytesIO(b"ab\\ncd\\ne"), 1))
    [(0, b'ab\\n'), (1, b'cd\\n'), (2, b'e')]
    """
    line_offset = 0
    while chunk := handle.read(chunk_bytes):
        chunk += handle.readline()
        yield line_offset, chunk
        line_offset += chunk.count(b"\n")


def _is_schema_drift(exc: Exception) -> bool:
    """Whether pyarrow refused a later block of a JSON lines file for its types (a number then a
    string, an integer then a float, a new field), not for its text."""
    text = str(exc)
    return "Failed to convert JSON" in text or "changed from" in text or "unexpected field" in text


def unify_jsonl_schema(shard: Shard, chunk_bytes: int = 32 << 20) -> pa.Schema:
    """The types and fields of the whole file: each line-aligned chunk inferred, then unified;
    recorded on the shard (``shard.found.schema``) for the run's next attempt."""
    schemas = []
    with _open_jsonl(shard) as handle:
        for _, chunk in _line_chunks(handle, chunk_bytes):
            if not chunk.strip():
                continue
            try:
                schemas.append(pa_json.read_json(pa.BufferReader(chunk)).schema)
            except pa.ArrowException as exc:
                raise _jsonl_error(shard, exc) from None
    try:
        schema = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowException, TypeError) as exc:
        raise GrpoError(
            f"{shard.display}: a column holds values of incompatible types ({first_line(exc)})"
        ) from None
    shard.found.schema = schema
    return schema


def _check_exact_integers(shard: Shard, schema: pa.Schema, chunk_bytes: int = 32 << 20) -> None:
    """Refuse an integer that a floating-point column would round (IDs past 2**53 or 2**63).

    pyarrow reads a JSON integer as float64 when it exceeds int64 or shares its column
    with floats. A fast scan finds the lines with long digit runs; only those are parsed.
    """
    key = str(schema)
    if not _floating(schema) or key in shard.found.exact_integers:
        return
    with _open_jsonl(shard) as handle:
        for line_offset, chunk in _line_chunks(handle, chunk_bytes):
            _check_integer_lines(shard, schema, _long_integer_lines(chunk, line_offset))
    shard.found.exact_integers.add(key)


def _floating(schema: pa.Schema) -> list[pa.Field]:
    return [f for f in schema if holds_type(f.type, pa.types.is_floating)]


def _long_integer_lines(chunk: bytes, line_offset: int) -> list[tuple[int, bytes]]:
    """The lines of a chunk of whole lines that hold an integer literal of 16 digits or more, each
    with its 1-based number in the file (``line_offset`` lines come before the chunk).

    A run of 16 digits or more is taken for an integer literal where JSON puts a value: after a
    ``:``, ``[``, ``,`` or a blank (a ``-`` between), and before a ``,``, ``]``, ``}``, a blank or
    the line's end. So a fraction or an exponent (a float64 written in full has 16 fraction
    digits on every line) and the digits of a text ID (``"000000000000000000a1"``) are passed
    over. Found with vectorised byte comparisons, linear in the chunk; a run inside a string
    that looks like a value is parsed with its line, and its column's type decides.

    >>> _long_integer_lines(b'{"a": 0.1234567890123456789}\\n{"b": -12345678901234567}\\n', 4)
    [(6, b'{"b": -12345678901234567}')]
    >>> _long_integer_lines(b'{"id": "00000000000000000000a1", "n": "12345678901234567"}\\n', 0)
    []
    """
    import numpy as np

    data = np.frombuffer(chunk, dtype=np.uint8)
    if data.size < _LONG_DIGITS:
        return []
    digit = (data >= ord("0")) & (data <= ord("9"))
    edges = np.diff(digit.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)  # runs [start, end)
    long = ends - starts >= _LONG_DIGITS
    starts, ends = starts[long], ends[long]
    if not starts.size:
        return []
    before = np.where(starts > 0, data[np.maximum(starts - 1, 0)], ord(" "))
    two_before = np.where(starts > 1, data[np.maximum(starts - 2, 0)], ord(" "))
    after = np.where(ends < data.size, data[np.minimum(ends, data.size - 1)], ord(" "))

    def one_of(values: Any, marks: bytes) -> Any:
        return np.isin(values, np.frombuffer(marks, dtype=np.uint8))

    negative = (before == ord("-")) & one_of(two_before, _BEFORE_A_VALUE)
    literal = (one_of(before, _BEFORE_A_VALUE) | negative) & (
        one_of(after, _AFTER_A_VALUE) | (ends == data.size)
    )
    starts = starts[literal]
    if not starts.size:
        return []
    newlines = np.flatnonzero(data == ord("\n"))
    lines = np.unique(np.searchsorted(newlines, starts))  # the line index of each literal
    found = []
    for line in lines.tolist():
        begin = int(newlines[line - 1]) + 1 if line > 0 else 0
        stop = int(newlines[line]) if line < newlines.size else len(chunk)
        found.append((line_offset + line + 1, chunk[begin:stop]))
    return found


_LONG_DIGITS = 16
_BEFORE_A_VALUE = b":[, \t"
_AFTER_A_VALUE = b",]} \t\r\n"


def _check_integer_lines(shard: Shard, schema: pa.Schema, lines: list[tuple[int, bytes]]) -> None:
    """Refuse the first integer of ``lines`` that a floating column of ``schema`` would round."""
    floating = _floating(schema)
    for number, line in lines if floating else ():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # pyarrow reports malformed lines with their number
        if not isinstance(record, dict):
            continue
        for column in floating:
            value = _inexact_integer(record.get(column.name), column.type)
            if value is not None:
                raise GrpoError(
                    f"{shard.display}, {shard.record_word} {number}: the integer {value} in column "
                    f"{column.name!r} cannot be kept exactly (the column is read as "
                    f"{column.type}); write it as a string"
                )


def _inexact_integer(value: Any, data_type: pa.DataType) -> int | None:
    """An integer inside ``value`` that ``data_type`` (floating somewhere) would round,
    or that pyarrow made a float because it exceeds int64."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        beyond_int64 = not -(1 << 63) <= value < (1 << 63)
        if pa.types.is_floating(data_type) and (beyond_int64 or int(float(value)) != value):
            return value
        return None
    if isinstance(value, dict) and pa.types.is_struct(data_type):
        for i in range(data_type.num_fields):
            child = data_type.field(i)
            found = _inexact_integer(value.get(child.name), child.type)
            if found is not None:
                return found
    if isinstance(value, list) and (pa.types.is_list(data_type) or pa.types.is_large_list(data_type)):
        for item in value:
            found = _inexact_integer(item, data_type.value_type)
            if found is not None:
                return found
    return None


_TYPE_CHANGE = re.compile(r"Column\(/?([^)]*)\) changed from (\w+) to (\w+)")
_JSON_KINDS: dict[str, type | tuple[type, ...]] = {
    "number": (int, float),
    "string": str,
    "object": dict,
    "array": list,
    "boolean": bool,
}


def _jsonl_error(shard: Shard, exc: BaseException) -> GrpoError:
    """Find the offending line with the standard library: pyarrow only counts records (within
    its block), and says where a column's values change type in no line at all."""
    location = _first_bad_jsonl_line(shard)
    if location is not None:
        line, reason = location
        what = "JSON array" if shard.record_word == "element" else "JSONL"
        return GrpoError(f"{shard.display}, {shard.record_word} {line}: malformed {what} ({reason})")
    if shard.compression and isinstance(exc, OSError):
        return GrpoError(f"{shard.display}: not a readable {shard.compression} file ({first_line(exc)})")
    change = _TYPE_CHANGE.search(str(exc))
    if change is not None:
        column, before, after = change.groups()
        path = column.split("/")
        changed = _type_change_line(shard, path, before, after)
        if changed is not None:
            line, first = changed
            where = f"{shard.record_word} {first}" if first < line else "the same line, before it,"
            return GrpoError(
                f"{shard.display}, {shard.record_word} {line}: column {_path_text(path)!r} holds "
                f"{_a(after)} where {where} holds {_a(before)}; a column's values must share a type"
            )
    return GrpoError(f"{shard.display}: cannot read the JSONL file ({first_line(exc)})")


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _json_kind(value: Any) -> str:
    """A JSON value's kind as pyarrow's JSON reader words it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return next(kind for kind, types in _JSON_KINDS.items() if isinstance(value, types))


def _path_text(path: list[str]) -> str:
    """pyarrow's column path (``a/[]/b``, ``[]`` for a list's elements) as ``a[].b``."""
    text = ""
    for key in path:
        text += key if key == "[]" or not text else f".{key}"
    return text


def _kinds_at(value: Any, path: list[str]) -> Iterator[str]:
    """The kinds of the values at ``path`` within one record, in the order the text gives them;
    ``[]`` steps into each element of a list."""
    if not path:
        yield _json_kind(value)
        return
    key, rest = path[0], path[1:]
    if key == "[]":
        for item in value if isinstance(value, list) else ():
            yield from _kinds_at(item, rest)
    else:
        yield from _kinds_at(value.get(key) if isinstance(value, dict) else None, rest)


def _type_change_line(shard: Shard, path: list[str], before: str, after: str) -> tuple[int, int] | None:
    """The first line with a value at ``path`` of kind ``after`` once a value of kind ``before``
    came before it (on an earlier line or earlier on the same one), and the line of that first
    ``before``."""
    first_before: int | None = None
    with _open_jsonl(shard) as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            for kind in _kinds_at(json.loads(raw), path):
                if kind == after and first_before is not None:
                    return number, first_before
                if kind == before and first_before is None:
                    first_before = number
    return None


def _first_bad_jsonl_line(shard: Shard) -> tuple[int, str] | None:
    with _open_jsonl(shard) as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return number, f"invalid UTF-8 at byte {err.start + 1} of the line"
            if not text.strip():
                continue
            try:
                value = json.loads(text.rstrip("\r\n"))  # a column past the line's end is no help
            except json.JSONDecodeError as err:
                return number, f"{err.msg} at column {err.colno}"
            if not isinstance(value, dict):
                return number, f"expected a JSON object, got {type(value).__name__}"
            if not _encodable(value):
                return number, "a string escapes a lone UTF-16 surrogate (not valid Unicode)"
    return None


def _encodable(value: Any) -> bool:
    """Whether every string in a parsed JSON value is valid Unicode (no lone surrogates)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_encodable(k) and _encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_encodable(v) for v in value)
    return True


def jsonl_line_of_record(shard: Shard, record: int) -> int | None:
    """The 1-based line of the 0-based ``record`` (blank lines do not count as records)."""
    seen = -1
    with _open_jsonl(shard) as handle:
        for number, text in enumerate(handle, start=1):
            if text.strip():
                seen += 1
                if seen == record:
                    return number
    return None


def _check_jsonl_nesting(shard: Shard, chunk_bytes: int = 32 << 20) -> None:
    """Refuse a JSON line nested deeper than :data:`~grpo_cli.arrow.columns.MAX_NESTING` before
    pyarrow's parser sees it: about 20,000 levels overflow its stack (a segfault). Notes the
    longest line in ``shard.found``: pyarrow's read block must hold a whole line. (A file that
    streams from disk is scanned as pyarrow reads it: :class:`_ScannedJsonl`.)"""
    longest = 0
    with _open_jsonl(shard) as handle:
        for line_offset, chunk in _line_chunks(handle, chunk_bytes):
            longest = max(longest, _scan_nesting(shard, chunk, line_offset))
    shard.found.longest_line = longest
    shard.found.scanned = True


def _scan_nesting(shard: Shard, chunk: bytes, line_offset: int) -> int:
    """The longest line of a chunk of whole lines (``line_offset`` lines come before it); a value
    nested deeper than :data:`~grpo_cli.arrow.columns.MAX_NESTING` is refused with its line.

    A line cannot nest deeper than it has ``[`` and ``{``: a vectorised count per line finds
    the few lines with more, and only those are scanned, strings skipped.
    """
    import numpy as np

    data = np.frombuffer(chunk, dtype=np.uint8)
    if not data.size:
        return 0
    ends = np.flatnonzero(data == ord("\n"))
    longest = int(np.diff(np.concatenate(([-1], ends, [data.size]))).max())
    starts = np.concatenate(([0], ends + 1))
    brackets = np.flatnonzero((data == ord("[")) | (data == ord("{")))  # a few a line: small
    counts = np.bincount(np.searchsorted(ends, brackets), minlength=starts.size)
    for line in np.flatnonzero(counts > MAX_NESTING).tolist():
        end = int(ends[line]) if line < ends.size else data.size
        depth = _json_depth(chunk[int(starts[line]) : end])
        if depth > MAX_NESTING:
            raise GrpoError(
                f"{shard.display}, {shard.record_word} {line_offset + line + 1}: a value nests "
                f"{depth:,} levels deep; grpo-cli reads at most {MAX_NESTING}"
            )
    return longest


def _json_depth(line: bytes) -> int:
    """The deepest ``[``/``{`` nesting of one JSON text, brackets inside strings not counted."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest
