"""Per-group sufficient statistics (:class:`GroupStats`), their scales, their merge (Chan et
al.) and the active mask."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import Tensor

from grpo_cli.choices import Singleton, check_choice
from grpo_cli.kernel.exact import sqrt_rn


@dataclass(frozen=True)
class GroupStats:
    """Per-group sufficient statistics, all of shape ``(num_groups,)``.

    ``count`` is int64; ``mean``, ``m2`` (sum of squared deviations from the mean, in
    units of ``group_scale(stats) ** 2``: see :func:`group_scale`; for rewards of ordinary
    magnitude the scale is 1), ``minimum`` and ``maximum`` are in the accumulator dtype
    (float64, or float32 on MPS). An empty group has count 0, mean 0, m2 0, minimum ``+inf`` and maximum
    ``-inf``. Rewards of float16, bfloat16 and float32 convert to float64 exactly, so
    ``minimum`` and ``maximum`` hold the original values.

    ``at_minimum`` and ``at_maximum`` (int64, optional) count the rollouts equal to the
    minimum and the maximum: the leave-one-out baseline needs them to know exactly when
    the *other* rollouts of a group are all identical. ``but_max`` and ``but_min`` (optional,
    with them) are the statistics of each group without its first rollout at the maximum
    (the minimum), in row order: the others of a lone extreme, whose spread the reverse
    update cannot take from ``m2`` where that rollout dominates it (``[1, 1, 1.0000001,
    100]``: the others' M2, about 7e-15, is below the rounding of the group's, about 7350).
    """

    count: Tensor
    mean: Tensor
    m2: Tensor
    minimum: Tensor
    maximum: Tensor
    at_minimum: Tensor | None = None
    at_maximum: Tensor | None = None
    but_max: GroupStats | None = None
    but_min: GroupStats | None = None

    @property
    def num_groups(self) -> int:
        return int(self.count.shape[0])

    def to(self, device: torch.device | str) -> GroupStats:
        """Move every statistic to ``device``."""
        return self._map(lambda t: t.to(device))

    def groups(self, start: int, end: int) -> GroupStats:
        """The statistics of groups ``start`` to ``end - 1`` (views: nothing is copied)."""
        return self._map(lambda t: t[start:end])

    def _map(self, fn: Callable[[Tensor], Tensor]) -> GroupStats:
        return GroupStats(
            fn(self.count),
            fn(self.mean),
            fn(self.m2),
            fn(self.minimum),
            fn(self.maximum),
            None if self.at_minimum is None else fn(self.at_minimum),
            None if self.at_maximum is None else fn(self.at_maximum),
            None if self.but_max is None else self.but_max._map(fn),
            None if self.but_min is None else self.but_min._map(fn),
        )

    FIELDS: ClassVar[tuple[str, ...]] = (
        "count",
        "mean",
        "m2",
        "minimum",
        "maximum",
        "at_minimum",
        "at_maximum",
    )
    """Every statistic, in order; the last two are optional (``count_extremes``, which also
    brings :attr:`LEAVE_OUTS`)."""

    LEAVE_OUTS: ClassVar[tuple[str, ...]] = ("but_max", "but_min")
    """The statistics without a lone extreme, each a :class:`GroupStats` (``count_extremes``)."""

    @property
    def counts_extremes(self) -> bool:
        """Whether ``at_minimum`` and ``at_maximum`` are present."""
        return self.at_minimum is not None and self.at_maximum is not None

    def to_columns(self, prefix: str = "") -> dict[str, Tensor]:
        """Each statistic present, keyed ``prefix + name`` (for a table of partial statistics).

        >>> from grpo_cli.kernel import group_stats
        >>> stats = group_stats(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
        >>> sorted(stats.to_columns("s_"))
        ['s_count', 's_m2', 's_maximum', 's_mean', 's_minimum']
        >>> GroupStats.from_columns(stats.to_columns("s_"), "s_") == stats
        True
        """
        columns = {}
        for name in self.FIELDS:
            value = getattr(self, name)
            if value is not None:
                columns[prefix + name] = value
        for name in self.LEAVE_OUTS:
            nested: GroupStats | None = getattr(self, name)
            if nested is not None:
                columns.update(nested.to_columns(f"{prefix}{name}_"))
        return columns

    @classmethod
    def from_columns(cls, columns: Mapping[str, Tensor], prefix: str = "") -> GroupStats:
        """The inverse of :meth:`to_columns`; the extreme counts are read when present."""
        optional = cls.FIELDS[5:]
        values: dict[str, Any] = {
            name: columns[prefix + name]
            for name in cls.FIELDS
            if name not in optional or prefix + name in columns
        }
        for name in cls.LEAVE_OUTS:
            if f"{prefix}{name}_count" in columns:
                values[name] = cls.from_columns(columns, f"{prefix}{name}_")
        return cls(**values)

    def select(self, groups: Tensor) -> GroupStats:
        """The statistics of some groups: ``groups`` is a bool mask or an index tensor."""
        return self._map(lambda t: t[groups.to(t.device)])

    def without_extremes(self) -> GroupStats:
        """The same statistics without ``at_minimum``, ``at_maximum`` and the leave-outs."""
        return replace(self, at_minimum=None, at_maximum=None, but_max=None, but_min=None)

    def placed(self, group_ids: Tensor, num_groups: int) -> GroupStats:
        """Statistics for ``num_groups`` groups: entry ``i`` of these at group ``group_ids[i]``.

        The other groups are empty, so partial statistics of different groups placed
        this way merge with :func:`merge_group_stats`. ``group_ids`` must not repeat.

        >>> from grpo_cli.kernel import group_stats
        >>> part = group_stats(torch.tensor([5.0, 7.0]), torch.tensor([0, 0]))
        >>> part.placed(torch.tensor([2]), 3).count
        tensor([0, 0, 2])
        """
        out = empty_group_stats(
            num_groups, device=self.count.device, dtype=self.mean.dtype, count_extremes=self.counts_extremes
        )

        def put(target: Tensor | None, values: Tensor | None) -> Tensor | None:
            if target is None or values is None:
                return None
            return target.index_copy(0, group_ids, values.to(target.dtype))

        def nested(stats: GroupStats | None) -> GroupStats | None:
            return None if stats is None else stats.placed(group_ids, num_groups)

        return GroupStats(
            **{name: put(getattr(out, name), getattr(self, name)) for name in self.FIELDS},  # type: ignore[arg-type]
            but_max=nested(self.but_max),
            but_min=nested(self.but_min),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GroupStats):
            return NotImplemented
        mine, theirs = self.to_columns(), other.to_columns()
        return mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def accumulator_dtype(device: torch.device) -> torch.dtype:
    """The dtype statistics accumulate in on ``device``: float64, or float32 on MPS.

    >>> accumulator_dtype(torch.device("cpu"))
    torch.float64
    """
    return torch.float32 if device.type == "mps" else torch.float64


def _scales(minimum: Tensor, maximum: Tensor) -> Tensor | None:
    """Per-group powers of two that bring each group's largest magnitude into [1, 2).

    ``None`` when every group has scale 1: rewards in ``[2**-L, 2**L)`` with
    ``L = maxexp / 4`` (256 in float64), zeros and empty groups. Squares of scaled
    deviations then neither overflow nor underflow, and scaling by a power of two is
    exact, so results for ordinary rewards are bitwise those of unscaled arithmetic.
    """
    if minimum.numel() == 0:
        return None
    maxexp = math.frexp(torch.finfo(minimum.dtype).max)[1]  # 1024 for float64, 128 for float32
    limit = maxexp // 4
    magnitude = torch.maximum(minimum.abs(), maximum.abs())
    # the test below, by comparisons alone (frexp is several times slower): most runs stop here
    tiny = (magnitude > 0) & (magnitude < 2.0**-limit)
    if not bool((tiny | ((magnitude >= 2.0**limit) & (magnitude < math.inf))).any()):
        return None
    _, exponent = torch.frexp(magnitude)  # magnitude = m * 2**exponent, m in [0.5, 1)
    ordinary = (magnitude == 0) | ~torch.isfinite(magnitude) | ((exponent > -limit) & (exponent <= limit))
    if bool(ordinary.all()):
        return None
    exponent = (exponent - 1).clamp(min=-(maxexp * 7 // 8), max=maxexp - 1)
    scale = torch.ldexp(torch.ones_like(magnitude), exponent)
    return torch.where(ordinary, torch.ones_like(scale), scale)


def group_scale(stats: GroupStats) -> Tensor:
    """The power of two per group that ``stats.m2`` is expressed in (``m2 / scale**2``).

    1 for rewards of ordinary magnitude (the largest in [2**-256, 2**256) in float64);
    for a group of rewards near 1e300 or 1e-300 it brings the largest magnitude into
    [1, 2). It is never below 2**-896 (float64), so that its reciprocal stays finite.

    >>> from grpo_cli.kernel import group_stats
    >>> rewards = torch.tensor([1.0, 2.0, 1e300, 3e300], dtype=torch.float64)
    >>> group_scale(group_stats(rewards, torch.tensor([0, 0, 1, 1])))
    tensor([ 1.0000e+00, 2.6788e+300], dtype=torch.float64)
    """
    scale = _scales(stats.minimum, stats.maximum)
    return torch.ones_like(stats.mean) if scale is None else scale


def group_scales(stats: GroupStats) -> Tensor | None:
    """:func:`group_scale`, or ``None`` where every group's scale is 1 (no tensor made).

    >>> from grpo_cli.kernel import group_stats
    >>> group_scales(group_stats(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([0, 1]))) is None
    True
    """
    return _scales(stats.minimum, stats.maximum)


def group_std(stats: GroupStats, *, ddof: int = 0) -> Tensor:
    """Per-group standard deviation (``ddof=1``: Bessel-corrected), in reward units.

    >>> from grpo_cli.kernel import group_stats
    >>> rewards = torch.tensor([1.0, 3.0, 1e300, 3e300], dtype=torch.float64)
    >>> group_std(group_stats(rewards, torch.tensor([0, 0, 1, 1])))
    tensor([ 1.0000e+00, 1.0000e+300], dtype=torch.float64)
    """
    dof = (stats.count - ddof).clamp_min(1).to(stats.m2.dtype)
    return sqrt_rn(stats.m2 / dof) * group_scale(stats)


def empty_group_stats(
    num_groups: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    count_extremes: bool = False,
) -> GroupStats:
    """Statistics of ``num_groups`` groups that have seen no rollouts (the merge identity).

    >>> empty_group_stats(2).count
    tensor([0, 0])
    """
    device = torch.device(device)
    acc = dtype or accumulator_dtype(device)
    return GroupStats(
        count=torch.zeros(num_groups, dtype=torch.int64, device=device),
        mean=torch.zeros(num_groups, dtype=acc, device=device),
        m2=torch.zeros(num_groups, dtype=acc, device=device),
        minimum=torch.full((num_groups,), math.inf, dtype=acc, device=device),
        maximum=torch.full((num_groups,), -math.inf, dtype=acc, device=device),
        at_minimum=torch.zeros(num_groups, dtype=torch.int64, device=device) if count_extremes else None,
        at_maximum=torch.zeros(num_groups, dtype=torch.int64, device=device) if count_extremes else None,
        but_max=empty_group_stats(num_groups, device=device, dtype=acc) if count_extremes else None,
        but_min=empty_group_stats(num_groups, device=device, dtype=acc) if count_extremes else None,
    )


def merge_group_stats(a: GroupStats, b: GroupStats) -> GroupStats:
    """Combine the statistics of two disjoint sets of rollouts (the *merge* step).

    Groups are matched by position; the shorter input is padded with empty groups.
    The merge is Chan et al.'s pairwise update, so no precision is lost to
    cancellation, and merging with an empty group returns the other side exactly.

    >>> from grpo_cli.kernel import group_stats
    >>> left = group_stats(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    >>> right = group_stats(torch.tensor([5.0, 4.0]), torch.tensor([0, 1]))
    >>> both = merge_group_stats(left, right)
    >>> both.count.tolist(), both.mean.tolist(), both.m2.tolist()
    ([3, 1], [3.0, 4.0], [8.0, 0.0])
    """
    k = max(a.num_groups, b.num_groups)
    a, b = _pad(a, k), _pad(b, k)
    minimum, maximum = torch.minimum(a.minimum, b.minimum), torch.maximum(a.maximum, b.maximum)
    count = a.count + b.count
    na = a.count.to(a.mean.dtype)
    nb = b.count.to(a.mean.dtype)
    n = count.clamp_min(1).to(a.mean.dtype)
    scale = _scales(minimum, maximum)
    if scale is None and _scales(a.minimum, a.maximum) is None and _scales(b.minimum, b.maximum) is None:
        delta = b.mean - a.mean
        mean = a.mean + delta * (nb / n)
        m2_a, m2_b = a.m2, b.m2
    else:  # in units of the merged group's scale: each side's m2 rescaled exactly
        scale = torch.ones_like(a.mean) if scale is None else scale
        ratio_a, ratio_b = group_scale(a) / scale, group_scale(b) / scale
        mean_a, mean_b = a.mean / scale, b.mean / scale
        delta = mean_b - mean_a
        mean = (mean_a + delta * (nb / n)) * scale
        m2_a, m2_b = a.m2 * ratio_a * ratio_a, b.m2 * ratio_b * ratio_b
    m2 = m2_a + m2_b + delta * delta * (na * nb / n)
    a_empty, b_empty = a.count == 0, b.count == 0
    mean = torch.where(a_empty, b.mean, torch.where(b_empty, a.mean, mean))
    m2 = torch.where(a_empty, m2_b, torch.where(b_empty, m2_a, m2))
    at_minimum = at_maximum = None
    if a.at_minimum is not None and b.at_minimum is not None:
        at_minimum = _merge_extreme_count(a.minimum, a.at_minimum, b.minimum, b.at_minimum)
    if a.at_maximum is not None and b.at_maximum is not None:
        at_maximum = _merge_extreme_count(-a.maximum, a.at_maximum, -b.maximum, b.at_maximum)
    but_max = but_min = None
    if a.but_max is not None and b.but_max is not None:
        but_max = _merge_leave_out(a, a.but_max, b, b.but_max, b.maximum > a.maximum)
    if a.but_min is not None and b.but_min is not None:
        but_min = _merge_leave_out(a, a.but_min, b, b.but_min, b.minimum < a.minimum)
    return GroupStats(count, mean, m2, minimum, maximum, at_minimum, at_maximum, but_max, but_min)


def _merge_leave_out(
    a: GroupStats, a_but: GroupStats, b: GroupStats, b_but: GroupStats, left_out_in_b: Tensor
) -> GroupStats:
    """The statistics of the union of ``a`` (earlier rows) and ``b`` (later rows) without the
    first rollout at its extreme: where that rollout lies in ``b`` (``left_out_in_b``: ``b``'s
    extreme beats ``a``'s strictly, so a tie keeps the earlier one), all of ``a`` with ``b``
    less it, else ``a`` less it with all of ``b``. Every side is a Chan merge of disjoint sets."""
    with_b_left_out = merge_group_stats(a.without_extremes(), b_but)
    with_a_left_out = merge_group_stats(a_but, b.without_extremes())
    return GroupStats.from_columns(
        {
            name: torch.where(left_out_in_b, value, with_a_left_out.to_columns()[name])
            for name, value in with_b_left_out.to_columns().items()
        }
    )


def _merge_extreme_count(a_value: Tensor, a_count: Tensor, b_value: Tensor, b_count: Tensor) -> Tensor:
    """How many rollouts sit at the smaller of two minima."""
    return torch.where(a_value < b_value, a_count, torch.where(b_value < a_value, b_count, a_count + b_count))


def _pad(stats: GroupStats, k: int) -> GroupStats:
    if stats.num_groups == k:
        return stats
    extra = empty_group_stats(
        k - stats.num_groups,
        device=stats.mean.device,
        dtype=stats.mean.dtype,
        count_extremes=stats.at_minimum is not None,
    )
    return _concat_stats(stats, extra)


class RunningGroupStats:
    """Statistics of the groups seen so far, grown in place: each block's statistics merged
    bit for bit as ``merge_group_stats(stats, block placed among all the groups)`` (merging
    with an empty group returns the other side exactly), but only where the block holds
    groups. The groups live at the front of tensors whose capacity grows by half, so a run of
    many blocks copies each group a bounded number of times (twice on average), where merging
    every block over all the groups so far (or concatenating onto them) costs every group per
    block: quadratic in the blocks. Growing by half, not doubling, leaves less room unused and
    less to hold while the groups are copied: the 10M-row sorted file's 1.25M groups took
    capacity for 2M at 40 bytes each, and its peak was 22 MiB higher.

    >>> from grpo_cli.kernel import group_stats
    >>> a = group_stats(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 1, 1]))
    >>> b = group_stats(torch.tensor([7.0, 2.0]), torch.tensor([0, 1]))
    >>> running = RunningGroupStats()
    >>> running.merge_at(a, 0); running.merge_at(b, 1)
    >>> running.stats().count.tolist(), running.stats().mean.tolist()
    ([1, 3, 1], [1.0, 5.0, 2.0])
    >>> running.stats() == merge_group_stats(a, b.placed(torch.tensor([1, 2]), 3))
    True
    >>> running.merge_rows(b, torch.tensor([3, 0]), 4)  # b's groups are groups 3 and 0
    >>> running.stats().count.tolist()
    [2, 3, 1, 1]
    """

    def __init__(self) -> None:
        self._storage: GroupStats | None = None  # capacity groups, the first `size` seen
        self.size = 0
        self._handed_out = False  # stats() gave views: the next merge writes to a new storage

    def merge_at(self, block: GroupStats, first_group: int, *, room: int | None = None) -> None:
        """Merge ``block``, the statistics of groups ``first_group`` onwards; ``room``: the
        groups to make room for, if the storage must grow (where the caller can tell how many
        will come; by default, half as many again as it holds)."""
        end = first_group + block.num_groups
        storage = self._grown(block, end, room)
        overlap = max(0, min(self.size, end) - first_group)
        if overlap:
            seen = storage.groups(first_group, first_group + overlap)
            _assign(seen, merge_group_stats(seen, block.groups(0, overlap)))
        # beyond the groups seen the storage holds empty groups: the block's own figures go there
        _assign(storage.groups(first_group + overlap, end), block.groups(overlap, block.num_groups))
        self.size = max(self.size, end)

    def merge_rows(self, block: GroupStats, group_ids: Tensor, num_groups: int) -> None:
        """Merge ``block``, whose entry ``i`` holds group ``group_ids[i]`` (int64, no repeats,
        each below ``num_groups``, the groups seen once it is merged)."""
        storage = self._grown(block, max(num_groups, self.size))
        group_ids = group_ids.to(storage.count.device)
        seen = group_ids < self.size
        if bool(seen.any()):
            at = group_ids[seen]
            merged = merge_group_stats(storage._map(lambda t: t[at]), block._map(lambda t: t[seen]))
            _assign_rows(storage, at, merged)
        fresh = ~seen
        if bool(fresh.any()):
            _assign_rows(storage, group_ids[fresh], block._map(lambda t: t[fresh]))
        self.size = max(self.size, num_groups)

    def _grown(self, block: GroupStats, groups: int, room: int | None = None) -> GroupStats:
        """The storage, holding at least ``groups`` groups, not shared with a past stats()."""
        storage = self._storage
        if storage is None or storage.num_groups < groups or self._handed_out:
            self._handed_out = False
            held = 0 if storage is None else storage.num_groups
            grown = empty_group_stats(
                max(groups, 3 * held // 2 if room is None else room),
                device=block.count.device,
                dtype=block.mean.dtype,
                count_extremes=block.counts_extremes,
            )
            if storage is not None:
                _assign(grown.groups(0, self.size), storage.groups(0, self.size))
            storage = self._storage = grown
        return storage

    def stats(self) -> GroupStats | None:
        """The groups seen so far, or ``None`` before any block (views of the storage, which
        later merges leave as they are)."""
        if self._storage is None:
            return None
        self._handed_out = True
        return self._storage.groups(0, self.size)


def _assign_rows(target: GroupStats, rows: Tensor, source: GroupStats) -> None:
    """Copy ``source``'s statistics into ``target``'s entries ``rows``."""
    for name in ("count", "mean", "m2", "minimum", "maximum", "at_minimum", "at_maximum"):
        to, values = getattr(target, name), getattr(source, name)
        if to is not None and values is not None:
            to.index_copy_(0, rows, values.to(to.dtype))
    for name in ("but_max", "but_min"):
        to, values = getattr(target, name), getattr(source, name)
        if to is not None and values is not None:
            _assign_rows(to, rows, values)


def _assign(target: GroupStats, source: GroupStats) -> None:
    """Copy ``source``'s statistics into ``target``'s tensors (views of one shape)."""
    for name in ("count", "mean", "m2", "minimum", "maximum", "at_minimum", "at_maximum"):
        to, values = getattr(target, name), getattr(source, name)
        if to is not None and values is not None:
            to.copy_(values)
    for name in ("but_max", "but_min"):
        to, values = getattr(target, name), getattr(source, name)
        if to is not None and values is not None:
            _assign(to, values)


def _concat_all(parts: Sequence[GroupStats]) -> GroupStats:
    """The groups of ``parts`` one after the other (a part without groups adds none)."""
    merged = parts[0]
    for part in parts[1:]:
        if part.num_groups:
            merged = _concat_stats(merged, part)
    return merged


def _slice_stats(stats: GroupStats, start: int, stop: int) -> GroupStats:
    """Groups ``start`` to ``stop`` (views)."""
    return stats._map(lambda t: t[start:stop])


def _concat_stats(a: GroupStats, b: GroupStats) -> GroupStats:
    """Groups of ``a`` followed by groups of ``b``."""

    def cat(x: Tensor | None, y: Tensor | None) -> Tensor | None:
        return None if x is None or y is None else torch.cat((x, y))

    def nested(x: GroupStats | None, y: GroupStats | None) -> GroupStats | None:
        return None if x is None or y is None else _concat_stats(x, y)

    return GroupStats(
        torch.cat((a.count, b.count)),
        torch.cat((a.mean, b.mean)),
        torch.cat((a.m2, b.m2)),
        torch.cat((a.minimum, b.minimum)),
        torch.cat((a.maximum, b.maximum)),
        cat(a.at_minimum, b.at_minimum),
        cat(a.at_maximum, b.at_maximum),
        nested(a.but_max, b.but_max),
        nested(a.but_min, b.but_min),
    )


def active_groups(stats: GroupStats, *, singleton: Singleton = "zero", tolerance: float = 0.0) -> Tensor:
    """Bool tensor ``(K,)``: which groups carry a learning signal.

    A group is active when its rewards are not all identical (``maximum > minimum``,
    exact on the original values), or with ``tolerance`` T > 0 when they span more than T
    (``maximum - minimum > T``, for LLM-judge rewards). With ``singleton="raw"`` (verl's
    convention) a group of one rollout is active too, since it then gets a non-zero advantage.

    >>> from grpo_cli.kernel import group_stats
    >>> r = torch.tensor([1.0, 3.0, 4.0, 4.0, 2.0, 2.0, 2.0005])
    >>> stats = group_stats(r, torch.tensor([0, 0, 1, 1, 2, 3, 3]))
    >>> active_groups(stats)
    tensor([ True, False, False,  True])
    >>> active_groups(stats, tolerance=1e-3)
    tensor([ True, False, False, False])
    """
    check_choice("singleton", singleton, Singleton)
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance}")
    active = stats.maximum > stats.minimum
    if tolerance > 0:
        active = active & ((stats.maximum - stats.minimum) > tolerance)
    if singleton == "raw":
        active = active | ((stats.count == 1) & (stats.maximum != 0))
    return active
