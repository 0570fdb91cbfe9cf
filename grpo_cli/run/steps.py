"""The columns a run watches beside its key: a training step that its groups may span (the
merged-steps finding) and the values that --by and a whole-batch filter report on."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa

from grpo_cli.options.config import ComputeConfig
from grpo_cli.run.figures import OneValueFigure

if TYPE_CHECKING:
    from collections.abc import Sequence


STEP_COLUMNS = ("step", "global_step", "train_step", "iteration", "epoch", "training_step")
"""Columns that name a training step or iteration, in the order one is watched."""


def watched_step(config: ComputeConfig, schema: pa.Schema) -> str | None:
    """The step column a run watches for groups that span steps (a prompt key without the step
    draws every step's rollouts of a prompt into one group): the first of :data:`STEP_COLUMNS`
    that ``schema`` holds as numbers, outside the group key, ``--by`` and ``--batch-col`` (a
    group across those is refused) and not read otherwise; ``None`` where none is.

    >>> import pyarrow as pa
    >>> schema = pa.schema([("prompt", pa.string()), ("step", pa.int64()), ("reward", pa.float64())])
    >>> watched_step(ComputeConfig(group_cols=("prompt",)), schema)
    'step'
    >>> watched_step(ComputeConfig(group_cols=("prompt", "step")), schema) is None
    True
    """
    taken = {*config.group_cols, *config.by_cols, config.batch_col, *config.input_columns}
    for name in STEP_COLUMNS:
        index = schema.get_field_index(name)
        if index >= 0 and name not in taken:
            kind = schema.field(index).type
            if pa.types.is_integer(kind) or pa.types.is_floating(kind):
                return name
    return None


def with_watched_step(config: ComputeConfig, schemas: Sequence[pa.Schema]) -> ComputeConfig:
    """``config`` watching the step column every shard holds (:func:`watched_step`; shards of no
    columns, empty JSON lines, aside), or ``config`` itself where it names its own or none fits."""
    if config.step_col is not None:
        return config
    found = {watched_step(config, schema) for schema in schemas if len(schema)}
    step = found.pop() if len(found) == 1 else None
    return config if step is None else replace(config, step_col=step)


def one_value_figures(config: ComputeConfig) -> list[OneValueFigure]:
    """The columns that hold one value per group, each a figure with its merge rule: --batch-col
    (its training batch), then each --by column (its figures per value), in that order."""
    figures = [] if config.batch_col is None else [OneValueFigure(config.batch_col, "batch_col")]
    return figures + [OneValueFigure(column, "by") for column in config.by_cols]
