"""The names of the fields Ray's tables carry between tasks (a block's partial rows, a
bucket's report), the refusal a task returns in place of raising, and a run whose rows are
not known."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from grpo_cli.errors import GrpoError

FIGURE_PREFIX = "__grpo_figure_"  # a block's per-group figures (figures.FIGURES)


VALUE_PREFIX = "__grpo_value_"


# a one-value-per-group column's value at the group's first row in the block
VALUE_FIELD = VALUE_PREFIX + "{}"


VALUE_CLASH_FIELD = "__grpo_value_clash_{}"  # the group spans two of its values in this block


ROW_GROUP_FIELD = "__grpo_row_group"  # --group-size: a row's group, as a key the Ray jobs match


_CPU = torch.device("cpu")


BLOCK_FIELD = "__grpo_block"  # the statistics block a partial row or a moments row belongs to


GROUP_FIELD = "__grpo_group"  # a partial row's group in its block (first appearance there)


# A block that fails returns its error's line in this field: an exception in a Ray task
# would print its traceback.
ERROR_FIELD = "__grpo_error"


def _channel_prefix(channel: int) -> str:
    return f"__grpo_{channel}_"


_SUMMARY_PREFIX = "__grpo_summary_"


def _refusal(message: str) -> pa.Table:
    return pa.table({ERROR_FIELD: [message]})


def _numpy(columns: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {name: value.numpy() for name, value in columns.items()}


def _record_batch(table: pa.Table) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], schema=table.schema)


FIRST_SEEN_FIELDS = ("__grpo_first_block", "__grpo_first_group")  # a group's first partial row


class RowsUnknown(GrpoError):
    """A refusal whose row the driver does not know (a null or NaN key, a group across two
    batches, a bad reward under ``--nan error``): the :class:`~grpo_cli.jobs.Ray` engine's job
    words it as the local engine does when every input is a local file."""


ROW_GROUP_IN_BLOCK = "__grpo_row_group_in_block"  # a row's group in its block, in a rows table


REPORT_FIELD = "__grpo_report"  # a pickled report of a bucket, in a one-row table


def _report_table(report: Any) -> pa.Table:
    return pa.table({REPORT_FIELD: [pickle.dumps(report)]})


def _report_of(table: pa.Table) -> Any:
    return pickle.loads(table.column(REPORT_FIELD)[0].as_py())


BatchStds = list[dict[Any, float]]
"""``--scale batch``: per channel, each batch's reward std by its key (``None``: the whole run)."""


KEY_PREFIX = "__grpo_key_"  # a group's key column, in a cut of the groups


BY_VALUE_FIELD = "__grpo_by_value"


FILTER_VIEW_FIELD = "__grpo_filter_view"  # a group's value of the trainer filter's report column


BY_FIGURES = ("count", "mean", "m2", "minimum", "maximum", "active", "rows")
"""A group's figures that :func:`~grpo_cli.results.summary.figures_by_value` reads (:class:`GroupFigures`)."""
