"""Finding and reading rollout files: Parquet, JSON lines, JSON arrays, CSV, Arrow IPC.

An INPUT is a file, a directory of shards (a ``datasets`` ``save_to_disk`` folder too),
a quoted glob or ``-`` (standard input); a run may name several. Every format is read
as a stream of record batches in bounded memory: a JSON array is turned into JSON
lines on the way in, element by element. Every read error becomes a
:class:`~grpo_cli.errors.GrpoError` naming the file (and the line, for text formats).
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import io
import json
import os
import queue
import re
import sys
import threading
import zlib
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from grpo_cli.choices import InputFormat, check_choice
from grpo_cli.columns import MAX_NESTING, holds_type
from grpo_cli.errors import GrpoError
from grpo_cli.file_names import (
    ARROW_SUFFIXES,
    COMPRESSION_SUFFIXES,
    JSONL_SUFFIXES,
    OTHER_DATA_SUFFIXES,
    PARQUET_SUFFIXES,
    PROVENANCE_KEY,
    READ_SUFFIXES,
    TEXT_SUFFIXES,
)
from grpo_cli.guard import ProtectedInputs
from grpo_cli.scratch import spool

JSONL_BLOCK_BYTES = 8 << 20
_GLOB_CHARS = "*?["
_MAGIC_COMPRESSION = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd"}


@dataclass
class ShardFindings:
    """What reading a shard once settled, for this run's later reads of it (never kept past
    the run: each run resolves its inputs into new shards)."""

    longest_line: int = 0  # JSON lines: pyarrow's read block must hold a whole line
    schema: pa.Schema | None = None  # JSON lines: the whole file's unified types, after a drift
    exact_integers: set[str] = field(default_factory=set)  # schemas whose floats were scanned


@dataclass(frozen=True)
class Shard:
    """One input: a file, or (the table API) a table in memory.

    ``format`` is how it is read: ``json`` input becomes ``jsonl`` (a JSON array is
    spooled as lines, whose messages then count ``element``s instead of lines).
    """

    path: Path
    display: str
    format: str  # parquet, jsonl, csv, arrow or table
    size_bytes: int
    compression: str | None = None  # gzip or zstd (text formats)
    record_word: str = "line"
    table: pa.Table | None = field(default=None, compare=False, repr=False)
    found: ShardFindings = field(default_factory=lambda: ShardFindings(), compare=False, repr=False)

    @property
    def gzipped(self) -> bool:
        return self.compression == "gzip"

    @property
    def source(self) -> Path | None:
        """The user's file this shard reads (a spooled JSON array's original), or ``None``
        for standard input, a pipe or a table in memory."""
        if self.table is not None or self.display.startswith("<"):
            return None
        return Path(self.display) if self.record_word == "element" else self.path


def detect_format(path: str, override: InputFormat | None) -> InputFormat | None:
    """The format a file's name (or ``--input-format``) says; ``None`` when it says none."""
    if override:
        return override
    name = path.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(ARROW_SUFFIXES):
        return "arrow"
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    for suffix, fmt in TEXT_SUFFIXES.items():
        if name.endswith(suffix):
            return fmt  # type: ignore[return-value]
    return None


def _sniff(path: Path, *, json_array: bool) -> tuple[str | None, str | None]:
    """(format, compression) told by content; ``json_array``: also look for a JSON array."""
    with open(path, "rb") as handle:
        head = handle.read(8)
    compression = next((c for magic, c in _MAGIC_COMPRESSION.items() if head.startswith(magic)), None)
    if compression is None:
        if head.startswith(b"PAR1"):
            return "parquet", None
        if head.startswith(b"ARROW1") or head.startswith(b"\xff\xff\xff\xff"):
            return "arrow", None
    if json_array:
        text = b""
        with contextlib.suppress(Exception), _decompressed(path, compression) as stream:
            # a corrupt stream is reported when it is read
            text = stream.read(1 << 16).removeprefix(UTF8_BOM).lstrip()
        if text.startswith(b"["):
            return "json", compression
    return None, compression


UTF8_BOM = b"\xef\xbb\xbf"


def _looks_like_csv(path: Path, compression: str | None) -> bool:
    """Text on standard input that is no JSON: a first line with a comma, not ``{`` or ``[``."""
    first = b""
    with contextlib.suppress(Exception), _decompressed(path, compression) as stream:
        first = stream.readline(1 << 16).removeprefix(UTF8_BOM).strip()
    return bool(first) and first[:1] not in (b"{", b"[") and b"," in first


@contextlib.contextmanager
def _decompressed(path: Path, compression: str | None) -> Iterator[IO[bytes]]:
    """A buffered binary reader of the file's bytes, decompressed (lines can be iterated)."""
    if compression == "gzip":
        with gzip.open(path, "rb") as handle:
            yield handle  # type: ignore[misc]
        return
    if compression == "zstd":
        with pa.input_stream(str(path), compression="zstd") as native:
            yield io.BufferedReader(_NativeRaw(native), 1 << 20)
        return
    with open(path, "rb") as handle:
        yield handle


class _NativeRaw(io.RawIOBase):
    """A pyarrow input stream as a raw file, so that :class:`io.BufferedReader` can read lines."""

    def __init__(self, native: pa.NativeFile) -> None:
        self._native = native

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._native.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class InputSet:
    """The shards that INPUT arguments name; owns the spooled copies of streams.

    Each INPUT is a file, a directory of shards, a quoted glob, or ``-`` for standard
    input (format told by content). A path that exists is read as that file, even when
    its name holds glob characters. A pipe (``<(cat x.jsonl)``) is copied once to a
    private temporary file, like standard input, since it can be read only once; so is
    a JSON array, as JSON lines. Use as a context manager so that those copies are
    removed. Naming one file twice is refused: its rows would count twice.
    """

    def __init__(
        self,
        specs: str | Sequence[str],
        *,
        input_format: InputFormat | None = None,
        stdin: IO[bytes] | None = None,
    ) -> None:
        if input_format is not None:
            check_choice("--input-format", input_format, InputFormat)
        self.specs = [specs] if isinstance(specs, str) else list(specs)
        if not self.specs:
            raise GrpoError("no INPUT given")
        self.spec = " ".join(self.specs)
        self._spools = contextlib.ExitStack()
        self.directories: list[Path] = []
        try:
            if self.specs.count("-") > 1:
                raise GrpoError("- (standard input) is named more than once; it can be read only once")
            self.shards = [shard for spec in self.specs for shard in self._resolve(spec, input_format, stdin)]
            self._refuse_repeats()
        except BaseException:
            self._spools.close()
            raise

    @classmethod
    def of_table(cls, table: pa.Table, label: str = "<table>") -> InputSet:
        """A table in memory as the one shard of a run (the table API)."""
        inputs = cls.__new__(cls)
        inputs.specs, inputs.spec = [label], label
        inputs._spools = contextlib.ExitStack()
        inputs.directories = []
        inputs.shards = [Shard(Path(label), label, "table", table.nbytes, table=table)]
        return inputs

    def __enter__(self) -> InputSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._spools.close()

    @property
    def is_stdin(self) -> bool:
        return self.specs == ["-"]

    @property
    def total_bytes(self) -> int:
        return sum(s.size_bytes for s in self.shards)

    def protected(self) -> ProtectedInputs:
        """What no output of this run may touch: every input file and directory named."""
        files = [(s.source, s.display) for s in self.shards if s.source is not None]
        return ProtectedInputs.of(files, self.directories)

    def _refuse_repeats(self) -> None:
        seen: dict[tuple[int, int], Shard] = {}
        for shard in self.shards:
            if shard.source is None:
                continue
            stat = shard.source.stat()
            first = seen.setdefault((stat.st_dev, stat.st_ino), shard)
            if first is not shard:
                raise GrpoError(
                    f"{shard.display}: named twice (also as {first.display}); its rows would be read twice"
                )

    def _resolve(self, spec: str, input_format: InputFormat | None, stdin: IO[bytes] | None) -> list[Shard]:
        if spec == "-":
            return [self._spooled(stdin or sys.stdin.buffer, "<stdin>", input_format)]
        path = Path(spec)
        if not os.path.exists(spec) and any(ch in spec for ch in _GLOB_CHARS):
            matches = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
            shards = self._readable(spec, [Path(m) for m in matches], input_format, "the pattern matches")
            if not shards:
                raise GrpoError(f"{spec}: the pattern matches no file of a format grpo-cli reads")
            return shards
        if path.is_dir():
            return self._directory(spec, path, input_format)
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

    def _directory(self, spec: str, path: Path, input_format: InputFormat | None) -> list[Shard]:
        self.directories.append(path)
        saved = _saved_dataset_files(spec, path)
        if saved is not None:
            return [self._shard(str(file), input_format or "arrow", strict=True) for file in saved]  # type: ignore[misc]
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
            raise GrpoError(f"{spec}: the directory holds no file of a format grpo-cli reads")
        by_format = {s.format: Path(s.display).name for s in shards}
        if len(by_format) > 1:
            kinds = " and ".join(f"{fmt} ({name}, ...)" for fmt, name in sorted(by_format.items()))
            raise GrpoError(f"{spec}: the directory mixes {kinds} shards; use a glob to pick one format")
        return shards

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
                    f"{spec}: {where} {file.name}, a format grpo-cli does not read; move it out "
                    "or name the files to read with a glob"
                )
        return shards

    def _shard(self, path: str, input_format: InputFormat | None, *, strict: bool) -> Shard | None:
        fmt = detect_format(path, input_format)
        if fmt is None:
            if strict:
                raise GrpoError(
                    f"{path}: cannot tell the format from the name; expected one of "
                    f"{', '.join(READ_SUFFIXES)} or --input-format"
                )
            return None
        try:
            size = os.path.getsize(path)
            sniffed, compression = _sniff(Path(path), json_array=fmt == "json")
        except OSError as exc:
            raise GrpoError(f"{path}: cannot read the file ({exc.strerror})") from None
        named = next((c for suffix, c in COMPRESSION_SUFFIXES.items() if path.lower().endswith(suffix)), None)
        if named is not None and named != compression:  # the name says compressed: it must be
            compression, sniffed = named, "json" if fmt == "json" else sniffed
        return self._typed(Path(path), path, fmt, size, sniffed, compression)

    def _typed(
        self,
        path: Path,
        display: str,
        fmt: str,
        size: int,
        sniffed: str | None,
        compression: str | None,
    ) -> Shard:
        if fmt == "json":
            if sniffed != "json":  # JSON lines under a .json name
                return Shard(path, display, "jsonl", size, compression)
            lines = self._spools.enter_context(
                spool(
                    None,
                    label=display,
                    write=lambda out: _json_array_to_lines(path, compression, display, out),
                )
            )
            return Shard(lines, display, "jsonl", size, None, record_word="element")
        if sniffed in ("parquet", "arrow") and fmt != sniffed:
            raise GrpoError(f"{display}: its content is {sniffed.capitalize()}, not {fmt}")
        if fmt == "arrow" and compression is not None:
            raise GrpoError(f"{display}: a compressed Arrow file; decompress it first")
        return Shard(path, display, fmt, size, compression if fmt in ("jsonl", "csv") else None)

    def _spooled(self, stream: IO[bytes], label: str, input_format: InputFormat | None) -> Shard:
        # Two passes read the data twice: keep a private copy of a stream.
        path = self._spools.enter_context(spool(stream, label=label))
        sniffed, compression = _sniff(path, json_array=input_format in (None, "json"))
        if sniffed is None and input_format is None and _looks_like_csv(path, compression):
            sniffed = "csv"
        fmt = input_format or sniffed or "jsonl"
        return self._typed(path, label, fmt, path.stat().st_size, sniffed, compression)


def _saved_dataset_files(spec: str, folder: Path) -> list[Path] | None:
    """The Arrow files of a ``datasets`` ``save_to_disk`` folder, in order; ``None`` if it is not one."""
    if (folder / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in folder.iterdir() if (p / "state.json").is_file())
        raise GrpoError(
            f"{spec}: a saved DatasetDict with splits {', '.join(splits) or '(none)'}; name one split's "
            f"folder, e.g. {folder / (splits[0] if splits else 'train')}"
        )
    state_file = folder / "state.json"
    if not state_file.is_file() or not (folder / "dataset_info.json").is_file():
        return None
    try:
        state = json.loads(state_file.read_text())
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise GrpoError(f"{state_file}: not a readable datasets state file") from None
    files = [folder / name for name in names]
    for file in files:
        if Path(file.name) != Path(str(file.name)) or not file.is_file():
            raise GrpoError(f"{state_file}: lists {file.name}, which is not in {spec}")
    if not files:
        raise GrpoError(f"{spec}: the saved dataset lists no data file")
    return files


def _json_array_to_lines(path: Path, compression: str | None, display: str, out: IO[bytes]) -> None:
    """Write a JSON array's elements as JSON lines, parsing one element at a time."""
    try:
        _json_array_lines(path, compression, display, out)
    except (EOFError, zlib.error, pa.ArrowException) as exc:
        raise GrpoError(
            f"{display}: not a readable {compression or 'JSON'} file ({_first_line(exc)})"
        ) from None
    except OSError as exc:
        if compression is not None and not isinstance(exc, FileNotFoundError | PermissionError):
            raise GrpoError(f"{display}: not a readable {compression} file ({_first_line(exc)})") from None
        raise


class _RepeatedKey(ValueError):
    pass


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's fields; a name given twice is refused (a dict would keep the last silently)."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise _RepeatedKey(key)
        value[key] = item
    return value


def _json_array_lines(path: Path, compression: str | None, display: str, out: IO[bytes]) -> None:
    decoder = json.JSONDecoder(object_pairs_hook=_refuse_repeated_keys)
    with _decompressed(path, compression) as raw:
        stream = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape")
        buffer, position, eof, chunk = "", 0, False, 1 << 20
        expect = "["  # then "first", "value" (after a comma), "separator", "end"
        elements = 0
        line = 1  # the line `buffer` starts on, for messages

        def more() -> bool:
            nonlocal buffer, position, eof, line
            data = stream.read(chunk)
            if not data:
                eof = True
                return False
            line += buffer.count("\n", 0, position)
            buffer, position = buffer[position:] + data, 0
            return True

        def fail(what: str, at: int) -> GrpoError:
            number = line + buffer.count("\n", 0, at)
            return GrpoError(f"{display}, line {number}: malformed JSON array ({what})")

        while True:
            while position < len(buffer) and buffer[position] in " \t\r\n":
                position += 1
            if position >= len(buffer):
                if more():
                    continue
                if expect == "end":
                    return
                raise fail("it ends before the closing ]", len(buffer))
            char = buffer[position]
            if expect == "[":
                if char != "[":
                    raise fail(f"expected [, got {char!r}", position)
                expect, position = "first", position + 1
            elif expect == "end":
                raise fail(f"unexpected {char!r} after the closing ]", position)
            elif char == "]" and expect in ("first", "separator"):
                expect, position = "end", position + 1
            elif expect == "separator":
                if char != ",":
                    raise fail(f"expected , or ] after element {elements}, got {char!r}", position)
                expect, position = "value", position + 1
            else:
                try:
                    value, end = decoder.raw_decode(buffer, position)
                except _RepeatedKey as repeated:
                    raise fail(f"element {elements + 1} gives the field {repeated} twice", position) from None
                except RecursionError:
                    raise fail(f"element {elements + 1} is nested too deeply to parse", position) from None
                except json.JSONDecodeError as err:
                    if more():  # the element may go on in the next chunk
                        chunk = min(chunk * 2, 1 << 28)
                        continue
                    raise fail(err.msg, err.pos) from None
                if end == len(buffer) and isinstance(value, int | float) and more():
                    continue  # a number may go on in the next chunk
                if not isinstance(value, dict):
                    raise fail(
                        f"element {elements + 1} is {type(value).__name__}, expected an object", position
                    )
                out.write(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n")
                elements, expect, position = elements + 1, "separator", end


def _check_jsonl_nesting(shard: Shard, chunk_bytes: int = 32 << 20) -> None:
    """Refuse a JSON line nested deeper than :data:`~grpo_cli.columns.MAX_NESTING` before
    pyarrow's parser sees it: about 20,000 levels overflow its stack (a segfault). Notes the
    longest line in ``shard.found``: pyarrow's read block must hold a whole line.

    A line cannot nest deeper than it has ``[`` and ``{``: a vectorised count per line finds
    the few lines with more, and only those are scanned, strings skipped.
    """
    import numpy as np

    opening = np.zeros(256, dtype=np.int64)
    opening[[ord("["), ord("{")]] = 1
    line_offset = longest = 0
    with _open_jsonl(shard) as handle:
        while True:
            chunk = handle.read(chunk_bytes)
            if not chunk:
                shard.found.longest_line = longest
                return
            chunk += handle.readline()
            data = np.frombuffer(chunk, dtype=np.uint8)
            ends = np.flatnonzero(data == ord("\n"))
            if data.size:
                bounds = np.concatenate(([-1], ends, [data.size]))
                longest = max(longest, int(np.diff(bounds).max()))
            starts = np.concatenate(([0], ends + 1))
            counts = np.add.reduceat(opening[data], starts[starts < data.size]) if data.size else data
            for line in np.flatnonzero(counts > MAX_NESTING).tolist():
                end = int(ends[line]) if line < ends.size else data.size
                depth = _json_depth(chunk[int(starts[line]) : end])
                if depth > MAX_NESTING:
                    raise GrpoError(
                        f"{shard.display}, {shard.record_word} {line_offset + line + 1}: a value nests "
                        f"{depth:,} levels deep; grpo-cli reads at most {MAX_NESTING}"
                    )
            line_offset += int(ends.size)


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


def _holds_data(folder: Path) -> bool:
    """Whether a folder holds, at any depth, a file that looks like data."""
    suffixes = PARQUET_SUFFIXES + JSONL_SUFFIXES + OTHER_DATA_SUFFIXES
    return any(name.lower().endswith(suffixes) for _, _, files in os.walk(folder) for name in files)


# --------------------------------------------------------------------------- schema and batches


def read_schema(shard: Shard) -> pa.Schema:
    """The shard's schema (for JSONL and CSV: as inferred from the first block)."""
    if shard.table is not None:
        return shard.table.schema
    if shard.format == "parquet":
        try:
            return pq.read_schema(shard.path)
        except (pa.ArrowException, OSError) as exc:
            raise read_error(shard, exc, "not a readable Parquet file") from None
    if shard.format == "arrow":
        with _arrow_batches(shard) as (schema, _):
            return schema
    if shard.format == "csv":
        with _CsvReader(shard) as reader:
            return reader.schema
    if jsonl_is_empty(shard):
        return pa.schema([])
    _check_jsonl_nesting(shard)
    with _JsonlReader(shard) as reader:
        return reader.schema


def read_provenance(shard: Shard) -> dict[str, Any] | None:
    """The ``grpo_cli`` provenance entry of a Parquet shard grpo-cli wrote, or ``None``."""
    if shard.format != "parquet":
        return None
    try:
        metadata = pq.read_metadata(shard.path).metadata or {}
    except (pa.ArrowException, OSError) as exc:
        raise read_error(shard, exc, "not a readable Parquet file") from None
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
    if shard.table is not None:
        return int(shard.table.nbytes)
    if shard.format == "arrow":
        return shard.size_bytes
    if shard.format == "parquet":
        try:
            meta = pq.read_metadata(shard.path)
        except (pa.ArrowException, OSError) as exc:
            raise read_error(shard, exc, "not a readable Parquet file") from None
        return int(sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)))
    return shard.size_bytes * (6 if shard.compression else 2)


def row_count(shard: Shard) -> int | None:
    """Rows in the shard when the file says so cheaply (Parquet, Arrow), else ``None``."""
    if shard.table is not None:
        return int(shard.table.num_rows)
    if shard.format == "arrow":  # memory-mapped: only the batches' headers are read
        with _arrow_batches(shard) as (_, batches):
            return int(sum(batch.num_rows for batch in batches))
    if shard.format != "parquet":
        return None
    try:
        return int(pq.read_metadata(shard.path).num_rows)
    except (pa.ArrowException, OSError):
        return None


def iter_batches(shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches of the shard, optionally only some columns."""
    if shard.table is not None:
        table = shard.table if columns is None else shard.table.select(columns)
        yield from table.to_batches(max_chunksize=batch_rows)
    elif shard.format == "parquet":
        yield from _parquet_batches(shard, columns, batch_rows)
    elif shard.format == "arrow":
        with _arrow_batches(shard) as (_, batches):
            yield from _rebatched(batches, columns, batch_rows)
    elif shard.format == "csv":
        yield from _csv_batches(shard, columns)
    else:
        yield from _jsonl_batches(shard, columns)


_Item = TypeVar("_Item")


def read_ahead(items: Iterator[_Item], *, depth: int = 1) -> Generator[_Item, None, None]:
    """``items``, produced on a second thread up to ``depth`` items ahead of the consumer.

    Decoding the next batch (pyarrow releases the GIL) overlaps the consumer's work on
    this one. The producer's exception is raised to the consumer where the item would
    have come; a consumer that stops early stops the producer, which closes ``items``.

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
            for item in items:
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
    try:
        while True:
            finished, value = slots.get()
            if finished:
                if value is not None:
                    raise value
                return
            yield value
    finally:
        stop.set()
        thread.join()


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
        raise GrpoError(f"{shard.display}: not a readable Arrow IPC file ({_first_line(exc)})") from None


def _checked(shard: Shard, batches: Iterator[pa.RecordBatch], what: str) -> Iterator[pa.RecordBatch]:
    """``batches``, a decoding error becoming one line naming the shard."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            raise read_error(shard, exc, f"corrupt {what} data") from None
        try:
            # memory-mapped bytes from another writer: a bad offset would be read as an address
            batch.validate(full=True)
        except (pa.ArrowException, ValueError) as exc:
            raise GrpoError(f"{shard.display}: corrupt {what} data ({_first_line(exc)})") from None
        yield batch


def read_error(shard: Shard, exc: BaseException, what: str) -> GrpoError:
    """A read error as one line; an encrypted file says so, whichever part of it failed."""
    text = _first_line(exc)
    if "crypt" in text.lower():
        return GrpoError(
            f"{shard.display}: an encrypted Parquet file; grpo-cli reads no encrypted data (decrypt it first)"
        )
    return GrpoError(f"{shard.display}: {what} ({text})")


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
                "error": read_error(shard, exc, "unreadable").message,
            }
        with file:
            names = file.schema_arrow.names
            for group in range(file.num_row_groups):
                for name in names:
                    try:
                        file.read_row_group(group, columns=[name], use_threads=False)
                    except (pa.ArrowException, OSError) as exc:
                        where = f"row group {group}, column {name!r}"
                        error = read_error(shard, exc, f"{where}: does not decode").message
                        return {"row_groups": row_groups, "column_chunks": chunks, "error": error}
                    chunks += 1
                row_groups += 1
    return {"row_groups": row_groups, "column_chunks": chunks, "error": None}


def read_table(shard: Shard) -> pa.Table:
    """A whole Parquet shard, decoded in parallel."""
    try:
        return pq.read_table(shard.path, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as exc:
        raise read_error(shard, exc, "corrupt Parquet data") from None


def _parquet_batches(shard: Shard, columns: list[str] | None, batch_rows: int) -> Iterator[pa.RecordBatch]:
    try:
        # pre_buffer would read the whole file ahead: memory must stay bounded by a batch.
        file = pq.ParquetFile(shard.path, pre_buffer=False, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as exc:
        raise read_error(shard, exc, "not a readable Parquet file") from None
    with file:
        batches = file.iter_batches(batch_size=batch_rows, columns=columns, use_threads=True)
        yield from _checked(shard, batches, "Parquet")


_Reader = TypeVar("_Reader")


class _TextReader(Generic[_Reader]):
    """A streaming reader of a text shard (JSON lines, CSV); its stream is closed on exit."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self._stream: Any = None

    def __enter__(self) -> _Reader:
        try:
            self._stream = pa.input_stream(str(self.shard.path), compression=self.shard.compression)
            return self._open(self._stream)
        except (pa.ArrowException, OSError) as exc:
            self.close()
            raise self._error(exc) from None

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


class _JsonlReader(_TextReader["pa_json.JSONStreamingReader"]):
    def _open(self, stream: pa.NativeFile) -> pa_json.JSONStreamingReader:
        schema = self.shard.found.schema
        return pa_json.open_json(
            stream,
            read_options=pa_json.ReadOptions(block_size=jsonl_block_bytes(self.shard)),
            parse_options=pa_json.ParseOptions(explicit_schema=schema) if schema is not None else None,
        )

    def _error(self, exc: BaseException) -> Exception:
        if isinstance(exc, Exception) and _is_schema_drift(exc) and self.shard.found.schema is None:
            return JsonlSchemaDrift(self.shard)
        return _jsonl_error(self.shard, exc)


@contextlib.contextmanager
def _open_jsonl(shard: Shard) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed; a corrupt gzip stream becomes one clear error."""
    try:
        with _decompressed(shard.path, shard.compression) as handle:
            yield handle
    except (OSError, EOFError, zlib.error, pa.ArrowException) as exc:
        if shard.compression and not isinstance(exc, FileNotFoundError | PermissionError):
            raise GrpoError(
                f"{shard.display}: not a readable {shard.compression} file ({_first_line(exc)})"
            ) from None
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
                if _is_schema_drift(exc) and shard.found.schema is None:
                    raise JsonlSchemaDrift(shard) from None
                raise _jsonl_error(shard, exc) from None
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


class JsonlSchemaDrift(SchemaDrift):
    """A JSONL column changed type, or a new field appeared: the whole file's types are
    inferred chunk by chunk and unified (:func:`unify_jsonl_schema`)."""

    def settle(self) -> None:
        unify_jsonl_schema(self.shard)


class _CsvReader(_TextReader["pa_csv.CSVStreamingReader"]):
    """Every CSV column is read as its text: type inference would merge the keys ``007``,
    ``07`` and ``7``, turn ``N/A`` into a null and ``001`` into ``1.0``. An unquoted empty
    cell is a null (a quoted ``""`` is the empty string); the columns grpo-cli computes
    from are parsed as numbers where they are read (:func:`~grpo_cli.rewards.numbers_from_text`)."""

    def _open(self, stream: pa.NativeFile) -> pa_csv.CSVStreamingReader:
        read_options = pa_csv.ReadOptions(block_size=JSONL_BLOCK_BYTES)
        # a quoted cell may hold newlines: a block may not be cut at one of them
        parse_options = pa_csv.ParseOptions(newlines_in_values=True)
        with pa.input_stream(str(self.shard.path), compression=self.shard.compression) as header:
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
        return _csv_error(self.shard, exc, None)


def _csv_batches(shard: Shard, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
    with _CsvReader(shard) as reader:
        schema = reader.schema
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as exc:
                raise _csv_error(shard, exc, schema) from None
            yield batch.select(columns) if columns is not None else batch


def _csv_error(shard: Shard, exc: BaseException, schema: pa.Schema | None) -> Exception:
    text = _first_line(exc)
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


def _is_schema_drift(exc: Exception) -> bool:
    text = str(exc)
    return (
        "Failed to convert JSON" in text
        or "changed from" in text
        or "Column(" in text
        or "unexpected field" in text
    )


def unify_jsonl_schema(shard: Shard, chunk_bytes: int = 32 << 20) -> pa.Schema:
    """The types and fields of the whole file: each line-aligned chunk inferred, then unified;
    recorded on the shard (``shard.found.schema``) for the run's next attempt."""
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
    shard.found.schema = schema
    return schema


# Integer literals of 16 digits or more may exceed 2**53, beyond which float64 rounds.
_LONG_INTEGER = re.compile(rb"\d{16,}")


def _check_exact_integers(shard: Shard, schema: pa.Schema, chunk_bytes: int = 32 << 20) -> None:
    """Refuse an integer that a floating-point column would round (IDs past 2**53 or 2**63).

    pyarrow reads a JSON integer as float64 when it exceeds int64 or shares its column
    with floats. A fast scan finds the lines with long digit runs; only those are parsed.
    """
    floating = [f for f in schema if holds_type(f.type, pa.types.is_floating)]
    key = str(schema)
    if not floating or key in shard.found.exact_integers:
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
                            f"{shard.display}, {shard.record_word} {number}: the integer {value} in column "
                            f"{column.name!r} cannot be kept exactly (the column is read as "
                            f"{column.type}); write it as a string"
                        )
            line_offset += chunk.count(b"\n")
    shard.found.exact_integers.add(key)


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
        what = "JSON array" if shard.record_word == "element" else "JSONL"
        return GrpoError(f"{shard.display}, {shard.record_word} {line}: malformed {what} ({reason})")
    if shard.compression and isinstance(exc, OSError):
        return GrpoError(f"{shard.display}: not a readable {shard.compression} file ({_first_line(exc)})")
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
    """``data.parquet, row 17``, or ``data.jsonl, line 18`` and ``data.csv, line 19`` (the text
    formats name the line, 1-based, an editor shows) for error messages."""
    if shard.format == "jsonl":
        line = jsonl_line_of_record(shard, row)
        if line is not None:
            return f"{shard.display}, {shard.record_word} {line}"
        return f"{shard.display}, record {row}"
    if shard.format == "csv" and shard.path.is_file():
        line = csv_line_of_record(shard, row)
        if line is not None:
            return f"{shard.display}, line {line}"
    return f"{shard.display}, row {row}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
