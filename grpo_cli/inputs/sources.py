"""Finding rollout files: INPUT arguments to shards (Parquet, JSON lines, JSON arrays, CSV, Arrow IPC).

An INPUT is a file, a directory of shards (a ``datasets`` ``save_to_disk`` folder too),
a quoted glob or ``-`` (standard input); a run may name several. Formats are told by
name or content; standard input and JSON arrays are spooled to private files (a JSON array
as JSON lines, element by element). Reading a shard is :mod:`grpo_cli.inputs.readers`' job.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import gzip
import io
import json
import os
import re
import sys
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from grpo_cli.choices import InputFormat, check_choice
from grpo_cli.errors import GrpoError, LayoutError, first_line, mention
from grpo_cli.file_names import (
    ARROW_SUFFIXES,
    COMPRESSION_SUFFIXES,
    JSONL_SUFFIXES,
    OTHER_DATA_SUFFIXES,
    PARQUET_SUFFIXES,
    READ_SUFFIXES,
    TEXT_SUFFIXES,
)
from grpo_cli.inputs.protected import ProtectedInputs
from grpo_cli.scratch import spool
from grpo_cli.stores import check_scheme, download, is_uri, list_files, local_path, redact, same_or_within

_GLOB_CHARS = "*?["
_MAGIC_COMPRESSION = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd"}


@dataclass
class ShardFindings:
    """What reading a shard once settled, for this run's later reads of it (never kept past
    the run: each run resolves its inputs into new shards)."""

    longest_line: int = 0  # JSON lines: pyarrow's read block must hold a whole line
    scanned: bool = False  # JSON lines held in memory: nesting and the longest line scanned
    schema: pa.Schema | None = None  # JSON lines: the whole file's unified types, after a drift
    exact_integers: set[str] = field(default_factory=set)  # schemas whose floats were scanned
    contents: bytes | None = field(default=None, repr=False)  # a text file's bytes, read once
    hold_up_to: int = 0  # text: the run lets this many decompressed bytes be held (readers.hold_text_within)


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
    origin: Path | None = None  # the user's file a private rewrite of it (a trainer's dump) reads
    remote: str | None = None  # the object-store URI a private copy was streamed from (stores)
    found: ShardFindings = field(default_factory=lambda: ShardFindings(), compare=False, repr=False)

    @property
    def gzipped(self) -> bool:
        return self.compression == "gzip"

    @property
    def source(self) -> Path | None:
        """The user's file this shard reads (a spooled JSON array's original), or ``None``
        for standard input, a pipe, a table in memory or an object on a store (:attr:`remote`)."""
        if self.table is not None or self.display.startswith("<") or self.remote is not None:
            return None
        if self.origin is not None:
            return self.origin
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
        with contextlib.suppress(Exception), decompressed(path, compression) as stream:
            # a corrupt stream is reported when it is read
            text = stream.read(1 << 16).removeprefix(UTF8_BOM).lstrip()
        if text.startswith(b"["):
            return "json", compression
    return None, compression


UTF8_BOM = b"\xef\xbb\xbf"


def _looks_like_csv(path: Path, compression: str | None) -> bool:
    """Text on standard input that is no JSON: a first line with a comma, not ``{`` or ``[``."""
    first = b""
    with contextlib.suppress(Exception), decompressed(path, compression) as stream:
        first = stream.readline(1 << 16).removeprefix(UTF8_BOM).strip()
    return bool(first) and first[:1] not in (b"{", b"[") and b"," in first


@contextlib.contextmanager
def decompressed(path: Path, compression: str | None) -> Iterator[IO[bytes]]:
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


DANGLING = "a link that leads to no file (to itself, or to a file since moved): remove it or mend it"
"""Why a link among the files a folder or glob names is refused rather than passed over."""
COPY_PROBE_BYTES = 1 << 16
"""Bytes compared at each end of two files of one size before their whole contents are."""


def refuse_copies(files: Sequence[tuple[Path, str]]) -> None:
    """Refuse two of ``files`` (each a path and the name to show) that hold the same bytes,
    naming both: a file copied beside itself (``completions_010.parquet`` beside
    ``completions_00010.parquet``) would count each row twice. Files of one size only are
    compared, their ends first, their digests only where those are equal."""
    by_size: dict[int, list[tuple[Path, str]]] = {}
    try:
        for path, display in files:
            size = path.stat().st_size
            if size:
                by_size.setdefault(size, []).append((path, display))
    except OSError as exc:
        raise GrpoError(f"cannot read an input to compare it with another ({exc.strerror or exc})") from None
    for same_size in by_size.values():
        if len(same_size) > 1:
            _refuse_equal(same_size)


def _refuse_equal(files: Sequence[tuple[Path, str]]) -> None:
    """:func:`refuse_copies` of files of one size."""
    import hashlib

    def probe(path: Path) -> bytes:
        with open(path, "rb") as handle:
            head = handle.read(COPY_PROBE_BYTES)
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - COPY_PROBE_BYTES))
            return head + handle.read()

    def digest(path: Path) -> bytes:
        hasher = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                hasher.update(block)
        return hasher.digest()

    try:
        by_probe: dict[bytes, list[tuple[Path, str]]] = {}
        for path, display in files:
            by_probe.setdefault(probe(path), []).append((path, display))
        for alike in by_probe.values():
            seen: dict[bytes, str] = {}
            for path, display in alike if len(alike) > 1 else ():
                first = seen.setdefault(digest(path), display)
                if first is not display:
                    raise GrpoError(
                        f"{display}: the same bytes as {first} (a copy?); its rows would be read twice: "
                        "name one of them"
                    )
    except OSError as exc:
        raise GrpoError(f"cannot read an input to compare it with another ({exc.strerror or exc})") from None


def matching_files(pattern: str) -> list[Path]:
    """The files a glob names, sorted, as :func:`glob.glob` with ``recursive=True`` names them
    (``**`` any folders deep, ``*``, ``?`` and ``[...]`` within one name, a name starting with
    ``.`` only where the pattern's does), with each real folder visited once: a folder reached
    again through a link (``ln -s . loop``, ``ln -s .. up``) is passed over, so no input makes
    the search unbounded, and a file is named once, by its first path.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "a").mkdir(); (root / "a" / "x.jsonl").write_text("")
    0
    >>> os.symlink(".", root / "a" / "loop"); os.symlink("..", root / "a" / "up")
    >>> [p.relative_to(root).as_posix() for p in matching_files(f"{root}/**/*.jsonl")]
    ['a/x.jsonl']
    """
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if any(ch in part for ch in _GLOB_CHARS)), len(parts))
    base = Path(*parts[:fixed]) if fixed else Path(".")
    rest = parts[fixed:]
    if not rest:
        return [base] if base.is_file() else []
    seen: set[tuple[int, int]] = set()
    found: list[Path] = []

    def visit(folder: Path) -> None:
        try:
            stat = folder.stat()
        except OSError:
            return
        if (stat.st_dev, stat.st_ino) in seen:
            return  # a folder reached again through a link
        seen.add((stat.st_dev, stat.st_ino))
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            path = folder / entry.name
            dangling = entry.is_symlink() and not os.path.exists(path)  # a loop raises in is_dir
            try:
                is_dir = not dangling and entry.is_dir()
                is_file = not dangling and entry.is_file()
            except OSError:
                continue
            if (is_file or dangling) and _matches(rest, _relative_parts(path, base)):
                if dangling:
                    raise GrpoError(f"{path}: {DANGLING}")
                found.append(path)
            elif is_dir and _could_match_below(rest, _relative_parts(path, base)):
                visit(path)

    if base.is_dir():
        visit(base)
    return sorted(found)


def _relative_parts(path: Path, base: Path) -> tuple[str, ...]:
    return path.relative_to(base).parts if base != Path(".") else path.parts


def _name_matches(pattern: str, name: str) -> bool:
    if name.startswith(".") and not pattern.startswith("."):
        return False
    return fnmatch.fnmatchcase(name, pattern)


def _matches(pattern: Sequence[str], names: Sequence[str]) -> bool:
    """Whether a path's names below the glob's fixed folder match its parts (``**``: any
    number of folders, none starting with ``.``)."""
    if not pattern:
        return not names
    if pattern[0] == "**":
        return any(
            _matches(pattern[1:], names[skip:])
            for skip in range(len(names) + 1)
            if not any(name.startswith(".") for name in names[:skip])
        )
    return bool(names) and _name_matches(pattern[0], names[0]) and _matches(pattern[1:], names[1:])


def _could_match_below(pattern: Sequence[str], names: Sequence[str]) -> bool:
    """Whether a folder (its names below the fixed folder) can hold a match of ``pattern``."""
    if not names:
        return True
    if not pattern:
        return False
    if pattern[0] == "**":
        if names[0].startswith("."):
            return _could_match_below(pattern[1:], names)
        return True
    return _name_matches(pattern[0], names[0]) and _could_match_below(pattern[1:], names[1:])


class InputSet:
    """The shards that INPUT arguments name; owns the spooled copies of streams.

    Each INPUT is a file, a directory of shards, a quoted glob, or ``-`` for standard
    input (format told by content). A path that exists is read as that file, even when
    its name holds glob characters. A pipe (``<(cat x.jsonl)``) is copied once to a
    private temporary file, like standard input, since it can be read only once; so is
    a JSON array, as JSON lines. Use as a context manager so that those copies are
    removed. Naming one file twice is refused: its rows would count twice.
    """

    about: dict[str, Any] | None = None
    """What read a trainer's dump (:meth:`grpo_cli.trainers.dumps.OpenedDump.info`), for the summary."""

    def __init__(
        self,
        specs: str | Sequence[str],
        *,
        input_format: InputFormat | None = None,
        stdin: IO[bytes] | None = None,
    ) -> None:
        if input_format is not None:
            check_choice(mention("input_format"), input_format, InputFormat)
        self.specs = [specs] if isinstance(specs, str) else list(specs)
        if not self.specs:
            raise GrpoError("no INPUT given")
        self.spec = " ".join(redact(spec) for spec in self.specs)  # never a credential
        self._spools = contextlib.ExitStack()
        self.directories: list[Path] = []
        self.uris: list[str] = []  # the object-store INPUTs named, which no output may replace
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
        inputs.directories, inputs.uris = [], []
        inputs.shards = [Shard(Path(label), label, "table", table.nbytes, table=table)]
        return inputs

    @classmethod
    def of_shards(cls, label: str, shards: list[Shard], spools: contextlib.ExitStack) -> InputSet:
        """Shards already resolved (a trainer's dump, :mod:`grpo_cli.trainers.dumps`), owning ``spools``."""
        inputs = cls.__new__(cls)
        inputs.specs, inputs.spec = [label], label
        inputs._spools = spools
        inputs.directories, inputs.uris = [], []
        inputs.shards = shards
        inputs._refuse_repeats()
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
        return ProtectedInputs.of(files, self.directories, self.uris)

    def _refuse_repeats(self) -> None:
        """Refuse a file named twice (one file under two names or links) and a copy of another
        (the same bytes under another name): either would count its rows twice."""
        seen: dict[tuple[int, int], Shard] = {}
        files = []
        for shard in self.shards:
            if shard.source is None:
                continue
            stat = shard.source.stat()
            first = seen.setdefault((stat.st_dev, stat.st_ino), shard)
            if first is not shard:
                raise GrpoError(
                    f"{shard.display}: named twice (also as {first.display}); its rows would be read twice"
                )
            files.append((shard.source, shard.display))
        refuse_copies(files)

    def _resolve(self, spec: str, input_format: InputFormat | None, stdin: IO[bytes] | None) -> list[Shard]:
        if spec == "-":
            return [self._spooled(stdin or sys.stdin.buffer, "<stdin>", input_format)]
        if is_uri(spec):
            return self._remote(spec, input_format)
        path = Path(spec)
        if not os.path.exists(spec) and any(ch in spec for ch in _GLOB_CHARS):
            matches = matching_files(spec)
            shards = self._readable(spec, matches, input_format, "the pattern matches")
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
        nested = [p for p in entries if p.is_dir() and _data_suffixes(p)]
        if nested:
            names = ", ".join(p.name for p in nested[:3]) + (", ..." if len(nested) > 3 else "")
            suffix = _data_suffixes(nested[0]).most_common(1)[0][0]
            raise LayoutError(
                f"{spec}: holds subfolders with data files ({names}); grpo-cli reads the files of one "
                f"folder: pass a quoted glob such as '{path / '**' / ('*' + suffix)}' to read them all"
            )
        for entry in entries:
            if entry.is_symlink() and not entry.exists() and detect_format(entry.name, input_format):
                raise GrpoError(f"{entry}: {DANGLING}")
        files = [p for p in entries if p.is_file()]
        shards = self._readable(spec, files, input_format, "the directory holds")
        if not shards:
            raise LayoutError(f"{spec}: the directory holds no file of a format grpo-cli reads")
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
                raise _unknown_format(path)
            return None
        try:
            size = os.path.getsize(path)
            sniffed, compression = _sniff(Path(path), json_array=fmt == "json")
        except OSError as exc:
            raise GrpoError(f"{path}: cannot read the file ({exc.strerror})") from None
        sniffed, compression = _as_named(path, fmt, sniffed, compression)
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
        if fmt == "json" and sniffed != "json":  # JSON lines under a .json name
            return Shard(path, display, "jsonl", size, compression)
        if fmt in ("json", "json-columns"):  # an array, or one object of columns: spooled as lines
            convert = _json_array_to_lines if fmt == "json" else _json_columns_to_lines
            lines = self._spools.enter_context(
                spool(None, label=display, write=lambda out: convert(path, compression, display, out))
            )
            return Shard(lines, display, "jsonl", size, None, record_word="element")
        if sniffed in ("parquet", "arrow") and fmt != sniffed:
            raise GrpoError(f"{display}: its content is {sniffed.capitalize()}, not {fmt}")
        if fmt == "arrow" and compression is not None:
            raise GrpoError(f"{display}: a compressed Arrow file; decompress it first")
        return Shard(path, display, fmt, size, compression if fmt in ("jsonl", "csv") else None)

    def _remote(self, spec: str, input_format: InputFormat | None) -> list[Shard]:
        """An object-store INPUT: each file it names streamed to a private copy, read as a local
        file and named by its URI (a ``file://`` URI is the local path)."""
        if check_scheme(spec) == "file":
            return self._resolve(local_path(spec), input_format, None)
        if any(same_or_within(spec, seen) or same_or_within(seen, spec) for seen in self.uris):
            raise GrpoError(f"{redact(spec)}: named twice; its rows would be read twice")
        self.uris.append(spec)
        shards = []
        for file in list_files(spec):
            display = redact(file.uri)
            fmt = detect_format(file.name, input_format)
            copy = self._spools.enter_context(
                spool(None, label=display, write=functools.partial(download, file))
            )
            sniffed, compression = _as_named(file.name, fmt, *_sniff(copy, json_array=fmt in (None, "json")))
            told = fmt or sniffed
            if told is None:
                raise _unknown_format(display)
            shard = self._typed(copy, display, told, file.size, sniffed, compression)
            shards.append(replace(shard, remote=file.uri))
        return shards

    def _spooled(self, stream: IO[bytes], label: str, input_format: InputFormat | None) -> Shard:
        # Two passes read the data twice: keep a private copy of a stream.
        path = self._spools.enter_context(spool(stream, label=label))
        sniffed, compression = _sniff(path, json_array=input_format in (None, "json"))
        if sniffed is None and input_format is None and _looks_like_csv(path, compression):
            sniffed = "csv"
        fmt = input_format or sniffed or "jsonl"
        return self._typed(path, label, fmt, path.stat().st_size, sniffed, compression)


def _as_named(
    name: str, fmt: str | None, sniffed: str | None, compression: str | None
) -> tuple[str | None, str | None]:
    """(sniffed format, compression) once the name is heard: a name that says compressed must be."""
    named = next((c for suffix, c in COMPRESSION_SUFFIXES.items() if name.lower().endswith(suffix)), None)
    if named is not None and named != compression:
        return ("json" if fmt == "json" else sniffed), named
    return sniffed, compression


def _unknown_format(display: str) -> GrpoError:
    return GrpoError(
        f"{display}: cannot tell the format from the name; expected one of "
        f"{', '.join(READ_SUFFIXES)} or {mention('input_format')}"
    )


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
            f"{display}: not a readable {compression or 'JSON'} file ({first_line(exc)})"
        ) from None
    except OSError as exc:
        if compression is not None and not isinstance(exc, FileNotFoundError | PermissionError):
            raise GrpoError(f"{display}: not a readable {compression} file ({first_line(exc)})") from None
        raise


def _json_columns_to_lines(path: Path, compression: str | None, display: str, out: IO[bytes]) -> None:
    """ONE JSON object whose fields are columns of equal length (ROLL's dump), as JSON lines."""
    try:
        with decompressed(path, compression) as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="strict").read()
    except UnicodeDecodeError as exc:
        raise GrpoError(f"{display}: not UTF-8 text (byte {exc.start})") from None
    except (EOFError, zlib.error) as exc:
        raise GrpoError(f"{display}: not a readable {compression} file ({first_line(exc)})") from None
    try:
        value = json.loads(text, object_pairs_hook=_refuse_repeated_keys)
    except _RepeatedKey as repeated:
        raise GrpoError(f"{display}: the field {repeated} is given twice") from None
    except RecursionError:
        raise GrpoError(f"{display}: nested too deeply to parse") from None
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith("{") and not text.rstrip().endswith("}"):
            raise GrpoError(
                f"{display}: truncated: its JSON object of columns ends early, at line "
                f"{text.count(chr(10)) + 1} "
                "(a writer stopped mid-write: ROLL writes it from a daemon process)"
            ) from None
        raise GrpoError(f"{display}, line {exc.lineno}: not a JSON object of columns ({exc.msg})") from None
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise GrpoError(f"{display}: not a JSON object of columns (one object whose fields are lists)")
    lengths = {name: len(column) for name, column in value.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{name} {length}" for name, length in lengths.items())
        raise GrpoError(f"{display}: its columns differ in length ({shown})")
    for row in zip(*value.values(), strict=True):
        out.write(
            json.dumps(dict(zip(value, row, strict=True)), ensure_ascii=False).encode(
                "utf-8", "surrogatepass"
            )
            + b"\n"
        )


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
    with decompressed(path, compression) as raw:
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
                text = json.dumps(value, ensure_ascii=False)
                try:
                    encoded = text.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate: from bytes that are not UTF-8, or an escape
                    if _SURROGATE_ESCAPE.search(buffer, position, end):
                        raise fail(
                            f"element {elements + 1}: a string escapes a lone UTF-16 surrogate (not valid "
                            "Unicode)",
                            position,
                        ) from None
                    encoded = text.encode("utf-8", "surrogatepass")  # the reader names the bad bytes
                out.write(encoded + b"\n")
                elements, expect, position = elements + 1, "separator", end


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
"""A JSON escape of a UTF-16 surrogate (``\\udc80``): a lone one is no Unicode text."""


def _data_suffixes(folder: Path) -> Counter[str]:
    """The suffixes of the files that look like data in a folder, at any depth, counted (none:
    it holds no data)."""
    suffixes = PARQUET_SUFFIXES + JSONL_SUFFIXES + OTHER_DATA_SUFFIXES
    found: Counter[str] = Counter()
    for _, _, files in os.walk(folder):
        for name in files:
            lowered = name.lower()
            matched = [s for s in suffixes if lowered.endswith(s)]
            if matched:
                found[name[-max(len(s) for s in matched) :]] += 1
    return found
