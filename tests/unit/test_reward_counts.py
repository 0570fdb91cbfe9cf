"""The raw reward histogram: each row in the bar whose ``[low, high)`` holds it, against an
exact reference of the grid, and the same integers however the rows are cut and merged."""

from __future__ import annotations

import bisect
import math
import random
import sys
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from grpo_cli.run.reward_counts import MANTISSA_BITS, RANGE_BARS, VALUE_BARS, RewardCounts, shortest_decimal


def grid_step(magnitude: Fraction) -> Fraction:
    """The grid's spacing at a magnitude: 4,096 points to each power of two (a linear step below
    float64's smallest normal, where a float's bits shifted lose their exponent)."""
    if magnitude < Fraction(2) ** -1022:
        return Fraction(2) ** (-1074 + 52 - MANTISSA_BITS)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    while Fraction(2) ** exponent > magnitude:
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= magnitude:
        exponent += 1
    return Fraction(2) ** (exponent - MANTISSA_BITS)


def reference_bin(value: float) -> tuple[Fraction, Fraction]:
    """The grid interval ``[low, high)`` holding ``value``, in exact arithmetic."""
    v = Fraction(value)
    if v >= 0:
        step = grid_step(v) if v else grid_step(Fraction(0))
        low = math.floor(v / step) * step
        return low, low + grid_step(low) if low else step
    magnitude = -v
    step = grid_step(magnitude)
    top = math.ceil(magnitude / step) * step  # the grid point at or beyond |v|
    below = top - grid_step(top - step / 2)  # the next grid point toward zero
    if top == magnitude:  # on the grid: [v, the next point toward zero)
        return -top, -below
    return -top, -(top - step)


def as_float(value: Fraction) -> float:
    """A grid point as a float: exact; past the largest float, infinity for the highest bin's
    end and the lowest float for the lowest bin's start (no float lies below it)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -sys.float_info.max


def reference_counts(values: np.ndarray) -> dict[tuple[float, float], int]:
    counts: dict[tuple[float, float], int] = {}
    for v in values.tolist():
        low, high = reference_bin(v)
        key = (as_float(low), as_float(high))
        counts[key] = counts.get(key, 0) + 1
    return counts


def assert_each_row_in_its_bar(values: np.ndarray, histogram: dict[str, Any]) -> None:
    """Every row counted once, in the bar whose ``[low, high)`` holds it; bars in order."""
    low, high = histogram["low"], histogram["high"]
    assert low == sorted(low) and all(a < b for a, b in zip(low, high, strict=True))
    assert all(b <= a for a, b in zip(low[1:], high[:-1], strict=True)) or histogram["kind"] == "values"
    counted = [0] * len(low)
    for v in values.astype(np.float64).tolist():
        at = bisect.bisect_right(low, v) - 1
        assert at >= 0 and low[at] <= v < high[at], (v, low[max(at, 0)], high[max(at, 0)])
        counted[at] += 1
    assert counted == histogram["counts"]
    assert histogram["rows"] == values.size == sum(histogram["counts"])


def test_binary_rewards_are_two_bars_at_0_and_1():
    rewards = np.array([0.0, 1.0, 1.0, np.nan, 0.0, 1.0], dtype=np.float32)
    scored = ~np.isnan(rewards)
    histogram = RewardCounts.of_rows(rewards, scored).histogram()
    assert histogram["kind"] == "values"
    assert histogram["labels"] == ["0", "1"] and histogram["counts"] == [2, 3]
    assert histogram["low"] == [0.0, 1.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_a_person_writes_are_labelled_as_written(dtype):
    written = [-0.5, -0.1, 0.0, 0.1, 0.2, 0.3, 0.7, 1.0, 1.1, 1.5, 3.0, 7.25, 100.0, 1e-3]
    values = np.repeat(np.array(written, dtype=dtype), np.arange(1, len(written) + 1))
    histogram = RewardCounts.of_rows(values, None).histogram()
    assert histogram["kind"] == "values"
    expected = sorted(zip(written, range(1, len(written) + 1), strict=True))
    assert histogram["labels"] == [format(w, "g") for w, _ in expected]
    assert histogram["counts"] == [c for _, c in expected]
    assert_each_row_in_its_bar(values, histogram)


def test_each_value_bar_is_the_grid_interval_that_holds_its_rows():
    values = np.array([-3.7, -1.0, -(2**-1030), -0.0, 5e-324, 0.3, 1 / 3, 2.0, 1e300, -1e-310])
    histogram = RewardCounts.of_rows(values, None).histogram()
    assert histogram["kind"] == "values"
    reference = reference_counts(values)
    assert list(zip(histogram["low"], histogram["high"], strict=True)) == sorted(reference)
    assert histogram["counts"] == [reference[k] for k in sorted(reference)]
    for label, a, b in zip(histogram["labels"], histogram["low"], histogram["high"], strict=True):
        assert Fraction(a) <= Fraction(label) < Fraction(b)


def test_many_values_are_drawn_in_equal_power_of_two_bars_with_exact_counts():
    rng = np.random.default_rng(3)
    values = rng.normal(0.2, 0.3, 5000)
    histogram = RewardCounts.of_rows(values, None).histogram()
    assert histogram["kind"] == "ranges"
    widths = {b - a for a, b in zip(histogram["low"], histogram["high"], strict=True)}
    (width,) = widths
    assert math.log2(width).is_integer()
    assert 10 < len(histogram["counts"]) <= RANGE_BARS
    assert_each_row_in_its_bar(values, histogram)


def test_rewards_far_from_zero_across_a_power_of_two_fall_whole_into_bars():
    """Below 1024 a bin is 1/8 wide, above it 1/4: 61 bins over 10, in 11 bars of 1."""
    values = 1024.0 + np.arange(-40, 41) / 8
    assert RewardCounts.of_rows(values, None).counts.size == 61
    histogram = RewardCounts.of_rows(values, None).histogram()
    assert histogram["kind"] == "ranges" and histogram["high"][0] - histogram["low"][0] == 1.0
    assert len(histogram["counts"]) == 11
    assert_each_row_in_its_bar(values, histogram)


def test_no_scored_row_is_no_bar():
    histogram = RewardCounts.of_rows(np.array([np.nan]), np.array([False])).histogram()
    assert histogram == {"kind": "none", "rows": 0, "labels": [], "counts": [], "low": [], "high": []}


@pytest.mark.parametrize("values", [[1e-45, 3e-40, -2e-39, 1.0, 0.0], [1e-45, 0.0, 1.0], [-1e-45, 0.0]])
def test_float32_subnormals_are_counted_on_the_float64_grid(values):
    """Where float32's grid holds its subnormals, even in the zero's bin, the float64 grid counts."""
    values = np.array(values, dtype=np.float32)
    assert_same(RewardCounts.of_rows(values, None), RewardCounts.of_rows(values.astype(np.float64), None))
    assert RewardCounts.of_rows(values, None).zeros == np.count_nonzero(values == 0)


def test_the_bins_next_to_zero_on_each_side_are_counted():
    values = np.array([-5e-324, -1e-310, 0.0, -0.0, 5e-324, 1.0, -2.0])
    assert_each_row_in_its_bar(values, RewardCounts.of_rows(values, None).histogram())
    assert RewardCounts.of_rows(values, None).bins()[2].tolist() == [1, 1, 1, 3, 1]


def assert_same(a: RewardCounts, b: RewardCounts) -> None:
    assert a.zeros == b.zeros
    assert a.keys.tolist() == b.keys.tolist() and a.counts.tolist() == b.counts.tolist()


finite = st.floats(allow_nan=False, allow_infinity=False)
few = st.sampled_from([0.0, -0.0, 1.0, 0.5, -1.0, 0.1, 1e-300, -2.5, 1e308, 5e-324, -5e-324])


@settings(max_examples=150, deadline=None)
@given(
    values=st.one_of(
        hnp.arrays(np.float64, st.integers(1, 300), elements=finite),
        hnp.arrays(np.float64, st.integers(1, 300), elements=few),
        hnp.arrays(
            np.float32,
            st.integers(1, 300),
            elements=st.floats(width=32, allow_nan=False, allow_infinity=False),
        ),
        hnp.arrays(np.float64, st.integers(1, 300), elements=st.floats(-2.0, 3.0)),
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_cut_and_order_of_the_rows_counts_the_same(values, seed):
    """The bins of an exact reference; the counts of the whole equal those of its chunks merged
    in any order; every row lands in the bar that holds it, float32 as its float64 value."""
    whole = RewardCounts.of_rows(values, None)
    reference = reference_counts(values)
    low, high, counts = whole.bins()
    assert list(zip(low.tolist(), high.tolist(), strict=True)) == sorted(reference)
    assert counts.tolist() == [reference[k] for k in sorted(reference)]
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, values.size), min(values.size - 1, rng.randint(0, 6))))
    parts = [RewardCounts.of_rows(part, None) for part in np.split(values, cuts)]
    rng.shuffle(parts)
    assert_same(RewardCounts.of_parts(parts), whole)
    if values.dtype == np.float32:
        assert_same(whole, RewardCounts.of_rows(values.astype(np.float64), None))
    histogram = whole.histogram()
    assert histogram["kind"] == ("values" if len(reference) <= VALUE_BARS else "ranges")
    assert_each_row_in_its_bar(values, histogram)


@pytest.mark.parametrize(
    ("low", "high", "label"),
    [
        (0.0, 5e-312, "0"),
        (0.499, 0.5001, "0.5"),
        (-1.0, -0.9997, "-1"),
        (1e20, 1.0001e20, "1e+20"),
        (0.33331298828125, 0.3333740234375, "0.33332"),
    ],
)
def test_a_bar_is_labelled_with_the_shortest_decimal_it_holds(low, high, label):
    assert shortest_decimal(low, high) == label
