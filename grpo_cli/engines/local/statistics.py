"""Pass 1: the reward and key columns read in batches, keys matched to dense group IDs (in
chunks, on a second thread), the kernel's accumulators and the figures fed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from grpo_cli.arrow.columns import column_of
from grpo_cli.arrow.keys import (
    GroupKeyIndex,
    InvalidKeyError,
)
from grpo_cli.engines.local.spool import _IdSpool
from grpo_cli.errors import GrpoError, mention
from grpo_cli.inputs.readers import (
    describe_row,
)
from grpo_cli.inputs.sources import Shard
from grpo_cli.kernel import GroupStats
from grpo_cli.results.summary import ByValues
from grpo_cli.run.figures import FigureAccumulator, RowInputs, padded, room_for, wanted
from grpo_cli.run.outcome import BatchLayout, batch_of_groups
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.rewards import RewardBatch
from grpo_cli.run.steps import KEY_ROLES, ONE_VALUE_REASONS
from grpo_cli.stages import timed

# Keys are matched a chunk at a time; a match costs a pass over the keys seen so far, so a
# chunk at least as large as that count keeps the total cost linear, and small chunks while
# few keys are known keep the progress bar moving with the rows actually done.
KEY_CHUNK_ROWS = 1 << 21


MIN_KEY_CHUNK_ROWS = 1 << 18


@dataclass
class _Statistics:
    """What pass 1 found."""

    channel_stats: list[GroupStats]
    summary_stats: GroupStats  # the combined reward
    figures: dict[str, np.ndarray]  # per group, each column of the figures.FIGURES the run wants
    rows: int
    nan_rewards: int
    keys: GroupKeyIndex | None
    cached: list[list[pa.RecordBatch]] | None  # every shard's batches, when in memory
    batches: BatchLayout
    by: list[ByValues]
    filter_rows: list[tuple[np.ndarray, np.ndarray]] | None
    group_rewards: list[tuple[np.ndarray, torch.Tensor, torch.Tensor | None]] | None  # the need group_rewards

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
        self._pending_lengths: list[torch.Tensor] = []  # --length-col of each pending batch, where summed
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
        self.group_rewards: list[tuple[np.ndarray, torch.Tensor, torch.Tensor | None]] | None = (
            [] if "group_rewards" in plan.needs else None
        )  # every row's group, combined reward and validity, in input order

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
            runs = [(self._pending_first_global, self._pending_rows)]
            rows = RowInputs.of(chunk, lengths, steps, runs=runs)
            self.figure_totals.update(group_ids, rows)
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
                option="batch_col",
                why=ONE_VALUE_REASONS["batch_col"],
            )
        for column, keys in self.by_keys.items():
            self.by_of_group[column] = self._values_of_groups(
                keys,
                self.by_of_group[column],
                column,
                group_ids,
                shard,
                option="by",
                why=ONE_VALUE_REASONS["by"],
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
        value_ids = self._encode(keys, [values], shard, what=KEY_ROLES[option])
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
                f"{mention(option)} {column!r} ({keys.key_at(first)!r}, then "
                f"{keys.key_at(int(value_ids[row]))!r}); "
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
                raise GrpoError(
                    f"{mention('group_size')} {group_size} does not divide the {self.rows} rows of {spec}"
                )
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
            self.by_values(num_groups),
            self.filter_rows,
            self.group_rewards,
        )
