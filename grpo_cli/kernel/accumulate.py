"""Turning chunks of rewards into group statistics: the update step, as left folds in a set order."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from grpo_cli.kernel.layout import _block_layout, _check_rewards, _Layout, _layout, _row_group_ids
from grpo_cli.kernel.stats import (
    GroupStats,
    RunningGroupStats,
    _assign,
    _concat_all,
    _pad,
    _scales,
    accumulator_dtype,
    empty_group_stats,
)


def group_stats(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    num_groups: int | None = None,
    *,
    group_size: int | None = None,
    valid: Tensor | None = None,
    count_extremes: bool = False,
) -> GroupStats:
    """Per-group sufficient statistics of one chunk of rewards (the *update* step).

    Args:
        rewards: floating tensor of shape ``(N,)``, or ``(P, G)`` grouped by row.
        group_ids: integer tensor of shape ``(N,)`` with values in ``[0, num_groups)``.
        num_groups: number of groups ``K``; defaults to ``max(group_ids) + 1``.
        group_size: with flat rewards and no ``group_ids``: consecutive blocks of this size.
        valid: optional bool tensor of the rewards' shape; ``False`` rows are left out of
            the statistics (used for NaN rewards under ``nan="ignore"``).
        count_extremes: also count the rollouts at each group's minimum and maximum
            (needed by ``baseline="leave-one-out"``).

    Returns:
        :class:`GroupStats` of shape ``(K,)`` in the accumulator dtype.

    NaN or infinite rewards are not checked here; callers validate first.

    >>> s = group_stats(torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1]))
    >>> s.count.tolist(), s.mean.tolist(), s.m2.tolist()
    ([2, 2], [2.0, 4.0], [2.0, 0.0])
    """
    _check_rewards(rewards, allow_nonfinite=True)
    flat, layout = _layout(rewards, group_ids, group_size)
    if num_groups is not None:
        if num_groups < layout.num_groups:
            raise ValueError(
                f"num_groups ({num_groups}) must exceed the largest group ID ({layout.num_groups - 1})"
            )
        if num_groups > layout.num_groups:  # padded with empty groups: no longer one block per group
            layout = _Layout(num_groups, _row_group_ids(layout, flat.device))
    valid_flat = None
    if valid is not None:
        if valid.shape != rewards.shape or valid.dtype != torch.bool:
            raise ValueError(
                f"valid must be a bool tensor of the rewards' shape {tuple(rewards.shape)}, "
                f"got {valid.dtype} of shape {tuple(valid.shape)}"
            )
        valid_flat = valid.reshape(-1)
    return _group_stats(flat, layout, valid_flat, count_extremes=count_extremes)


def _group_stats(flat: Tensor, layout: _Layout, valid: Tensor | None, *, count_extremes: bool) -> GroupStats:
    acc = accumulator_dtype(flat.device)
    k = layout.num_groups
    if layout.group_size is not None and layout.first_group == 0 and valid is None:
        g = layout.group_size
        rows = flat.view(k, g)  # widened to the accumulator dtype as _block_stats lays it out
        stats = _block_stats(rows, acc)
        if not count_extremes:
            return stats
        at_min, at_max = rows == stats.minimum[:, None], rows == stats.maximum[:, None]

        def but(at_extreme: Tensor) -> GroupStats:  # each row less its first rollout at the extreme
            if g == 1:
                return empty_group_stats(k, device=flat.device, dtype=acc)
            column = torch.arange(g, device=flat.device).expand(k, g)
            # a group holding a NaN has no row at its (NaN) extreme: its last row stands in,
            # keeping the shape; the caller refuses or leaves out such a group
            first = torch.where(at_extreme, column, g).amin(dim=1).clamp_(max=g - 1)
            return _block_stats(rows[column != first[:, None]].view(k, g - 1), acc)

        return replace(
            stats,
            at_minimum=at_min.sum(dim=1),
            at_maximum=at_max.sum(dim=1),
            but_max=but(at_max),
            but_min=but(at_min),
        )
    x = flat.to(acc)
    ids = _row_group_ids(layout, flat.device)
    if valid is not None:
        x, ids = x[valid], ids[valid]
    stats = _scatter_stats(x, ids, k)
    if not count_extremes:
        return stats
    at_min = x == torch.take(stats.minimum, ids)
    at_max = x == torch.take(stats.maximum, ids)
    zeros = torch.zeros(k, dtype=torch.int64, device=x.device)
    position = torch.arange(x.numel(), device=x.device)

    def scattered_but(at_extreme: Tensor) -> GroupStats:  # the rows less each group's first at the extreme
        first = torch.full((k,), x.numel(), dtype=torch.int64, device=x.device).scatter_reduce_(
            0, ids[at_extreme], position[at_extreme], "amin"
        )
        kept = position != torch.take(first, ids)
        return _scatter_stats(x[kept], ids[kept], k)

    return replace(
        stats,
        at_minimum=zeros.index_add(0, ids, at_min.to(torch.int64)),
        at_maximum=zeros.index_add(0, ids, at_max.to(torch.int64)),
        but_max=scattered_but(at_max),
        but_min=scattered_but(at_min),
    )


LEFT_FOLD_COLUMNS = 64
"""Groups of at most this many rollouts side by side are summed column by column (a few
vectorised adds); larger ones take the scatter path, whose sums are the same left fold."""


CPU_SLICE_ROWS = 1 << 18
"""Rows of a ``(K, G)`` block reduced at once on the CPU. A group's statistics depend on its own
rows alone, so slices of groups give the same bits as the whole block, and their temporaries
(several float64 copies of the rows, 2 MiB each) are reused from slice to slice: a block of 4M
rows taken whole made some 200 MB of them, fresh pages the process then held. Smaller slices
(64K rows here, 128K in pass 2) took no less memory and 5% longer on the 10M-row sorted file."""


def _block_stats(x: Tensor, dtype: torch.dtype | None = None) -> GroupStats:
    """Statistics of a ``(K, G)`` matrix whose rows are the groups, bit for bit those of
    :func:`_scatter_stats` over the same rows: every sum is a left fold from ``+0.0`` over
    the group's rollouts in row order, and the formulas are the same. So a group's statistics
    never depend on which path a chunk takes (consecutive blocks here, IDs there), nor on the
    other groups in the chunk: the Ray engine, which sees a chunk's groups apart, relies on it,
    and on the CPU a large block is reduced a slice of groups at a time (:data:`CPU_SLICE_ROWS`).

    ``dtype``: the statistics' (default ``x``'s); ``x`` is widened to it exactly.
    """
    k, g = x.shape
    dtype = x.dtype if dtype is None else dtype
    if g > LEFT_FOLD_COLUMNS:
        ids = torch.arange(k, device=x.device).repeat_interleave(g)
        return _scatter_stats(x.reshape(-1).to(dtype), ids, k)
    per_slice = max(1, CPU_SLICE_ROWS // max(g, 1))
    if x.device.type != "cpu" or k <= per_slice:
        return _columns_stats(x, dtype)
    stats = GroupStats(
        torch.empty(k, dtype=torch.int64),
        torch.empty(k, dtype=dtype),
        torch.empty(k, dtype=dtype),
        torch.empty(k, dtype=dtype),
        torch.empty(k, dtype=dtype),
    )
    for start in range(0, k, per_slice):
        stop = min(k, start + per_slice)
        _assign(stats.groups(start, stop), _columns_stats(x[start:stop], dtype))
    return stats


def _columns_stats(x: Tensor, dtype: torch.dtype) -> GroupStats:
    """:func:`_block_stats` of ``x`` (``(K, G)``, ``G`` at most :data:`LEFT_FOLD_COLUMNS`) at once."""
    k, g = x.shape
    count = torch.full((k,), g, dtype=torch.int64, device=x.device)
    minimum, maximum = (extreme.to(dtype) for extreme in x.aminmax(dim=1))
    scale = _scales(minimum, maximum)
    # (G, K): each rollout position's values side by side, widened in the same pass (a
    # transposing copy from float32 is some five times faster than widening first)
    columns = torch.empty((g, k), dtype=dtype, device=x.device).copy_(x.t())
    if scale is not None:
        columns = columns / scale
    size = count.to(dtype)

    def group_sum(values: Tensor) -> Tensor:
        total = torch.zeros(k, dtype=dtype, device=x.device)
        for column in values:
            total.add_(column)  # in place: the same additions, no tensor per column
        return total

    mean = group_sum(columns) / size
    deviation = columns - mean
    deviation_sum = group_sum(deviation)
    correction = deviation_sum / size
    m2 = (group_sum(deviation * deviation) - correction * deviation_sum).clamp_min(0)
    mean = mean + correction
    if scale is not None:
        mean = mean * scale
    return GroupStats(count, mean, m2, minimum, maximum)


class _LeftFold:
    """Per-group sums of rows in any order, each a left fold from ``+0.0`` over the group's rows
    in row order, on any device: so a group's sums are the same bits on the CPU and a GPU.

    On the CPU a one-dimensional ``scatter_add_`` runs serially in row order, which is that fold.
    Elsewhere it adds with atomics in no set order, so the rows are taken in rounds: round ``r``
    adds each group's ``r``-th row (one row per group, so no two adds meet), in as many rounds as
    the largest group has rows.

    >>> ids = torch.tensor([1, 0, 1, 1])
    >>> _LeftFold(ids, 2, serial=False).sum(torch.tensor([0.1, 5.0, 0.2, 0.3], dtype=torch.float64)).tolist()
    [5.0, 0.6000000000000001]
    """

    def __init__(self, ids: Tensor, k: int, *, serial: bool | None = None) -> None:
        self.ids, self.k = ids, k
        self.serial = ids.device.type == "cpu" if serial is None else serial
        self.rounds: list[tuple[Tensor, Tensor]] = []
        if self.serial or not ids.numel():
            return
        order = torch.argsort(ids, stable=True)  # by group, each group's rows in row order
        counts = torch.bincount(ids, minlength=k)
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.empty_like(order)
        rank[order] = torch.arange(ids.numel(), device=ids.device) - torch.take(starts, ids[order])
        by_rank = torch.argsort(rank, stable=True)
        per_round = torch.bincount(rank, minlength=int(counts.max())).tolist()  # one sync per chunk
        rows = torch.split(by_rank, per_round)
        self.rounds = [(row, torch.take(ids, row)) for row in rows]

    def sum(self, values: Tensor) -> Tensor:
        total = torch.zeros(self.k, dtype=values.dtype, device=values.device)
        if self.serial:
            return total.scatter_add_(0, self.ids, values)
        for rows, groups in self.rounds:
            total.index_add_(0, groups, torch.take(values, rows))
        return total


SIDE_BY_SIDE_MIN_ROWS = 1 << 16
"""The rows from which :func:`_side_by_side` runs its two operations on two threads."""


def _side_by_side(
    first: Callable[[], Tensor], second: Callable[[], Tensor], rows: Tensor
) -> tuple[Tensor, Tensor]:
    """``first()`` and ``second()``, two independent operations over ``rows``: the first on a
    thread of its own where both would run on one core each (torch's one-dimensional CPU
    scatters are serial: the min and max, and the left folds), so they take about the time of
    one. The results are the same bits either way. Serial where torch has one thread (the
    user's ``OMP_NUM_THREADS=1``), on other devices, and for fewer than
    :data:`SIDE_BY_SIDE_MIN_ROWS` rows. A new thread each call (some 100 us against the
    milliseconds saved), so that no pool outlives a ``fork()``.

    >>> _side_by_side(lambda: torch.ones(2), lambda: torch.zeros(2), torch.ones(2))
    (tensor([1., 1.]), tensor([0., 0.]))
    """
    if rows.device.type != "cpu" or rows.numel() < SIDE_BY_SIDE_MIN_ROWS or torch.get_num_threads() < 2:
        return first(), second()
    outcome: list[Tensor | BaseException] = []

    def run_first() -> None:
        try:
            outcome.append(first())
        except BaseException as exc:  # re-raised on the caller's thread
            outcome.append(exc)

    helper = threading.Thread(target=run_first, name="grpo-cli-kernel", daemon=True)
    helper.start()
    try:
        second_result = second()
    finally:
        helper.join()  # also where second() failed: never left running
    (first_result,) = outcome
    if isinstance(first_result, BaseException):
        raise first_result
    return first_result, second_result


def _scatter_stats(x: Tensor, ids: Tensor, k: int) -> GroupStats:
    """Statistics of rows ``x`` with group IDs ``ids`` in ``[0, k)``, in any order.

    Each group's sums are a left fold over its rollouts in row order (:class:`_LeftFold`), so
    they do not depend on thread scheduling, the device, or the other groups of the chunk.
    """
    minimum, maximum = _side_by_side(
        lambda: torch.full((k,), math.inf, dtype=x.dtype, device=x.device).scatter_reduce_(0, ids, x, "amin"),
        lambda: torch.full((k,), -math.inf, dtype=x.dtype, device=x.device).scatter_reduce_(
            0, ids, x, "amax"
        ),
        x,
    )
    scale = _scales(minimum, maximum)
    if scale is not None:
        x = x / torch.take(scale, ids)
    group_sum = _LeftFold(ids, k).sum
    total, count = _side_by_side(lambda: group_sum(x), lambda: torch.bincount(ids, minlength=k), x)
    safe_count = count.clamp_min(1).to(x.dtype)
    mean = total / safe_count
    deviation = x - torch.take(mean, ids)
    # Corrected two-pass (Chan, Golub & LeVeque 1983): the sum of deviations removes
    # the rounding error left in the first-pass mean.
    deviation_sum, square_sum = _side_by_side(
        lambda: group_sum(deviation), lambda: group_sum(deviation * deviation), x
    )
    correction = deviation_sum / safe_count
    m2 = (square_sum - correction * deviation_sum).clamp_min(0)
    mean = mean + correction
    if scale is not None:
        mean = mean * scale
    return GroupStats(count, mean, m2, minimum, maximum)


class GroupStatsAccumulator:
    """Streaming *update* / *compute*: feed chunks in row order, get :class:`GroupStats`.

    Rows are cut into statistics blocks at fixed global row positions (multiples of
    ``block_rows``), whatever the sizes of the chunks fed in. Each block goes through
    :func:`group_stats` and the blocks are combined with :func:`merge_group_stats`, so
    the result depends only on the rows and their order: a file read in one piece and
    the same rows streamed in many small batches give bitwise identical statistics. With
    ``group_size``, a group across a block's edge is cut there as IDs would cut it, so the
    statistics are bit for bit those of the same rows given IDs ``row // group_size``.

    Args:
        device: where the statistics live.
        block_rows: rows per statistics block (bounds the memory of one update).
        group_size: rows are consecutive groups of this size (no IDs are passed).
        count_extremes: also count rollouts at each group's min and max.
        expected_rows: the rows it will be fed in all, where known: once a block's groups
            all follow the groups before it (sorted input), the statistics' storage is sized
            at once for as many groups per row as came so far, where it grew by half as groups
            came (the same statistics; less memory held while they are copied to a larger
            storage).

    >>> acc = GroupStatsAccumulator(block_rows=3)
    >>> acc.update(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    >>> acc.update(torch.tensor([4.0, 4.0, 5.0]), torch.tensor([1, 1, 0]))
    >>> stats = acc.compute()
    >>> stats.count.tolist(), stats.mean.tolist()
    ([3, 2], [3.0, 4.0])
    """

    def __init__(
        self,
        *,
        device: torch.device | str = "cpu",
        block_rows: int = 1 << 22,
        group_size: int | None = None,
        count_extremes: bool = False,
        expected_rows: int | None = None,
    ) -> None:
        if block_rows < 1:
            raise ValueError(f"block_rows must be positive, got {block_rows}")
        if group_size is not None and group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        self.device = torch.device(device)
        self.block_rows = block_rows
        self.group_size = group_size
        self.count_extremes = count_extremes
        self.expected_rows = expected_rows
        self.rows_seen = 0
        self._pending: list[_Piece] = []
        self._pending_rows = 0
        self._running = RunningGroupStats()

    def update(self, rewards: Tensor, group_ids: Tensor | None = None, valid: Tensor | None = None) -> None:
        """Add a chunk of 1-D rewards (with their group IDs unless ``group_size`` was set)."""
        if (group_ids is None) != (self.group_size is not None):
            raise ValueError("pass group_ids exactly when the accumulator has no group_size")
        n = rewards.numel()
        if n == 0:
            return
        self._pending.append((rewards.reshape(-1), group_ids, valid))
        self._pending_rows += n
        while self._pending_rows >= self.block_rows:
            self._flush(self.block_rows)

    def compute(self, num_groups: int | None = None) -> GroupStats:
        """Statistics of every row fed so far, padded to ``num_groups`` groups if given."""
        rows = self.rows_seen + self._pending_rows
        if self.group_size is not None and rows % self.group_size:
            raise ValueError(
                f"the number of rows ({rows}) is not divisible by group_size ({self.group_size})"
            )
        if self._pending_rows:
            self._flush(self._pending_rows)
        stats = self._running.stats() or empty_group_stats(
            0, device=self.device, count_extremes=self.count_extremes
        )
        if num_groups is not None:
            if num_groups < stats.num_groups:
                raise ValueError(f"num_groups ({num_groups}) is below the groups seen ({stats.num_groups})")
            stats = _pad(stats, num_groups)
        return stats

    def _flush(self, rows: int) -> None:
        head, self._pending = _cut(self._pending, rows)
        self._pending_rows -= rows
        if self.group_size is None and len(head) > 1:
            pieces = []
            for r, i, v in head:
                assert i is not None  # fed with IDs: no group size
                pieces.append((r, i.to(self.device, torch.int64), v))
            bounds = [_id_bounds(i) for _, i, _ in pieces]
            if _one_after_another(bounds):
                # each group's rows lie in one piece, and a group's statistics are its own:
                # the block's statistics are its pieces', without joining them into one
                for (r, piece_ids, v), piece_bounds in zip(pieces, bounds, strict=True):
                    low, layout = _id_layout(piece_ids, piece_bounds)
                    stats = _group_stats(
                        r.to(self.device), layout, self._on_device(v), count_extremes=self.count_extremes
                    )
                    self.rows_seen += r.numel()
                    self._merge(stats, low)
                return
        rewards = _joined([r for r, _, _ in head])
        ids = None if self.group_size is not None else _joined([i for _, i, _ in head if i is not None])
        valid = None
        if any(v is not None for _, _, v in head):
            valid = _joined(
                [v if v is not None else torch.ones_like(r, dtype=torch.bool) for r, _, v in head]
            )
        block, first_group = self._block_stats(rewards.to(self.device), ids, valid)
        self.rows_seen += rows
        self._merge(block, first_group)

    def _merge(self, block: GroupStats, first_group: int) -> None:
        """Merge a block of the rows seen so far (counted in ``rows_seen``) into the running statistics."""
        room = None
        seen = self._running.size
        if self.expected_rows is not None and seen and first_group >= seen:
            # the block's groups all follow those seen before it (none of a shuffled file's blocks
            # past its first does): make room for as many groups per row in the rows to come
            end = first_group + block.num_groups
            room = -(-end * max(self.expected_rows, self.rows_seen) // self.rows_seen)
        self._running.merge_at(block, first_group, room=room)

    def _on_device(self, values: Tensor | None, dtype: torch.dtype | None = None) -> Tensor | None:
        return None if values is None else values.to(self.device, dtype)

    def _block_stats(
        self, rewards: Tensor, ids: Tensor | None, valid: Tensor | None
    ) -> tuple[GroupStats, int]:
        """A block's statistics over the groups from its lowest ID to its highest, and that
        lowest ID."""
        valid = self._on_device(valid)
        if self.group_size is not None:
            return self._consecutive_block_stats(rewards, valid), self.rows_seen // self.group_size
        ids = self._on_device(ids, torch.int64)
        assert ids is not None
        low, layout = _id_layout(ids, _id_bounds(ids))
        return _group_stats(rewards, layout, valid, count_extremes=self.count_extremes), low

    def _consecutive_block_stats(self, rewards: Tensor, valid: Tensor | None) -> GroupStats:
        """A block of consecutive groups of ``group_size``, from its first group on: a group
        across the block's edge is cut there, as IDs cut it (its rows in this block are one
        group of their own); the whole groups between go the fixed-size path, which gives a
        group the bits the IDs path would."""
        g, n = self.group_size, rewards.numel()
        assert g is not None
        head = min(n, -self.rows_seen % g)  # the end of a group begun in the block before
        whole = (n - head) // g * g
        pieces = [(0, head, 1), (head, head + whole, whole // g), (head + whole, n, 1)]
        return _concat_all(
            [
                _group_stats(
                    rewards[start:stop],
                    _Layout(groups, group_size=(stop - start) // groups),
                    None if valid is None else valid[start:stop],
                    count_extremes=self.count_extremes,
                )
                for start, stop, groups in pieces
                if stop > start
            ]
        )


_Piece = tuple[Tensor, Tensor | None, Tensor | None]  # rewards, group IDs, validity


def _cut(pieces: list[_Piece], rows: int) -> tuple[list[_Piece], list[_Piece]]:
    """The first ``rows`` rows of ``pieces`` and the rest, each a list of pieces (views, not copies)."""
    for at, piece in enumerate(pieces):
        n = piece[0].numel()
        if n > rows:
            head = [*pieces[:at], _part(piece, slice(None, rows))] if rows else pieces[:at]
            return head, [_part(piece, slice(rows, None)), *pieces[at + 1 :]]
        rows -= n
    return list(pieces), []


def _part(piece: _Piece, rows: slice) -> _Piece:
    rewards, ids, valid = piece
    return rewards[rows], None if ids is None else ids[rows], None if valid is None else valid[rows]


def _id_bounds(ids: Tensor) -> tuple[int, int, int | None]:
    """The lowest and highest of a block's group IDs (int64), and the size of its groups where
    they come in equal blocks one after another (sorted input), else ``None``; the IDs are not
    copied."""
    blocks = _block_layout(ids)
    if blocks is not None:
        return blocks.first_group, blocks.num_groups - 1, blocks.group_size
    low, high = (int(v) for v in ids.aminmax())
    return low, high, None


def _one_after_another(bounds: Sequence[tuple[int, int, int | None]]) -> bool:
    """Whether each piece's groups (``bounds``, of :func:`_id_bounds`) lie above every group of
    the piece before: no group has rows in two pieces."""
    highs, lows = [high for _, high, _ in bounds[:-1]], [low for low, _, _ in bounds[1:]]
    return all(high < low for high, low in zip(highs, lows, strict=True))


def _id_layout(ids: Tensor, bounds: tuple[int, int, int | None]) -> tuple[int, _Layout]:
    """A block's groups from its lowest ID to its highest (``bounds``, of :func:`_id_bounds`),
    as a layout, and that lowest ID: a block of a few groups among millions (sorted or grouped
    input) is reduced and merged over its own groups only."""
    low, high, size = bounds
    if size is not None:
        return low, _Layout(high - low + 1, group_size=size)
    return low, _Layout(high - low + 1, group_ids=ids - low if low else ids)


def _joined(pieces: Sequence[Tensor]) -> Tensor:
    """``pieces`` end to end: the one piece itself, uncopied, where there is one."""
    return pieces[0] if len(pieces) == 1 else torch.cat(list(pieces))
