"""The reducers: each block's partial rows cut by key hash into buckets, each bucket merged in
block order and finished where its groups are (outcome, findings, --by figures, a trainer's
filter, an estimator's state built from its groups' rows)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from grpo_cli.arrow.keys import GroupKeyIndex, key_buckets
from grpo_cli.arrow.plain import plain_key
from grpo_cli.engines.ray.blocks import FilePart, block_statistics
from grpo_cli.engines.ray.fields import (
    _CPU,
    BLOCK_FIELD,
    BY_FIGURES,
    BY_VALUE_FIELD,
    ERROR_FIELD,
    FILTER_VIEW_FIELD,
    FIRST_SEEN_FIELDS,
    GROUP_FIELD,
    KEY_PREFIX,
    ROW_GROUP_FIELD,
    ROW_GROUP_IN_BLOCK,
    BatchStds,
    RowsUnknown,
    _refusal,
    _report_table,
)
from grpo_cli.engines.ray.merge import (
    MergedStatistics,
    OrderedMerge,
    _empty_keys,
    _fetched,
    _in_bucket_order,
    _key_in,
    _KeyTable,
    _outcome_of,
)
from grpo_cli.errors import GrpoError
from grpo_cli.kernel import (
    RewardTotals,
)
from grpo_cli.options.config import ComputeConfig
from grpo_cli.results.findings import (
    FirstRound,
    GroupPart,
    RunFigures,
    SecondRound,
    in_chunks,
)
from grpo_cli.results.summary import (
    FINDINGS_CHUNK_GROUPS,
    ByValues,
    GroupFigures,
    figures_by_value,
    outcome_part,
    value_sort_key,
)
from grpo_cli.run.figures import GroupRows
from grpo_cli.run.outcome import GroupOutcome, OutcomeTotals
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.reward_counts import RewardCounts
from grpo_cli.trainers.filters import FilterPart


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
    in the block's order; a refusal goes to every bucket. ``with_rows`` (an estimator that
    reads its groups' rows, a trainer's filter, on the reducers): then the block's rows, cut
    the same way by their group's bucket, in input order. Last, the block's scored rewards
    counted (:class:`~grpo_cli.run.reward_counts.RewardCounts`), which the driver merges."""
    rows: list[pa.Table] | None = [] if with_rows else None
    counts: list[RewardCounts] = []
    table = block_statistics(
        pa.table({"block": [index]}), blocks, config, group_size, rows=rows, reward_counts=counts
    )
    if ERROR_FIELD in table.column_names:
        parts = [table.append_column(BLOCK_FIELD, pa.array([index]))] * buckets
        row_parts = [pa.table({})] * (buckets if with_rows else 0)
    else:
        which = key_buckets(table.select(list(config.group_cols)), buckets)
        parts = _cut(table, which, buckets)
        row_parts = []
        if rows:
            row_parts = _cut(rows[0], which[rows[0].column(ROW_GROUP_IN_BLOCK).to_numpy()], buckets)
    return [*parts, *row_parts, counts[0] if counts else RewardCounts.empty()]


def _cut(table: pa.Table, which: np.ndarray, buckets: int) -> list[pa.Table]:
    """``table``'s rows cut into ``buckets`` tables by ``which`` (each row's), each in order."""
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(buckets + 1))
    ordered = table.take(pa.array(order))
    return [ordered.slice(start, stop - start) for start, stop in itertools.pairwise(bounds)]


@dataclass(frozen=True)
class BucketReport:
    """What the driver gets of a reducer's bucket: its groups, the totals of its outcome and
    round 1 of its findings."""

    groups: int
    totals: OutcomeTotals
    first: FirstRound
    batch_totals: list[dict[Any, RewardTotals]] | None  # --scale batch: round 1 of each batch's std
    filtered: FilterPart | None = None  # check --trainer-filter: the rule on its groups


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
    config: ComputeConfig, buckets: int, with_rows: bool, *tables: pa.Table
) -> tuple[pa.Table, ...]:
    """Reduce task of the statistics job: one bucket's partial rows of every block, in block
    order, merged per group as the local engine merges its blocks (:class:`OrderedMerge`; a
    group's figures depend on its own partial rows only, so the bits are the local engine's).
    ``tables``: the blocks' partial rows, then with ``with_rows`` their rows (an estimator
    that reads its groups' rows, a trainer's filter).

    Each reducer finishes its bucket: it returns the bucket's :class:`BucketReport` (its
    outcome's totals, round 1 of its findings, ...), its figures (:meth:`OrderedMerge.bucket_table`,
    with where each group first appeared), its keys and the estimator's state of its groups,
    built from their rows (:func:`_group_rows_state`; an empty table where it needs none);
    then, with ``--by``, each column's groups, cut into ``buckets`` tables (the job's bucket
    count) by a hash of their value (:func:`_by_value_parts`). A refusal comes first, the rest
    empty tables.
    """
    plan = RunPlan(config, device=_CPU)
    merge = OrderedMerge(plan)
    partials = tables[: len(tables) // 2] if with_rows else tables
    row_tables = tables[len(tables) // 2 :] if with_rows else ()
    nothing = pa.table({})
    by_parts = [nothing] * (_value_cuts(plan) * buckets)
    row_ids: list[np.ndarray] = []
    row_columns: dict[str, list[np.ndarray]] = {name: [] for name in ("seen", *GroupRows.COLUMNS)}
    for b, partial in enumerate(partials):
        if ERROR_FIELD in partial.column_names:
            return partial, nothing, _empty_keys(plan), nothing, *by_parts
        try:
            ids_np = merge.add(partial)
        except RowsUnknown as error:
            block = partial.column(BLOCK_FIELD)[0].as_py()
            refusal = _refusal(error.template).append_column(BLOCK_FIELD, pa.array([block]))
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
    state = nothing
    if with_rows and plan.keeps_group_rows:
        state = _group_rows_state(plan, outcome, row_ids, row_columns)
    by_parts = _by_value_parts(merged.by, whole, buckets)
    return _report_table(report), figures, keys, state, *by_parts, *filter_cuts


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


def _group_rows_state(
    plan: RunPlan, outcome: GroupOutcome, ids: list[np.ndarray], columns: dict[str, list[np.ndarray]]
) -> pa.Table:
    """The estimator's state of a bucket's groups built from every row of them (each block's
    rows in block order: each group's in input order, :meth:`~grpo_cli.run.plan.RunPlan.with_group_rows`),
    as a table of its :meth:`~grpo_cli.estimators.AdvantageEstimator.state_columns`."""
    rows = GroupRows.concat(
        [
            GroupRows.of_columns(block_ids, {name: columns[name][b] for name in GroupRows.COLUMNS})
            for b, block_ids in enumerate(ids)
        ]
    )
    state = plan.with_group_rows(outcome, rows).estimator_state
    return pa.table(plan.estimator.state_columns(state))


def _state_of_buckets(plan: RunPlan, tables: Sequence[Any], sizes: Sequence[int]) -> Any:
    """The buckets' estimator states (references or tables of :func:`_group_rows_state`,
    ``sizes``: each bucket's groups) laid end to end in the buckets' order (a worker's run
    group IDs)."""
    parts = []
    for ref in tables:
        table = _fetched(ref)
        parts.append({name: table.column(name).to_numpy() for name in table.column_names})
    return plan.estimator.state_of_columns(parts, sizes)


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
