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

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from grpo_cli.errors import mention
from grpo_cli.estimators import Need
from grpo_cli.kernel import NO_ROW, TopTwo, group_top_two, merge_top_two
from grpo_cli.run.reward_counts import RewardCounts
from grpo_cli.run.rewards import RewardBatch


@dataclass(frozen=True)
class RowInputs:
    """What a chunk's rows contribute from: the combined reward (in its own dtype: a float32
    reward times a float64 length is widened exactly), whether it is in the statistics (bool),
    each row's length where the run reads one, its step (the watched step column's value, float64,
    NaN where null) where the run watches one, and where the rows sit in the whole input
    (``runs``: each run of consecutive rows as its first row's place and its length)."""

    combined: np.ndarray
    valid: np.ndarray
    lengths: np.ndarray | None
    steps: np.ndarray | None = None
    runs: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(
        cls,
        rewards: RewardBatch,
        lengths: np.ndarray | None,
        steps: np.ndarray | None = None,
        *,
        runs: Sequence[tuple[int, int]] | None = None,
    ) -> RowInputs:
        """The rows of ``rewards``; ``runs`` by default: one run from the input's first row."""
        combined = rewards.combined.numpy()
        return cls(
            combined,
            rewards.scored().numpy(),
            lengths,
            steps,
            tuple(runs) if runs is not None else ((0, combined.size),),
        )

    def positions(self) -> np.ndarray:
        """Each row's place in the whole input, int64 ``(N,)``.

        >>> RowInputs(np.zeros(3), np.ones(3, bool), None, runs=((5, 1), (9, 2))).positions().tolist()
        [5, 9, 10]
        """
        if not self.runs:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(first, first + rows, dtype=np.int64) for first, rows in self.runs])

    def __getitem__(self, rows: slice) -> RowInputs:
        start, stop, _ = rows.indices(self.combined.size)
        return RowInputs(
            self.combined[rows],
            self.valid[rows],
            None if self.lengths is None else self.lengths[rows],
            None if self.steps is None else self.steps[rows],
            _runs_between(self.runs, start, stop),
        )

    @staticmethod
    def concat(parts: Sequence[RowInputs]) -> RowInputs:
        def joined(arrays: list[np.ndarray | None]) -> np.ndarray | None:
            return None if any(a is None for a in arrays) else np.concatenate(arrays)  # type: ignore[arg-type]

        columns = [
            joined([getattr(p, name) for p in parts]) for name in ("combined", "valid", "lengths", "steps")
        ]
        assert columns[0] is not None and columns[1] is not None
        runs = tuple(run for part in parts for run in part.runs)
        return RowInputs(columns[0], columns[1], columns[2], columns[3], runs)


def _runs_between(runs: tuple[tuple[int, int], ...], start: int, stop: int) -> tuple[tuple[int, int], ...]:
    """The runs of rows ``start`` to ``stop`` (places among the rows the runs hold).

    >>> _runs_between(((10, 3), (20, 2)), 1, 4)
    ((11, 2), (20, 1))
    """
    out, seen = [], 0
    for first, rows in runs:
        low, high = max(start, seen), min(stop, seen + rows)
        if low < high:
            out.append((first + low - seen, high - low))
        seen += rows
    return tuple(out)


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

    @property
    def columns(self) -> dict[str, tuple[type[np.generic], float]]:
        """Its columns: dtype and a group's value before any row of it, by name."""
        return {self.name: (np.int64 if self.kind == "count" else np.float64, self.identity)}

    @property
    def exact(self) -> bool:
        """Whether its merge gives the same bits in any order (a count, an extreme): folded a
        chunk at a time; a float sum is folded in blocks cut at fixed rows."""
        return self.kind != "sum"

    def of_chunk(self, ids: np.ndarray, k: int, rows: RowInputs) -> dict[str, np.ndarray]:
        """Its per-group total over a chunk's rows, shape ``(k,)``."""
        values = self.of_rows(rows)
        if self.kind == "count":
            if values.all():  # most counts hold every row or none: no copy of the IDs
                return {self.name: np.bincount(ids, minlength=k).astype(np.int64)}
            if not values.any():
                return {self.name: np.zeros(k, dtype=np.int64)}
            return {self.name: np.bincount(ids[values], minlength=k).astype(np.int64)}
        if self.kind == "extreme":
            return {self.name: MERGES[self.merge].by_group(ids, values, k)}
        return {self.name: np.bincount(ids, weights=values, minlength=k)}

    def merged(self, held: Mapping[str, np.ndarray], part: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Two aligned partial figures of the same groups, merged by its rule."""
        return {self.name: MERGES[self.merge].pair(held[self.name], part[self.name])}


@dataclass(frozen=True)
class TopTwoFigure:
    """The need ``top_two``: each group's largest and second largest scored reward (float64)
    and the place of its first row holding the largest (int64), merged exactly in any order
    (:func:`~grpo_cli.kernel.merge_top_two`)."""

    name: str = "top_two"
    need: Need | None = "top_two"
    exact: bool = True

    @property
    def columns(self) -> dict[str, tuple[type[np.generic], float]]:
        return {
            "top_first": (np.float64, -math.inf),
            "top_second": (np.float64, -math.inf),
            "top_best_row": (np.int64, NO_ROW),
        }

    def of_chunk(self, ids: np.ndarray, k: int, rows: RowInputs) -> dict[str, np.ndarray]:
        values, groups, positions = rows.combined, ids, rows.positions()
        if not rows.valid.all():
            values, groups, positions = values[rows.valid], groups[rows.valid], positions[rows.valid]
        top = group_top_two(
            torch.from_numpy(values), torch.from_numpy(groups), k, positions=torch.from_numpy(positions)
        )
        return self._columns(top)

    def merged(self, held: Mapping[str, np.ndarray], part: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._columns(merge_top_two(self._top_two(held), self._top_two(part)))

    @staticmethod
    def _columns(top: TopTwo) -> dict[str, np.ndarray]:
        return {column: getattr(top, field).numpy() for column, field in _TOP_TWO_FIELDS.items()}

    @staticmethod
    def _top_two(columns: Mapping[str, np.ndarray]) -> TopTwo:
        return TopTwo(**{name: torch.from_numpy(columns[column]) for column, name in _TOP_TWO_FIELDS.items()})


_TOP_TWO_FIELDS = {"top_first": "first", "top_second": "second", "top_best_row": "best_row"}


Figure = GroupFigure | TopTwoFigure
"""A per-group figure of pass 1: its columns, how a chunk's rows give it, how partials merge."""


ONE_VALUE_REASONS = {
    "batch_col": "each group must lie in one training batch",
    "by": "each group must lie in one value of it",
}
"""Why a group may hold only one value of each such column, by option (every engine refuses
in these words)."""

KEY_ROLES = {"batch_col": "batch", "by": "by"}
"""How a refusal names such a column's key (``batch key 'step' is NaN``), by option."""


@dataclass(frozen=True)
class OneValueFigure:
    """A column each group holds one value of: ``--batch-col`` (its training batch) or a ``--by``
    column (its figures per value). Per group, the ID of its value (the column's values numbered
    by a key index in order of first appearance; -1 for a group with no row yet), merged by the
    rule "one": two partial figures of a group agree, or the group is refused.

    >>> by = OneValueFigure("source", "by")
    >>> of_group, split = by.of_chunk(np.array([0, 0, 1, 2, 2]), np.array([4, 4, 1, 0, 3]), 3)
    >>> of_group.tolist(), split.tolist()  # group 2 holds two values: refused, whatever its ID here
    ([4, 1, 0], [False, False, True])
    >>> merged, clash = by.merged(np.array([4, -1, 2]), np.array([4, 1, -1]), np.zeros(3, bool))
    >>> merged.tolist(), clash.tolist()
    ([4, 1, 2], [False, False, False])
    >>> by.merged(np.array([4]), np.array([5]), np.zeros(1, bool))[1].tolist()
    [True]
    >>> by.spans(("math", "chat")).split("'source' ")[1]
    "('math', then 'chat'); each group must lie in one value of it"
    """

    column: str  # "" for the tensor API's batch IDs, which have no column
    option: Literal["batch_col", "by"]

    @property
    def role(self) -> str:
        """How a refusal names its key (``by key 'source' is null``)."""
        return KEY_ROLES[self.option]

    def of_chunk(
        self, ids: np.ndarray, value_ids: np.ndarray, k: int, *, low: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per group of a chunk (``ids`` in ``low..low+k-1``, int64 ``(N,)``, beside each row's
        value ID), the ID of its rows' value (-1 for a group with no row) and whether they hold
        two (bool), shape ``(k,)``.

        The rows are taken a run of one group at a time (a group's rows mostly come together):
        where each group is one run, in ID order, the runs' first rows are the answer."""
        if not ids.size:
            return np.full(k, -1, dtype=np.int64), np.zeros(k, dtype=bool)
        same_group = ids[1:] == ids[:-1]
        heads = np.flatnonzero(np.concatenate(([True], ~same_group)))
        head_groups, head_values = ids[heads] - low, value_ids[heads]
        if head_groups.size == k and bool((np.diff(head_groups) > 0).all()):
            of_group, split = head_values.astype(np.int64, copy=True), np.zeros(k, dtype=bool)
        else:
            of_group, split = _one_value_per_group(head_groups, head_values, k)
        split[ids[1:][same_group & (value_ids[1:] != value_ids[:-1])] - low] = True  # within a run
        return of_group, split

    @staticmethod
    def merged(held: np.ndarray, part: np.ndarray, split: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Two aligned partial figures of the same groups (``part``'s own ``split``): the value
        each group holds, and where a group holds two (bool; those groups are refused)."""
        present = part >= 0
        clash = split | (present & (held >= 0) & (held != part))
        return np.where(present, part, held), clash

    def spans(self, values: tuple[Any, Any] | None = None, *, fix: str = "") -> str:
        """What a refusal says a group spans: the option, its column, the two values where known."""
        named = f" {self.column!r}" if self.column else ""
        seen = "" if values is None else f" ({values[0]!r}, then {values[1]!r})"
        return f"two values of {mention(self.option)}{named}{seen}; {ONE_VALUE_REASONS[self.option]}{fix}"


def _one_value_per_group(ids: np.ndarray, value_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group, its rows' highest value ID (-1 for a group with no rows) and whether they hold two.

    >>> _one_value_per_group(np.array([0, 0, 1, 1]), np.array([3, 3, 2, 5]), 3)
    (array([ 3,  5, -1]), array([False,  True, False]))
    """
    high = np.full(k, -1, dtype=np.int64)
    np.maximum.at(high, ids, value_ids)
    low = np.full(k, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(low, ids, value_ids)
    return high, (high >= 0) & (low != high)


def second_value(
    ids: np.ndarray, value_ids: np.ndarray, group: int, first: int | None = None
) -> tuple[int, int]:
    """Where a refused group's second value appears: its first value ID (``first``, known
    from earlier chunks, or by default its first row's here) and the first row of ``group``
    whose value ID differs from it.

    >>> second_value(np.array([0, 1, 0, 0]), np.array([2, 5, 2, 7]), 0)
    (2, 3)
    >>> second_value(np.array([0, 1, 0, 0]), np.array([2, 5, 2, 7]), 0, first=7)
    (7, 0)
    """
    rows = np.flatnonzero(ids == group)
    if first is None:
        first = int(value_ids[rows[0]])
    return first, int(rows[np.argmax(value_ids[rows] != first)])


@dataclass(frozen=True)
class GroupRows:
    """The need ``group_rewards``: rows kept whole for an estimator that reads every row of its
    groups (pass@k), each row's group ID (int64), whether it is scored (bool) and its combined
    reward (float64), shape ``(n,)``. Its merge rule is "rows in input order": parts are laid end
    to end in the order of their rows, so each group's rows keep their order whichever engine,
    chunk or Ray bucket held them.

    >>> rewards = RewardBatch([torch.tensor([1.0, 0.0])], [None], torch.tensor([1.0, 0.0]), None)
    >>> rows = GroupRows.concat([GroupRows.of_chunk(np.array([0, 1]), rewards)] * 2)
    >>> rows.ids.tolist(), rows.scored.tolist(), rows.rewards.tolist()
    ([0, 1, 0, 1], [True, True, True, True], [1.0, 0.0, 1.0, 0.0])
    """

    ids: np.ndarray
    scored: np.ndarray
    rewards: np.ndarray

    COLUMNS = ("scored", "reward")
    """Its columns beside the rows' group IDs, as Ray's blocks ship them to the reducers."""

    @classmethod
    def of_chunk(cls, ids: np.ndarray, rewards: RewardBatch) -> GroupRows:
        """A chunk's rows: their group IDs and rewards."""
        return cls(ids, rewards.scored().numpy(), rewards.combined.to(torch.float64).numpy())

    @classmethod
    def concat(cls, parts: Sequence[GroupRows]) -> GroupRows:
        """Parts merged by the rule: their rows end to end, in the order given (input order)."""
        if len(parts) == 1:
            return parts[0]
        return cls(
            np.concatenate([p.ids for p in parts]) if parts else np.zeros(0, np.int64),
            np.concatenate([p.scored for p in parts]) if parts else np.zeros(0, bool),
            np.concatenate([p.rewards for p in parts]) if parts else np.zeros(0, np.float64),
        )

    def columns(self) -> dict[str, np.ndarray]:
        """:data:`COLUMNS`, by name."""
        return {"scored": self.scored, "reward": self.rewards}

    @classmethod
    def of_columns(cls, ids: np.ndarray, columns: Mapping[str, np.ndarray]) -> GroupRows:
        """Rows shipped as :meth:`columns`, their groups given as ``ids``."""
        return cls(ids, columns["scored"], columns["reward"])


def counted_rewards(rewards: RewardBatch) -> RewardCounts:
    """The run's one figure of every row (:class:`~grpo_cli.run.reward_counts.RewardCounts`):
    a chunk's scored combined rewards counted, for the local engine's chunks and Ray's blocks."""
    valid = rewards.combined_valid
    return RewardCounts.of_rows(rewards.combined.numpy(), None if valid is None else valid.numpy())


def top_two_of(totals: Mapping[str, np.ndarray]) -> TopTwo | None:
    """The need ``top_two`` from the run's figure totals (``None`` where it is not wanted)."""
    if "top_first" not in totals:
        return None
    return TopTwoFigure._top_two(totals)


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
    TopTwoFigure(),
)
"""Every figure, in a fixed order: rows and unscorable rows per group, then those an estimator
needs: rows with a non-zero reward (GPG's alpha) and OPO's length sums, then the lowest and
highest step of each group where the run watches a step column (a group whose two differ
spans steps), then each group's top two rewards (grpo_passk)."""


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


def wanted(needs: Sequence[Need]) -> list[Figure]:
    """The figures a run with these estimator needs computes."""
    return [figure for figure in FIGURES if figure.need is None or figure.need in needs]


def of_chunk(figures: Sequence[Figure], ids: np.ndarray, k: int, rows: RowInputs) -> dict[str, np.ndarray]:
    """Each figure's per-group totals over one chunk's rows, by column, shape ``(k,)``."""
    out: dict[str, np.ndarray] = {}
    for figure in figures:
        out.update(figure.of_chunk(ids, k, rows))
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

    def __init__(self, figures: Sequence[Figure], *, block_rows: int) -> None:
        self.counts = [figure for figure in figures if figure.exact]  # counts, extremes, the top two
        self.sums = [figure for figure in figures if not figure.exact]
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

    def _fold(self, figures: Sequence[Figure], ids: np.ndarray, rows: RowInputs) -> None:
        low, high = int(ids.min()), int(ids.max())  # the rows' groups: few, for sorted input
        chunk = of_chunk(figures, ids - low if low else ids, high - low + 1, rows)
        for figure in figures:
            window = {}
            for column, (_, identity) in figure.columns.items():
                buffer = self._buffers.get(column)
                self._sizes[column] = max(self._sizes.get(column, 0), high + 1)
                if buffer is not None and column in self._handed_out:  # compute() gave a view of it
                    self._handed_out.discard(column)
                    buffer = buffer.copy()
                buffer = self._buffers[column] = room_for(
                    buffer, high + 1, fill=identity, dtype=chunk[column].dtype
                )
                window[column] = buffer[low : high + 1]
            # a group not seen before holds the rule's identity there (0 + a bincount's total is
            # the total: a bincount never sums to -0.0)
            merged = figure.merged(window, chunk)
            for column, at in window.items():
                at[...] = merged[column]


def padded(figures: Sequence[Figure], totals: Mapping[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """The totals of ``k`` groups, by column (a group seen in no chunk holds the identity)."""
    out = {}
    for figure in figures:
        for column, (dtype, identity) in figure.columns.items():
            values = totals.get(column)
            out[column] = (
                np.full(k, identity, dtype=dtype)
                if values is None
                else np.pad(values, (0, k - values.size), constant_values=identity)
            )
    return out
