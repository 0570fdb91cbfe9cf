"""The local engine: two passes over a rollout dataset with bounded memory.

Pass 1 reads only the reward and group-key columns, maps keys to dense group IDs and
feeds the kernel's :class:`~grpo_cli.kernel.GroupStatsAccumulator`. Pass 2 streams
every column again, appends the advantage and activity columns and writes them out.
Inputs whose decoded size fits ``memory_budget_bytes`` are read once and kept in memory
for pass 2; the arithmetic is the same, so both paths give bitwise identical results.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from grpo_cli.checks import CheckBounds, evaluate_checks
from grpo_cli.errors import GrpoError
from grpo_cli.guard import (
    PROVENANCE_KEY,
    Claim,
    WriteGuard,
    output_is_directory,
    reported_after_commit,
    write_text,
)
from grpo_cli.kernel import (
    GroupStats,
    GroupStatsAccumulator,
    Normalization,
    apply_normalization,
    group_std,
    prepare_normalization,
)
from grpo_cli.keys import GroupKeyIndex, InvalidKeyError, as_tensor, check_key_types
from grpo_cli.options import AGGREGATION_CHOICES, AdvantageOptions, RewardSpec
from grpo_cli.output import OutputTarget
from grpo_cli.sources import (
    InputSet,
    JsonlSchemaDrift,
    Shard,
    describe_row,
    estimated_memory_bytes,
    iter_batches,
    read_schema,
    read_table,
    row_count,
    unify_jsonl_schema,
)
from grpo_cli.summary import RunSummary, build_summary

DEFAULT_MEMORY_BUDGET = 1 << 30
BATCH_BYTES = 64 << 20
MAX_BATCH_ROWS = 1 << 20
KEY_CHUNK_ROWS = 1 << 21
SMALL_INPUT_ROWS = 100_000  # below this, keys are matched in a dict: no polars import


@dataclass(frozen=True)
class VerifySpec:
    """``check --verify-advantage-col``: compare an existing column with recomputed values."""

    column: str
    atol: float = 1e-6
    rtol: float = 1e-5
    max_examples: int = 5


@dataclass(frozen=True)
class ComputeConfig:
    """Everything the engine needs besides the input and output paths."""

    rewards: tuple[RewardSpec, ...] = (RewardSpec("reward"),)
    group_cols: tuple[str, ...] = ("group_id",)
    group_size: int | None = None
    aggregation: str = "sum-then-normalize"
    advantage: AdvantageOptions = field(default_factory=AdvantageOptions)
    advantage_col: str = "advantage"
    active_col: str = "group_active"
    stats_cols: bool = False
    drop_inactive: bool = False
    keep_mean_range: tuple[float, float] | None = None
    device: str = "cpu"
    batch_rows: int | None = None  # None: about BATCH_BYTES of decoded data per batch
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET
    stats_block_rows: int = 1 << 22
    input_format: str | None = None
    verify: VerifySpec | None = None

    def validate(self) -> None:
        if not self.rewards:
            raise GrpoError("at least one --reward-col is needed")
        names = [r.column for r in self.rewards]
        if len(set(names)) != len(names):
            raise GrpoError(f"--reward-col names a column twice: {', '.join(names)}")
        if self.group_size is not None and self.group_size < 1:
            raise GrpoError(f"--group-size must be a positive integer, got {self.group_size}")
        if self.group_size is None and not self.group_cols:
            raise GrpoError("give --group-col or --group-size")
        if self.aggregation not in AGGREGATION_CHOICES:
            raise GrpoError(
                f"--reward-aggregation must be one of {', '.join(AGGREGATION_CHOICES)}, "
                f"got {self.aggregation!r}"
            )
        if self.advantage_col == self.active_col:
            raise GrpoError(f"--advantage-col and --active-col are both {self.advantage_col!r}")
        if self.keep_mean_range is not None:
            low, high = self.keep_mean_range
            if not low <= high:
                raise GrpoError(f"--keep-mean-range needs LO <= HI, got {low} {high}")
        if self.batch_rows is not None and self.batch_rows < 1:
            raise GrpoError(f"batch_rows must be positive, got {self.batch_rows}")
        self.advantage.validate()

    @property
    def input_columns(self) -> list[str]:
        """The columns pass 1 reads: the rewards, then the group keys (without repeats)."""
        columns = [r.column for r in self.rewards]
        if self.group_size is None:
            columns += [c for c in self.group_cols if c not in columns]
        return columns

    @property
    def new_columns(self) -> list[str]:
        cols = [self.advantage_col, self.active_col]
        if self.stats_cols:
            cols += [
                f"{self.advantage_col}_group_mean",
                f"{self.advantage_col}_group_std",
                f"{self.advantage_col}_group_size",
            ]
        return cols


class Progress(Protocol):
    """What the engine reports while it runs; the CLI draws it with rich."""

    def start(self, description: str, total_rows: int | None) -> None: ...
    def advance(self, rows: int) -> None: ...
    def finish(self) -> None: ...


class _NoProgress:
    def start(self, description: str, total_rows: int | None) -> None:
        pass

    def advance(self, rows: int) -> None:
        pass

    def finish(self) -> None:
        pass


def resolve_device(spec: str) -> torch.device:
    """``auto`` picks CUDA, then MPS, then CPU; anything else must be available."""
    available = ["cpu"]
    if torch.cuda.is_available():
        available += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        available.append("mps")
    if spec == "auto":
        return torch.device("cuda" if "cuda" in available else "mps" if "mps" in available else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise GrpoError(
            f"--device {spec!r} is not a device name; use auto, cpu, cuda, cuda:N or mps"
        ) from None
    if spec not in available:
        raise GrpoError(f"--device {spec} is not available here; available: {', '.join(available)}")
    return device


# --------------------------------------------------------------------------- group keys


# --------------------------------------------------------------------------- ID spool


class _IdSpool:
    """Per-row group IDs from pass 1, kept for pass 2: in memory, or in a temporary file."""

    def __init__(self, *, on_disk: bool) -> None:
        self._chunks: list[np.ndarray] = []
        self._file: IO[bytes] | None = None
        if on_disk:
            # Owned by the spool and closed (so deleted) in close().
            self._file = tempfile.TemporaryFile(prefix="grpo-cli-ids-")  # noqa: SIM115

    def append(self, ids: np.ndarray) -> None:
        if self._file is not None:
            self._file.write(ids.astype(np.int64, copy=False).tobytes())
        else:
            self._chunks.append(ids)

    def reader(self) -> Callable[[int], np.ndarray]:
        if self._file is not None:
            file = self._file
            file.flush()
            file.seek(0)

            def take_from_file(n: int) -> np.ndarray:
                return np.frombuffer(file.read(n * 8), dtype=np.int64)

            return take_from_file
        flat = np.concatenate(self._chunks) if self._chunks else np.empty(0, dtype=np.int64)
        position = 0

        def take_from_memory(n: int) -> np.ndarray:
            nonlocal position
            out = flat[position : position + n]
            position += n
            return out

        return take_from_memory

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


# --------------------------------------------------------------------------- rewards


@dataclass
class _RewardBatch:
    """Rewards of one batch: per channel tensor and validity, plus the combined reward."""

    channels: list[torch.Tensor]
    channel_valid: list[torch.Tensor | None]
    combined: torch.Tensor
    combined_valid: torch.Tensor | None


class RewardReader:
    """Turns reward columns into tensors: one channel (sum-then-normalize) or one per column."""

    def __init__(self, config: ComputeConfig, schema: pa.Schema, shard: Shard) -> None:
        self.specs = config.rewards
        self.shard = shard
        self.per_column = config.aggregation == "normalize-then-sum" and len(self.specs) > 1
        types = []
        for spec in self.specs:
            column_type = schema.field(spec.column).type
            if not (
                pa.types.is_integer(column_type)
                or pa.types.is_floating(column_type)
                or pa.types.is_boolean(column_type)
                or pa.types.is_decimal(column_type)
            ):
                raise GrpoError(
                    f"{shard.display}: reward column {spec.column!r} has type {column_type}; "
                    "it must be numeric"
                )
            types.append(column_type)
        self.output_dtype = _advantage_dtype(types)
        single = len(self.specs) == 1 and self.specs[0].weight == 1.0
        self.native = single and pa.types.is_floating(types[0])

    def read(self, batch: pa.RecordBatch, first_row: int = 0) -> _RewardBatch:
        """The batch's rewards; ``first_row`` (its row in the shard) locates errors."""
        values = [self._column(batch.column(spec.column), spec.column, first_row) for spec in self.specs]
        if self.native:
            tensor = values[0]
            valid = _finite(tensor)
            return _RewardBatch([tensor], [valid], tensor, valid)
        weighted = [v.to(torch.float64) * spec.weight for v, spec in zip(values, self.specs, strict=True)]
        combined = weighted[0]
        for extra in weighted[1:]:
            combined = combined + extra
        combined_valid = _finite(combined)
        if self.per_column:
            scaled = [v.to(torch.float64) for v in values]
            return _RewardBatch(scaled, [_finite(v) for v in scaled], combined, combined_valid)
        return _RewardBatch([combined], [combined_valid], combined, combined_valid)

    def _column(self, array: pa.Array, name: str, first_row: int) -> torch.Tensor:
        if pa.types.is_integer(array.type) and array.type.bit_width == 64:
            limit = pa.scalar(1 << 53, array.type)
            too_large = pc.greater(array, limit)
            if pa.types.is_signed_integer(array.type):
                too_large = pc.or_(too_large, pc.less(array, pa.scalar(-(1 << 53), array.type)))
            if pc.any(too_large).as_py():
                index = int(pc.index(too_large, True).as_py())
                raise GrpoError(
                    f"{describe_row(self.shard, first_row + index)}: reward {array[index].as_py()} in column "
                    f"{name!r} is an integer beyond 2**53, which float64 cannot hold exactly"
                )
        if pa.types.is_decimal(array.type):
            # through text, which rounds correctly: Arrow's decimal-to-double division is
            # off by one ulp for about half of all values
            array = pc.cast(pc.cast(array, pa.string()), pa.float64())
        elif pa.types.is_boolean(array.type) or pa.types.is_integer(array.type):
            array = pc.cast(array, pa.float64(), safe=False)
        if array.null_count:
            array = array.fill_null(float("nan"))
        return as_tensor(array.to_numpy(zero_copy_only=False))


def _finite(values: torch.Tensor) -> torch.Tensor | None:
    """Validity mask, or ``None`` when every value is finite (the common case)."""
    finite = torch.isfinite(values)
    return None if bool(finite.all()) else finite


def _advantage_dtype(types: Sequence[pa.DataType]) -> torch.dtype:
    if any(pa.types.is_decimal(t) for t in types):
        return torch.float64
    floats = [t for t in types if pa.types.is_floating(t)]
    if len(types) == 1 and floats:
        return {16: torch.float16, 32: torch.float32, 64: torch.float64}[floats[0].bit_width]
    if any(t.bit_width == 64 for t in floats):
        return torch.float64
    return torch.float32


# --------------------------------------------------------------------------- the two passes


@dataclass
class _BadRewards:
    count: int = 0
    first: tuple[Shard, int, float] | None = None


@dataclass
class _Pass1:
    stats: list[GroupStats]  # one per advantage channel
    summary_stats: GroupStats  # the combined reward
    rows_per_group: np.ndarray
    num_groups: int
    rows: int
    nan_rewards: int
    keys: GroupKeyIndex | None
    cached: list[list[pa.RecordBatch]] | None


class Engine:
    """One run of ``compute`` or ``check`` over an :class:`InputSet`."""

    def __init__(
        self,
        inputs: InputSet,
        config: ComputeConfig,
        *,
        writes_output: bool = True,
        progress: Progress | None = None,
    ) -> None:
        config.validate()
        self.writes_output = writes_output
        self.inputs = inputs
        self.config = config
        self.progress: Progress = progress or _NoProgress()
        self.device = resolve_device(config.device)
        self.schemas = [read_schema(shard) for shard in inputs.shards]
        self._check_columns()
        if config.group_size is None:
            check_key_types(
                [(shard.display, schema) for shard, schema in zip(inputs.shards, self.schemas, strict=True)],
                config.group_cols,
            )
        self.in_memory = sum(estimated_memory_bytes(s) for s in inputs.shards) <= config.memory_budget_bytes
        self.bytes_read = 0
        self._spool: _IdSpool | None = None

    # ----------------------------------------------------------------- validation

    def _check_columns(self) -> None:
        for shard, schema in zip(self.inputs.shards, self.schemas, strict=True):
            check_shard_columns(shard, schema, self.config, writes_output=self.writes_output)

    # ----------------------------------------------------------------- pass 1

    def _pass1(self) -> _Pass1:
        config = self.config
        options = config.advantage
        count_extremes = options.baseline == "leave-one-out"
        total_rows = self._total_rows()
        small = total_rows is not None and total_rows <= SMALL_INPUT_ROWS
        keys = None if config.group_size is not None else GroupKeyIndex(config.group_cols, exact=small)
        channels = (
            len(config.rewards)
            if config.aggregation == "normalize-then-sum" and len(config.rewards) > 1
            else 1
        )

        def accumulator(extremes: bool) -> GroupStatsAccumulator:
            return GroupStatsAccumulator(
                device=self.device,
                block_rows=config.stats_block_rows,
                group_size=config.group_size,
                count_extremes=extremes,
            )

        accumulators = [accumulator(count_extremes) for _ in range(channels)]
        summary_acc = accumulators[0] if channels == 1 else accumulator(False)
        rows_per_group = np.zeros(0, dtype=np.int64)
        bad = _BadRewards()
        cached: list[list[pa.RecordBatch]] | None = [] if self.in_memory else None
        spool = self._spool = _IdSpool(on_disk=not self.in_memory)
        columns = None if self.in_memory else config.input_columns
        rows = 0
        pending: list[tuple[pa.RecordBatch, _RewardBatch]] = []
        pending_rows = 0
        pending_start = 0

        def flush(shard: Shard) -> None:
            # Keys are matched a chunk of batches at a time (a whole shard when it is in
            # memory anyway): each match costs a pass over the keys seen so far, so few
            # large chunks beat many small ones.
            nonlocal rows_per_group, pending_rows
            if not pending:
                return
            ids: torch.Tensor | None = None
            if keys is not None:
                key_columns = [pa.chunked_array([b.column(c) for b, _ in pending]) for c in config.group_cols]
                ids_np = self._encode_keys(keys, key_columns, shard, pending_start)
                spool.append(ids_np)
                ids = torch.from_numpy(ids_np)
                counts = np.bincount(ids_np, minlength=len(keys))
                rows_per_group = np.pad(rows_per_group, (0, len(counts) - len(rows_per_group))) + counts
            chunk = _concat_rewards([r for _, r in pending])
            for acc, values, valid in zip(accumulators, chunk.channels, chunk.channel_valid, strict=True):
                acc.update(values, ids, valid)
            if summary_acc is not accumulators[0]:
                summary_acc.update(chunk.combined, ids, chunk.combined_valid)
            pending.clear()
            pending_rows = 0

        self.progress.start("pass 1/2: statistics", total_rows)
        for shard, schema in zip(self.inputs.shards, self.schemas, strict=True):
            if len(schema) == 0:
                if cached is not None:
                    cached.append([])
                continue
            reader = RewardReader(config, schema, shard)
            shard_batches: list[pa.RecordBatch] = []
            shard_row = 0
            pending_start = 0
            for batch in self._batches(shard, columns):
                n = batch.num_rows
                if cached is not None:
                    shard_batches.append(batch)
                rewards = reader.read(batch, shard_row)
                self._note_bad_rewards(rewards, bad, shard, shard_row)
                pending.append((batch, rewards))
                pending_rows += n
                shard_row += n
                rows += n
                self.bytes_read += batch.nbytes
                if pending_rows >= KEY_CHUNK_ROWS and not self.in_memory:
                    flush(shard)
                    pending_start = shard_row
                self.progress.advance(n)
            flush(shard)
            if cached is not None:
                cached.append(shard_batches)
        self.progress.finish()
        if bad.count and options.nan == "error":
            assert bad.first is not None
            shard, row, value = bad.first
            what = "null" if value != value and self._is_null_at(shard, row) else str(value)
            raise GrpoError(
                f"{describe_row(shard, row)}: reward is {what}; {bad.count} reward(s) in all are null, "
                f"NaN or infinite (--nan ignore leaves them out)"
            )
        if config.group_size is not None:
            if rows % config.group_size:
                raise GrpoError(
                    f"--group-size {config.group_size} does not divide the {rows} rows of {self.inputs.spec}"
                )
            num_groups = rows // config.group_size
            rows_per_group = np.full(num_groups, config.group_size, dtype=np.int64)
        else:
            assert keys is not None
            num_groups = len(keys)
        stats = [acc.compute(num_groups) for acc in accumulators]
        summary_stats = stats[0] if summary_acc is accumulators[0] else summary_acc.compute(num_groups)
        return _Pass1(stats, summary_stats, rows_per_group, num_groups, rows, bad.count, keys, cached)

    def _batches(self, shard: Shard, columns: list[str] | None) -> Iterator[pa.RecordBatch]:
        """Batches sized to about ``BATCH_BYTES`` unless ``batch_rows`` is set."""
        batch_rows = self.config.batch_rows or _batch_rows_for(shard)
        if self.in_memory and shard.format == "parquet" and columns is None:
            # Read whole: pyarrow decodes row groups and columns in parallel.
            yield from read_table(shard).to_batches(max_chunksize=batch_rows)
            return
        yield from iter_batches(shard, columns, batch_rows)

    def _total_rows(self) -> int | None:
        counts = [row_count(s) for s in self.inputs.shards]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def _note_bad_rewards(
        self, rewards: _RewardBatch, bad: _BadRewards, shard: Shard, shard_row: int
    ) -> None:
        if rewards.combined_valid is None:
            return
        invalid = ~rewards.combined_valid
        count = int(invalid.sum())
        bad.count += count
        if bad.first is None:
            index = int(invalid.nonzero()[0])
            bad.first = (shard, shard_row + index, float(rewards.combined[index]))

    def _is_null_at(self, shard: Shard, row: int) -> bool:
        for spec in self.config.rewards:
            table = _read_row(shard, spec.column, row, self.config.batch_rows or MAX_BATCH_ROWS)
            if table is not None and not table.is_valid:
                return True
        return False

    def _encode_keys(
        self, keys: GroupKeyIndex, arrays: list[pa.ChunkedArray], shard: Shard, shard_row: int
    ) -> np.ndarray:
        try:
            return keys.encode(arrays)
        except InvalidKeyError as bad:
            raise GrpoError(
                f"{describe_row(shard, shard_row + bad.row)}: group key {bad.column!r} is {bad.what} "
                f"({bad.count} {bad.what} key(s) in this chunk); {bad.what} keys cannot be grouped"
            ) from None
        except (TypeError, pa.ArrowException) as exc:
            raise GrpoError(
                f"{shard.display}: cannot use {', '.join(keys.columns)} as group keys ({exc})"
            ) from None

    # ----------------------------------------------------------------- pass 2

    def run(self, output: OutputTarget | None) -> RunSummary:
        started = time.perf_counter()
        config = self.config
        try:
            first = self._pass1()
            if first.rows == 0 and output is not None:
                raise GrpoError(f"{self.inputs.spec}: no rows; there is nothing to compute advantages for")
            kwargs = config.advantage.kernel_kwargs()
            norms = [prepare_normalization(stats, **kwargs) for stats in first.stats]
            active = norms[0].active
            for extra in norms[1:]:
                active = active | extra.active
            active_cpu = active.cpu()
            group_columns = group_columns_for(config, first.summary_stats, first.rows_per_group)
            keep_groups = kept_groups(config, active.cpu(), first.summary_stats)
            tracker = _Pass2Tracker(config.verify)
            assert self._spool is not None
            take_ids = self._spool.reader()
            self.progress.start("pass 2/2: advantages" if output else "pass 2/2: verify", first.rows)
            global_row = 0
            for index, (shard, schema) in enumerate(zip(self.inputs.shards, self.schemas, strict=True)):
                out_schema = self._output_schema(schema)
                new_columns = len(config.new_columns)
                writer = output.open_shard(shard, out_schema, new_columns) if output is not None else None
                if len(schema) == 0:
                    if writer is not None:
                        writer.close()
                    continue
                reader = RewardReader(config, schema, shard)
                batches: Iterator[pa.RecordBatch] = (
                    iter(first.cached[index]) if first.cached is not None else self._batches(shard, None)
                )
                shard_row = 0
                for batch in batches:
                    n = batch.num_rows
                    if config.group_size is not None:
                        ids = torch.arange(global_row, global_row + n) // config.group_size
                    else:
                        ids = as_tensor(take_ids(n))
                    result = combined_advantages(reader.read(batch), ids, norms, active, config, self.device)
                    result = result.to(reader.output_dtype).cpu()
                    row_active = active_cpu[ids]
                    tracker.observe(batch, result, row_active, ids, first, shard, shard_row)
                    if writer is not None:
                        arrays = new_column_arrays(result, row_active, ids.numpy(), group_columns)
                        out_batch = pa.RecordBatch.from_arrays([*batch.columns, *arrays], schema=out_schema)
                        if keep_groups is not None:
                            keep = keep_groups[ids].numpy()
                            tracker.dropped_rows += int(n - keep.sum())
                            out_batch = out_batch.filter(pa.array(keep))
                        writer.write(out_batch)
                    if first.cached is None:
                        self.bytes_read += batch.nbytes
                    shard_row += n
                    global_row += n
                    self.progress.advance(n)
                if writer is not None:
                    writer.close()
            self.progress.finish()
            output_info = output.commit() if output is not None else None
        finally:
            if self._spool is not None:
                self._spool.close()
            if output is not None:
                output.discard()
        return build_summary(
            stats=first.summary_stats,
            active=active_cpu,
            rows_per_group=first.rows_per_group,
            rows=first.rows,
            nan_rewards=first.nan_rewards,
            advantage_range=tracker.advantage_range(),
            dropped_groups=0 if keep_groups is None else int((~keep_groups).sum()),
            dropped_rows=tracker.dropped_rows,
            drop_reasons=drop_reasons(config),
            inputs=self.inputs,
            bytes_read=self.bytes_read,
            output=output_info,
            options=options_summary(config),
            mode="in-memory" if self.in_memory else "streaming",
            device=str(self.device),
            elapsed=time.perf_counter() - started,
            verify=tracker.verify_result(),
        )

    def _output_schema(self, schema: pa.Schema) -> pa.Schema:
        dtype = _advantage_dtype_from_schema(self.config, schema)
        arrow_type = {torch.float16: pa.float16(), torch.float32: pa.float32(), torch.float64: pa.float64()}[
            dtype
        ]
        fields = [
            pa.field(self.config.advantage_col, arrow_type),
            pa.field(self.config.active_col, pa.bool_()),
        ]
        if self.config.stats_cols:
            prefix = self.config.advantage_col
            fields += [
                pa.field(f"{prefix}_group_mean", pa.float64()),
                pa.field(f"{prefix}_group_std", pa.float64()),
                pa.field(f"{prefix}_group_size", pa.int64()),
            ]
        out = schema
        for f in fields:
            out = out.append(f)
        metadata = dict(schema.metadata or {})
        metadata[PROVENANCE_KEY] = provenance(self.config, self.inputs)
        return out.with_metadata(metadata)


def provenance(config: ComputeConfig, inputs: Any) -> bytes:
    """The ``grpo_cli`` key-value entry of every Parquet output: how it was made."""
    from grpo_cli import __version__

    record = {
        "version": __version__,
        "options": options_summary(config),
        "inputs": [shard.display for shard in inputs.shards],
    }
    return json.dumps(record, sort_keys=True).encode()


def options_summary(config: ComputeConfig) -> dict[str, Any]:
    """Every option in force, after the preset: the summary's ``options``."""
    return {
        **config.advantage.as_dict(),
        "reward_cols": [{"column": r.column, "weight": r.weight} for r in config.rewards],
        "reward_aggregation": config.aggregation,
        "group_cols": list(config.group_cols) if config.group_size is None else [],
        "group_size": config.group_size,
        "advantage_col": config.advantage_col,
        "active_col": config.active_col,
        "stats_cols": config.stats_cols,
        "drop_inactive": config.drop_inactive,
        "keep_mean_range": list(config.keep_mean_range) if config.keep_mean_range else None,
        "device": config.device,
    }


def combined_advantages(
    rewards: _RewardBatch,
    ids: torch.Tensor,
    norms: list[Normalization],
    active: torch.Tensor,
    config: ComputeConfig,
    device: torch.device,
) -> torch.Tensor:
    """Advantages of one batch: one channel, or the weighted sum of per-reward channels."""
    ids_dev = ids.to(device)
    total: torch.Tensor | None = None
    for channel, (values, valid, norm) in enumerate(
        zip(rewards.channels, rewards.channel_valid, norms, strict=True)
    ):
        part = apply_normalization(
            values.to(device), ids_dev, norm, valid=None if valid is None else valid.to(device)
        )
        if len(norms) > 1:
            part = part.to(torch.float64) * config.rewards[channel].weight
        total = part if total is None else total + part
    assert total is not None
    if len(norms) > 1:
        # each channel leaves inactive groups at exactly 0; so does the weighted sum
        total = torch.where(active[ids_dev], total, torch.zeros_like(total))
    return total


def new_column_arrays(
    advantages: torch.Tensor,
    row_active: torch.Tensor,
    ids: np.ndarray,
    group_columns: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
) -> list[pa.Array]:
    """The appended columns of one batch, in the order of ``ComputeConfig.new_columns``."""
    arrays = [pa.array(advantages.numpy()), pa.array(row_active.numpy())]
    if group_columns is not None:
        arrays += [pa.array(column[ids]) for column in group_columns]
    return arrays


def group_columns_for(
    config: ComputeConfig, stats: GroupStats, rows_per_group: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per-group mean, std and size for --stats-cols (``None`` without it), computed once."""
    if not config.stats_cols:
        return None
    stats = stats.to("cpu")
    ddof = 1 if config.advantage.std == "sample" else 0
    std = group_std(stats, ddof=ddof)
    return stats.mean.numpy(), std.numpy(), rows_per_group


def kept_groups(config: ComputeConfig, active: torch.Tensor, stats: GroupStats) -> torch.Tensor | None:
    """Bool per group for --drop-inactive and --keep-mean-range, or ``None`` without them."""
    if not config.drop_inactive and config.keep_mean_range is None:
        return None
    keep = torch.ones(active.numel(), dtype=torch.bool)
    if config.drop_inactive:
        keep &= active
    if config.keep_mean_range is not None:
        low, high = config.keep_mean_range
        mean = stats.mean.cpu()
        keep &= (mean >= low) & (mean <= high)
    return keep


def drop_reasons(config: ComputeConfig) -> list[str]:
    reasons = []
    if config.drop_inactive:
        reasons.append("inactive group (--drop-inactive)")
    if config.keep_mean_range is not None:
        low, high = config.keep_mean_range
        reasons.append(f"group mean reward outside [{low}, {high}] (--keep-mean-range)")
    return reasons


def check_shard_columns(
    shard: Shard, schema: pa.Schema, config: ComputeConfig, *, writes_output: bool
) -> None:
    """Refuse, before any work, a shard whose columns do not fit the options."""
    if len(schema) == 0:  # an empty JSONL file: no records, no columns
        return
    names = schema.names
    for column in config.input_columns:
        if column not in names:
            raise GrpoError(f"{shard.display}: no column {column!r}; the columns are {', '.join(names)}")
    for column in config.new_columns if writes_output else ():
        if column in names:
            option = "--active-col" if column == config.active_col else "--advantage-col"
            raise GrpoError(
                f"{shard.display}: the input already has a column {column!r}; "
                f"choose another name with {option}"
            )
    if config.verify is not None and config.verify.column not in names:
        raise GrpoError(
            f"{shard.display}: no column {config.verify.column!r} to verify; "
            f"the columns are {', '.join(names)}"
        )
    for column in config.group_cols if config.group_size is None else ():
        column_type = schema.field(column).type
        if pa.types.is_nested(column_type) or pa.types.is_null(column_type):
            raise GrpoError(
                f"{shard.display}: group column {column!r} has type {column_type}; "
                "group keys must be scalars (integers, strings, ...)"
            )


def _advantage_dtype_from_schema(config: ComputeConfig, schema: pa.Schema) -> torch.dtype:
    if len(schema) == 0:  # an empty JSONL file: JSON numbers read as float64
        return torch.float64
    return _advantage_dtype([schema.field(r.column).type for r in config.rewards])


def _batch_rows_for(shard: Shard) -> int:
    decoded = estimated_memory_bytes(shard)
    rows = row_count(shard)
    if not rows:
        return MAX_BATCH_ROWS
    return int(min(MAX_BATCH_ROWS, max(1024, BATCH_BYTES * rows // max(decoded, 1))))


def _concat_rewards(parts: list[_RewardBatch]) -> _RewardBatch:
    if len(parts) == 1:
        return parts[0]

    def cat_valid(masks: list[torch.Tensor | None], values: list[torch.Tensor]) -> torch.Tensor | None:
        if all(m is None for m in masks):
            return None
        return torch.cat(
            [
                torch.ones_like(v, dtype=torch.bool) if m is None else m
                for m, v in zip(masks, values, strict=True)
            ]
        )

    channels = len(parts[0].channels)
    channel_values = [[p.channels[c] for p in parts] for c in range(channels)]
    combined = [p.combined for p in parts]
    return _RewardBatch(
        channels=[torch.cat(v) for v in channel_values],
        channel_valid=[
            cat_valid([p.channel_valid[c] for p in parts], channel_values[c]) for c in range(channels)
        ],
        combined=torch.cat(combined),
        combined_valid=cat_valid([p.combined_valid for p in parts], combined),
    )


def _read_row(shard: Shard, column: str, row: int, batch_rows: int) -> pa.Scalar | None:
    seen = 0
    for batch in iter_batches(shard, [column], batch_rows):
        if seen + batch.num_rows > row:
            return batch.column(0)[row - seen]
        seen += batch.num_rows
    return None


class _Pass2Tracker:
    """Figures gathered while advantages are written: their range and the verification."""

    def __init__(self, verify: VerifySpec | None) -> None:
        self.minimum = float("inf")
        self.maximum = float("-inf")
        self.dropped_rows = 0
        self.verify = verify
        self.mismatched = 0
        self.compared = 0
        self.max_abs_diff = 0.0
        self.examples: list[dict[str, Any]] = []

    def observe(
        self,
        batch: pa.RecordBatch,
        advantages: torch.Tensor,
        row_active: torch.Tensor,
        ids: torch.Tensor,
        first: _Pass1,
        shard: Shard,
        shard_row: int,
    ) -> None:
        if advantages.numel():
            low, high = torch.aminmax(advantages.to(torch.float64))
            self.minimum = min(self.minimum, float(low))
            self.maximum = max(self.maximum, float(high))
        if self.verify is None:
            return
        column = batch.column(self.verify.column)
        if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
            raise GrpoError(
                f"{shard.display}: column {self.verify.column!r} has type {column.type}; "
                "it must be numeric to verify"
            )
        given = as_tensor(
            pc.cast(column, pa.float64()).fill_null(float("nan")).to_numpy(zero_copy_only=False)
        )
        expected = advantages.to(torch.float64)
        diff = (given - expected).abs()
        bad = ~(diff <= self.verify.atol + self.verify.rtol * expected.abs())  # NaN counts as bad
        self.compared += given.numel()
        count = int(bad.sum())
        if diff.numel():
            finite = diff[torch.isfinite(diff)]
            if finite.numel():
                self.max_abs_diff = max(self.max_abs_diff, float(finite.max()))
            if not bool(torch.isfinite(diff).all()):
                self.max_abs_diff = float("inf")
        if not count:
            return
        self.mismatched += count
        for index in bad.nonzero().flatten().tolist():
            if len(self.examples) >= self.verify.max_examples:
                break
            gid = int(ids[index])
            key = first.keys.key_at(gid) if first.keys is not None else gid
            self.examples.append(
                {
                    "file": shard.display,
                    "row": shard_row + index,
                    "group": _jsonable(key),
                    "expected": float(expected[index]),
                    "actual": float(given[index]),
                }
            )

    def advantage_range(self) -> tuple[float, float] | None:
        if self.minimum > self.maximum:
            return None
        return self.minimum, self.maximum

    def verify_result(self) -> dict[str, Any] | None:
        if self.verify is None:
            return None
        return {
            "column": self.verify.column,
            "atol": self.verify.atol,
            "rtol": self.verify.rtol,
            "compared": self.compared,
            "mismatched": self.mismatched,
            "max_abs_diff": self.max_abs_diff,
            "examples": self.examples,
        }


def _jsonable(key: Any) -> Any:
    if isinstance(key, tuple):
        return [_jsonable(k) for k in key]
    if isinstance(key, (str, int, float, bool)) or key is None:
        return key
    return str(key)


def compute_dataset(
    input: str | os.PathLike[str],
    output: str | os.PathLike[str] | None,
    config: ComputeConfig | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
    summary_json: str | os.PathLike[str] | None = None,
) -> RunSummary:
    """Library entry point: the same job as ``grpo-cli compute``.

    Reads ``input`` (file, directory of shards, glob, or ``-``), writes the augmented
    Parquet ``output`` atomically (nothing is written when ``output`` is ``None``),
    writes the summary as JSON to ``summary_json`` if given, and returns the run's
    :class:`~grpo_cli.summary.RunSummary`. Every path is checked by the write guard
    before any work starts.
    """
    return _job(input, output, config, force=force, progress=progress, summary_json=summary_json)


def check_dataset(
    input: str | os.PathLike[str],
    bounds: CheckBounds,
    config: ComputeConfig | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
    summary_json: str | os.PathLike[str] | None = None,
) -> RunSummary:
    """Library entry point: the same job as ``grpo-cli check``; ``summary.checks`` holds the results."""

    def add_checks(summary: RunSummary) -> None:
        summary.checks = evaluate_checks(summary, bounds)

    return _job(
        input, None, config, force=force, progress=progress, summary_json=summary_json, finish=add_checks
    )


def _job(
    input: str | os.PathLike[str],
    output: str | os.PathLike[str] | None,
    config: ComputeConfig | None,
    *,
    force: bool,
    progress: Progress | None,
    summary_json: str | os.PathLike[str] | None,
    finish: Callable[[RunSummary], None] | None = None,
) -> RunSummary:
    config = config or ComputeConfig()
    config.validate()
    directory = output_is_directory(os.fspath(output)) if output is not None else False
    with (
        InputSet(str(input), input_format=config.input_format) as inputs,
        WriteGuard(inputs.protected()) as guard,
    ):
        claim, summary_claim = guard.claim_run(output, summary_json, directory=directory, force=force)
        with reported_after_commit(claim):
            summary = _run_settling_jsonl_types(inputs, config, claim, force=force, progress=progress)
            if finish is not None:
                finish(summary)
            if summary_claim is not None:
                write_text(summary_claim, summary.to_json() + "\n", force=force)
            return summary


def _run_settling_jsonl_types(
    inputs: InputSet, config: ComputeConfig, claim: Claim | None, *, force: bool, progress: Progress | None
) -> RunSummary:
    for _ in range(len(inputs.shards) + 1):
        target = OutputTarget(claim, force=force) if claim is not None else None
        try:
            engine = Engine(inputs, config, writes_output=target is not None, progress=progress)
            return engine.run(target)
        except JsonlSchemaDrift as drift:
            # Types inferred from the first block did not hold: read again with the
            # types of the whole file (nothing was written: run() discards on error).
            unify_jsonl_schema(drift.shard)
    raise GrpoError(f"{inputs.spec}: the JSONL column types could not be settled")
