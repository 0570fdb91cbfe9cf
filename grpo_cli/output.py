"""Atomic Parquet output: a single file or a directory of shards.

Everything is written beside the target under a hidden temporary name, flushed to disk
(fsync) and moved into place with ``os.replace`` only when the whole run succeeded, in
the manner of pip's ``adjacent_tmp_file``. A failure or Ctrl-C leaves no partial output
and never touches the input.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from grpo_cli.errors import GrpoError
from grpo_cli.sources import InputSet, Shard

FILE_SUFFIXES = (".parquet", ".pq")


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory
    finally:
        os.close(fd)


def _same_path(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


class _WriterThread:
    """Encodes and compresses batches on a second thread, in order.

    pyarrow releases the GIL while it writes, so pass 2 computes batch N+1 while batch N
    is compressed. The queue is short, so memory stays bounded by a few batches.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[], None], bool] | None] = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="grpo-cli-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            task, must_run = item
            if self._error is None and (not self._stop or must_run):
                try:
                    task()
                except BaseException as exc:  # re-raised on the main thread by check()
                    self._error = exc

    def submit(self, task: Callable[[], None], *, must_run: bool = False) -> None:
        self.check()
        self._queue.put((task, must_run))

    def check(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def finish(self, *, abandon: bool = False) -> None:
        """Wait for every queued task (or, abandoning, skip the writes); raise a write error."""
        self._stop = abandon
        self._queue.put(None)
        self._thread.join()
        if not abandon:
            self.check()


class _ShardWriter:
    def __init__(self, writer: pq.ParquetWriter, thread: _WriterThread, *, shared: bool) -> None:
        self._writer = writer
        self._thread = thread
        self._shared = shared

    def write(self, batch: pa.RecordBatch) -> None:
        self._thread.submit(lambda: self._writer.write_batch(batch))

    def close(self) -> None:
        if not self._shared:
            self._thread.submit(self._writer.close, must_run=True)


class OutputTarget:
    """Where ``compute`` writes: a ``.parquet`` file, or a directory of one shard per input.

    A path ending in ``.parquet`` or ``.pq`` is a single file; any other path is a
    directory whose shards keep the input shards' base names.
    """

    def __init__(self, path: Path, inputs: InputSet, *, force: bool) -> None:
        self.path = path
        self.is_directory = not path.name.lower().endswith(FILE_SUFFIXES)
        self.force = force
        self._token = uuid.uuid4().hex[:12]
        self._temp: Path | None = None
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None
        self._first_shard: Shard | None = None
        self._names: dict[str, Shard] = {}
        self._committed = False
        self._check(inputs)
        self._thread = _WriterThread()

    def _check(self, inputs: InputSet) -> None:
        path = self.path
        if path.name in ("", ".", ".."):
            raise GrpoError(f"{path}: not a usable output path")
        parent = path.parent
        if not parent.is_dir():
            raise GrpoError(f"{path}: the folder {parent} does not exist")
        if not os.access(parent, os.W_OK):
            raise GrpoError(f"{path}: cannot write in {parent}")
        for shard in inputs.shards:
            if not inputs.is_stdin and (_same_path(shard.path, path) or _same_path(shard.path.parent, path)):
                raise GrpoError(f"{path}: the output would overwrite the input {shard.display}")
        if self.is_directory:
            if path.exists() and not path.is_dir():
                raise GrpoError(
                    f"{path}: exists and is not a directory (name a .parquet file for one output file)"
                )
            if path.is_dir() and any(path.iterdir()) and not self.force:
                raise GrpoError(f"{path}: the directory exists and is not empty; pass --force to replace it")
        else:
            if path.is_dir():
                raise GrpoError(f"{path}: is a directory")
            if path.exists() and not self.force:
                raise GrpoError(f"{path}: already exists; pass --force to overwrite it")

    def _temp_path(self) -> Path:
        if self._temp is None:
            self._temp = self.path.parent / f".{self.path.name}.{self._token}.tmp"
            if self.is_directory:
                self._temp.mkdir()
        return self._temp

    def open_shard(self, shard: Shard, schema: pa.Schema, new_columns: int = 2) -> _ShardWriter:
        """A writer for one input shard's rows; the last ``new_columns`` fields are ours."""
        temp = self._temp_path()
        if self.is_directory:
            name = _shard_output_name(shard)
            if name in self._names:
                raise GrpoError(
                    f"{shard.display} and {self._names[name].display} would both be written "
                    f"to {self.path / name}"
                )
            self._names[name] = shard
            return _ShardWriter(_parquet_writer(temp / name, schema, new_columns), self._thread, shared=False)
        if self._writer is None:
            self._writer = _parquet_writer(temp, schema, new_columns)
            self._schema, self._first_shard = schema, shard
        elif not schema.equals(self._schema, check_metadata=False):
            assert self._first_shard is not None
            raise GrpoError(
                f"{shard.display}: its columns differ from those of {self._first_shard.display}; "
                "write to a directory to keep one output shard per input shard"
            )
        return _ShardWriter(self._writer, self._thread, shared=True)

    def commit(self) -> dict[str, Any]:
        """Move the finished output into place; returns what was written."""
        temp = self._temp_path()
        self._thread.finish()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if not self.is_directory and not temp.exists():
            raise GrpoError("no output was produced")
        if self.is_directory:
            files = sorted(temp.iterdir())
            for file in files:
                _fsync_path(file)
            _fsync_path(temp, directory=True)
            size = sum(f.stat().st_size for f in files)
            if self.path.exists():
                old = self.path.parent / f".{self.path.name}.{self._token}.old"
                os.replace(self.path, old)
                os.replace(temp, self.path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(temp, self.path)
            shards = len(files)
        else:
            _fsync_path(temp)
            size = temp.stat().st_size
            os.replace(temp, self.path)
            shards = 1
        _fsync_path(self.path.parent, directory=True)
        self._committed = True
        return {"path": str(self.path), "shards": shards, "bytes": size}

    def discard(self) -> None:
        """Remove whatever an unfinished run left (a no-op after :meth:`commit`)."""
        if self._committed:
            return
        with contextlib.suppress(BaseException):  # the run already failed; cleanup goes on
            self._thread.finish(abandon=True)
        if self._writer is not None:
            with contextlib.suppress(Exception):  # the run already failed; cleanup goes on
                self._writer.close()
            self._writer = None
        if self._temp is not None:
            if self._temp.is_dir():
                shutil.rmtree(self._temp, ignore_errors=True)
            else:
                self._temp.unlink(missing_ok=True)


def _parquet_writer(path: Path, schema: pa.Schema, new_columns: int) -> pq.ParquetWriter:
    # Dictionary-encoding the advantage column (mostly distinct floats) costs more than
    # the rest of the write: keep dictionaries for the input's columns only.
    input_columns = schema.names[: len(schema.names) - new_columns]
    return pq.ParquetWriter(path, schema, use_dictionary=input_columns or False)


def _shard_output_name(shard: Shard) -> str:
    if shard.display == "<stdin>":
        return "stdin.parquet"
    name = shard.path.name
    for suffix in (".jsonl.gz", ".ndjson.gz", ".jsonl", ".ndjson", ".parquet", ".pq"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return f"{name}.parquet"


def write_text_atomically(path: Path, text: str) -> None:
    """Write a small text file (the summary JSON) beside-then-rename."""
    if not path.parent.is_dir():
        raise GrpoError(f"{path}: the folder {path.parent} does not exist")
    temp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise GrpoError(f"{path}: cannot write the summary ({exc.strerror})") from None
