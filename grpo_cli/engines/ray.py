"""The Ray engine: the same run on Ray Data, for datasets beyond one machine, with the local
engine's bits.

The local engine's pass 1 cuts the input into statistics blocks at fixed row positions
(``stats_block_rows``, counted over the whole input in order), reduces each block to per-group
statistics and figures, and merges the blocks in input order. A float sum depends on the order
of its terms, so the Ray engine makes the same cuts and the same merge:

1. statistics: one Ray task per statistics block reads the block's row ranges of its files
   (:func:`statistics_blocks`, only the run's columns, page CRCs verified), reduces them to
   one row per group with the kernel's accumulators (:func:`block_statistics`) and cuts those
   rows by their key's hash into one bucket per reducer (:func:`block_partials`). One task
   per bucket takes its rows of every block in block order and merges each group as the local
   engine merges its blocks (:func:`merge_bucket`, :class:`OrderedMerge`): a group's merged
   figures depend on its own partial rows only, so they are the local engine's bits. The
   driver receives each group's figures and where it first appeared (block, place in the
   block), never a key or a partial row, and orders the groups by first appearance over the
   whole input (:func:`_gathered`): the local engine's group IDs. The keys stay with the
   reducers in the object store (:class:`BucketKeys`);
2. moments (a batch whitening only): one task per statistics block computes the block's
   weighted moments per training batch; the driver merges them in block order;
3. advantages: every block of the input, read by Ray Data, is joined with the per-group
   outcome (broadcast once through the object store; each worker process indexes the
   buckets' keys once, with their run IDs) and written out.

So the advantages, masks and summary are the local engine's, bit for bit. The driver holds
the run's per-group figures (about 80 bytes a group, with the outcome and the summary
computed from them as the local engine computes them), not the keys. Patterns measured to be
much slower and avoided here: ``groupby().map_groups()`` (one call and one Parquet row group
per group) and Ray's ``Std`` aggregation (a Python path, ddof=1 by default).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import os
import pickle
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from grpo_cli import interrupts
from grpo_cli.allocator import MALLOC_ENV
from grpo_cli.arrow.columns import plain_schema
from grpo_cli.arrow.keys import GroupKeyIndex, InvalidKeyError, as_tensor, check_key_types, key_buckets
from grpo_cli.errors import GrpoError, first_line, os_reason
from grpo_cli.file_names import PARQUET_SUFFIXES, PROVENANCE_KEY, output_is_directory
from grpo_cli.inputs.readers import parquet_row_range, row_count
from grpo_cli.inputs.sources import InputSet, Shard
from grpo_cli.kernel import (
    BatchTransform,
    GroupStats,
    RewardTotals,
    RunningGroupStats,
    RunningTopTwo,
    TopTwo,
    WeightedMoments,
    empty_group_stats,
    empty_top_two,
    merge_weighted_moments,
    weighted_moments,
)
from grpo_cli.options.choices import InputFormat
from grpo_cli.options.config import ComputeConfig
from grpo_cli.outputs.guard import Claim, ProtectedInputs, RemoteClaim, StagedRemoteClaim
from grpo_cli.outputs.output import (
    commit_directory,
    footers_range,
    output_info,
    output_name_of,
    splice_refusal,
)
from grpo_cli.outputs.splice import SplicedFile, SpliceRefused, read_footer
from grpo_cli.results.findings import (
    FirstRound,
    GroupFindings,
    GroupPart,
    RunFigures,
    SecondRound,
    in_chunks,
    merged_findings,
    plain_key,
)
from grpo_cli.results.summary import (
    FINDINGS_CHUNK_GROUPS,
    ByValues,
    GroupFigures,
    RunSummary,
    build_summary,
    figures_by_value,
    group_findings,
    input_info,
    outcome_part,
    value_sort_key,
)
from grpo_cli.results.verify import Verifier, settled, split_by_groups
from grpo_cli.run.figures import MERGES, RowInputs, of_chunk, padded, room_for, step_spans, wanted
from grpo_cli.run.plan import (
    BatchLayout,
    GroupOutcome,
    OutcomeTotals,
    RewardCredit,
    RunPlan,
    batch_of_groups,
    scored_top_two,
    value_columns,
    with_watched_step,
)
from grpo_cli.run.rewards import RewardBatch, new_column_arrays
from grpo_cli.scratch import socket_root
from grpo_cli.stores import CopiedPrefix, check_scheme, gcs_filesystem, local_path, store_output
from grpo_cli.threads import IDLE_THREADS_ENV
from grpo_cli.trainers.filters import FilterPart

PARTITION_BYTES = 256 << 20
WORKER_ENV = {**MALLOC_ENV, **IDLE_THREADS_ENV}
"""Settings a process reads when it starts (glibc's malloc, OpenMP), for the private instance's
workers: see :mod:`grpo_cli.allocator` and :mod:`grpo_cli.threads`."""
FIGURE_PREFIX = "__grpo_figure_"  # a block's per-group figures (figures.FIGURES)
VALUE_PREFIX = "__grpo_value_"
# a one-value-per-group column's value at the group's first row in the block
VALUE_FIELD = VALUE_PREFIX + "{}"
VALUE_CLASH_FIELD = "__grpo_value_clash_{}"  # the group spans two of its values in this block


def import_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise GrpoError(
            "--engine ray needs Ray Data: pip install 'grpo-cli[ray]' (or pip install 'ray[data]')"
        ) from None
    return ray


@contextmanager
def ray_session(address: str | None, *, quiet: bool = True, num_cpus: int | None = None) -> Iterator[Any]:
    """Join ``address`` (``auto`` or host:port), or start a private local instance (with
    ``num_cpus`` worker slots: all of this machine's by default).

    A local instance is started quietly (no dashboard, no log forwarding, no usage
    stats), keeps its files and its auth token in a temporary folder rather than in
    /tmp/ray and ``~/.ray``, and is shut down on every exit path. An instance already
    running in this process is reused and left running.
    """
    running = sys.modules.get("ray")
    if running is not None and running.is_initialized():
        yield running
        return
    saved_env = {k: os.environ.get(k) for k in (*_RAY_ENV, *WORKER_ENV)}
    temp_dir = tempfile.mkdtemp(prefix="grpo-ray-", dir=_short_temp_root()) if address is None else None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if temp_dir is not None:  # the private instance's workers start as the CLI's process runs
        for setting, wanted_value in WORKER_ENV.items():
            os.environ.setdefault(setting, wanted_value)
    unset = saved_env["RAY_AUTH_MODE"] is None and not saved_env["RAY_AUTH_TOKEN"]
    # Every private instance of the process uses one token file (a second instance started with
    # another timed out waiting for its GCS). Ray reads its auth settings when it is imported:
    # where something imported it first, it is told to read them again, since without a token it
    # turns token auth on for a new local instance and writes one to ~/.ray/auth_token.
    reread = temp_dir is not None and unset
    if reread:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(_process_token.get())
        if running is not None:
            _reread_ray_auth()
    ray = None
    try:
        ray = import_ray()
        handlers = _signal_handlers()
        _keep_our_sigterm_handler(ray)
        try:
            if temp_dir is not None:
                ray.init(
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level="ERROR",
                    _temp_dir=temp_dir,
                    num_cpus=num_cpus,
                )
            else:
                assert address is not None  # no private instance is started: one is joined
                _check_reachable(address)
                ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        except SystemExit as exc:
            # ray.init's own SIGTERM handler exits with the signal's number while it starts the
            # instance: the run was stopped, as by Ctrl-C (exit 130, everything started stopped)
            if exc.code in _STOP_SIGNALS:
                raise KeyboardInterrupt from None
            raise
        except (ConnectionError, RuntimeError) as exc:
            where = "start a local Ray instance" if address is None else f"join the Ray cluster at {address}"
            raise GrpoError(f"cannot {where} ({str(exc).strip().splitlines()[0]})") from None
        # Ray's driver installs handlers that dump stacks on SIGTERM: keep grpo-cli's, which
        # end the run cleanly (exit 130, temporaries removed).
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        interrupts.raise_if_requested()  # a stop while Ray started (its exception may be lost)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = not quiet
        context.print_on_execution_start = False
        context.execution_options.preserve_order = True  # output files follow the input's order
        for name in ("ray", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
        yield ray
    finally:
        if ray is not None and (ray.is_initialized() or temp_dir is not None):
            # a private instance stopped while it started is not "initialized", yet runs
            ray.shutdown(**({"wait_for_processes": True} if _shutdown_waits(ray) else {}))
        if temp_dir is not None:
            _stop_leftovers(temp_dir)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if reread and "ray" in sys.modules:  # Ray sees the process's own settings again
            _reread_ray_auth()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


JOIN_TIMEOUT_SECONDS = 10.0


def _check_reachable(address: str) -> None:
    """Refuse a ``host:port`` that nothing answers at within :data:`JOIN_TIMEOUT_SECONDS`:
    Ray itself retries such an address for many minutes, logging each try to the terminal.
    ``auto`` and ``ray://`` client addresses are left to Ray.

    >>> _check_reachable("auto")
    """
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=JOIN_TIMEOUT_SECONDS).close()
    except OSError as exc:
        if isinstance(exc, TimeoutError):
            raise ConnectionError(f"nothing answered there within {JOIN_TIMEOUT_SECONDS:g} s") from None
        raise ConnectionError(os_reason(exc)) from None


def _reread_ray_auth() -> None:
    """Have an imported Ray read its auth settings (``RAY_AUTH_MODE``, the token) from the
    environment again, as Ray itself does when it turns token auth on."""
    import importlib

    try:
        raylet = importlib.import_module("ray._raylet")
        config, loader = raylet.Config, raylet.AuthenticationTokenLoader
    except (ImportError, AttributeError):  # a Ray without token auth
        return
    config.initialize("")
    loader.instance().reset_cache()


class _ProcessToken:
    """The auth token of this process's private Ray instances: a file in a private folder,
    made once, removed when the interpreter exits."""

    def __init__(self) -> None:
        self.path: Path | None = None

    def get(self) -> Path:
        if self.path is None:
            folder = Path(tempfile.mkdtemp(prefix="grpo-ray-token-", dir=_short_temp_root()))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            path = folder / "auth_token"
            path.write_text(secrets.token_hex(32))
            path.chmod(0o600)
            self.path = path
        return self.path


_process_token = _ProcessToken()


_STOP_SIGNALS = {int(getattr(signal, name)) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)}

RAY_SOCKET_TAIL = len("/grpo-ray-12345678/session_2026-12-07_00-32-57_894933_4194304/sockets/plasma_store")
"""What follows the temporary root in the longest socket path of a private instance: the
folder, Ray's session (its date, time and the largest process ID) and its plasma store."""


def _short_temp_root() -> str | None:
    """A temporary root short enough for Ray's socket paths: ``TMPDIR`` (``None``) where it
    fits, else ``/tmp``; a TMPDIR of 28 characters or more broke them (exit 70)."""
    root = socket_root(RAY_SOCKET_TAIL, program="Ray")
    return None if root is None else str(root)


def _shutdown_waits(ray: Any) -> bool:
    """Whether this Ray's ``shutdown`` can wait for the processes it stops."""
    import inspect

    return "wait_for_processes" in inspect.signature(ray.shutdown).parameters


def _stop_leftovers(temp_dir: str) -> None:
    """Stop every process of this run's private instance still running after ``ray.shutdown``
    (one stopped while it started is not shut down by it): this process's descendants whose
    command line names ``temp_dir`` or that Ray titled ``ray::...`` (its workers). SIGTERM,
    then SIGKILL a few seconds later. Linux only (``/proc``); elsewhere ``ray.shutdown`` alone."""
    import time

    proc = Path("/proc")
    if not proc.is_dir():
        return
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            commands[int(entry.name)] = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            )
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    ours, stack = [], list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        ours.append(pid)
        stack += children.get(pid, [])
    leftovers = [
        pid for pid in ours if temp_dir in commands.get(pid, "") or commands.get(pid, "").startswith("ray::")
    ]
    for pid in leftovers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 3.0
    while leftovers and time.monotonic() < deadline:
        leftovers = [pid for pid in leftovers if _running(pid)]
        time.sleep(0.05)
    for pid in leftovers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def _keep_our_sigterm_handler(ray: Any) -> None:
    """``ray.init`` installs a SIGTERM handler that exits with the signal's number: raised in
    one of the at-fork callbacks Ray's start runs, its SystemExit was ignored and the signal
    lost (the run went on and exited 0). grpo-cli's handler stays (it records the stop:
    :mod:`grpo_cli.interrupts`)."""
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    if utils is not None and hasattr(utils, "set_sigterm_handler"):
        utils.set_sigterm_handler = lambda handler: None


def _signal_handlers() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    names = ("SIGTERM", "SIGHUP", "SIGINT")
    return {sig: signal.getsignal(sig) for sig in (getattr(signal, n) for n in names if hasattr(signal, n))}


_RAY_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED")


# --------------------------------------------------------------------------- inputs and options


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
        raise GrpoError(f"--partitions must be positive, got {partitions}")
    if config.device not in ("cpu", "auto"):
        raise GrpoError("--engine ray computes on the CPUs of the Ray workers; leave --device as cpu")
    if output is not None and not is_remote(output) and not output_is_directory(output):
        raise GrpoError(f"{output}: --engine ray writes a directory of Parquet files; name a directory")


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
            "JSON lines, CSV, Arrow, standard input and --from dumps run on a local Ray instance "
            "(no --ray-address) or the local engine"
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


# --------------------------------------------------------------------------- statistics blocks


@dataclass(frozen=True)
class FilePart:
    """Rows ``[start, stop)`` of one input file."""

    file: InputFile
    start: int
    stop: int


def statistics_blocks(files: Sequence[InputFile], block_rows: int) -> list[list[FilePart]]:
    """The input's rows cut where the local engine cuts its statistics blocks: at multiples of
    ``block_rows`` counted over the whole input in order, across file ends. Each block is the
    list of its files' row ranges.

    >>> files = [InputFile("a", "a", 5, 0), InputFile("b", "b", 0, 0), InputFile("c", "c", 4, 0)]
    >>> [[(p.file.source, p.start, p.stop) for p in block] for block in statistics_blocks(files, 4)]
    [[('a', 0, 4)], [('a', 4, 5), ('c', 0, 3)], [('c', 3, 4)]]
    """
    blocks: list[list[FilePart]] = []
    current: list[FilePart] = []
    room = block_rows
    for file in files:
        start = 0
        while start < file.rows:
            stop = min(file.rows, start + room)
            current.append(FilePart(file, start, stop))
            room -= stop - start
            start = stop
            if room == 0:
                blocks.append(current)
                current, room = [], block_rows
    if current:
        blocks.append(current)
    return blocks


def advantage_parts(files: Sequence[InputFile], parts: int) -> list[list[FilePart]]:
    """The input cut into about ``parts`` row ranges for the advantage job, none across a file's
    end, so that each output file keeps its input file's column types.

    >>> files = [InputFile("a", "a", 10, 0), InputFile("b", "b", 0, 0), InputFile("c", "c", 5, 0)]
    >>> [[(p.file.source, p.start, p.stop) for p in part] for part in advantage_parts(files, 3)]
    [[('a', 0, 5)], [('a', 5, 10)], [('c', 0, 5)]]
    """
    total = sum(file.rows for file in files)
    out = []
    for file in files:
        if not file.rows:
            continue
        pieces = max(1, min(file.rows, math.ceil(parts * file.rows / total)))
        bounds = [file.rows * i // pieces for i in range(pieces + 1)]
        out += [[FilePart(file, start, stop)] for start, stop in itertools.pairwise(bounds)]
    return out


def _read_block(
    parts: Sequence[FilePart], columns: list[str] | None, group_size: int | None = None
) -> list[tuple[FilePart, pa.RecordBatch]]:
    """Each part's rows, the run's columns only; with ``group_size`` (``--group-size``), a last
    column :data:`ROW_GROUP_FIELD` holds each row's group: its position in the whole input
    divided by the group size, the group the local engine gives it."""
    out = []
    if columns is not None and group_size is not None:
        columns = [c for c in columns if c != ROW_GROUP_FIELD]
    for part in parts:
        table = parquet_row_range(_open_file(part.file), part.file.display, columns, part.start, part.stop)
        table = table.cast(plain_schema(table.schema))
        if group_size is not None:
            first = part.file.offset + part.start
            groups = np.arange(first, first + table.num_rows, dtype=np.int64) // group_size
            table = table.append_column(ROW_GROUP_FIELD, pa.array(groups))
        out.append((part, _record_batch(table)))
    return out


ROW_GROUP_FIELD = "__grpo_row_group"  # --group-size: a row's group, as a key the Ray jobs match


def keyed_by_position(config: ComputeConfig) -> ComputeConfig:
    """The configuration Ray's jobs run: with ``--group-size``, the groups keyed by
    :data:`ROW_GROUP_FIELD` (the blocks' statistics are those of the consecutive blocks, bit for
    bit: the kernel gives a group the same statistics whichever path its chunk takes)."""
    if config.group_size is None:
        return config
    return replace(config, group_cols=(ROW_GROUP_FIELD,), group_size=None)


_CPU = torch.device("cpu")
BLOCK_FIELD = "__grpo_block"  # the statistics block a partial row or a moments row belongs to
GROUP_FIELD = "__grpo_group"  # a partial row's group in its block (first appearance there)
# A block that fails returns its error's line in this field: an exception in a Ray task
# would print its traceback.
ERROR_FIELD = "__grpo_error"


def _channel_prefix(channel: int) -> str:
    return f"__grpo_{channel}_"


_SUMMARY_PREFIX = "__grpo_summary_"


def _refusal(message: str) -> pa.Table:
    return pa.table({ERROR_FIELD: [message]})


def block_statistics(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    config: ComputeConfig,
    group_size: int | None = None,
    *,
    rows: list[pa.Table] | None = None,
) -> pa.Table:
    """One statistics block (its index in ``batch``): one row per group, in order of first
    appearance, with its key columns and the block's statistics and figures of the group,
    computed as the local engine computes a block's (:meth:`RunPlan.accumulators`,
    :func:`~grpo_cli.run.figures.of_chunk`). ``rows`` (pass_at_k, a trainer's filter, on the
    reducers) gets a table of the block's rows in input order: each one's group in the block,
    whether it is scored, and pass_at_k's combined reward (float64) or the reward the filter
    sees (its own dtype; unshaped, if asked)."""
    (index,) = batch.column("block").to_pylist()
    plan = RunPlan(config, device=_CPU)
    keys = GroupKeyIndex(config.group_cols)
    one_value = value_columns(config)
    value_keys = [GroupKeyIndex([column], few_values=True) for column, _, _ in one_value]
    length_col = config.length_col if "length_sums" in plan.needs else None  # opo sums them
    id_parts: list[np.ndarray] = []
    value_id_parts: list[list[np.ndarray]] = [[] for _ in one_value]
    value_parts: list[list[pa.Array]] = [[] for _ in one_value]
    reward_parts: list[RewardBatch] = []
    part_starts: list[int] = []  # each part's first row in the whole input
    length_parts: list[torch.Tensor] = []
    step_parts: list[np.ndarray] = []
    first_record: pa.RecordBatch | None = None
    role = ""
    try:
        for part, record in _read_block(blocks[index], plan.input_columns, group_size):
            if first_record is None:
                first_record = record
            role = "group"
            id_parts.append(keys.encode([record.column(c) for c in config.group_cols]))
            for i, ((column, option, _), index_of) in enumerate(zip(one_value, value_keys, strict=True)):
                role = option.removeprefix("--").replace("-col", "")
                values = record.column(column)
                value_id_parts[i].append(index_of.encode([values]))
                value_parts[i].append(values)
            reader = plan.reward_reader(record.schema, part.file.shard())
            reward_parts.append(reader.read(record, part.start))
            part_starts.append(part.file.offset + part.start)
            if length_col is not None:
                length_parts.append(reader.lengths(record, length_col, part.start))
            if config.step_col is not None:
                step_parts.append(reader.column(record, config.step_col, part.start).numpy())
    except InvalidKeyError as bad:
        return _refusal(
            f"{role} key {bad.column!r} {bad.description} in {bad.count} row(s) of a block; "
            f"{bad.what} keys cannot be grouped"
        )
    except GrpoError as error:
        return _refusal(error.message)
    ids_np = np.concatenate(id_parts)
    k = len(keys)
    ids = as_tensor(ids_np)
    rewards = RewardBatch.concat(reward_parts)
    if rows is not None:
        scored = rewards.combined_valid
        row_columns = {
            ROW_GROUP_IN_BLOCK: ids_np,
            "scored": np.ones(ids_np.size, bool) if scored is None else scored.numpy(),
        }
        if "group_rewards" in plan.needs:
            row_columns["reward"] = rewards.combined.to(torch.float64).numpy()
        if config.trainer_filter is not None:
            row_columns["seen"] = plan.filter_values(rewards)
        rows.append(pa.table(row_columns))
    accumulators, separate_summary = plan.accumulators()
    columns: dict[str, Any] = {}
    for channel, (acc, values, valid) in enumerate(
        zip(accumulators[: plan.channels], rewards.channels, rewards.channel_valid, strict=True)
    ):
        acc.update(values, ids, valid)
        columns.update(_numpy(acc.compute(k).to_columns(_channel_prefix(channel))))
    if separate_summary:
        accumulators[-1].update(rewards.combined, ids, rewards.combined_valid)
        columns.update(_numpy(accumulators[-1].compute(k).to_columns(_SUMMARY_PREFIX)))
    lengths = torch.cat(length_parts).numpy() if length_parts else None
    steps = np.concatenate(step_parts) if step_parts else None
    figures = of_chunk(wanted(plan.needs), ids_np, k, RowInputs.of(rewards, lengths, steps))
    columns.update({FIGURE_PREFIX + name: values for name, values in figures.items()})
    if "top_two" in plan.needs:
        positions = np.concatenate(
            [
                np.arange(first, first + r.combined.numel())
                for first, r in zip(part_starts, reward_parts, strict=True)
            ]
        )
        columns.update(_top_two_columns(rewards, ids, torch.from_numpy(positions), k))
    assert first_record is not None  # a block holds at least one row
    table = keys.key_table(pa.Table.from_batches([first_record]))
    for name, value in columns.items():
        table = table.append_column(name, pa.array(value))
    if one_value:
        _, first_rows = np.unique(ids_np, return_index=True)
    for i in range(len(one_value)):
        _, split = batch_of_groups(ids_np, np.concatenate(value_id_parts[i]), k)
        values = pa.chunked_array([v.cast(value_parts[i][0].type) for v in value_parts[i]])
        table = table.append_column(VALUE_FIELD.format(i), values.take(pa.array(first_rows)))
        table = table.append_column(VALUE_CLASH_FIELD.format(i), pa.array(split))
    table = table.append_column(GROUP_FIELD, pa.array(np.arange(k, dtype=np.int64)))
    return table.append_column(BLOCK_FIELD, pa.array(np.full(k, index, dtype=np.int64)))


TOP_TWO_FIELDS = {
    "first": "__grpo_top_first",
    "second": "__grpo_top_second",
    "best_row": "__grpo_top_best_row",
}


def _top_two_columns(
    rewards: RewardBatch, ids: torch.Tensor, positions: torch.Tensor, k: int
) -> dict[str, Any]:
    """grpo_passk: a block's top two rewards of each group and its first best row, as the local
    engine reduces a chunk (:func:`~grpo_cli.run.plan.scored_top_two`)."""
    top = scored_top_two(rewards, ids, positions, k)
    return {field: getattr(top, name).numpy() for name, field in TOP_TWO_FIELDS.items()}


def _partial_top_two(partial: pa.Table) -> TopTwo:
    """A block's top two, one entry per partial row."""
    return TopTwo(
        *(torch.from_numpy(partial.column(TOP_TWO_FIELDS[name]).to_numpy()) for name in RunningTopTwo.NAMES)
    )


def _numpy(columns: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {name: value.numpy() for name, value in columns.items()}


def _record_batch(table: pa.Table) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], schema=table.schema)


def _stats_from_table(table: pa.Table, prefix: str) -> GroupStats:
    columns = {
        name: torch.from_numpy(table.column(name).to_numpy().copy())
        for name in table.column_names
        if name.startswith(prefix)
    }
    return GroupStats.from_columns(columns, prefix)


@dataclass
class BucketKeys:
    """The run's group keys where the reducers left them, in the object store: bucket ``r``'s
    keys (``tables[r]``, in its own order) laid end to end are at ``position``; the group at
    position ``p`` has the run's ID ``ids[p]``, and group ``g`` is at ``positions[g]``."""

    tables: list[Any]  # object references to pa.Table, or the tables
    ids: np.ndarray
    positions: np.ndarray
    bucket_starts: np.ndarray
    fetched: dict[int, pa.Table] = field(default_factory=dict)  # the buckets key_at has fetched

    def key_at(self, group: int) -> Any:
        """Group ``group``'s key: one value, or a tuple of several (one bucket fetched)."""
        position = int(self.positions[group])
        bucket = int(np.searchsorted(self.bucket_starts, position, side="right")) - 1
        table = self.fetched.get(bucket)
        if table is None:
            table = self.fetched[bucket] = _fetched(self.tables[bucket])
        return _key_in(table, position - int(self.bucket_starts[bucket]))

    def index(self, group_cols: Sequence[str]) -> GroupKeyIndex:
        """Every key in an index whose IDs are the positions (each key is in one bucket)."""
        return _key_index(self.tables, group_cols)


def _key_in(table: pa.Table, row: int) -> Any:
    """The key at ``row`` of a key table: one value, or a tuple of several."""
    values = tuple(table.column(c)[row].as_py() for c in table.column_names)
    return values[0] if len(values) == 1 else values


def _key_index(tables: Sequence[Any], group_cols: Sequence[str]) -> GroupKeyIndex:
    """The keys of ``tables`` (object references or tables, fetched one at a time) laid end to
    end in an index whose IDs are their positions (each key is in one table)."""
    index = GroupKeyIndex(group_cols)
    for table in tables:
        table = _fetched(table)
        if table.num_rows:
            index.encode([table.column(c) for c in group_cols])
    return index


def _fetched(table: Any) -> pa.Table:
    return table if isinstance(table, pa.Table) else import_ray().get(table)


@dataclass(frozen=True)
class MergedStatistics:
    """The blocks' partial statistics merged in input order, one row per group (first appearance)."""

    keys: BucketKeys | None  # None in a reducer, which holds its keys itself
    channel_stats: list[GroupStats]
    summary_stats: GroupStats
    figures: dict[str, np.ndarray]  # per group, each of figures.FIGURES the run wants
    batches: BatchLayout
    by: list[ByValues]  # each --by column's value of every group
    top_two: TopTwo | None  # grpo_passk

    @property
    def rows_per_group(self) -> np.ndarray:
        return self.figures["rows"]

    @property
    def nan_rewards(self) -> int:
        return int(self.figures["nan_rewards"].sum())


class OrderedMerge:
    """A reducer of the statistics job: its bucket's partial rows of each block, taken in block
    order, are given IDs (first appearance in that order) and merged into running statistics and
    figures exactly as the local engine merges its blocks (Chan's rule, then each figure's merge
    rule), so each group's figures are the local engine's bits."""

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.keys = GroupKeyIndex(plan.config.group_cols)
        self.one_value = value_columns(plan.config)
        self.value_keys = [
            GroupKeyIndex([VALUE_FIELD.format(i)], few_values=True) for i in range(len(self.one_value))
        ]
        # running totals grown in place (a block merged over its own groups only, not all so far)
        self.channels = [RunningGroupStats() for _ in range(plan.channels)]
        self.summary = RunningGroupStats()  # the combined reward's, where channels are several
        self.figures = wanted(plan.needs)
        self.totals: dict[str, np.ndarray] = {}  # each figure's, at the front of a growing buffer
        self.value_of_group = [np.zeros(0, dtype=np.int64) for _ in self.one_value]
        self.first_table: pa.Table | None = None
        self.top_two = RunningTopTwo()  # grpo_passk
        self.first_seen: list[np.ndarray] = []  # each group's first partial row: (block, group in block)

    def add(self, partial: pa.Table) -> np.ndarray:
        """One block's partial rows (or a piece of them, in order); returns their groups' IDs."""
        if not partial.num_rows:
            return np.zeros(0, np.int64)
        if self.first_table is None:
            self.first_table = partial
        known = len(self.keys)
        ids_np = self.keys.encode([partial.column(c) for c in self.plan.config.group_cols])
        k = len(self.keys)
        ids = torch.from_numpy(ids_np)
        new = ids_np >= known  # the new groups' first rows, in ID order
        seen = np.stack([partial.column(f).to_numpy()[new] for f in (BLOCK_FIELD, GROUP_FIELD)], axis=1)
        self.first_seen.append(seen)

        for channel, running in enumerate(self.channels):
            running.merge_rows(_stats_from_table(partial, _channel_prefix(channel)), ids, k)
        if self.plan.channels > 1:
            self.summary.merge_rows(_stats_from_table(partial, _SUMMARY_PREFIX), ids, k)
        for figure in self.figures:
            values = partial.column(FIGURE_PREFIX + figure.name).to_numpy()
            total = self.totals[figure.name] = room_for(
                self.totals.get(figure.name), k, fill=figure.identity, dtype=values.dtype
            )
            # a group new here holds 0: 0 + its block's figure, as placing it among all the groups gave
            total[ids_np] = MERGES[figure.merge].pair(total[ids_np], values)
        if "top_two" in self.plan.needs:
            self.top_two.merge_rows(_partial_top_two(partial), ids, k)
        for i in range(len(self.one_value)):
            self._add_values(i, partial, ids_np, k)
        return ids_np

    def _add_values(self, i: int, partial: pa.Table, ids_np: np.ndarray, k: int) -> None:
        """Each group's value of one-value column ``i`` (IDs in order of first appearance, which
        is its values' order of first appearance in the rows); a group across two is refused."""
        column, option, why = self.one_value[i]
        value_ids = self.value_keys[i].encode([partial.column(VALUE_FIELD.format(i))])
        clash = partial.column(VALUE_CLASH_FIELD.format(i)).to_numpy(zero_copy_only=False).astype(bool)
        known = room_for(self.value_of_group[i], k, fill=-1)
        clash |= (known[ids_np] >= 0) & (known[ids_np] != value_ids)
        if clash.any():
            key = partial.select(list(self.plan.config.group_cols)).slice(int(np.flatnonzero(clash)[0]), 1)
            raise RowsUnknown(f"group {key.to_pylist()[0]} spans two values of {option} {column!r}; {why}")
        known[ids_np] = value_ids
        self.value_of_group[i] = known

    def result(self) -> MergedStatistics:
        k = len(self.keys)
        extremes = self.plan.count_extremes
        # each block's groups were merged among all the groups seen by then: the last saw them all
        channels = [_or_empty(running, k, extremes) for running in self.channels]
        summary = channels[0]
        if self.plan.channels > 1:
            summary = _or_empty(self.summary, k, False)
        totals = padded(self.figures, {name: total[:k] for name, total in self.totals.items()}, k)
        values = [
            (
                column,
                self._of_groups(i, k),
                [self.value_keys[i].key_at(v) for v in range(len(self.value_keys[i]))],
            )
            for i, (column, _, _) in enumerate(self.one_value)
        ]
        top_two = self.top_two.result(k)
        return _merged(self.plan, None, channels, summary, totals, values, top_two)

    def _of_groups(self, i: int, k: int) -> np.ndarray:
        known = self.value_of_group[i]
        return np.pad(known, (0, max(0, k - known.size)))[:k].clip(min=0)

    def bucket_table(self) -> pa.Table:
        """A reducer's answer: one row per group of its bucket (in its own order of first
        appearance) with its merged statistics, figures and one-value columns' values, and
        where it first appeared (:data:`FIRST_SEEN_FIELDS`): no key."""
        k = len(self.keys)
        columns: dict[str, Any] = {}
        merged = self.result()
        for channel, stats in enumerate(merged.channel_stats):
            columns.update(_numpy(stats.to_columns(_channel_prefix(channel))))
        if self.plan.channels > 1:
            columns.update(_numpy(merged.summary_stats.to_columns(_SUMMARY_PREFIX)))
        columns.update({FIGURE_PREFIX + name: values for name, values in merged.figures.items()})
        if merged.top_two is not None:
            columns.update({f: getattr(merged.top_two, n).numpy() for n, f in TOP_TWO_FIELDS.items()})
        for i in range(len(self.one_value)):
            values = self.value_keys[i].key_table(_empty_values(i)).column(0)
            columns[VALUE_FIELD.format(i)] = values.take(pa.array(self._of_groups(i, k)))
        seen = np.concatenate(self.first_seen) if self.first_seen else np.zeros((0, 2), np.int64)
        for at, name in enumerate(FIRST_SEEN_FIELDS):
            columns[name] = seen[:, at]
        return pa.table(columns)


FIRST_SEEN_FIELDS = ("__grpo_first_block", "__grpo_first_group")  # a group's first partial row


def _or_empty(running: RunningGroupStats, groups: int, count_extremes: bool) -> GroupStats:
    stats = running.stats()
    return stats if stats is not None else empty_group_stats(groups, count_extremes=count_extremes)


def _empty_values(i: int) -> pa.Table:
    return pa.table({VALUE_FIELD.format(i): pa.array([], pa.null())})


def _merged(
    plan: RunPlan,
    keys: BucketKeys | None,
    channels: list[GroupStats],
    summary: GroupStats,
    totals: dict[str, np.ndarray],
    values: list[tuple[str, np.ndarray, list[Any]]],
    top_two: TopTwo | None,
) -> MergedStatistics:
    """The merged figures, with the batch layout and ``--by`` values of each group from the
    one-value columns' ``values`` (column, each group's value ID, the values)."""
    k = int(totals["rows"].size)
    if plan.config.batch_col is None:
        batches = BatchLayout.of_groups(np.zeros(k, dtype=np.int64), totals, [None])
    else:
        _, of_group, batch_keys = values.pop(0)
        batches = BatchLayout.of_groups(of_group, totals, batch_keys)
    by = [ByValues(column, of_group, value_keys) for column, of_group, value_keys in values]
    return MergedStatistics(keys, channels, summary, totals, batches, by, top_two)


def _empty_keys(plan: RunPlan) -> pa.Table:
    return pa.table({c: pa.array([], pa.string()) for c in plan.config.group_cols})


_WORKER_CACHE: dict[str, Any] = {}


def _worker_state(payload: Any, token: str, config: ComputeConfig) -> tuple[RunPlan, _RunIds, GroupOutcome]:
    """The plan, key index and outcome, built once per worker process and run."""
    cached = _WORKER_CACHE.get(token)
    if cached is None:
        _WORKER_CACHE.clear()
        if not isinstance(payload, dict):
            payload = import_ray().get(payload)
        plan = RunPlan(config, device=_CPU)
        if "buckets" in payload:  # the reducers finished job 1: every bucket's groups end to end
            figures, key_tables, sizes = payload["buckets"]
            outcome = _outcome_of(plan, _in_bucket_order(plan, figures, sizes), payload["batch_stds"])
            if payload["credits"] is not None:
                outcome = replace(outcome, reward_credit=_credit_of(payload["credits"], sizes))
            if payload["transform"] is not None:
                outcome = replace(outcome, transform=payload["transform"])
            cached = (plan, _RunIds(_key_index(key_tables, config.group_cols), None), outcome)
        else:
            keys: BucketKeys = payload["keys"]
            cached = (plan, _RunIds(keys.index(config.group_cols), keys.ids), payload["outcome"])
        _WORKER_CACHE[token] = cached
    return cached


@dataclass(frozen=True)
class _RunIds:
    """A worker's map from keys to the outcome's group IDs: the keys' positions, then their IDs
    (``None``: the positions are the IDs, the outcome being in the buckets' order)."""

    index: GroupKeyIndex
    ids: np.ndarray | None


def _group_ids(batch: pa.RecordBatch, config: ComputeConfig, run_ids: _RunIds) -> np.ndarray:
    """The run's group IDs of a batch's rows (every key was seen by the statistics job)."""
    index = run_ids.index
    positions = (
        index.encode([batch.column(c) for c in config.group_cols])
        if batch.num_rows
        else np.empty(0, np.int64)
    )
    if positions.size and int(positions.max()) >= len(index):
        raise RuntimeError("a group key appeared in pass 2 that pass 1 did not see")
    if run_ids.ids is None:
        return positions
    ids: np.ndarray = run_ids.ids[positions]
    return ids


def block_moments(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    group_size: int | None = None,
) -> pa.Table:
    """One statistics block's weighted moments of the advantages per training batch (for a
    whitening), over its rows in input order as the local engine's moments pass cuts them."""
    (index,) = batch.column("block").to_pylist()
    plan, keys, outcome = _worker_state(payload, token, config)
    assert outcome.batches is not None
    values, weights, batch_ids, valid = [], [], [], []
    try:
        for part, record in _read_block(blocks[index], plan.input_columns, group_size):
            reader = plan.reward_reader(record.schema, part.file.shard())
            ids = as_tensor(_group_ids(record, config, keys))
            rewards, result, in_batch = plan.row_advantages(
                record,
                reader,
                ids,
                outcome,
                active_device=outcome.active,
                first_row=part.start,
                global_row=part.file.offset + part.start,
            )
            values.append(result)
            if config.length_col is not None:
                weights.append(reader.lengths(record, config.length_col, part.start))
            assert in_batch is not None  # a moments pass reads each row's batch
            batch_ids.append(in_batch)
            valid.append(
                torch.ones(result.numel(), dtype=torch.bool)
                if rewards.combined_valid is None
                else rewards.combined_valid
            )
    except GrpoError as error:
        return _refusal(error.message)
    # the tensors the local engine's WeightedMomentsAccumulator hands weighted_moments for a block
    x = torch.cat(values).to(torch.float64)
    w = torch.cat(weights).to(torch.float64) if weights else torch.ones_like(x)
    moments = weighted_moments(
        x, w, torch.cat(batch_ids).to(torch.int64), outcome.batches.count, valid=torch.cat(valid)
    )
    return pa.table(
        {
            "weight": moments.weight.numpy(),
            "mean": moments.mean.numpy(),
            "m2": moments.m2.numpy(),
            "count": moments.count.numpy(),
            BLOCK_FIELD: np.full(outcome.batches.count, index, dtype=np.int64),
        }
    )


def block_advantages(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    provenance: bytes,
    group_size: int | None = None,
) -> pa.Table:
    """One part of the input (its index in ``batch``), every column in its file's own types, with
    the advantage and activity columns appended, rows in order.

    ``payload`` (the keys and the :class:`~grpo_cli.run.plan.GroupOutcome`, or an
    object-store reference to them) is read once per worker process.
    """
    (index,) = batch.column("block").to_pylist()
    plan, keys, outcome = _worker_state(payload, token, config)
    ((part, record),) = _read_block(blocks[index], None, group_size)
    _, advantages, ids_np = _part_advantages(plan, keys, outcome, part, record, record.schema)
    if group_size is not None:  # the key column is the jobs' own, not the output's
        record = record.drop_columns([ROW_GROUP_FIELD])
    ids = torch.from_numpy(ids_np)
    arrays = new_column_arrays(advantages, outcome.active[ids], ids_np, outcome.group_columns)
    out = pa.Table.from_batches([record])
    for name, array in zip(plan.new_columns, arrays, strict=True):
        out = out.append_column(name, array)
    if outcome.kept is not None:
        out = out.filter(pa.array(outcome.kept.numpy()[ids_np]))
    return out.replace_schema_metadata({**(out.schema.metadata or {}), PROVENANCE_KEY: provenance})


def block_verify(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    group_size: int | None = None,
) -> pa.Table:
    """``check --verify-advantage-col``: one part's advantages, computed as the advantage job
    computes them (in the output's dtype), compared with the given column by a
    :class:`~grpo_cli.results.verify.Verifier` of its own; returns what it saw (pickled, for
    :meth:`~grpo_cli.results.verify.Verifier.merge`) and the part's advantage range."""
    (index,) = batch.column("block").to_pylist()
    plan, run_ids, outcome = _worker_state(payload, token, config)
    assert config.verify is not None
    columns = list(dict.fromkeys([*plan.input_columns, config.verify.column]))
    try:
        ((part, record),) = _read_block(blocks[index], columns, group_size)
        rewards, advantages, ids_np = _part_advantages(plan, run_ids, outcome, part, record, record.schema)
        verifier = Verifier(
            config.verify,
            outcome.stats,
            config.advantage,
            # where the reducers finished job 1 the worker holds every key: it names its examples
            run_ids.index if run_ids.ids is None else None,
            batch_transform=plan.needs_moments_pass,
            first_row=part.file.offset + part.start,
        )
        column = record.column(config.verify.column)
        verifier.compare(
            column, advantages, rewards.combined, as_tensor(ids_np), part.file.shard(), part.start
        )
    except GrpoError as error:
        return _refusal(error.message).append_column(BLOCK_FIELD, pa.array([index]))
    return _ranged(index, advantages, partial=pickle.dumps(verifier.partial()))


def verify_part(
    index: int,
    parts: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    group_size: int | None,
    starts: list[int],
) -> tuple[pa.Table, ...]:
    """``check --verify-advantage-col`` where the reducers finished job 1: :func:`block_verify`
    of part ``index``, its constant groups' state cut by bucket (``starts``: each bucket's
    first group in the workers' order) for :func:`settle_bucket`; the answer keeps the rest."""
    table = block_verify(pa.table({"block": [index]}), parts, payload, token, config, group_size)
    if ERROR_FIELD in table.column_names:
        return (table, *[pa.table({})] * len(starts))
    rest, cuts = split_by_groups(pickle.loads(table.column("partial")[0].as_py()), starts)
    table = table.set_column(
        table.schema.get_field_index("partial"), "partial", pa.array([pickle.dumps(rest)])
    )
    return (table, *(_report_table(cut) for cut in cuts))


@dataclass(frozen=True)
class _KeyTable:
    """Names a bucket's groups by their keys (its key table's rows, in the bucket's order)."""

    table: pa.Table

    def key_at(self, group_id: int) -> Any:
        return _key_in(self.table, group_id)


def settle_bucket(config: ComputeConfig, figures: pa.Table, keys: pa.Table, *cuts: pa.Table) -> pa.Table:
    """``check --verify-advantage-col``: one bucket's constant groups settled, from every part's
    cut of their state in input order (:func:`verify_part`), with the bucket's own statistics;
    what it found, named by key (:func:`~grpo_cli.results.verify.settled`)."""
    plan = RunPlan(config, device=_CPU)
    assert config.verify is not None
    stats = _outcome_of(plan, _in_bucket_order(plan, [figures], [figures.num_rows])).stats
    verifier = Verifier(
        config.verify, stats, config.advantage, _KeyTable(keys), batch_transform=plan.needs_moments_pass
    )
    for cut in cuts:
        if cut.num_rows:
            verifier.merge(_report_of(cut))
    return _report_table(settled(verifier))


def _held_verify(
    ray: Any, parts: list[list[FilePart]], plan: RunPlan, held: HeldStatistics, job: dict[str, Any]
) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """``check --verify-advantage-col`` where the reducers finished job 1: each part compared on
    a worker (its examples named there), each bucket's constant groups settled by a task of
    their own from every part's cut of their state; the driver merges the parts' counts and
    examples in input order with the buckets' (no per-group state), as :func:`_verify` does."""
    config = plan.config
    assert config.verify is not None
    starts = list(itertools.accumulate(held.sizes, initial=0))[:-1]
    shared = ray.put(parts)
    answers = [
        _task(ray, verify_part, num_returns=1 + len(starts)).remote(
            i, shared, job["payload"], job["token"], config, job["group_size"], starts
        )
        for i in range(len(parts))
    ]
    tables = ray.get([refs[0] for refs in answers])
    _raise_first_refusal(tables)
    settles = [
        _task(ray, settle_bucket, num_returns=1).remote(
            config, figures, keys, *[refs[1 + b] for refs in answers]
        )
        for b, (figures, keys) in enumerate(zip(held.figures, held.keys, strict=True))
    ]
    verifier = Verifier(
        config.verify,
        empty_group_stats(0, count_extremes=plan.count_extremes),
        config.advantage,
        None,
        batch_transform=plan.needs_moments_pass,
    )
    for table in tables:
        verifier.merge(pickle.loads(table.column("partial")[0].as_py()), named=True)
    for table in ray.get(settles):
        verifier.merge(_report_of(table), named=True)
    return verifier.result(), _range_of(tables)


def _part_advantages(
    plan: RunPlan,
    run_ids: _RunIds,
    outcome: GroupOutcome,
    part: FilePart,
    record: pa.RecordBatch,
    schema: pa.Schema,
) -> tuple[RewardBatch, torch.Tensor, np.ndarray]:
    """One part's rewards, its advantages in the output's dtype for ``schema`` (the file's),
    and its rows' run group IDs, as the advantage job computes them."""
    ids_np = _group_ids(record, plan.config, run_ids)
    reader = plan.reward_reader(record.schema, part.file.shard())
    rewards, result, batch_ids = plan.row_advantages(
        record,
        reader,
        as_tensor(ids_np),
        outcome,
        active_device=outcome.active,
        first_row=part.start,
        global_row=part.file.offset + part.start,
    )
    advantages = plan.finish(result, batch_ids, outcome, scored=rewards.combined_valid)
    return rewards, advantages.to(plan.output_dtype(schema)), ids_np


def _ranged(index: int, advantages: torch.Tensor, **values: Any) -> pa.Table:
    """A task's one-row answer: ``values``, its advantages' range (nulls when it has none) and its part."""
    low = high = None
    if advantages.numel():
        low, high = (float(x) for x in torch.aminmax(advantages.to(torch.float64)))
    columns = {name: [value] for name, value in values.items()}
    return pa.table(
        {
            **columns,
            "low": pa.array([low], pa.float64()),
            "high": pa.array([high], pa.float64()),
            BLOCK_FIELD: [index],
        }
    )


def _range_of(tables: list[pa.Table]) -> tuple[float, float] | None:
    """The advantages' range over the tasks' :func:`_ranged` answers."""
    lows = [t.column("low")[0].as_py() for t in tables if t.column("low")[0].is_valid]
    highs = [t.column("high")[0].as_py() for t in tables if t.column("high")[0].is_valid]
    return (min(lows), max(highs)) if lows else None


def block_splice(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    provenance: bytes,
    target: str,
    group_size: int | None = None,
) -> pa.Table:
    """One input file (its index in ``batch``) spliced as the local engine splices a shard:
    its bytes copied, the new columns (computed from the run's columns only) appended as
    column chunks of each row group, the footer merged; written to ``target``'s folder under
    the local engine's name for the shard. Returns the file's name, rows and advantage range."""
    (index,) = batch.column("block").to_pylist()
    plan, run_ids, outcome = _worker_state(payload, token, config)
    ((part, record),) = _read_block(blocks[index], plan.input_columns, group_size)
    shard = part.file.shard()
    with _local_copy(part.file) as source:
        schema = pq.read_schema(source)
        _, advantages, ids_np = _part_advantages(plan, run_ids, outcome, part, record, schema)
        ids = torch.from_numpy(ids_np)
        arrays = new_column_arrays(advantages, outcome.active[ids], ids_np, outcome.group_columns)
        output_schema = plan.output_schema(schema, provenance)
        new_schema = pa.schema(list(output_schema)[len(output_schema) - len(plan.new_columns) :])
        name = output_name_of(shard)
        from grpo_cli.scratch import scratch_dir

        folder = scratch_dir(name) if is_remote(target) else Path(target)
        try:
            with open(folder / name, "wb") as handle:
                spliced = SplicedFile(source, handle)
                spliced.copy_prefix()
                spliced.begin(new_schema, {PROVENANCE_KEY: provenance}, compression=config.compression)
                if record.num_rows:
                    spliced.add(arrays)
                spliced.close()
            # the output's first bytes are the input's up to its footer: a store may copy them itself
            prefix = CopiedPrefix(part.file.source, spliced.footer.start)
            transfer = {}
            if is_remote(target):  # a staging folder on a store: this task uploads its file
                copied = {"": prefix} if prefix.source.startswith("s3://") else {}
                transfer = store_output(target + name, directory=False).publish(folder / name, copied)
        finally:
            if is_remote(target):
                shutil.rmtree(folder, ignore_errors=True)
    return _ranged(
        index,
        advantages,
        name=name,
        source=prefix.source,
        prefix=prefix.length,
        uploaded=transfer.get("bytes_uploaded", 0),
        copied=transfer.get("bytes_copied_in_store", 0),
    )


def _splice_refusal_of(file: InputFile) -> str | None:
    """Why ``file`` cannot be spliced (its footer read by the splice's own parser), or ``None``."""
    try:
        with _footer_source(file) as source:
            footer = read_footer(source)
    except (SpliceRefused, OSError) as refused:
        return first_line(refused)
    return "it has an empty row group" if any(count == 0 for count in footer.row_counts()) else None


def _on_this_machine(file: InputFile) -> Path | None:
    """``file``'s local path (a ``file://`` URI's too), or ``None`` for an object on a store."""
    if not is_remote(file.source):
        return Path(file.source)
    return Path(local_path(file.source)) if check_scheme(file.source) == "file" else None


def _footer_source(file: InputFile) -> Any:
    """A handle on ``file`` that :func:`~grpo_cli.outputs.splice.read_footer` reads (ranged reads of an
    object on a store: its footer only)."""
    path = _on_this_machine(file)
    return _open_file(file) if path is None else open(path, "rb")


@contextmanager
def _local_copy(file: InputFile) -> Iterator[Path]:
    """``file`` as a path on this machine: a local file itself, an object on a store copied
    to a private scratch file (removed on exit), as the local engine splices it."""
    path = _on_this_machine(file)
    if path is not None:
        yield path
        return
    from grpo_cli.scratch import spool

    def download(out: Any) -> None:
        with _open_file(file) as remote:
            shutil.copyfileobj(remote, out, 8 << 20)

    with spool(None, label=file.display, write=download) as path:
        yield Path(path)


def block_filter_rows(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    group_size: int | None = None,
) -> pa.Table:
    """``check --trainer-filter``: one part's rows, each row's run group ID and the reward the
    trainer's rule sees (:meth:`~grpo_cli.run.plan.RunPlan.filter_values`), in input order, as the
    local engine's pass 1 keeps them."""
    (index,) = batch.column("block").to_pylist()
    plan, run_ids, _ = _worker_state(payload, token, config)
    ((part, record),) = _read_block(blocks[index], plan.input_columns, group_size)
    rewards = plan.reward_reader(record.schema, part.file.shard()).read(record, part.start)
    ids, values = plan.filter_rows(rewards, _group_ids(record, config, run_ids))
    return pa.table(
        {
            "group": ids,
            "reward": values,
            BLOCK_FIELD: np.full(ids.size, index, np.int64),
            GROUP_FIELD: np.arange(ids.size, dtype=np.int64),  # the rows' order, should Ray cut the table
        }
    )


def block_group_rewards(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    payload: Any,
    token: str,
    config: ComputeConfig,
    group_size: int | None = None,
) -> pa.Table:
    """pass_at_k: one statistics block's rows, in input order: each row's run group ID, its
    combined reward (float64) and whether it is scored, as the local engine's pass 1 keeps them."""
    (index,) = batch.column("block").to_pylist()
    plan, run_ids, _ = _worker_state(payload, token, config)
    ids, values, scored = [], [], []
    for part, record in _read_block(blocks[index], plan.input_columns, group_size):
        rewards = plan.reward_reader(record.schema, part.file.shard()).read(record, part.start)
        ids.append(_group_ids(record, config, run_ids))
        values.append(rewards.combined.to(torch.float64).numpy())
        valid = rewards.combined_valid
        scored.append(np.ones(record.num_rows, bool) if valid is None else valid.numpy())
    rows = int(sum(v.size for v in values))
    return pa.table(
        {
            "group": np.concatenate(ids),
            "reward": np.concatenate(values),
            "scored": np.concatenate(scored),
            BLOCK_FIELD: np.full(rows, index, np.int64),
            GROUP_FIELD: np.arange(rows, dtype=np.int64),  # the rows' order, should Ray cut the table
        }
    )


def _with_group_rewards(
    ray: Any,
    blocks: list[list[FilePart]],
    plan: RunPlan,
    merged: MergedStatistics,
    outcome: GroupOutcome,
    group_size: int | None,
) -> GroupOutcome:
    """pass_at_k: every row's group and reward gathered on the driver in input order (16 bytes a
    row, as the local engine holds them), then every row's advantage (:meth:`RunPlan.with_group_rewards`)."""
    job = {"payload": _payload(ray, merged, outcome), "token": uuid.uuid4().hex}
    tables = _map_blocks(ray, blocks, block_group_rewards, config=plan.config, group_size=group_size, **job)
    pieces = [
        (
            t.column("group").to_numpy(),
            torch.from_numpy(t.column("reward").to_numpy().copy()),
            torch.from_numpy(t.column("scored").to_numpy(zero_copy_only=False).copy()),
        )
        for t in tables
    ]
    return plan.with_group_rewards(outcome, pieces)


def _trainer_filter(
    ray: Any,
    parts: list[list[FilePart]],
    plan: RunPlan,
    merged: MergedStatistics,
    outcome: GroupOutcome,
    job: dict[str, Any],
) -> dict[str, Any]:
    """``check --trainer-filter``: every scored row's group and reward gathered in input order
    (16 bytes a row on the driver, as the local engine holds them), then the trainer's rule on
    each group against the exact decision (:meth:`~grpo_cli.run.plan.RunPlan.trainer_filter_report`)."""
    job = {name: value for name, value in job.items() if name != "provenance"}
    tables = _map_blocks(ray, parts, block_filter_rows, **job)
    ids = np.concatenate([t.column("group").to_numpy() for t in tables]) if tables else np.zeros(0, np.int64)
    values = np.concatenate([t.column("reward").to_numpy() for t in tables]) if tables else np.zeros(0)
    return plan.trainer_filter_report(
        ids,
        values,
        outcome.active,
        by=merged.by,
        batches=merged.batches,
        key_at=None if job["group_size"] is not None or merged.keys is None else merged.keys.key_at,
    )


def splice_plan(inputs: RayInputs, config: ComputeConfig) -> str | None:
    """Why this run's output is re-encoded rather than spliced, or ``None``: the local
    engine's reasons (:func:`~grpo_cli.outputs.output.splice_refusal`), and the Ray engine's own
    (a file staged from another format is re-encoded; so is a file the splice refuses, and
    two files of one name)."""
    shards = [file.shard() for file in inputs.files]
    refusal = splice_refusal(config, shards)
    if refusal is not None:
        return refusal
    staged = next((file for file in inputs.files if file.staged), None)
    if staged is not None:
        return f"{staged.display} is staged from another format; --engine ray splices Parquet files only"
    names: dict[str, str] = {}
    refusals = side_by_side_requests(_splice_refusal_of, inputs.files)
    for file, shard, refused in zip(inputs.files, shards, refusals, strict=True):
        if refused is not None:
            return f"{file.display}: {refused}"
        name = output_name_of(shard)
        if name in names:
            return f"{file.display} and {names[name]} would both be written to {name}"
        names[name] = file.display
    return None


# --------------------------------------------------------------------------- the run


class RowsUnknown(GrpoError):
    """A refusal whose row the driver does not know (a null or NaN key, a group across two
    batches, a bad reward under ``--nan error``): :func:`grpo_cli.jobs.compute_dataset_ray`
    words it as the local engine does when every input is a local file."""


def run_ray(
    inputs: RayInputs,
    output: str | None,
    claim: Claim | None,
    config: ComputeConfig,
    *,
    address: str | None,
    partitions: int | None,
    quiet: bool,
) -> RunSummary:
    """The Ray Data jobs; writes to ``claim`` (a local directory) or to the URI ``output``
    (``None``: ``check``, which writes nothing and needs the advantages' range only).

    A null or NaN key, a group across two batches and (with ``--nan error``) a bad reward
    raise :class:`RowsUnknown`.
    """
    started = time.perf_counter()
    group_size = config.group_size
    asked = RunPlan(config, device=_CPU)
    schemas = _read_schemas(inputs.files, asked)
    watching = with_watched_step(config, schemas)
    if watching is not config:
        config, asked = watching, RunPlan(watching, device=_CPU)
    plan = RunPlan(keyed_by_position(config), device=_CPU)  # what the jobs run
    total_rows = sum(file.rows for file in inputs.files)
    if group_size is None:
        check_key_types(
            [(file.display, schema) for file, schema in zip(inputs.files, schemas, strict=True)],
            config.group_cols,
        )
    elif total_rows % group_size:
        raise GrpoError(f"--group-size {group_size} does not divide the {total_rows} rows of {inputs.spec}")
    total_bytes = sum(file.size_bytes for file in inputs.files)
    partition_count = partitions or max(1, math.ceil(total_bytes / PARTITION_BYTES))
    blocks = statistics_blocks(inputs.files, config.stats_block_rows)
    ray_start = time.perf_counter()
    # Ray prints warnings with print(): keep standard output for what the user asked for.
    with contextlib.redirect_stdout(sys.stderr), ray_session(address, quiet=quiet) as ray:
        ray_startup = time.perf_counter() - ray_start
        dtypes = {plan.output_dtype(schema) for schema in schemas}
        # check, where the advantages' range follows from each group's extremes, computed as
        # the rows would be: no advantage job
        range_dtype = (
            next(iter(dtypes))
            if output is None and config.verify is None and plan.range_follows_from_stats and len(dtypes) == 1
            else None
        )
        held = merged = outcome = None
        if OUTCOME_ON_REDUCERS:
            held = _held_statistics(ray, blocks, plan, group_size)
            rows, nan_rewards = held.totals.rows, held.totals.nan_rewards
        else:
            merged = _statistics(ray, blocks, plan, group_size)
            rows, nan_rewards = int(merged.rows_per_group.sum()), merged.nan_rewards
        if rows == 0:
            raise GrpoError(f"{inputs.spec}: no rows; there is nothing to compute advantages for")
        if nan_rewards and config.advantage.nan == "error":
            raise RowsUnknown(
                f"{inputs.spec}: {nan_rewards} reward(s) are null, NaN or infinite "
                "(--nan ignore leaves them out; the local engine names the first row)"
            )
        if held is not None:
            totals = held.totals
            second_round = held.round_two(ray, plan, range_dtype)  # beside the advantage job
            transform = None
            if plan.needs_moments_pass:
                moments = _moments(ray, blocks, plan, held.payload(ray), group_size)
                transform = plan.transform(moments)
            payload = held.payload(ray, transform)
        else:
            assert merged is not None
            outcome = _outcome_of(plan, merged)
            if "group_rewards" in plan.needs:
                outcome = _with_group_rewards(ray, blocks, plan, merged, outcome, group_size)
            if plan.needs_moments_pass:
                moments = _moments(ray, blocks, plan, _payload(ray, merged, outcome), group_size)
                outcome = replace(outcome, transform=plan.transform(moments))
            totals = outcome.totals
            payload = _payload(ray, merged, outcome)
        parts = advantage_parts(inputs.files, partition_count)
        written_info: dict[str, Any] | None = None
        job = {
            "payload": payload,
            "token": uuid.uuid4().hex,
            "config": plan.config,
            # the options as asked (--group-size), as the local engine records them
            "provenance": asked.provenance([file.display for file in inputs.files], totals),
            "group_size": group_size,
        }

        def summary(
            extremes: tuple[float, float] | None,
            written: dict[str, Any] | None = None,
            **checked: Any,
        ) -> RunSummary:
            if held is not None:
                seconds = [_report_of(table) for table in ray.get(second_round)]
                if range_dtype is not None:
                    extremes = _merged_range([extremes for _, extremes in seconds], totals.nan_rewards)
                findings = merged_findings(
                    held.first,
                    sum((second for second, _ in seconds), SecondRound()),
                    options=config.findings_options(),
                    named=config.group_size is None,
                )
                findings = replace(findings, by=held.by)
                measured: GroupOutcome | OutcomeTotals = totals
            else:
                assert merged is not None and outcome is not None
                key_at = None if config.group_size is not None or merged.keys is None else merged.keys.key_at
                findings = group_findings(
                    outcome, options=config.findings_options(), key_at=key_at, by=merged.by
                )
                measured = outcome
            return _summary(
                inputs,
                config,
                measured,
                findings,
                parts,
                blocks,
                ray_startup,
                started,
                written,
                extremes,
                **checked,
            )

        if output is None:  # check: the figures and the advantages' range, nothing written
            filtered = verified = None
            extremes = None
            if config.trainer_filter is not None and held is not None:
                assert held.filtered is not None
                filtered = plan.trainer_filter_result(held.filtered)
            elif config.trainer_filter is not None:
                assert merged is not None and outcome is not None
                filtered = _trainer_filter(ray, parts, plan, merged, outcome, job)
            if config.verify is not None and held is not None:
                verified, extremes = _held_verify(ray, parts, plan, held, job)
            elif config.verify is not None:
                assert merged is not None and outcome is not None
                verified, extremes = _verify(ray, parts, plan, outcome, merged.keys, job)
            elif range_dtype is not None:
                if outcome is not None:  # else each bucket's range comes with its round 2
                    extremes = plan.advantage_range_from_stats(outcome, range_dtype)
            else:
                column = config.advantage_col
                advantages = _block_dataset(ray, parts, block_advantages, **job).select_columns([column])
                extremes = (float(advantages.min(column)), float(advantages.max(column)))
            return summary(extremes, verified=verified, trainer_filter=filtered)
        assert claim is not None
        # A cluster's workers write a store's output to its staging folder there; otherwise Ray
        # writes to the claim's temporary folder on this machine.
        filesystem: Any = None
        if isinstance(claim, StagedRemoteClaim):
            target = claim.staging_uri()
            filesystem, folder = _open_remote(target)
        else:
            target = folder = str(claim.temp_path())
        rewrite_reason = splice_plan(inputs, config)
        method = "rewrite"
        if rewrite_reason is None:  # each task splices one input file, as the local engine does
            method, parts = "splice", [[FilePart(file, 0, file.rows)] for file in inputs.files]
            tables = _map_blocks(ray, parts, block_splice, target=target, **job)
            extremes = _range_of(tables)
        else:
            _block_dataset(ray, parts, block_advantages, **job).write_parquet(
                folder, filesystem=filesystem, try_create_dir=filesystem is None
            )
        written: list[Path | str] = (
            [*_files_under(filesystem, folder)] if filesystem else [*sorted(Path(folder).glob("*.parquet"))]
        )
        if not written:  # Ray Data writes no file for no rows (every group filtered out)
            schema = asked.output_schema(schemas[0], job["provenance"])
            written = [_write_empty(schema, folder, filesystem)]
        footers = _written_footers(written, totals, claim.display, filesystem=filesystem)
        if rewrite_reason is not None:
            extremes = footers_range(footers, config.advantage_col)
        if isinstance(claim, StagedRemoteClaim):
            claim.commit()
            assert claim.transfer is not None
            written_info = {
                "path": claim.display,
                "shards": len(written),
                "bytes": claim.transfer["bytes_uploaded"],
            }
            if method == "splice":  # what the tasks uploaded, and what they copied in the store
                claim.transfer["bytes_uploaded"] = sum(t.column("uploaded")[0].as_py() for t in tables)
                claim.transfer["bytes_copied_in_store"] = sum(t.column("copied")[0].as_py() for t in tables)
        else:
            if method == "splice" and isinstance(claim, RemoteClaim):  # S3 inputs' bytes copied in the store
                for table in tables:
                    source = table.column("source")[0].as_py()
                    if source.startswith("s3://"):
                        claim.note_copied_prefix(
                            table.column("name")[0].as_py(), source, table.column("prefix")[0].as_py()
                        )
            # before the commit: an upload removes them
            written_info = output_info(claim.display, [Path(file) for file in written])
            commit_directory(claim)
        if claim.transfer is not None:
            written_info["transfer"] = claim.transfer
        written_info.update(method=method, shards_by_method={method: len(written)})
        if rewrite_reason is not None:
            written_info["rewrite_reason"] = rewrite_reason
        # in the session: the summary names groups by their keys, which the object store holds
        return summary(extremes, written_info)


def _summary(
    inputs: RayInputs,
    config: ComputeConfig,
    outcome: GroupOutcome | OutcomeTotals,
    findings: GroupFindings,
    parts: list[Any],
    blocks: list[Any],
    ray_startup: float,
    started: float,
    written_info: dict[str, Any] | None,
    extremes: tuple[float, float] | None,
    *,
    verified: dict[str, Any] | None = None,
    trainer_filter: dict[str, Any] | None = None,
) -> RunSummary:
    options = {
        **config.options_summary(),
        "device": "cpu",
        "engine": "ray",
        "partitions": len(parts),
        "statistics_blocks": len(blocks),
        # where each group's outcome was computed: "reducers" (the driver held the merged
        # totals and findings only) or "driver" (it gathered every group's figures)
        "outcome_on": "reducers" if isinstance(outcome, OutcomeTotals) else "driver",
        "ray_startup_seconds": round(ray_startup, 3),
    }
    output = written_info
    return build_summary(
        outcome,
        input=input_info(
            inputs.spec,
            [file.shard() for file in inputs.files],
            stdin=inputs.spec == "-",
            bytes_decoded=sum(file.size_bytes for file in inputs.files),
            about=inputs.about,
        ),
        output=output,
        options=options,
        advantage_range=extremes,
        mode="ray",
        device="cpu",
        elapsed=time.perf_counter() - started,
        verify=verified,
        trainer_filter=trainer_filter,
        findings=findings,
    )


def _payload(ray: Any, merged: MergedStatistics, outcome: GroupOutcome) -> Any:
    """What the workers of the moments and advantage jobs read once, in the object store: the
    keys' buckets and IDs (their tables are there already) and the outcome, its tensors
    shipped as NumPy arrays (:func:`_shipped`)."""
    assert merged.keys is not None
    return ray.put(
        {"keys": replace(merged.keys, positions=np.zeros(0, np.int64)), "outcome": _shipped(outcome)}
    )


class _ShippedTensor:
    """A CPU tensor on its way to Ray's object store as the NumPy array over its memory: Ray
    stores an array's buffer without a copy, where a tensor is first pickled into a copy of its
    bytes on the driver (about 100 bytes a group for an outcome: the driver's peak)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.array = tensor.numpy()

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray]]:
        return _tensor_of, (self.array,)


def _tensor_of(array: np.ndarray) -> torch.Tensor:
    """A shipped tensor, back in a worker: a copy, since the object store's pages are read-only."""
    return torch.from_numpy(array.copy())


def _shipped(value: Any) -> Any:
    """``value`` with each tensor in it (through dataclasses, lists, tuples and dicts) shipped as
    a :class:`_ShippedTensor`, which a worker unpickles as the tensor; nothing is copied here."""
    if isinstance(value, torch.Tensor):
        return _ShippedTensor(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: _shipped(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return replace(value, **changed)
    if isinstance(value, list):
        return [_shipped(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_shipped(item) for item in value)
    if isinstance(value, dict):
        return {key: _shipped(item) for key, item in value.items()}
    return value


def _block_dataset(ray: Any, blocks: list[list[FilePart]], function: Any, **kwargs: Any) -> Any:
    """A dataset of ``function`` over every block (its index in a one-row batch), a Ray task each."""
    ds = ray.data.from_items([{"block": i} for i in range(len(blocks))], override_num_blocks=len(blocks))
    return ds.map_batches(
        function, batch_size=1, batch_format="pyarrow", fn_kwargs={"blocks": blocks, **kwargs}
    )


def _map_blocks(ray: Any, blocks: list[list[FilePart]], function: Any, **kwargs: Any) -> list[pa.Table]:
    """``function`` over every statistics block, a Ray task each; the tables in block order."""
    if not blocks:
        return []
    out = _block_dataset(ray, blocks, function, **kwargs)
    tables = [t for t in ray.get(out.to_arrow_refs()) if t.num_rows]
    errors = [t.column(ERROR_FIELD)[0].as_py() for t in tables if ERROR_FIELD in t.column_names]
    if errors:
        raise RowsUnknown(errors[0])

    # Ray may hand a task's rows back in several pieces: put them back in block order.
    def position(table: pa.Table) -> tuple[int, int]:
        first = table.column(GROUP_FIELD)[0].as_py() if GROUP_FIELD in table.column_names else 0
        return table.column(BLOCK_FIELD)[0].as_py(), first

    return sorted(tables, key=position)


# the statistics job's reducers; None: one per CPU of the instance, at most one per block
REDUCERS: int | None = None
# False: the driver gathers every group's figures even where the reducers could finish the
# statistics job, as before 2026-12-06 (benchmarks and tests compare the two)
OUTCOME_ON_REDUCERS = True


def block_partials(
    index: int,
    blocks: list[list[FilePart]],
    config: ComputeConfig,
    group_size: int | None,
    buckets: int,
    with_rows: bool = False,
) -> Any:
    """Map task of the statistics job: block ``index``'s partial rows (:func:`block_statistics`)
    cut into ``buckets`` tables by their key's bucket (:func:`~grpo_cli.arrow.keys.key_buckets`), each
    in the block's order; a refusal goes to every bucket. ``with_rows`` (pass_at_k, a trainer's
    filter, on the reducers): then the block's rows, cut the same way by their group's bucket,
    in input order."""
    rows: list[pa.Table] | None = [] if with_rows else None
    table = block_statistics(pa.table({"block": [index]}), blocks, config, group_size, rows=rows)
    if ERROR_FIELD in table.column_names:
        parts = [table.append_column(BLOCK_FIELD, pa.array([index]))] * buckets
        row_parts = [pa.table({})] * (buckets if with_rows else 0)
    else:
        which = key_buckets(table.select(list(config.group_cols)), buckets)
        parts = _cut(table, which, buckets)
        row_parts = []
        if rows:
            row_parts = _cut(rows[0], which[rows[0].column(ROW_GROUP_IN_BLOCK).to_numpy()], buckets)
    out = [*parts, *row_parts]
    return out if len(out) > 1 else out[0]


def _cut(table: pa.Table, which: np.ndarray, buckets: int) -> list[pa.Table]:
    """``table``'s rows cut into ``buckets`` tables by ``which`` (each row's), each in order."""
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(buckets + 1))
    ordered = table.take(pa.array(order))
    return [ordered.slice(start, stop - start) for start, stop in itertools.pairwise(bounds)]


ROW_GROUP_IN_BLOCK = "__grpo_row_group_in_block"  # a row's group in its block, in a rows table


# How the reducers finish every run where the groups are (OUTCOME_ON_REDUCERS): each group's
# outcome follows from its own figures, its rows (pass_at_k, a trainer's filter) and its batch's
# exact figures, and the driver holds merged totals, findings and per-batch figures only.
# A batch's figures for GPG are integer sums every worker rebuilds from the buckets (the workers
# number the batches alike, by first appearance in the buckets' order), and a whitening's moments
# come from the blocks, merged in block order, a row per batch. --scale batch's std of each
# batch (or of the whole run) is exact sums over its groups, merged from the buckets in two
# rounds before the outcome (_held_statistics). --by's figures per value come from a second cut
# of the groups, by value (_by_values); pass_at_k's rows go to their group's bucket, whose
# reducer makes a table per group and reward; check --verify's constant groups are settled by a
# task per bucket (_held_verify); a trainer's rule on each group's own rows runs where the group
# is, a whole-batch rule in a task per cut of the batches (by_batch_filter).


@dataclass(frozen=True)
class BucketReport:
    """What the driver gets of a reducer's bucket where the reducers finish the statistics job
    (:data:`OUTCOME_ON_REDUCERS`): its groups, the totals of its outcome and round 1 of its findings."""

    groups: int
    totals: OutcomeTotals
    first: FirstRound
    batch_totals: list[dict[Any, RewardTotals]] | None  # --scale batch: round 1 of each batch's std
    filtered: FilterPart | None = None  # check --trainer-filter: the rule on its groups


REPORT_FIELD = "__grpo_report"  # a pickled report of a bucket, in a one-row table


def _report_table(report: Any) -> pa.Table:
    return pa.table({REPORT_FIELD: [pickle.dumps(report)]})


def _report_of(table: pa.Table) -> Any:
    return pickle.loads(table.column(REPORT_FIELD)[0].as_py())


BatchStds = list[dict[Any, float]]
"""``--scale batch``: per channel, each batch's reward std by its key (``None``: the whole run)."""


def _bucket_parts(
    plan: RunPlan, figures: pa.Table, merged: MergedStatistics, keys: pa.Table, batch_stds: BatchStds | None
) -> tuple[GroupOutcome, GroupPart, list[Any]]:
    """A bucket's outcome (its groups in its own order, ``merged`` from its ``figures``) and its
    groups as parts of the findings, in the run's order by where each group first appeared
    (block, then place in the block), named by their keys (by the group IDs they are with
    ``--group-size``)."""
    outcome = _outcome_of(plan, merged, batch_stds)
    block, place = (figures.column(name).to_numpy() for name in FIRST_SEEN_FIELDS)
    if place.size and int(place.max()) >= 1 << 32:
        raise GrpoError(f"a statistics block holds {int(place.max()) + 1:,} groups; at most 2**32 are kept")
    order = (block.astype(np.int64) << 32) | place.astype(np.int64)
    named = plan.config.group_cols != (ROW_GROUP_FIELD,)
    whole = outcome_part(outcome, order=order, named=named)
    return outcome, whole, in_chunks(whole, FINDINGS_CHUNK_GROUPS, key_at=functools.partial(_key_in, keys))


def bucket_round_two(
    config: ComputeConfig,
    run: RunFigures,
    dtype: torch.dtype | None,
    batch_stds: BatchStds | None,
    figures: pa.Table,
    keys: pa.Table,
) -> pa.Table:
    """Round 2 of a bucket's findings, given the run's figures from every bucket's round 1; with
    ``dtype`` (``check`` where the advantages' range follows from the groups' extremes) also the
    range of its groups' advantages in that dtype, rows left out of the statistics aside."""
    plan = RunPlan(config, device=_CPU)
    merged = _in_bucket_order(plan, [figures], [figures.num_rows])
    outcome, _, parts = _bucket_parts(plan, figures, merged, keys, batch_stds)
    second = sum((SecondRound.of(part, run) for part in parts), SecondRound())
    extremes = None
    if dtype is not None:
        extremes = plan.advantage_range_from_stats(replace(outcome, nan_rewards=0), dtype)
    return _report_table((second, extremes))


def merge_bucket(
    config: ComputeConfig, finish: bool, buckets: int, with_rows: bool, *tables: pa.Table
) -> tuple[pa.Table, ...]:
    """Reduce task of the statistics job: one bucket's partial rows of every block, in block
    order, merged per group as the local engine merges its blocks (:class:`OrderedMerge`; a
    group's figures depend on its own partial rows only, so the bits are the local engine's).
    ``tables``: the blocks' partial rows, then with ``with_rows`` their rows (pass_at_k, a
    trainer's filter).

    Returns where each of the bucket's groups first appeared (:data:`FIRST_SEEN_FIELDS`), its
    figures (:meth:`OrderedMerge.bucket_table`), its keys and an empty table; or a refusal and
    three empty tables. Where the reducers ``finish`` the job (:data:`OUTCOME_ON_REDUCERS`) the
    first is the bucket's :class:`BucketReport` instead, the figures keep where each group first
    appeared, and the fourth is pass_at_k's table of its groups (:func:`_credit_table`); with
    ``--by``, each column's groups follow, cut into ``buckets`` tables (the job's bucket count)
    by a hash of their value (:func:`_by_value_parts`).
    """
    plan = RunPlan(config, device=_CPU)
    merge = OrderedMerge(plan)
    partials = tables[: len(tables) // 2] if with_rows else tables
    row_tables = tables[len(tables) // 2 :] if with_rows else ()
    nothing = pa.table({})
    by_parts = [nothing] * (_value_cuts(plan) * buckets if finish else 0)
    row_ids: list[np.ndarray] = []
    row_columns: dict[str, list[np.ndarray]] = {"reward": [], "seen": [], "scored": []}
    for b, partial in enumerate(partials):
        if ERROR_FIELD in partial.column_names:
            return partial, nothing, _empty_keys(plan), nothing, *by_parts
        try:
            ids_np = merge.add(partial)
        except RowsUnknown as error:
            block = partial.column(BLOCK_FIELD)[0].as_py()
            refusal = _refusal(error.message).append_column(BLOCK_FIELD, pa.array([block]))
            return refusal, nothing, _empty_keys(plan), nothing, *by_parts
        if with_rows and row_tables[b].num_rows:  # each row's group: its block's group's ID here
            rows = row_tables[b]
            in_block = partial.column(GROUP_FIELD).to_numpy()
            row_ids.append(ids_np[np.searchsorted(in_block, rows.column(ROW_GROUP_IN_BLOCK).to_numpy())])
            for name, parts_of in row_columns.items():
                if name in rows.column_names:
                    parts_of.append(rows.column(name).to_numpy(zero_copy_only=False))
    empty = merge.first_table if merge.first_table is not None else _empty_keys(plan)
    figures = merge.bucket_table()
    keys = merge.keys.key_table(empty)
    if finish:
        # The report counts groups, rows and active groups, which each group's span decides:
        # with --scale batch the std the bucket's own groups give (not the batches') changes none.
        merged = _in_bucket_order(plan, [figures], [figures.num_rows])
        outcome, whole, parts = _bucket_parts(plan, figures, merged, keys, None)
        first = sum((FirstRound.of(part) for part in parts), FirstRound())
        batch_totals = None
        if config.advantage.scale == "batch":  # round 1 of each batch's std
            batch_totals = plan.batch_totals(merged.channel_stats, merged.batches)
        filtered: FilterPart | None = None
        filter_cuts: list[pa.Table] = []
        if config.trainer_filter is not None:
            groups = _filter_groups(outcome, row_ids, row_columns["seen"])
            filtered, filter_cuts = _bucket_filter(plan, outcome, whole, merged, keys, groups, buckets)
        report = BucketReport(figures.num_rows, outcome.totals, first, batch_totals, filtered)
        credit = nothing
        if with_rows and "group_rewards" in plan.needs:
            credit = _credit_table(plan, outcome, row_ids, row_columns["reward"], row_columns["scored"])
        by_parts = _by_value_parts(merged.by, whole, buckets)
        return _report_table(report), figures, keys, credit, *by_parts, *filter_cuts
    first_seen = figures.select(list(FIRST_SEEN_FIELDS))
    return first_seen, figures.drop_columns(list(FIRST_SEEN_FIELDS)), keys, nothing


def _value_cuts(plan: RunPlan) -> int:
    """How many cuts of its groups by a value's hash each reducer makes: one a --by column, and
    one for a trainer's whole-batch filter."""
    return len(plan.config.by_cols) + int(plan.whole_batch_filter)


def _filter_groups(outcome: GroupOutcome, ids: list[np.ndarray], seen: list[np.ndarray]) -> list[np.ndarray]:
    """Each of a bucket's groups' rows, the reward a trainer's filter sees, in input order."""
    from grpo_cli.trainers.filters import split_by_group

    if ids:
        row_ids, values = np.concatenate(ids), np.concatenate(seen)
    else:
        row_ids, values = np.zeros(0, np.int64), np.zeros(0)
    return split_by_group(row_ids, values, int(outcome.active.numel()))


KEY_PREFIX = "__grpo_key_"  # a group's key column, in a cut of the groups


def _bucket_filter(
    plan: RunPlan,
    outcome: GroupOutcome,
    whole: GroupPart,
    merged: MergedStatistics,
    keys: pa.Table,
    groups: list[np.ndarray],
    buckets: int,
) -> tuple[FilterPart | None, list[pa.Table]]:
    """``check --trainer-filter`` on a bucket's groups (each one's scored rows in input order),
    in the run's order by where each group first appeared, named by key (not with
    ``--group-size``, as the local engine names them). A rule on each group's own rows gives
    the bucket's :class:`FilterPart`; a whole-batch rule gives its groups cut into ``buckets``
    tables by a hash of their batch (``--batch-col``'s value; all in the first without one), a
    row per group with its place in the run's order, whether it is active, its key, its rewards
    and its value of :attr:`RunPlan.filter_column` (the report's view), for
    :func:`by_batch_filter`."""
    if not plan.whole_batch_filter:
        named = plan.config.group_cols != (ROW_GROUP_FIELD,)
        part = plan.trainer_filter_part(
            groups,
            outcome.active,
            order=whole.order,
            key_at=_KeyTable(keys).key_at if named else None,
            by=merged.by,
            batches=merged.batches,
        )
        return part, []
    counts = np.array([g.size for g in groups], dtype=np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    flat = np.concatenate(groups) if groups else np.zeros(0)
    columns: dict[str, Any] = {
        "order": whole.order,
        "active": outcome.active.numpy(),
        "rewards": pa.ListArray.from_arrays(offsets, pa.array(flat)),
        **{KEY_PREFIX + name: keys.column(name) for name in keys.column_names},
    }
    view = plan.filter_partition(merged.by, merged.batches)
    if view is not None:  # the report's values, beside the batches that decide
        _, view_of_group, view_values = view
        columns[FILTER_VIEW_FIELD] = pa.array([plain_key(key) for key in view_values]).take(
            pa.array(view_of_group)
        )
    batches = plan.filter_batches(merged.batches)
    if batches is None:
        table = pa.table(columns)
        return None, [table, *[table.slice(0, 0)] * (buckets - 1)]
    return None, _cut_by_value(merged.batches.keys, batches, columns, buckets)


def by_batch_filter(config: ComputeConfig, *parts: pa.Table) -> pa.Table:
    """``check --trainer-filter`` with a whole-batch rule: the batches whose groups hashed here,
    from every bucket's cut (:func:`_bucket_filter`), each batch's groups in the run's
    order, as the local engine takes them; a pickled :class:`FilterPart`."""
    from grpo_cli.trainers.filters import filter_part

    name = config.trainer_filter
    assert name is not None
    tables = [t for t in parts if t.num_rows]
    if not tables:
        return _report_table(None)
    table = pa.concat_tables(tables, promote_options="permissive")
    table = table.take(pa.array(np.argsort(table.column("order").to_numpy(), kind="stable")))
    rewards = table.column("rewards").combine_chunks()
    flat = rewards.flatten().to_numpy(zero_copy_only=False)
    groups = np.split(flat, rewards.offsets.to_numpy()[1:-1])
    batch_of_group = _values_in(table)[0] if config.batch_col is not None else None
    value_of_group = None
    column = RunPlan(config, device=_CPU).filter_column
    if column is not None:
        value_of_group = (column, *_values_in(table, FILTER_VIEW_FIELD))
    key_columns = [name for name in table.column_names if name.startswith(KEY_PREFIX)]
    named = config.group_cols != (ROW_GROUP_FIELD,)
    key_table = table.select(key_columns)
    part = filter_part(
        name,
        groups,
        table.column("active").to_numpy(zero_copy_only=False).astype(bool),
        order=table.column("order").to_numpy(),
        key_at=_KeyTable(key_table).key_at if named else None,
        value_of_group=value_of_group,
        batch_of_group=batch_of_group,
    )
    return _report_table(part)


CREDIT_FIELDS = ("group", "reward", "advantage")


def _credit_table(
    plan: RunPlan,
    outcome: GroupOutcome,
    ids: list[np.ndarray],
    values: list[np.ndarray],
    scored: list[np.ndarray],
) -> pa.Table:
    """pass_at_k's table of a bucket's groups (:class:`~grpo_cli.run.plan.RewardCredit`) from every
    row of them, each group's rows in input order: a row per group and distinct reward."""

    def joined(parts: list[np.ndarray], dtype: Any) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype))

    credit = plan.reward_credit(
        outcome, joined(values, np.float64), joined(ids, np.int64), joined(scored, bool).to(torch.bool)
    )
    return pa.table(dict(zip(CREDIT_FIELDS, (credit.groups, credit.values, credit.advantages), strict=True)))


def _credit_of(tables: Sequence[Any], sizes: Sequence[int]) -> RewardCredit:
    """The buckets' pass_at_k tables (references or tables, ``sizes``: each bucket's groups)
    laid end to end in the buckets' order (a worker's run group IDs)."""
    parts = []
    for ref, size in zip(tables, sizes, strict=True):
        group, values, advantages = (_fetched(ref).column(name).to_numpy() for name in CREDIT_FIELDS)
        parts.append(RewardCredit.of_counts(np.bincount(group, minlength=size), values, advantages))
    return RewardCredit.concat(parts)


BY_VALUE_FIELD = "__grpo_by_value"
FILTER_VIEW_FIELD = "__grpo_filter_view"  # a group's value of the trainer filter's report column
BY_FIGURES = ("count", "mean", "m2", "minimum", "maximum", "active", "rows")
"""A group's figures that :func:`~grpo_cli.results.summary.figures_by_value` reads (:class:`GroupFigures`)."""


def _by_value_parts(by: Sequence[ByValues], whole: GroupPart, buckets: int) -> list[pa.Table]:
    """``--by``: each column's groups of a bucket, cut into ``buckets`` tables by a hash of their
    value, each row a group's value (as a plain Arrow value: equal values, read from files of
    different types, hash alike) and its :data:`BY_FIGURES`. Every group of a value then meets
    in one task (:func:`by_value_figures`), whichever bucket its key hashed to."""
    figures = {name: getattr(whole, name) for name in BY_FIGURES}
    return [part for values in by for part in _cut_by_value(values.keys, values.of_group, figures, buckets)]


def _cut_by_value(
    values: Sequence[Any], of_group: np.ndarray, columns: dict[str, Any], buckets: int
) -> list[pa.Table]:
    """A table of ``columns`` (a row per group) with each group's value (``values[of_group]``,
    as a plain Arrow value: equal values read from files of different types hash alike), cut
    into ``buckets`` tables by a hash of the value."""
    value = pa.array([plain_key(key) for key in values]).take(pa.array(of_group))
    table = pa.table({BY_VALUE_FIELD: value, **columns})
    return _cut(table, key_buckets(table.select([BY_VALUE_FIELD]), buckets), buckets)


def _values_in(table: pa.Table, field: str = BY_VALUE_FIELD) -> tuple[np.ndarray, list[Any]]:
    """The value ID of each row of a table of :func:`_cut_by_value`'s cuts (its ``field``), and
    the values (IDs in order of first appearance)."""
    index = GroupKeyIndex([field], few_values=True)
    of_group = index.encode([table.column(field)])
    return of_group, [index.key_at(v) for v in range(len(index))]


def by_value_figures(column: str, run_range: tuple[float | None, float | None], *parts: pa.Table) -> pa.Table:
    """``--by``: the figures of each value whose groups hashed here, from every bucket's part
    (:func:`_by_value_parts`): :func:`~grpo_cli.results.summary.figures_by_value` of all of a value's
    groups, which depends on the set of them, not their order (exact sums, counts, extremes and
    percentiles). A pickled list of (sort key, figures)."""
    tables = [t for t in parts if t.num_rows]
    if not tables:
        return _report_table([])
    table = pa.concat_tables(tables, promote_options="permissive")
    of_group, keys = _values_in(table)
    figures = GroupFigures(**{name: table.column(name).to_numpy(zero_copy_only=False) for name in BY_FIGURES})
    entries = figures_by_value(ByValues(column, of_group, keys), figures, run_range=run_range)
    return _report_table([(value_sort_key(entry["value"]), entry) for entry in entries])


def bucket_batch_squares(config: ComputeConfig, totals: Any, figures: pa.Table) -> pa.Table:
    """Round 2 of ``--scale batch``'s std: the bucket's exact sums of squared deviations from
    each batch's mean, given every bucket's round 1 merged (``totals``)."""
    plan = RunPlan(config, device=_CPU)
    merged = _in_bucket_order(plan, [figures], [figures.num_rows])
    return _report_table(plan.batch_squares(merged.channel_stats, merged.batches, totals))


def _merged_by_key(parts: Sequence[Sequence[dict[Any, Any]]]) -> list[dict[Any, Any]]:
    """Per channel, the parts' figures merged by key with ``+`` (exact: any order)."""
    out: list[dict[Any, Any]] = [{} for _ in parts[0]] if parts else []
    for part in parts:
        for merged, by_key in zip(out, part, strict=True):
            for key, value in by_key.items():
                merged[key] = merged[key] + value if key in merged else value
    return out


def _statistics(
    ray: Any, blocks: list[list[FilePart]], plan: RunPlan, group_size: int | None
) -> MergedStatistics:
    """Job 1: each statistics block reduced to per-group partials on a worker, cut by key
    bucket; each bucket merged on a worker in block order; the driver takes the buckets'
    figures (no key, no partial row) and puts the groups in the run's order, first appearance
    over the whole input: by the block and place in it where each group first appeared."""
    first_seen, figures, keys, _, _ = _reduced(ray, blocks, plan, group_size, finish=False)
    return _gathered(plan, first_seen, figures, keys)


@dataclass(frozen=True)
class HeldStatistics:
    """Job 1 where the reducers finish it (:data:`OUTCOME_ON_REDUCERS`): each bucket's figures and
    keys stay in the object store (``figures``, ``keys``: references, ``sizes``: its groups);
    the driver holds the buckets' merged totals and round 1 of the findings."""

    figures: list[Any]
    keys: list[Any]
    sizes: list[int]
    totals: OutcomeTotals
    first: FirstRound
    batch_stds: BatchStds | None  # --scale batch: each batch's std, merged from the buckets
    by: dict[str, list[dict[str, Any]]]  # --by: each column's figures per value, in the summary's order
    credits: list[Any] | None  # pass_at_k: each bucket's table per group and reward (references)
    filtered: FilterPart | None  # check --trainer-filter: the rule on every group, merged

    def payload(self, ray: Any, transform: BatchTransform | None = None) -> Any:
        """What each worker of the moments and advantage jobs reads once: the buckets'
        references, the batches' stds with ``--scale batch``, and the run's batch transform
        where there is one (after the moments job)."""
        return ray.put(
            {
                "buckets": (self.figures, self.keys, self.sizes),
                "transform": transform,
                "batch_stds": self.batch_stds,
                "credits": self.credits,
            }
        )

    def round_two(self, ray: Any, plan: RunPlan, dtype: torch.dtype | None) -> list[Any]:
        """Round 2 of the findings, a task per bucket (:func:`bucket_round_two`), started."""
        run = RunFigures.of(self.first)
        return [
            _task(ray, bucket_round_two, num_returns=1).remote(
                plan.config, run, dtype, self.batch_stds, figures, keys
            )
            for figures, keys in zip(self.figures, self.keys, strict=True)
        ]


def _held_statistics(
    ray: Any, blocks: list[list[FilePart]], plan: RunPlan, group_size: int | None
) -> HeldStatistics:
    """Job 1 as :func:`_statistics` runs it, but each reducer computes its bucket's outcome and
    round 1 of its findings; the driver gets one report a bucket, no per-group figure.

    With ``--scale batch`` the advantages (and ``check``'s range) need each batch's std: the
    reports carry each batch's count, extremes and exact reward sum, merged here; a task per
    bucket then sums its squared deviations from the batches' means, merged here into each
    batch's std, which round 2 of the findings and the advantage job's workers are given.

    With ``--by`` each reducer also cut its groups of each column by a hash of their value; a
    task per such cut takes it from every bucket and computes the figures of its values, given
    the run's reward range; the driver holds the figures per value."""
    reports, figures, keys, credits, by_parts = _reduced(ray, blocks, plan, group_size, finish=True)
    held: list[BucketReport] = [_report_of(table) for table in reports]
    batch_stds = None
    if plan.config.advantage.scale == "batch":
        totals = _merged_by_key([report.batch_totals for report in held if report.batch_totals is not None])
        squares = ray.get(
            [_task(ray, bucket_batch_squares, num_returns=1).remote(plan.config, totals, f) for f in figures]
        )
        batch_stds = plan.batch_stds(totals, _merged_by_key([_report_of(table) for table in squares]))
    nothing = OutcomeTotals(
        rows=0,
        nan_rewards=0,
        groups=0,
        active_groups=0,
        drop_reasons=tuple(plan.drop_reasons()),
        drops_by_reason=tuple({"reason": r, "groups": 0, "rows": 0} for r in plan.drop_reasons()),
    )
    first = sum((report.first for report in held), FirstRound())
    return HeldStatistics(
        figures,
        keys,
        [report.groups for report in held],
        sum((report.totals for report in held), nothing),
        first,
        batch_stds,
        _by_values(ray, plan, first, by_parts),
        credits if "group_rewards" in plan.needs else None,
        _merged_filter([report.filtered for report in held] + _batch_filters(ray, plan, by_parts)),
    )


def _batch_filters(ray: Any, plan: RunPlan, by_parts: list[list[Any]]) -> list[FilterPart | None]:
    """``check --trainer-filter`` with a whole-batch rule: a task per cut of the batches
    (:func:`by_batch_filter`), after the ``--by`` columns' cuts; their parts."""
    config = plan.config
    if not plan.whole_batch_filter:
        return []
    buckets = len(by_parts)
    at = len(config.by_cols) * buckets
    refs = [
        _task(ray, by_batch_filter, num_returns=1).remote(config, *[parts[at + r] for parts in by_parts])
        for r in range(buckets)
    ]
    return [_report_of(table) for table in ray.get(refs)]


def _merged_filter(parts: Sequence[FilterPart | None]) -> FilterPart | None:
    """The buckets' :class:`FilterPart` merged (``None`` without ``--trainer-filter``)."""
    seen = [part for part in parts if part is not None]
    return sum(seen[1:], seen[0]) if seen else None


def _by_values(
    ray: Any, plan: RunPlan, first: FirstRound, by_parts: list[list[Any]]
) -> dict[str, list[dict[str, Any]]]:
    """``--by``: each column's figures per value (:func:`by_value_figures`), a task per cut of
    the values, sorted as the local engine lists them."""
    buckets = len(by_parts)
    run_range = (first.reward.low, first.reward.high) if first.reward.rewards else (None, None)
    started = {
        column: [
            _task(ray, by_value_figures, num_returns=1).remote(
                column, run_range, *[parts[c * buckets + r] for parts in by_parts]
            )
            for r in range(buckets)
        ]
        for c, column in enumerate(plan.config.by_cols)
    }
    by = {}
    for column, refs in started.items():
        entries = [entry for table in ray.get(refs) for entry in _report_of(table)]
        by[column] = [entry for _, entry in sorted(entries, key=lambda pair: pair[0])]
    return by


def _reduced(
    ray: Any, blocks: list[list[FilePart]], plan: RunPlan, group_size: int | None, *, finish: bool
) -> tuple[list[pa.Table], list[Any], list[Any], list[Any], list[list[Any]]]:
    """Job 1's map and reduce tasks (the reducers ``finish`` it or not, see
    :func:`merge_bucket`): their first answers (fetched; a refusal raised, the first block's),
    references to their figures, keys and pass_at_k tables, and, where they finish it with
    ``--by``, to each bucket's groups of each column cut by value (a list a bucket:
    column-major)."""
    if not blocks:
        return [], [], [], [], []
    cpus = int(ray.cluster_resources().get("CPU", 1))
    buckets = max(1, min(len(blocks), REDUCERS or cpus))
    shared = ray.put(blocks)
    # pass_at_k, a trainer's filter: every row to its group's bucket
    with_rows = finish and ("group_rewards" in plan.needs or plan.config.trainer_filter is not None)
    per_task = buckets * (2 if with_rows else 1)
    partial_refs = [
        _task(ray, block_partials, num_returns=per_task).remote(
            i, shared, plan.config, group_size, buckets, with_rows
        )
        for i in range(len(blocks))
    ]
    per_block = [refs if per_task > 1 else [refs] for refs in partial_refs]
    returns = 4 + (_value_cuts(plan) * buckets if finish else 0)
    reduced = [
        _task(ray, merge_bucket, num_returns=returns).remote(
            plan.config,
            finish,
            buckets,
            with_rows,
            *[refs[r] for refs in per_block],
            *([refs[buckets + r] for refs in per_block] if with_rows else []),
        )
        for r in range(buckets)
    ]
    answers = ray.get([refs[0] for refs in reduced])
    _raise_first_refusal(answers)
    return (
        answers,
        [refs[1] for refs in reduced],
        [refs[2] for refs in reduced],
        [refs[3] for refs in reduced],
        [refs[4:] for refs in reduced],
    )


def _raise_first_refusal(answers: Sequence[pa.Table]) -> None:
    """Raise the refusal of the first block among tasks' answers (each naming its block), if any."""
    errors = [t for t in answers if ERROR_FIELD in t.column_names]
    if errors:
        first = min(errors, key=lambda t: t.column(BLOCK_FIELD)[0].as_py())
        raise RowsUnknown(first.column(ERROR_FIELD)[0].as_py())


_TASKS: dict[tuple[Any, int], Any] = {}


def _task(ray: Any, function: Any, *, num_returns: int) -> Any:
    """``function`` as a Ray task of one CPU with ``num_returns`` results (made once a process)."""
    made = _TASKS.get((function, num_returns))
    if made is None:
        made = _TASKS[(function, num_returns)] = ray.remote(num_cpus=1, num_returns=num_returns)(function)
    return made


def _gathered(
    plan: RunPlan, first_seen: list[pa.Table], figures: list[Any], key_tables: list[Any]
) -> MergedStatistics:
    """The buckets' figures in the run's group order (see :func:`_statistics`): each bucket's
    table is fetched in turn and its columns put in place, so the driver holds the run's
    figures and one bucket's at a time."""
    starts = np.cumsum([0, *(t.num_rows for t in first_seen)], dtype=np.int64)
    k = int(starts[-1])
    seen = [
        np.concatenate([t.column(f).to_numpy() for t in first_seen]) if k else np.zeros(0, np.int64)
        for f in FIRST_SEEN_FIELDS
    ]
    positions = np.lexsort((seen[1], seen[0])).astype(np.int64)  # group g of the run is at positions[g]
    del seen
    ids = np.empty(k, dtype=np.int64)
    ids[positions] = np.arange(k, dtype=np.int64)
    places = [ids[start:stop] for start, stop in itertools.pairwise(starts)]
    merged = _placed(plan, figures, places, k, positions)
    return replace(merged, keys=BucketKeys(key_tables, ids, positions, starts[:-1]))


def _placed(
    plan: RunPlan, figures: Sequence[Any], places: Sequence[np.ndarray], k: int, positions: np.ndarray
) -> MergedStatistics:
    """The merged statistics of ``k`` groups from the buckets' ``figures`` tables (object
    references or tables, fetched one at a time): bucket ``b``'s rows go to groups
    ``places[b]``, and group ``g``'s row is at ``positions[g]`` of the tables laid end to end
    (where the one-value columns are read from). ``keys`` is left ``None``."""
    numbers: dict[str, np.ndarray] = {}
    values: dict[str, list[pa.ChunkedArray]] = {}
    for ref, place in zip(figures, places, strict=True):
        table = _fetched(ref)
        for name in table.column_names:
            if name in FIRST_SEEN_FIELDS:
                continue
            column = table.column(name)
            if name.startswith(VALUE_PREFIX):
                values.setdefault(name, []).append(column)
                continue
            array = column.to_numpy()
            if name not in numbers:
                numbers[name] = np.zeros(k, dtype=array.dtype)
            numbers[name][place] = array
        del table
    channels = [_stats_of(numbers, _channel_prefix(c), plan) for c in range(plan.channels)]
    summary = channels[0] if plan.channels == 1 else _stats_of(numbers, _SUMMARY_PREFIX, plan)
    totals = padded(
        wanted(plan.needs),
        {
            f.name: numbers[FIGURE_PREFIX + f.name]
            for f in wanted(plan.needs)
            if FIGURE_PREFIX + f.name in numbers
        },
        k,
    )
    top_two = None
    if "top_two" in plan.needs:
        top_two = empty_top_two(k)
        if k:
            top_two = TopTwo(
                *(torch.from_numpy(numbers[TOP_TWO_FIELDS[n]]) for n in ("first", "second", "best_row"))
            )
    one_value = []
    for i, (column, _, _) in enumerate(value_columns(plan.config)):
        index = GroupKeyIndex([VALUE_FIELD.format(i)], few_values=True)
        of_group = np.zeros(0, np.int64)
        if k:
            name = VALUE_FIELD.format(i)
            parts = [pa.table({name: column}) for column in values[name]]
            combined = pa.concat_tables(parts, promote_options="permissive").column(name)
            of_group = index.encode([combined.take(pa.array(positions))])
        one_value.append((column, of_group, [index.key_at(v) for v in range(len(index))]))
    return _merged(plan, None, channels, summary, totals, one_value, top_two)


def _in_bucket_order(plan: RunPlan, figures: Sequence[Any], sizes: Sequence[int]) -> MergedStatistics:
    """The merged statistics of the buckets' groups laid end to end, each bucket in its own
    order (``sizes``: each bucket's groups): a reducer's own, or every bucket's in a worker."""
    starts = list(itertools.accumulate(sizes, initial=0))
    places = [np.arange(start, stop, dtype=np.int64) for start, stop in itertools.pairwise(starts)]
    return _placed(plan, figures, places, starts[-1], np.arange(starts[-1], dtype=np.int64))


def _outcome_of(plan: RunPlan, merged: MergedStatistics, batch_stds: BatchStds | None = None) -> GroupOutcome:
    """:meth:`RunPlan.outcome` of merged statistics: the driver's, a bucket's or a worker's
    (``batch_stds``: ``--scale batch``'s, merged from every bucket, for a part of the groups)."""
    return plan.outcome(
        merged.channel_stats,
        merged.summary_stats,
        rows_per_group=merged.rows_per_group,
        rows=int(merged.rows_per_group.sum()),
        nan_rewards=merged.nan_rewards,
        batches=merged.batches,
        top_two=merged.top_two,
        length_sums=merged.figures.get("length_sums"),
        weighted_reward_sums=merged.figures.get("weighted_reward_sums"),
        batch_stds=batch_stds,
        step_spans=step_spans(merged.figures),
    )


def _merged_range(
    ranges: Sequence[tuple[float, float] | None], nan_rewards: int
) -> tuple[float, float] | None:
    """The advantages' range from the buckets' ranges of their groups' extremes: as
    :meth:`RunPlan.advantage_range_from_stats` of the whole run (rows left out get advantage 0)."""
    seen = [r for r in ranges if r is not None]
    if not seen:
        return (0.0, 0.0) if nan_rewards else None
    low, high = min(r[0] for r in seen), max(r[1] for r in seen)
    if nan_rewards:
        low, high = min(low, 0.0), max(high, 0.0)
    return low, high


def _stats_of(numbers: dict[str, np.ndarray], prefix: str, plan: RunPlan) -> GroupStats:
    if not any(name.startswith(prefix) for name in numbers):  # no group
        return empty_group_stats(0, count_extremes=plan.count_extremes and prefix != _SUMMARY_PREFIX)
    return GroupStats.from_columns(
        {name: torch.from_numpy(v) for name, v in numbers.items() if name.startswith(prefix)}, prefix
    )


def _verify(
    ray: Any,
    parts: list[list[FilePart]],
    plan: RunPlan,
    outcome: GroupOutcome,
    keys: BucketKeys | None,
    job: dict[str, Any],
) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """``check --verify-advantage-col``: each part compared on a worker, what each saw merged
    in input order into one verifier (the local engine's figures, examples named by key), and
    the advantages' range."""
    config = plan.config
    assert config.verify is not None
    job = {name: value for name, value in job.items() if name != "provenance"}
    tables = _map_blocks(ray, parts, block_verify, **job)
    verifier = Verifier(
        config.verify,
        outcome.stats,
        config.advantage,
        None if job["group_size"] is not None else keys,
        batch_transform=plan.needs_moments_pass,
    )
    for table in tables:
        verifier.merge(pickle.loads(table.column("partial")[0].as_py()))
    return verifier.result(), _range_of(tables)


def _moments(
    ray: Any,
    blocks: list[list[FilePart]],
    plan: RunPlan,
    payload: Any,
    group_size: int | None,
) -> WeightedMoments:
    """The extra job of a batch transform: each statistics block's moments of each of the
    run's batches, merged in block order as the local engine's moments pass merges them
    (``payload``: the outcome's :func:`_payload`, or the buckets' :meth:`HeldStatistics.payload`;
    the batches are numbered by the workers' outcome, each block's table a row per batch)."""
    tables = _map_blocks(
        ray,
        blocks,
        block_moments,
        payload=payload,
        token=uuid.uuid4().hex,
        config=plan.config,
        group_size=group_size,
    )
    batches = {table.num_rows for table in tables}
    if len(batches) > 1:
        raise RuntimeError(f"the moments job's blocks returned {sorted(batches)} batches")
    count = batches.pop() if batches else 0
    total = weighted_moments(torch.zeros(0), None, torch.zeros(0, dtype=torch.int64), count)
    for table in tables:
        part = WeightedMoments(
            *(
                torch.from_numpy(table.column(name).to_numpy().copy())
                for name in ("weight", "mean", "m2", "count")
            )
        )
        total = merge_weighted_moments(total, part)
    return total


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
        plan.check_columns(file.shard(), schema, writes_output=True)
        for column in (*plan.input_columns, *([plan.config.verify.column] if plan.config.verify else [])):
            if column not in schema.names:
                raise GrpoError(
                    f"{file.display}: {column!r} is a nested field; --engine ray reads top-level columns "
                    "(use the local engine)"
                )
        schemas.append(schema)
    return schemas


__all__ = ["check_ray_run", "ray_session", "resolve_inputs", "run_ray", "statistics_blocks"]
