"""The kernel against the independent float64 reference, its exact cases and its errors."""

from __future__ import annotations

import math
import re

import pytest
import torch

from grpo_cli.kernel import (
    GroupStats,
    GroupStatsAccumulator,
    active_groups,
    advantages_from_stats,
    apply_normalization,
    group_scale,
    group_stats,
    merge_group_stats,
    normalize_in_groups,
    prepare_normalization,
)
from tests.reference import reference_advantages

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# Relative accuracy we expect: a couple of ulps of the output dtype.
TOLERANCE = {
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    torch.float32: 1e-6,
    torch.float64: 1e-12,
}


def make_ids(layout: str, n_groups: int, group_size: int, gen: torch.Generator) -> torch.Tensor:
    ids = torch.arange(n_groups).repeat_interleave(group_size)
    if layout == "sorted":
        return ids
    if layout == "shuffled":
        return ids[torch.randperm(ids.numel(), generator=gen)]
    if layout == "gaps":  # every third ID unused: empty, inactive groups
        return (ids * 3)[torch.randperm(ids.numel(), generator=gen)]
    if layout == "ragged":  # sizes 1..group_size*2, singletons included
        sizes = torch.randint(1, 2 * group_size + 1, (n_groups,), generator=gen)
        return torch.arange(n_groups).repeat_interleave(sizes)[
            torch.randperm(int(sizes.sum()), generator=gen)
        ]
    raise AssertionError(layout)


def make_rewards(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Binary, continuous and constant-prone rewards mixed, representable in ``dtype``."""
    kind = torch.randint(0, 3, (n,), generator=gen)
    binary = torch.randint(0, 2, (n,), generator=gen).double()
    continuous = torch.randn(n, generator=gen, dtype=torch.float64) * 3 + 1
    rewards = torch.where(kind == 0, binary, continuous)
    return rewards.to(dtype)


def assert_matches_reference(rewards, ids, out, **options):
    expected, active = reference_advantages(rewards.double().tolist(), ids.tolist(), **options)
    got = out["advantages"]
    assert got.dtype == rewards.dtype
    assert got.shape == rewards.shape
    tol = TOLERANCE[rewards.dtype]
    expected_t = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(got.double().reshape(-1), expected_t, rtol=tol, atol=tol)
    mask = out["active_group_mask"]
    for g in range(mask.numel()):
        assert bool(mask[g]) == active.get(g, False), g
    assert out["active_group_count"] == sum(active.values())


# --------------------------------------------------------------------------- exact cases from the contract


def test_two_rewards_exact():
    out = normalize_in_groups(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]), 1e-8)
    assert out["advantages"].tolist() == [-1.0, 1.0]
    assert out["active_group_mask"].tolist() == [True]
    assert out["active_group_count"] == 1
    assert type(out["active_group_count"]) is int


def test_active_and_constant_group_exact():
    # Exact with epsilon 1e-8 (1 / (1 + 1e-8) rounds to 1 in float32); within epsilon by default.
    out = normalize_in_groups(torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1]), 1e-8)
    assert out["advantages"].tolist() == [-1.0, 1.0, 0.0, 0.0]
    default = normalize_in_groups(torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1]))
    assert default["advantages"].tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0], abs=2e-6)
    assert default["advantages"][2:].tolist() == [0.0, 0.0]
    assert out["active_group_mask"].tolist() == [True, False]
    assert out["active_group_count"] == 1


def test_constant_group_exact():
    out = normalize_in_groups(torch.tensor([4.0, 4.0]), torch.tensor([0, 0]))
    assert out["advantages"].tolist() == [0.0, 0.0]
    assert out["active_group_mask"].tolist() == [False]
    assert out["active_group_count"] == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("epsilon", [1e-12, 1e-8, 1e-6, 1e-4])
@pytest.mark.parametrize("value", [0.1, 1 / 3, 0.7, 1e4 + 0.1, -2.3e-5])
@pytest.mark.parametrize("form", ["ids", "shuffled_ids", "group_size", "2d"])
def test_constant_groups_are_exactly_positive_zero(dtype, epsilon, value, form):
    # The float mean of seven copies of 0.1 is not 0.1 in float32: a trainer that decides
    # activity from the rounded std turns the residue into a large same-signed advantage.
    rewards = torch.full((7,), value, dtype=dtype)
    rewards = torch.cat((rewards, torch.tensor([0.0, 1.0], dtype=dtype)))
    ids = torch.tensor([0] * 7 + [1, 1])
    if form == "ids":
        out = normalize_in_groups(rewards, ids, epsilon)
    elif form == "shuffled_ids":
        perm = torch.tensor([3, 7, 0, 1, 8, 2, 4, 5, 6])
        out = normalize_in_groups(rewards[perm], ids[perm], epsilon)
        rewards, ids = rewards[perm], ids[perm]
    elif form == "group_size":
        rewards = torch.full((7,), value, dtype=dtype)
        out = normalize_in_groups(rewards, group_size=7, epsilon=epsilon)
        ids = torch.zeros(7, dtype=torch.long)
    else:
        rewards = torch.full((3, 7), value, dtype=dtype)
        out = normalize_in_groups(rewards, epsilon=epsilon)
        ids = torch.arange(3).repeat_interleave(7)
    constant = out["advantages"].reshape(-1)[ids.reshape(-1) == 0]
    assert constant.tolist() == [0.0] * constant.numel()
    assert not torch.signbit(constant).any(), "inactive advantages must be +0.0, not -0.0"
    assert not bool(out["active_group_mask"][0])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("std", ["population", "sample"])
def test_constant_groups_zero_in_every_mode(scale, std):
    rewards = torch.tensor([0.1] * 7 + [0.0, 1.0, 0.5], dtype=torch.float32)
    ids = torch.tensor([0] * 7 + [1, 1, 1])
    out = normalize_in_groups(rewards, ids, 1e-12, std=std, scale=scale)
    assert out["advantages"][:7].tolist() == [0.0] * 7
    assert out["advantages"][7:].abs().sum() > 0


def test_large_offset_small_spread_float32():
    # Rewards near 1e4 with a spread of 0.5: E[x^2] - E[x]^2 in float32 loses it all.
    gen = torch.Generator().manual_seed(1)
    base = torch.full((64,), 1e4, dtype=torch.float64)
    rewards64 = base + torch.randint(0, 2, (64,), generator=gen).double() * 0.5
    rewards = rewards64.float()
    ids = torch.arange(8).repeat_interleave(8)
    out = normalize_in_groups(rewards, ids, 1e-6)
    assert_matches_reference(rewards, ids, out, epsilon=1e-6)
    active = out["advantages"][out["advantages"] != 0]
    assert active.abs().min() > 0.3  # half-step advantages, not noise


def test_float64_extreme_offset():
    rewards = torch.tensor([1e12 + 1, 1e12 + 2, 1e12 + 3], dtype=torch.float64)
    out = normalize_in_groups(rewards, torch.zeros(3, dtype=torch.long), 1e-8)
    expected = math.sqrt(1.5)
    torch.testing.assert_close(
        out["advantages"], torch.tensor([-expected, 0.0, expected], dtype=torch.float64)
    )


# --------------------------------------------------------------------------- against the reference


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["sorted", "shuffled", "gaps", "ragged"])
@pytest.mark.parametrize(("n_groups", "group_size"), [(1, 2), (5, 1), (17, 8), (300, 4), (64, 16)])
def test_ids_form_matches_reference(dtype, layout, n_groups, group_size):
    gen = torch.Generator().manual_seed(n_groups * 100 + group_size)
    ids = make_ids(layout, n_groups, group_size, gen)
    rewards = make_rewards(ids.numel(), dtype, gen)
    out = normalize_in_groups(rewards, ids, 1e-6)
    assert_matches_reference(rewards, ids, out, epsilon=1e-6)
    assert out["active_group_mask"].shape == (int(ids.max()) + 1,)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n_groups", "group_size"), [(1, 1), (3, 2), (40, 8), (7, 33)])
def test_2d_and_group_size_forms_match_reference(dtype, n_groups, group_size):
    gen = torch.Generator().manual_seed(7)
    rewards = make_rewards(n_groups * group_size, dtype, gen)
    ids = torch.arange(n_groups).repeat_interleave(group_size)
    flat = normalize_in_groups(rewards, group_size=group_size)
    assert_matches_reference(rewards, ids, flat)
    two_d = normalize_in_groups(rewards.view(n_groups, group_size))
    assert two_d["advantages"].shape == (n_groups, group_size)
    assert torch.equal(two_d["advantages"].reshape(-1), flat["advantages"])
    assert torch.equal(two_d["active_group_mask"], flat["active_group_mask"])


@pytest.mark.parametrize("std", ["population", "sample"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("layout", ["sorted", "shuffled", "ragged"])
def test_options_match_reference(std, scale, layout):
    gen = torch.Generator().manual_seed(3)
    ids = make_ids(layout, 50, 6, gen)
    rewards = make_rewards(ids.numel(), torch.float64, gen)
    out = normalize_in_groups(rewards, ids, 1e-6, std=std, scale=scale)
    assert_matches_reference(rewards, ids, out, epsilon=1e-6, std=std, scale=scale)


@pytest.mark.parametrize("baseline", ["mean", "leave-one-out"])
@pytest.mark.parametrize("epsilon_mode", ["add", "clamp", "add-if-nonzero"])
@pytest.mark.parametrize("singleton", ["zero", "raw"])
@pytest.mark.parametrize("std", ["population", "sample"])
def test_estimator_options_match_reference(baseline, epsilon_mode, singleton, std):
    gen = torch.Generator().manual_seed(11)
    ids = make_ids("ragged", 60, 4, gen)
    rewards = make_rewards(ids.numel(), torch.float64, gen)
    options = dict(baseline=baseline, epsilon_mode=epsilon_mode, singleton=singleton, std=std)
    out = normalize_in_groups(rewards, ids, 1e-3, **options)  # type: ignore[arg-type]
    assert_matches_reference(rewards, ids, out, epsilon=1e-3, **options)


OUTLIER_GROUPS = [
    [1.0, 1.0, 1.0000001, 100.0],  # the others' M2 (7e-15) below the rounding of the group's (7350)
    [-5e4, 0.25, 0.5, 0.25 + 2**-40, 0.375],  # a lone minimum
    [3.0, 1e-6, 2e-6, 1e-6],  # the outlier first
    [1e300, 1.0, 2.0],  # a group scaled by 2**997 whose others have scale 1
    [7.0, 7.0, 7.0, 7.5, 7.0],  # others identical: nothing to divide by, exactly
    [2.0, 9.0, 9.0, 1.0],  # extremes tied at the maximum, lone at the minimum
]


def _outlier_case() -> tuple[torch.Tensor, torch.Tensor]:
    rewards = [v for group in OUTLIER_GROUPS for v in group]
    ids = [g for g, group in enumerate(OUTLIER_GROUPS) for _ in group]
    return torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids)


@pytest.mark.parametrize("std", ["population", "sample"])
@pytest.mark.parametrize("epsilon_mode", ["add", "add-if-nonzero"])
def test_leave_one_out_divides_a_lone_outlier_by_its_others_spread(std, epsilon_mode):
    """The others' M2 of a row was the group's M2 less the row's share (the reverse update),
    which cancels where that row dominates the group: the 100.0 above got 5.07e7 where the
    formula gives 9.36e7 under NeMo-RL's options. Such a row is its group's lone maximum or
    minimum, and the statistics now carry each group without it: the reference's values, to
    its rounding."""
    rewards, ids = _outlier_case()
    options = dict(baseline="leave-one-out", std=std, epsilon_mode=epsilon_mode)
    out = normalize_in_groups(rewards, ids, 1e-6, **options)  # type: ignore[arg-type]
    expected, _ = reference_advantages(rewards.tolist(), ids.tolist(), epsilon=1e-6, **options)
    torch.testing.assert_close(
        out["advantages"], torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0
    )
    if std == "sample" and epsilon_mode == "add-if-nonzero":  # NeMo-RL's options
        assert out["advantages"][3].item() == pytest.approx(93596219.6996397, rel=1e-12)


@pytest.mark.parametrize("block_rows", [1, 2, 3, 5, 7, 1 << 20])
def test_the_groups_without_their_extremes_merge_across_blocks(block_rows):
    """Each block's statistics without its first rollout at the extreme, merged in row order
    (where the later block's extreme beats the earlier's strictly, it is the one left out):
    the statistics of the whole group without its first rollout at the extreme, to the rounding
    of Chan's merge (never to the group's M2: the outlier is not in them), and bit for bit the
    same however the rows are fed in (both engines cut the same blocks). The whole group's are
    those of the list without that rollout, bit for bit."""
    rewards, ids = _outlier_case()
    order = torch.randperm(rewards.numel(), generator=torch.Generator().manual_seed(5))
    rewards, ids = rewards[order], ids[order]
    whole = group_stats(rewards, ids, count_extremes=True)
    fed = []
    for chunk in (1, 3, rewards.numel()):
        acc = GroupStatsAccumulator(block_rows=block_rows, count_extremes=True)
        for start in range(0, rewards.numel(), chunk):
            acc.update(rewards[start : start + chunk], ids[start : start + chunk])
        fed.append(acc.compute())
    assert fed[0] == fed[1] == fed[2]
    for name in GroupStats.LEAVE_OUTS:
        got, want = getattr(fed[0], name), getattr(whole, name)
        assert torch.equal(got.count, want.count) and torch.equal(got.minimum, want.minimum), name
        torch.testing.assert_close(got.mean, want.mean, rtol=1e-15, atol=0)
        torch.testing.assert_close(
            got.m2 * group_scale(got) ** 2, want.m2 * group_scale(want) ** 2, rtol=1e-8, atol=0
        )  # Chan's merge of [1, 1] and [1.0000001] rounds its means' difference: 1e-9 of the 7e-15
    for g in range(len(OUTLIER_GROUPS)):
        values = rewards[ids == g].tolist()
        for name, extreme in (("but_max", max(values)), ("but_min", min(values))):
            rest = list(values)
            rest.remove(extreme)  # the first at the extreme, in row order
            expected = group_stats(
                torch.tensor(rest, dtype=torch.float64), torch.zeros(len(rest), dtype=torch.long)
            )
            got = getattr(whole, name)
            assert (got.count[g].item(), got.mean[g].item(), got.m2[g].item()) == (
                expected.count[0].item(),
                expected.mean[0].item(),
                expected.m2[0].item(),
            ), (g, name)


# --------------------------------------------------------------------------- contract details


def test_empty_inputs():
    for dtype in DTYPES:
        out = normalize_in_groups(torch.tensor([], dtype=dtype), torch.tensor([], dtype=torch.long))
        assert out["advantages"].dtype == dtype and out["advantages"].shape == (0,)
        assert out["active_group_mask"].dtype == torch.bool and out["active_group_mask"].shape == (0,)
        assert out["active_group_count"] == 0
    out = normalize_in_groups(torch.empty(0, 8))
    assert out["advantages"].shape == (0, 8) and out["active_group_mask"].shape == (0,)
    out = normalize_in_groups(torch.empty(0), group_size=4)
    assert out["active_group_mask"].shape == (0,)


def test_inputs_are_not_modified_and_noncontiguous_is_fine():
    base = torch.tensor([1.0, 9.0, 3.0, 9.0, 4.0, 9.0, 4.0, 9.0])
    ids_base = torch.tensor([0, 5, 0, 5, 1, 5, 1, 5])
    rewards, ids = base[::2], ids_base[::2]
    assert not rewards.is_contiguous()
    before_r, before_i = rewards.clone(), ids.clone()
    out = normalize_in_groups(rewards, ids, 1e-8)
    assert torch.equal(rewards, before_r) and torch.equal(ids, before_i)
    assert out["advantages"].tolist() == [-1.0, 1.0, 0.0, 0.0]
    two_d = torch.tensor([[1.0, 4.0], [3.0, 4.0]]).t()  # noncontiguous view of [[1, 3], [4, 4]]
    out2 = normalize_in_groups(two_d, epsilon=1e-8)
    assert out2["advantages"].tolist() == [[-1.0, 1.0], [0.0, 0.0]]


def test_integer_id_dtypes_accepted():
    for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        out = normalize_in_groups(torch.tensor([1.0, 3.0]), torch.tensor([0, 0], dtype=dtype), 1e-8)
        assert out["advantages"].tolist() == [-1.0, 1.0]


def test_unused_ids_are_inactive_groups():
    out = normalize_in_groups(torch.tensor([1.0, 2.0]), torch.tensor([3, 3]))
    assert out["active_group_mask"].tolist() == [False, False, False, True]


def test_singleton_is_inactive():
    out = normalize_in_groups(torch.tensor([5.0, 1.0, 2.0]), torch.tensor([0, 1, 1]))
    assert out["advantages"][0].item() == 0.0
    assert out["active_group_mask"].tolist() == [False, True]


def test_result_on_input_device():
    out = normalize_in_groups(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]))
    assert out["advantages"].device.type == "cpu"
    assert out["active_group_mask"].device.type == "cpu"


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: normalize_in_groups([1.0, 2.0], torch.zeros(2, dtype=torch.long)),
            "rewards must be a torch.Tensor, got list",
        ),  # type: ignore[arg-type]
        (lambda: normalize_in_groups(torch.ones(2), [0, 0]), "group_ids must be a torch.Tensor, got list"),  # type: ignore[arg-type]
        (
            lambda: normalize_in_groups(torch.ones(4), torch.zeros(4, dtype=torch.long), group_size=2),
            "pass either group_ids or group_size, not both",
        ),
        (
            lambda: normalize_in_groups(torch.ones(4), group_size=True),
            "group_size must be a positive integer, got True",
        ),
        (
            lambda: normalize_in_groups(torch.ones(4), group_size=2.0),
            "group_size must be a positive integer, got 2.0",
        ),  # type: ignore[arg-type]
        (
            lambda: normalize_in_groups(torch.ones(2, 2), group_size=2),
            "group_size needs 1-D rewards, got shape (2, 2); 2-D rewards are already grouped by row",
        ),
        (
            lambda: normalize_in_groups(torch.ones(2, 0)),
            "2-D rewards need at least one column, got shape (2, 0)",
        ),
        (
            lambda: normalize_in_groups(torch.ones(2, 2, 2)),
            "rewards of shape (2, 2, 2) need group_ids or group_size; "
            "only 2-D rewards of shape (num_prompts, group_size) are grouped by row",
        ),
    ],
)
def test_call_form_errors_say_exactly_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


def _accumulated(rewards: torch.Tensor, ids: torch.Tensor) -> GroupStatsAccumulator:
    acc = GroupStatsAccumulator()
    acc.update(rewards, ids)
    return acc


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: normalize_in_groups(torch.ones(3), torch.zeros(4, dtype=torch.long)), r"\(3,\) and \(4,\)"),
        (
            lambda: normalize_in_groups(torch.ones(2), torch.tensor([0.0, 1.0])),
            "integer tensor, got dtype torch.float32",
        ),
        (
            lambda: normalize_in_groups(torch.ones(2), torch.tensor([True, False])),
            "integer tensor, got dtype torch.bool",
        ),
        (
            lambda: normalize_in_groups(torch.ones(3), torch.tensor([0, -2, 1])),
            "non-negative, got -2 at index 1",
        ),
        (  # negative IDs in equal blocks, as sorted input lays them out
            lambda: normalize_in_groups(torch.ones(4), torch.tensor([-2, -2, -1, -1])),
            "non-negative, got -2 at index 0",
        ),
        (
            lambda: normalize_in_groups(torch.tensor([1, 2]), torch.tensor([0, 0])),
            "floating-point tensor.*torch.int64",
        ),
        (
            lambda: normalize_in_groups(
                torch.tensor([1.0, float("nan"), float("inf"), 2.0]), torch.zeros(4, dtype=torch.long)
            ),
            "2 NaN or infinite value.*first is nan at index 1",
        ),
        (
            lambda: normalize_in_groups(torch.ones(2), torch.zeros(2, dtype=torch.long), 0.0),
            "epsilon.*got 0.0",
        ),
        (
            lambda: normalize_in_groups(torch.ones(2), torch.zeros(2, dtype=torch.long), -1e-6),
            "epsilon.*got -1e-06",
        ),
        (
            lambda: normalize_in_groups(torch.ones(2), torch.zeros(2, dtype=torch.long), float("inf")),
            "epsilon.*got inf",
        ),
        (
            lambda: normalize_in_groups(torch.ones(2), torch.zeros(2, dtype=torch.long), float("nan")),
            "epsilon.*got nan",
        ),
        (
            lambda: normalize_in_groups(torch.ones(10), group_size=3),
            r"\(10\) is not divisible by group_size \(3\)",
        ),
        (lambda: normalize_in_groups(torch.ones(4), group_size=0), "positive integer, got 0"),
        (lambda: normalize_in_groups(torch.ones(4)), r"shape \(4,\) need group_ids or group_size"),
        (
            lambda: normalize_in_groups(torch.ones(4), torch.zeros(4, dtype=torch.long), group_size=2),
            "either group_ids or group_size",
        ),
        (
            lambda: normalize_in_groups(torch.ones(2), torch.zeros(2, dtype=torch.long), std="biased"),
            "^std must be one of population, sample, got 'biased'$",
        ),
        (
            lambda: normalize_in_groups(torch.ones(2), torch.zeros(2, dtype=torch.long), scale="row"),
            "^scale must be one of group, batch, none, mean, got 'row'$",
        ),
        (lambda: normalize_in_groups([1.0, 2.0], torch.zeros(2, dtype=torch.long)), "torch.Tensor, got list"),  # type: ignore[arg-type]
        (
            lambda: apply_normalization(
                torch.ones(3),
                torch.tensor([0, 1, 2]),
                prepare_normalization(group_stats(torch.ones(2), torch.tensor([0, 1]))),
            ),
            r"^group IDs reach 2 but stats describe 2 groups$",
        ),
        (
            lambda: prepare_normalization(
                group_stats(torch.ones(2), torch.zeros(2, dtype=torch.long)), std="n"
            ),
            "^std must be one of population, sample, got 'n'$",
        ),
        (
            lambda: active_groups(
                group_stats(torch.ones(2), torch.zeros(2, dtype=torch.long)), singleton="one"
            ),
            "^singleton must be one of zero, raw, got 'one'$",
        ),
        (
            lambda: normalize_in_groups(torch.tensor([math.nan]), torch.zeros(1, dtype=torch.long)),
            "NaN or infinite value.*first is nan at index 0",
        ),
        (lambda: GroupStatsAccumulator(block_rows=0), "^block_rows must be positive, got 0$"),
        (lambda: GroupStatsAccumulator(group_size=0), "^group_size must be a positive integer, got 0$"),
        (
            lambda: _accumulated(torch.ones(2), torch.tensor([0, 1])).compute(num_groups=1),
            r"^num_groups \(1\) is below the groups seen \(2\)$",
        ),
        (
            lambda: GroupStatsAccumulator().update(torch.ones(2)),
            "^pass group_ids exactly when the accumulator has no group_size$",
        ),
        (
            lambda: GroupStatsAccumulator(group_size=2).update(
                torch.ones(2), torch.zeros(2, dtype=torch.long)
            ),
            "^pass group_ids exactly when the accumulator has no group_size$",
        ),
    ],
)
def test_bad_calls_raise_value_error_naming_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.cuda
def test_device_mismatch_and_cuda_matches_cpu():
    rewards = torch.tensor([1.0, 3.0, 4.0, 4.0])
    ids = torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="same device, got cuda:0 and cpu"):
        normalize_in_groups(rewards.cuda(), ids)
    gen = torch.Generator().manual_seed(0)
    ids = make_ids("shuffled", 1000, 8, gen)
    rewards = make_rewards(ids.numel(), torch.float32, gen)
    cpu = normalize_in_groups(rewards, ids)
    gpu = normalize_in_groups(rewards.cuda(), ids.cuda())
    assert gpu["advantages"].device.type == "cuda"
    torch.testing.assert_close(gpu["advantages"].cpu(), cpu["advantages"])
    assert torch.equal(gpu["active_group_mask"].cpu(), cpu["active_group_mask"])


def test_device_mismatch_message_without_cuda():
    rewards = torch.ones(2, device="meta")
    with pytest.raises(ValueError, match="same device, got meta and cpu"):
        normalize_in_groups(rewards, torch.zeros(2, dtype=torch.long))


# --------------------------------------------------------------------------- update / merge / compute


@pytest.mark.parametrize("chunks", [1, 2, 5, 13])
def test_merged_chunks_match_one_pass(chunks):
    gen = torch.Generator().manual_seed(5)
    ids = make_ids("ragged", 200, 8, gen)
    rewards = make_rewards(ids.numel(), torch.float32, gen)
    merged: GroupStats | None = None
    for part_r, part_i in zip(rewards.chunk(chunks), ids.chunk(chunks), strict=True):
        stats = group_stats(part_r, part_i)
        merged = stats if merged is None else merge_group_stats(merged, stats)
    assert merged is not None
    whole = group_stats(rewards, ids)
    assert torch.equal(merged.count, whole.count)
    assert torch.equal(merged.minimum, whole.minimum) and torch.equal(merged.maximum, whole.maximum)
    torch.testing.assert_close(merged.mean, whole.mean, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(merged.m2, whole.m2, rtol=1e-12, atol=1e-12)
    streamed = advantages_from_stats(rewards, ids, merged)
    assert_matches_reference(
        rewards,
        ids,
        {
            "advantages": streamed,
            "active_group_mask": active_groups(merged),
            "active_group_count": int(active_groups(merged).sum()),
        },
    )


def test_merge_with_empty_is_exact():
    stats = group_stats(torch.tensor([0.1, 0.2, 0.7]), torch.tensor([0, 0, 1]))
    empty = group_stats(torch.tensor([]), torch.tensor([], dtype=torch.long), 3)
    for merged in (merge_group_stats(stats, empty), merge_group_stats(empty, stats)):
        assert torch.equal(merged.mean[:2], stats.mean) and torch.equal(merged.m2[:2], stats.m2)
        assert merged.count.tolist() == [2, 1, 0]


def test_valid_mask_leaves_rows_out():
    rewards = torch.tensor([1.0, 3.0, 100.0, 4.0])
    ids = torch.tensor([0, 0, 0, 1])
    valid = torch.tensor([True, True, False, True])
    stats = group_stats(rewards, ids, valid=valid, count_extremes=True)
    assert stats.count.tolist() == [2, 1]
    out = advantages_from_stats(rewards, ids, stats, epsilon=1e-8, valid=valid)
    assert out.tolist() == [-1.0, 1.0, 0.0, 0.0]


def test_group_stats_column_form_round_trips_and_places():
    from grpo_cli.kernel import empty_group_stats

    r = torch.tensor([1.0, 3.0, 2.0, 2.0, 9.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1, 2])
    stats = group_stats(r, ids, count_extremes=True)
    columns = stats.to_columns("p_")
    nested = [f"p_{out}_{name}" for out in GroupStats.LEAVE_OUTS for name in GroupStats.FIELDS[:5]]
    assert sorted(columns) == sorted([f"p_{name}" for name in GroupStats.FIELDS] + nested)
    assert GroupStats.from_columns(columns, "p_") == stats
    restored = GroupStats.from_columns(columns, "p_")
    assert restored.but_max is not None and restored.but_max == stats.but_max
    assert GroupStats.from_columns(stats.without_extremes().to_columns()) == stats.without_extremes()
    plain = stats.without_extremes()
    assert plain.at_minimum is None and plain.at_maximum is None and not plain.counts_extremes
    assert plain == group_stats(r, ids)
    placed = stats.select(torch.tensor([2, 0])).placed(torch.tensor([3, 1]), 4)
    assert placed.count.tolist() == [0, 2, 0, 1]
    assert placed.mean.tolist() == [0.0, 2.0, 0.0, 9.0]
    assert placed.minimum.tolist() == [math.inf, 1.0, math.inf, 9.0]
    assert placed.at_maximum is not None and placed.at_maximum.tolist() == [0, 1, 0, 1]
    assert placed.but_max is not None and placed.but_max.count.tolist() == [0, 1, 0, 0]  # 1.0 without 3.0
    empty = empty_group_stats(2, dtype=torch.float32, count_extremes=True)
    assert (empty.mean.dtype, empty.count.dtype, empty.at_minimum.dtype) == (  # type: ignore[union-attr]
        torch.float32,
        torch.int64,
        torch.int64,
    )
    assert empty.maximum.tolist() == [-math.inf, -math.inf] and empty.m2.tolist() == [0.0, 0.0]
    assert stats != stats.without_extremes()
