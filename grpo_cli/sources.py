"""Finding and reading rollout files: Parquet and JSONL, single files, shards, globs, stdin.

Every read error becomes a :class:`~grpo_cli.errors.GrpoError` naming the file (and the
line, for JSONL).
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import json
import os
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from grpo_cli.choices import InputFormat, check_choice
from grpo_cli.errors import GrpoError
from grpo_cli.guard import OTHER_DATA_SUFFIXES, PROVENANCE_KEY, ProtectedInputs, spool

PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
JSONL_BLOCK_BYTES = 8 << 20
_GLOB_CHARS = "*?["


@dataclass(frozen=True)
class Shard:
    """One input file."""

    path: Path
    display: str
    format: InputFormat
    size_bytes: int
    gzipped: bool = False


def detect_format(path: str, override: InputFormat | None) -> InputFormat | None:
    if override:
        return override
    name = path.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return None


class InputSet:
    """The shards an INPUT argument names; owns the spooled copies of streams.

    INPUT is a file, a directory of shards, a quoted glob, or ``-`` for standard input
    (JSONL, or Parquet told by its first bytes). A path that exists is read as that
    file, even when its name holds glob characters. A pipe (``<(cat x.jsonl)``) is
    copied once to a private temporary file, like standard input, since it can be read
    only once. Use as a context manager so that those copies are removed.
    """

    def __init__(
        self, spec: str, *, input_format: InputFormat | None = None, stdin: IO[bytes] | None = None
    ) -> None:
        if input_format is not None:
            check_choice("--input-format", input_format, InputFormat)
        self.spec = spec
        self._spools = contextlib.ExitStack()
        self.directories: list[Path] = []
        try:
            self.shards = self._resolve(spec, input_format, stdin)
        except BaseException:
            self._spools.close()
            raise

    def __enter__(self) -> InputSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._spools.close()

    @property
    def is_stdin(self) -> bool:
        return self.spec == "-"

    @property
    def total_bytes(self) -> int:
        return sum(s.size_bytes for s in self.shards)

    def protected(self) -> ProtectedInputs:
        """What no output of this run may touch: every input file and directory named."""
        files = [(s.path, s.display) for s in self.shards if not s.display.startswith("<")]
        return ProtectedInputs.of(files, self.directories)

    def _resolve(self, spec: str, input_format: InputFormat | None, stdin: IO[bytes] | None) -> list[Shard]:
        if spec == "-":
            return [self._spooled(stdin or sys.stdin.buffer, "<stdin>", input_format)]
        path = Path(spec)
        if not os.path.exists(spec) and any(ch in spec for ch in _GLOB_CHARS):
            matches = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
            shards = self._readable(spec, [Path(m) for m in matches], input_format, "the pattern matches")
            if not shards:
                raise GrpoError(f"{spec}: the pattern matches no Parquet or JSONL file")
            return shards
        if path.is_dir():
            self.directories.append(path)
            entries = sorted(p for p in path.iterdir() if not p.name.startswith((".", "_")))
            nested = [p for p in entries if p.is_dir() and _holds_data(p)]
            if nested:
                names = ", ".join(p.name for p in nested[:3]) + (", ..." if len(nested) > 3 else "")
                raise GrpoError(
                    f"{spec}: holds subfolders with data files ({names}); grpo-cli reads the files of one "
                    f"folder: pass a quoted glob such as '{path / '**' / '*.parquet'}' to read them all"
                )
            files = [p for p in entries if p.is_file()]
            shards = self._readable(spec, files, input_format, "the directory holds")
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
        if not path.is_file():  # a pipe or a device: it can be read only once
            try:
                stream = open(path, "rb")  # noqa: SIM115 (closed by the ExitStack)
            except OSError as exc:
                raise GrpoError(f"{spec}: cannot read it ({exc.strerror})") from None
            self._spools.enter_context(stream)
            return [self._spooled(stream, spec, input_format or detect_format(spec, None))]
        shard = self._shard(spec, input_format, strict=True)
        assert shard is not None
        return [shard]

    def _readable(
        self, spec: str, files: list[Path], input_format: InputFormat | None, where: str
    ) -> list[Shard]:
        """The shards among ``files``; a data file of another format is refused, not skipped."""
        shards = []
        for file in files:
            shard = self._shard(str(file), input_format, strict=False)
            if shard is not None:
                shards.append(shard)
            elif file.name.lower().endswith(OTHER_DATA_SUFFIXES):
                raise GrpoError(
                    f"{spec}: {where} {file.name}, a format grpo-cli does not read (Parquet and JSONL "
                    "only); move it out or name the files to read with a glob"
                )
        return shards

    def _shard(self, path: str, input_format: InputFormat | None, *, strict: bool) -> Shard | None:
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
        return Shard(Path(path), path, fmt, size, gzipped=path.lower().endswith(".gz"))

    def _spooled(self, stream: IO[bytes], label: str, input_format: InputFormat | None) -> Shard:
        # Two passes read the data twice: keep a private copy of a stream.
        path = self._spools.enter_context(spool(stream, label=label))
        with open(path, "rb") as handle:
            magic = handle.read(4)
        fmt = input_format or ("parquet" if magic == b"PAR1" else "jsonl")
        gzipped = magic[:2] == b"\x1f\x8b"
        return Shard(path, label, fmt, path.stat().st_size, gzipped=gzipped)


def _holds_data(folder: Path) -> bool:
    """Whether a folder holds, at any depth, a file that looks like data."""
    suffixes = PARQUET_SUFFIXES + JSONL_SUFFIXES + OTHER_DATA_SUFFIXES
    return any(name.lower().endswith(suffixes) for _, _, files in os.walk(folder) for name in files)


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
    with _JsonlReader(shard) as reader:
        return reader.schema


def read_provenance(shard: Shard) -> dict[str, Any] | None:
    """The ``grpo_cli`` provenance entry of a Parquet shard grpo-cli wrote, or ``None``."""
    if shard.format != "parquet":
        return None
    try:
        metadata = pq.read_metadata(shard.path).metadata or {}
    except (pa.ArrowException, OSError) as exc:
        raise GrpoError(f"{shard.display}: not a readable Parquet file ({_first_line(exc)})") from None
    raw = metadata.get(PROVENANCE_KEY)
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        raise GrpoError(f"{shard.display}: its grpo-cli provenance entry is not valid JSON") from None
    if not isinstance(record, dict):
        raise GrpoError(f"{shard.display}: its grpo-cli provenance entry is not a JSON object")
    return record


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
        except (pa.ArrowException, OSError) as exc:
            self.close()
            if _is_schema_drift(exc) and _jsonl_key(self.shard) not in _UNIFIED_JSONL_SCHEMAS:
                raise JsonlSchemaDrift(self.shard) from None
            raise _jsonl_error(self.shard, exc) from None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


@contextlib.contextmanager
def _open_jsonl(shard: Shard) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed; a corrupt gzip stream becomes one clear error."""
    try:
        handle: IO[bytes]
        with gzip.open(shard.path, "rb") if shard.gzipped else open(shard.path, "rb") as handle:  # type: ignore[assignment]
            yield handle
    except (OSError, EOFError, zlib.error) as exc:
        if shard.gzipped and not isinstance(exc, FileNotFoundError | PermissionError):
            raise GrpoError(f"{shard.display}: not a readable gzip file ({_first_line(exc)})") from None
        raise GrpoError(f"{shard.display}: cannot read the file ({_first_line(exc)})") from None


def jsonl_is_empty(shard: Shard) -> bool:
    with _open_jsonl(shard) as handle:
        return all(not line.strip() for line in handle)


def _jsonl_batches(shard: Shard, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    if jsonl_is_empty(shard):
        return
    with _JsonlReader(shard) as reader:
        _check_exact_integers(shard, reader.schema)
        while True:
            try:
                batch = reader.read_next_batch()
                batch.validate(full=True)  # the JSON reader passes invalid UTF-8 through
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as exc:
                if _is_schema_drift(exc) and _jsonl_key(shard) not in _UNIFIED_JSONL_SCHEMAS:
                    raise JsonlSchemaDrift(shard) from None
                raise _jsonl_error(shard, exc) from None
            yield batch.select(columns) if columns is not None else batch


class JsonlSchemaDrift(Exception):
    """A JSONL column changed type, or a new field appeared, after the first block.

    pyarrow infers a JSONL file's types from its first block; the engine catches this,
    calls :func:`unify_jsonl_schema` and runs again with the types of the whole file.
    """

    def __init__(self, shard: Shard) -> None:
        super().__init__(shard.display)
        self.shard = shard


_UNIFIED_JSONL_SCHEMAS: dict[tuple[str, int, float], pa.Schema] = {}
_EXACT_INTEGERS_CHECKED: set[tuple[tuple[str, int, float], str]] = set()


def _jsonl_key(shard: Shard) -> tuple[str, int, float]:
    stat = shard.path.stat()
    return str(shard.path), stat.st_size, stat.st_mtime


def _is_schema_drift(exc: Exception) -> bool:
    text = str(exc)
    return (
        "Failed to convert JSON" in text
        or "changed from" in text
        or "Column(" in text
        or "unexpected field" in text
    )


def unify_jsonl_schema(shard: Shard, chunk_bytes: int = 32 << 20) -> pa.Schema:
    """The types and fields of the whole file: each line-aligned chunk inferred, then unified."""
    schemas = []
    with _open_jsonl(shard) as handle:
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


# Integer literals of 16 digits or more may exceed 2**53, beyond which float64 rounds.
_LONG_INTEGER = re.compile(rb"\d{16,}")


def _check_exact_integers(shard: Shard, schema: pa.Schema, chunk_bytes: int = 32 << 20) -> None:
    """Refuse an integer that a floating-point column would round (IDs past 2**53 or 2**63).

    pyarrow reads a JSON integer as float64 when it exceeds int64 or shares its column
    with floats. A fast scan finds the lines with long digit runs; only those are parsed.
    """
    floating = [f for f in schema if _has_floating(f.type)]
    key = (_jsonl_key(shard), str(schema))
    if not floating or key in _EXACT_INTEGERS_CHECKED:
        return
    line_offset = 0
    with _open_jsonl(shard) as handle:
        while True:
            chunk = handle.read(chunk_bytes)
            if not chunk:
                break
            chunk += handle.readline()
            for match in _LONG_INTEGER.finditer(chunk):
                start = chunk.rfind(b"\n", 0, match.start()) + 1
                end = chunk.find(b"\n", match.end())
                line = chunk[start : end if end >= 0 else len(chunk)]
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # pyarrow reports malformed lines with their number
                if not isinstance(record, dict):
                    continue
                for column in floating:
                    value = _inexact_integer(record.get(column.name), column.type)
                    if value is not None:
                        number = line_offset + chunk.count(b"\n", 0, start) + 1
                        raise GrpoError(
                            f"{shard.display}, line {number}: the integer {value} in column "
                            f"{column.name!r} cannot be kept exactly (the column is read as "
                            f"{column.type}); write it as a string"
                        )
            line_offset += chunk.count(b"\n")
    _EXACT_INTEGERS_CHECKED.add(key)


def _has_floating(data_type: pa.DataType) -> bool:
    if pa.types.is_floating(data_type):
        return True
    if pa.types.is_struct(data_type):
        return any(_has_floating(data_type.field(i).type) for i in range(data_type.num_fields))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _has_floating(data_type.value_type)
    return False


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


def _jsonl_error(shard: Shard, exc: BaseException) -> GrpoError:
    """Find the offending line with the standard library: pyarrow only counts records."""
    location = _first_bad_jsonl_line(shard)
    if location is not None:
        line, reason = location
        return GrpoError(f"{shard.display}, line {line}: malformed JSONL ({reason})")
    if shard.gzipped and isinstance(exc, OSError):
        return GrpoError(f"{shard.display}: not a readable gzip file ({_first_line(exc)})")
    return GrpoError(f"{shard.display}: cannot read the JSONL file ({_first_line(exc)})")


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
                value = json.loads(text)
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
