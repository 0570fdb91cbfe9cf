"""Blocks merged in input order, as the local engine merges them: each group's figures from its
own partial rows, the keys kept by the reducers that hold them."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from grpo_cli.arrow.keys import GroupKeyIndex
from grpo_cli.engines.ray.blocks import _stats_from_table
from grpo_cli.engines.ray.fields import (
    _SUMMARY_PREFIX,
    BLOCK_FIELD,
    FIGURE_PREFIX,
    FIRST_SEEN_FIELDS,
    GROUP_FIELD,
    VALUE_CLASH_FIELD,
    VALUE_FIELD,
    VALUE_PREFIX,
    BatchStds,
    RowsUnknown,
    _channel_prefix,
    _numpy,
)
from grpo_cli.engines.ray.session import import_ray
from grpo_cli.kernel import (
    GroupStats,
    RunningGroupStats,
    empty_group_stats,
)
from grpo_cli.results.summary import (
    ByValues,
)
from grpo_cli.run.figures import padded, room_for, wanted
from grpo_cli.run.outcome import BatchLayout, GroupOutcome
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.steps import one_value_figures


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

    channel_stats: list[GroupStats]
    summary_stats: GroupStats
    figures: dict[str, np.ndarray]  # per group, each column of the figures.FIGURES the run wants
    batches: BatchLayout
    by: list[ByValues]  # each --by column's value of every group

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
        self.one_value = one_value_figures(plan.config)
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
            held, part = {}, {}
            for column, (_, identity) in figure.columns.items():
                part[column] = partial.column(FIGURE_PREFIX + column).to_numpy()
                self.totals[column] = room_for(
                    self.totals.get(column), k, fill=identity, dtype=part[column].dtype
                )
                held[column] = self.totals[column][ids_np]
            # a group new here holds the identity: merged with its block's figure, as placing it
            # among all the groups gave
            for column, values in figure.merged(held, part).items():
                self.totals[column][ids_np] = values
        for i in range(len(self.one_value)):
            self._add_values(i, partial, ids_np, k)
        return ids_np

    def _add_values(self, i: int, partial: pa.Table, ids_np: np.ndarray, k: int) -> None:
        """Each group's value of one-value column ``i`` (IDs in order of first appearance, which
        is its values' order of first appearance in the rows); a group across two is refused."""
        figure = self.one_value[i]
        value_ids = self.value_keys[i].encode([partial.column(VALUE_FIELD.format(i))])
        split = partial.column(VALUE_CLASH_FIELD.format(i)).to_numpy(zero_copy_only=False).astype(bool)
        known = room_for(self.value_of_group[i], k, fill=-1)
        merged, clash = figure.merged(known[ids_np], value_ids, split)
        if clash.any():
            key = partial.select(list(self.plan.config.group_cols)).slice(int(np.flatnonzero(clash)[0]), 1)
            raise RowsUnknown(f"group {key.to_pylist()[0]} spans {figure.spans()}")
        known[ids_np] = merged
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
                figure.column,
                self._of_groups(i, k),
                [self.value_keys[i].key_at(v) for v in range(len(self.value_keys[i]))],
            )
            for i, figure in enumerate(self.one_value)
        ]
        return _merged(self.plan, channels, summary, totals, values)

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
        for i in range(len(self.one_value)):
            values = self.value_keys[i].key_table(_empty_values(i)).column(0)
            columns[VALUE_FIELD.format(i)] = values.take(pa.array(self._of_groups(i, k)))
        seen = np.concatenate(self.first_seen) if self.first_seen else np.zeros((0, 2), np.int64)
        for at, name in enumerate(FIRST_SEEN_FIELDS):
            columns[name] = seen[:, at]
        return pa.table(columns)


def _or_empty(running: RunningGroupStats, groups: int, count_extremes: bool) -> GroupStats:
    stats = running.stats()
    return stats if stats is not None else empty_group_stats(groups, count_extremes=count_extremes)


def _empty_values(i: int) -> pa.Table:
    return pa.table({VALUE_FIELD.format(i): pa.array([], pa.null())})


def _merged(
    plan: RunPlan,
    channels: list[GroupStats],
    summary: GroupStats,
    totals: dict[str, np.ndarray],
    values: list[tuple[str, np.ndarray, list[Any]]],
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
    return MergedStatistics(channels, summary, totals, batches, by)


def _empty_keys(plan: RunPlan) -> pa.Table:
    return pa.table({c: pa.array([], pa.string()) for c in plan.config.group_cols})


@dataclass(frozen=True)
class _KeyTable:
    """Names a bucket's groups by their keys (its key table's rows, in the bucket's order)."""

    table: pa.Table

    def key_at(self, group_id: int) -> Any:
        return _key_in(self.table, group_id)


def _in_bucket_order(plan: RunPlan, figures: Sequence[Any], sizes: Sequence[int]) -> MergedStatistics:
    """The merged statistics of the buckets' groups laid end to end, each bucket in its own
    order (``figures``: the buckets' tables, object references or tables, fetched one at a
    time; ``sizes``: each bucket's groups): a reducer's own, or every bucket's in a worker."""
    starts = list(itertools.accumulate(sizes, initial=0))
    k = starts[-1]
    numbers: dict[str, np.ndarray] = {}
    values: dict[str, list[pa.ChunkedArray]] = {}
    for ref, start, stop in zip(figures, starts[:-1], starts[1:], strict=True):
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
            numbers[name][start:stop] = array
        del table
    channels = [_stats_of(numbers, _channel_prefix(c), plan) for c in range(plan.channels)]
    summary = channels[0] if plan.channels == 1 else _stats_of(numbers, _SUMMARY_PREFIX, plan)
    figures = wanted(plan.needs)
    columns = [column for figure in figures for column in figure.columns]
    totals = padded(
        figures,
        {column: numbers[FIGURE_PREFIX + column] for column in columns if FIGURE_PREFIX + column in numbers},
        k,
    )
    one_value = []
    for i, figure in enumerate(one_value_figures(plan.config)):
        index = GroupKeyIndex([VALUE_FIELD.format(i)], few_values=True)
        of_group = np.zeros(0, np.int64)
        if k:
            name = VALUE_FIELD.format(i)
            parts = [pa.table({name: column}) for column in values[name]]
            combined = pa.concat_tables(parts, promote_options="permissive").column(name)
            of_group = index.encode([combined])
        one_value.append((figure.column, of_group, [index.key_at(v) for v in range(len(index))]))
    return _merged(plan, channels, summary, totals, one_value)


def _outcome_of(plan: RunPlan, merged: MergedStatistics, batch_stds: BatchStds | None = None) -> GroupOutcome:
    """:meth:`RunPlan.outcome` of merged statistics: the driver's, a bucket's or a worker's
    (``batch_stds``: ``--scale batch``'s, merged from every bucket, for a part of the groups)."""
    return plan.outcome(
        merged.channel_stats,
        merged.summary_stats,
        rows_per_group=merged.rows_per_group,
        rows=int(merged.rows_per_group.sum()),
        nan_rewards=merged.nan_rewards,
        figures=merged.figures,
        batches=merged.batches,
        batch_stds=batch_stds,
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
