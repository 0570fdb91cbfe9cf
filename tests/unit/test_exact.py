"""kernel.ExactSum and the batch moments built on it: exact sums, so any cut of the groups,
in any order, gives the bits of the whole (the summary's reward figures, ``--scale batch``)."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from grpo_cli import kernel
from grpo_cli.kernel import ExactSum
from grpo_cli.kernel import exact as exact_sums


def floats(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_an_exact_sum_takes_terms_of_every_magnitude_and_keeps_infinities():
    terms = np.array([1e308, 1e308, -1e308, 2.0**-1074, 5e-324, 0.0, -0.0])
    assert ExactSum.of(torch.from_numpy(terms)).value() == 1e308
    assert ExactSum.of(floats([1e308]), torch.tensor([10])).value() == math.inf
    assert (
        ExactSum.of(floats([1e308]), torch.tensor([10])) + ExactSum.of(floats([-1e308]), torch.tensor([10]))
    ).value() == 0.0
    assert ExactSum.of(floats([2.0**-1074])).ratio(2) == 0.0  # half the least subnormal rounds to even
    assert ExactSum.of(floats([3 * 2.0**-1074])).ratio(2) == 2 * 2.0**-1074
    assert ExactSum.of(floats([1.0, math.inf])).value() == math.inf
    assert math.isnan(ExactSum.of(floats([math.inf, -math.inf, 1.0])).value())


def exact_value(total: ExactSum) -> Fraction:
    return Fraction(total.scaled) * Fraction(2) ** kernel.EXACT_LOWEST_EXPONENT


finite_floats = st.floats(allow_nan=False, allow_infinity=False)
# terms of one magnitude band with full mantissas, as a summary's squares and products are
banded = st.tuples(st.integers(-1070, 1000), st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=60)).map(
    lambda band: [math.ldexp(f, band[0]) for f in band[1]]
)

# many terms at the top of their binade: their extracted parts add up to the headroom's edge
crowded = st.tuples(
    st.integers(-1000, 1000), st.lists(st.integers(1, 63) | st.integers(-63, -1), min_size=1, max_size=40)
).map(lambda top: [math.copysign(math.ldexp(1 - abs(k) * 2.0**-53, top[0]), k) for k in top[1]])


ROUNDS_TO_INFINITY = Fraction(2) ** 1024 - Fraction(2) ** 970


@settings(max_examples=300, deadline=None)
@given(terms=st.one_of(st.lists(finite_floats, max_size=60), banded, crowded))
@example(terms=[1.7976931348623157e308, 1.7976931348623157e308, -1.0, -1.7976931348623155e308])
@example(terms=[1.7976931348623157e308, 2.0**970])
@example(terms=[1.7976931348623157e308, 2.0**969])
def test_an_exact_sum_is_the_rational_sum_of_its_terms(terms):
    """Extraction rounds, their fall-back to exponent bins and the bins alone all give the
    exact rational sum, for terms of any magnitudes (subnormal to the largest)."""
    array = np.array(terms, dtype=np.float64)
    exact = sum((Fraction(t) for t in terms), Fraction(0))
    assert exact_value(ExactSum.of(torch.from_numpy(array))) == exact
    assert exact_sums._binned(torch.from_numpy(array), None) == ExactSum.of(torch.from_numpy(array)).scaled
    # at or past the midpoint between the largest float64 and 2**1024, round-to-nearest gives inf
    rounded = float(exact) if abs(exact) < ROUNDS_TO_INFINITY else (math.inf if exact > 0 else -math.inf)
    assert ExactSum.of(torch.from_numpy(array)).value() == rounded


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(finite_floats, min_size=1, max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_sum_of_products_rounds_each_product_once_and_never_overflows(values, seed):
    rng = random.Random(seed)
    counts = np.array([rng.choice([0, 1, 2, 3, 8, 1000, 2**40]) for _ in values], dtype=np.int64)
    array = np.array(values, dtype=np.float64)
    mantissa, exponent = np.frexp(array)
    # count * mantissa is the product rounded once; the power of two makes it exact at any size
    expected = sum(
        (
            Fraction(float(c * m)) * Fraction(2) ** int(e)
            for c, m, e in zip(counts, mantissa, exponent, strict=True)
        ),
        Fraction(0),
    )
    assert exact_value(ExactSum.of_products(torch.from_numpy(counts), torch.from_numpy(array))) == expected


def test_extracted_parts_that_fill_the_headroom_still_add_up_exactly():
    """Fifteen terms just under 1, mixed signs: sigma must sit 4 bits (15 < 2**4) above the
    largest term, or the float sum of their extracted parts rounds."""
    top = 1 - 56 * 2.0**-53
    signs = [1, 1, -1, 1, -1, 1, 1, 0, 1, 1, 1, 1, -1, 1, 1]
    terms = [sign * top if sign else 0.8215501447435144 for sign in signs]
    exact = sum((Fraction(t) for t in terms), Fraction(0))
    assert exact_value(ExactSum.of(floats(terms))) == exact


def test_an_exact_sum_scales_by_powers_of_two_exactly():
    total = ExactSum.of(floats([3 * 2.0**-1074, 1e300]))
    for power in (-2000, -1, 0, 1, 2000):
        assert exact_value(total.times_power_of_two(power)) == exact_value(total) * Fraction(2) ** power
    with pytest.raises(ValueError, match="below"):
        total.times_power_of_two(-3427)


def _parts_moments(stats: kernel.GroupStats, cuts: list[int], ddof: int) -> tuple[int, float, float]:
    """The batch's count, mean and std from its groups cut at ``cuts``, each round merged in
    reverse order, as a Ray run's buckets would give them."""
    bounds = [0, *cuts, stats.num_groups]
    parts = [stats.groups(a, b) for a, b in itertools.pairwise(bounds)]
    totals = sum((kernel.RewardTotals.of_stats(p) for p in reversed(parts)), kernel.RewardTotals())
    squares = sum((kernel.squared_deviations_of(p, totals) for p in reversed(parts)), ExactSum())
    return totals.rewards, totals.mean, totals.std(squares, ddof=ddof)


magnitudes = st.sampled_from([1e-3, 1.0, 7.0, 1e3, 1e-300, 1e300, 1e-80, 1e-310])


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6), min_size=1, max_size=30),
    magnitude=st.lists(magnitudes, min_size=1, max_size=3),
    seed=st.integers(0, 2**32 - 1),
    ddof=st.integers(0, 1),
    data=st.data(),
)
def test_the_batch_moments_of_any_cut_of_the_groups_are_the_wholes_bits(sizes, magnitude, seed, ddof, data):
    """Groups cut anywhere (empty groups among them, rewards of one or several magnitudes),
    each part's round 1 and round 2 merged in any order: the count, mean and std of the whole,
    bit for bit (what lets a Ray run's reducers compute --scale batch's divisor apart)."""
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(len(sizes)), sizes)
    rewards = rng.standard_normal(ids.size) * rng.choice(magnitude, ids.size)
    stats = kernel.group_stats(torch.from_numpy(rewards), torch.from_numpy(ids), len(sizes))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(sizes)), max_size=4)))
    n, mean, std = kernel.batch_mean_std(stats, ddof=ddof)
    assert _parts_moments(stats, cuts, ddof) == (n, mean.item(), std.item())


def test_the_batch_moments_are_exact_sums_rounded_once():
    """The mean is the exact sum of the groups' ``count * mean`` (each product rounded once)
    over the count, rounded once; the centred sum of squares is the exact sum of each group's
    m2 and its ``count * (mean - batch mean)**2`` as formed, rounded once. Checked against
    Python's fractions, on groups whose float sum in order would round."""
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 70, 3000)
    ids = np.repeat(np.arange(sizes.size), sizes)
    rewards = rng.random(ids.size) * rng.choice([1e-3, 1.0, 7.0, 1e3], ids.size)
    rewards[:3] = [1e16, -1e16, 1.0]  # a fold in order loses the 1.0
    stats = kernel.group_stats(torch.from_numpy(rewards), torch.from_numpy(ids))
    n, mean, m2 = kernel.batch_moments(stats)
    counts, means, group_m2 = stats.count.tolist(), stats.mean.tolist(), stats.m2.tolist()
    exact_sum = sum((Fraction(c * m) for c, m in zip(counts, means, strict=True)), Fraction(0))
    assert n == sum(counts) and mean.item() == float(exact_sum / n)
    exponent = math.frexp(max(abs(rewards.min()), abs(rewards.max())))[1]
    unit = math.ldexp(1.0, -exponent)
    terms = Fraction(0)
    for c, m, q in zip(counts, means, group_m2, strict=True):
        d = m * unit - mean.item() * unit
        terms += Fraction(q) + Fraction(c * (d * d)) * Fraction(2) ** (2 * exponent)
    assert m2.item() == float(terms)
    for ddof in (0, 1):  # the root of the mean square rounded once, itself rounded once
        assert kernel.batch_std(stats, ddof=ddof).item() == math.sqrt(float(terms / (n - ddof)))


def test_the_batch_std_is_the_summarys_reward_std():
    """One figure, one definition: --scale batch divides by the std the summary reports."""
    from grpo_cli.results.findings import findings_of
    from tests.unit.test_findings import part_of_rewards

    rng = np.random.default_rng(3)
    ids, rewards = np.sort(rng.integers(0, 50, 400)).tolist(), (rng.random(400) * 5 - 2).tolist()
    stats = kernel.group_stats(torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids))
    reward = findings_of([part_of_rewards(rewards, ids)], options={}).reward
    _n, mean, std = kernel.batch_mean_std(stats)
    assert (reward["mean"], reward["std"]) == (mean.item(), std.item())
