"""Every finite float64 reward gives the right advantage: 1e-300 and 1e300 alike.

The reference works in exact rational arithmetic (``fractions``) with a 60-digit square
root (``decimal``), so it neither overflows nor underflows.
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import pytest
import torch

from grpo_cli.kernel import (
    GroupStatsAccumulator,
    apply_normalization,
    batch_std,
    group_stats,
    group_std,
    normalize_in_groups,
    prepare_normalization,
)

decimal.getcontext().prec = 60


def assert_close_per_group(actual, expected, ids, rtol=1e-12):
    """Equal to ``rtol`` of the largest advantage of each group (a value at the mean may
    round to 0 where the exact one is 1e-16 of its neighbours)."""
    expected = torch.as_tensor(expected, dtype=torch.float64)
    for group in ids.unique().tolist():
        rows = ids == group
        scale = float(expected[rows].abs().max())
        torch.testing.assert_close(actual[rows], expected[rows], rtol=rtol, atol=rtol * scale)


def exact_sqrt(value: Fraction) -> Fraction:
    root = (decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)).sqrt()
    return Fraction(root)


def exact_advantages(rewards, *, epsilon=1e-6, ddof=0, mode="add"):
    values = [Fraction(r) for r in rewards]
    n = len(values)
    mean = sum(values) / n
    std = exact_sqrt(sum((v - mean) ** 2 for v in values) / max(n - ddof, 1))
    if max(values) == min(values):
        return [0.0] * n
    eps = Fraction(epsilon)
    denominator = {"add": std + eps, "clamp": max(std, eps), "add-if-nonzero": std + eps}[mode]
    return [float((v - mean) / denominator) for v in values]


GROUPS = [
    [1e300, 3e300, 2e300],
    [-1e300, 1e300],
    [1e154, 2e154, 4e154],  # squares overflow from 1.34e154 on
    [1e200, 3e200],
    [1.5e308, -1.7e308, 1.0e308],  # the sum overflows
    [1e-300, 3e-300, 2e-300],  # squares underflow
    [1e-160, 2e-160],
    [5e-324, 1e-323, 1.5e-323],  # subnormal
    [7.0, 9.0, 8.0],  # ordinary, beside the extremes
]


@pytest.mark.parametrize("mode", ["add", "clamp", "add-if-nonzero"])
@pytest.mark.parametrize("ddof", [0, 1])
def test_extreme_magnitudes_match_exact_arithmetic(mode, ddof):
    rewards = torch.tensor([r for group in GROUPS for r in group], dtype=torch.float64)
    ids = torch.tensor([g for g, group in enumerate(GROUPS) for _ in group])
    out = normalize_in_groups(rewards, ids, 1e-6, std="sample" if ddof else "population", epsilon_mode=mode)[
        "advantages"
    ]
    expected = [a for group in GROUPS for a in exact_advantages(group, ddof=ddof, mode=mode)]
    assert bool(torch.isfinite(out).all())
    assert_close_per_group(out, expected, ids)


@pytest.mark.parametrize("group", GROUPS, ids=str)
def test_constant_groups_of_any_magnitude_are_inactive_and_zero(group):
    value = group[0]
    out = normalize_in_groups(torch.full((5,), value, dtype=torch.float64), torch.zeros(5, dtype=torch.long))
    assert out["active_group_count"] == 0
    assert out["advantages"].tolist() == [0.0] * 5
    assert all(str(a) == "0.0" for a in out["advantages"].tolist())  # +0.0, never -0.0


def test_huge_rewards_stream_in_blocks_like_in_memory():
    rewards = torch.tensor([r for group in GROUPS for r in group], dtype=torch.float64)
    ids = torch.tensor([g for g, group in enumerate(GROUPS) for _ in group])
    order = torch.randperm(rewards.numel(), generator=torch.Generator().manual_seed(0))
    rewards, ids = rewards[order], ids[order]
    whole = normalize_in_groups(rewards, ids, 1e-6)["advantages"]
    acc = GroupStatsAccumulator(block_rows=2)  # every group merged across blocks
    for start in range(0, rewards.numel(), 3):
        acc.update(rewards[start : start + 3], ids[start : start + 3])
    streamed = apply_normalization(rewards, ids, prepare_normalization(acc.compute(), epsilon=1e-6))
    assert_close_per_group(streamed, whole, ids)


def test_leave_one_out_and_batch_scale_stay_finite():
    rewards = torch.tensor([1e300, 3e300, 2e300, 1.0, 2.0, 4.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    loo = normalize_in_groups(rewards, ids, baseline="leave-one-out", std="sample")["advantages"]
    # r_0 = 1e300 against the others (3e300, 2e300): mean 2.5e300, sample std 0.707e300
    expected_first = float((Fraction(1e300) - Fraction(2.5e300)) / exact_sqrt(Fraction(0.5e300) ** 2 * 2))
    assert loo[0].item() == pytest.approx(expected_first, rel=1e-12)
    batch = normalize_in_groups(rewards, ids, scale="batch")["advantages"]
    assert bool(torch.isfinite(batch).all()) and batch[0] < 0 < batch[1]


def test_group_and_batch_std_in_reward_units():
    rewards = torch.tensor([1e300, 3e300, 1e-300, 3e-300], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1])
    from grpo_cli.kernel import group_stats

    stats = group_stats(rewards, ids)
    assert group_std(stats).tolist() == pytest.approx([1e300, 1e-300], rel=1e-15, abs=0)
    assert float(batch_std(stats)) == pytest.approx(
        float(exact_sqrt(sum((Fraction(r) - Fraction(1e300)) ** 2 for r in rewards.tolist()) / 4)), rel=1e-12
    )


def test_ordinary_magnitudes_are_not_rescaled():
    """Scale 1 for rewards in [2**-256, 2**256): the plain float64 reference agrees to rounding."""
    from grpo_cli.kernel import group_scale, group_stats
    from tests.reference import reference_advantages

    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(2000, dtype=torch.float64, generator=generator) * 1e70
    ids = torch.randint(0, 150, (2000,), generator=generator)
    assert bool((group_scale(group_stats(rewards, ids)) == 1).all())
    out = normalize_in_groups(rewards, ids, 1e-6)["advantages"]
    expected, _ = reference_advantages(rewards.tolist(), ids.tolist(), epsilon=1e-6)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("largest", "scale"),
    [
        (2.0**-256, 1.0),  # the ordinary range's ends: [2**-256, 2**256)
        (math.nextafter(2.0**256, 0.0), 1.0),
        (1.5 * 2.0**-257, 2.0**-257),  # just outside it: brought into [1, 2)
        (2.0**256, 2.0**256),
        (1.75 * 2.0**-600, 2.0**-600),
        (1.5 * 2.0**1023, 2.0**1023),  # the largest binade
        (2.0**-896, 2.0**-896),
        (2.0**-1000, 2.0**-896),  # never below 2**-896: 1 / scale stays finite
        (5e-324, 2.0**-896),
        (0.0, 1.0),
    ],
)
def test_group_scale_at_the_edges_of_the_ordinary_range(largest, scale):
    from grpo_cli.kernel import group_scale, group_stats

    rewards = torch.tensor([largest, -largest / 2, 1.0, 1.5], dtype=torch.float64)
    got = group_scale(group_stats(rewards, torch.tensor([0, 0, 1, 1])))
    assert got.tolist() == [scale, 1.0]


@pytest.mark.parametrize("baseline", ["mean", "leave-one-out"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"std": "sample", "epsilon_mode": "clamp"},
        {"scale": "batch"},
        # a std per group (its training batch's): each chunk takes its groups' (it crashed)
        {"scale": "batch", "batch_std": "per group"},
        {"scale": "none", "singleton": "raw"},
        {"scale": "mean"},
        {"epsilon_mode": "add-if-nonzero", "inactive_tolerance": 0.25},
        {"singleton": "raw", "std": "sample"},
    ],
)
def test_normalising_groups_chunk_by_chunk_gives_the_whole_runs_bits(monkeypatch, baseline, options):
    """prepare_normalization takes the groups a chunk at a time (their temporaries a chunk's):
    the centres, divisors, activity, units and tolerated groups are bit for bit those of one
    pass over every group, with huge and tiny rewards in some chunks only (their units) and
    singletons, zeros and constant groups among them."""
    from grpo_cli.kernel import normalize  # where the chunk size is read
    from tests.conftest import bits

    if baseline == "leave-one-out" and options.get("scale") == "mean":
        pytest.skip("scale='mean' takes the mean baseline")
    generator = torch.Generator().manual_seed(7)
    groups = 40
    sizes = torch.randint(1, 5, (groups,), generator=generator)
    ids = torch.repeat_interleave(torch.arange(groups), sizes)
    rewards = torch.randint(-2, 3, (ids.numel(),), generator=generator).to(torch.float64) / 4
    magnitude = torch.ones(groups, dtype=torch.float64)
    magnitude[5], magnitude[6], magnitude[33] = 1e300, 1e-300, 2.0**300  # chunks 1 and 8 only
    rewards = rewards * magnitude[ids]
    stats = group_stats(rewards, ids, count_extremes=True)
    if options.get("batch_std") == "per group":  # three batches of groups, each with its std
        batch = torch.arange(groups) % 3
        options = {**options, "batch_std": torch.tensor([0.5, 2.0, 1e300], dtype=torch.float64)[batch]}

    def normalised(chunk: int) -> normalize.Normalization:
        monkeypatch.setattr(normalize, "NORMALIZATION_CHUNK_GROUPS", chunk)
        return prepare_normalization(stats, baseline=baseline, **options)

    whole, chunked = normalised(groups), normalised(4)
    for name in ("active", "center", "denominator", "units", "tolerated"):
        a, b = getattr(whole, name), getattr(chunked, name)
        assert (a is None) == (b is None), name
        if a is not None and a.dtype == torch.bool:
            assert torch.equal(a, b), name
        elif a is not None:
            assert bits(a.numpy()).tolist() == bits(b.numpy()).tolist(), name
    assert (
        bits(apply_normalization(rewards, ids, whole).numpy()).tolist()
        == bits(apply_normalization(rewards, ids, chunked).numpy()).tolist()
    )
    ordinary = stats.groups(0, 4)  # no chunk of ordinary rewards has units
    if isinstance(options.get("batch_std"), torch.Tensor):
        options = {**options, "batch_std": options["batch_std"][:4] * 0 + 1}
    assert prepare_normalization(ordinary, baseline=baseline, **options).units is None
