"""JSON lines (and JSON arrays, spooled as lines): nesting scanned, integers kept exact, types
settled over the whole file when they drift, every error on its line."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json

from grpo_cli.arrow.columns import MAX_NESTING, holds_type
from grpo_cli.errors import GrpoError, first_line
from grpo_cli.inputs.readers.text import (
    _FILE_ERRORS,
    SchemaDrift,
    _contents,
    _file_error,
    _is_schema_drift,
    _line_chunks,
    _native_stream,
    _open_file,
    _open_jsonl,
    _Text,
    _TextStream,
    jsonl_block_bytes,
)
from grpo_cli.inputs.sources import Shard


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
