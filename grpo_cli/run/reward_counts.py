"""Every scored row's reward counted on a fixed grid: the run's raw reward distribution, a
figure of pass 1 that merges exactly in any order.

The grid does not depend on the data, so two parts of a run count their rows on the same bins
and merge by adding counts: the result is the same integers however the rows were cut into
chunks or blocks and in whatever order the parts arrive. Each bin is a half-open interval
``[low, high)`` between two neighbouring floats that keep :data:`MANTISSA_BITS` bits of
mantissa: 4,096 bins to each power of two, so one holds values less than 1 part in 4,096
apart, and a reward such as 0, 1, 0.5, k/8 or an integer below 4,096 is a bin's low end.

:meth:`RewardCounts.histogram` turns the counts into the report's bars: one bar a bin where
the rewards fill at most :data:`VALUE_BARS` bins (binary rewards: two bars, 0 and 1), else at
most :data:`RANGE_BARS` bars of equal width, a power of two wide so that each bin falls
whole into one bar and the bars' counts are exact.

>>> import numpy as np
>>> counts = RewardCounts.of_rows(np.array([0.0, 1.0, 1.0, np.nan]), np.array([True, True, True, False]))
>>> later = RewardCounts.of_rows(np.array([0.5], dtype=np.float32), None)
>>> histogram = counts.merged(later).histogram()
>>> histogram["kind"], histogram["labels"], histogram["counts"]
('values', ['0', '0.5', '1'], [1, 1, 2])
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np

MANTISSA_BITS = 12
"""Bits of mantissa a bin keeps: 4,096 bins to each power of two."""
_SHIFT = 52 - MANTISSA_BITS  # a float64's bits shifted right by this give its bin
_FLOAT32_TO_FLOAT64 = (1023 - 127) << MANTISSA_BITS
"""A normal float32's bin on float64's grid less its bin on float32's (the exponents' biases)."""
_FLOAT32_NORMAL = 1 << MANTISSA_BITS
"""The bins on float32's grid that hold a subnormal float32 are at most this far from zero."""
DENSE_SPAN = 1 << 20
"""Widest span of bins counted or merged in one dense array (8 MiB); wider ones are sorted."""
VALUE_BARS = 20
"""Most bins drawn one bar each; rewards that fill more are drawn in ranges."""
RANGE_BARS = 20
"""Most bars of the ranges drawn for rewards that fill more than :data:`VALUE_BARS` bins."""


@dataclass(frozen=True)
class RewardCounts:
    """Rows counted by reward bin: ``zeros`` (rewards equal to 0), and each other bin's
    ``keys`` (int64, sorted, unique: ``q >= 0`` is the bin ``[g(q), g(q + 1))`` of positive
    rewards, ``-n`` the bin ``[-g(n), -g(n - 1))`` of negative ones, ``g(q)`` the float64 whose
    bits are ``q`` shifted left by 40) with its count (int64, the same shape)."""

    zeros: int
    keys: np.ndarray
    counts: np.ndarray

    @classmethod
    def empty(cls) -> RewardCounts:
        return cls(0, np.zeros(0, np.int64), np.zeros(0, np.int64))

    @classmethod
    def of_rows(cls, rewards: np.ndarray, scored: np.ndarray | None) -> RewardCounts:
        """The scored rows of one chunk: ``rewards`` (float32 or float64, shape ``(n,)``) where
        ``scored`` (bool, the same shape; ``None``: every row) holds."""
        values = rewards if scored is None else rewards[scored]
        values = np.ascontiguousarray(values, dtype=np.float32 if values.dtype == np.float32 else np.float64)
        if values.size == 0:
            return cls.empty()
        smallest, largest = values.min(), values.max()
        keys = _keys(values, smallest=smallest)
        low, high = _key(smallest), _key(largest)
        zeros = int(np.count_nonzero(keys == 0)) if low <= 0 <= high else 0
        if values.dtype == np.float32 and zeros and np.count_nonzero(values == 0) != zeros:
            return cls.of_rows(values.astype(np.float64), None)  # a subnormal float32 shares the zero's bin
        negatives = _below(keys, 0) if low < 0 else 0
        parts = []
        if low < 0:
            nearest = high if high < 0 else -_smallest_positive(~keys + 1)
            parts.append(_counted_between(keys, low, nearest, above=values.size - negatives))
        if high > 0:
            nearest = low if low > 0 else _smallest_positive(keys)
            parts.append(_counted_between(keys, nearest, high, below=zeros + negatives))
        found, counts = _joined(parts)
        if values.dtype == np.float32:
            # a subnormal float32: float32's grid is not float64's there
            if np.any(np.abs(found) <= _FLOAT32_NORMAL):
                return cls.of_rows(values.astype(np.float64), None)
            found = np.sign(found) * (np.abs(found) + _FLOAT32_TO_FLOAT64)
        return cls(zeros, found, counts)

    def merged(self, other: RewardCounts) -> RewardCounts:
        """Both parts' rows, counted together (exact: the same in any order)."""
        return RewardCounts(
            self.zeros + other.zeros, *_joined([(self.keys, self.counts), (other.keys, other.counts)])
        )

    @classmethod
    def of_parts(cls, parts: Iterable[RewardCounts]) -> RewardCounts:
        """Every part's rows counted together."""
        held = cls.empty()
        for part in parts:
            held = held.merged(part)
        return held

    def bins(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each non-empty bin's ``[low, high)`` (float64) and count (int64), in order of value;
        a zero is counted in the bin ``[0, g(1))``; the highest bin ends at infinity."""
        keys, counts = self.keys, self.counts
        if self.zeros:
            keys, counts = _joined([(keys, counts), (np.zeros(1, np.int64), np.array([self.zeros]))])
        magnitudes = np.abs(keys)
        at = _grid(magnitudes)
        toward_zero = _grid(np.maximum(magnitudes - 1, 0))
        away = _grid(magnitudes + 1)
        negative = keys < 0
        # the bins at the ends of the floats: [-inf, x) holds no float below the lowest one
        low = np.maximum(np.where(negative, -at, at), -np.finfo(np.float64).max)
        high = np.where(negative, -toward_zero, away)  # the highest bin's is +inf
        return low, high, counts

    def histogram(self) -> dict[str, Any]:
        """The summary's ``reward_histogram``: each bar's ``[low, high)``, ``label`` and row
        count; ``kind`` ``"values"`` (a bar a bin: the values the rewards hold), ``"ranges"``
        (bars of equal width) or ``"none"`` (no scored row)."""
        low, high, counts = self.bins()
        if counts.size == 0:
            return {"kind": "none", "rows": 0, "labels": [], "counts": [], "low": [], "high": []}
        if counts.size <= VALUE_BARS:
            return {
                "kind": "values",
                "rows": int(counts.sum()),
                "labels": [shortest_decimal(a, b) for a, b in zip(low.tolist(), high.tolist(), strict=True)],
                "counts": counts.tolist(),
                "low": low.tolist(),
                "high": high.tolist(),
            }
        width = bar_width(low, high)
        bar = np.floor_divide(low, width).astype(np.int64)  # floor(low / width), exact where that underflows
        first = int(bar[0])
        per_bar = np.bincount(bar - first, weights=counts).astype(np.int64)
        with np.errstate(over="ignore"):  # a bar past the largest float ends at infinity
            edges = (np.arange(per_bar.size + 1, dtype=np.float64) + first) * width
        return {
            "kind": "ranges",
            "rows": int(per_bar.sum()),
            "labels": [
                f"[{a:.6g}, {b:.6g})" for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True)
            ],
            "counts": per_bar.tolist(),
            "low": edges[:-1].tolist(),
            "high": edges[1:].tolist(),
        }


def bar_width(low: np.ndarray, high: np.ndarray) -> float:
    """The narrowest power of two that cuts the bins ``[low, high)`` (sorted) into at most
    :data:`RANGE_BARS` bars with no bin across two: each bin is a power of two wide and starts
    at a multiple of its width, so a bar at least as wide as every bin holds each bin whole.

    >>> bar_width(np.array([0.0, 0.25, 0.5]), np.array([0.001, 0.251, 0.501]))
    0.03125
    """
    with np.errstate(over="ignore"):
        widths = high - low
    # the bin that ends at infinity is as wide as the grid's spacing below it
    widest = float(np.max(np.where(np.isinf(widths), 2.0 ** (1023 - MANTISSA_BITS), widths)))
    half_span = float(low[-1]) / 2 - float(low[0]) / 2  # halved: the whole may pass the largest float
    exponent = math.ceil(math.log2(widest))
    if half_span / RANGE_BARS > 0:
        exponent = max(exponent, math.ceil(math.log2(half_span / RANGE_BARS)) + 1)
    while (
        exponent < 1023
        and np.floor_divide(low[-1], 2.0**exponent) - np.floor_divide(low[0], 2.0**exponent) >= RANGE_BARS
    ):
        exponent += 1
    return 2.0 ** min(exponent, 1023)


def shortest_decimal(low: float, high: float) -> str:
    """The decimal with the fewest digits in ``[low, high)``: a bin's label, the value the
    rewards in it round to.

    >>> shortest_decimal(0.099853515625, 0.10009765625), shortest_decimal(-1.0, -0.999755859375)
    ('0.1', '-1')
    """
    below = Fraction(low)
    above = Fraction(high) if math.isfinite(high) else Fraction(2) ** 1024
    # a coarser decimal than a tenth of the bin's largest magnitude is 0 or lies outside it
    places = -math.floor(math.log10(max(abs(low), min(abs(high), sys.float_info.max)))) - 1
    while True:
        scale = Fraction(10) ** places
        candidate = math.ceil(below * scale) / scale
        if candidate < above:  # reached by the places of the low end's exact decimal at the latest
            if places > 15 or places < -15:
                return f"{float(candidate):.6g}"
            text = format(Decimal(candidate.numerator) / Decimal(candidate.denominator), "f")
            return text.rstrip("0").rstrip(".") if "." in text else text
        places += 1


def _grid(magnitudes: np.ndarray) -> np.ndarray:
    """``g(q)``: the float64 whose bits are ``q`` shifted left by 40."""
    return (magnitudes.astype(np.int64) << _SHIFT).view(np.float64)


def _keys(values: np.ndarray, *, smallest: np.floating[Any]) -> np.ndarray:
    """Each value's bin (0 for a zero): float64 values' as :class:`RewardCounts` keys them,
    int64; float32 values' alike on float32's grid (int32; the same bin's key less
    :data:`_FLOAT32_TO_FLOAT64` where the value is a normal float32), half the bytes to scan.
    ``smallest``: the least of the values."""
    if values.dtype == np.float32:
        bits, shift = values.view(np.int32), 23 - MANTISSA_BITS
    else:
        bits, shift = values.view(np.int64), _SHIFT
    if not smallest < 0:
        keys = bits >> shift
        # -0.0 is the one value with the sign bit here: its key is the zero's
        return np.maximum(keys, 0, out=keys) if smallest == 0 else keys
    sign = bits >> (8 * bits.itemsize - 1)  # -1 for a negative value, else 0
    keys = bits & bits.dtype.type(np.iinfo(bits.dtype).max)
    keys ^= sign  # two's complement: the magnitude's bits, negated where the value is negative
    keys -= sign
    # a shift rounds toward minus infinity: a negative value off the grid goes to the grid point
    # below it, the low end of its bin
    keys >>= shift
    return keys


def _key(value: np.floating[Any]) -> int:
    """The bin of one value, on its dtype's grid."""
    return int(_keys(np.array([value]), smallest=value)[0])


def _smallest_positive(keys: np.ndarray) -> int:
    """The smallest positive key, one at least being positive: ``k - 1`` read unsigned puts
    every key at or below zero above every positive one."""
    return int((keys - 1).view(np.uint64 if keys.dtype == np.int64 else np.uint32).min()) + 1


def _below(keys: np.ndarray, bound: int) -> int:
    return int(np.count_nonzero(keys < bound))


def _counted_between(
    keys: np.ndarray, first: int, last: int, *, below: int = 0, above: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Each distinct key from ``first`` to ``last`` (int64, both held) and how many times it
    appears, in order, where ``below`` keys lie below ``first`` or ``above`` above ``last``."""
    others = below + above
    if first == last:
        return np.array([first], np.int64), np.array([keys.size - others], np.int64)
    if last - first >= DENSE_SPAN:
        inside = keys[(keys >= first) & (keys <= last)]
        unique, counts = np.unique(inside, return_counts=True)
        return unique.astype(np.int64), counts.astype(np.int64)
    if others:  # clipped onto the end they lie beyond, and taken off it again below
        offsets = np.clip(keys, first, last)
        offsets -= first
    else:
        offsets = keys - first
    dense = np.bincount(offsets, minlength=last - first + 1)
    dense[0] -= below
    dense[-1] -= above
    at = np.flatnonzero(dense)
    return at.astype(np.int64) + first, dense[at].astype(np.int64)


def _joined(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Counted keys of several parts, each part's negative and positive keys added up apart
    (their spans are each narrow where the rewards' magnitudes are)."""
    keys = [k for k, _ in parts]
    counts = [c for _, c in parts]
    if sum(k.size for k in keys) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    every_key, every_count = np.concatenate(keys), np.concatenate(counts)
    out_keys, out_counts = [], []
    for side in (every_key < 0, every_key >= 0):
        side_keys, side_counts = every_key[side], every_count[side]
        if side_keys.size == 0:
            continue
        first, last = int(side_keys.min()), int(side_keys.max())
        if last - first < DENSE_SPAN:
            dense = np.bincount(side_keys - first, weights=side_counts, minlength=last - first + 1)
            at = np.flatnonzero(dense)
            out_keys.append(at.astype(np.int64) + first)
            out_counts.append(dense[at].astype(np.int64))
        else:
            unique, inverse = np.unique(side_keys, return_inverse=True)
            out_keys.append(unique.astype(np.int64))
            out_counts.append(np.bincount(inverse, weights=side_counts).astype(np.int64))
    return np.concatenate(out_keys), np.concatenate(out_counts)
