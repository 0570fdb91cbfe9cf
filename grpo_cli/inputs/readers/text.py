"""What the text formats (JSON lines, CSV) share: their bytes read once and held where they fit,
the block pyarrow reads them in, files opened decompressed, and types that drift."""

from __future__ import annotations

import contextlib
import io
import zlib
from collections.abc import Iterator
from typing import IO, Any, Generic, TypeVar

import pyarrow as pa

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.inputs.readers.base import _Rows
from grpo_cli.inputs.sources import Shard, decompressed

JSONL_BLOCK_BYTES = 8 << 20


MAX_TYPE_SETTLINGS = (
    64  # a run settles a text file's types at most this often: each widens a column's or unifies a file's
)


class _Text(_Rows):
    def memory_bytes(self, shard: Shard) -> int:
        return shard.size_bytes * (6 if shard.compression else 2)


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


TEXT_IN_MEMORY_BYTES = 64 << 20
"""A JSON-lines or CSV file up to this size (decompressed) is read from disk once per run and
scanned, typed and parsed from memory: its hardening scans would otherwise each read it again.
Small beside the memory a run takes anyway; a run whose inputs fit its memory budget with their
text held too lets a larger file be held (:func:`hold_text_within`)."""


def _text_bytes(shard: Shard) -> int:
    """A text shard's decompressed size, estimated from its size on disk."""
    return shard.size_bytes * (6 if shard.compression else 1)


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
