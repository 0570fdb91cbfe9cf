"""The run's files as Ray reads them: Parquet where they are (a store's objects listed, their
footers read side by side), other formats staged as Parquet first."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from grpo_cli.choices import InputFormat
from grpo_cli.errors import GrpoError, first_line, mention
from grpo_cli.file_names import PARQUET_SUFFIXES, output_is_directory
from grpo_cli.inputs.protected import ProtectedInputs
from grpo_cli.inputs.readers import row_count
from grpo_cli.inputs.sources import InputSet, Shard
from grpo_cli.options.config import ComputeConfig
from grpo_cli.run.columns import check_columns
from grpo_cli.run.outcome import OutcomeTotals
from grpo_cli.run.plan import RunPlan
from grpo_cli.stores import check_scheme, gcs_filesystem, local_path


@dataclass(frozen=True)
class InputFile:
    """One Parquet file of the input, in input order: a local path or an object-store URI
    (``staged``: a private Parquet copy of another format, on this machine's disk)."""

    source: str
    display: str
    rows: int
    size_bytes: int
    staged: bool = False
    format: str = "parquet"  # the format the user's file is in (a staged copy is Parquet)
    offset: int = 0  # the file's first row in the whole input (--group-size: rows are groups by position)
    schema: pa.Schema | None = field(default=None, compare=False)  # an object's, read with its row count

    def shard(self) -> Shard:
        """The file as the plan and the error messages name it (a CSV's numbers are text)."""
        return Shard(Path(self.source), self.display, self.format, self.size_bytes)


@dataclass(frozen=True)
class RayInputs:
    """What ``--engine ray`` reads: every Parquet file in input order (local ones checked
    here, URIs listed on their file system), and the local shards and folders to protect."""

    spec: str
    files: list[InputFile]
    shards: list[Shard]
    directories: list[Path]
    about: dict[str, Any] | None = None  # a trainer's dump: what read it (the summary's input.from)
    uris: list[str] = field(default_factory=list)  # the URIs named as inputs

    @property
    def paths(self) -> list[str]:
        return [file.source for file in self.files]

    def protected(self) -> ProtectedInputs:
        """What no output of this run may touch: every input file and folder, local or on a
        store (a ``file://`` URI is its local path)."""
        files = [(shard.path, shard.display) for shard in self.shards]
        directories, uris = list(self.directories), []
        for uri in self.uris:
            if check_scheme(uri) != "file":
                uris.append(uri)
                continue
            path = Path(local_path(uri))
            if path.is_dir():
                directories.append(path)
            else:
                files.append((path, uri))
        return ProtectedInputs.of(files, directories, uris)


def check_ray_run(output: str | None, config: ComputeConfig, *, partitions: int | None) -> None:
    """Refuse, before any work, what ``--engine ray`` cannot do."""
    config.validate()
    if partitions is not None and partitions < 1:
        raise GrpoError(f"{mention('partitions')} must be positive, got {partitions}")
    if config.device not in ("cpu", "auto"):
        raise GrpoError(
            f"{mention('engine')} ray computes on the CPUs of the Ray workers; leave {mention('device')} as "
            "cpu"
        )
    if output is not None and not is_remote(output) and not output_is_directory(output):
        raise GrpoError(
            f"{output}: {mention('engine')} ray writes a directory of Parquet files; name a directory"
        )


def is_remote(path: str) -> bool:
    """An object-store URI (``s3://...``), read through pyarrow's file systems."""
    return "://" in path


def resolve_inputs(
    input: str | Sequence[str] | InputSet,
    *,
    staging: contextlib.ExitStack,
    input_format: InputFormat | None = None,
    cluster: bool = False,
) -> RayInputs:
    """Local files, directories and globs resolved to Parquet files; URIs listed on their file
    system (a file, or a folder's Parquet files in name order).

    Every other input (JSON lines, CSV, Arrow IPC, standard input, a trainer's dump: an
    :class:`InputSet` already opened) is read by the local engine's readers, with their checks,
    and written to a private Parquet file in ``staging`` (removed when it closes) that Ray's
    tasks read: the same rows, columns and types, on this machine's disk. So they are refused
    on a ``cluster``, whose workers do not see this machine's disk.
    """
    inputs = _resolve_inputs(input, staging, input_format)
    offsets = itertools.accumulate((file.rows for file in inputs.files), initial=0)
    inputs = replace(
        inputs, files=[replace(f, offset=o) for f, o in zip(inputs.files, offsets, strict=False)]
    )
    staged = next((file for file in inputs.files if file.staged), None)
    if cluster and staged is not None:
        raise GrpoError(
            f"{staged.display}: a Ray cluster's workers read Parquet files and object-store URIs; "
            f"JSON lines, CSV, Arrow, standard input and {mention('from_')} dumps run on a local Ray "
            "instance "
            f"(no {mention('ray_address')}) or the local engine"
        )
    return inputs


def _resolve_inputs(
    input: str | Sequence[str] | InputSet, staging: contextlib.ExitStack, input_format: InputFormat | None
) -> RayInputs:
    if isinstance(input, InputSet):
        return _resolved(input, staging, input.spec, [])
    specs = [input] if isinstance(input, str) else list(input)
    files: list[InputFile] = []
    shards: list[Shard] = []
    directories: list[Path] = []
    uris: list[str] = []
    about = None
    for spec in specs:
        if is_remote(spec):
            files += _remote_files(spec)
            uris.append(spec)
            continue
        inputs = staging.enter_context(InputSet(spec, input_format=input_format))
        resolved = _resolved(inputs, staging, spec, files)
        files, about = resolved.files, about or resolved.about
        shards += inputs.shards
        directories += inputs.directories
    return RayInputs(", ".join(specs), files, shards, directories, about, uris)


def _resolved(
    inputs: InputSet, staging: contextlib.ExitStack, spec: str, files: list[InputFile]
) -> RayInputs:
    """``inputs``' shards after ``files``: a Parquet file as it is, any other shard staged."""
    files = list(files)
    for shard in inputs.shards:
        if shard.format == "parquet" and shard.source == shard.path:
            # absolute: a worker of a cluster runs in a folder of its own
            source = os.path.abspath(shard.path)
            files.append(InputFile(source, shard.display, row_count(shard) or 0, shard.size_bytes))
        else:
            files.append(_staged_parquet(shard, staging))
    return RayInputs(
        spec, files, list(inputs.shards), list(inputs.directories), inputs.about, list(inputs.uris)
    )


def _staged_parquet(shard: Shard, staging: contextlib.ExitStack) -> InputFile:
    """``shard`` as a private Parquet file, read through the local engine's reader (types settled
    where a text file's column changes type after its first block, as the local engine settles them)."""
    from grpo_cli.inputs.readers import MAX_TYPE_SETTLINGS, SchemaDrift
    from grpo_cli.scratch import spool

    for _ in range(MAX_TYPE_SETTLINGS):
        try:
            path = staging.enter_context(
                spool(None, label=shard.display, write=functools.partial(_write_parquet, shard))
            )
        except SchemaDrift as drift:
            drift.settle()
            continue
        rows = pq.ParquetFile(path).metadata.num_rows
        return InputFile(str(path), shard.display, rows, shard.size_bytes, staged=True, format=shard.format)
    raise GrpoError(f"{shard.display}: the column types could not be settled")


def _write_parquet(shard: Shard, out: Any) -> None:
    from grpo_cli.inputs.readers import iter_batches, read_schema

    writer = None
    try:
        for batch in iter_batches(shard, None, 1 << 16):
            if writer is None:
                writer = pq.ParquetWriter(out, batch.schema)
            writer.write_batch(batch)
        if writer is None:  # no rows: the schema alone
            writer = pq.ParquetWriter(out, read_schema(shard))
    finally:
        if writer is not None:
            writer.close()


def _write_empty(schema: pa.Schema, folder: str, filesystem: Any) -> str:
    """One Parquet file of no rows with the output's ``schema`` in ``folder``: an output whose
    rows were all filtered out keeps its columns and provenance, as the local engine's does."""
    path = f"{folder.rstrip('/')}/part-00000.parquet"
    pq.write_table(schema.empty_table(), path, filesystem=filesystem)
    return path


def _open_remote(uri: str) -> Any:
    """A URI's file system and the path on it: ``gs://`` through gcsfs, as the local engine
    reads it (the same credentials and ``STORAGE_EMULATOR_HOST``; pyarrow's own GCS client
    waits minutes for a metadata server where there are no credentials), others through
    pyarrow's file systems."""
    import pyarrow.fs as pafs

    scheme, _, rest = uri.partition("://")
    try:
        if scheme.lower() in ("gs", "gcs"):
            return pafs.PyFileSystem(pafs.FSSpecHandler(gcs_filesystem())), rest
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise GrpoError(f"{uri}: cannot open its file system ({first_line(exc)})") from None


def _written_footers(
    files: Sequence[Path | str], totals: OutcomeTotals, display: str, *, filesystem: Any = None
) -> list[pq.FileMetaData]:
    """The footers of the files Ray wrote (``filesystem``: a store's), read once, side by side;
    refused where they hold fewer or more rows than the run writes: a cluster's workers that
    wrote a local path on their own disks (no file system shared at that path) leave only some
    of the shards where the driver looks."""
    footers = side_by_side_requests(functools.partial(pq.read_metadata, filesystem=filesystem), files)
    expected = totals.rows - totals.dropped_rows
    found = sum(footer.num_rows for footer in footers)
    if found != expected:
        raise GrpoError(
            f"{display}: the Ray workers' files hold {found:,} of the output's {expected:,} rows where "
            "this machine sees them, so nothing was written; on a cluster, write to object storage "
            "or to a file system every node shares at the same path"
        )
    return footers


def _files_under(filesystem: Any, folder: str) -> list[str]:
    import pyarrow.fs as pafs

    found = filesystem.get_file_info(pafs.FileSelector(folder, recursive=True))
    return sorted(info.path for info in found if info.type == pafs.FileType.File)


def _remote_files(uri: str) -> list[InputFile]:
    import pyarrow.fs as pafs

    fs, root = _open_remote(uri)
    scheme = uri.split("://", 1)[0]
    try:
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.NotFound:
            raise GrpoError(f"{uri}: no such file or folder")
        if info.type == pafs.FileType.Directory:
            found = fs.get_file_info(pafs.FileSelector(root, recursive=True))
            entries = sorted(
                (f for f in found if f.type == pafs.FileType.File and f.path.endswith(PARQUET_SUFFIXES)),
                key=lambda f: f.path,
            )
            entries = [f for f in entries if not _hidden(f.path[len(root) :])]
        else:
            entries = [info]

        def described(entry: Any) -> InputFile:
            source = f"{scheme}://{entry.path}"
            with fs.open_input_file(entry.path) as handle:
                metadata = pq.ParquetFile(handle).metadata
            return InputFile(
                source, source, metadata.num_rows, entry.size or 0, schema=metadata.schema.to_arrow_schema()
            )

        files = side_by_side_requests(described, entries)
    except (pa.ArrowException, OSError) as exc:
        raise GrpoError(f"{uri}: not a readable Parquet input ({first_line(exc)})") from None
    if not files:
        raise GrpoError(f"{uri}: no Parquet files")
    return files


STORE_REQUESTS_AT_ONCE = 16
"""How many objects' footers the driver reads at once: each read is a request to the store."""


T = TypeVar("T")


U = TypeVar("U")


def side_by_side_requests(read: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """``read(item)`` for each item, in order, :data:`STORE_REQUESTS_AT_ONCE` at a time: one
    after the other, each request waits out the store's round trip (200 objects behind 20 ms
    took 10 s a pass, three passes). The first error, in the items' order, is raised.

    >>> side_by_side_requests(lambda x: x * 2, [1, 2, 3])
    [2, 4, 6]
    """
    if len(items) < 2:
        return [read(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(
        min(STORE_REQUESTS_AT_ONCE, len(items)), thread_name_prefix="grpo-cli-footers"
    ) as pool:
        return list(pool.map(read, items))


def _hidden(relative: str) -> bool:
    """A path below the folder with a part starting with ``.`` or ``_`` (Spark's and Ray's own files)."""
    return any(part.startswith((".", "_")) for part in relative.split("/") if part)


def _open_file(file: InputFile) -> Any:
    """What pyarrow reads ``file`` from: its path, or a handle on its file system."""
    if not is_remote(file.source):
        return file.source
    fs, path = _open_remote(file.source)
    return fs.open_input_file(path)


def _read_schema(file: InputFile) -> pa.Schema:
    if file.schema is not None:  # an object's, read when it was listed
        return file.schema
    try:
        return pq.read_schema(_open_file(file))
    except (pa.ArrowException, OSError) as exc:
        raise GrpoError(f"{file.display}: not a readable Parquet file ({first_line(exc)})") from None


def _read_schemas(files: list[InputFile], plan: RunPlan) -> list[pa.Schema]:
    schemas = []
    for file, schema in zip(files, side_by_side_requests(_read_schema, files), strict=True):
        check_columns(plan.config, file.shard(), schema, writes_output=True)
        for column in (*plan.input_columns, *([plan.config.verify.column] if plan.config.verify else [])):
            if column not in schema.names:
                raise GrpoError(
                    f"{file.display}: {column!r} is a nested field; {mention('engine')} ray reads top-level "
                    "columns "
                    "(use the local engine)"
                )
        schemas.append(schema)
    return schemas
