"""A batch's reward moments from its groups' statistics, exact sums rounded once (:class:`RewardTotals`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_cli.kernel.exact import ExactSum, _exact_terms
from grpo_cli.kernel.stats import GroupStats, group_scales


@dataclass(frozen=True)
class RewardTotals:
    """Round 1 of a batch's reward mean and standard deviation, from its groups: how many
    rewards, their extremes and their exact sum. ``+`` merges two parts' (any order), so the
    groups may be held apart (a Ray run's buckets) and give the bits of one machine.

    Round 2 is :func:`squared_deviations` from :attr:`mean`; :meth:`std` takes its merged sum.

    >>> from grpo_cli.kernel import group_stats
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

    >>> from grpo_cli.kernel import group_stats
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

    >>> from grpo_cli.kernel import group_stats
    >>> float(batch_std(group_stats(torch.tensor([1.0, 3.0, 5.0, 7.0]), torch.tensor([0, 0, 1, 1]))))
    2.23606797749979
    """
    return batch_mean_std(stats, ddof=ddof)[2]


def batch_mean_std(stats: GroupStats, *, ddof: int = 0) -> tuple[int, Tensor, Tensor]:
    """Count, mean and standard deviation of all rollouts, merged from the groups: bit for bit
    :func:`batch_moments`' count and mean and :func:`batch_std`.

    >>> from grpo_cli.kernel import group_stats
    >>> stats = group_stats(torch.tensor([1.0, 3.0, 5.0, 7.0]), torch.tensor([0, 0, 1, 1]))
    >>> n, mean, std = batch_mean_std(stats)
    >>> n, mean.item(), std.item()
    (4, 4.0, 2.23606797749979)
    """
    totals = RewardTotals.of_stats(stats)
    like = stats.mean.new_zeros(())
    std = totals.std(squared_deviations_of(stats, totals), ddof=ddof)
    return totals.rewards, like + totals.mean, like + std
