"""Finding and reading rollout files: Parquet and JSONL, single files, shards, globs, stdin.

Every read error becomes a :class:`~grpo_cli.errors.GrpoError` naming the file (and the
line, for JSONL).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from grpo_cli.errors import GrpoError

PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
FORMATS = ("parquet", "jsonl")
JSONL_BLOCK_BYTES = 8 << 20


@dataclass(frozen=True)
class Shard:
    """One input file."""

    path: Path
    display: str
    format: str  # "parquet" | "jsonl"
    size_bytes: int

    @property
    def gzipped(self) -> bool:
        return self.path.name.endswith(".gz")

    @property
    def row_noun(self) -> str:
        return "record" if self.format == "jsonl" else "row"


def detect_format(path: str, override: str | None) -> str | None:
    if override:
        return override
    name = path.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return None


class InputSet:
    """The shards an INPUT argument names; owns the spooled copy of standard input.

    INPUT is a file, a directory of shards, a quoted glob, or ``-`` for JSONL on stdin.
    Use as a context manager so that the spooled stdin copy is removed.
    """

    def __init__(self, spec: str, *, input_format: str | None = None, stdin: IO[bytes] | None = None) -> None:
        if input_format is not None and input_format not in FORMATS:
            raise GrpoError(f"--input-format must be one of {', '.join(FORMATS)}, got {input_format!r}")
        self.spec = spec
        self._spool: Path | None = None
        self.shards = self._resolve(spec, input_format, stdin)

    def __enter__(self) -> InputSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._spool is not None:
            self._spool.unlink(missing_ok=True)
            self._spool = None

    @property
    def is_stdin(self) -> bool:
        return self.spec == "-"

    @property
    def total_bytes(self) -> int:
        return sum(s.size_bytes for s in self.shards)

    def _resolve(self, spec: str, input_format: str | None, stdin: IO[bytes] | None) -> list[Shard]:
        if spec == "-":
            if input_format == "parquet":
                raise GrpoError("standard input ('-') is read as JSONL; Parquet needs a file")
            return [self._spool_stdin(stdin or sys.stdin.buffer)]
        if any(ch in spec for ch in "*?["):
            matches = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
            shards = [s for s in (self._shard(m, input_format, strict=False) for m in matches) if s]
            if not shards:
                raise GrpoError(f"{spec}: the pattern matches no Parquet or JSONL file")
            return shards
        path = Path(spec)
        if path.is_dir():
            entries = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
            shards = [s for s in (self._shard(str(p), input_format, strict=False) for p in entries) if s]
            if not shards:
                raise GrpoError(f"{spec}: the directory holds no Parquet or JSONL file")
            formats = {s.format for s in shards}
            if len(formats) > 1:
                raise GrpoError(
                    f"{spec}: the directory mixes Parquet and JSONL shards; use a glob to pick one"
                )
            return shards
        if not path.exists():
            raise GrpoError(f"{spec}: no such file or directory")
        shard = self._shard(spec, input_format, strict=True)
        assert shard is not None
        return [shard]

    def _shard(self, path: str, input_format: str | None, *, strict: bool) -> Shard | None:
        fmt = detect_format(path, input_format)
        if fmt is None:
            if strict:
                raise GrpoError(
                    f"{path}: cannot tell the format from the name; expected "
                    f"{', '.join(PARQUET_SUFFIXES + JSONL_SUFFIXES)} or --input-format parquet|jsonl"
                )
            return None
        try:
            size = os.path.getsize(path)
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise GrpoError(f"{path}: cannot read the file ({exc.strerror})") from None
        return Shard(Path(path), path, fmt, size)

    def _spool_stdin(self, stream: IO[bytes]) -> Shard:
        # Two passes need to read the data twice: keep a private copy of the stream.
        fd, name = tempfile.mkstemp(prefix="grpo-cli-stdin-", suffix=".jsonl")
        self._spool = Path(name)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(stream, out, 1 << 20)
        return Shard(self._spool, "<stdin>", "jsonl", self._spool.stat().st_size)


# --------------------------------------------------------------------------- schema and batches


def read_schema(shard: Shard) -> pa.Schema:
    """The shard's schema (for JSONL: as inferred from its first block)."""
    if shard.format == "parquet":
        try:
            return pq.read_schema(shard.path)
        except (pa.ArrowException, OSError) as exc:
            raise GrpoError(f"{shard.display}: not a readable Parquet file ({_first_line(exc)})") from None
    if jsonl_is_empty(shard):
        return pa.schema([])
    with _jsonl_reader(shard) as reader:
        return reader.schema


def estimated_memory_bytes(shard: Shard) -> int:
    """Roughly how much memory the shard takes once decoded."""
    if shard.format == "parquet":
        try:
            meta = pq.read_metadata(shard.path)
        except (pa.ArrowException, OSError) as exc:
            raise GrpoError(f"{shard.display}: not a readable Parquet file ({_first_line(exc)})") from None
        return int(sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)))
    return shard.size_bytes * (6 if shard.gzipped else 2)


def row_count(shard: Shard) -> int | None:
    """Rows in the shard when the file says so cheaply (Parquet), else ``None``."""
    if shard.format != "parquet":
        return None
    try:
        return int(pq.read_metadata(shard.path).num_rows)
    except (pa.ArrowException, OSError):
        return None


def iter_batches(shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches of the shard, optionally only some columns."""
    if shard.format == "parquet":
        yield from _parquet_batches(shard, columns, batch_rows)
    else:
        yield from _jsonl_batches(shard, columns)


def read_table(shard: Shard) -> pa.Table:
    """A whole Parquet shard, decoded in parallel."""
    try:
        return pq.read_table(shard.path)
    except (pa.ArrowException, OSError) as exc:
        raise GrpoError(f"{shard.display}: corrupt Parquet data ({_first_line(exc)})") from None


def _parquet_batches(shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
    try:
        # pre_buffer would read the whole file ahead: memory must stay bounded by a batch.
        file = pq.ParquetFile(shard.path, pre_buffer=False)
    except (pa.ArrowException, OSError) as exc:
        raise GrpoError(f"{shard.display}: not a readable Parquet file ({_first_line(exc)})") from None
    with file:
        batches = file.iter_batches(batch_size=batch_rows, columns=columns, use_threads=True)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as exc:
                raise GrpoError(f"{shard.display}: corrupt Parquet data ({_first_line(exc)})") from None
            yield batch


class _JsonlReader:
    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self._stream: Any = None

    def __enter__(self) -> pa_json.JSONStreamingReader:
        try:
            self._stream = pa.input_stream(
                str(self.shard.path), compression="gzip" if self.shard.gzipped else None
            )
            schema = _UNIFIED_JSONL_SCHEMAS.get(_jsonl_key(self.shard))
            return pa_json.open_json(
                self._stream,
                read_options=pa_json.ReadOptions(block_size=JSONL_BLOCK_BYTES),
                parse_options=pa_json.ParseOptions(explicit_schema=schema) if schema is not None else None,
            )
        except pa.ArrowException as exc:
            self.close()
            raise _jsonl_error(self.shard, exc) from None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def _jsonl_reader(shard: Shard) -> _JsonlReader:
    return _JsonlReader(shard)


def jsonl_is_empty(shard: Shard) -> bool:
    opener: Any = gzip.open if shard.gzipped else open
    with opener(shard.path, "rb") as handle:
        return all(not line.strip() for line in handle)


def _jsonl_batches(shard: Shard, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    if jsonl_is_empty(shard):
        return
    with _jsonl_reader(shard) as reader:
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except pa.ArrowException as exc:
                if _is_schema_drift(exc) and _jsonl_key(shard) not in _UNIFIED_JSONL_SCHEMAS:
                    raise JsonlSchemaDrift(shard) from None
                raise _jsonl_error(shard, exc) from None
            yield batch.select(columns) if columns is not None else batch


class JsonlSchemaDrift(Exception):
    """A JSONL column changed type after the first block (0/1 rewards, then 0.5).

    pyarrow infers a JSONL file's types from its first block; the engine catches this,
    calls :func:`unify_jsonl_schema` and runs again with the types of the whole file.
    """

    def __init__(self, shard: Shard) -> None:
        super().__init__(shard.display)
        self.shard = shard


_UNIFIED_JSONL_SCHEMAS: dict[tuple[str, int, float], pa.Schema] = {}


def _jsonl_key(shard: Shard) -> tuple[str, int, float]:
    stat = shard.path.stat()
    return str(shard.path), stat.st_size, stat.st_mtime


def _is_schema_drift(exc: Exception) -> bool:
    text = str(exc)
    return "Failed to convert JSON" in text or "changed from" in text or "Column(" in text


def unify_jsonl_schema(shard: Shard, chunk_bytes: int = 32 << 20) -> pa.Schema:
    """The types of the whole file: each line-aligned chunk inferred, then unified (int -> float)."""
    opener: Any = gzip.open if shard.gzipped else open
    schemas = []
    with opener(shard.path, "rb") as handle:
        while True:
            chunk = handle.read(chunk_bytes)
            if not chunk:
                break
            chunk += handle.readline()  # finish the last line
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
            f"{shard.display}: a column holds values of incompatible types ({_first_line(exc)})"
        ) from None
    _UNIFIED_JSONL_SCHEMAS[_jsonl_key(shard)] = schema
    return schema


def _jsonl_error(shard: Shard, exc: Exception) -> GrpoError:
    """Find the offending line with the standard library: pyarrow only counts records."""
    try:
        location = _first_bad_jsonl_line(shard)
    except (OSError, EOFError, UnicodeDecodeError) as read_error:
        return GrpoError(f"{shard.display}: cannot read the JSONL file ({read_error})")
    if location is not None:
        line, reason = location
        return GrpoError(f"{shard.display}, line {line}: malformed JSONL ({reason})")
    return GrpoError(f"{shard.display}: cannot read the JSONL file ({_first_line(exc)})")


def _first_bad_jsonl_line(shard: Shard) -> tuple[int, str] | None:
    opener: Any = gzip.open if shard.gzipped else open
    with opener(shard.path, "rt", encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as err:
                return number, f"{err.msg} at column {err.colno}"
            if not isinstance(value, dict):
                return number, f"expected a JSON object, got {type(value).__name__}"
    return None


def jsonl_line_of_record(shard: Shard, record: int) -> int | None:
    """The 1-based line of the 0-based ``record`` (blank lines do not count as records)."""
    opener: Any = gzip.open if shard.gzipped else open
    seen = -1
    with opener(shard.path, "rb") as handle:
        for number, text in enumerate(handle, start=1):
            if text.strip():
                seen += 1
                if seen == record:
                    return number
    return None


def describe_row(shard: Shard, row: int) -> str:
    """``data.parquet, row 17`` or ``data.jsonl, line 18`` for error messages."""
    if shard.format == "jsonl":
        line = jsonl_line_of_record(shard, row)
        if line is not None:
            return f"{shard.display}, line {line}"
        return f"{shard.display}, record {row}"
    return f"{shard.display}, row {row}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
