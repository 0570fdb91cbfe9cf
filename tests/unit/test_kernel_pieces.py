"""The kernel's pieces one at a time: the streaming split against the one-call kernel,
merges against statistics of the concatenation, validation messages with their values.

Written against the mutants `make mutation` found alive (docs/mutation-report.md).
"""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_cli.errors import GrpoError
from grpo_cli.kernel import (
    NO_ROW,
    GroupStats,
    GroupStatsAccumulator,
    advantages_from_stats,
    apply_normalization,
    batch_mean_std,
    batch_moments,
    batch_std,
    empty_group_stats,
    group_stats,
    group_top_two,
    merge_group_stats,
    merge_top_two,
    merge_weighted_moments,
    normalize_in_groups,
    passk_advantages,
    prepare_normalization,
    weighted_moments,
    whitening,
)

OPTIONS = [
    {},
    {"std": "sample"},
    {"scale": "batch"},
    {"scale": "none"},
    {"baseline": "leave-one-out"},
    {"baseline": "leave-one-out", "std": "sample"},
    {"epsilon_mode": "clamp", "epsilon": 0.3},
    {"epsilon_mode": "add-if-nonzero"},
    {"singleton": "raw"},
    {"epsilon": 0.25},
]


def sample_rewards() -> tuple[torch.Tensor, torch.Tensor]:
    rewards = torch.tensor([0.1, 0.1, 0.7, 1.0, 1.0, 1.0, 3.0, 0.5, -2.0, 0.25, 0.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 4])  # group 2 is a singleton
    return rewards, ids


@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default"
)
def test_the_streaming_split_gives_the_one_call_kernel(options):
    rewards, ids = sample_rewards()
    expected = normalize_in_groups(rewards, ids, **options)["advantages"]
    extremes = options.get("baseline") == "leave-one-out"
    stats = group_stats(rewards, ids, count_extremes=extremes)
    assert torch.equal(advantages_from_stats(rewards, ids, stats, **options), expected)


@pytest.mark.parametrize("options", OPTIONS[:4], ids=["default", "sample", "batch", "none"])
def test_the_split_honours_group_size(options):
    rewards = torch.tensor([1.0, 0.0, 2.0, 2.0, 5.0, -1.0], dtype=torch.float64)
    expected = normalize_in_groups(rewards, group_size=2, **options)["advantages"]
    stats = group_stats(rewards, group_size=2)
    assert torch.equal(advantages_from_stats(rewards, None, stats, group_size=2, **options), expected)


def test_leave_one_out_of_a_singleton_is_zero_or_raw():
    rewards, ids = torch.tensor([4.0, 1.0, 3.0]), torch.tensor([0, 1, 1])
    zero = normalize_in_groups(rewards, ids, baseline="leave-one-out")["advantages"]
    raw = normalize_in_groups(rewards, ids, baseline="leave-one-out", singleton="raw")["advantages"]
    assert zero[0] == 0.0 and raw[0].item() == pytest.approx(4.0, rel=1e-5)  # no other rollout: no baseline


def test_group_stats_do_not_count_extremes_unless_asked():
    stats = group_stats(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]))
    assert stats.at_minimum is None and stats.at_maximum is None
    counted = group_stats(torch.tensor([1.0, 1.0, 2.0]), torch.tensor([0, 0, 0]), count_extremes=True)
    assert counted.at_minimum is not None and counted.at_maximum is not None
    assert counted.at_minimum.tolist() == [2] and counted.at_maximum.tolist() == [1]


def test_group_stats_leave_invalid_rows_out_even_when_not_finite():
    rewards = torch.tensor([1.0, math.nan, 3.0, math.inf])
    valid = torch.tensor([True, False, True, False])
    stats = group_stats(rewards, torch.tensor([0, 0, 0, 0]), valid=valid)
    assert stats.count.tolist() == [2] and stats.mean.tolist() == [2.0]


def test_group_stats_validation_names_the_values():
    rewards, ids = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"num_groups \(2\) must exceed the largest group ID \(2\)"):
        group_stats(rewards, ids, num_groups=2)
    assert group_stats(rewards, ids, num_groups=3).count.tolist() == [1, 1, 1]
    padded = group_stats(rewards, ids, num_groups=5)
    assert padded.count.tolist() == [1, 1, 1, 0, 0]
    with pytest.raises(
        ValueError, match=r"valid must be a bool tensor of the rewards' shape \(3,\), got torch.int64"
    ):
        group_stats(rewards, ids, valid=torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match=r"got torch.bool of shape \(2,\)"):
        group_stats(rewards, ids, valid=torch.tensor([True, False]))


def test_num_groups_keeps_a_group_size_layout():
    stats = group_stats(torch.tensor([1.0, 3.0, 5.0, 5.0]), group_size=2, num_groups=3)
    assert stats.count.tolist() == [2, 2, 0] and stats.mean.tolist() == [2.0, 5.0, 0.0]


# --------------------------------------------------------------------------- merges


@pytest.mark.parametrize("count_extremes", [False, True])
def test_empty_stats_are_the_merge_identity(count_extremes):
    rewards, ids = sample_rewards()
    stats = group_stats(rewards, ids, count_extremes=count_extremes)
    empty = empty_group_stats(5, count_extremes=count_extremes)
    assert empty.mean.dtype == torch.float64 and empty.count.dtype == torch.int64
    assert empty.minimum.tolist() == [math.inf] * 5 and empty.maximum.tolist() == [-math.inf] * 5
    assert (empty.at_minimum is not None) == count_extremes == (empty.at_maximum is not None)
    assert merge_group_stats(empty, stats) == stats
    assert merge_group_stats(stats, empty) == stats
    assert empty_group_stats(2, dtype=torch.float32).m2.dtype == torch.float32


def test_extreme_counts_survive_a_merge_only_when_both_sides_have_them():
    a = group_stats(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), count_extremes=True)
    b = group_stats(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]))
    merged = merge_group_stats(a, b)
    assert merged.at_minimum is None and merged.at_maximum is None
    both = merge_group_stats(
        a, group_stats(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]), count_extremes=True)
    )
    assert both.at_minimum is not None and both.at_maximum is not None
    assert both.at_minimum.tolist() == [3] and both.at_maximum.tolist() == [1]


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ([1e300, 3e300], [2e300, -1e300]),  # both sides need scaling
        ([1e300, 3e300], [0.5, 0.25]),  # one side does
        ([0.5, 0.25], [1e-300, 3e-300]),
        ([1e-170, 0.0], [1e-170, 2e-170]),
    ],
)
def test_merging_extreme_magnitudes_matches_the_whole(left, right):
    a = torch.tensor(left, dtype=torch.float64)
    b = torch.tensor(right, dtype=torch.float64)
    ids = torch.zeros(2, dtype=torch.int64)
    merged = merge_group_stats(group_stats(a, ids), group_stats(b, ids))
    whole = group_stats(torch.cat([a, b]), torch.zeros(4, dtype=torch.int64))
    assert merged.count.tolist() == whole.count.tolist()
    assert merged.mean.tolist() == pytest.approx(whole.mean.tolist(), rel=1e-12, abs=0)
    assert merged.m2.tolist() == pytest.approx(whole.m2.tolist(), rel=1e-12, abs=0)
    assert (
        merged.minimum.tolist() == whole.minimum.tolist()
        and merged.maximum.tolist() == whole.maximum.tolist()
    )


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.integers(-3, 3), min_size=0, max_size=24),
    ids=st.lists(st.integers(0, 3), min_size=24, max_size=24),
    cut=st.integers(0, 24),
)
def test_top_two_of_halves_merge_into_the_top_two_of_the_whole(values, ids, cut):
    x = torch.tensor(values, dtype=torch.float64) / 2
    group = torch.tensor(ids[: len(values)], dtype=torch.int64)
    cut = min(cut, len(values))
    whole = group_top_two(x, group, 4)
    later = group_top_two(x[cut:], group[cut:], 4, positions=torch.arange(cut, len(values)))
    merged = merge_top_two(group_top_two(x[:cut], group[:cut], 4), later)
    assert merged.first.tolist() == whole.first.tolist()
    assert merged.second.tolist() == whole.second.tolist()
    assert merged.best_row.tolist() == whole.best_row.tolist()
    for g in range(4):  # torch.topk's answer, and the first row that holds the largest
        members = x[group == g]
        top = torch.topk(members, min(2, members.numel())).values.tolist() + [-math.inf] * 2
        assert [whole.first[g].item(), whole.second[g].item()] == top[:2]
        rows = [i for i in range(len(values)) if ids[i] == g and x[i] == top[0]]
        assert whole.best_row[g].item() == (rows[0] if rows else NO_ROW)


@given(
    values=st.lists(st.integers(0, 2), min_size=1, max_size=24),
    ids=st.lists(st.integers(0, 3), min_size=24, max_size=24),
    cuts=st.lists(st.integers(0, 24), max_size=3),
)
def test_passk_advantages_of_any_slices_are_those_of_the_whole(values, ids, cuts):
    """Each slice of the rows, passed on its own with its positions, gives its rows' part of
    the whole's advantages: the best row is found by position, not by what came before."""
    x = torch.tensor(values, dtype=torch.float64)
    group = torch.tensor(ids[: len(values)], dtype=torch.int64)
    top = group_top_two(x, group, 4)
    best = torch.arange(1.0, 5.0, dtype=torch.float64)
    positions = torch.arange(len(values))
    whole = passk_advantages(group, positions, top.best_row, best)
    bounds = [0, *sorted(min(c, len(values)) for c in cuts), len(values)]
    pieces = [
        passk_advantages(group[a:b], positions[a:b], top.best_row, best)
        for a, b in itertools.pairwise(bounds)
    ]
    assert torch.equal(torch.cat(pieces), whole)
    for g in range(4):  # one row of each group with rows gets its value: its first largest
        rows = (group == g).nonzero().flatten().tolist()
        if rows:
            first_best = min(rows, key=lambda i: (-values[i], i))
            assert whole.nonzero().flatten().tolist().count(first_best) == 1
            assert whole[first_best].item() == best[g].item()
            assert all(whole[i].item() == 0 for i in rows if i != first_best)


def test_top_two_of_float32_rewards_are_those_of_their_float64_values():
    x = torch.tensor([0.1, 0.7, 0.7, 0.3], dtype=torch.float32)
    group = torch.tensor([0, 0, 1, 1])
    top = group_top_two(x, group, 2)
    exact = group_top_two(x.to(torch.float64), group, 2)
    assert top.first.dtype == torch.float64
    assert top.first.tolist() == exact.first.tolist() and top.second.tolist() == exact.second.tolist()


@pytest.mark.parametrize("unit", [1e-150, 1e150])
def test_batch_moments_of_rewards_far_from_one_are_in_reward_units(unit):

    x = torch.tensor([1.0, 3.0, 2.0], dtype=torch.float64) * unit
    n, mean, m2 = batch_moments(group_stats(x, torch.tensor([0, 0, 1])))
    assert n == 3
    assert float(mean) == pytest.approx(2 * unit, rel=1e-15, abs=0)
    assert float(m2) == pytest.approx(2 * unit * unit, rel=1e-12, abs=0)


def test_batch_moments_of_ordinary_and_tiny_groups_together():
    """The batch is of ordinary magnitude, one group's rewards are near 1e-80: its m2 is
    kept in that group's own scale and must be brought back before it is added."""
    from fractions import Fraction

    values = [1.0, 3.0, 1e-80, 3e-80]
    n, mean, m2 = batch_moments(
        group_stats(torch.tensor(values, dtype=torch.float64), torch.tensor([0, 0, 1, 1]))
    )
    exact = [Fraction(v) for v in values]
    exact_mean = sum(exact) / len(exact)
    assert n == 4
    assert float(mean) == pytest.approx(float(exact_mean), rel=1e-15, abs=0)
    assert float(m2) == pytest.approx(float(sum((v - exact_mean) ** 2 for v in exact)), rel=1e-15, abs=0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(st.floats(-1e3, 1e3), st.floats(-1e300, 1e300), st.sampled_from([0.0, 1e-300, -2e-200])),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 6),
    st.integers(0, 1),
)
def test_batch_mean_std_is_batch_moments_and_batch_std_at_once(values, groups, ddof):
    """The summary's one pass over the groups gives batch_moments' count and mean bits (its
    standard deviation is batch_std's own, which the tests above pin)."""
    x = torch.tensor(values, dtype=torch.float64)
    stats = group_stats(x, torch.arange(x.numel()) % groups, groups)
    n, mean, _ = batch_mean_std(stats, ddof=ddof)
    n_moments, mean_moments, _ = batch_moments(stats)
    assert n == n_moments
    assert torch.equal(mean, mean_moments)


@pytest.mark.parametrize("block_rows", [100, 4, 3])
@pytest.mark.parametrize("group_size", [None, 1])
def test_streamed_chunks_with_and_without_a_validity_mask(block_rows, group_size):
    """Masked and unmasked chunks in one block; with small blocks, a mask cut across two."""

    rewards = torch.tensor([1.0, 2.0, 5.0, 9.0, 4.0, 7.0], dtype=torch.float64)
    ids = torch.tensor([0, 1, 0, 1, 0, 1]) if group_size is None else torch.arange(6)
    valid = torch.tensor([True, True, True, False, True, False])
    acc = GroupStatsAccumulator(block_rows=block_rows, group_size=group_size)
    acc.update(rewards[:2], None if group_size else ids[:2])  # no mask: every reward valid
    acc.update(rewards[2:], None if group_size else ids[2:], valid[2:])
    got = acc.compute()
    expected = group_stats(rewards[valid], ids[valid], num_groups=int(ids.max()) + 1)
    for exact in ("count", "minimum", "maximum"):  # merged blocks round the others differently
        assert torch.equal(getattr(got, exact), getattr(expected, exact))
    assert torch.allclose(got.mean, expected.mean, rtol=1e-15, atol=0)
    assert torch.allclose(got.m2, expected.m2, rtol=1e-14, atol=0)


def test_accumulated_group_ids_may_be_any_integer_type():

    rewards = torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64)
    acc = GroupStatsAccumulator()
    acc.update(rewards, torch.tensor([0, 1, 0], dtype=torch.int32))
    assert acc.compute() == group_stats(rewards, torch.tensor([0, 1, 0]))


def test_an_accumulator_that_saw_no_rows_still_counts_extremes():

    stats = GroupStatsAccumulator(count_extremes=True).compute()
    assert stats.num_groups == 0 and stats.counts_extremes
    assert not GroupStatsAccumulator().compute().counts_extremes  # only when asked


def test_rows_not_divisible_by_the_group_size_are_counted_across_blocks():

    acc = GroupStatsAccumulator(group_size=2, block_rows=2)
    acc.update(torch.ones(5))  # two blocks of two are folded in before the last row
    with pytest.raises(ValueError, match=r"^the number of rows \(5\) is not divisible by group_size \(2\)$"):
        acc.compute()


@settings(max_examples=60, deadline=None)
@given(
    group_size=st.integers(1, 9),
    groups=st.integers(1, 30),
    block_rows=st.integers(1, 40),
    chunks=st.lists(st.integers(1, 50), min_size=1, max_size=8),
    count_extremes=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_group_size_accumulates_the_bits_of_ids_row_over_group_size_whatever_the_blocks(
    group_size, groups, block_rows, chunks, count_extremes, seed
):
    """A group across a statistics block's edge is cut there as IDs cut it: --group-size and the
    same rows keyed by ``row // group_size`` (-g, or the Ray engine's keys) give the same bits.
    The blocks were rounded down to whole groups with a group size, a cut IDs do not make."""
    rows = group_size * groups
    rewards = torch.rand(rows, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 7 - 3
    ids = torch.arange(rows) // group_size
    by_size = GroupStatsAccumulator(
        block_rows=block_rows, group_size=group_size, count_extremes=count_extremes
    )
    by_ids = GroupStatsAccumulator(block_rows=block_rows, count_extremes=count_extremes)
    start = 0
    for size in itertools.cycle(chunks):
        if start >= rows:
            break
        by_size.update(rewards[start : start + size])
        by_ids.update(rewards[start : start + size], ids[start : start + size])
        start += size
    assert by_size.compute() == by_ids.compute()


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=30),
    equal_sizes=st.booleans(),
    swaps=st.integers(0, 3),
    block_rows=st.integers(1, 60),
    chunks=st.lists(st.integers(1, 25), min_size=1, max_size=6),
    count_extremes=st.booleans(),
    masked=st.booleans(),
    expected=st.sampled_from([None, 0, 1, 2]),
    seed=st.integers(0, 2**16),
)
def test_chunks_fed_in_any_sizes_give_the_bits_of_one_chunk(
    sizes, equal_sizes, swaps, block_rows, chunks, count_extremes, masked, expected, seed
):
    """Groups in ID order (sorted input: equal sizes, or not), a few rows swapped or none, cut
    into chunks of any sizes: the statistics of the whole rows fed at once, bit for bit. A
    block whose chunks hold groups one after another is reduced chunk by chunk; a group with
    rows in two chunks of a block must not be, or it is merged where it was summed whole. The
    rows expected (none told, too few, all, too many) size the storage, not the statistics."""
    g = torch.Generator().manual_seed(seed)
    if equal_sizes:
        sizes = [sizes[0]] * len(sizes)
    ids = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
    rows = ids.numel()
    for _ in range(swaps):
        i, j = (int(v) for v in torch.randint(rows, (2,), generator=g))
        ids[[i, j]] = ids[[j, i]]
    rewards = torch.randn(rows, generator=g, dtype=torch.float64) * 1e3
    valid = torch.rand(rows, generator=g) > 0.2 if masked else None

    told = None if expected is None else [rows // 2, rows, 2 * rows][expected]

    def accumulated(cuts: list[int]) -> GroupStats:
        acc = GroupStatsAccumulator(block_rows=block_rows, count_extremes=count_extremes, expected_rows=told)
        start = 0
        for size in itertools.cycle(cuts):
            if start >= rows:
                break
            part = slice(start, start + size)
            acc.update(rewards[part], ids[part], None if valid is None else valid[part])
            start += size
        return acc.compute()

    assert accumulated(chunks) == accumulated([rows])


@pytest.mark.parametrize("expected_rows", [None, 4000])
@pytest.mark.parametrize("shuffled", [False, True])
def test_sorted_groups_with_their_rows_told_are_stored_at_once(expected_rows, shuffled):
    """Groups in ID order, the rows to come told: the statistics' storage holds the groups,
    sized once (each later block would otherwise grow it by half). Shuffled rows, whose first
    block holds most groups already, are not taken for groups in order: their storage grows
    by half as before, not to the groups of the first block times the blocks to come."""
    g = torch.Generator().manual_seed(3)
    ids = torch.arange(500).repeat_interleave(8)
    if shuffled:
        ids = ids[torch.randperm(ids.numel(), generator=g)]
    rewards = torch.rand(ids.numel(), generator=g, dtype=torch.float64)
    acc = GroupStatsAccumulator(block_rows=400, expected_rows=expected_rows)
    for start in range(0, ids.numel(), 300):
        acc.update(rewards[start : start + 300], ids[start : start + 300])
    whole = GroupStatsAccumulator(block_rows=400)
    whole.update(rewards, ids)
    assert acc.compute() == whole.compute()
    held = acc._running.stats()
    assert held is not None
    capacity = held.mean.untyped_storage().nbytes() // held.mean.element_size()
    if expected_rows and not shuffled:
        assert capacity == 500
    else:
        assert 500 <= capacity <= 3 * 500 // 2


def test_ids_in_equal_contiguous_blocks_give_the_group_size_result_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(64 * 50, generator=g, dtype=torch.float64) * 3.7 + 1e3
    ids = torch.arange(50).repeat_interleave(64)
    by_ids = normalize_in_groups(rewards, ids)["advantages"]
    assert torch.equal(by_ids, normalize_in_groups(rewards, group_size=64)["advantages"])


@pytest.mark.parametrize("kind", ["normal", "extreme", "float32"])
@pytest.mark.parametrize("options", [{}, {"epsilon_mode": "clamp"}, {"inactive_tolerance": 0.5}])
def test_a_chunk_of_sorted_ids_past_group_zero_gets_the_bits_of_the_whole(kind, options):
    """Pass 2 applies the statistics a batch at a time: a batch of sorted input holds blocks of
    groups that start past group 0 (the block path, from its first group). Each row gets the
    bits the rows in any order get (the path of scattered IDs), and its group's statistics are
    those of scattered IDs too; float32 rewards are widened on either path alike."""
    from grpo_cli.kernel.accumulate import _scatter_stats

    g = torch.Generator().manual_seed(7)
    k, size = 30, 8
    x = torch.randn(k * size, generator=g, dtype=torch.float64)
    if kind == "extreme":  # the groups' units (powers of two) take part
        x[::5] = 3e300
        x[1::5] = -2e-300
    if kind == "float32":
        x = x.to(torch.float32)
    ids = torch.arange(k).repeat_interleave(size)
    norm = prepare_normalization(group_stats(x, ids), **options)
    order = torch.randperm(k * size, generator=g)
    scattered = torch.empty_like(x)
    scattered[order] = apply_normalization(x[order], ids[order], norm)
    for first, last in [(0, 4), (5, 17), (29, 30), (12, 30)]:
        rows = slice(first * size, last * size)
        assert torch.equal(apply_normalization(x[rows], ids[rows], norm), scattered[rows]), (first, last)
        chunk = group_stats(x[rows], ids[rows])
        expected = _scatter_stats(x[rows].to(torch.float64), ids[rows], last)
        for name in ("count", "mean", "m2", "minimum", "maximum"):
            assert torch.equal(getattr(chunk, name), getattr(expected, name)), (first, last, name)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_group_ids_of_any_integer_type_give_the_int64_result(dtype):
    rewards = torch.tensor([1.0, 2.0, 4.0, 8.0, 3.0])
    ids = torch.tensor([0, 1, 0, 1, 1])
    expected = normalize_in_groups(rewards, ids)["advantages"]
    assert torch.equal(normalize_in_groups(rewards, ids.to(dtype))["advantages"], expected)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"std": "n"}, "std must be one of population, sample, got 'n'"),
        ({"scale": "row"}, "scale must be one of group, batch, none, mean, got 'row'"),
        (
            {"baseline": "median"},
            "baseline must be one of mean, leave-one-out, got 'median'; did you mean 'mean'?",
        ),
        ({"epsilon_mode": "max"}, "epsilon_mode must be one of add, clamp, add-if-nonzero, got 'max'"),
        ({"singleton": "one"}, "singleton must be one of zero, raw, got 'one'"),
        ({"epsilon": True}, "epsilon must be a positive finite number, got True"),
        ({"epsilon": "1e-6"}, "epsilon must be a positive finite number, got '1e-6'"),
        (
            {"baseline": "leave-one-out"},
            "baseline='leave-one-out' needs stats computed with count_extremes=True",
        ),
    ],
)
def test_prepare_normalization_names_the_option_it_refuses(option, message):

    stats = group_stats(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        prepare_normalization(stats, **option)


@pytest.mark.parametrize(
    ("baseline", "singleton"), [("mean", "zero"), ("mean", "raw"), ("leave-one-out", "raw")]
)
def test_zero_rewards_of_either_sign_give_positive_zero_advantages(baseline, singleton):
    rewards = torch.tensor([-0.0, -0.0, -0.0, 1.0, 2.0], dtype=torch.float64)
    out = normalize_in_groups(rewards, torch.tensor([0, 0, 1, 2, 2]), baseline=baseline, singleton=singleton)
    assert [math.copysign(1.0, a) for a in out["advantages"][:3].tolist()] == [1.0, 1.0, 1.0]


def test_a_raw_singleton_of_a_tiny_reward_keeps_it():
    rewards = torch.tensor([1e-80, 1.0, 3.0], dtype=torch.float64)
    out = normalize_in_groups(rewards, torch.tensor([0, 1, 1]), singleton="raw")["advantages"]
    assert out[0].item() == pytest.approx(1e-80 / (1 + 1e-6), rel=1e-15, abs=0)


def test_the_default_epsilon_is_trls():

    stats = group_stats(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    assert prepare_normalization(stats).divisor.epsilon == 1e-6


@pytest.mark.parametrize("unit", [1e-80, 1.0, 1e80])
def test_batch_scale_of_rewards_of_any_magnitude(unit):
    """scale='batch' divides by the std over all rollouts, in reward units, whatever
    scale each group's statistics are kept in."""
    values = [1.0, 3.0, 2.0, 5.0, 4.0]
    ids = [0, 0, 1, 1, 1]
    rewards = torch.tensor(values, dtype=torch.float64) * unit
    got = normalize_in_groups(rewards, torch.tensor(ids), scale="batch", epsilon=1e-300)["advantages"]
    x = [v * unit for v in values]
    overall = sum(x) / len(x)
    batch_std = (sum((v - overall) ** 2 for v in x) / len(x)) ** 0.5
    means = {g: sum(v for v, i in zip(x, ids, strict=True) if i == g) / ids.count(g) for g in set(ids)}
    expected = [(v - means[i]) / (batch_std + 1e-300) for v, i in zip(x, ids, strict=True)]
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=0)


def test_float32_advantages_are_the_float64_ones_rounded_once():
    g = torch.Generator().manual_seed(1)
    rewards = torch.rand(4000, generator=g) * 10
    ids = torch.randint(0, 300, (4000,), generator=g)
    wide = normalize_in_groups(rewards.double(), ids)["advantages"]
    assert torch.equal(normalize_in_groups(rewards, ids)["advantages"], wide.float())


@pytest.mark.parametrize(("scale", "divisor"), [("none", 1.0), ("group", 1 + 1e-6)])
def test_a_raw_singleton_under_leave_one_out_keeps_its_reward(scale, divisor):
    rewards = torch.tensor([1.0, 3.0, 0.7], dtype=torch.float64)
    out = normalize_in_groups(
        rewards, torch.tensor([0, 0, 1]), baseline="leave-one-out", singleton="raw", scale=scale
    )["advantages"]
    assert out[2].item() == 0.7 / divisor


def test_left_out_rewards_get_zero_with_a_group_size():
    out = normalize_in_groups(torch.tensor([1.0, math.nan, 3.0, 5.0]), group_size=2, nan="ignore")[
        "advantages"
    ]
    assert out[1].item() == 0.0 and out[0].item() == 0.0  # a group of one valid reward
    assert out[2:].tolist() == pytest.approx([-1.0, 1.0], rel=1e-5)


def test_sample_std_of_two_rollouts_divides_by_one():

    stats = group_stats(torch.tensor([0.0, 2.0], dtype=torch.float64), torch.tensor([0, 1]))
    assert float(batch_std(stats, ddof=1)) == 2**0.5
    assert float(batch_std(stats)) == 1.0


def test_merging_the_moments_of_two_empty_batches_leaves_them_empty():
    nothing = torch.zeros(0, dtype=torch.float64)
    empty = weighted_moments(nothing, nothing, torch.zeros(0, dtype=torch.int64), 2)
    merged = merge_weighted_moments(empty, empty)
    assert merged.weight.tolist() == [0.0, 0.0]
    assert merged.mean.tolist() == empty.mean.tolist() == [0.0, 0.0]
    assert merged.m2.tolist() == [0.0, 0.0]


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.floats(-4, 4, allow_nan=False), min_size=1, max_size=16),
    weights=st.lists(st.floats(0.5, 3), min_size=16, max_size=16),
    cut=st.integers(0, 16),
    method=st.sampled_from(["unbiased", "population", "areal"]),
)
def test_whitening_moments_merge_like_the_whole(values, weights, cut, method):
    x = torch.tensor(values, dtype=torch.float64)
    w = torch.tensor(weights[: len(values)], dtype=torch.float64)
    batch = torch.arange(len(values)) % 2
    cut = min(cut, len(values))
    whole = weighted_moments(x, w, batch, 2)
    merged = merge_weighted_moments(
        weighted_moments(x[:cut], w[:cut], batch[:cut], 2), weighted_moments(x[cut:], w[cut:], batch[cut:], 2)
    )
    a = whitening(whole, method=method).apply(x, batch)
    b = whitening(merged, method=method).apply(x, batch)
    assert b.tolist() == pytest.approx(a.tolist(), rel=1e-9, abs=1e-9)


def test_whitening_against_the_formulas():
    x = torch.tensor([1.0, 2.0, 4.0, 7.0], dtype=torch.float64)
    w = torch.tensor([1.0, 2.0, 1.0, 3.0], dtype=torch.float64)
    moments = weighted_moments(x, w, torch.zeros(4, dtype=torch.int64), 1)
    mean = float((x * w).sum() / w.sum())
    var_population = float((w * (x - mean) ** 2).sum() / w.sum())
    var_unbiased = var_population * float(w.sum()) / (float(w.sum()) - 1)  # verl's masked_whiten
    batch = torch.zeros(4, dtype=torch.int64)
    population = whitening(moments, method="population").apply(x, batch)
    unbiased = whitening(moments, method="unbiased").apply(x, batch)
    assert population.tolist() == pytest.approx(
        ((x - mean) / (var_population**0.5 + 1e-8)).tolist(), rel=1e-6
    )
    assert unbiased.tolist() == pytest.approx(((x - mean) * (var_unbiased + 1e-8) ** -0.5).tolist(), rel=1e-6)


def test_empty_stats_fields_have_the_asked_dtype_and_no_extremes_by_default():
    default = empty_group_stats(3)
    assert default.at_minimum is None and default.at_maximum is None
    for name in ("mean", "m2", "minimum", "maximum"):
        assert getattr(default, name).dtype == torch.float64, name
        assert getattr(empty_group_stats(3, dtype=torch.float16), name).dtype == torch.float16, name
    counted = empty_group_stats(3, count_extremes=True)
    assert counted.at_minimum is not None and counted.at_maximum is not None
    assert counted.at_minimum.dtype == torch.int64 and counted.at_maximum.dtype == torch.int64
    assert counted.count.dtype == torch.int64 and counted.count.tolist() == [0, 0, 0]


def test_advantages_from_stats_pass_the_batch_std_on():
    rewards, ids = torch.tensor([1.0, 3.0, 2.0, 6.0], dtype=torch.float64), torch.tensor([0, 0, 1, 1])
    stats = group_stats(rewards, ids)
    out = advantages_from_stats(
        rewards, ids, stats, scale="batch", batch_std=torch.tensor(4.0, dtype=torch.float64)
    )
    assert out.tolist() == pytest.approx([-1 / (4 + 1e-6), 1 / (4 + 1e-6), -2 / (4 + 1e-6), 2 / (4 + 1e-6)])


def test_merging_a_tiny_group_into_an_ordinary_one():
    # The merged group needs no scaling, but one side was stored in units of its own scale.
    a = torch.tensor([1e-70, 3e-70], dtype=torch.float64)
    b = torch.tensor([1e-300, 3e-300], dtype=torch.float64)
    ids = torch.zeros(2, dtype=torch.int64)
    for left, right in ((a, b), (b, a)):
        merged = merge_group_stats(group_stats(left, ids), group_stats(right, ids))
        whole = group_stats(torch.cat([left, right]), torch.zeros(4, dtype=torch.int64))
        assert merged.m2.tolist() == pytest.approx(whole.m2.tolist(), rel=1e-12, abs=0)
        assert merged.mean.tolist() == pytest.approx(whole.mean.tolist(), rel=1e-12, abs=0)


def test_whitening_divisors_for_two_rows_and_fractional_weights():
    x = torch.tensor([1.0, 3.0], dtype=torch.float64)
    batch = torch.zeros(2, dtype=torch.int64)
    two = weighted_moments(x, None, batch, 1)
    assert whitening(two, method="unbiased").apply(x, batch).tolist() == pytest.approx(
        [-1 / math.sqrt(2 + 1e-8), 1 / math.sqrt(2 + 1e-8)]
    )  # m2 = 2 over (2 - 1)
    assert whitening(two, method="trl").apply(x, batch).tolist() == pytest.approx(
        [1 / (math.sqrt(2) + 1e-4), 3 / (math.sqrt(2) + 1e-4)]
    )  # sample std over rows - 1 = 1
    weighted = weighted_moments(x, torch.tensor([0.5, 1.0], dtype=torch.float64), batch, 1)
    mean = (0.5 * 1 + 3) / 1.5
    m2 = 0.5 * (1 - mean) ** 2 + (3 - mean) ** 2
    assert whitening(weighted, method="population").apply(x, batch).tolist() == pytest.approx(
        [(1 - mean) / math.sqrt(m2 / 1.5), (3 - mean) / math.sqrt(m2 / 1.5)]
    )


def test_gdpo_whitening_of_a_constant_batch_leaves_it_centred():
    x = torch.tensor([2.0, 2.0, 2.0], dtype=torch.float64)
    batch = torch.zeros(3, dtype=torch.int64)
    assert whitening(weighted_moments(x, None, batch, 1), method="gdpo").apply(x, batch).tolist() == [0.0] * 3


def test_an_unknown_whitening_names_it():
    moments = weighted_moments(torch.tensor([1.0]), None, torch.tensor([0]), 1)
    with pytest.raises(
        ValueError, match="method must be unbiased, population, areal, trl-rloo, trl or gdpo, got 'zscore'"
    ):
        whitening(moments, method="zscore")


# Groups whose float64 sum / n is off by an ulp; the corrected two-pass mean is the
# correctly rounded one (found by search against exact fractions).
UNEVEN_MEANS = [
    [0.7, 2.7, 4.8999999999999995],
    [2.0999999999999996, 0.7, 0.3],
    [0.8999999999999999, 0.3, 6.3],
]


def _exact_mean(values: list[float]) -> float:
    from fractions import Fraction

    return float(sum(Fraction(v) for v in values) / len(values))


@pytest.mark.parametrize("layout", ["blocks", "scattered"])
def test_group_means_are_correctly_rounded(layout: str) -> None:
    groups = [g for g in UNEVEN_MEANS if len(g) == 3]
    values = torch.tensor([v for g in groups for v in g], dtype=torch.float64)
    ids = torch.arange(len(groups)).repeat_interleave(3)
    if layout == "scattered":
        order = torch.tensor([4, 0, 8, 2, 6, 1, 3, 7, 5])
        values, ids = values[order], ids[order]
    stats = group_stats(values, ids)
    assert stats.mean.tolist() == [_exact_mean(g) for g in groups]
    assert [sum(g) / 3 for g in groups] != [_exact_mean(g) for g in groups]  # the naive mean is off


def test_weighted_batch_means_are_correctly_rounded() -> None:

    values = torch.tensor([v for g in UNEVEN_MEANS for v in g], dtype=torch.float64)
    ids = torch.arange(len(UNEVEN_MEANS)).repeat_interleave(3)
    moments = weighted_moments(values, None, ids, len(UNEVEN_MEANS))
    assert moments.mean.tolist() == [_exact_mean(g) for g in UNEVEN_MEANS]


@pytest.mark.parametrize("num_groups", [2, 3])
def test_leave_one_out_divides_each_row_by_its_groups_batch_std(num_groups: int) -> None:
    """--batch-col with the leave-one-out baseline: a batch std per group, taken per row."""

    rewards = torch.tensor(
        [0.0, 1.0, 3.0, 2.0, 2.0, 6.0, 5.0, 1.0, 0.0][: 3 * num_groups], dtype=torch.float64
    )
    ids = torch.arange(num_groups).repeat_interleave(3)
    batch_std = torch.tensor([2.0, 4.0, 8.0][:num_groups], dtype=torch.float64)
    norm = prepare_normalization(
        group_stats(rewards, ids, count_extremes=True),
        scale="batch",
        baseline="leave-one-out",
        batch_std=batch_std,
        epsilon=1e-300,
    )
    got = apply_normalization(rewards, ids, norm)
    expected = []
    for i, r in enumerate(rewards.tolist()):
        group = int(ids[i])
        others = [rewards[j].item() for j in range(len(rewards)) if ids[j] == group and j != i]
        expected.append((r - sum(others) / len(others)) / batch_std[group].item())
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=0)


def test_leave_one_out_leaves_a_singleton_at_zero() -> None:

    rewards = torch.tensor([0.0, 1.0, 5.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1])
    norm = prepare_normalization(
        group_stats(rewards, ids, count_extremes=True), baseline="leave-one-out", singleton="zero"
    )
    got = apply_normalization(rewards, ids, norm)
    assert got[2].item() == 0.0 and got[0].item() < 0 < got[1].item()


@pytest.mark.parametrize(
    ("option", "allowed"),
    [
        ("baseline", "mean, leave-one-out"),
        ("epsilon_mode", "add, clamp, add-if-nonzero"),
        ("singleton", "zero, raw"),
        ("nan", "error, ignore"),
    ],
)
def test_normalize_in_groups_names_the_option_it_refuses(option: str, allowed: str) -> None:

    with pytest.raises(GrpoError) as raised:
        normalize_in_groups(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]), **{option: "bogus"})
    assert raised.value.message == f"{option} must be one of {allowed}, got 'bogus'"


@pytest.mark.parametrize("size", [1, 2, 3, 8, 17, 64, 65])
@pytest.mark.parametrize("kind", ["normal", "wide", "binary", "extreme"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slice_rows", [None, 24])
def test_consecutive_blocks_and_scattered_ids_give_the_same_bits(
    size: int, kind: str, dtype, slice_rows, monkeypatch
) -> None:
    """A group's statistics are a left fold over its rollouts in row order on either path, so
    they do not depend on how the chunk is laid out, nor on which other groups are in it (the
    Ray engine reduces a block's groups apart from the rest of it). Narrower rewards are
    widened as the blocks are laid out side by side: the bits of the float64 values. On the CPU
    the blocks are reduced in slices of groups (``slice_rows``: a few groups each, some slices
    holding an "extreme" group that must be scaled and some none)."""
    from grpo_cli.kernel import accumulate
    from grpo_cli.kernel.accumulate import _block_stats, _scatter_stats

    if slice_rows is not None:
        monkeypatch.setattr(accumulate, "CPU_SLICE_ROWS", slice_rows)
    g = torch.Generator().manual_seed(size)
    k = 40
    x = torch.randn(k * size, generator=g, dtype=torch.float64)
    if kind == "wide":
        x = x * torch.exp(torch.randn(k * size, generator=g, dtype=torch.float64) * 20)
    elif kind == "binary":
        x = (x > 0).to(torch.float64)
    elif kind == "extreme":  # near the ends of the narrow dtype's range: finite in it
        x[::5] = 3e300 if dtype == torch.float64 else torch.finfo(dtype).max / 2
        x[1::5] = -2e-300 if dtype == torch.float64 else -torch.finfo(dtype).tiny
    ids = torch.arange(k).repeat_interleave(size)
    narrow = x.to(dtype)
    x = narrow.to(torch.float64)  # the values the narrow rewards hold
    blocks, scattered = _block_stats(narrow.view(k, size), torch.float64), _scatter_stats(x, ids, k)
    alone = _scatter_stats(x[: 3 * size], ids[: 3 * size], 3)  # the first three groups by themselves
    for name in ("count", "mean", "m2", "minimum", "maximum"):
        assert torch.equal(getattr(blocks, name), getattr(scattered, name)), name
        assert torch.equal(getattr(alone, name), getattr(scattered, name)[:3]), name


@pytest.mark.parametrize("sizes", ["uneven", "one big group", "singletons"])
def test_the_rounds_a_gpu_sums_in_give_the_cpus_serial_left_fold(sizes: str) -> None:
    """A GPU's scatter_add_ adds with atomics in no set order; the rounds (one row per group each)
    make every group's sum the left fold the CPU's serial scatter_add_ computes, bit for bit."""
    from grpo_cli.kernel.accumulate import _LeftFold

    g = torch.Generator().manual_seed(5)
    n = 5000
    if sizes == "uneven":
        ids = torch.randint(0, 300, (n,), generator=g)
    elif sizes == "one big group":
        ids = torch.zeros(n, dtype=torch.int64)
    else:
        ids = torch.randperm(n, generator=g)
    values = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp(
        torch.randn(n, generator=g, dtype=torch.float64) * 10
    )
    k = int(ids.max()) + 1
    serial = _LeftFold(ids, k, serial=True).sum(values)
    rounds = _LeftFold(ids, k, serial=False).sum(values)
    assert torch.equal(serial, rounds)
    python = [0.0] * k
    for group, value in zip(ids.tolist(), values.tolist(), strict=True):
        python[group] += value
    assert serial.tolist() == python


@pytest.mark.parametrize("block_rows", [1, 3, 4, 100])
def test_figures_of_chunks_cut_across_blocks_are_the_figures_of_all_rows(block_rows: int) -> None:
    """Rows with lengths (OPO's figures) fed in chunks that the blocks cut: each block's rows
    keep their own lengths, so the totals are those of all rows at once."""
    import numpy as np

    from grpo_cli.run.figures import FigureAccumulator, RowInputs, of_chunk, wanted

    rng = np.random.default_rng(7)
    ids = rng.integers(0, 5, size=13)
    combined = rng.choice([0.0, 1.0, 0.5, np.nan], size=13)
    lengths = rng.integers(1, 50, size=13).astype(np.float64)
    rows = RowInputs(combined, ~np.isnan(combined), lengths)
    figures = wanted(("length_sums",))
    accumulator = FigureAccumulator(figures, block_rows=block_rows)
    for start, stop in ((0, 2), (2, 6), (6, 7), (7, 13)):
        part = RowInputs(rows.combined[start:stop], rows.valid[start:stop], lengths[start:stop])
        accumulator.update(ids[start:stop], part)
    totals = accumulator.compute()
    expected = of_chunk(figures, ids, int(ids.max()) + 1, rows)
    assert totals.keys() == expected.keys()
    for name, values in expected.items():
        np.testing.assert_allclose(totals[name], values, rtol=1e-12, err_msg=name)


def test_statistics_side_by_side_are_the_serial_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The min and max, the sum and the count, and the two deviation sums run two at a time on
    two threads (torch's one-dimensional CPU scatters are serial): the same bits as one after
    the other, and an error on the helper thread reaches the caller."""
    from grpo_cli.kernel import accumulate  # where the split is decided

    gen = torch.Generator().manual_seed(5)
    ids = torch.arange(40_000).repeat_interleave(5)
    ids = ids[torch.randperm(ids.numel(), generator=gen)]
    rewards = torch.rand(ids.numel(), generator=gen, dtype=torch.float64) * 3 - 1
    threads = []
    real_side_by_side = accumulate._side_by_side

    def counted(first, second, rows):  # type: ignore[no-untyped-def]
        threads.append(rows.numel() >= accumulate.SIDE_BY_SIDE_MIN_ROWS and torch.get_num_threads() > 1)
        return real_side_by_side(first, second, rows)

    monkeypatch.setattr(accumulate, "_side_by_side", counted)
    side_by_side = accumulate.group_stats(rewards, ids)
    # one thread (the Makefile's second run of the float tests): one after the other
    assert threads and all(threads) == (torch.get_num_threads() > 1)
    monkeypatch.setattr(accumulate, "SIDE_BY_SIDE_MIN_ROWS", 1 << 60)
    serial = accumulate.group_stats(rewards, ids)
    for name in ("count", "mean", "m2", "minimum", "maximum"):
        assert torch.equal(getattr(side_by_side, name), getattr(serial, name)), name
    monkeypatch.setattr(accumulate, "SIDE_BY_SIDE_MIN_ROWS", 1)

    def fails() -> torch.Tensor:
        raise ValueError("on the helper thread")

    with pytest.raises(ValueError, match="on the helper thread"):
        real_side_by_side(fails, lambda: torch.zeros(1), torch.zeros(2))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=60),
    block_rows=st.integers(1, 30),
    chunk=st.integers(1, 25),
    peek_after=st.integers(0, 12),
    count_extremes=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_running_totals_grow_in_place_and_keep_what_compute_gave(
    sizes, block_rows, chunk, peek_after, count_extremes, seed
):
    """Statistics and figures grow their totals in place as new groups arrive (sorted IDs, a
    few rows returning to group 0): fed in chunks they are each block's statistics merged
    placed among all the groups, in order, and the figures of all rows at once; what a
    compute() part-way gave stays as it was while more rows arrive."""
    import numpy as np

    from grpo_cli.run.figures import FigureAccumulator, RowInputs, of_chunk, wanted

    ids = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
    gen = torch.Generator().manual_seed(seed)
    ids[torch.rand(ids.numel(), generator=gen) < 0.1] = 0
    rewards = torch.rand(ids.numel(), generator=gen, dtype=torch.float64).round(decimals=1)
    rewards[torch.rand(ids.numel(), generator=gen) < 0.1] = math.nan
    valid = ~rewards.isnan()
    k = int(ids.max()) + 1  # the last group's rows may all have gone to group 0

    def fed(peek: bool):
        stats = GroupStatsAccumulator(block_rows=block_rows, count_extremes=count_extremes)
        figures = FigureAccumulator(wanted(()), block_rows=block_rows)
        early = None
        for i, start in enumerate(range(0, ids.numel(), chunk)):
            part = slice(start, start + chunk)
            stats.update(rewards[part], ids[part], valid[part])
            figures.update(ids[part].numpy(), RowInputs(rewards[part].numpy(), valid[part].numpy(), None))
            if peek and i == peek_after:
                early = (stats.compute(), figures.compute())
                copies = (
                    {n: t.clone() for n, t in early[0].to_columns("").items()},
                    {n: a.copy() for n, a in early[1].items()},
                )
        if early is not None:  # the rows after it went to new totals
            for name, values in early[0].to_columns("").items():
                assert torch.equal(values, copies[0][name]), name
            for name, array in early[1].items():
                np.testing.assert_array_equal(array, copies[1][name], err_msg=name)
        return stats.compute(), figures.compute()

    expected = empty_group_stats(k, count_extremes=count_extremes)
    for start in range(0, ids.numel(), block_rows):
        block = slice(start, start + block_rows)
        low, high = int(ids[block].min()), int(ids[block].max())
        own = group_stats(
            rewards[block],
            ids[block] - low,
            high - low + 1,
            valid=valid[block],
            count_extremes=count_extremes,
        )
        expected = merge_group_stats(expected, own.placed(torch.arange(low, high + 1), k))
    stats, figures = fed(peek=False)
    assert stats == expected
    all_rows = RowInputs(rewards.numpy(), valid.numpy(), None)
    expected_figures = of_chunk(wanted(()), ids.numpy(), k, all_rows)
    assert figures.keys() == expected_figures.keys()
    for name, values in expected_figures.items():
        np.testing.assert_array_equal(figures[name], values, err_msg=name)
    fed(peek=True)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=40),
    chunk=st.integers(1, 20),
    peek_after=st.integers(0, 6),
    seed=st.integers(0, 2**16),
)
def test_the_top_two_figure_over_chunks_is_the_top_two_of_all_rows(sizes, chunk, peek_after, seed):
    """Each chunk's top two over its own groups (as both engines take them, from its lowest ID
    to its highest) merged in place by the figure's rule: the top two of all scored rows at
    once, best rows included; what compute() gave part-way stays as it was."""
    from grpo_cli.kernel import group_top_two
    from grpo_cli.run.figures import FigureAccumulator, RowInputs, padded, top_two_of, wanted

    gen = torch.Generator().manual_seed(seed)
    ids = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
    ids[torch.rand(ids.numel(), generator=gen) < 0.15] = 0  # group 0 comes back in later chunks
    values = torch.randint(0, 4, (ids.numel(),), generator=gen).to(torch.float64) / 2
    scored = torch.rand(ids.numel(), generator=gen) > 0.1
    k = int(ids.max()) + 1
    figures = wanted(("top_two",))
    running, early = FigureAccumulator(figures, block_rows=7), None
    names = ("first", "second", "best_row")
    for i, start in enumerate(range(0, ids.numel(), chunk)):
        part = slice(start, start + chunk)
        rows = values[part].numel()
        inputs = RowInputs(values[part].numpy(), scored[part].numpy(), None, runs=((start, rows),))
        running.update(ids[part].numpy(), inputs)
        if i == peek_after:
            early = top_two_of(running.compute())
            assert early is not None
            copies = [getattr(early, name).clone() for name in names]
    positions = torch.arange(ids.numel())
    expected = group_top_two(values[scored], ids[scored], k, positions=positions[scored])
    got = top_two_of(padded(figures, running.compute(), k))
    assert got is not None
    for name in names:
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    if early is not None:
        for name, copy in zip(names, copies, strict=True):
            assert torch.equal(getattr(early, name), copy), name
