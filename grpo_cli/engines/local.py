"""The local engine: two passes over a rollout dataset with bounded memory.

Pass 1 (:class:`_StatisticsPass`) reads only the reward and group-key columns, maps
keys to dense group IDs and feeds the kernel's
:class:`~grpo_cli.kernel.GroupStatsAccumulator`. The plan turns the statistics into a
:class:`~grpo_cli.run.outcome.GroupOutcome`. Pass 2 streams every column again, appends the
advantage and activity columns and writes them out. Inputs whose decoded size fits
``memory_budget_bytes`` are read once and kept in memory for pass 2; the arithmetic is
the same, so both paths give bitwise identical results.
"""

from __future__ import annotations

import collections
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import IO, Any, Generic, TypeVar, cast

import numpy as np
import pyarrow as pa
import torch

from grpo_cli import interrupts
from grpo_cli.arrow.columns import column_of, filter_rows, top_level
from grpo_cli.arrow.keys import (
    GroupKeyIndex,
    InvalidKeyError,
    arrow_of,
    as_tensor,
    check_key_types,
    is_key_type,
)
from grpo_cli.errors import GrpoError
from grpo_cli.inputs.readers import (
    MAX_TYPE_SETTLINGS,
    SchemaDrift,
    describe_row,
    estimated_memory_bytes,
    hold_text_within,
    iter_batches,
    read_ahead,
    read_schema,
    read_table,
    row_count,
)
from grpo_cli.inputs.sources import InputSet, Shard
from grpo_cli.kernel import (
    GroupStats,
    RunningTopTwo,
    TopTwo,
    WeightedMoments,
    WeightedMomentsAccumulator,
)
from grpo_cli.options.config import ComputeConfig
from grpo_cli.outputs.output import (
    JsonlShardWriter,
    MemoryTarget,
    OutputTarget,
    ShardWriter,
    SplicedShardWriter,
    open_output,
    splice_refusal,
)
from grpo_cli.results.findings import GroupFindings
from grpo_cli.results.summary import ByValues, RunSummary, build_summary, group_findings, input_info
from grpo_cli.results.verify import Verifier
from grpo_cli.run.figures import FigureAccumulator, RowInputs, padded, room_for, step_spans, wanted
from grpo_cli.run.outcome import BatchLayout, GroupOutcome, batch_of_groups, scored_top_two
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.progress import NoProgress, Progress
from grpo_cli.run.rewards import RewardBatch, RewardReader, new_column_arrays
from grpo_cli.run.steps import ONE_VALUE_REASONS, with_watched_step
from grpo_cli.stages import timed

BATCH_BYTES = 64 << 20
MAX_BATCH_ROWS = 1 << 20
# Keys are matched a chunk at a time; a match costs a pass over the keys seen so far, so a
# chunk at least as large as that count keeps the total cost linear, and small chunks while
# few keys are known keep the progress bar moving with the rows actually done.
KEY_CHUNK_ROWS = 1 << 21
MIN_KEY_CHUNK_ROWS = 1 << 18
SMALL_INPUT_ROWS = 100_000  # below this, keys are matched in a dict: no polars import


def run_local(
    inputs: InputSet,
    config: ComputeConfig,
    output: OutputTarget | None,
    *,
    progress: Progress | None,
) -> RunSummary:
    """Run ``config`` over ``inputs``, writing to ``output`` (``None``: write nothing).

    ``output`` comes from :func:`~grpo_cli.outputs.output.open_output`, which may already be
    copying spliced shards' bytes; it is discarded if the run fails. Text columns whose
    type changes after the first block are settled (JSONL: the whole file's types; CSV:
    the column widened) and the run starts again (nothing was written by the failed attempt).
    """
    for _ in range(MAX_TYPE_SETTLINGS):
        try:
            engine = LocalEngine(inputs, RunPlan(config), writes_output=output is not None, progress=progress)
            return engine.run(output)
        except SchemaDrift as drift:
            drift.settle()
        finally:
            if output is not None:
                output.discard()  # a no-op once committed
        if output is not None:
            output = open_output(output.claim, config, inputs.shards)
    raise GrpoError(f"{inputs.spec}: the column types could not be settled")


def run_in_memory(inputs: InputSet, config: ComputeConfig) -> pa.Table:
    """Run ``config`` over in-memory ``inputs`` (the table API): the output rows."""
    target = MemoryTarget()
    LocalEngine(inputs, RunPlan(config), writes_output=True).run(target)
    return target.table()


def check_inputs(inputs: InputSet, config: ComputeConfig) -> None:
    """Refuse ``inputs`` as a run of ``config`` would, before reading any row (a LazyFrame's schema)."""
    LocalEngine(inputs, RunPlan(config), writes_output=True)


def refuse_as_local(inputs: InputSet, config: ComputeConfig) -> None:
    """Raise the error this engine's first pass raises on ``inputs``, if any: a null or
    NaN key, a group across two batches, or (with ``--nan error``) a bad reward, each
    naming its file and row.

    The Ray engine finds those in blocks its workers reduce, and the driver, which merges
    the blocks' per-group rows, knows no row; it calls this to word its refusal as this
    engine does (which error comes first included), reading the key and reward columns
    once more. Returns when ``inputs`` hold nothing to refuse.
    """
    engine = LocalEngine(inputs, RunPlan(config), writes_output=False)
    spool = _IdSpool(on_disk=not engine.in_memory)
    try:
        engine._statistics(spool)
    finally:
        spool.close()


PROMPT_COLUMNS = ("prompt", "input", "question", "query", "problem", "input_prompt", "instruction")
"""Columns that hold a rollout's prompt in the trainers' dumps, checked in this order."""
BLOCK_PROBE_ROWS = 1 << 16
"""Rows read to check that ``--group-size`` blocks hold one prompt each."""


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
        chunks = collections.deque(self._chunks)

        def take_from_memory(n: int) -> np.ndarray:
            # pass 2's batches need not line up with pass 1's chunks: take across them
            parts = []
            while n and chunks:
                head = chunks.popleft()
                if head.size > n:
                    chunks.appendleft(head[n:])
                    head = head[:n]
                parts.append(head)
                n -= head.size
            if len(parts) == 1:
                return parts[0]
            return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

        return take_from_memory

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


# --------------------------------------------------------------------------- pass 1


@dataclass
class _Statistics:
    """What pass 1 found."""

    channel_stats: list[GroupStats]
    summary_stats: GroupStats  # the combined reward
    figures: dict[str, np.ndarray]  # per group, each of figures.FIGURES the run wants
    rows: int
    nan_rewards: int
    keys: GroupKeyIndex | None
    cached: list[list[pa.RecordBatch]] | None  # every shard's batches, when in memory
    batches: BatchLayout
    top_two: TopTwo | None
    by: list[ByValues]
    filter_rows: list[tuple[np.ndarray, np.ndarray]] | None
    group_rewards: list[tuple[np.ndarray, torch.Tensor, torch.Tensor | None]] | None  # pass_at_k

    @property
    def rows_per_group(self) -> np.ndarray:
        return self.figures["rows"]


class _StatisticsPass:
    """Pass 1's running state: accumulators, the key index, the ID spool, the first bad reward.

    Batches are held until :meth:`flush`: keys are matched a chunk of batches at a time,
    since each match costs a pass over the keys seen so far (:attr:`chunk_full` says when).
    """

    def __init__(self, plan: RunPlan, spool: _IdSpool, *, exact_keys: bool) -> None:
        config = plan.config
        self.plan = plan
        self.spool = spool
        self.keys = (
            None if config.group_size is not None else GroupKeyIndex(config.group_cols, exact=exact_keys)
        )
        self.accumulators, self.separate_summary = plan.accumulators()
        self.figures = wanted(plan.needs)
        # folded at the statistics blocks' rows: a float sum must not depend on the key chunks
        self.figure_totals = FigureAccumulator(self.figures, block_rows=self.accumulators[0].block_rows)
        self.rows = 0
        self.first_bad: tuple[Shard, int, float] | None = None
        self._pending: list[tuple[pa.RecordBatch, RewardBatch]] = []
        self._pending_lengths: list[torch.Tensor] = []  # opo: --length-col of each pending batch
        self._pending_steps: list[np.ndarray] = []  # the watched step column of each pending batch
        self._pending_rows = 0
        self._pending_start = 0
        self._pending_first_global = 0
        self.batch_keys = (
            GroupKeyIndex([config.batch_col], exact=exact_keys, few_values=True) if config.batch_col else None
        )
        self.batch_of_group = np.zeros(0, dtype=np.int64)
        self.filter_rows: list[tuple[np.ndarray, np.ndarray]] | None = [] if config.trainer_filter else None
        self.by_keys = {
            column: GroupKeyIndex([column], exact=exact_keys, few_values=True) for column in config.by_cols
        }
        self.by_of_group = {column: np.zeros(0, dtype=np.int64) for column in config.by_cols}
        self.top_two = RunningTopTwo()  # grpo_passk
        self.group_rewards: list[tuple[np.ndarray, torch.Tensor, torch.Tensor | None]] | None = (
            [] if "group_rewards" in plan.needs else None
        )  # pass_at_k: every row's group, combined reward and validity, in input order

    @property
    def bad_count(self) -> int:
        """Rows whose reward is null, NaN or infinite (read once pass 1 is done: it folds the last block)."""
        counts = self.figure_totals.compute().get("nan_rewards")
        return 0 if counts is None else int(counts.sum())

    @property
    def pending_rows(self) -> int:
        return self._pending_rows

    @property
    def chunk_full(self) -> bool:
        """Whether the pending rows are worth a key match now (see ``KEY_CHUNK_ROWS``)."""
        known = len(self.keys) if self.keys is not None else 0
        return self._pending_rows >= min(max(known, MIN_KEY_CHUNK_ROWS), KEY_CHUNK_ROWS)

    def add(
        self,
        batch: pa.RecordBatch,
        rewards: RewardBatch,
        shard: Shard,
        shard_row: int,
        lengths: torch.Tensor | None = None,
        steps: np.ndarray | None = None,
    ) -> None:
        if not self._pending:
            self._pending_start = shard_row
            self._pending_first_global = self.rows
        self._note_bad_rewards(rewards, shard, shard_row)
        self._pending.append((batch, rewards))
        if lengths is not None:
            self._pending_lengths.append(lengths)
        if steps is not None:
            self._pending_steps.append(steps)
        self._pending_rows += batch.num_rows
        self.rows += batch.num_rows

    def flush(self, shard: Shard) -> int:
        """Match the pending rows' keys and fold them into the statistics; returns how many."""
        if not self._pending:
            return 0
        flushed = self._pending_rows
        ids: torch.Tensor | None = None
        if self.keys is not None:
            group_cols = self.plan.config.group_cols
            key_columns = [pa.chunked_array([column_of(b, c) for b, _ in self._pending]) for c in group_cols]
            ids_np = self._encode(self.keys, key_columns, shard, what="group")
            self.spool.append(ids_np)
            ids = torch.from_numpy(ids_np)
        with timed("pass 1: statistics"):
            chunk = RewardBatch.concat([r for _, r in self._pending])
            group_ids = self._row_groups(ids)
            self._check_batches(group_ids, shard)
            lengths = torch.cat(self._pending_lengths).numpy() if self._pending_lengths else None
            steps = np.concatenate(self._pending_steps) if self._pending_steps else None
            rows = RowInputs.of(chunk, lengths, steps)
            self.figure_totals.update(group_ids, rows)
            self._top_two(chunk, group_ids)
            if self.group_rewards is not None:
                self.group_rewards.append((group_ids, chunk.combined.to(torch.float64), chunk.combined_valid))
            if self.filter_rows is not None:  # --trainer-filter: each group's rewards, in input order
                self.filter_rows.append(self.plan.filter_rows(chunk, group_ids))
            channels = self.accumulators[: self.plan.channels]
            for acc, values, valid in zip(channels, chunk.channels, chunk.channel_valid, strict=True):
                acc.update(values, ids, valid)
            if self.separate_summary:
                self.accumulators[-1].update(chunk.combined, ids, chunk.combined_valid)
        self._pending.clear()
        self._pending_lengths.clear()
        self._pending_steps.clear()
        self._pending_rows = 0
        return flushed

    def _row_groups(self, ids: torch.Tensor | None) -> np.ndarray:
        """The pending rows' group IDs (with --group-size, from their position)."""
        if ids is not None:
            return ids.numpy()
        group_size = self.plan.config.group_size
        assert group_size is not None
        first = self._pending_first_global
        return np.arange(first, first + self._pending_rows) // group_size

    def _top_two(self, chunk: RewardBatch, group_ids: np.ndarray) -> None:
        """grpo_passk: each group's top two rewards."""
        if "top_two" not in self.plan.needs:
            return
        if not group_ids.size:
            return
        low, high = int(group_ids.min()), int(group_ids.max())  # the chunk's own groups
        first = self._pending_first_global
        positions = torch.arange(first, first + chunk.combined.numel())
        top = scored_top_two(chunk, torch.from_numpy(group_ids - low), positions, high - low + 1)
        self.top_two.merge_rows(top, torch.arange(low, high + 1), high + 1)

    def _check_batches(self, group_ids: np.ndarray, shard: Shard) -> None:
        """Each group's batch and ``--by`` values: one per group, checked (without --batch-col
        every group's batch is 0)."""
        config = self.plan.config
        if self.batch_keys is not None:
            assert config.batch_col is not None
            self.batch_of_group = self._values_of_groups(
                self.batch_keys,
                self.batch_of_group,
                config.batch_col,
                group_ids,
                shard,
                option="--batch-col",
                why=ONE_VALUE_REASONS["--batch-col"],
            )
        for column, keys in self.by_keys.items():
            self.by_of_group[column] = self._values_of_groups(
                keys,
                self.by_of_group[column],
                column,
                group_ids,
                shard,
                option="--by",
                why=ONE_VALUE_REASONS["--by"],
            )

    def _values_of_groups(
        self,
        keys: GroupKeyIndex,
        known_so_far: np.ndarray,
        column: str,
        group_ids: np.ndarray,
        shard: Shard,
        *,
        option: str,
        why: str,
    ) -> np.ndarray:
        """Each group's value of ``column`` (an ID of ``keys``; -1 for a group not seen yet,
        past the groups seen the array may hold more -1s), the pending rows' folded into what
        was known; a group holding two values is refused.

        The chunk's rows are taken a run of one group at a time (a group's rows mostly come
        together) and only over the chunk's own groups, from its lowest ID to its highest:
        the work is the chunk's, not every group's so far."""
        values = pa.chunked_array([column_of(b, column) for b, _ in self._pending])
        value_ids = self._encode(keys, [values], shard, what=option.removeprefix("--").replace("-col", ""))
        if not group_ids.size:
            return known_so_far
        low, high = int(group_ids.min()), int(group_ids.max())
        same_group = group_ids[1:] == group_ids[:-1]
        heads = np.flatnonzero(np.concatenate(([True], ~same_group)))
        head_groups, head_values = group_ids[heads] - low, value_ids[heads]
        k = high - low + 1
        if head_groups.size == k and bool((np.diff(head_groups) > 0).all()):  # each group one run, in order
            value_of, split = head_values, np.zeros(k, dtype=bool)
        else:
            value_of, split = batch_of_groups(head_groups, head_values, k)
        split[group_ids[1:][same_group & (value_ids[1:] != value_ids[:-1])] - low] = True  # within a run
        known = room_for(known_so_far, high + 1, fill=-1)
        window = known[low : high + 1]
        present = value_of >= 0
        clash = split | (present & (window >= 0) & (window != value_of))
        if clash.any():
            group = low + int(np.flatnonzero(clash)[0])
            rows = np.flatnonzero(group_ids == group)
            first = int(known[group]) if known[group] >= 0 else int(value_ids[rows[0]])
            row = int(rows[np.argmax(value_ids[rows] != first)])  # where the second value appears
            group_cols = self.plan.config.group_cols if self.keys is not None else ()
            fix = (
                f": -g {' -g '.join([*group_cols, column])} keys each group within one" if group_cols else ""
            )
            raise GrpoError(
                f"{describe_row(shard, self._pending_start + row)}: a group spans two values of "
                f"{option} {column!r} ({keys.key_at(first)!r}, then {keys.key_at(int(value_ids[row]))!r}); "
                f"{why}{fix}"
            )
        window[present] = value_of[present]
        return known

    def by_values(self, num_groups: int) -> list[ByValues]:
        """Each ``--by`` column's value of every group, and the values."""
        out = []
        for column, keys in self.by_keys.items():
            of_group = np.pad(
                self.by_of_group[column], (0, max(0, num_groups - self.by_of_group[column].size))
            )
            out.append(
                ByValues(
                    column, of_group[:num_groups].clip(min=0), [keys.key_at(v) for v in range(len(keys))]
                )
            )
        return out

    def batch_layout(self, totals: dict[str, np.ndarray], num_groups: int) -> BatchLayout:
        of_group = np.pad(self.batch_of_group, (0, max(0, num_groups - self.batch_of_group.size)))
        of_group = of_group[:num_groups].clip(min=0)
        keys = [self.batch_keys.key_at(b) for b in range(len(self.batch_keys))] if self.batch_keys else [None]
        return BatchLayout.of_groups(of_group, totals, keys)

    def _note_bad_rewards(self, rewards: RewardBatch, shard: Shard, shard_row: int) -> None:
        """The first row whose reward is null, NaN or infinite (the figures count them all)."""
        if self.first_bad is not None or rewards.combined_valid is None:
            return
        index = int((~rewards.combined_valid).nonzero()[0])
        as_read = rewards.combined if rewards.unshaped is None else rewards.unshaped  # not clipped
        self.first_bad = (shard, shard_row + index, float(as_read[index]))

    def _encode(
        self, keys: GroupKeyIndex, arrays: list[pa.ChunkedArray], shard: Shard, *, what: str
    ) -> np.ndarray:
        try:
            with timed("key index"):
                return keys.encode(arrays)
        except InvalidKeyError as bad:
            raise GrpoError(
                f"{describe_row(shard, self._pending_start + bad.row)}: {what} key {bad.column!r} "
                f"{bad.description} ({bad.count} {bad.what} key(s) in this chunk); "
                f"{bad.what} keys cannot be grouped"
            ) from None
        except (TypeError, pa.ArrowException) as exc:
            raise GrpoError(
                f"{shard.display}: cannot use {', '.join(keys.columns)} as {what} keys ({exc})"
            ) from None

    def result(self, spec: str, cached: list[list[pa.RecordBatch]] | None) -> _Statistics:
        group_size = self.plan.config.group_size
        if group_size is not None:
            if self.rows % group_size:
                raise GrpoError(f"--group-size {group_size} does not divide the {self.rows} rows of {spec}")
            num_groups = self.rows // group_size
        else:
            assert self.keys is not None
            num_groups = len(self.keys)
        totals = padded(self.figures, self.figure_totals.compute(), num_groups)
        stats = [acc.compute(num_groups) for acc in self.accumulators]
        channel_stats = stats[: self.plan.channels]
        summary_stats = stats[-1] if self.separate_summary else stats[0]
        return _Statistics(
            channel_stats,
            summary_stats,
            totals,
            self.rows,
            self.bad_count,
            self.keys,
            cached,
            self.batch_layout(totals, num_groups),
            self.top_two.result(num_groups),
            self.by_values(num_groups),
            self.filter_rows,
            self.group_rewards,
        )


# --------------------------------------------------------------------------- pass 2


class _Pass2Figures:
    """Figures gathered while advantages are written: their range, and the verification."""

    def __init__(self, verifier: Verifier | None) -> None:
        self.minimum = float("inf")
        self.maximum = float("-inf")
        self.verifier = verifier

    def observe(
        self,
        batch: pa.RecordBatch,
        advantages: torch.Tensor,
        rewards: torch.Tensor,
        ids: torch.Tensor,
        shard: Shard,
        shard_row: int,
        written: torch.Tensor | None = None,
    ) -> None:
        """One batch's advantages: their range over the rows ``written`` (bool, the rows
        the filters keep; every row where ``None``), all of them verified."""
        kept = advantages if written is None else advantages[written]
        if kept.numel():
            low, high = torch.aminmax(kept)  # in the advantages' dtype: float() of either is exact
            self.minimum = min(self.minimum, float(low))
            self.maximum = max(self.maximum, float(high))
        if self.verifier is not None:
            column = column_of(batch, self.verifier.spec.column)
            self.verifier.compare(column, advantages, rewards, ids, shard, shard_row)

    def advantage_range(self) -> tuple[float, float] | None:
        if self.minimum > self.maximum:
            return None
        return self.minimum, self.maximum

    def verify_result(self) -> dict[str, Any] | None:
        return None if self.verifier is None else self.verifier.result()


# --------------------------------------------------------------------------- the engine


class LocalEngine:
    """One run of ``compute`` or ``check`` over an :class:`InputSet`, on this machine."""

    def __init__(
        self, inputs: InputSet, plan: RunPlan, *, writes_output: bool = True, progress: Progress | None = None
    ) -> None:
        self.inputs = inputs
        self.plan = plan
        self.config = plan.config
        self.progress: Progress = progress or NoProgress()
        budget = self.config.memory_budget_bytes
        hold_text_within(inputs.shards, budget)  # before the first scan reads a text shard
        self.schemas = [read_schema(shard) for shard in inputs.shards]
        watching = with_watched_step(plan.config, self.schemas)
        if watching is not plan.config:
            plan = self.plan = RunPlan(watching, device=plan.device)
            self.config = watching
        for shard, schema in zip(inputs.shards, self.schemas, strict=True):
            plan.check_columns(shard, schema, writes_output=writes_output)
        if self.config.group_size is None:
            check_key_types(
                [(shard.display, schema) for shard, schema in zip(inputs.shards, self.schemas, strict=True)],
                self.config.group_cols,
            )
        self.in_memory = sum(estimated_memory_bytes(s) for s in inputs.shards) <= budget
        self.one_pass_dtype = self._one_pass_dtype(writes_output)
        self.splice_refusal = splice_refusal(self.config, inputs.shards) if writes_output else "no output"
        self.bytes_read = 0

    @property
    def keeps_every_column(self) -> bool:
        """Whether pass 1, when it keeps the batches, keeps every column (no shard is spliced)."""
        return self.splice_refusal is not None

    def run(self, output: OutputTarget | MemoryTarget | None) -> RunSummary:
        """Both passes; the output is committed only when everything succeeded."""
        started = time.perf_counter()
        if isinstance(output, OutputTarget):
            for shard, schema in zip(self.inputs.shards, self.schemas, strict=True):
                output.refuse_unwritable(shard, schema)
        spool = _IdSpool(on_disk=not self.in_memory)
        findings: _Beside[GroupFindings] | None = None
        try:
            first = self._statistics(spool)
            if first.rows == 0 and output is not None:
                raise GrpoError(f"{self.inputs.spec}: no rows; there is nothing to compute advantages for")
            with timed("outcome"):
                outcome = self.plan.outcome(
                    first.channel_stats,
                    first.summary_stats,
                    rows_per_group=first.rows_per_group,
                    rows=first.rows,
                    nan_rewards=first.nan_rewards,
                    batches=first.batches,
                    top_two=first.top_two,
                    length_sums=first.figures.get("length_sums"),
                    weighted_reward_sums=first.figures.get("weighted_reward_sums"),
                    step_spans=step_spans(first.figures),
                )
            if first.group_rewards is not None:  # pass_at_k
                outcome = self.plan.with_group_rewards(outcome, first.group_rewards)
            if self.one_pass_dtype is not None:
                advantage_range = self.plan.advantage_range_from_stats(outcome, self.one_pass_dtype)
                verify_result = None
            else:
                if self.plan.needs_moments_pass:
                    outcome = replace(
                        outcome, transform=self.plan.transform(self._moments(first, outcome, spool))
                    )
                # pass 2 waits on the writer about half its time: the summary's figures of the
                # groups are computed meanwhile
                findings = _Beside(self._findings, first, outcome)
                figures = self._advantages(first, outcome, spool.reader(), output)
                advantage_range, verify_result = figures.advantage_range(), figures.verify_result()
            with timed("commit"):
                output_info = output.commit() if output is not None else None
        finally:
            spool.close()
            if output is not None:
                output.discard()
            if findings is not None:  # a failed run too: see _Beside
                findings.join()
        with timed("summary"):
            return self._summary(
                first,
                outcome,
                output_info,
                advantage_range,
                verify_result,
                started,
                findings.result() if findings is not None else self._findings(first, outcome),
            )

    def _findings(self, first: _Statistics, outcome: GroupOutcome) -> GroupFindings:
        with timed("group findings"):
            return group_findings(
                outcome,
                options=self.config.findings_options(),
                key_at=first.keys.key_at if first.keys is not None else None,
                by=first.by,
            )

    def _summary(
        self,
        first: _Statistics,
        outcome: GroupOutcome,
        output_info: dict[str, Any] | None,
        advantage_range: tuple[float, float] | None,
        verify_result: dict[str, Any] | None,
        started: float,
        findings: GroupFindings,
    ) -> RunSummary:
        inputs = self.inputs
        return build_summary(
            outcome,
            input=input_info(
                inputs.spec,
                inputs.shards,
                stdin=inputs.is_stdin,
                bytes_decoded=self.bytes_read,
                about=inputs.about,
            ),
            output=output_info,
            options=self.config.options_summary(),
            advantage_range=advantage_range,
            mode="in-memory" if self.in_memory else "streaming",
            device=str(self.plan.device),
            elapsed=time.perf_counter() - started,
            verify=verify_result,
            key_at=first.keys.key_at if first.keys is not None else None,
            warnings=self._block_warnings(),
            by=first.by,
            trainer_filter=self._trainer_filter(first, outcome),
            findings=findings,
        )

    def _trainer_filter(self, first: _Statistics, outcome: GroupOutcome) -> dict[str, Any] | None:
        """``--trainer-filter``: the trainer's rule on each group against the exact decision."""
        if self.config.trainer_filter is None or first.filter_rows is None:
            return None
        ids = (
            np.concatenate([ids for ids, _ in first.filter_rows])
            if first.filter_rows
            else np.zeros(0, np.int64)
        )
        values = np.concatenate([v for _, v in first.filter_rows]) if first.filter_rows else np.zeros(0)
        return self.plan.trainer_filter_report(
            ids,
            values,
            outcome.active,
            by=first.by,
            batches=first.batches,
            key_at=first.keys.key_at if first.keys is not None else None,
        )

    def _block_warnings(self) -> list[str]:
        """With ``--group-size``: do the first blocks each hold one prompt (where a prompt-like
        column says)? A trainer that reorders its batch before it dumps (verl balances it)
        leaves a prompt's rows apart, and consecutive blocks then mix prompts."""
        size = self.config.group_size
        if size is None or size < 2 or not self.inputs.shards or not len(self.schemas[0]):
            return []
        shard, schema = self.inputs.shards[0], self.schemas[0]
        column = next(
            (c for c in PROMPT_COLUMNS if c in schema.names and is_key_type(schema.field(c).type)), None
        )
        if column is None:
            return []
        parts, rows = [], 0
        for batch in self._batches(shard, schema, [column]):
            parts.append(batch.column(0))
            rows += batch.num_rows
            if rows >= BLOCK_PROBE_ROWS:
                break
        blocks = min(rows, BLOCK_PROBE_ROWS) // size
        if blocks == 0:
            return []
        values = pa.chunked_array(parts).slice(0, blocks * size)
        try:
            ids = GroupKeyIndex([column], exact=True).encode([values]).reshape(blocks, size)
        except (GrpoError, InvalidKeyError):
            return []  # a null or NaN prompt: not the place to refuse it
        mixed = int((ids != ids[:, :1]).any(axis=1).sum())
        if not mixed:
            return []
        return [
            f"{mixed:,} of the first {blocks:,} --group-size {size} blocks hold more than one {column!r}: "
            f"the rows of a group are not consecutive (verl dumps after balancing its batch); group by "
            f"the prompt instead (-g {column}, with -g step if the file holds several steps)"
        ]

    # ----------------------------------------------------------------- pass 1

    def _statistics(self, spool: _IdSpool) -> _Statistics:
        total_rows = self._total_rows()
        small = total_rows is not None and total_rows <= SMALL_INPUT_ROWS
        state = _StatisticsPass(self.plan, spool, exact_keys=small)
        length_col = self.config.length_col if "length_sums" in self.plan.needs else None  # opo sums them
        step_col = self.config.step_col
        keep_batches = self.in_memory and self.one_pass_dtype is None
        cached: list[list[pa.RecordBatch]] | None = [] if keep_batches else None
        columns = None if keep_batches and self.keeps_every_column else self.plan.input_columns
        self.progress.start("statistics" if self.one_pass_dtype else "pass 1/2: statistics", total_rows)
        for shard, schema in zip(self.inputs.shards, self.schemas, strict=True):
            shard_batches: list[pa.RecordBatch] = []
            if len(schema) == 0:
                if cached is not None:
                    cached.append(shard_batches)
                continue
            reader = self._reward_reader(schema, shard)
            shard_row = 0
            for batch in self._batches(shard, schema, columns):
                if cached is not None:
                    shard_batches.append(batch)
                lengths = reader.lengths(batch, length_col, shard_row) if length_col is not None else None
                steps = None if step_col is None else reader.column(batch, step_col, shard_row).numpy()
                with timed("rewards"):
                    rewards = reader.read(batch, shard_row)
                state.add(batch, rewards, shard, shard_row, lengths, steps)
                shard_row += batch.num_rows
                self.bytes_read += batch.nbytes
                interrupts.raise_if_requested()
                if state.chunk_full:
                    self.progress.advance(state.flush(shard))
            self.progress.advance(state.flush(shard))
            if cached is not None:
                cached.append(shard_batches)
        self.progress.finish()
        if state.bad_count and self.config.advantage.nan == "error":
            assert state.first_bad is not None
            shard, row, value = state.first_bad
            what = "null" if value != value and self._is_null_at(shard, row) else str(value)
            raise GrpoError(
                f"{describe_row(shard, row)}: reward is {what}; {state.bad_count} reward(s) in all are null, "
                f"NaN or infinite (--nan ignore leaves them out)"
            )
        return state.result(self.inputs.spec, cached)

    def _one_pass_dtype(self, writes_output: bool) -> torch.dtype | None:
        """``check`` without verification needs no second pass when the advantages' range
        follows from the group statistics (see :meth:`RunPlan.advantage_range_from_stats`):
        the dtype of the advantages then, else ``None``."""
        if writes_output or self.config.verify is not None or not self.plan.range_follows_from_stats:
            return None
        dtypes = {self.plan.output_dtype(schema) for schema in self.schemas if len(schema)}
        return dtypes.pop() if len(dtypes) == 1 else None

    def _reward_reader(self, schema: pa.Schema, shard: Shard) -> RewardReader:
        return self.plan.reward_reader(schema, shard)

    def _batches(
        self, shard: Shard, schema: pa.Schema, columns: list[str] | None
    ) -> Iterator[pa.RecordBatch]:
        """Batches sized to about ``BATCH_BYTES`` unless ``batch_rows`` is set; ``columns``
        may name nested fields, which are read with their top-level struct."""
        batch_rows = self.config.batch_rows or _batch_rows_for(shard)
        if columns is not None:
            columns = top_level(schema, columns)
        if self.in_memory and shard.format == "parquet" and columns is None:
            # Read whole: pyarrow decodes row groups and columns in parallel.
            with timed("read"):
                table = read_table(shard)
            yield from table.to_batches(max_chunksize=batch_rows)
            return
        # The next batch is decoded while this one's keys and rewards are processed.
        yield from read_ahead(iter_batches(shard, columns, batch_rows))

    def _total_rows(self) -> int | None:
        counts = [row_count(s) for s in self.inputs.shards]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def _is_null_at(self, shard: Shard, row: int) -> bool:
        schema = self.schemas[self.inputs.shards.index(shard)]
        for spec in self.config.rewards:
            value = _read_row(shard, schema, spec.column, row, self.config.batch_rows or MAX_BATCH_ROWS)
            if value is not None and not value.is_valid:
                return True
        return False

    # ----------------------------------------------------------------- pass 2

    def _advantages(
        self,
        first: _Statistics,
        outcome: GroupOutcome,
        take_ids: Callable[[int], np.ndarray],
        output: OutputTarget | MemoryTarget | None,
    ) -> _Pass2Figures:
        config, plan = self.config, self.plan
        verifier = None
        if config.verify is not None:
            verifier = Verifier(
                config.verify,
                outcome.stats,
                config.advantage,
                first.keys,
                batch_transform=self.plan.needs_moments_pass,
            )
        figures = _Pass2Figures(verifier)
        provenance = plan.provenance([shard.display for shard in self.inputs.shards], outcome.totals)
        active_device = outcome.active.to(plan.device)
        self.progress.start("pass 2/2: advantages" if output else "pass 2/2: verify", first.rows)
        global_row = 0
        for index, (shard, schema) in enumerate(zip(self.inputs.shards, self.schemas, strict=True)):
            out_schema = plan.output_schema(schema, provenance)
            spliced: SplicedShardWriter | None = None
            writer: ShardWriter | JsonlShardWriter | MemoryTarget | None = None
            if output is not None:
                spliced = output.open_spliced(shard, out_schema, len(plan.new_columns))
                if spliced is None:
                    writer = output.open_shard(shard, out_schema, len(plan.new_columns))
            if writer is not None:
                reader, batches = self._shard_batches(first, index, None, all_columns=True)
            else:
                verified = [config.verify.column] if config.verify is not None else []
                reader, batches = self._shard_batches(first, index, [*plan.input_columns, *verified])
            shard_row = 0
            for batch in batches:
                n = batch.num_rows
                ids = self._group_ids(global_row, n, take_ids)
                assert reader is not None
                with timed("pass 2: advantages"):
                    rewards, result, batch_ids = self._row_advantages(
                        batch, reader, ids, outcome, active_device, shard_row, global_row
                    )
                    result = plan.finish(result, batch_ids, outcome, scored=rewards.combined_valid)
                with timed("cast"):
                    result = result.to(plan.output_dtype(batch.schema))
                written = None if outcome.kept is None else outcome.kept[ids]
                figures.observe(batch, result, rewards.combined, ids, shard, shard_row, written)
                if writer is not None or spliced is not None:
                    with timed("cast"):
                        arrays = new_column_arrays(
                            result, outcome.active[ids], ids.numpy(), outcome.group_columns
                        )
                    if spliced is not None:
                        spliced.write_new(arrays)
                    elif writer is not None:
                        out_batch = pa.RecordBatch.from_arrays([*batch.columns, *arrays], schema=out_schema)
                        if written is not None:
                            out_batch = filter_rows(out_batch, arrow_of(written.numpy()))
                        writer.write(out_batch)
                if first.cached is None:
                    self.bytes_read += batch.nbytes
                shard_row += n
                global_row += n
                self.progress.advance(n)
                interrupts.raise_if_requested()
            for done in (writer, spliced):
                if done is not None:
                    done.close()
        self.progress.finish()
        return figures

    def _shard_batches(
        self, first: _Statistics, index: int, columns: list[str] | None, *, all_columns: bool = False
    ) -> tuple[RewardReader | None, Iterator[pa.RecordBatch]]:
        """Shard ``index``'s reward reader and batches again: kept from pass 1, or read anew.

        ``all_columns``: every column is needed (a re-encoded output), whatever pass 1 kept.
        An empty JSONL file (no columns) has no reader and no batches.
        """
        shard, schema = self.inputs.shards[index], self.schemas[index]
        if not len(schema):
            return None, iter(())
        reader = self._reward_reader(schema, shard)
        if first.cached is not None and (self.keeps_every_column or not all_columns):
            return reader, iter(first.cached[index])
        return reader, self._batches(shard, schema, None if all_columns else columns)

    def _group_ids(self, global_row: int, n: int, take_ids: Callable[[int], np.ndarray]) -> torch.Tensor:
        group_size = self.config.group_size
        if group_size is not None:
            return torch.arange(global_row, global_row + n) // group_size
        return as_tensor(take_ids(n))

    def _row_advantages(
        self,
        batch: pa.RecordBatch,
        reader: RewardReader,
        ids: torch.Tensor,
        outcome: GroupOutcome,
        active_device: torch.Tensor,
        shard_row: int,
        global_row: int,
    ) -> tuple[RewardBatch, torch.Tensor, torch.Tensor | None]:
        """One batch's rewards, advantages before any batch transform (CPU), and batch IDs where
        they are read (``global_row``: the batch's first row in the whole input)."""
        rewards, result, batch_ids = self.plan.row_advantages(
            batch,
            reader,
            ids,
            outcome,
            active_device=active_device,
            first_row=shard_row,
            global_row=global_row,
        )
        return rewards, result, batch_ids

    def _moments(self, first: _Statistics, outcome: GroupOutcome, spool: _IdSpool) -> WeightedMoments:
        """The extra pass of a batch transform: weighted moments of the advantages per batch."""
        config, plan = self.config, self.plan
        assert outcome.batches is not None
        take_ids = spool.reader()
        active_device = outcome.active.to(plan.device)
        total = WeightedMomentsAccumulator(
            num_batches=outcome.batches.count, block_rows=config.stats_block_rows
        )
        columns = None if first.cached is not None else plan.input_columns
        self.progress.start("pass 2/3: batch moments", first.rows)
        global_row = 0
        for index in range(len(self.inputs.shards)):
            reader, batches = self._shard_batches(first, index, columns)
            shard_row = 0
            for batch in batches:
                n = batch.num_rows
                ids = self._group_ids(global_row, n, take_ids)
                assert reader is not None
                rewards, result, batch_ids = self._row_advantages(
                    batch, reader, ids, outcome, active_device, shard_row, global_row
                )
                lengths = (
                    None if config.length_col is None else reader.lengths(batch, config.length_col, shard_row)
                )
                assert batch_ids is not None  # a moments pass reads each row's batch
                total.update(result, lengths, batch_ids, valid=rewards.combined_valid)
                shard_row += n
                global_row += n
                self.progress.advance(n)
        self.progress.finish()
        return total.compute()


T = TypeVar("T")


class _Beside(Generic[T]):
    """``function(*args)`` run on a thread of its own while the caller goes on. :meth:`result`
    waits for it and returns its value, or raises its error. A run that fails first must still
    :meth:`join` it: a thread inside torch when the process exits aborts the process (C++'s
    "terminate called without an active exception", after the error's line)."""

    def __init__(self, function: Callable[..., T], *args: Any) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = function(*args)
            except BaseException as exc:  # re-raised by result(), on the caller's thread
                self._error = exc

        self._thread = threading.Thread(target=run, name="grpo-cli-beside", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait for the function to end (its value or error kept for :meth:`result`)."""
        self._thread.join()

    def result(self) -> T:
        self.join()
        if self._error is not None:
            raise self._error
        return cast(T, self._value)


def _batch_rows_for(shard: Shard) -> int:
    decoded = estimated_memory_bytes(shard)
    rows = row_count(shard)
    if not rows:
        return MAX_BATCH_ROWS
    return int(min(MAX_BATCH_ROWS, max(1024, BATCH_BYTES * rows // max(decoded, 1))))


def _read_row(shard: Shard, schema: pa.Schema, column: str, row: int, batch_rows: int) -> pa.Scalar | None:
    seen = 0
    for batch in iter_batches(shard, top_level(schema, [column]), batch_rows):
        if seen + batch.num_rows > row:
            return column_of(batch, column)[row - seen]
        seen += batch.num_rows
    return None
