"""The Ray engine: the same run on Ray Data, for datasets beyond one machine.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from grpo_cli.config import ComputeConfig
from grpo_cli.errors import GrpoError
from grpo_cli.figures import RowInputs, merge_by_group, of_chunk, wanted
from grpo_cli.file_names import PROVENANCE_KEY, output_is_directory
from grpo_cli.guard import Claim, ProtectedInputs
from grpo_cli.kernel import (
    GroupStats,
    WeightedMoments,
    empty_group_stats,
    merge_group_stats,
    merge_weighted_moments,
    weighted_moments,
)
from grpo_cli.keys import GroupKeyIndex, InvalidKeyError, as_tensor, check_key_types
from grpo_cli.options import ESTIMATOR_SPECS
from grpo_cli.output import advantage_range, commit_directory, output_info
from grpo_cli.plan import BatchLayout, GroupOutcome, RunPlan, batch_of_groups
from grpo_cli.rewards import RewardBatch, RewardReader, new_column_arrays
from grpo_cli.sources import InputSet, Shard
from grpo_cli.summary import RunSummary, build_summary, input_info

PARTITION_BYTES = 256 << 20
FIGURE_PREFIX = "__grpo_figure_"  # a block's per-group figures (figures.FIGURES)
BATCH_FIELD = "__grpo_batch"  # the --batch-col value of the group's first row in the block
BATCH_CLASH_FIELD = "__grpo_batch_clash"  # the group spans two batch values in this block
# A block with a null or NaN key returns one row of these instead of its statistics
# (an exception in a Ray task prints its traceback): the role ("group" or "batch"), the
# column, what is wrong with it, how the error words it and in how many of the block's rows.
REFUSED_FIELDS = (
    "__grpo_refused_role",
    "__grpo_refused_column",
    "__grpo_refused_what",
    "__grpo_refused_description",
    "__grpo_refused_rows",
)


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


# --------------------------------------------------------------------------- inputs and options


@dataclass(frozen=True)
class RayInputs:
    """What ``--engine ray`` reads: local Parquet shards (checked here) and URIs (passed to Ray)."""

    spec: str
    paths: list[str]
    shards: list[Shard]
    directories: list[Path]

    def protected(self) -> ProtectedInputs:
        """What no output of this run may touch: every local input file and directory."""
        return ProtectedInputs.of([(shard.path, shard.display) for shard in self.shards], self.directories)


def check_ray_run(
    input: str | Sequence[str], output: str, config: ComputeConfig, *, partitions: int | None
) -> None:
    """Refuse, before any work, what ``--engine ray`` cannot do."""
    config.validate()
    if config.group_size is not None:
        raise GrpoError("--engine ray needs --group-col; --group-size depends on row order across files")
    if config.by_cols:
        raise GrpoError("--by reports per value with the local engine; run it without --engine ray")
    if partitions is not None and partitions < 1:
        raise GrpoError(f"--partitions must be positive, got {partitions}")
    if config.device not in ("cpu", "auto"):
        raise GrpoError("--engine ray computes on the CPUs of the Ray workers; leave --device as cpu")
    if "-" in ([input] if isinstance(input, str) else input):
        raise GrpoError("--engine ray reads Parquet files, not standard input")
    estimator = config.advantage.estimator
    refusal = ESTIMATOR_SPECS[estimator].ray
    if refusal is not None:
        raise GrpoError(
            f"--engine ray does not compute --estimator {estimator}: {refusal}; use the local engine"
        )
    if not is_remote(output) and not output_is_directory(output):
        raise GrpoError(f"{output}: --engine ray writes a directory of Parquet files; name a directory")


def is_remote(path: str) -> bool:
    """An object-store URI (``s3://...``), which Ray reads or writes itself."""
    return "://" in path


def resolve_inputs(input: str | Sequence[str]) -> RayInputs:
    """Local files, directories and globs resolved to Parquet files; URIs kept as given."""
    specs = [input] if isinstance(input, str) else list(input)
    paths: list[str] = []
    shards: list[Shard] = []
    directories: list[Path] = []
    for spec in specs:
        if is_remote(spec):
            paths.append(spec)
            continue
        with InputSet(spec) as inputs:
            for shard in inputs.shards:
                if shard.format != "parquet":
                    raise GrpoError(
                        f"{shard.display}: --engine ray reads Parquet; "
                        "read other formats with the local engine"
                    )
            shards += inputs.shards
            directories += inputs.directories
            paths += [str(shard.path) for shard in inputs.shards]
    return RayInputs(", ".join(specs), paths, shards, directories)


# --------------------------------------------------------------------------- block functions


_CPU = torch.device("cpu")
_BLOCK = Shard(Path("<ray block>"), "<ray block>", "parquet", 0)


def _channel_prefix(channel: int) -> str:
    return f"__grpo_{channel}_"


_SUMMARY_PREFIX = "__grpo_summary_"


def block_group_stats(batch: pa.Table, config: ComputeConfig) -> pa.Table:
    """One row per group of the block: its key columns and sufficient statistics."""
    plan = RunPlan(config, device=_CPU)
    reader = plan.reward_reader(batch.schema, _BLOCK)
    keys = GroupKeyIndex(config.group_cols)
    batch_keys = GroupKeyIndex([config.batch_col]) if config.batch_col is not None else None
    role = "group"
    try:
        ids_np = keys.encode([batch.column(c) for c in config.group_cols])
        role = "batch"
        batch_ids = (
            batch_keys.encode([batch.column(c) for c in batch_keys.columns])
            if batch_keys is not None
            else None
        )
    except InvalidKeyError as bad:
        return pa.table(
            dict(
                zip(
                    REFUSED_FIELDS,
                    [[role], [bad.column], [bad.what], [bad.description], [bad.count]],
                    strict=True,
                )
            )
        )
    k = len(keys)
    ids = as_tensor(ids_np)
    rewards = reader.read(_record_batch(batch))
    accumulators, separate_summary = plan.accumulators(block_rows=max(1, batch.num_rows))
    columns: dict[str, Any] = {}
    channels = accumulators[: plan.channels]
    for channel, (acc, values, valid) in enumerate(
        zip(channels, rewards.channels, rewards.channel_valid, strict=True)
    ):
        acc.update(values, ids, valid)
        columns.update(_numpy(acc.compute(k).to_columns(_channel_prefix(channel))))
    if separate_summary:
        summary = accumulators[-1]
        summary.update(rewards.combined, ids, rewards.combined_valid)
        columns.update(_numpy(summary.compute(k).to_columns(_SUMMARY_PREFIX)))
    lengths = None
    if "length_sums" in plan.needs:
        assert config.length_col is not None  # ComputeConfig.validate: opo needs --length-col
        lengths = reader.lengths(_record_batch(batch), config.length_col).numpy()
    block = of_chunk(wanted(plan.needs), ids_np, k, RowInputs.of(rewards, lengths))
    columns.update({FIGURE_PREFIX + name: values for name, values in block.items()})
    table = keys.key_table(batch)
    for name, value in columns.items():
        table = table.append_column(name, pa.array(value))
    if config.batch_col is not None:
        assert batch_ids is not None
        _, split = batch_of_groups(ids_np, batch_ids, k)
        _, first_rows = np.unique(ids_np, return_index=True)
        table = table.append_column(BATCH_FIELD, batch.column(config.batch_col).take(pa.array(first_rows)))
        table = table.append_column(BATCH_CLASH_FIELD, pa.array(split))
    return table


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


@dataclass(frozen=True)
class MergedStatistics:
    """Per-block partial statistics merged into one row per group (first-appearance order)."""

    keys: pa.Table
    channel_stats: list[GroupStats]
    summary_stats: GroupStats
    figures: dict[str, np.ndarray]  # per group, each of figures.FIGURES the run wants
    batches: BatchLayout

    @property
    def rows_per_group(self) -> np.ndarray:
        return self.figures["rows"]

    @property
    def nan_rewards(self) -> int:
        return int(self.figures["nan_rewards"].sum())


def merge_partials(partials: pa.Table, plan: RunPlan) -> MergedStatistics:
    """Merge per-block group rows; a group that Ray split over blocks is merged, not double-counted."""
    group_cols = plan.config.group_cols
    keys = GroupKeyIndex(group_cols)
    ids = (
        keys.encode([partials.column(c) for c in group_cols]) if partials.num_rows else np.empty(0, np.int64)
    )
    k = len(keys)
    # occurrence rank of each row within its group: 0 for the first block's row, 1, ...
    order = np.argsort(ids, kind="stable")
    rank = np.empty_like(order)
    if order.size:
        sorted_ids = ids[order]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
        run = np.repeat(starts, np.diff(np.r_[starts, sorted_ids.size]))
        rank[order] = np.arange(sorted_ids.size) - run
    depth = int(rank.max()) + 1 if rank.size else 0

    def merged(prefix: str, extremes: bool) -> GroupStats:
        total: GroupStats | None = None
        for level in range(depth):
            rows = np.flatnonzero(rank == level)
            part = _stats_from_table(partials.take(pa.array(rows)), prefix)
            # each group appears at most once per level: place it at its group ID
            placed = part.placed(torch.from_numpy(ids[rows]), k)
            total = placed if total is None else merge_group_stats(total, placed)
        return total if total is not None else empty_group_stats(k, count_extremes=extremes)

    channels = [merged(_channel_prefix(c), plan.count_extremes) for c in range(plan.channels)]
    summary = merged(_SUMMARY_PREFIX, False) if plan.channels > 1 else channels[0]
    figures = wanted(plan.needs)
    parts = {f.name: partials.column(FIGURE_PREFIX + f.name).to_numpy() for f in figures}
    merged_figures = merge_by_group(figures, parts, ids, k)
    batches = _batch_layout(partials, ids, k, merged_figures, plan)
    return MergedStatistics(keys.key_table(partials), channels, summary, merged_figures, batches)


def _batch_layout(
    partials: pa.Table,
    ids: np.ndarray,
    k: int,
    figures: dict[str, np.ndarray],
    plan: RunPlan,
) -> BatchLayout:
    """Each group's batch (checked to be one), and rows and non-zero rewards per batch."""
    batch_col = plan.config.batch_col
    if batch_col is None:
        return BatchLayout.of_groups(np.zeros(k, dtype=np.int64), figures, [None])
    batch_keys = GroupKeyIndex([BATCH_FIELD])
    batch_ids = batch_keys.encode([partials.column(BATCH_FIELD)]) if partials.num_rows else ids
    high, across_blocks = batch_of_groups(ids, batch_ids, k)
    within_block = partials.column(BATCH_CLASH_FIELD).to_numpy(zero_copy_only=False).astype(np.float64)
    clash = across_blocks | (np.bincount(ids, weights=within_block, minlength=k) > 0)
    if clash.any():
        group = int(np.flatnonzero(clash)[0])
        key = partials.select(list(plan.config.group_cols)).take(
            pa.array([int(np.flatnonzero(ids == group)[0])])
        )
        raise RowsUnknown(
            f"group {key.to_pylist()[0]} spans two values of --batch-col {batch_col!r}; "
            "each group must lie in one training batch"
        )
    return BatchLayout.of_groups(high, figures, [batch_keys.key_at(b) for b in range(len(batch_keys))])


def _empty_partials(plan: RunPlan) -> pa.Table:
    columns: dict[str, pa.Array] = {c: pa.array([], pa.string()) for c in plan.config.group_cols}
    empty = empty_group_stats(0, count_extremes=plan.count_extremes)
    for channel in range(plan.channels):
        columns.update(
            {k: pa.array(v.numpy()) for k, v in empty.to_columns(_channel_prefix(channel)).items()}
        )
    if plan.channels > 1:
        moments = empty.without_extremes().to_columns(_SUMMARY_PREFIX)
        columns.update({k: pa.array(v.numpy()) for k, v in moments.items()})
    for figure in wanted(plan.needs):
        columns[FIGURE_PREFIX + figure.name] = pa.array(
            [], pa.int64() if figure.kind == "count" else pa.float64()
        )
    if plan.config.batch_col is not None:
        columns[BATCH_FIELD] = pa.array([], pa.string())
        columns[BATCH_CLASH_FIELD] = pa.array([], pa.bool_())
    return pa.table(columns)


_WORKER_CACHE: dict[str, Any] = {}


def _worker_state(
    payload: Any, token: str, config: ComputeConfig
) -> tuple[RunPlan, GroupKeyIndex, GroupOutcome]:
    """The plan, key index and outcome, built once per worker process and run."""
    cached = _WORKER_CACHE.get(token)
    if cached is None:
        _WORKER_CACHE.clear()
        if not isinstance(payload, dict):
            payload = import_ray().get(payload)
        plan = RunPlan(config, device=_CPU)
        index = GroupKeyIndex(config.group_cols)
        key_table: pa.Table = payload["keys"]
        if key_table.num_rows:
            index.encode([key_table.column(c) for c in config.group_cols])
        cached = (plan, index, payload["outcome"])
        _WORKER_CACHE[token] = cached
    return cached


def _block_rows(
    batch: pa.Table, plan: RunPlan, index: GroupKeyIndex, outcome: GroupOutcome
) -> tuple[RewardReader, pa.RecordBatch, np.ndarray, RewardBatch, torch.Tensor, torch.Tensor]:
    """A block's reader, record batch, group IDs, rewards, advantages before any batch transform,
    batch IDs."""
    config = plan.config
    reader = plan.reward_reader(batch.schema, _BLOCK)
    ids_np = (
        index.encode([batch.column(c) for c in config.group_cols])
        if batch.num_rows
        else np.empty(0, np.int64)
    )
    if ids_np.size and int(ids_np.max()) >= len(index):
        raise RuntimeError("a group key appeared in pass 2 that pass 1 did not see")
    record = _record_batch(batch)
    rewards, result, batch_ids = plan.row_advantages(
        record, reader, as_tensor(ids_np), outcome, active_device=outcome.active
    )
    return reader, record, ids_np, rewards, result, batch_ids


def block_moments(batch: pa.Table, payload: Any, token: str, config: ComputeConfig) -> pa.Table:
    """One block's weighted moments of the advantages per batch (for whitening)."""
    plan, index, outcome = _worker_state(payload, token, config)
    assert outcome.batches is not None
    reader, record, _, rewards, result, batch_ids = _block_rows(batch, plan, index, outcome)
    lengths = None if config.length_col is None else reader.column(record, config.length_col)
    moments = weighted_moments(
        result, lengths, batch_ids, outcome.batches.count, valid=rewards.combined_valid
    )
    return pa.table(
        {
            "weight": moments.weight.numpy(),
            "mean": moments.mean.numpy(),
            "m2": moments.m2.numpy(),
            "count": moments.count.numpy(),
        }
    )


def block_advantages(
    batch: pa.Table, payload: Any, token: str, config: ComputeConfig, provenance: bytes
) -> pa.Table:
    """Append the advantage and activity columns to one block, rows in order.

    ``payload`` (the keys and the :class:`~grpo_cli.plan.GroupOutcome`, or an
    object-store reference to them) is read once per worker process.
    """
    plan, index, outcome = _worker_state(payload, token, config)
    reader, _, ids_np, rewards, result, batch_ids = _block_rows(batch, plan, index, outcome)
    advantages = plan.finish(result, batch_ids, outcome, scored=rewards.combined_valid).to(
        reader.output_dtype
    )
    ids = torch.from_numpy(ids_np)
    arrays = new_column_arrays(advantages, outcome.active[ids], ids_np, outcome.group_columns)
    out = batch
    for name, array in zip(plan.new_columns, arrays, strict=True):
        out = out.append_column(name, array)
    if outcome.kept is not None:
        out = out.filter(pa.array(outcome.kept.numpy()[ids_np]))
    return out.replace_schema_metadata({**(out.schema.metadata or {}), PROVENANCE_KEY: provenance})


# --------------------------------------------------------------------------- the run


class RowsUnknown(GrpoError):
    """A refusal found in hash-partitioned blocks, which no longer know a row's file or
    position (:func:`grpo_cli.jobs.compute_dataset_ray` words it as the local engine does
    when every input is a local file)."""


def run_ray(
    inputs: RayInputs,
    output: str,
    claim: Claim | None,
    config: ComputeConfig,
    *,
    address: str | None,
    partitions: int | None,
    quiet: bool,
) -> RunSummary:
    """The two Ray Data jobs; writes to ``claim`` (a local directory) or to the URI ``output``.

    A null or NaN key, a group across two batches and (with ``--nan error``) a bad reward
    raise :class:`RowsUnknown`, with counts but no row.
    """
    started = time.perf_counter()
    plan = RunPlan(config, device=_CPU)
    schemas = _read_schemas(inputs.shards, plan)
    check_key_types(
        [(shard.display, schema) for shard, schema in zip(inputs.shards, schemas, strict=True)],
        config.group_cols,
    )
    total_bytes = sum(shard.size_bytes for shard in inputs.shards)
    partition_count = partitions or max(1, math.ceil(total_bytes / PARTITION_BYTES))
    ray_start = time.perf_counter()
    # Ray prints warnings with print(): keep standard output for what the user asked for.
    with contextlib.redirect_stdout(sys.stderr), ray_session(address, quiet=quiet) as ray:
        ray_startup = time.perf_counter() - ray_start
        ds = ray.data.read_parquet(inputs.paths)
        merged = _statistics(ray, ds, plan, partition_count, inputs.spec)
        if int(merged.rows_per_group.sum()) == 0:
            raise GrpoError(f"{inputs.spec}: no rows; there is nothing to compute advantages for")
        if merged.nan_rewards and config.advantage.nan == "error":
            raise RowsUnknown(
                f"{inputs.spec}: {merged.nan_rewards} reward(s) are null, NaN or infinite "
                "(--nan ignore leaves them out; the local engine names the first row)"
            )
        outcome = plan.outcome(
            merged.channel_stats,
            merged.summary_stats,
            rows_per_group=merged.rows_per_group,
            rows=int(merged.rows_per_group.sum()),
            nan_rewards=merged.nan_rewards,
            batches=merged.batches,
            length_sums=merged.figures.get("length_sums"),
            weighted_reward_sums=merged.figures.get("weighted_reward_sums"),
        )
        if plan.needs_moments_pass:
            moments = _moments(ray, ds, plan, {"keys": merged.keys, "outcome": outcome})
            outcome = replace(outcome, transform=plan.transform(moments))
        payload = ray.put({"keys": merged.keys, "outcome": outcome})
        out_ds = ds.map_batches(
            block_advantages,
            batch_size=None,
            batch_format="pyarrow",
            fn_kwargs={
                "payload": payload,
                "token": uuid.uuid4().hex,
                "config": config,
                "provenance": plan.provenance([shard.display for shard in inputs.shards], outcome),
            },
        )
        if claim is None:
            out_ds.write_parquet(output)
            written: list[Path] = []
        else:
            out_ds.write_parquet(str(claim.temp_path()))
            written = commit_directory(claim)
    options = {
        **config.options_summary(),
        "device": "cpu",
        "engine": "ray",
        "partitions": partition_count,
        "ray_startup_seconds": round(ray_startup, 3),
    }
    return build_summary(
        outcome,
        input=input_info(inputs.spec, inputs.shards, stdin=False, bytes_decoded=total_bytes),
        output={
            **output_info(output, written),
            "method": "rewrite",
            "shards_by_method": {"rewrite": len(written)},
        },
        options=options,
        advantage_range=advantage_range(written, config.advantage_col) if written else None,
        mode="ray",
        device="cpu",
        elapsed=time.perf_counter() - started,
        key_at=lambda group: _key_at(merged.keys, group),
    )


def _key_at(keys: pa.Table, group: int) -> Any:
    """Group ``group``'s key from the merged key table: one value, or a tuple of several."""
    values = tuple(keys.column(c)[group].as_py() for c in keys.column_names)
    return values[0] if len(values) == 1 else values


def _statistics(ray: Any, ds: Any, plan: RunPlan, partition_count: int, spec: str) -> MergedStatistics:
    """Job 1: hash-partition the reward and key columns by group, reduce each block, merge."""
    stats_ds = ds.select_columns(plan.input_columns).repartition(
        partition_count, keys=list(plan.config.group_cols)
    )
    partial_ds = stats_ds.map_batches(
        block_group_stats, batch_size=None, batch_format="pyarrow", fn_kwargs={"config": plan.config}
    )
    tables = [t for t in ray.get(partial_ds.to_arrow_refs()) if t.num_rows]
    refused = [t.to_pylist()[0] for t in tables if REFUSED_FIELDS[0] in t.column_names]
    if refused:
        raise _refused_keys_error(spec, refused)
    partials = pa.concat_tables(tables, promote_options="default") if tables else _empty_partials(plan)
    return merge_partials(partials, plan)


def _refused_keys_error(spec: str, refused: list[dict[str, Any]]) -> RowsUnknown:
    """One line for the blocks that held null or NaN keys: the first block's column and
    kind, with the rows of that kind over every block."""
    role, column, what, description, _ = (refused[0][field] for field in REFUSED_FIELDS)
    rows = sum(
        r[REFUSED_FIELDS[-1]] for r in refused if [r[f] for f in REFUSED_FIELDS[:3]] == [role, column, what]
    )
    return RowsUnknown(
        f"{spec}: {role} key {column!r} {description} in {rows} row(s); {what} keys cannot be grouped "
        "(the local engine names the first row)"
    )


def _moments(ray: Any, ds: Any, plan: RunPlan, payload: dict[str, Any]) -> WeightedMoments:
    """The extra job of a batch transform: each block's moments per batch, merged in block order."""
    outcome: GroupOutcome = payload["outcome"]
    assert outcome.batches is not None
    moments_ds = ds.select_columns(plan.input_columns).map_batches(
        block_moments,
        batch_size=None,
        batch_format="pyarrow",
        fn_kwargs={"payload": ray.put(payload), "token": uuid.uuid4().hex, "config": plan.config},
    )
    total = weighted_moments(torch.zeros(0), None, torch.zeros(0, dtype=torch.int64), outcome.batches.count)
    for table in ray.get(moments_ds.to_arrow_refs()):
        if table.num_rows:
            part = WeightedMoments(
                *(
                    torch.from_numpy(table.column(name).to_numpy().copy())
                    for name in ("weight", "mean", "m2", "count")
                )
            )
            total = merge_weighted_moments(total, part)
    return total


def _read_schemas(shards: list[Shard], plan: RunPlan) -> list[pa.Schema]:
    schemas = []
    for shard in shards:
        try:
            schema = pq.read_schema(shard.path)
        except (pa.ArrowException, OSError) as exc:
            raise GrpoError(f"{shard.display}: not a readable Parquet file ({exc})") from None
        plan.check_columns(shard, schema, writes_output=True)
        for column in (*plan.input_columns, *([plan.config.verify.column] if plan.config.verify else [])):
            if column not in schema.names:
                raise GrpoError(
                    f"{shard.display}: {column!r} is a nested field; --engine ray reads top-level columns "
                    "(use the local engine)"
                )
        schemas.append(schema)
    return schemas


__all__ = ["check_ray_run", "ray_session", "resolve_inputs", "run_ray"]
