"""Pass 1's additive per-group figures, each declared once with its update and its merge rule.

A figure is a count or a sum per group: each row contributes a value (:attr:`GroupFigure.of_rows`),
a block's figure is the per-group total of its rows, and two partial figures of the same groups
merge by their rule (``"sum"``), as torchmetrics' ``add_state(..., dist_reduce_fx="sum")``
declares a metric's state. For a float sum, rows are cut into blocks at the fixed row positions
where the kernel's accumulators cut theirs (:class:`FigureAccumulator`), each block's totals are
computed (:func:`of_chunk`) and folded into the running totals in input order (:func:`fold`): the
sum then depends only on the rows and their order, never on the sizes of the chunks read, and the
Ray engine, which reduces each block on a worker, folds the same blocks in the same order. A count
is exact in any order, so it is folded a chunk at a time as the rows come. The group
statistics themselves (count, mean, M2, extremes) merge by Chan's rule in :mod:`grpo_cli.kernel`.

>>> import numpy as np
>>> rows = RowInputs(np.array([1.0, 0.0, np.nan]), np.array([True, True, False]), None)
>>> totals = of_chunk(wanted(("batch_nonzero",)), np.array([0, 0, 1]), 2, rows)
>>> {name: values.tolist() for name, values in totals.items()}
{'rows': [2, 1], 'nan_rewards': [0, 1], 'nonzero_rewards': [1, 0]}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from grpo_cli.estimators import Need
from grpo_cli.run.rewards import RewardBatch


@dataclass(frozen=True)
class RowInputs:
    """What a chunk's rows contribute from: the combined reward (in its own dtype: a float32
    reward times a float64 length is widened exactly), whether it is in the statistics (bool),
    each row's length where the run reads one, and its step (the watched step column's value, float64,
    NaN where null) where the run watches one."""

    combined: np.ndarray
    valid: np.ndarray
    lengths: np.ndarray | None
    steps: np.ndarray | None = None

    @classmethod
    def of(
        cls, rewards: RewardBatch, lengths: np.ndarray | None, steps: np.ndarray | None = None
    ) -> RowInputs:
        combined = rewards.combined.numpy()
        valid = rewards.combined_valid
        return cls(
            combined, np.ones(combined.size, dtype=bool) if valid is None else valid.numpy(), lengths, steps
        )

    def __getitem__(self, rows: slice) -> RowInputs:
        return RowInputs(
            self.combined[rows],
            self.valid[rows],
            None if self.lengths is None else self.lengths[rows],
            None if self.steps is None else self.steps[rows],
        )

    @staticmethod
    def concat(parts: Sequence[RowInputs]) -> RowInputs:
        def joined(arrays: list[np.ndarray | None]) -> np.ndarray | None:
            return None if any(a is None for a in arrays) else np.concatenate(arrays)  # type: ignore[arg-type]

        columns = [
            joined([getattr(p, name) for p in parts]) for name in ("combined", "valid", "lengths", "steps")
        ]
        assert columns[0] is not None and columns[1] is not None
        return RowInputs(columns[0], columns[1], columns[2], columns[3])


def _extreme_by_group(
    reduce: np.ufunc, identity: float
) -> Callable[[np.ndarray, np.ndarray, int], np.ndarray]:
    def by_group(ids: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
        out = np.full(k, identity)
        reduce.at(out, ids, values)
        return out

    return by_group


@dataclass(frozen=True)
class MergeRule:
    """How partial figures of the same groups combine: two aligned totals (``pair``), or rows
    of (block, group) partials into one per group (``by_group(ids, values, k)``); ``identity``
    is a group's figure before any row of it (what a total of groups not seen yet holds)."""

    pair: Callable[[np.ndarray, np.ndarray], np.ndarray]
    by_group: Callable[[np.ndarray, np.ndarray, int], np.ndarray]
    identity: float = 0.0


MERGES: dict[str, MergeRule] = {
    "sum": MergeRule(np.add, lambda ids, values, k: np.bincount(ids, weights=values, minlength=k)),
    # fmin/fmax: a NaN (a null step) is no value; exact in any order
    "min": MergeRule(np.fmin, _extreme_by_group(np.fmin, np.inf), np.inf),
    "max": MergeRule(np.fmax, _extreme_by_group(np.fmax, -np.inf), -np.inf),
}


@dataclass(frozen=True)
class GroupFigure:
    """One per-group figure: integer counts (``of_rows`` gives a bool mask of the rows counted),
    float sums or a float extreme (``of_rows`` gives each row's value), wanted always or for
    one need."""

    name: str
    kind: Literal["count", "sum", "extreme"]
    merge: Literal["sum", "min", "max"]
    of_rows: Callable[[RowInputs], np.ndarray]
    need: Need | None = None

    @property
    def identity(self) -> float:
        return MERGES[self.merge].identity


def _lengths(rows: RowInputs) -> np.ndarray:
    assert rows.lengths is not None  # wanted only with --length-col (ComputeConfig.validate)
    return np.where(rows.valid, rows.lengths, 0.0)


def _weighted_rewards(rows: RowInputs) -> np.ndarray:
    """Each scored row's length times its reward, 0 for a row left out (never multiplied: a
    NaN or infinite reward would warn on standard error)."""
    lengths = _lengths(rows)
    product = np.zeros(lengths.shape, dtype=np.result_type(lengths, rows.combined))
    np.multiply(lengths, rows.combined, out=product, where=rows.valid)
    return product


FIGURES = (
    GroupFigure("rows", "count", "sum", lambda rows: np.ones(rows.combined.size, dtype=bool)),
    GroupFigure("nan_rewards", "count", "sum", lambda rows: ~rows.valid),
    GroupFigure(
        "nonzero_rewards",
        "count",
        "sum",
        lambda rows: np.isfinite(rows.combined) & (rows.combined != 0),
        need="batch_nonzero",
    ),
    GroupFigure("length_sums", "sum", "sum", _lengths, need="length_sums"),
    GroupFigure(
        "weighted_reward_sums",
        "sum",
        "sum",
        _weighted_rewards,
        need="length_sums",
    ),
    GroupFigure("step_low", "extreme", "min", lambda rows: _steps(rows), need="step_span"),
    GroupFigure("step_high", "extreme", "max", lambda rows: _steps(rows), need="step_span"),
)
"""Every figure, in a fixed order: rows and unscorable rows per group, then those an estimator
needs: rows with a non-zero reward (GPG's alpha) and OPO's length sums, then the lowest and
highest step of each group where the run watches a step column (a group whose two differ
spans steps)."""


def step_spans(totals: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """Whether each group's rows hold more than one value of the watched step column (bool, per
    group), from the ``step_low`` and ``step_high`` figures; ``None`` where none is watched. A
    group of null steps alone spans none."""
    low, high = totals.get("step_low"), totals.get("step_high")
    if low is None or high is None:
        return None
    spans: np.ndarray = low < high
    return spans


def _steps(rows: RowInputs) -> np.ndarray:
    assert rows.steps is not None  # wanted only with a watched step column (RunPlan.needs)
    return rows.steps


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
            if values.all():  # most counts hold every row or none: no copy of the IDs
                out[figure.name] = np.bincount(ids, minlength=k).astype(np.int64)
            elif not values.any():
                out[figure.name] = np.zeros(k, dtype=np.int64)
            else:
                out[figure.name] = np.bincount(ids[values], minlength=k).astype(np.int64)
        elif figure.kind == "extreme":
            out[figure.name] = MERGES[figure.merge].by_group(ids, values, k)
        else:
            out[figure.name] = np.bincount(ids, weights=values, minlength=k)
    return out


def room_for(values: np.ndarray | None, size: int, *, fill: float = 0, dtype: Any = None) -> np.ndarray:
    """``values`` itself where it holds ``size`` entries, else a copy at the front of an array
    at least twice as large, the rest ``fill`` (``dtype``: where ``values`` is ``None``).
    Running per-group totals grow this way by each chunk's new groups: every value is copied a
    bounded number of times, where growing by exactly the new groups copies all per chunk.

    >>> room_for(np.array([3, 4]), 3, fill=-1).tolist()
    [3, 4, -1, -1]
    """
    if values is not None and values.size >= size:
        return values
    held = 0 if values is None else values.size
    grown = np.full(max(size, 2 * held), fill, dtype=dtype if values is None else values.dtype)
    if values is not None:
        grown[:held] = values
    return grown


class FigureAccumulator:
    """Rows fed in input order. Counts are folded a chunk at a time: an integer total is the
    same in any order. Float sums are cut into blocks at multiples of ``block_rows`` (as
    :class:`~grpo_cli.kernel.GroupStatsAccumulator` cuts them), each block's totals folded in.

    >>> acc = FigureAccumulator(wanted(("batch_nonzero",)), block_rows=2)
    >>> acc.update(np.array([0, 1, 1]), RowInputs(np.array([1.0, 0.0, 2.0]), np.ones(3, bool), None))
    >>> acc.compute()["nonzero_rewards"].tolist()
    [1, 1]
    """

    def __init__(self, figures: Sequence[GroupFigure], *, block_rows: int) -> None:
        # an extreme is exact in any order: folded a chunk at a time, as the counts
        self.counts = [figure for figure in figures if figure.kind != "sum"]
        self.sums = [figure for figure in figures if figure.kind == "sum"]
        self.block_rows = block_rows
        self._pending: list[tuple[np.ndarray, RowInputs]] = []
        self._pending_rows = 0
        # each figure's totals at the front of a buffer that grows by doubling: a chunk's groups
        # are mostly new ones (sorted input), and growing by copying every chunk was quadratic
        self._buffers: dict[str, np.ndarray] = {}
        self._sizes: dict[str, int] = {}  # the groups each figure has seen
        self._handed_out: set[str] = set()  # compute() gave views: the next fold copies first

    def update(self, ids: np.ndarray, rows: RowInputs) -> None:
        """Add a chunk: each row's group ID and what it contributes from."""
        if ids.size:
            self._fold(self.counts, ids, rows)
        if not self.sums:
            return
        self._pending.append((ids, rows))
        self._pending_rows += ids.size
        while self._pending_rows >= self.block_rows:
            self._flush(self.block_rows)

    def compute(self) -> dict[str, np.ndarray]:
        """Each figure's totals over the rows fed so far (as long as the groups seen)."""
        if self._pending_rows:
            self._flush(self._pending_rows)
        self._handed_out = set(self._buffers)
        return {name: buffer[: self._sizes[name]] for name, buffer in self._buffers.items()}

    def _flush(self, rows: int) -> None:
        ids = np.concatenate([i for i, _ in self._pending])
        parts = RowInputs.concat([r for _, r in self._pending])
        head, rest = parts[:rows], parts[rows:]
        self._pending = [(ids[rows:], rest)] if ids.size > rows else []
        self._pending_rows = ids.size - rows
        if rows:
            self._fold(self.sums, ids[:rows], head)

    def _fold(self, figures: Sequence[GroupFigure], ids: np.ndarray, rows: RowInputs) -> None:
        low, high = int(ids.min()), int(ids.max())  # the rows' groups: few, for sorted input
        chunk = of_chunk(figures, ids - low if low else ids, high - low + 1, rows)
        for figure in figures:
            buffer = self._buffers.get(figure.name)
            self._sizes[figure.name] = max(self._sizes.get(figure.name, 0), high + 1)
            if buffer is not None and figure.name in self._handed_out:  # compute() gave a view of it
                self._handed_out.discard(figure.name)
                buffer = buffer.copy()
            buffer = self._buffers[figure.name] = room_for(
                buffer, high + 1, fill=figure.identity, dtype=chunk[figure.name].dtype
            )
            # a group not seen before holds the rule's identity there (0 + a bincount's total is
            # the total: a bincount never sums to -0.0)
            at = buffer[low : high + 1]
            at[...] = MERGES[figure.merge].pair(at, chunk[figure.name])


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
            np.full(k, figure.identity, dtype=dtype)
            if values is None
            else np.pad(values, (0, k - values.size), constant_values=figure.identity)
        )
    return out
