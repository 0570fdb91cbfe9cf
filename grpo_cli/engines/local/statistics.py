"""Pass 1: the reward and key columns read in batches, keys matched to dense group IDs (in
chunks, on a second thread), the kernel's accumulators and the figures fed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from grpo_cli.arrow.columns import column_of
from grpo_cli.arrow.keys import (
    EncodedKeys,
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
from grpo_cli.run.figures import (
    FigureAccumulator,
    GroupRows,
    OneValueFigure,
    RowInputs,
    counted_rewards,
    padded,
    room_for,
    second_value,
    wanted,
)
from grpo_cli.run.outcome import BatchLayout
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.reward_counts import RewardCounts
from grpo_cli.run.rewards import RewardBatch
from grpo_cli.run.steps import one_value_figures
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
    group_rows: GroupRows | None  # every row of the groups, where the plan keeps them
    reward_counts: RewardCounts

    @property
    def rows_per_group(self) -> np.ndarray:
        return self.figures["rows"]


class _StatisticsPass:
    """Pass 1's running state: accumulators, the key index, the ID spool, the first bad reward.

    Batches are held until :meth:`flush`: keys are matched a chunk of batches at a time,
    since each match costs a pass over the keys seen so far (:attr:`chunk_full` says when).
    """

    def __init__(
        self, plan: RunPlan, spool: _IdSpool, *, exact_keys: bool, expected_rows: int | None = None
    ) -> None:
        config = plan.config
        self.plan = plan
        self.spool = spool
        self.keys = (
            None if config.group_size is not None else GroupKeyIndex(config.group_cols, exact=exact_keys)
        )
        self.accumulators, self.separate_summary = plan.accumulators(expected_rows=expected_rows)
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
        self.filter_rows: list[tuple[np.ndarray, np.ndarray]] | None = [] if config.trainer_filter else None
        # --batch-col and each --by column: its values' key index, each group's value ID so far
        self.one_value = one_value_figures(config)
        self.value_keys = [
            GroupKeyIndex([f.column], exact=exact_keys, few_values=True) for f in self.one_value
        ]
        self.value_of_group = [np.zeros(0, dtype=np.int64) for _ in self.one_value]
        self.reward_counts = RewardCounts.empty()
        self.group_rows: list[GroupRows] | None = [] if plan.keeps_group_rows else None  # in input order

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
            encoded = self._encode(self.keys, key_columns, shard, what="group")
            ids_np = encoded.ids
            self.spool.append(ids_np, encoded.runs)
            ids = torch.from_numpy(ids_np)
        with timed("pass 1: statistics"):
            chunk = RewardBatch.concat([r for _, r in self._pending])
            group_ids = self._row_groups(ids)
            self._check_values(group_ids, shard)
            lengths = torch.cat(self._pending_lengths).numpy() if self._pending_lengths else None
            steps = np.concatenate(self._pending_steps) if self._pending_steps else None
            runs = [(self._pending_first_global, self._pending_rows)]
            rows = RowInputs.of(chunk, lengths, steps, runs=runs)
            self.figure_totals.update(group_ids, rows)
            self.reward_counts = self.reward_counts.merged(counted_rewards(chunk))
            if self.group_rows is not None:
                self.group_rows.append(GroupRows.of_chunk(group_ids, chunk))
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

    def _check_values(self, group_ids: np.ndarray, shard: Shard) -> None:
        """Each group's batch and ``--by`` values: one per group, checked."""
        for i, figure in enumerate(self.one_value):
            self.value_of_group[i] = self._values_of_groups(i, figure, group_ids, shard)

    def _values_of_groups(
        self, i: int, figure: OneValueFigure, group_ids: np.ndarray, shard: Shard
    ) -> np.ndarray:
        """Each group's value of ``figure``'s column (an ID of its key index; -1 for a group not
        seen yet, past the groups seen the array may hold more -1s), the pending rows' merged
        into what was known by the figure's rule; a group holding two values is refused. The
        work is over the chunk's own groups, from its lowest ID to its highest, not every
        group's so far."""
        keys = self.value_keys[i]
        values = pa.chunked_array([column_of(b, figure.column) for b, _ in self._pending])
        value_ids = self._encode(keys, [values], shard, what=figure.role).ids
        if not group_ids.size:
            return self.value_of_group[i]
        low, high = int(group_ids.min()), int(group_ids.max())
        value_of, split = figure.of_chunk(group_ids, value_ids, high - low + 1, low=low)
        known = room_for(self.value_of_group[i], high + 1, fill=-1)
        window = known[low : high + 1]
        merged, clash = figure.merged(window, value_of, split)
        if clash.any():
            group = low + int(np.flatnonzero(clash)[0])
            held = int(known[group])
            first, row = second_value(group_ids, value_ids, group, held if held >= 0 else None)
            group_cols = self.plan.config.group_cols if self.keys is not None else ()
            fix = (
                f": -g {' -g '.join([*group_cols, figure.column])} keys each group within one"
                if group_cols
                else ""
            )
            seen = (keys.key_at(first), keys.key_at(int(value_ids[row])))
            where = describe_row(shard, self._pending_start + row)
            raise GrpoError(f"{where}: a group spans {figure.spans(seen, fix=fix)}")
        window[...] = merged
        return known

    def _of_groups(self, i: int, num_groups: int) -> np.ndarray:
        """Each of ``num_groups`` groups' value ID of one-value figure ``i`` (0 for a group with none)."""
        known = self.value_of_group[i]
        return np.pad(known, (0, max(0, num_groups - known.size)))[:num_groups].clip(min=0)

    def by_values(self, num_groups: int) -> list[ByValues]:
        """Each ``--by`` column's value of every group, and the values."""
        return [
            ByValues(
                figure.column,
                self._of_groups(i, num_groups),
                [self.value_keys[i].key_at(v) for v in range(len(self.value_keys[i]))],
            )
            for i, figure in enumerate(self.one_value)
            if figure.option == "by"
        ]

    def batch_layout(self, totals: dict[str, np.ndarray], num_groups: int) -> BatchLayout:
        """Each group's training batch (one batch without ``--batch-col``)."""
        for i, figure in enumerate(self.one_value):
            if figure.option == "batch_col":
                keys = self.value_keys[i]
                of_group = self._of_groups(i, num_groups)
                return BatchLayout.of_groups(of_group, totals, [keys.key_at(b) for b in range(len(keys))])
        return BatchLayout.of_groups(np.zeros(num_groups, dtype=np.int64), totals, [None])

    def _note_bad_rewards(self, rewards: RewardBatch, shard: Shard, shard_row: int) -> None:
        """The first row whose reward is null, NaN or infinite (the figures count them all)."""
        if self.first_bad is not None or rewards.combined_valid is None:
            return
        index = int((~rewards.combined_valid).nonzero()[0])
        as_read = rewards.combined if rewards.unshaped is None else rewards.unshaped  # not clipped
        self.first_bad = (shard, shard_row + index, float(as_read[index]))

    def _encode(
        self, keys: GroupKeyIndex, arrays: list[pa.ChunkedArray], shard: Shard, *, what: str
    ) -> EncodedKeys:
        try:
            with timed("key index"):
                return keys.encode_runs(arrays)
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
            None if self.group_rows is None else GroupRows.concat(self.group_rows),
            self.reward_counts,
        )
