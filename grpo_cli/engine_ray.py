"""The Ray engine: the same job on Ray Data, for datasets beyond one machine.

Two Ray Data jobs, both built on the kernel the local engine uses:

1. statistics: the reward and key columns are hash-partitioned by group key
   (``repartition(P, keys=...)``) so that each group lands in one partition, and each
   whole block is reduced to one row per group of sufficient statistics
   (``map_batches(batch_size=None, batch_format="pyarrow")``). The driver merges them
   (Chan et al.; a group that Ray split over two blocks is merged, not double-counted)
   and prepares the normalisation exactly as the local engine does;
2. advantages: every block of the input, in its original order, is joined with the
   per-group statistics (broadcast once through the object store) and written out.

Patterns measured to be much slower and avoided here: ``groupby().map_groups()`` (one
call and one Parquet row group per group) and Ray's ``Std`` aggregation (a Python path,
ddof=1 by default). Statistics stay in float64 and inactive groups exactly zero.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from grpo_cli.engine import (
    ComputeConfig,
    RewardReader,
    check_shard_columns,
    combined_advantages,
    drop_reasons,
    group_columns_for,
    kept_groups,
    new_column_arrays,
    options_summary,
    provenance,
)
from grpo_cli.errors import GrpoError
from grpo_cli.guard import (
    PROVENANCE_KEY,
    Claim,
    ProtectedInputs,
    WriteGuard,
    output_is_directory,
    reported_after_commit,
    write_text,
)
from grpo_cli.kernel import (
    GroupStats,
    GroupStatsAccumulator,
    merge_group_stats,
    prepare_normalization,
)
from grpo_cli.keys import GroupKeyIndex, as_tensor, check_key_types
from grpo_cli.sources import InputSet, Shard
from grpo_cli.summary import RunSummary, build_summary

PARTITION_BYTES = 256 << 20
STAT_FIELDS = ("count", "mean", "m2", "minimum", "maximum", "at_minimum", "at_maximum")
ROWS_FIELD = "__grpo_rows"
NAN_FIELD = "__grpo_nan"


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
def ray_session(address: str | None, *, quiet: bool = True) -> Iterator[Any]:
    """Join ``address`` (``auto`` or host:port), or start a private local instance.

    A local instance is started quietly (no dashboard, no log forwarding, no usage
    stats), keeps its files and its auth token in a temporary folder rather than in
    /tmp/ray and ``~/.ray``, and is shut down on every exit path. An instance already
    running in this process is reused and left running.
    """
    running = sys.modules.get("ray")
    if running is not None and running.is_initialized():
        yield running
        return
    saved_env = {k: os.environ.get(k) for k in _RAY_ENV}
    temp_dir = tempfile.mkdtemp(prefix="grpo-ray-", dir=_short_temp_root()) if address is None else None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    fresh = running is None and saved_env["RAY_AUTH_MODE"] is None and not saved_env["RAY_AUTH_TOKEN"]
    if temp_dir is not None and fresh:
        # Ray reads the token when it is imported: set it first, in a file of our own.
        token_path = Path(temp_dir) / "auth_token"
        token_path.write_text(secrets.token_hex(32))
        token_path.chmod(0o600)
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    ray = None
    try:
        ray = import_ray()
        handlers = _signal_handlers()
        try:
            if temp_dir is not None:
                ray.init(
                    include_dashboard=False, log_to_driver=False, logging_level="ERROR", _temp_dir=temp_dir
                )
            else:
                ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError) as exc:
            where = "start a local Ray instance" if address is None else f"join the Ray cluster at {address}"
            raise GrpoError(f"cannot {where} ({str(exc).strip().splitlines()[0]})") from None
        # Ray's driver installs handlers that dump stacks on SIGTERM: keep grpo-cli's, which
        # end the run cleanly (exit 130, temporaries removed).
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = not quiet
        context.print_on_execution_start = False
        for name in ("ray", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)
        yield ray
    finally:
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _short_temp_root() -> str | None:
    """Ray's socket paths must fit in 107 bytes: a long TMPDIR would break them."""
    root = tempfile.gettempdir()
    if len(root) <= 40 or not os.path.isdir("/tmp"):
        return None
    return "/tmp"


def _signal_handlers() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    names = ("SIGTERM", "SIGHUP", "SIGINT")
    return {sig: signal.getsignal(sig) for sig in (getattr(signal, n) for n in names if hasattr(signal, n))}


_RAY_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED")


# --------------------------------------------------------------------------- block functions


def _channels(config: ComputeConfig) -> int:
    per_column = config.aggregation == "normalize-then-sum" and len(config.rewards) > 1
    return len(config.rewards) if per_column else 1


def block_group_stats(batch: pa.Table, config: ComputeConfig) -> pa.Table:
    """One row per group of the block: its key columns and sufficient statistics."""
    shard = Shard(Path("<ray block>"), "<ray block>", "parquet", 0)
    reader = RewardReader(config, batch.schema, shard)
    keys = GroupKeyIndex(config.group_cols)
    ids_np = keys.encode([batch.column(c) for c in config.group_cols])
    k = len(keys)
    ids = as_tensor(ids_np)
    rewards = reader.read(_record_batch(batch))
    extremes = config.advantage.baseline == "leave-one-out"
    columns: dict[str, Any] = {}
    for channel, (values, valid) in enumerate(zip(rewards.channels, rewards.channel_valid, strict=True)):
        acc = GroupStatsAccumulator(block_rows=max(1, batch.num_rows), count_extremes=extremes)
        acc.update(values, ids, valid)
        stats = acc.compute(k)
        for name in STAT_FIELDS:
            value = getattr(stats, name)
            if value is not None:
                columns[f"__grpo_{channel}_{name}"] = value.numpy()
    if _channels(config) > 1:
        acc = GroupStatsAccumulator(block_rows=max(1, batch.num_rows))
        acc.update(rewards.combined, ids, rewards.combined_valid)
        stats = acc.compute(k)
        for name in STAT_FIELDS[:5]:
            columns[f"__grpo_summary_{name}"] = getattr(stats, name).numpy()
    columns[ROWS_FIELD] = np.bincount(ids_np, minlength=k)
    invalid = np.zeros(k, dtype=np.int64)
    if rewards.combined_valid is not None:
        invalid = np.bincount(ids_np[~rewards.combined_valid.numpy()], minlength=k)
    columns[NAN_FIELD] = invalid
    table = keys.key_table(batch)
    for name, value in columns.items():
        table = table.append_column(name, pa.array(value))
    return table


def _record_batch(table: pa.Table) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], schema=table.schema)


def _stats_from_columns(table: pa.Table, prefix: str, extremes: bool) -> GroupStats:
    def column(name: str) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(table.column(f"{prefix}{name}").to_numpy()))

    return GroupStats(
        column("count"),
        column("mean"),
        column("m2"),
        column("minimum"),
        column("maximum"),
        column("at_minimum") if extremes else None,
        column("at_maximum") if extremes else None,
    )


def merge_partials(
    partials: pa.Table, config: ComputeConfig
) -> tuple[pa.Table, list[GroupStats], GroupStats, np.ndarray, int]:
    """Merge per-block group rows into one row per group (in first-appearance order)."""
    keys = GroupKeyIndex(config.group_cols)
    ids = (
        keys.encode([partials.column(c) for c in config.group_cols])
        if partials.num_rows
        else np.empty(0, np.int64)
    )
    k = len(keys)
    extremes = config.advantage.baseline == "leave-one-out"
    # occurrence rank of each row within its group: 0 for the first block's row, 1, ...
    order = np.argsort(ids, kind="stable")
    rank = np.empty_like(order)
    if order.size:
        sorted_ids = ids[order]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
        run = np.repeat(starts, np.diff(np.r_[starts, sorted_ids.size]))
        rank[order] = np.arange(sorted_ids.size) - run
    depth = int(rank.max()) + 1 if rank.size else 0

    def merged(prefix: str, with_extremes: bool) -> GroupStats:
        total: GroupStats | None = None
        for level in range(depth):
            rows = np.flatnonzero(rank == level)
            part = _stats_from_columns(partials.take(pa.array(rows)), prefix, with_extremes)
            # place each row's statistics at its group ID; other groups stay empty
            placed = _scatter_stats(part, torch.from_numpy(ids[rows]), k)
            total = placed if total is None else merge_group_stats(total, placed)
        if total is None:
            from grpo_cli.kernel import empty_group_stats

            return empty_group_stats(k, count_extremes=with_extremes)
        return total

    channels = [merged(f"__grpo_{c}_", extremes) for c in range(_channels(config))]
    summary = merged("__grpo_summary_", False) if _channels(config) > 1 else channels[0]
    rows_per_group = np.bincount(ids, weights=partials.column(ROWS_FIELD).to_numpy(), minlength=k).astype(
        np.int64
    )
    nan_rewards = int(partials.column(NAN_FIELD).to_numpy().sum()) if partials.num_rows else 0
    key_table = keys.key_table(partials)
    return key_table, channels, summary, rows_per_group, nan_rewards


def _scatter_stats(part: GroupStats, ids: torch.Tensor, k: int) -> GroupStats:
    from grpo_cli.kernel import empty_group_stats

    out = empty_group_stats(k, count_extremes=part.at_minimum is not None)

    def put(target: torch.Tensor | None, values: torch.Tensor | None) -> torch.Tensor | None:
        if target is None or values is None:
            return None
        target = target.clone()
        target[ids] = values.to(target.dtype)
        return target

    return GroupStats(
        put(out.count, part.count),  # type: ignore[arg-type]
        put(out.mean, part.mean),  # type: ignore[arg-type]
        put(out.m2, part.m2),  # type: ignore[arg-type]
        put(out.minimum, part.minimum),  # type: ignore[arg-type]
        put(out.maximum, part.maximum),  # type: ignore[arg-type]
        put(out.at_minimum, part.at_minimum),
        put(out.at_maximum, part.at_maximum),
    )


_WORKER_CACHE: dict[str, Any] = {}


def block_advantages(batch: pa.Table, payload: Any, token: str, config: ComputeConfig) -> pa.Table:
    """Append the advantage and activity columns to one block, rows in order.

    ``payload`` (the per-group statistics, or an object-store reference to them) is
    turned into a key index and normalisations once per worker process.
    """
    cached = _WORKER_CACHE.get(token)
    if cached is None:
        _WORKER_CACHE.clear()
        if not isinstance(payload, dict):
            payload = import_ray().get(payload)
        index = GroupKeyIndex(config.group_cols)
        key_table: pa.Table = payload["keys"]
        if key_table.num_rows:
            index.encode([key_table.column(c) for c in config.group_cols])
        kwargs = config.advantage.kernel_kwargs()
        norms = [prepare_normalization(stats, **kwargs) for stats in payload["stats"]]
        active = norms[0].active
        for extra in norms[1:]:
            active = active | extra.active
        cached = (index, norms, active, payload["keep"], payload["group_columns"])
        _WORKER_CACHE[token] = cached
    index, norms, active, keep, group_columns = cached
    known = len(index)
    shard = Shard(Path("<ray block>"), "<ray block>", "parquet", 0)
    reader = RewardReader(config, batch.schema, shard)
    ids_np = (
        index.encode([batch.column(c) for c in config.group_cols])
        if batch.num_rows
        else np.empty(0, np.int64)
    )
    if ids_np.size and int(ids_np.max()) >= known:
        raise RuntimeError("a group key appeared in pass 2 that pass 1 did not see")
    ids = as_tensor(ids_np)
    rewards = reader.read(_record_batch(batch))
    advantages = combined_advantages(rewards, ids, norms, active, config, torch.device("cpu"))
    arrays = new_column_arrays(advantages.to(reader.output_dtype), active[ids], ids_np, group_columns)
    out = batch
    for name, array in zip(config.new_columns, arrays, strict=True):
        out = out.append_column(name, array)
    if keep is not None:
        out = out.filter(pa.array(keep[ids_np]))
    return out


# --------------------------------------------------------------------------- the job


class _Inputs:
    """What the summary needs to know of the inputs (local shards, or URIs as given)."""

    def __init__(self, spec: str, shards: list[Shard]) -> None:
        self.spec = spec
        self.shards = shards
        self.is_stdin = False
        self.total_bytes = sum(shard.size_bytes for shard in shards)


def _input_paths(specs: Sequence[str]) -> tuple[list[str], list[Shard], list[Path]]:
    """Local files, directories and globs resolved to Parquet files; URIs passed to Ray as given.

    Also returns the input directories named, which no output may touch.
    """
    paths: list[str] = []
    shards: list[Shard] = []
    directories: list[Path] = []
    for spec in specs:
        if "://" in spec:
            paths.append(spec)
            continue
        with InputSet(spec) as inputs:
            for shard in inputs.shards:
                if shard.format != "parquet":
                    raise GrpoError(
                        f"{shard.display}: --engine ray reads Parquet; "
                        "convert JSONL with the local engine first"
                    )
            shards += inputs.shards
            directories += inputs.directories
            paths += [str(shard.path) for shard in inputs.shards]
    return paths, shards, directories


def compute_dataset_ray(
    input: str | Sequence[str],
    output: str,
    config: ComputeConfig,
    *,
    address: str | None = None,
    partitions: int | None = None,
    force: bool = False,
    quiet: bool = True,
    summary_json: str | os.PathLike[str] | None = None,
) -> RunSummary:
    """``grpo-cli compute --engine ray``: read Parquet, write a directory of Parquet files.

    ``input`` is a file, directory, glob or object-store URI, or a list of them. Local
    outputs are claimed from the same write guard as the local engine's.
    """
    started = time.perf_counter()
    config.validate()
    if config.group_size is not None:
        raise GrpoError("--engine ray needs --group-col; --group-size depends on row order across files")
    if partitions is not None and partitions < 1:
        raise GrpoError(f"--partitions must be positive, got {partitions}")
    if config.device not in ("cpu", "auto"):
        raise GrpoError("--engine ray computes on the CPUs of the Ray workers; leave --device as cpu")
    specs = [input] if isinstance(input, str) else list(input)
    if input == "-":
        raise GrpoError("--engine ray reads Parquet files, not standard input")
    remote_output = "://" in output
    if not remote_output and not output_is_directory(output):
        raise GrpoError(f"{output}: --engine ray writes a directory of Parquet files; name a directory")
    paths, shards, directories = _input_paths(specs)
    inputs = _Inputs(", ".join(specs), shards)
    protected = ProtectedInputs.of([(shard.path, shard.display) for shard in shards], directories)
    with WriteGuard(protected) as guard:
        claim, summary_claim = guard.claim_run(
            None if remote_output else output, summary_json, directory=True, force=force
        )
        with reported_after_commit(claim):
            summary = _run_ray(inputs, paths, output, claim, config, address, partitions, force, quiet)
            summary.elapsed_seconds = time.perf_counter() - started
            if summary_claim is not None:
                write_text(summary_claim, summary.to_json() + "\n", force=force)
            return summary


def _run_ray(
    inputs: _Inputs,
    paths: list[str],
    output: str,
    claim: Claim | None,
    config: ComputeConfig,
    address: str | None,
    partitions: int | None,
    force: bool,
    quiet: bool,
) -> RunSummary:
    shards = inputs.shards
    total_bytes = inputs.total_bytes
    schemas = _check_schema(shards, config)
    check_key_types(
        [(shard.display, schema) for shard, schema in zip(shards, schemas, strict=True)], config.group_cols
    )
    partition_count = partitions or max(1, math.ceil(total_bytes / PARTITION_BYTES))
    ray_start = time.perf_counter()
    # Ray prints warnings with print(): keep standard output for what the user asked for.
    with contextlib.redirect_stdout(sys.stderr), ray_session(address, quiet=quiet) as ray:
        ray_startup = time.perf_counter() - ray_start
        ds = ray.data.read_parquet(paths)
        stats_ds = ds.select_columns(config.input_columns).repartition(
            partition_count, keys=list(config.group_cols)
        )
        partial_ds = stats_ds.map_batches(
            block_group_stats, batch_size=None, batch_format="pyarrow", fn_kwargs={"config": config}
        )
        refs = partial_ds.to_arrow_refs()
        tables = [t for t in ray.get(refs) if t.num_rows]
        partials = pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
        if partials.num_rows == 0:
            partials = _empty_partials(config)
        key_table, channel_stats, summary_stats, rows_per_group, nan_rewards = merge_partials(
            partials, config
        )
        if int(rows_per_group.sum()) == 0:
            raise GrpoError(f"{inputs.spec}: no rows; there is nothing to compute advantages for")
        if nan_rewards and config.advantage.nan == "error":
            raise GrpoError(
                f"{inputs.spec}: {nan_rewards} reward(s) are null, NaN or infinite "
                "(--nan ignore leaves them out; the local engine names the first row)"
            )
        kwargs = config.advantage.kernel_kwargs()
        norms = [prepare_normalization(stats, **kwargs) for stats in channel_stats]
        active = norms[0].active
        for extra in norms[1:]:
            active = active | extra.active
        keep = kept_groups(config, active, summary_stats)
        group_columns = group_columns_for(config, summary_stats, rows_per_group)
        payload = ray.put(
            {
                "keys": key_table,
                "stats": channel_stats,
                "keep": None if keep is None else keep.numpy(),
                "group_columns": group_columns,
            }
        )
        out_ds = ds.map_batches(
            _advantages_task,
            batch_size=None,
            batch_format="pyarrow",
            fn_kwargs={
                "payload": payload,
                "token": uuid.uuid4().hex,
                "config": config,
                "provenance": provenance(config, inputs),
            },
        )
        if claim is None:
            out_ds.write_parquet(output)
        else:
            out_ds.write_parquet(str(claim.temp_path()))
            claim.commit(force=force)
    written = sorted(claim.resolved.glob("*.parquet")) if claim is not None else []
    output_info = {
        "path": output,
        "shards": len(written),
        "bytes": sum(p.stat().st_size for p in written),
    }
    dropped_rows = int(rows_per_group[~keep.numpy()].sum()) if keep is not None else 0
    options = {
        **options_summary(config),
        "device": "cpu",
        "engine": "ray",
        "partitions": partition_count,
        "ray_startup_seconds": round(ray_startup, 3),
    }
    return build_summary(
        stats=summary_stats,
        active=active,
        rows_per_group=rows_per_group,
        rows=int(rows_per_group.sum()),
        nan_rewards=nan_rewards,
        advantage_range=_advantage_range(written, config.advantage_col) if written else None,
        dropped_groups=0 if keep is None else int((~keep).sum()),
        dropped_rows=dropped_rows,
        drop_reasons=drop_reasons(config),
        inputs=inputs,  # type: ignore[arg-type]
        bytes_read=total_bytes,
        output=output_info,
        options=options,
        mode="ray",
        device="cpu",
        elapsed=0.0,
        verify=None,
    )


def _advantages_task(
    batch: pa.Table, payload: Any, token: str, config: ComputeConfig, provenance: bytes
) -> pa.Table:
    out = block_advantages(batch, payload, token, config)
    return out.replace_schema_metadata({**(out.schema.metadata or {}), PROVENANCE_KEY: provenance})


def _empty_partials(config: ComputeConfig) -> pa.Table:
    columns: dict[str, pa.Array] = {c: pa.array([], pa.string()) for c in config.group_cols}
    for channel in range(_channels(config)):
        for name in STAT_FIELDS:
            dtype = pa.int64() if name in ("count", "at_minimum", "at_maximum") else pa.float64()
            columns[f"__grpo_{channel}_{name}"] = pa.array([], dtype)
    if _channels(config) > 1:
        for name in STAT_FIELDS[:5]:
            dtype = pa.int64() if name == "count" else pa.float64()
            columns[f"__grpo_summary_{name}"] = pa.array([], dtype)
    columns[ROWS_FIELD] = pa.array([], pa.int64())
    columns[NAN_FIELD] = pa.array([], pa.int64())
    return pa.table(columns)


def _check_schema(shards: list[Shard], config: ComputeConfig) -> list[pa.Schema]:
    schemas = []
    for shard in shards:
        try:
            schema = pq.read_schema(shard.path)
        except (pa.ArrowException, OSError) as exc:
            raise GrpoError(f"{shard.display}: not a readable Parquet file ({exc})") from None
        check_shard_columns(shard, schema, config, writes_output=True)
        schemas.append(schema)
    return schemas


def _advantage_range(files: list[Path], column: str) -> tuple[float, float] | None:
    """The advantage column's extremes, from the Parquet statistics Ray wrote."""
    low, high = math.inf, -math.inf
    for file in files:
        meta = pq.read_metadata(file)
        index = meta.schema.to_arrow_schema().get_field_index(column)
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(index).statistics
            if stats is None or not stats.has_min_max:
                if meta.row_group(group).num_rows:
                    return None
                continue
            low, high = min(low, float(stats.min)), max(high, float(stats.max))
    return (low, high) if low <= high else None


__all__ = ["compute_dataset_ray", "ray_session"]
