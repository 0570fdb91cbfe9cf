"""Atomic output for both engines: a Parquet file, a directory of Parquet shards, or JSON lines.

Each output shard is written by one of two methods. *splice* (the default for Parquet
input whose rows come out unchanged) copies the input file's bytes and appends the new
columns' chunks and a new footer (:mod:`grpo_cli.outputs.splice`): the input's columns are
never decoded. *rewrite* re-encodes every column with pyarrow: JSONL input, row
filters, ``--rewrite``, several inputs into one file, or a file splice refuses
(encrypted, an empty row group), whose reason the summary gives. A ``.jsonl`` target
(``.gz``, ``.zst``), or ``-`` for standard output, gets every row as one JSON object
per line, encoded by polars.

The target is claimed from the :class:`~grpo_cli.outputs.guard.WriteGuard` before the run
starts; everything is written to the claim's hidden temporary beside it and moved into
place only when the whole run succeeded. A failure or Ctrl-C leaves no partial output
and never touches the input. The local engine writes through :class:`OutputTarget`;
the Ray engine's workers fill the claim's temporary directory and
:func:`commit_directory` moves it into place.
"""

from __future__ import annotations

import contextlib
import io
import math
import queue
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from grpo_cli import interrupts
from grpo_cli.arrow.columns import holds_type, without_views
from grpo_cli.errors import GrpoError, mention, os_reason
from grpo_cli.file_names import PROVENANCE_KEY, READ_SUFFIXES, output_format
from grpo_cli.inputs.sources import Shard
from grpo_cli.outputs.guard import Claim
from grpo_cli.outputs.splice import SplicedFile, SpliceRefused
from grpo_cli.stages import timed

if TYPE_CHECKING:
    from grpo_cli.options.config import ComputeConfig

_T = TypeVar("_T")


def splice_refusal(config: ComputeConfig, shards: Sequence[Shard]) -> str | None:
    """Why no shard of a run can be spliced, or ``None`` when its Parquet shards may be."""
    if config.rewrite:
        return "--rewrite re-encodes every column"
    if config.drop_inactive or config.keep_mean_range is not None:
        return "rows are filtered, so every column is re-encoded"
    if any(shard.display == "<stdin>" for shard in shards):
        return "standard input is re-encoded (only Parquet files are spliced)"
    others = [shard for shard in shards if shard.format != "parquet"]
    if len(others) == len(shards):
        return "only Parquet input can be spliced"
    if others:
        return (
            f"{others[0].display} is {others[0].format} input, and a run is spliced only when "
            "every input is Parquet"
        )
    return None


def open_output(claim: Claim, config: ComputeConfig, shards: Sequence[Shard]) -> OutputTarget:
    """The run's :class:`OutputTarget`, with its spliced shards' bytes already being copied."""
    target = OutputTarget(claim, compression=config.compression)
    try:
        target.start_splices(shards, splice_refusal(config, shards))
    except BaseException:
        target.discard()
        raise
    return target


class _WriterThread:
    """Encodes and compresses batches on a second thread, in order.

    pyarrow releases the GIL while it writes, so pass 2 computes batch N+1 while batch N
    is compressed. The queue is short, so memory stays bounded by a few batches.
    """

    def __init__(self, label: str) -> None:
        self._label = label
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
                    with timed("write"):
                        task()
                except BaseException as exc:  # re-raised on the main thread by check()
                    self._error = exc

    def submit(self, task: Callable[[], None], *, must_run: bool = False) -> None:
        self.check()
        self._queue.put((task, must_run))

    def check(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, OSError):
                raise GrpoError(
                    f"{self._label}: cannot write the output ({os_reason(error)}); nothing was written"
                ) from None
            raise error

    def finish(self, *, abandon: bool = False) -> None:
        """Wait for every queued task (or, abandoning, skip the writes); raise a write error."""
        self._stop = abandon
        self._queue.put(None)
        self._thread.join()
        if not abandon:
            self.check()


class _PrefixCopier:
    """Copies spliced outputs' prefixes (the input files' bytes) on its own thread, in order.

    Started as the run starts, so the copy (in the kernel, without the GIL) overlaps
    importing torch and pass 1; each :class:`~grpo_cli.outputs.splice.SplicedFile` waits for its
    own prefix before it writes. Errors are kept by the files and raised where they write.
    """

    def __init__(self) -> None:
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, files: Sequence[SplicedFile]) -> None:
        if not files:
            return

        def copy_all() -> None:
            with timed("copy"):
                for file in files:
                    file.copy_prefix(cancelled=self._cancel.is_set)

        self._thread = threading.Thread(target=copy_all, name="grpo-cli-copier", daemon=True)
        self._thread.start()

    def finish(self, *, cancel: bool = False) -> None:
        """Wait for the copies (``cancel``: stop them at the next piece)."""
        if cancel:
            self._cancel.set()
        if self._thread is not None:
            self._thread.join()


class ShardWriter:
    """Re-encodes whole batches (input columns and new ones) on the writer thread."""

    spliced = False

    def __init__(self, writer: pq.ParquetWriter, thread: _WriterThread, *, shared: bool) -> None:
        self._writer = writer
        self._thread = thread
        self._shared = shared

    def write(self, batch: pa.RecordBatch) -> None:
        self._thread.submit(lambda: self._writer.write_batch(batch))

    def close(self) -> None:
        if not self._shared:
            self._thread.submit(self._writer.close, must_run=True)


class SplicedShardWriter:
    """Writes the new columns only, spliced into a copy of the input file's bytes."""

    spliced = True

    def __init__(self, spliced: SplicedFile, handle: IO[bytes], thread: _WriterThread) -> None:
        self._spliced = spliced
        self._handle = handle
        self._thread = thread

    def write_new(self, arrays: list[pa.Array]) -> None:
        self._thread.submit(lambda: self._spliced.add(arrays))

    def close(self) -> None:
        def finish() -> None:
            try:
                self._spliced.close()
            finally:
                self._handle.close()

        self._thread.submit(finish, must_run=True)

    def abandon(self) -> None:
        self._spliced.abandon()
        self._handle.close()


class _OneFile:
    """The columns of the shards written into one output file: a column two shards hold has
    one type in both (a CSV's text ``reward`` beside a JSON number would make JSON lines that
    mix text and numbers in one field, which no reader, grpo-cli's included, takes back as one
    column); a Parquet file also holds one set of columns (a JSON line, the fields its row has).
    A shard that breaks either is refused, naming the column."""

    def __init__(self, output_format: str) -> None:
        self.parquet = output_format == "parquet"
        self.first: tuple[pa.Schema, Shard] | None = None
        self.types: dict[str, tuple[pa.DataType, Shard]] = {}

    def admit(self, shard: Shard, schema: pa.Schema) -> None:
        for field in schema:
            kind, holder = self.types.setdefault(field.name, (field.type, shard))
            if not kind.equals(field.type):
                raise GrpoError(
                    f"{shard.display}: column {field.name!r} is {field.type} here and {kind} in "
                    f"{holder.display}; one output file holds one type a column: write to a directory to "
                    "keep one Parquet shard per input, or convert the inputs to one format first"
                )
        if self.first is None:
            self.first = (schema, shard)
        elif self.parquet and not schema.equals(self.first[0], check_metadata=False):
            raise GrpoError(
                f"{shard.display}: its columns differ from those of {self.first[1].display} "
                f"({_first_difference(self.first[0], schema)}); write to a directory to keep one output "
                "shard per input shard"
            )


def _first_difference(first: pa.Schema, other: pa.Schema) -> str:
    """The first way ``other``'s columns differ from ``first``'s, in words.

    >>> _first_difference(pa.schema([("r", pa.string())]), pa.schema([("r", pa.float64())]))
    "column 'r' is double here, string there"
    """
    for field in other:
        index = first.get_field_index(field.name)
        if index < 0:
            return f"column {field.name!r} is not there"
        if not first.field(index).type.equals(field.type):
            return f"column {field.name!r} is {field.type} here, {first.field(index).type} there"
    missing = [name for name in first.names if name not in other.names]
    if missing:
        return f"column {missing[0]!r} is not here"
    return "the columns come in another order"


class JsonlShardWriter:
    """Appends whole batches as JSON lines to the one JSONL output, on the writer thread."""

    spliced = False

    def __init__(self, sink: _JsonlSink, thread: _WriterThread, label: str = "") -> None:
        self._sink = sink
        self._thread = thread
        self._label = label

    def write(self, batch: pa.RecordBatch) -> None:
        self._thread.submit(lambda: self._sink.write(batch, self._label))

    def close(self) -> None:
        pass  # the sink is shared by every shard; the target closes it


class _JsonlSink:
    """The JSONL output file, compressed as its name says."""

    def __init__(self, path: Path, name: str) -> None:
        compression = "gzip" if name.endswith(".gz") else "zstd" if name.endswith(".zst") else None
        self._handle = pa.output_stream(str(path), compression=compression)

    def write(self, batch: pa.RecordBatch, label: str = "") -> None:
        import polars as pl

        for index, field in enumerate(batch.schema):
            if pa.types.is_map(field.type):
                _refuse_repeated_map_keys(batch.column(index), field.name, label)
        # JSON lines carry no schema metadata, and polars panics on keys that are not UTF-8
        plain = pa.schema([field.remove_metadata() for field in batch.schema])
        frame = pl.from_arrow(pa.RecordBatch.from_arrays(batch.columns, schema=plain))
        assert isinstance(frame, pl.DataFrame)
        lines = io.BytesIO()
        frame.write_ndjson(lines)
        self._handle.write(lines.getbuffer())

    def close(self) -> None:
        self._handle.close()


def _refuse_repeated_map_keys(column: pa.Array, name: str, label: str) -> None:
    """A map with a key twice in one row would become a JSON object that gives a field twice:
    readers keep one of the values (grpo-cli refuses such JSON)."""
    import numpy as np
    import pyarrow.compute as pc

    offsets = column.offsets.to_numpy(zero_copy_only=False)
    if not len(column) or offsets[-1] == offsets[0]:
        return
    rows = np.repeat(np.arange(len(column)), np.diff(offsets))
    keys = column.keys.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    keys = keys.cast(without_views(keys.type))
    pairs = pa.table({"row": rows, "key": keys})
    counts = pairs.group_by(["row", "key"]).aggregate([([], "count_all")])
    repeated = pc.greater(counts.column("count_all"), 1)
    if pc.any(repeated).as_py():
        at = counts.filter(repeated)
        raise GrpoError(
            f"{label}: column {name!r} holds a map with the key {at.column('key')[0].as_py()!r} twice in "
            "a row, which a JSON object cannot hold; write Parquet"
        )


def _is_raw_bytes(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(data_type)
        or pa.types.is_large_binary(data_type)
        or pa.types.is_fixed_size_binary(data_type)
        or pa.types.is_binary_view(data_type)
    )


def _json_cannot_hold(data_type: pa.DataType) -> bool:
    """Types polars' JSON writer has no form for (it panics or refuses on them)."""
    return bool(
        pa.types.is_union(data_type)
        or pa.types.is_interval(data_type)
        or pa.types.is_list_view(data_type)
        or pa.types.is_large_list_view(data_type)
        or pa.types.is_run_end_encoded(data_type)
        or pa.types.is_decimal256(data_type)
        or isinstance(data_type, pa.BaseExtensionType)
    )


def _json_refusal(schema: pa.Schema) -> str | None:
    """Why JSON lines cannot hold a column of ``schema``, or ``None``."""
    for column in schema:
        if holds_type(column.type, _is_raw_bytes):
            return f"column {column.name!r} holds raw bytes ({column.type}), which JSON cannot; write Parquet"
        if holds_type(column.type, _json_cannot_hold):
            return (
                f"column {column.name!r} has type {column.type}, which grpo-cli cannot write as JSON; "
                "write Parquet"
            )
    return None


def _parquet_refusal(schema: pa.Schema) -> str | None:
    """Why Parquet cannot hold a column of ``schema`` (Arrow's own schema conversion says), or ``None``."""

    def refusal(part: pa.Schema) -> str | None:
        try:
            pq.ParquetWriter(io.BytesIO(), part).close()
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            return str(exc).strip().splitlines()[0].rstrip(".")
        return None

    if refusal(schema) is None:
        return None
    for column in schema:
        why = refusal(pa.schema([column]))
        if why is not None:
            other = "" if _json_refusal(pa.schema([column])) else "; write JSON lines (-o FILE.jsonl)"
            return f"column {column.name!r} has type {column.type}, which Parquet cannot hold ({why}){other}"
    return refusal(schema)


def output_refusal(schema: pa.Schema, output_format: str) -> str | None:
    """Why an output of ``output_format`` (``parquet`` or ``jsonl``) cannot hold ``schema``'s
    columns, or ``None``: asked before any work, so that nothing is read in vain.

    >>> output_refusal(pa.schema([("meta", pa.struct([]))]), "parquet")  # doctest: +ELLIPSIS
    "column 'meta' has type struct<>, which Parquet cannot hold (Cannot write struct type 'meta' ...)..."
    >>> output_refusal(pa.schema([("meta", pa.struct([]))]), "jsonl") is None
    True
    """
    return _json_refusal(schema) if output_format == "jsonl" else _parquet_refusal(schema)


class OutputTarget:
    """Where ``compute`` writes: a ``.parquet`` file, or a directory of one shard per input.

    ``claim`` is the output path claimed from the run's write guard; a directory claim
    gets shards named after the input shards. A ``.jsonl`` name or ``-`` (standard output)
    gets JSON lines (:attr:`format` is ``jsonl``).
    """

    def __init__(self, claim: Claim, *, compression: str = "snappy") -> None:
        self.claim = claim
        self.path = claim.path
        self.is_directory = claim.directory
        self.compression = compression
        self.methods: dict[str, int] = {}
        self.rewrite_reasons: list[str] = []
        self._spliced: list[SplicedShardWriter] = []
        self._writer: pq.ParquetWriter | None = None
        self._names: dict[str, Shard] = {}
        self._thread = _WriterThread(claim.display)
        self.format = output_format(str(claim.path))
        self._inputs_columns = _OneFile(self.format)  # checked before any work
        self._written_columns = _OneFile(self.format)  # and as each shard is written
        self._jsonl: _JsonlSink | None = None
        self._splices: dict[Shard, tuple[SplicedFile, IO[bytes]]] = {}
        self._copier = _PrefixCopier()
        self._discarded = False
        self._int96: bool | None = None
        self._int96_of: dict[Shard, bool] = {}

    def refuse_unwritable(self, shard: Shard, schema: pa.Schema) -> None:
        """Refuse, in one line, a shard whose columns this output's format cannot hold, or
        (re-encoded Parquet) whose Parquet types re-encoding would change, or (one output file)
        whose columns differ from the first shard's: before any work."""
        if not self.is_directory and len(schema):  # an empty JSON lines shard has no columns
            self._inputs_columns.admit(shard, schema)
        refusal = output_refusal(schema, self.format)
        if (
            refusal is None
            and self.format == "parquet"
            and shard.format == "parquet"
            and shard not in self._splices
        ):
            refusal, int96 = reencoding_refusal(shard)
            if refusal is None and self._int96 is not None and int96 != self._int96 and not self.is_directory:
                refusal = (
                    "its timestamps are INT96 in some inputs and INT64 in others; one file keeps one kind"
                )
            self._int96 = int96 if self._int96 is None else self._int96
            self._int96_of[shard] = int96
        if refusal is not None:
            raise GrpoError(f"{shard.display}: {refusal}")

    def open_shard(self, shard: Shard, schema: pa.Schema, new_columns: int) -> ShardWriter | JsonlShardWriter:
        """A re-encoding writer for one input shard's rows; the last ``new_columns`` fields are ours."""
        if shard in self._splices:
            raise AssertionError(f"{shard.display} is being spliced; it cannot be re-encoded too")
        path = self._shard_path(shard)
        self.methods["rewrite"] = self.methods.get("rewrite", 0) + 1
        if not self.is_directory:
            self._written_columns.admit(shard, schema)
        if self.format == "jsonl":  # the engine refused what JSON cannot hold before any work
            if self._jsonl is None:
                self._jsonl = self._guarded(lambda: _JsonlSink(path, str(self.path).lower()))
            return JsonlShardWriter(self._jsonl, self._thread, shard.display)
        int96 = self._int96_of.get(shard, False)
        if self.is_directory:
            writer = self._guarded(
                lambda: _parquet_writer(path, schema, new_columns, self.compression, int96)
            )
            return ShardWriter(writer, self._thread, shared=False)
        if self._writer is None:
            self._writer = self._guarded(
                lambda: _parquet_writer(path, schema, new_columns, self.compression, int96)
            )
        return ShardWriter(self._writer, self._thread, shared=True)

    def commit(self) -> dict[str, Any]:
        """Move the finished output into place; returns what was written (not where a stop was
        asked for and its exception lost: :mod:`grpo_cli.interrupts`)."""
        interrupts.raise_if_requested()
        temp = self.claim.temp_path()
        if self._splices:
            names = ", ".join(shard.display for shard in self._splices)
            raise AssertionError(f"{names}: spliced but never written")
        self._guarded(self._copier.finish)
        self._guarded(self._thread.finish)
        if self._writer is not None:
            writer, self._writer = self._writer, None
            self._guarded(writer.close)
        if self._jsonl is not None:
            sink, self._jsonl = self._jsonl, None
            self._guarded(sink.close)
        if not self.is_directory and not temp.exists():
            raise GrpoError("no output was produced")
        files = sorted(temp.iterdir()) if self.is_directory else [temp]
        info = output_info(self.claim.display, files)
        info["method"] = next(iter(self.methods)) if len(self.methods) == 1 else "mixed"
        info["shards_by_method"] = dict(sorted(self.methods.items()))
        info["format"] = self.format
        if self.rewrite_reasons:
            info["rewrite_reason"] = self.rewrite_reasons[0]
        self.claim.commit()
        if self.claim.transfer is not None:
            info["transfer"] = self.claim.transfer
        return info

    def start_splices(self, shards: Sequence[Shard], refusal: str | None) -> None:
        """Decide which of ``shards`` are spliced, and start copying their bytes at once (once).

        ``refusal``: why no shard of the run can be spliced (:func:`splice_refusal`), or
        ``None``. The copies run on their own thread while the run imports torch and reads
        the keys; the reason each other shard is re-encoded is noted for the summary.
        """
        if self.format == "jsonl":
            return
        if refusal is None and not self.is_directory and len(shards) > 1:
            refusal = "several input shards into one file are re-encoded (write to a directory to splice)"
        for shard in shards:
            if refusal is not None:
                self._rewrite_because(f"{shard.display}: {refusal}")
            else:
                self._prepare_splice(shard)
        self._copier.start([spliced for spliced, _ in self._splices.values()])

    def _prepare_splice(self, shard: Shard) -> None:
        path = self._shard_path(shard)
        handle = self._guarded(lambda: open(path, "wb"))  # noqa: SIM115 (closed by the writer)
        try:
            spliced = self._guarded(lambda: SplicedFile(shard.path, handle))
        except SpliceRefused as refused:
            handle.close()
            self._rewrite_because(f"{shard.display}: {refused}")
            return
        except BaseException:
            handle.close()
            raise
        self._splices[shard] = (spliced, handle)

    def open_spliced(self, shard: Shard, schema: pa.Schema, new_columns: int) -> SplicedShardWriter | None:
        """The writer of the new columns spliced into ``shard``'s copied bytes.

        ``None`` when :meth:`start_splices` decided to re-encode the shard (the reason is
        noted): then call :meth:`open_shard`.
        """
        if shard not in self._splices:
            return None
        spliced, handle = self._splices.pop(shard)
        new_schema = pa.schema(list(schema)[len(schema) - new_columns :])
        metadata = {k: v for k, v in (schema.metadata or {}).items() if k == PROVENANCE_KEY}
        spliced.begin(new_schema, metadata, compression=self.compression)
        if shard.remote is not None and shard.remote.startswith("s3://"):
            # the output begins with the input's bytes up to its footer: S3 copies them itself
            name = output_name_of(shard) if self.is_directory else ""
            self.claim.note_copied_prefix(name, shard.remote, spliced.footer.start)
        self.methods["splice"] = self.methods.get("splice", 0) + 1
        writer = SplicedShardWriter(spliced, handle, self._thread)
        self._spliced.append(writer)
        return writer

    def _shard_path(self, shard: Shard) -> Path:
        """Where ``shard``'s output goes: the temporary file, or its name in the temporary folder."""
        if self._discarded:
            raise AssertionError("this output target was discarded; make a new one (open_output())")
        temp = self.claim.temp_path()
        if not self.is_directory:
            return temp
        name = output_name_of(shard)
        if self._names.get(name, shard) is not shard:
            raise GrpoError(
                f"{shard.display} and {self._names[name].display} would both be written to {self.path / name}"
            )
        self._names[name] = shard
        return temp / name

    def _rewrite_because(self, reason: str) -> None:
        self.rewrite_reasons.append(reason)

    def discard(self) -> None:
        """Remove whatever an unfinished run left (a no-op after :meth:`commit`)."""
        if self.claim.committed or self._discarded:
            return
        self._discarded = True
        with contextlib.suppress(BaseException):  # the run already failed; cleanup goes on
            self._copier.finish(cancel=True)
        with contextlib.suppress(BaseException):  # the run already failed; cleanup goes on
            self._thread.finish(abandon=True)
        for spliced in self._spliced:
            with contextlib.suppress(Exception):  # the run already failed; cleanup goes on
                spliced.abandon()
        for spliced_file, handle in self._splices.values():
            with contextlib.suppress(Exception):  # the run already failed; cleanup goes on
                spliced_file.abandon()
                handle.close()
        self._splices.clear()
        if self._writer is not None:
            with contextlib.suppress(Exception):  # the run already failed; cleanup goes on
                self._writer.close()
            self._writer = None
        if self._jsonl is not None:
            with contextlib.suppress(Exception):  # the run already failed; cleanup goes on
                self._jsonl.close()
            self._jsonl = None
        self.claim.discard()

    def _guarded(self, write: Callable[[], _T]) -> _T:
        """Run a write; a full disk or a failing device becomes one line naming the output."""
        try:
            return write()
        except OSError as exc:
            raise GrpoError(
                f"{self.claim.display}: cannot write the output ({os_reason(exc)}); nothing was written"
            ) from None


def output_info(display: str, files: list[Path]) -> dict[str, Any]:
    """The summary's ``output`` object: where, how many shards, how many bytes."""
    return {"path": display, "shards": len(files), "bytes": sum(f.stat().st_size for f in files)}


def commit_directory(claim: Claim) -> list[Path]:
    """Move a directory that another writer filled at ``claim.temp_path()`` into place.

    Returns the Parquet files now in the output directory.
    """
    claim.commit()
    return sorted(claim.resolved.glob("*.parquet"))


def advantage_range(files: list[Path], column: str) -> tuple[float, float] | None:
    """The extremes of ``column`` over Parquet ``files``, from their column statistics.

    ``None`` when a non-empty row group has no statistics.
    """
    return footers_range([pq.read_metadata(file) for file in files], column)


def footers_range(footers: Sequence[pq.FileMetaData], column: str) -> tuple[float, float] | None:
    """:func:`advantage_range` over Parquet footers already read (files on a store, say)."""
    low, high = math.inf, -math.inf
    for meta in footers:
        index = meta.schema.to_arrow_schema().get_field_index(column)
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(index).statistics
            if stats is None or not stats.has_min_max:
                if meta.row_group(group).num_rows:
                    return None
                continue
            low, high = min(low, float(stats.min)), max(high, float(stats.max))
    return (low, high) if low <= high else None


def _parquet_writer(
    path: Path, schema: pa.Schema, new_columns: int, compression: str, int96: bool = False
) -> pq.ParquetWriter:
    # Dictionary-encoding the advantage column (mostly distinct floats) costs more than
    # the rest of the write: keep dictionaries for the input's columns only.
    input_columns = schema.names[: len(schema.names) - new_columns]
    return pq.ParquetWriter(
        path,
        schema,
        use_dictionary=input_columns or False,
        compression=compression,
        use_deprecated_int96_timestamps=int96,
    )


_PARQUET_NODE = re.compile(
    r"^\s*(?:required|optional|repeated) (\w+) field_id=\S+ ([^ ;{]+)(?: \(([A-Za-z]+))?"
)
_KEPT_ONLY_BY_SPLICING = {"Geometry": "GEOMETRY", "Geography": "GEOGRAPHY", "Variant": "VARIANT"}


def reencoding_refusal(shard: Shard) -> tuple[str | None, bool]:
    """Why re-encoding a Parquet ``shard`` would change a column's Parquet type, or ``None``;
    and whether its timestamps are INT96 (Impala's and Spark's), which re-encoding keeps.

    pyarrow reads GEOMETRY, GEOGRAPHY and VARIANT columns as plain binary and structs, and
    would write them back without their logical type; splicing copies their bytes as they are.
    """
    try:
        text = str(pq.read_metadata(shard.path).schema)
    except (pa.ArrowException, OSError):
        return None, False  # the reader reports an unreadable file with its own words
    int96 = other_timestamps = False
    for line in text.splitlines()[1:]:
        found = _PARQUET_NODE.match(line)
        if found is None:
            continue
        physical, name, annotation = found.groups()
        if annotation in _KEPT_ONLY_BY_SPLICING:
            return (
                f"column {name!r} has the Parquet type {_KEPT_ONLY_BY_SPLICING[annotation]}, which "
                f"re-encoding would drop (pyarrow reads it as plain data); leave out {mention('rewrite')} "
                "and row "
                "filters, and write one output shard per input, so that its bytes are spliced as they are"
            ), False
        int96 |= physical == "int96"
        other_timestamps |= annotation == "Timestamp"
    if int96 and other_timestamps:
        return (
            "it holds INT96 and INT64 timestamps, and re-encoding keeps only one kind; leave out "
            f"{mention('rewrite')} "
            "and row filters, so that its bytes are spliced as they are"
        ), False
    return None, int96


def output_name_of(shard: Shard) -> str:
    """The name of ``shard``'s output in an output directory (both engines)."""
    if shard.display == "<stdin>":
        return "stdin.parquet"
    name = Path(shard.display).name
    for suffix in sorted(READ_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return f"{name}.parquet"


class MemoryTarget:
    """The table API's output: the rows kept in memory as one Arrow table.

    Offers what the local engine uses of :class:`OutputTarget`; nothing touches a disk.
    """

    format = "table"
    is_directory = False

    def __init__(self) -> None:
        self._batches: list[pa.RecordBatch] = []
        self._schema: pa.Schema | None = None

    def open_spliced(self, shard: Shard, schema: pa.Schema, new_columns: int) -> None:
        return None

    def open_shard(self, shard: Shard, schema: pa.Schema, new_columns: int) -> MemoryTarget:
        self._schema = schema
        return self

    def write(self, batch: pa.RecordBatch) -> None:
        self._batches.append(batch)

    def close(self) -> None:
        pass

    def commit(self) -> None:
        """Nothing to move into place: the caller takes :meth:`table`."""

    def discard(self) -> None:
        pass

    def table(self) -> pa.Table:
        """Every row written, in order (an empty table of the output schema if none)."""
        assert self._schema is not None, "no shard was opened"
        return pa.Table.from_batches(self._batches, schema=self._schema)
