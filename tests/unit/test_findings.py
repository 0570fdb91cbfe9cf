"""findings.py: the summary's figures of the groups merge exactly, whatever the cut and order."""

from __future__ import annotations

import functools
import math
import random
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_cli.kernel import group_scale, group_stats
from grpo_cli.results.findings import (
    FirstRound,
    GroupPart,
    RunFigures,
    SecondRound,
    findings_of,
    merged_findings,
)


def part_of_rewards(rewards: list[float], ids: list[int], *, active_above: float = 0.0) -> GroupPart:
    """The groups of these rows, as the kernel reduces them; a group is active where its
    spread is above ``active_above``, each named by a key of its ID."""
    stats = group_stats(torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids))
    spread = (stats.maximum - stats.minimum).numpy()
    return GroupPart(
        count=stats.count.numpy(),
        mean=stats.mean.numpy(),
        m2=stats.m2.numpy(),
        m2_scale=group_scale(stats).numpy(),
        minimum=stats.minimum.numpy(),
        maximum=stats.maximum.numpy(),
        active=spread > active_above,
        rows=np.bincount(np.asarray(ids)),
        order=np.arange(stats.count.numel(), dtype=np.int64),
        label_at=lambda g: f"prompt {g}",
        named=True,
    )


def cut(part: GroupPart, pieces: list[np.ndarray]) -> list[GroupPart]:
    """The part's groups dealt into pieces (any groups each, in any order), each keeping the
    groups' places in the run's order and their keys."""
    out = []
    for chosen in pieces:
        arrays = {
            name: getattr(part, name)[chosen]
            for name in ("count", "mean", "m2", "m2_scale", "minimum", "maximum", "active", "rows", "order")
        }
        out.append(GroupPart(**arrays, label_at=functools.partial(_label_of, part, chosen), named=True))
    return out


def _label_of(part: GroupPart, chosen: np.ndarray, i: int) -> Any:
    return part.label(int(chosen[i]))


def merged_in_order(parts: list[GroupPart], options: dict[str, Any]) -> object:
    """Both rounds where each part is, merged in the order the parts are given (as Ray's
    buckets arrive)."""
    first = FirstRound()
    for part in parts:
        first = first + FirstRound.of(part)
    run = RunFigures.of(first)
    second = SecondRound()
    for part in parts:
        second = second + SecondRound.of(part, run)
    return merged_findings(first, second, options=options, named=True)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=40),
    magnitude=st.sampled_from([1.0, 1e-300, 1e300, 3.0e-8]),
    pieces=st.integers(1, 7),
    seed=st.integers(0, 2**32 - 1),
    binary=st.booleans(),
)
def test_any_cut_of_the_groups_in_any_order_gives_the_same_findings(sizes, magnitude, pieces, seed, binary):
    rng = random.Random(seed)
    ids = [g for g, size in enumerate(sizes) for _ in range(size)]
    rewards = [float(rng.random() < 0.5) if binary else rng.uniform(-1, 1) * magnitude for _ in ids]
    whole = part_of_rewards(rewards, ids)
    options = {"group_cols": ["prompt"]}
    deal = np.array([rng.randrange(pieces) for _ in sizes])
    parts = cut(whole, [np.flatnonzero(deal == p) for p in range(pieces)])
    rng.shuffle(parts)
    expected = findings_of([whole], options=options)
    assert merged_in_order(parts, options) == expected
    assert findings_of(parts, options=options) == expected


def test_the_reward_mean_is_the_exact_sum_rounded_once_where_a_fold_is_not():
    """Rewards whose float sum in row order loses the small ones: the mean is their exact sum
    over the count, rounded once (each group's count * mean is exact here)."""
    rewards = [1e16, 1.0, 1.0, 1.0, -1e16, 1.0, 3.0, 3.0]
    ids = [0, 1, 2, 3, 4, 5, 6, 6]
    findings = findings_of([part_of_rewards(rewards, ids)], options={})
    exact = sum(Fraction(r) for r in rewards) / len(rewards)
    assert findings.reward["mean"] == float(exact) == 1.25
    folded = 0.0
    for r in rewards:
        folded += r
    assert folded / len(rewards) != 1.25  # what a left fold in row order gives


@pytest.mark.parametrize("magnitude", [1.0, 1e300, 1e-300])
def test_the_reward_std_is_the_exact_mean_square_rounded_then_rooted(magnitude):
    rewards = [v * magnitude for v in (0.0, 1.0, 3.0, -2.0, 5.0, 5.0)]
    ids = [0, 0, 1, 1, 2, 2]
    findings = findings_of([part_of_rewards(rewards, ids)], options={})
    exact_mean = sum(Fraction(r) for r in rewards) / len(rewards)
    exact_variance = sum((Fraction(r) - exact_mean) ** 2 for r in rewards) / len(rewards)
    assert findings.reward["mean"] == float(exact_mean)
    assert findings.reward["std"] == pytest.approx(
        math.sqrt(float(exact_variance / Fraction(magnitude) ** 2)) * magnitude, rel=1e-15
    )


def test_the_examples_are_the_first_groups_in_the_run_order_whichever_part_holds_them():
    sizes = [4] * 10 + [8, 3, 8, 12, 5, 8, 2]
    ids = [g for g, size in enumerate(sizes) for _ in range(size)]
    rewards = [float(i % 2) for i in range(len(ids))]
    whole = part_of_rewards(rewards, ids)
    options = {"group_cols": ["prompt"]}
    # the later groups in the first part, the earlier in the last
    parts = cut(whole, [np.arange(14, 17), np.arange(5, 14), np.arange(0, 5)])
    findings = merged_in_order(parts, options)
    assert findings == findings_of([whole], options=options)
    assert [e["group"] for e in findings.off_size_groups["examples"]] == [
        f"prompt {g}" for g in range(10, 15)
    ]
    assert findings.off_size_groups["groups"] == 7
    assert '"prompt 10" (8 rows), "prompt 12" (8 rows), "prompt 13" (12 rows);' in findings.warnings[0]


@pytest.mark.parametrize(
    "means",
    [
        [-1 / 3, float(np.nextafter(-1 / 3, 0.0))],  # a few ulps apart: no ten bins of positive width
        [-1e308, 1e308],  # a span past the largest float: no ten bins of finite width
    ],
)
def test_means_that_cannot_hold_ten_bins_make_one_bar(means):
    means = np.array(means)
    ones = np.ones(means.size)
    part = GroupPart(
        count=np.full(means.size, 2),
        mean=means,
        m2=ones,
        m2_scale=None,
        minimum=means - abs(means) * 1e-3,
        maximum=means + abs(means) * 1e-3,
        active=ones.astype(bool),
        rows=np.full(means.size, 2),
        order=np.arange(means.size),
    )
    histogram = findings_of([part], options={}).group_mean_histogram
    assert histogram == {"kind": "single", "edges": [means[0], means[1]], "counts": [2]}


def test_subnormal_rewards_have_a_mean_and_std():
    """Rewards below 2**-1022 in magnitude: their deviations are squared in units of 2**-1022,
    whose reciprocal is finite (units of their own binade overflowed: a traceback)."""
    rewards = [3e-310, 1e-310, -2e-311, 4e-320]
    findings = findings_of([part_of_rewards(rewards, [0, 0, 1, 1])], options={})
    exact = [Fraction(r) for r in rewards]
    mean = sum(exact) / len(exact)
    assert findings.reward["mean"] == float(mean)
    variance = sum((r - mean) ** 2 for r in exact) / len(exact)
    assert findings.reward["std"] == pytest.approx(math.sqrt(float(variance * 2**2044)) / 2**1022, rel=1e-15)
