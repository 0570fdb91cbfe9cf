"""Statistics blocks: the local engine's cuts at fixed row positions, each read and reduced to
one row per group with the kernel's accumulators; the fields those rows carry."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from grpo_cli.arrow.columns import plain_schema
from grpo_cli.arrow.keys import GroupKeyIndex, InvalidKeyError, as_tensor
from grpo_cli.engines.ray.fields import (
    _CPU,
    _SUMMARY_PREFIX,
    BLOCK_FIELD,
    FIGURE_PREFIX,
    GROUP_FIELD,
    ROW_GROUP_FIELD,
    ROW_GROUP_IN_BLOCK,
    VALUE_CLASH_FIELD,
    VALUE_FIELD,
    _channel_prefix,
    _numpy,
    _record_batch,
    _refusal,
)
from grpo_cli.engines.ray.inputs import InputFile, _open_file
from grpo_cli.errors import GrpoError
from grpo_cli.inputs.readers import parquet_row_range
from grpo_cli.kernel import (
    GroupStats,
)
from grpo_cli.options.config import ComputeConfig
from grpo_cli.run.figures import GroupRows, RowInputs, counted_rewards, of_chunk, wanted
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.reward_counts import RewardCounts
from grpo_cli.run.rewards import RewardBatch
from grpo_cli.run.steps import one_value_figures


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


def keyed_by_position(config: ComputeConfig) -> ComputeConfig:
    """The configuration Ray's jobs run: with ``--group-size``, the groups keyed by
    :data:`ROW_GROUP_FIELD` (the blocks' statistics are those of the consecutive blocks, bit for
    bit: the kernel gives a group the same statistics whichever path its chunk takes)."""
    if config.group_size is None:
        return config
    return replace(config, group_cols=(ROW_GROUP_FIELD,), group_size=None)


def block_statistics(
    batch: pa.Table,
    blocks: list[list[FilePart]],
    config: ComputeConfig,
    group_size: int | None = None,
    *,
    rows: list[pa.Table] | None = None,
    reward_counts: list[RewardCounts] | None = None,
) -> pa.Table:
    """One statistics block (its index in ``batch``): one row per group, in order of first
    appearance, with its key columns and the block's statistics and figures of the group,
    computed as the local engine computes a block's (:meth:`RunPlan.accumulators`,
    :func:`~grpo_cli.run.figures.of_chunk`). ``rows`` (the need ``group_rewards``, a trainer's filter,
    on the reducers) gets a table of the block's rows in input order: each one's group in the block,
    whether it is scored, and the combined reward (float64) the estimator reads or the reward the filter
    sees (its own dtype; unshaped, if asked). ``reward_counts`` gets the block's scored rewards
    counted (:class:`~grpo_cli.run.reward_counts.RewardCounts`)."""
    (index,) = batch.column("block").to_pylist()
    plan = RunPlan(config, device=_CPU)
    keys = GroupKeyIndex(config.group_cols)
    one_value = one_value_figures(config)
    value_keys = [GroupKeyIndex([figure.column], few_values=True) for figure in one_value]
    length_col = config.length_col if "length_sums" in plan.needs else None
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
            for i, (figure, index_of) in enumerate(zip(one_value, value_keys, strict=True)):
                role = figure.role
                values = record.column(figure.column)
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
        return _refusal(error.template)
    ids_np = np.concatenate(id_parts)
    k = len(keys)
    ids = as_tensor(ids_np)
    rewards = RewardBatch.concat(reward_parts)
    if reward_counts is not None:
        reward_counts.append(counted_rewards(rewards))
    if rows is not None:
        row_columns = {ROW_GROUP_IN_BLOCK: ids_np}
        if plan.keeps_group_rows:  # whether each row is scored, and its reward
            row_columns.update(GroupRows.of_chunk(ids_np, rewards).columns())
        else:
            row_columns["scored"] = rewards.scored().numpy()
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
    runs = [(first, r.combined.numel()) for first, r in zip(part_starts, reward_parts, strict=True)]
    figures = of_chunk(wanted(plan.needs), ids_np, k, RowInputs.of(rewards, lengths, steps, runs=runs))
    columns.update({FIGURE_PREFIX + name: values for name, values in figures.items()})
    assert first_record is not None  # a block holds at least one row
    table = keys.key_table(pa.Table.from_batches([first_record]))
    for name, value in columns.items():
        table = table.append_column(name, pa.array(value))
    if one_value:
        _, first_rows = np.unique(ids_np, return_index=True)
    for i, figure in enumerate(one_value):
        _, split = figure.of_chunk(ids_np, np.concatenate(value_id_parts[i]), k)
        values = pa.chunked_array([v.cast(value_parts[i][0].type) for v in value_parts[i]])
        table = table.append_column(VALUE_FIELD.format(i), values.take(pa.array(first_rows)))
        table = table.append_column(VALUE_CLASH_FIELD.format(i), pa.array(split))
    table = table.append_column(GROUP_FIELD, pa.array(np.arange(k, dtype=np.int64)))
    return table.append_column(BLOCK_FIELD, pa.array(np.full(k, index, dtype=np.int64)))


def _stats_from_table(table: pa.Table, prefix: str) -> GroupStats:
    columns = {
        name: torch.from_numpy(table.column(name).to_numpy().copy())
        for name in table.column_names
        if name.startswith(prefix)
    }
    return GroupStats.from_columns(columns, prefix)
