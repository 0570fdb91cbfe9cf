"""The group-advantage kernel: pure PyTorch, no I/O.

Every path in grpo-cli (the in-memory API, the streaming CLI, ``check``) goes through
the same three steps, in the style of torchmetrics' update/compute split:

1. :func:`group_stats` turns one chunk of rewards into per-group sufficient statistics
   (count, mean, centred sum of squares, min and max), accumulated in float64;
2. :func:`merge_group_stats` combines the statistics of two chunks (Chan et al.);
3. :func:`advantages_from_stats` normalises rewards with the final statistics.

:func:`normalize_in_groups` is the one-call convenience wrapper over the three;
:func:`grpo_cli.api.group_advantages` adds trainer presets on top of it.

Numerical contract:

* a group is *active* when its rewards are not all identical; this is decided exactly,
  by comparing the group's minimum and maximum, never from a rounded variance;
* inactive groups get advantages of exactly ``+0.0``, whatever the dtype and epsilon;
* statistics accumulate in float64 (float32 on MPS, which has no float64) with a
  corrected two-pass centred variance, never ``E[x^2] - E[x]^2``;
* every finite reward gives the right advantage, 1e-300 and 1e300 alike: a group whose
  rewards lie outside ``[2**-256, 2**256)`` in magnitude (``[2**-32, 2**32)`` in float32)
  is computed in units of a power of two (:func:`group_scale`), which is exact, so that
  squares neither overflow nor underflow. Ordinary rewards have scale 1 and take the
  unscaled path, bit for bit;
* the same input gives the same bits on every CPU (x86-64 or ARM, any vector width, any
  thread count): every float64 operation is an IEEE one (``+ - * /``, each correctly
  rounded), :func:`sqrt_rn` where a square root is taken (torch's own ``sqrt`` goes through
  the vector-math library of the CPU it runs on, which is not correctly rounded), and every
  sum is a left fold in a set order (:func:`fold_sum`, the group folds) or exact
  (:class:`ExactSum`), never a reduction whose order follows the vector width or the threads;
* a batch's reward mean and std (``scale="batch"``'s divisor, the summary's reward figures)
  are exact sums over its groups rounded once (:class:`RewardTotals`), so groups held apart
  (a Ray run's buckets) give the bits of one machine holding them all.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypedDict

import torch
from torch import Tensor

from grpo_cli.options.choices import Baseline, EpsilonMode, NanPolicy, Scale, Singleton, Std, check_choice

__all__ = [
    "EXACT_LOWEST_EXPONENT",
    "NO_ROW",
    "Baseline",
    "BatchTransform",
    "Divisor",
    "EpsilonMode",
    "ExactSum",
    "GroupAdvantages",
    "GroupStats",
    "GroupStatsAccumulator",
    "NanPolicy",
    "Normalization",
    "RewardTotals",
    "Scale",
    "Singleton",
    "Std",
    "TopTwo",
    "WeightedMoments",
    "WeightedMomentsAccumulator",
    "accumulator_dtype",
    "active_groups",
    "advantages_from_stats",
    "apply_normalization",
    "batch_mean_std",
    "batch_moments",
    "batch_std",
    "empty_group_stats",
    "empty_top_two",
    "flat_groups",
    "fold_sum",
    "gpg_row_scale",
    "group_scale",
    "group_stats",
    "group_std",
    "group_top_two",
    "length_weighted_baseline",
    "merge_group_stats",
    "merge_top_two",
    "merge_weighted_moments",
    "normalize_in_groups",
    "padded_top_two",
    "pass_at_k_advantages",
    "pass_at_k_weights",
    "passk_advantages",
    "passk_best_advantage",
    "prepare_normalization",
    "row_baseline_advantages",
    "shaped_rewards",
    "sqrt_rn",
    "squared_deviations",
    "squared_deviations_of",
    "weighted_moments",
    "whitening",
]


_SPLITTER = 134217729.0  # 2**27 + 1: Veltkamp's split of a float64 into two halves of 26 bits


def sqrt_rn(x: Tensor) -> Tensor:
    """The correctly rounded square root (IEEE 754's ``sqrt``), the same bits on every CPU.

    ``torch.sqrt`` on the CPU goes through the vector-math library of the machine it runs on
    (MKL's, chosen by CPU), whose float64 results are within an ulp but not always the nearest:
    about 1 in 80 differs from ``math.sqrt``, and which ones depends on the CPU. Here each root
    is corrected to the nearest float64 by its exact residual ``x - y*y`` (Dekker's product, no
    fused multiply-add needed); values beyond ``2**+-960``, where that product would overflow or
    lose bits, are first brought near 1 by an exact power of two. Zeros, infinities, NaN and
    negatives keep IEEE's answers. A float32 or float16 tensor takes the float64 root rounded
    once more, which is its own correctly rounded root.

    ``x``: any shape, a floating dtype; the result has its shape and dtype.

    >>> sqrt_rn(torch.tensor([2.0, 0.0, -1.0, float("inf")], dtype=torch.float64)).tolist()
    [1.4142135623730951, 0.0, nan, inf]
    >>> import math
    >>> xs = torch.linspace(0.5, 1e6, 100_001, dtype=torch.float64)
    >>> sqrt_rn(xs).tolist() == [math.sqrt(v) for v in xs.tolist()]
    True
    """
    if not x.is_floating_point():
        raise TypeError(f"sqrt_rn takes a floating tensor, got {x.dtype}")
    if x.dtype != torch.float64:
        return sqrt_rn(x.to(torch.float64)).to(x.dtype)
    if bool((((x >= _DEKKER_LOW) & (x <= _DEKKER_HIGH)) | (x == 0)).all()):  # NaN fails every test
        return _nearest_root(x, x.sqrt())  # the library's root is within an ulp: one step corrects it
    return _scaled_sqrt_rn(x, torch.isfinite(x) & (x > 0))


_DEKKER_LOW, _DEKKER_HIGH = 2.0**-960, 2.0**960
"""Where Dekker's product of a root with itself neither overflows nor loses its low bits."""


def _scaled_sqrt_rn(x: Tensor, ordinary: Tensor) -> Tensor:
    """:func:`sqrt_rn` of any float64 values: each brought to ``[0.5, 2)`` by an even power of two."""
    mantissa, exponent = torch.frexp(torch.where(ordinary, x, torch.ones_like(x)))
    odd = exponent % 2 != 0  # an even exponent halves exactly
    mantissa = torch.where(odd, mantissa * 2, mantissa)  # in [0.5, 2): exact
    half_exponent = torch.div(exponent - odd.to(exponent.dtype), 2, rounding_mode="floor")
    root = _nearest_root(mantissa, mantissa.sqrt())
    return torch.where(ordinary, torch.ldexp(root, half_exponent), x.sqrt())


def _nearest_root(m: Tensor, y: Tensor) -> Tensor:
    """``y`` (within an ulp of ``sqrt(m)``, ``m`` in ``[2**-960, 2**960]``) moved one float64 up or
    down where a neighbour is nearer ``sqrt(m)``, from the exact residual ``r = m - y*y``: ``y`` is
    the nearest where ``-y*gap_below < r <= y*gap_above`` (no root of a float64 lies halfway, and
    ``r`` and the bounds are multiples of ``ulp(y)**2``)."""
    product = y * y
    split = _SPLITTER * y
    high = split - (split - y)
    low = y - high
    error = ((high * high - product) + 2 * high * low) + low * low  # y*y == product + error exactly
    residual = (m - product) - error  # m - product is exact (Sterbenz): one rounding, far from the bounds
    bits = y.view(torch.int64)
    # the gaps to the next float64 up and down, from the exponent bits (powers of two: exact products)
    gap_above = torch.bitwise_and(bits, _EXPONENT_BITS).view(torch.float64) * 2.0**-52
    gap_below = torch.bitwise_and(bits - 1, _EXPONENT_BITS).view(torch.float64) * 2.0**-52
    step = (residual > y * gap_above).to(torch.int64) - (residual <= -(y * gap_below)).to(torch.int64)
    return (bits + step).view(torch.float64)


_EXPONENT_BITS = 0x7FF0000000000000


def fold_sum(values: Tensor, dim: int = 0) -> Tensor:
    """The sum along ``dim`` as a left fold from ``+0.0``, in index order, the same bits on every
    CPU and thread count (``Tensor.sum`` adds in an order that follows the vector width).

    ``values``: any shape, a floating dtype; the result drops ``dim``.

    >>> fold_sum(torch.tensor([1e16, 1.0, 1.0, -1e16], dtype=torch.float64)).item()
    0.0
    >>> fold_sum(torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64), dim=1).tolist()
    [0.6000000000000001]
    """
    if values.shape[dim] == 0:
        return torch.zeros_like(values.sum(dim))
    return torch.zeros_like(values.select(dim, 0)) + torch.cumsum(values, dim).select(dim, -1)


class GroupAdvantages(TypedDict):
    """What :func:`normalize_in_groups` returns.

    ``advantages`` has the rewards' shape, dtype and device; ``active_group_mask`` is a
    bool tensor of shape ``(num_groups,)`` ordered by group ID; ``active_group_count``
    is a plain ``int``.
    """

    advantages: Tensor
    active_group_mask: Tensor
    active_group_count: int


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

    >>> rewards = torch.tensor([1.0, 2.0, 1e300, 3e300], dtype=torch.float64)
    >>> group_scale(group_stats(rewards, torch.tensor([0, 0, 1, 1])))
    tensor([ 1.0000e+00, 2.6788e+300], dtype=torch.float64)
    """
    scale = _scales(stats.minimum, stats.maximum)
    return torch.ones_like(stats.mean) if scale is None else scale


def group_scales(stats: GroupStats) -> Tensor | None:
    """:func:`group_scale`, or ``None`` where every group's scale is 1 (no tensor made).

    >>> group_scales(group_stats(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([0, 1]))) is None
    True
    """
    return _scales(stats.minimum, stats.maximum)


def group_std(stats: GroupStats, *, ddof: int = 0) -> Tensor:
    """Per-group standard deviation (``ddof=1``: Bessel-corrected), in reward units.

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


# --------------------------------------------------------------------------- validation


def _check_rewards(rewards: Tensor, *, allow_nonfinite: bool = False) -> None:
    if not isinstance(rewards, Tensor):
        raise ValueError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if not rewards.dtype.is_floating_point:
        raise ValueError(
            f"rewards must be a floating-point tensor (float16, bfloat16, float32 or float64), "
            f"got dtype {rewards.dtype}"
        )
    if allow_nonfinite or rewards.numel() == 0:
        return
    bad = ~torch.isfinite(rewards)
    if bool(bad.any()):
        flat = bad.reshape(-1)
        positions = flat.nonzero()
        first = int(positions[0])
        value = rewards.reshape(-1)[first].item()
        raise ValueError(
            f"rewards contain {positions.numel()} NaN or infinite value(s); "
            f"the first is {value} at index {first}"
        )


def _check_epsilon(epsilon: float) -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")


def _check_group_ids(rewards: Tensor, group_ids: Tensor) -> None:
    """Refuse IDs that are no group IDs for ``rewards`` by their type, shape or device (their
    values: :func:`_id_range`)."""
    if not isinstance(group_ids, Tensor):
        raise ValueError(f"group_ids must be a torch.Tensor, got {type(group_ids).__name__}")
    if group_ids.dtype.is_floating_point or group_ids.dtype.is_complex or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must have the same shape, got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    if group_ids.device != rewards.device:
        raise ValueError(
            f"rewards and group_ids must be on the same device, got {rewards.device} and {group_ids.device}"
        )


def _id_range(flat_ids: Tensor) -> tuple[int, int]:
    """The lowest and the highest of flat group IDs (``(0, -1)`` for none); a negative one is
    refused."""
    if not flat_ids.numel():
        return 0, -1
    lowest, highest = torch.aminmax(flat_ids)  # one pass over the IDs for both
    if int(lowest) < 0:
        first = int((flat_ids < 0).nonzero()[0])
        raise ValueError(f"group_ids must be non-negative, got {int(flat_ids[first])} at index {first}")
    return int(lowest), int(highest)


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class _Layout:
    """How flat rows map to groups: explicit IDs, or consecutive blocks of ``group_size``, one
    block each for groups ``first_group`` to ``num_groups - 1`` (a chunk of sorted input names
    the groups after the chunks before it)."""

    num_groups: int
    group_ids: Tensor | None = None  # (N,) int64
    group_size: int | None = None
    first_group: int = 0


def _layout(rewards: Tensor, group_ids: Tensor | None, group_size: int | None) -> tuple[Tensor, _Layout]:
    """Validate a call form and return the flat rewards with their layout."""
    if group_ids is not None and group_size is not None:
        raise ValueError("pass either group_ids or group_size, not both")
    if group_ids is not None:
        _check_group_ids(rewards, group_ids)
        flat_ids = group_ids.reshape(-1).to(torch.int64)
        layout = _block_layout(flat_ids)
        if layout is None:
            layout = _Layout(_id_range(flat_ids)[1] + 1, group_ids=flat_ids)
        return rewards.reshape(-1), layout
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        if rewards.dim() != 1:
            raise ValueError(
                f"group_size needs 1-D rewards, got shape {tuple(rewards.shape)}; "
                "2-D rewards are already grouped by row"
            )
        if rewards.numel() % group_size:
            raise ValueError(
                f"the number of rewards ({rewards.numel()}) is not divisible by group_size ({group_size})"
            )
        return rewards, _Layout(rewards.numel() // group_size, group_size=group_size)
    if rewards.dim() == 2:
        num_groups, size = rewards.shape
        if size == 0:
            raise ValueError(f"2-D rewards need at least one column, got shape {tuple(rewards.shape)}")
        return rewards.reshape(-1), _Layout(num_groups, group_size=size)
    raise ValueError(
        f"rewards of shape {tuple(rewards.shape)} need group_ids or group_size; "
        "only 2-D rewards of shape (num_prompts, group_size) are grouped by row"
    )


def _block_layout(flat_ids: Tensor) -> _Layout | None:
    """The fixed-size layout where the IDs are f,f,..,f+1,f+1,.. in equal blocks from the first
    ID ``f >= 0`` to the last (sorted input, a chunk of it past group 0 too), else ``None``. The
    first and last IDs bound them then: no pass over the IDs for their range.

    >>> _block_layout(torch.tensor([3, 3, 4, 4]))
    _Layout(num_groups=5, group_ids=None, group_size=2, first_group=3)
    >>> _block_layout(torch.tensor([3, 4, 4, 5])) is None
    True
    """
    n = flat_ids.numel()
    if not n:
        return None
    first, last = int(flat_ids[0]), int(flat_ids[-1])
    blocks = last - first + 1
    if first < 0 or blocks < 1 or n % blocks:
        return None
    size = n // blocks
    heads = flat_ids[::size]
    # each block's first ID is the next group's, then every ID equals its block's
    if torch.equal(heads, torch.arange(first, last + 1, device=flat_ids.device)) and torch.equal(
        flat_ids.view(blocks, size), heads[:, None].expand(blocks, size)
    ):
        return _Layout(last + 1, group_size=size, first_group=first)
    return None


def flat_groups(
    rewards: Tensor, group_ids: Tensor | None = None, *, group_size: int | None = None
) -> tuple[Tensor, Tensor, int]:
    """A call form of :func:`normalize_in_groups`, validated, as flat rows: the rewards ``(N,)``,
    each row's group ID ``(N,)`` int64 (on the rewards' device) and the number of groups ``K``.

    >>> flat_groups(torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
    (tensor([1.0000, 0.0000, 0.5000, 0.5000]), tensor([0, 0, 1, 1]), 2)
    >>> flat_groups(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([2, 0, 2]))[1:]
    (tensor([2, 0, 2]), 3)
    """
    _check_rewards(rewards, allow_nonfinite=True)
    flat, layout = _layout(rewards, group_ids, group_size)
    return flat, _row_group_ids(layout, flat.device), layout.num_groups


# --------------------------------------------------------------------------- update / merge / compute


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


def _block_stats(x: Tensor, dtype: torch.dtype | None = None) -> GroupStats:
    """Statistics of a ``(K, G)`` matrix whose rows are the groups, bit for bit those of
    :func:`_scatter_stats` over the same rows: every sum is a left fold from ``+0.0`` over
    the group's rollouts in row order, and the formulas are the same. So a group's statistics
    never depend on which path a chunk takes (consecutive blocks here, IDs there), nor on the
    other groups in the chunk: the Ray engine, which sees a chunk's groups apart, relies on it.

    ``dtype``: the statistics' (default ``x``'s); ``x`` is widened to it exactly.
    """
    k, g = x.shape
    dtype = x.dtype if dtype is None else dtype
    if g > LEFT_FOLD_COLUMNS:
        ids = torch.arange(k, device=x.device).repeat_interleave(g)
        return _scatter_stats(x.reshape(-1).to(dtype), ids, k)
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


def merge_group_stats(a: GroupStats, b: GroupStats) -> GroupStats:
    """Combine the statistics of two disjoint sets of rollouts (the *merge* step).

    Groups are matched by position; the shorter input is padded with empty groups.
    The merge is Chan et al.'s pairwise update, so no precision is lost to
    cancellation, and merging with an empty group returns the other side exactly.

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
    groups. The groups live at the front of tensors whose capacity doubles, so a run of many
    blocks copies each group a bounded number of times, where merging every block over all
    the groups so far (or concatenating onto them) costs every group per block: quadratic in
    the blocks.

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

    def merge_at(self, block: GroupStats, first_group: int) -> None:
        """Merge ``block``, the statistics of groups ``first_group`` onwards."""
        end = first_group + block.num_groups
        storage = self._grown(block, end)
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

    def _grown(self, block: GroupStats, groups: int) -> GroupStats:
        """The storage, holding at least ``groups`` groups, not shared with a past stats()."""
        storage = self._storage
        if storage is None or storage.num_groups < groups or self._handed_out:
            self._handed_out = False
            grown = empty_group_stats(
                max(groups, 2 * (0 if storage is None else storage.num_groups)),
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


EXACT_LOWEST_EXPONENT = -4500
"""Every term of an :class:`ExactSum` is a multiple of ``2**EXACT_LOWEST_EXPONENT``: below the
smallest float64 (``2**-1074``) times the smallest squares and products the moments form."""
_BIN_TERMS = 1 << 26
"""Terms summed per exponent in one float64 bincount: 27-bit halves of a 53-bit mantissa add up
exactly below ``2**53``."""
_EXTRACTION_ROUNDS = 4
"""Rounds of :func:`_extracted` before what is left is summed by exponent bins."""


def _exact_terms(values: Tensor) -> Tensor:
    """``values`` as a flat float64 CPU tensor (a copy only where the dtype or device differ)."""
    return values.detach().reshape(-1).to("cpu", torch.float64)


@dataclass(frozen=True)
class ExactSum:
    """A sum of float64 terms kept exactly: ``scaled * 2**EXACT_LOWEST_EXPONENT``, plus the sum
    of any infinite or NaN terms (``special``). Adding two is exact, so parts merge in any order
    and a sum cut into parts (chunks, a Ray run's buckets) has the bits of the whole.

    >>> total = ExactSum.of(torch.tensor([1e16, 1.0, 1.0, -1e16], dtype=torch.float64))
    >>> total.value(), (total + ExactSum.of(torch.tensor([0.5], dtype=torch.float64))).value()
    (2.0, 2.5)
    """

    scaled: int = 0
    special: float = 0.0

    @classmethod
    def of(cls, terms: Tensor, exponents: Tensor | None = None) -> ExactSum:
        """The exact sum of ``terms * 2**exponents`` (a floating and an integer tensor of one
        shape; ``exponents`` defaults to 0), whatever their magnitudes: no product overflows."""
        terms = _exact_terms(terms)
        special = 0.0
        if not math.isfinite(float(terms.sum())):  # one pass: no term is inf or NaN
            finite = torch.isfinite(terms)
            special = float(terms[~finite].sum())  # inf - inf is NaN, whatever the order
            terms = terms[finite]
            exponents = None if exponents is None else exponents.reshape(-1).cpu()[finite]
        if exponents is None:
            return cls(_extracted(terms), special)
        return cls(_binned(terms, exponents.to("cpu", torch.int64).reshape(-1)), special)

    @classmethod
    def of_products(cls, counts: Tensor, values: Tensor) -> ExactSum:
        """The exact sum of ``counts * values`` (int64 and float64, one shape), each product
        rounded once to float64 as a product of the two, never overflowing.

        >>> values = torch.tensor([1e308, -1e308], dtype=torch.float64)
        >>> ExactSum.of_products(torch.tensor([3, 2]), values).value()
        1e+308
        """
        counts, values = counts.detach().reshape(-1).cpu(), _exact_terms(values)
        products = counts * values
        if math.isfinite(float(products.sum())):
            # every float is a multiple of 2**-1074, so a product with an integer that lands
            # below the normal range is exact: these are the products rounded once
            return cls.of(products)
        mantissa, exponent = torch.frexp(values)
        return cls.of(counts * mantissa, exponent)

    def times_power_of_two(self, power: int) -> ExactSum:
        """The sum times ``2**power``, exactly (the terms' bits stay above
        ``2**EXACT_LOWEST_EXPONENT``: ``power`` within +-2048 of the terms' own exponents)."""
        if power >= 0:  # an infinite or NaN special stays what it is
            return ExactSum(self.scaled << power, self.special)
        if self.scaled % (1 << -power):
            raise ValueError(f"the sum times 2**{power} is below 2**{EXACT_LOWEST_EXPONENT}")
        return ExactSum(self.scaled >> -power, self.special)

    def __add__(self, other: ExactSum) -> ExactSum:
        return ExactSum(self.scaled + other.scaled, self.special + other.special)

    def ratio(self, divisor: int, *, scale_exponent: int = 0) -> float:
        """``sum / divisor / 2**scale_exponent``, rounded once (``divisor`` > 0); +-inf past
        the float64 range."""
        if self.special != 0.0:  # an infinite or NaN term (NaN != 0.0 too)
            return self.special
        try:  # an integer quotient is rounded once
            return self.scaled / (divisor << (scale_exponent - EXACT_LOWEST_EXPONENT))
        except OverflowError:
            return math.inf if self.scaled > 0 else -math.inf

    def value(self) -> float:
        """The sum, rounded once."""
        return self.ratio(1)


def _extracted(terms: Tensor) -> int:
    """The exact sum of finite float64 ``terms`` in units of ``2**EXACT_LOWEST_EXPONENT``.

    Rump, Ogita and Oishi's error-free extraction (Accurate floating-point summation, 2008):
    with ``sigma = 2**k`` at least ``n + 1`` times every term's magnitude, ``q = (sigma + p) -
    sigma`` is ``p`` rounded to a multiple of ``2**(k - 53)`` and ``p - q`` is exact, so the
    ``q`` add up exactly in float64 in any order (their sum stays within ``2**53`` units), on
    any CPU and thread count. Each round takes about 53 - log2(n) bits of every term; most
    terms (counts times means of a few rewards) are done in one or two. What is left after
    :data:`_EXTRACTION_ROUNDS`, or near the ends of the float64 range, goes to :func:`_binned`.

    >>> terms = torch.tensor([1e16, 1.0, -1e16, 0.5], dtype=torch.float64)
    >>> _extracted(terms) == 3 << (-1 - EXACT_LOWEST_EXPONENT)
    True
    """
    if not terms.numel():
        return 0
    headroom_bits = int(terms.numel()).bit_length()  # 2**headroom_bits > n
    remainder = terms
    buffer = torch.empty_like(terms)
    scaled = 0
    for _ in range(_EXTRACTION_ROUNDS):
        largest = max(float(remainder.max()), -float(remainder.min()))
        if largest == 0.0:
            return scaled
        k = math.frexp(largest)[1] + headroom_bits  # largest < 2**(k - headroom_bits)
        if k > 1023 or k - 53 < -1022:  # sigma not a float, or its units below the normal range
            break
        sigma = math.ldexp(1.0, k)
        extracted = torch.add(remainder, sigma, out=buffer)
        extracted -= sigma
        units = int(math.ldexp(float(extracted.sum()), 53 - k))  # exact: an integer below 2**53
        scaled += units << (k - 53 - EXACT_LOWEST_EXPONENT)
        if remainder is terms:
            remainder = terms - extracted
        else:
            remainder -= extracted
    return scaled + _binned(remainder, None)


def _binned(terms: Tensor, exponents: Tensor | None) -> int:
    """The exact sum of finite ``terms * 2**exponents`` in units of ``2**EXACT_LOWEST_EXPONENT``:
    each term's 53-bit mantissa, cut in halves of 27 and 26 bits, added per exponent in float64
    (exact up to ``2**26`` terms a bin), then shifted into one integer."""
    mantissa, exponent = torch.frexp(terms)  # terms = mantissa * 2**exponent, |mantissa| in [0.5, 1)
    whole = (mantissa * 2.0**53).to(torch.int64)  # exact: 53 significant bits
    shifts = exponent.to(torch.int64) - 53
    if exponents is not None:
        shifts = shifts + exponents
    scaled = 0
    if whole.numel():  # a zero adds nothing to its exponent's bin, whatever that exponent is
        low_exponent = int(shifts.min())
        if low_exponent < EXACT_LOWEST_EXPONENT:
            raise ValueError(f"a term below 2**{EXACT_LOWEST_EXPONENT} cannot be summed exactly")
        bins = shifts - low_exponent
        high, low = whole >> 26, whole & ((1 << 26) - 1)  # whole = high * 2**26 + low
        width = int(bins.max()) + 1
        for start in range(0, whole.numel(), _BIN_TERMS):
            part = slice(start, start + _BIN_TERMS)
            highs = torch.bincount(bins[part], weights=high[part].to(torch.float64), minlength=width)
            lows = torch.bincount(bins[part], weights=low[part].to(torch.float64), minlength=width)
            for at in torch.nonzero((highs != 0) | (lows != 0)).reshape(-1).tolist():
                shift = at + low_exponent - EXACT_LOWEST_EXPONENT
                scaled += ((int(highs[at]) << 26) + int(lows[at])) << shift
    return scaled


@dataclass(frozen=True)
class RewardTotals:
    """Round 1 of a batch's reward mean and standard deviation, from its groups: how many
    rewards, their extremes and their exact sum. ``+`` merges two parts' (any order), so the
    groups may be held apart (a Ray run's buckets) and give the bits of one machine.

    Round 2 is :func:`squared_deviations` from :attr:`mean`; :meth:`std` takes its merged sum.

    >>> rewards = torch.tensor([1.0, 3.0, 5.0, 7.0], dtype=torch.float64)
    >>> stats = group_stats(rewards, torch.tensor([0, 0, 1, 1]))
    >>> totals = RewardTotals.of_stats(stats)
    >>> totals.rewards, totals.mean, totals.std(squared_deviations_of(stats, totals))
    (4, 4.0, 2.23606797749979)
    """

    rewards: int = 0
    low: float = math.inf
    high: float = -math.inf
    total: ExactSum = ExactSum()

    @classmethod
    def of(cls, count: Tensor, mean: Tensor, minimum: Tensor, maximum: Tensor) -> RewardTotals:
        """From groups' ``count`` (integer), ``mean``, ``minimum`` and ``maximum``, shape
        ``(k,)`` (an empty group holds count 0 and is left out)."""
        seen = count > 0
        if not bool(seen.all()):
            count, mean, minimum, maximum = count[seen], mean[seen], minimum[seen], maximum[seen]
        if not count.numel():
            return cls()
        return cls(
            rewards=int(count.sum()),
            low=float(minimum.min()),
            high=float(maximum.max()),
            total=ExactSum.of_products(count.to(torch.int64), mean),  # each group's sum
        )

    @classmethod
    def of_stats(cls, stats: GroupStats) -> RewardTotals:
        return cls.of(stats.count, stats.mean, stats.minimum, stats.maximum)

    def __add__(self, other: RewardTotals) -> RewardTotals:
        return RewardTotals(
            self.rewards + other.rewards,
            min(self.low, other.low),
            max(self.high, other.high),
            self.total + other.total,
        )

    @property
    def mean(self) -> float:
        """The reward mean, the exact sum's quotient rounded once (0 without a reward)."""
        return self.total.ratio(self.rewards) if self.rewards else 0.0

    @property
    def scale_exponent(self) -> int:
        """Deviations from the mean are squared in units of ``2**scale_exponent``: at most twice
        the largest magnitude, they stay below 4 there, and their squares neither overflow nor
        lose the largest ones' bits."""
        magnitude = max(abs(self.low), abs(self.high)) if self.rewards else 0.0
        if not magnitude or not math.isfinite(magnitude):
            return 0
        # at least 2**-1022: the unit's reciprocal stays finite for subnormal rewards
        return max(math.frexp(magnitude)[1], -1022)

    def std(self, squares: ExactSum, *, ddof: int = 0) -> float:
        """The standard deviation from the merged :func:`squared_deviations`: the mean of
        squares (over ``rewards - ddof``, at least 1) in units of ``4**scale_exponent``,
        rounded once, then its root, rounded once."""
        if not self.rewards:
            return 0.0
        exponent = self.scale_exponent
        variance = squares.ratio(max(self.rewards - ddof, 1), scale_exponent=2 * exponent)
        return math.ldexp(math.sqrt(variance), exponent) if variance >= 0 else math.nan


def squared_deviations(
    count: Tensor, mean: Tensor, m2: Tensor, m2_scale: Tensor | None, *, totals: RewardTotals
) -> ExactSum:
    """Round 2 of :class:`RewardTotals`: the exact sum over the groups' rewards of ``(reward -
    totals.mean)**2``, as each group's ``m2`` (in units of ``m2_scale**2``, powers of two;
    ``None``: every scale is 1) plus ``count * (mean - totals.mean)**2``, each term rounded
    once as formed. Groups of count 0 add nothing. Shapes ``(k,)``."""
    seen = count > 0
    if not bool(seen.all()):
        count, mean, m2 = count[seen], mean[seen], m2[seen]
        m2_scale = None if m2_scale is None else m2_scale[seen]
    mean, m2 = _exact_terms(mean), _exact_terms(m2)
    if m2_scale is None:  # every group of ordinary magnitude: m2 in reward units
        within = ExactSum.of(m2)
    else:
        m2_mantissa, m2_exponent = torch.frexp(m2)
        _, scale_exponent = torch.frexp(_exact_terms(m2_scale))  # a power of two 2**(e - 1)
        within = ExactSum.of(
            m2_mantissa, m2_exponent.to(torch.int64) + 2 * (scale_exponent.to(torch.int64) - 1)
        )
    exponent = totals.scale_exponent
    unit = math.ldexp(1.0, -exponent)
    deviation = mean * unit - totals.mean * unit  # exact scalings: the rounding of mean - run mean
    between = ExactSum.of_products(count.to(torch.int64), deviation * deviation).times_power_of_two(
        2 * exponent
    )
    return within + between


def squared_deviations_of(stats: GroupStats, totals: RewardTotals) -> ExactSum:
    """:func:`squared_deviations` of ``stats``' groups."""
    return squared_deviations(stats.count, stats.mean, stats.m2, group_scales(stats), totals=totals)


def batch_moments(stats: GroupStats) -> tuple[int, Tensor, Tensor]:
    """Count, mean and centred sum of squares of all rollouts, merged from the groups: exact
    sums (:class:`RewardTotals`), each rounded once, so any cut of the groups gives these bits.

    The sum of squares is in reward units squared (it overflows for rewards near
    1e154 and beyond: use :func:`batch_std` for the spread).

    >>> stats = group_stats(torch.tensor([1.0, 3.0, 5.0, 7.0]), torch.tensor([0, 0, 1, 1]))
    >>> n, mean, m2 = batch_moments(stats)
    >>> n, mean.item(), m2.item()
    (4, 4.0, 20.0)
    """
    totals = RewardTotals.of_stats(stats)
    squares = squared_deviations_of(stats, totals)
    like = stats.mean.new_zeros(())
    return totals.rewards, like + totals.mean, like + squares.value()


def batch_std(stats: GroupStats, *, ddof: int = 0) -> Tensor:
    """Standard deviation of all rollouts, merged from the groups, in reward units
    (:meth:`RewardTotals.std`: the summary's reward std, and ``--scale batch``'s divisor).

    >>> float(batch_std(group_stats(torch.tensor([1.0, 3.0, 5.0, 7.0]), torch.tensor([0, 0, 1, 1]))))
    2.23606797749979
    """
    return batch_mean_std(stats, ddof=ddof)[2]


def batch_mean_std(stats: GroupStats, *, ddof: int = 0) -> tuple[int, Tensor, Tensor]:
    """Count, mean and standard deviation of all rollouts, merged from the groups: bit for bit
    :func:`batch_moments`' count and mean and :func:`batch_std`.

    >>> stats = group_stats(torch.tensor([1.0, 3.0, 5.0, 7.0]), torch.tensor([0, 0, 1, 1]))
    >>> n, mean, std = batch_mean_std(stats)
    >>> n, mean.item(), std.item()
    (4, 4.0, 2.23606797749979)
    """
    totals = RewardTotals.of_stats(stats)
    like = stats.mean.new_zeros(())
    std = totals.std(squared_deviations_of(stats, totals), ddof=ddof)
    return totals.rewards, like + totals.mean, like + std


def advantages_from_stats(
    rewards: Tensor,
    group_ids: Tensor | None,
    stats: GroupStats,
    *,
    group_size: int | None = None,
    epsilon: float = 1e-6,
    std: Std = "population",
    scale: Scale = "group",
    baseline: Baseline = "mean",
    epsilon_mode: EpsilonMode = "add",
    singleton: Singleton = "zero",
    valid: Tensor | None = None,
    batch_std: Tensor | None = None,
) -> Tensor:
    """Normalise rewards with final group statistics (the *compute* step).

    Args:
        rewards: floating tensor ``(N,)`` (or ``(P, G)`` grouped by row), one chunk of the
            rollouts that ``stats`` describes.
        group_ids: int tensor ``(N,)`` indexing ``stats``, or ``None`` with ``group_size``
            or 2-D rewards.
        stats: :class:`GroupStats` over *all* rollouts of the groups involved.
        epsilon: added to (``"add"``), or a floor for (``"clamp"``), the std.
        std: ``"population"`` (divide by n) or ``"sample"`` (n - 1).
        scale: ``"group"`` std, ``"batch"`` std of all rewards in ``stats``, or ``"none"``.
        baseline: subtract the group ``"mean"``, or the ``"leave-one-out"`` mean of the
            other rollouts of the group (RLOO); with ``scale="group"`` the std is then
            taken over the same other rollouts (NeMo-RL).
        epsilon_mode: ``"add"`` (``std + eps``), ``"clamp"`` (``max(std, eps)``), or
            ``"add-if-nonzero"`` (divide by ``std + eps`` only where std > 0).
        singleton: ``"zero"``, or ``"raw"``: a one-rollout group gets ``r / (1 + eps)``
            (verl: mean 0, std 1), or ``r`` with ``scale="none"``.
        valid: optional bool tensor; ``False`` rows get advantage 0.
        batch_std: the batch std to use with ``scale="batch"``; computed from ``stats``
            when omitted.

    Returns:
        Advantages with the rewards' shape, dtype and device. Rollouts of inactive
        groups are exactly ``+0.0``.

    >>> r, ids = torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1])
    >>> advantages_from_stats(r, ids, group_stats(r, ids), epsilon=1e-8)
    tensor([-1.,  1.,  0.,  0.])
    """
    norm = prepare_normalization(
        stats,
        epsilon=epsilon,
        std=std,
        scale=scale,
        baseline=baseline,
        epsilon_mode=epsilon_mode,
        singleton=singleton,
        batch_std=batch_std,
    )
    return apply_normalization(rewards, group_ids, norm, group_size=group_size, valid=valid)


@dataclass(frozen=True)
class Normalization:
    """The per-group terms of the *compute* step, prepared once for many chunks.

    With the mean baseline, ``A = (r / units[g] - center[g]) / denominator[g]`` row by
    row, ``units`` being the groups' powers of two (``None``: all 1, see
    :func:`group_scale`); the leave-one-out baseline works from ``stats`` row by row. Build it with
    :func:`prepare_normalization`, apply it with :func:`apply_normalization`.
    """

    stats: GroupStats
    active: Tensor
    center: Tensor | None
    denominator: Tensor | None
    divisor: Divisor
    singleton: Singleton
    units: Tensor | None = None
    tolerated: Tensor | None = None  # bool (K,): groups with a spread that are inactive (zeroed)


@dataclass(frozen=True)
class Divisor:
    """What the centred rewards are divided by: the options of :func:`prepare_normalization`."""

    scale: Scale
    ddof: int
    epsilon: float
    epsilon_mode: EpsilonMode
    batch_std: Tensor | None

    def groups(self, start: int, end: int) -> Divisor:
        """The divisor of groups ``start`` to ``end - 1``: a batch std given per group is cut
        to theirs (a run's one std stays whole)."""
        if self.batch_std is None or self.batch_std.numel() <= 1:
            return self
        return replace(self, batch_std=self.batch_std[start:end])

    def of(
        self,
        m2: Tensor,
        count: Tensor,
        units: Tensor | None = None,
        mean: Tensor | None = None,
        *,
        deviation: Tensor | None = None,
    ) -> Tensor:
        """Per-group (or per-row, for leave-one-out) divisor for groups with ``count`` and ``m2``
        (``scale="mean"``: the groups' ``mean``, MaxRL's divisor).

        ``m2`` and the result are in ``units`` (powers of two; ``None``: 1); ``deviation``, in
        ``units`` too, is the standard deviation where the caller has it (``scale="group"``).
        """
        one = torch.ones_like(m2) if units is None else 1 / units
        if self.scale == "none":
            return one
        if self.scale == "mean":
            if mean is None:
                raise ValueError("scale='mean' divides by the group mean: it takes the mean baseline")
            deviation = mean if units is None else mean / units
        elif self.scale == "batch":
            assert self.batch_std is not None
            deviation = self.batch_std.expand_as(m2) if units is None else self.batch_std / units
        elif deviation is None:
            dof = (count - self.ddof).clamp_min(1).to(m2.dtype)
            deviation = sqrt_rn(m2 / dof)
        eps: float | Tensor = self.epsilon if units is None else self.epsilon / units
        if self.epsilon_mode == "clamp":
            return (
                deviation.clamp_min(self.epsilon)
                if units is None
                else torch.maximum(deviation, self.epsilon / units)
            )
        if self.epsilon_mode == "add-if-nonzero":
            return torch.where(deviation > 0, deviation + eps, one)
        return deviation + eps


def prepare_normalization(
    stats: GroupStats,
    *,
    epsilon: float = 1e-6,
    std: Std = "population",
    scale: Scale = "group",
    baseline: Baseline = "mean",
    epsilon_mode: EpsilonMode = "add",
    singleton: Singleton = "zero",
    batch_std: Tensor | None = None,
    inactive_tolerance: float = 0.0,
) -> Normalization:
    """Per-group centers and divisors from final statistics (options as in :func:`advantages_from_stats`).

    ``inactive_tolerance`` T: a group whose rewards span at most T is inactive (see
    :func:`active_groups`) and its rollouts get advantage ``+0.0``, as an exactly constant
    group's do.

    >>> r, ids = torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1])
    >>> norm = prepare_normalization(group_stats(r, ids), epsilon=1e-8)
    >>> apply_normalization(r, ids, norm)
    tensor([-1.,  1.,  0.,  0.])
    """
    _check_epsilon(epsilon)
    check_choice("std", std, Std)
    check_choice("scale", scale, Scale)
    check_choice("baseline", baseline, Baseline)
    check_choice("epsilon_mode", epsilon_mode, EpsilonMode)
    check_choice("singleton", singleton, Singleton)
    ddof = 1 if std == "sample" else 0
    if scale == "mean" and baseline != "mean":
        raise ValueError("scale='mean' (MaxRL) divides by the group mean: use baseline='mean'")
    if baseline != "mean" and (stats.at_minimum is None or stats.at_maximum is None):
        raise ValueError("baseline='leave-one-out' needs stats computed with count_extremes=True")
    if scale == "batch" and batch_std is None:
        batch_std = batch_mean_std(stats, ddof=ddof)[2]
    divisor = Divisor(scale, ddof, epsilon, epsilon_mode, batch_std)
    k = stats.num_groups
    if k <= NORMALIZATION_CHUNK_GROUPS:
        parts = _normalization_of(stats, divisor, baseline, singleton, inactive_tolerance)
        return Normalization(stats, *parts[:3], divisor, singleton, *parts[3:])
    # Chunk by chunk: every figure is a group's own, so the chunks' parts are the whole's, and
    # a chunk's temporaries (a dozen per group in the roots) are a chunk's, not the run's.
    active = torch.empty(k, dtype=torch.bool, device=stats.mean.device)
    center = denominator = units = tolerated = None
    if baseline == "mean":
        center, denominator = torch.empty_like(stats.mean), torch.empty_like(stats.mean)
    for start in range(0, k, NORMALIZATION_CHUNK_GROUPS):
        end = min(start + NORMALIZATION_CHUNK_GROUPS, k)
        part_active, part_center, part_denominator, part_units, part_tolerated = _normalization_of(
            stats.groups(start, end), divisor.groups(start, end), baseline, singleton, inactive_tolerance
        )
        active[start:end] = part_active
        if center is not None and part_center is not None:
            center[start:end] = part_center
        if denominator is not None and part_denominator is not None:
            denominator[start:end] = part_denominator
        if part_units is not None:  # a chunk's units of 1 are no units: 1 where no chunk had them
            if units is None:
                units = torch.ones_like(stats.mean)
            units[start:end] = part_units
        if part_tolerated is not None:
            if tolerated is None:
                tolerated = torch.zeros(k, dtype=torch.bool, device=stats.mean.device)
            tolerated[start:end] = part_tolerated
    return Normalization(stats, active, center, denominator, divisor, singleton, units, tolerated)


NORMALIZATION_CHUNK_GROUPS = 1 << 20
"""Groups normalised at a time: their temporaries (about 100 bytes a group) stay a chunk's."""


def _normalization_of(
    stats: GroupStats, divisor: Divisor, baseline: Baseline, singleton: Singleton, inactive_tolerance: float
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """:func:`prepare_normalization` of some groups: their activity, center, denominator, units
    and tolerated mask, each figure a group's own."""
    scale, epsilon = divisor.scale, divisor.epsilon
    active = active_groups(stats, singleton=singleton, tolerance=inactive_tolerance)
    if scale == "mean":  # MaxRL: a group whose mean reward is <= 0 carries no signal (prime-rl)
        active = active & ((stats.mean > 0) | ((stats.count == 1) & (singleton == "raw")))
    # Groups with a spread that a tolerance or MaxRL's mean <= 0 rule calls inactive: zeroed by hand
    # (the inactive center, the group minimum, zeroes only constant groups).
    tolerated = (
        (stats.maximum > stats.minimum) & ~active if inactive_tolerance > 0 or scale == "mean" else None
    )
    units = _scales(stats.minimum, stats.maximum)
    center = denominator = None
    if baseline == "mean":
        center = torch.where(active, stats.mean, stats.minimum)
        if units is not None:
            center = center / units
        # x - (-0.0) is +0.0 for both signed zeros: inactive groups of zeros give +0.0.
        center = torch.where(center == 0, torch.full_like(center, -0.0), center)
        denominator = divisor.of(stats.m2, stats.count, units, stats.mean)
        if singleton == "raw":
            lone = stats.count == 1
            center = torch.where(lone, torch.full_like(center, -0.0), center)
            lone_scale = torch.full_like(denominator, 1.0 if scale in ("none", "mean") else 1 + epsilon)
            denominator = torch.where(lone, lone_scale if units is None else lone_scale / units, denominator)
        denominator = torch.where(active, denominator, torch.ones_like(denominator))
    return active, center, denominator, units, tolerated


def apply_normalization(
    rewards: Tensor,
    group_ids: Tensor | None,
    norm: Normalization,
    *,
    group_size: int | None = None,
    valid: Tensor | None = None,
) -> Tensor:
    """Advantages of one chunk of rewards, with the rewards' shape, dtype and device.

    ``group_ids`` (or ``group_size``, or 2-D rewards) index the groups of ``norm``.
    """
    _check_rewards(rewards, allow_nonfinite=True)
    flat, layout = _layout(rewards, group_ids, group_size)
    if layout.num_groups > norm.stats.num_groups:
        raise ValueError(
            f"group IDs reach {layout.num_groups - 1} but stats describe {norm.stats.num_groups} groups"
        )
    out = _apply(flat, layout, norm, None if valid is None else valid.reshape(-1))
    return out.to(rewards.dtype).view(rewards.shape)


def _apply(flat: Tensor, layout: _Layout, norm: Normalization, valid: Tensor | None) -> Tensor:
    """Advantages of flat rows, in the accumulator dtype (the caller casts back)."""
    stats = norm.stats
    center, denominator = norm.center, norm.denominator
    blocks = layout.group_size is not None and valid is None and norm.tolerated is None
    if center is not None and denominator is not None and blocks:
        return _apply_blocks(flat, layout, center, denominator, norm.units)
    x = flat.to(stats.mean.dtype)
    ids = _row_group_ids(layout, flat.device)
    if center is not None and denominator is not None:
        if norm.units is not None:
            x = x / torch.take(norm.units, ids)
        out = (x - torch.take(center, ids)) / torch.take(denominator, ids)
    else:
        out = _leave_one_out(x, ids, norm)
        if norm.singleton == "raw":
            lone = torch.take(stats.count, ids) == 1
            divisor = norm.divisor
            # x + 0.0 is +0.0 for both signed zeros, as under the mean baseline
            out = torch.where(
                lone, (x + 0.0) / (1.0 if divisor.scale == "none" else 1 + divisor.epsilon), out
            )
    if norm.tolerated is not None:
        out = torch.where(torch.take(norm.tolerated, ids), torch.zeros_like(out), out)
    if valid is not None:
        out = torch.where(valid, out, torch.zeros_like(out))
    return out


def _apply_blocks(
    flat: Tensor, layout: _Layout, center: Tensor, denominator: Tensor, units: Tensor | None
) -> Tensor:
    """:func:`_apply`'s operations on rows in blocks of ``layout.group_size``, a block a group:
    the same bits, each group's figures broadcast over its block instead of gathered per row.
    Narrower rewards are widened exactly by the first operation's type promotion."""
    first, end, g = layout.first_group, layout.num_groups, layout.group_size
    assert g is not None
    acc = center.dtype
    rows = (flat if torch.promote_types(flat.dtype, acc) == acc else flat.to(acc)).view(end - first, g)
    if units is not None:
        rows = rows / units[first:end, None]
    out = rows - center[first:end, None]
    return out.div_(denominator[first:end, None]).view(-1)


def _row_group_ids(layout: _Layout, device: torch.device) -> Tensor:
    if layout.group_ids is not None:
        return layout.group_ids
    assert layout.group_size is not None  # a layout has IDs or a group size
    groups = torch.arange(layout.first_group, layout.num_groups, device=device)
    return groups.repeat_interleave(layout.group_size)


def _leave_one_out(x: Tensor, ids: Tensor, norm: Normalization) -> Tensor:
    """``(r_i - mean of the others) / std of the others``, from the group moments.

    Removing one point from (n, mean, M2) is the reverse Welford update, so no second
    pass over the group is needed: mean' = (n mean - r) / (n - 1) and
    M2' = M2 - (r - mean)^2 n / (n - 1). Works in the groups' units (powers of two).
    """
    stats = norm.stats
    n = torch.take(stats.count, ids).to(x.dtype)
    mean = torch.take(stats.mean, ids)
    units = None if norm.units is None else torch.take(norm.units, ids)
    scaled = x if units is None else x / units
    if units is not None:
        mean = mean / units
    row_active = torch.take(norm.active, ids) & (n > 1)
    others = (n - 1).clamp_min(1)
    deviation = scaled - mean
    centred = deviation * (n / others)  # r - (n mean - r) / (n - 1)
    m2_others = (torch.take(stats.m2, ids) - deviation * deviation * (n / others)).clamp_min(0)
    assert stats.at_minimum is not None and stats.at_maximum is not None
    # The reverse update cancels when the others are identical (binary rewards: one
    # success among failures): decide that case exactly from the extreme counts.
    others_n = n - 1
    at_min = torch.take(stats.at_minimum, ids).to(x.dtype)
    at_max = torch.take(stats.at_maximum, ids).to(x.dtype)
    lone_max = (x == torch.take(stats.maximum, ids)) & (at_max == 1)
    lone_min = (x == torch.take(stats.minimum, ids)) & (at_min == 1)
    identical = (lone_max & (at_min == others_n)) | (lone_min & (at_max == others_n))
    m2_others = torch.where(identical, torch.zeros_like(m2_others), m2_others)
    divisor = norm.divisor
    if divisor.batch_std is not None and divisor.batch_std.numel() > 1:  # one per group: per row here
        divisor = replace(divisor, batch_std=torch.take(divisor.batch_std, ids))
    spread: Tensor | None = None  # the others' standard deviation, in the groups' units
    if divisor.scale == "group":
        # It cancels too where the row left out dominates the group's M2 (an outlier): then it is
        # the group's lone maximum or minimum, whose others' statistics the group carries.
        dof = (others_n - divisor.ddof).clamp_min(1)
        spread = sqrt_rn(m2_others / dof)
        for lone, without in ((lone_max, stats.but_max), (lone_min, stats.but_min)):
            if without is None or not bool((lone & ~identical).any()):
                continue
            without_scale = _scales(torch.take(without.minimum, ids), torch.take(without.maximum, ids))
            exact = sqrt_rn(torch.take(without.m2, ids) / dof)
            if without_scale is not None:
                exact = exact * without_scale
            if units is not None:
                exact = exact / units
            spread = torch.where(lone & ~identical, exact, spread)
    denominator = divisor.of(m2_others, (n - 1).to(torch.int64), units, deviation=spread)
    out = centred / denominator
    return torch.where(row_active, out, torch.zeros_like(out))


def normalize_in_groups(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    epsilon: float = 1e-6,
    *,
    group_size: int | None = None,
    std: Std = "population",
    scale: Scale = "group",
    baseline: Baseline = "mean",
    epsilon_mode: EpsilonMode = "add",
    singleton: Singleton = "zero",
    nan: NanPolicy = "error",
) -> GroupAdvantages:
    """GRPO group-relative advantages: ``A_i = (r_i - mean_g) / (std_g + epsilon)``.

    Three call forms, one result:

    * ``normalize_in_groups(rewards, group_ids)``: rewards ``(N,)`` float, group_ids ``(N,)``
      int with values in ``[0, K)``; ``K = max(group_ids) + 1`` (IDs with no rollouts are
      inactive groups);
    * ``normalize_in_groups(rewards_2d)``: rewards ``(P, G)``, each row a group;
    * ``normalize_in_groups(rewards, group_size=G)``: rewards ``(N,)`` in consecutive blocks of G.

    Args:
        rewards: float16, bfloat16, float32 or float64 tensor; never modified.
        group_ids: integer tensor of the rewards' shape, on the same device.
        epsilon: positive finite number added to the std (default 1e-6).
        group_size: consecutive block size for flat rewards without group_ids.
        std: ``"population"`` (divide by n, default) or ``"sample"`` (Bessel-corrected:
            TRL, verl, OpenRLHF).
        scale: ``"group"`` (default), ``"batch"`` (group mean, std of all rewards in the
            call: TRL's ``scale_rewards="batch"``) or ``"none"`` (Dr. GRPO).
        baseline, epsilon_mode, singleton: see :func:`advantages_from_stats`.
        nan: ``"error"`` (default) raises on NaN or infinite rewards; ``"ignore"`` leaves
            them out of the statistics and gives them advantage 0 (TRL's convention).

    Returns:
        :class:`GroupAdvantages`: ``advantages`` (rewards' shape, dtype, device),
        ``active_group_mask`` (bool, ``(K,)``, by group ID) and ``active_group_count``.

    Raises:
        ValueError: naming the offending value, for mismatched shapes or devices,
            non-integer or negative IDs, non-floating or non-finite rewards, a bad epsilon
            or option, or a length that ``group_size`` does not divide.

    >>> out = normalize_in_groups(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]), 1e-8)
    >>> out["advantages"], out["active_group_mask"], out["active_group_count"]
    (tensor([-1.,  1.]), tensor([True]), 1)
    >>> out = normalize_in_groups(torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1]), 1e-8)
    >>> out["advantages"], out["active_group_mask"], out["active_group_count"]
    (tensor([-1.,  1.,  0.,  0.]), tensor([ True, False]), 1)
    >>> out = normalize_in_groups(torch.tensor([4.0, 4.0]), torch.tensor([0, 0]))
    >>> out["advantages"], out["active_group_mask"], out["active_group_count"]
    (tensor([0., 0.]), tensor([False]), 0)
    >>> normalize_in_groups(torch.tensor([[0.0, 1.0], [1.0, 1.0]]), epsilon=1e-8)["advantages"]
    tensor([[-1.,  1.],
            [ 0.,  0.]])
    """
    _check_rewards(rewards, allow_nonfinite=True)
    _check_epsilon(epsilon)
    check_choice("std", std, Std)
    check_choice("scale", scale, Scale)
    flat, layout = _layout(rewards, group_ids, group_size)
    check_choice("baseline", baseline, Baseline)
    check_choice("epsilon_mode", epsilon_mode, EpsilonMode)
    check_choice("singleton", singleton, Singleton)
    check_choice("nan", nan, NanPolicy)
    valid = None
    if nan == "ignore":
        finite = torch.isfinite(flat)
        valid = None if bool(finite.all()) else finite
    stats = _group_stats(flat, layout, valid, count_extremes=baseline == "leave-one-out")
    if nan == "error" and not bool(torch.isfinite(stats.mean).all()):
        # A NaN or infinite reward makes its group's sum non-finite: checking the K
        # group means instead of the N rewards keeps a pass off the common path.
        _check_rewards(rewards)
    norm = prepare_normalization(
        stats,
        epsilon=epsilon,
        std=std,
        scale=scale,
        baseline=baseline,
        epsilon_mode=epsilon_mode,
        singleton=singleton,
    )
    advantages = _apply(flat, layout, norm, valid)
    mask = norm.active
    return GroupAdvantages(
        advantages=advantages.to(rewards.dtype).view(rewards.shape),
        active_group_mask=mask,
        active_group_count=int(mask.sum()),
    )


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
    ) -> None:
        if block_rows < 1:
            raise ValueError(f"block_rows must be positive, got {block_rows}")
        if group_size is not None and group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        self.device = torch.device(device)
        self.block_rows = block_rows
        self.group_size = group_size
        self.count_extremes = count_extremes
        self.rows_seen = 0
        self._pending: list[tuple[Tensor, Tensor | None, Tensor | None]] = []
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
        rewards = _joined([p[0] for p in self._pending])
        ids = (
            None
            if self.group_size is not None
            else _joined([p[1] for p in self._pending if p[1] is not None])
        )
        any_valid = any(p[2] is not None for p in self._pending)
        valid = (
            _joined(
                [p[2] if p[2] is not None else torch.ones_like(p[0], dtype=torch.bool) for p in self._pending]
            )
            if any_valid
            else None
        )
        head_r, rest_r = rewards[:rows], rewards[rows:]
        head_i = None if ids is None else ids[:rows]
        head_v = None if valid is None else valid[:rows]
        self._pending = (
            [(rest_r, None if ids is None else ids[rows:], None if valid is None else valid[rows:])]
            if rest_r.numel()
            else []
        )
        self._pending_rows = rest_r.numel()
        block, first_group = self._block_stats(head_r.to(self.device), head_i, head_v)
        self.rows_seen += rows
        self._running.merge_at(block, first_group)

    def _block_stats(
        self, rewards: Tensor, ids: Tensor | None, valid: Tensor | None
    ) -> tuple[GroupStats, int]:
        """A block's statistics over the groups from its lowest ID to its highest, and that
        lowest ID: a block of a few groups among millions (sorted or grouped input) is reduced
        and merged over its own groups only."""
        if valid is not None:
            valid = valid.to(self.device)
        if self.group_size is not None:
            return self._consecutive_block_stats(rewards, valid), self.rows_seen // self.group_size
        assert ids is not None
        ids = ids.to(self.device, torch.int64)
        blocks = _block_layout(ids)
        if blocks is not None:  # the block's own groups, from its first
            low, high = blocks.first_group, blocks.num_groups - 1
            layout = _Layout(high - low + 1, group_size=blocks.group_size)
        else:
            low, high = (int(v) for v in ids.aminmax())
            layout = _Layout(high - low + 1, group_ids=ids - low if low else ids)
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


def _joined(pieces: Sequence[Tensor]) -> Tensor:
    """``pieces`` end to end: the one piece itself, uncopied, where there is one."""
    return pieces[0] if len(pieces) == 1 else torch.cat(list(pieces))


# --------------------------------------------------------------------------- batch whitening


@dataclass(frozen=True)
class WeightedMoments:
    """Per-batch weighted moments of advantages, all float64 of shape ``(num_batches,)``.

    ``weight`` is the sum of the weights (rows, or tokens with a length weight), ``mean``
    the weighted mean and ``m2`` the weighted centred sum of squares. Merge chunks with
    :func:`merge_weighted_moments`.
    """

    weight: Tensor
    mean: Tensor
    m2: Tensor
    count: Tensor  # rows, int64


def weighted_moments(
    values: Tensor,
    weights: Tensor | None,
    batch_ids: Tensor,
    num_batches: int,
    *,
    valid: Tensor | None = None,
) -> WeightedMoments:
    """Weighted moments of ``values`` per batch (corrected two-pass), in float64.

    ``valid`` (bool, the rows' shape; ``None``: all): rows whose reward was left out of the
    statistics are left out here too, as TRL's ``nanstd`` leaves out unscorable rows.

    >>> m = weighted_moments(torch.tensor([1.0, 3.0, 10.0]), None, torch.tensor([0, 0, 1]), 2)
    >>> m.weight.tolist(), m.mean.tolist(), m.m2.tolist()
    ([2.0, 1.0], [2.0, 10.0], [2.0, 0.0])
    >>> weighted_moments(torch.tensor([1.0, 3.0, 0.0]), None, torch.tensor([0, 0, 0]), 1,
    ...                  valid=torch.tensor([True, True, False])).count.tolist()
    [2]
    """
    if valid is not None:
        values, batch_ids = values[valid], batch_ids[valid]
        weights = None if weights is None else weights[valid]
    x = values.to(torch.float64)
    w = torch.ones_like(x) if weights is None else weights.to(torch.float64)
    ids = batch_ids.to(torch.int64)

    def total(v: Tensor) -> Tensor:
        return torch.zeros(num_batches, dtype=torch.float64, device=x.device).index_add_(0, ids, v)

    weight = total(w)
    safe = torch.where(weight > 0, weight, torch.ones_like(weight))
    mean = total(w * x) / safe
    deviation = x - torch.take(mean, ids)
    correction = total(w * deviation) / safe
    m2 = (total(w * deviation * deviation) - correction * total(w * deviation)).clamp_min(0)
    count = torch.bincount(ids, minlength=num_batches)
    return WeightedMoments(weight, mean + correction, m2, count)


def merge_weighted_moments(a: WeightedMoments, b: WeightedMoments) -> WeightedMoments:
    """Combine the moments of two disjoint sets of rows (Chan et al., weighted)."""
    weight = a.weight + b.weight
    safe = torch.where(weight > 0, weight, torch.ones_like(weight))
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.weight / safe)
    m2 = a.m2 + b.m2 + delta * delta * (a.weight * b.weight / safe)
    return WeightedMoments(weight, mean, m2, a.count + b.count)


class WeightedMomentsAccumulator:
    """:func:`weighted_moments` over chunks fed in row order, cut into blocks at fixed global row
    positions (multiples of ``block_rows``) as :class:`GroupStatsAccumulator` cuts them: the
    moments, and so the whitened advantages, depend only on the rows and their order, not on the
    sizes of the record batches they were read in.

    >>> acc = WeightedMomentsAccumulator(num_batches=1, block_rows=4)
    >>> acc.update(torch.tensor([1.0, 3.0]), None, torch.tensor([0, 0]))
    >>> acc.update(torch.tensor([5.0]), None, torch.tensor([0]))
    >>> m = acc.compute()
    >>> m.mean.tolist(), m.m2.tolist(), m.count.tolist()
    ([3.0], [8.0], [3])
    """

    def __init__(self, *, num_batches: int, block_rows: int = 1 << 22) -> None:
        if block_rows < 1:
            raise ValueError(f"block_rows must be positive, got {block_rows}")
        self.num_batches = num_batches
        self.block_rows = block_rows
        self._pending: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self._pending_rows = 0
        self._total = weighted_moments(torch.zeros(0), None, torch.zeros(0, dtype=torch.int64), num_batches)

    def update(
        self, values: Tensor, weights: Tensor | None, batch_ids: Tensor, *, valid: Tensor | None = None
    ) -> None:
        """Add a chunk: values ``(n,)``, weights ``(n,)`` or ``None``, batch IDs ``(n,)`` int,
        ``valid`` bool ``(n,)`` or ``None`` (see :func:`weighted_moments`)."""
        n = values.numel()
        if n == 0:
            return
        x = values.reshape(-1).to(torch.float64)
        w = torch.ones_like(x) if weights is None else weights.reshape(-1).to(torch.float64)
        keep = torch.ones_like(x, dtype=torch.bool) if valid is None else valid.reshape(-1)
        self._pending.append((x, w, batch_ids.reshape(-1).to(torch.int64), keep))
        self._pending_rows += n
        while self._pending_rows >= self.block_rows:
            self._flush(self.block_rows)

    def compute(self) -> WeightedMoments:
        if self._pending_rows:
            self._flush(self._pending_rows)
        return self._total

    def _flush(self, rows: int) -> None:
        x, w, ids, keep = (torch.cat([p[i] for p in self._pending]) for i in range(4))
        self._pending = [(x[rows:], w[rows:], ids[rows:], keep[rows:])] if x.numel() > rows else []
        self._pending_rows = x.numel() - rows
        block = weighted_moments(x[:rows], w[:rows], ids[:rows], self.num_batches, valid=keep[:rows])
        self._total = merge_weighted_moments(self._total, block)


@dataclass(frozen=True)
class BatchTransform:
    """``A = (A0 - shift[b]) * factor[b]`` for a row of batch ``b``; float64 ``(num_batches,)``."""

    shift: Tensor
    factor: Tensor

    def apply(self, advantages: Tensor, batch_ids: Tensor) -> Tensor:
        """The transformed advantages, in float64."""
        x = advantages.to(torch.float64)
        ids = batch_ids.to(torch.int64)
        return (x - torch.take(self.shift, ids)) * torch.take(self.factor, ids)


def whitening(moments: WeightedMoments, *, method: str) -> BatchTransform:
    """The batch transform that whitens advantages with these moments.

    ``method``:

    * ``"unbiased"``: verl's ``masked_whiten`` (ROLL's whitening): weighted mean, unbiased
      variance ``m2 / (W - 1)``, ``(x - mean) * rsqrt(var + 1e-8)``;
    * ``"population"``: OpenRLHF's advantage whitening: ``m2 / W``,
      ``(x - mean) * rsqrt(max(var, 1e-8))``;
    * ``"trl-rloo"``: TRL RLOOTrainer's ``normalize_advantages``: mean and sample std over the
      batch's rows, ``(x - mean) / (std + 1e-4)``;
    * ``"areal"``: AReaL's ``Normalization`` at the batch level (``adv_norm``): weighted mean,
      unbiased std ``sqrt(m2 / (W - 1))`` (1 where ``W <= 1``), ``(x - mean) / (std + 1e-5)``;
    * ``"trl"``: TRL's re-normalisation of the summed per-reward advantages: no shift (the
      exact mean is 0: each reward's advantages sum to 0 in every group), sample std over
      rows, ``x / (std + 1e-4)``;
    * ``"gdpo"``: NeMo-RL's GDPO: ``(x - mean) / std`` with the sample std over rows, or
      only ``x - mean`` where that std is 0.

    >>> m = weighted_moments(torch.tensor([1.0, 3.0]), None, torch.tensor([0, 0]), 1)
    >>> whitening(m, method="population").apply(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    tensor([-1.,  1.], dtype=torch.float64)
    """
    weight, mean, m2 = moments.weight, moments.mean, moments.m2
    rows = moments.count.to(torch.float64)
    if method == "unbiased":
        variance = m2 / (weight - 1).clamp_min(1)
        return BatchTransform(mean, 1 / sqrt_rn(variance + 1e-8))
    if method == "population":
        variance = m2 / weight.clamp_min(1)
        return BatchTransform(mean, 1 / sqrt_rn(variance.clamp_min(1e-8)))
    if method == "trl-rloo":
        rows_std = sqrt_rn(m2 / (rows - 1).clamp_min(1))
        return BatchTransform(mean, 1 / (rows_std + 1e-4))
    if method == "areal":
        std = torch.where(weight > 1, sqrt_rn(m2 / (weight - 1).clamp_min(1)), torch.ones_like(m2))
        return BatchTransform(mean, 1 / (std + 1e-5))
    sample_std = sqrt_rn(m2 / (rows - 1).clamp_min(1))
    if method == "trl":
        return BatchTransform(torch.zeros_like(mean), 1 / (sample_std + 1e-4))
    if method == "gdpo":
        return BatchTransform(mean, 1 / torch.where(sample_std > 0, sample_std, torch.ones_like(sample_std)))
    raise ValueError(f"method must be unbiased, population, areal, trl-rloo, trl or gdpo, got {method!r}")


# --------------------------------------------------------------------------- Pass@k


NO_ROW = torch.iinfo(torch.int64).max
""":attr:`TopTwo.best_row` of a group with no scored reward."""


@dataclass(frozen=True)
class TopTwo:
    """Per group, the largest reward and the second largest (equal to it on a tie), float64,
    and ``best_row`` (int64): the input position of the first row whose reward is the largest.

    An empty group has ``-inf`` for both and :data:`NO_ROW`; a one-rollout group ``-inf``
    for the second. Every figure merges exactly, in any order (:func:`merge_top_two`).
    """

    first: Tensor
    second: Tensor
    best_row: Tensor


def group_top_two(
    values: Tensor, group_ids: Tensor, num_groups: int, *, positions: Tensor | None = None
) -> TopTwo:
    """The two largest values of each group, as ``torch.topk(rewards, 2)`` gives them, and the
    position of the first row holding the largest (``positions``: each value's row in the whole
    input, int64 ``(N,)``; by default ``0 .. N-1``).

    >>> top = group_top_two(torch.tensor([0.25, 0.75, 0.75, 0.5]), torch.tensor([0, 0, 0, 1]), 2)
    >>> top.first.tolist(), top.second.tolist(), top.best_row.tolist()
    ([0.75, 0.5], [0.75, -inf], [1, 3])
    """
    x = values.to(torch.float64)
    ids = group_ids.to(torch.int64)
    rows = torch.arange(x.numel(), device=x.device) if positions is None else positions.to(torch.int64)
    empty = torch.full((num_groups,), -math.inf, dtype=torch.float64, device=x.device)
    first = empty.clone().scatter_reduce_(0, ids, x, "amax")
    at_first = x == torch.take(first, ids)
    ties = torch.zeros(num_groups, dtype=torch.int64, device=x.device).index_add_(
        0, ids, at_first.to(torch.int64)
    )
    below = torch.where(at_first, torch.full_like(x, -math.inf), x)
    second = empty.clone().scatter_reduce_(0, ids, below, "amax")
    best_row = torch.full((num_groups,), NO_ROW, dtype=torch.int64, device=x.device)
    best_row = best_row.scatter_reduce_(0, ids[at_first], rows[at_first], "amin")
    return TopTwo(first, torch.where(ties >= 2, first, second), best_row)


def empty_top_two(num_groups: int, *, device: torch.device | str = "cpu") -> TopTwo:
    """The top two of ``num_groups`` groups without a row: ``-inf``, ``-inf`` and :data:`NO_ROW`.

    >>> empty_top_two(1).best_row.tolist()
    [9223372036854775807]
    """
    pad = torch.full((num_groups,), -math.inf, dtype=torch.float64, device=device)
    return TopTwo(pad, pad.clone(), torch.full((num_groups,), NO_ROW, dtype=torch.int64, device=device))


def padded_top_two(top: TopTwo, num_groups: int) -> TopTwo:
    """``top`` with empty groups appended up to ``num_groups``.

    >>> padded_top_two(group_top_two(torch.tensor([1.0]), torch.tensor([0]), 1), 2).best_row.tolist()
    [0, 9223372036854775807]
    """
    extra = num_groups - top.first.numel()
    if extra <= 0:
        return top
    pad = empty_top_two(extra, device=top.first.device)
    return TopTwo(
        *(torch.cat([getattr(top, name), getattr(pad, name)]) for name in ("first", "second", "best_row"))
    )


def merge_top_two(a: TopTwo, b: TopTwo) -> TopTwo:
    """The top two of the union of two sets of rows, per group, and its first best row."""
    first = torch.maximum(a.first, b.first)
    # on a tie of the two firsts, the second is that same value (-inf when both sides are empty)
    second = torch.where(
        a.first > b.first,
        torch.maximum(a.second, b.first),
        torch.where(b.first > a.first, torch.maximum(b.second, a.first), a.first),
    )
    best_row = torch.where(
        a.first > b.first,
        a.best_row,
        torch.where(b.first > a.first, b.best_row, torch.minimum(a.best_row, b.best_row)),
    )
    return TopTwo(first, second, best_row)


class RunningTopTwo:
    """The top two of the groups seen so far, grown in place by doubling: each part's top two
    merged (:func:`merge_top_two`, exact in any order) over its own groups only, where
    merging over every group seen so far costs all of them per part.

    >>> running, one = RunningTopTwo(), torch.tensor([0])
    >>> running.merge_rows(group_top_two(torch.tensor([0.5, 1.0]), torch.arange(2), 2), torch.arange(2), 2)
    >>> running.merge_rows(group_top_two(torch.tensor([2.0]), one, 1), torch.tensor([2]), 3)
    >>> running.merge_rows(group_top_two(torch.tensor([0.75]), one, 1), one, 3)
    >>> top = running.result(); top.first.tolist(), top.second.tolist()
    ([0.75, 1.0, 2.0], [0.5, -inf, -inf])
    """

    NAMES = ("first", "second", "best_row")

    def __init__(self) -> None:
        self._storage: TopTwo | None = None
        self.size = 0
        self._handed_out = False

    def merge_rows(self, top: TopTwo, group_ids: Tensor, num_groups: int) -> None:
        """Merge ``top``, whose entry ``i`` is group ``group_ids[i]`` (int64, no repeats, each
        below ``num_groups``, the groups seen once it is merged)."""
        storage = self._storage
        groups = max(num_groups, self.size)
        if storage is None or storage.first.numel() < groups or self._handed_out:
            self._handed_out = False
            grown = empty_top_two(
                max(groups, 2 * (0 if storage is None else storage.first.numel())), device=top.first.device
            )
            if storage is not None:
                for name in self.NAMES:
                    getattr(grown, name)[: self.size] = getattr(storage, name)[: self.size]
            storage = self._storage = grown
        group_ids = group_ids.to(storage.first.device)
        seen = group_ids < self.size
        if bool(seen.any()):
            at = group_ids[seen]
            merged = merge_top_two(
                TopTwo(*(getattr(storage, name)[at] for name in self.NAMES)),
                TopTwo(*(getattr(top, name)[seen] for name in self.NAMES)),
            )
            for name in self.NAMES:
                getattr(storage, name).index_copy_(0, at, getattr(merged, name))
        fresh = ~seen
        if bool(fresh.any()):
            for name in self.NAMES:
                getattr(storage, name).index_copy_(0, group_ids[fresh], getattr(top, name)[fresh])
        self.size = groups

    def result(self, num_groups: int | None = None) -> TopTwo | None:
        """The groups seen so far (padded with empty ones to ``num_groups``), or ``None``
        before any part."""
        if self._storage is None:
            return None
        self._handed_out = True
        top = TopTwo(*(getattr(self._storage, name)[: self.size] for name in self.NAMES))
        return top if num_groups is None else padded_top_two(top, num_groups)


def passk_best_advantage(
    stats: GroupStats,
    top: TopTwo,
    active: Tensor,
    *,
    epsilon: float,
    std: Std = "sample",
    scale: Scale = "group",
) -> Tensor:
    """verl's Pass@k advantage of each group's best rollout: ``(r_max - r_second) / (std + eps)``.

    Shapes ``(K,)``; float64; 0 for an inactive group or one with fewer than two rollouts,
    and no division with ``scale="none"``. The other rollouts get 0 (:func:`passk_advantages`).

    >>> r, g = torch.tensor([1.0, 0.0, 0.5, 2.0]), torch.tensor([0, 0, 0, 1])
    >>> stats = group_stats(r, g)
    >>> best = passk_best_advantage(stats, group_top_two(r, g, 2), active_groups(stats), epsilon=1e-6)
    >>> best.tolist()
    [0.999998000004, 0.0]
    """
    stats = stats.to(str(top.first.device))
    gap = torch.where(stats.count >= 2, top.first - top.second, torch.zeros_like(top.first))
    if scale != "none":
        gap = gap / (group_std(stats, ddof=1 if std == "sample" else 0) + epsilon)
    return torch.where(active.to(gap.device), gap, torch.zeros_like(gap))


def passk_advantages(group_ids: Tensor, positions: Tensor, best_row: Tensor, best: Tensor) -> Tensor:
    """Pass@k row advantages: ``best[g]`` on group ``g``'s best row (the first, in input
    order, whose reward is the group's largest: :attr:`TopTwo.best_row`), 0 elsewhere;
    float64, shape ``(N,)`` of ``group_ids``. ``positions`` (int64 ``(N,)``) are the rows'
    places in the whole input, so that any slice of the rows can be passed on its own.

    >>> ids, best_row, best = torch.tensor([0, 0, 0]), torch.tensor([1]), torch.tensor([0.5])
    >>> passk_advantages(ids, torch.tensor([0, 1, 2]), best_row, best)
    tensor([0.0000, 0.5000, 0.0000], dtype=torch.float64)
    >>> passk_advantages(ids[:1], torch.tensor([2]), best_row, best)  # a later slice
    tensor([0.], dtype=torch.float64)
    """
    ids = group_ids.to(torch.int64)
    at_best = positions.to(device=ids.device, dtype=torch.int64) == best_row.to(ids.device)[ids]
    values = best.to(device=ids.device, dtype=torch.float64)[ids]
    return torch.where(at_best, values, torch.zeros_like(values))


def pass_at_k_weights(n: int, k: int) -> tuple[Tensor, Tensor]:
    """PKPO's weights for a group of ``n`` rollouts sorted by reward, ``k`` clamped to
    ``[1, n]``: at 1-based position ``m``, ``own[m-1] = C(m-1, k-1) / C(n, k)`` (the
    k-subsets that hold the rollout and whose maximum it is) and ``above[m-1] =
    C(m-2, k-2) / C(n, k)`` (the k-subsets that hold a given lower rollout and whose maximum
    is this one). Each is the correctly rounded float64 of an exact ratio of integers;
    shapes ``(n,)``.

    >>> own, above = pass_at_k_weights(4, 2)
    >>> (own * 6).tolist(), (above * 6).tolist()
    ([0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 1.0, 1.0])
    """
    k = min(max(k, 1), n)
    total = math.comb(n, k)
    # int / int is correctly rounded in Python, however large the binomials
    own = [math.comb(m - 1, k - 1) / total for m in range(1, n + 1)]
    above = [math.comb(m - 2, k - 2) / total if k >= 2 and m >= 2 else 0.0 for m in range(1, n + 1)]
    return torch.tensor(own, dtype=torch.float64), torch.tensor(above, dtype=torch.float64)


def pass_at_k_advantages(
    rewards: Tensor, group_ids: Tensor, num_groups: int, *, k: int, active: Tensor | None = None
) -> Tensor:
    """Pass@k policy optimisation (PKPO, arXiv:2505.15201): each rollout's credit is the mean,
    over the k-subsets of its group, of the subset's maximum reward counted where the subset
    holds the rollout, ``credit_i = sum_{S ni i, |S| = k} max_{j in S} r_j / C(n, k)``; the
    advantage is the credit minus its group mean. Exact for any ``k``, binary or continuous
    rewards (clamped to ``[1, n]`` per group); tied rewards get the same credit.

    ``rewards``, ``group_ids``: shape ``(N,)`` (the valid rows only); ``active`` (bool,
    ``(num_groups,)``): a group not active gets exactly 0. Computed in float64 from the sorted
    rewards: a rollout at position ``m`` gets ``own[m] r_m + sum_{p > m} above[p] r_p``
    (:func:`pass_at_k_weights`). Returns float64, shape ``(N,)``.

    >>> r = torch.tensor([1.0, 0.0, 1.0, 0.0])  # n = 4, two correct, k = 2: +-1/12
    >>> advantages = pass_at_k_advantages(r, torch.zeros(4, dtype=torch.int64), 1, k=2)
    >>> [round(12 * a, 12) for a in advantages.tolist()]
    [1.0, -1.0, 1.0, -1.0]
    """
    x = rewards.to(torch.float64)
    ids = group_ids.to(torch.int64)
    result = torch.zeros(x.numel(), dtype=torch.float64, device=x.device)
    if x.numel() == 0:
        return result
    by_reward = torch.argsort(x, stable=True)
    order = by_reward[torch.argsort(ids[by_reward], stable=True)]  # by group, then by reward
    counts = torch.bincount(ids, minlength=num_groups)
    sizes_of_rows = counts[ids[order]]
    for n in torch.unique(sizes_of_rows).tolist():
        rows = order[sizes_of_rows == n]  # whole groups of n rows, each sorted by reward
        ranked = x[rows].view(-1, n)
        own, above = (w.to(x.device) for w in pass_at_k_weights(int(n), k))
        higher = ranked * above
        after = torch.flip(torch.cumsum(torch.flip(higher, [1]), 1), [1])
        after = torch.cat([after[:, 1:], torch.zeros_like(after[:, :1])], dim=1)  # positions above m
        credit = own * ranked + after
        last_tie = torch.searchsorted(ranked, ranked, right=True) - 1  # each tie run's last credit
        # Every rollout with fewer than k rollouts below it has one exact credit (each of its
        # k-subsets holds a rollout at least as good as the others'): the credit of the last of
        # them, at or past sorted position k - 1, so that rounding cannot tell them apart.
        lowest = last_tie[:, min(max(k, 1), int(n)) - 1 :][:, :1]
        credit = credit.gather(1, torch.maximum(last_tie, lowest))
        advantage = credit - (fold_sum(credit, dim=1) / n)[:, None]
        # where every rollout shares that credit (fewer than k below the best) the exact
        # advantages are 0: the mean of n equal credits, rounded, may not be the credit
        uniform = lowest[:, 0] == int(n) - 1
        result[rows] = torch.where(uniform[:, None], torch.zeros_like(advantage), advantage).flatten()
    if active is not None:
        result = torch.where(active.to(x.device)[ids], result, torch.zeros_like(result))
    return result


def gpg_row_scale(batch_rows: Tensor, batch_nonzero: Tensor, *, f_norm: float = 1.0) -> Tensor:
    """verl's GPG factor of each training batch: ``alpha / f_norm``, with ``alpha`` the batch's
    rows over its rows with a non-zero reward (at least 1); float64, shape ``(B,)``.

    >>> gpg_row_scale(torch.tensor([8, 4]), torch.tensor([2, 0]))
    tensor([4., 4.], dtype=torch.float64)
    """
    alpha = batch_rows.to(torch.float64) / batch_nonzero.clamp_min(1).to(torch.float64)
    return alpha / f_norm


def length_weighted_baseline(count: Tensor, length_sums: Tensor, weighted_sums: Tensor) -> Tensor:
    """verl's OPO baseline of each group: ``sum(length * r) / sum(length)`` over its valid rows;
    0 for a one-rollout group or one whose lengths sum to 0. Shapes ``(K,)``; float64.

    >>> length_weighted_baseline(torch.tensor([2, 1]), torch.tensor([3.0, 5.0]), torch.tensor([2.0, 5.0]))
    tensor([0.6667, 0.0000], dtype=torch.float64)
    """
    lengths = length_sums.to(torch.float64)
    safe = torch.where(lengths > 0, lengths, torch.ones_like(lengths))
    baseline = weighted_sums.to(torch.float64) / safe
    return torch.where((count.to(lengths.device) > 1) & (lengths > 0), baseline, torch.zeros_like(baseline))


def row_baseline_advantages(rewards: Tensor, baseline: Tensor, valid: Tensor) -> Tensor:
    """``r - baseline`` per row where ``valid``, else 0 (ReMax's greedy baseline, OPO's group
    baseline gathered per row); float64, shape ``(N,)``.

    >>> valid = torch.tensor([True, False])
    >>> row_baseline_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.25, 0.5]), valid)
    tensor([0.7500, 0.0000], dtype=torch.float64)
    """
    difference = rewards.to(torch.float64) - baseline.to(torch.float64)
    return torch.where(valid, difference, torch.zeros_like(difference))


# --------------------------------------------------------------------------- reward transforms


def shaped_rewards(
    rewards: Tensor,
    *,
    lengths: Tensor | None = None,
    truncated: Tensor | None = None,
    overlong: tuple[float, float] | None = None,
    overlong_factor: float = 1.0,
    overlong_capped: bool = True,
    stop_properly: float | None = None,
    bias: float = 0.0,
    scale: float = 1.0,
    clip: tuple[float, float] | None = None,
) -> Tensor:
    """The rewards after the transforms trainers apply before their estimator, in this order;
    float64, shape of ``rewards`` ``(N,)`` (a NaN stays NaN).

    1. ``overlong = (max_tokens, buffer)``: DAPO's overlong penalty on a response of
       ``lengths`` tokens, ``-(length - (max_tokens - buffer)) / buffer * overlong_factor``
       where positive; ``overlong_capped`` caps the excess at ``buffer`` (a floor of
       ``-overlong_factor``: OpenRLHF ``apply_overlong_penalty``, the DAPO paper), else it
       grows without bound (NeMo-RL ``apply_reward_shaping``);
    2. ``stop_properly``: ProRL's penalty on a ``truncated`` rollout (bool, ``(N,)``): a factor
       in ``[0, 1]`` on its reward, or, negative, its reward (OpenRLHF);
    3. ``(r + bias) * scale`` (AReaL's ``reward_bias`` and ``reward_scaling``);
    4. ``clip = (lo, hi)``: clamp (TRL RLOO's ``reward_clip_range``, AReaL's ``reward_clip``).

    >>> r = torch.tensor([1.0, 1.0, 0.0, 1.0])
    >>> shaped_rewards(r, lengths=torch.tensor([10.0, 90.0, 99.0, 200.0]), overlong=(100, 20)).tolist()
    [1.0, 0.5, -0.95, 0.0]
    >>> shaped_rewards(r, truncated=torch.tensor([False, True, True, False]), stop_properly=0.5).tolist()
    [1.0, 0.5, 0.0, 1.0]
    """
    x = rewards.to(torch.float64)
    if overlong is not None:
        if lengths is None:
            raise ValueError("the overlong penalty needs each response's length")
        max_tokens, buffer = overlong
        exceed = lengths.to(torch.float64) - (max_tokens - buffer)
        if overlong_capped:
            exceed = exceed.clamp(max=buffer)
        x = x + torch.clamp(-exceed / buffer * overlong_factor, max=0.0)
    if stop_properly is not None:
        if truncated is None:
            raise ValueError("the stop-properly penalty needs each rollout's truncation flag")
        cut = truncated.to(torch.bool)
        penalised = torch.full_like(x, stop_properly) if stop_properly < 0 else x * stop_properly
        x = torch.where(cut & ~torch.isnan(x), penalised, x)
    if bias != 0.0 or scale != 1.0:
        x = (x + bias) * scale
    if clip is not None:
        x = x.clamp(clip[0], clip[1])
    return x
