"""Pass 1's additive per-group figures, each declared once with its update and its merge rule.

A figure is a count or a sum per group: each row contributes a value (:attr:`GroupFigure.of_rows`),
a chunk's figure is the per-group total of its rows, and two partial figures of the same groups
merge by their rule (``"sum"``), as torchmetrics' ``add_state(..., dist_reduce_fx="sum")``
declares a metric's state. The local engine folds each chunk into running totals
(:func:`fold`); each Ray block computes its own (:func:`of_chunk`), and the blocks' rows are
merged by group (:func:`merge_by_group`). The group statistics themselves (count, mean, M2,
extremes) merge by Chan's rule in :mod:`grpo_cli.kernel`.

>>> import numpy as np
>>> rows = RowInputs(np.array([1.0, 0.0, np.nan]), np.array([True, True, False]), None)
>>> totals = of_chunk(wanted(()), np.array([0, 0, 1]), 2, rows)
>>> {name: values.tolist() for name, values in totals.items()}
{'rows': [2, 1], 'nan_rewards': [0, 1], 'nonzero_rewards': [1, 0]}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from grpo_cli.options import Need
from grpo_cli.rewards import RewardBatch


@dataclass(frozen=True)
class RowInputs:
    """What a chunk's rows contribute from: the combined reward (in its own dtype: a float32
    reward times a float64 length is widened exactly), whether it is in the statistics (bool),
    and each row's length where the run reads one."""

    combined: np.ndarray
    valid: np.ndarray
    lengths: np.ndarray | None

    @classmethod
    def of(cls, rewards: RewardBatch, lengths: np.ndarray | None) -> RowInputs:
        combined = rewards.combined.numpy()
        valid = rewards.combined_valid
        return cls(combined, np.ones(combined.size, dtype=bool) if valid is None else valid.numpy(), lengths)


@dataclass(frozen=True)
class MergeRule:
    """How partial figures of the same groups combine: two aligned totals (``pair``), or rows
    of (block, group) partials into one per group (``by_group(ids, values, k)``)."""

    pair: Callable[[np.ndarray, np.ndarray], np.ndarray]
    by_group: Callable[[np.ndarray, np.ndarray, int], np.ndarray]


MERGES: dict[str, MergeRule] = {
    "sum": MergeRule(np.add, lambda ids, values, k: np.bincount(ids, weights=values, minlength=k)),
}


@dataclass(frozen=True)
class GroupFigure:
    """One per-group figure: integer counts (``of_rows`` gives a bool mask of the rows counted)
    or float sums (``of_rows`` gives each row's value), wanted always or for one estimator need."""

    name: str
    kind: Literal["count", "sum"]
    merge: Literal["sum"]
    of_rows: Callable[[RowInputs], np.ndarray]
    need: Need | None = None


def _lengths(rows: RowInputs) -> np.ndarray:
    assert rows.lengths is not None  # wanted only with --length-col (ComputeConfig.validate)
    return np.where(rows.valid, rows.lengths, 0.0)


FIGURES = (
    GroupFigure("rows", "count", "sum", lambda rows: np.ones(rows.combined.size, dtype=bool)),
    GroupFigure("nan_rewards", "count", "sum", lambda rows: ~rows.valid),
    GroupFigure(
        "nonzero_rewards", "count", "sum", lambda rows: np.isfinite(rows.combined) & (rows.combined != 0)
    ),
    GroupFigure("length_sums", "sum", "sum", _lengths, need="length_sums"),
    GroupFigure(
        "weighted_reward_sums",
        "sum",
        "sum",
        lambda rows: np.where(rows.valid, _lengths(rows) * rows.combined, 0.0),
        need="length_sums",
    ),
)
"""Every figure, in a fixed order: rows, unscorable rows and rows with a non-zero reward per
group (GPG's alpha), and OPO's length sums."""


def wanted(needs: Sequence[Need]) -> list[GroupFigure]:
    """The figures a run with these estimator needs computes."""
    return [figure for figure in FIGURES if figure.need is None or figure.need in needs]


def of_chunk(
    figures: Sequence[GroupFigure], ids: np.ndarray, k: int, rows: RowInputs
) -> dict[str, np.ndarray]:
    """Each figure's per-group total over one chunk's rows, shape ``(k,)`` (int64 or float64)."""
    out = {}
    for figure in figures:
        values = figure.of_rows(rows)
        if figure.kind == "count":
            out[figure.name] = np.bincount(ids[values], minlength=k).astype(np.int64)
        else:
            out[figure.name] = np.bincount(ids, weights=values, minlength=k)
    return out


def fold(
    figures: Sequence[GroupFigure], totals: Mapping[str, np.ndarray], chunk: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Running totals with one more chunk's, by each figure's merge rule (groups grow as they appear)."""
    out = {}
    for figure in figures:
        a, b = totals.get(figure.name), chunk[figure.name]
        if a is None:
            out[figure.name] = b
            continue
        size = max(a.size, b.size)
        out[figure.name] = MERGES[figure.merge].pair(
            np.pad(a, (0, size - a.size)), np.pad(b, (0, size - b.size))
        )
    return out


def merge_by_group(
    figures: Sequence[GroupFigure], parts: Mapping[str, np.ndarray], ids: np.ndarray, k: int
) -> dict[str, np.ndarray]:
    """Partial figures, one row per (block, group), merged into one per group ``ids`` names."""
    out = {}
    for figure in figures:
        merged = MERGES[figure.merge].by_group(ids, parts[figure.name], k)
        out[figure.name] = merged.astype(np.int64) if figure.kind == "count" else merged
    return out


def padded(figures: Sequence[GroupFigure], totals: Mapping[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """The totals of ``k`` groups (a group seen in no chunk has 0)."""
    out = {}
    for figure in figures:
        values = totals.get(figure.name)
        dtype = np.int64 if figure.kind == "count" else np.float64
        out[figure.name] = (
            np.zeros(k, dtype=dtype) if values is None else np.pad(values, (0, k - values.size))
        )
    return out
