"""Reward columns to tensors: CSV text parsed exactly, validity masks, the combined reward."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from grpo_cli.errors import GrpoError
from grpo_cli.rewards import RewardBatch, _concat_valid, _weighted_sum, numbers_from_text
from grpo_cli.sources import Shard

CSV = Shard(Path("r.csv"), "r.csv", "csv", 0)


@pytest.mark.parametrize(
    ("texts", "values"),
    [
        (
            ["1", "-2", "0.5", ".25", "5.", "+3", "1e3", "1E-2", "-0"],
            [1.0, -2.0, 0.5, 0.25, 5.0, 3.0, 1000.0, 0.01, -0.0],
        ),
        (["nan", "NaN", "NAN"], [math.nan] * 3),
        (["inf", "-Infinity", "INF"], [math.inf, -math.inf, math.inf]),
        (["True", "false", "TRUE", None], [1.0, 0.0, 1.0, None]),
        (["9007199254740992", "-9007199254740992", "1e20"], [2.0**53, -(2.0**53), 1e20]),
        ([None, "1"], [None, 1.0]),
    ],
)
def test_numbers_from_text(texts, values):
    got = numbers_from_text(pa.array(texts, pa.string()), "r", CSV)
    assert got.type == pa.float64()
    for a, b in zip(got.to_pylist(), values, strict=True):
        assert (
            (a is None and b is None)
            or (math.isnan(a) and math.isnan(b))
            or (a == b and math.copysign(1, a) == math.copysign(1, b))
        )


@pytest.mark.parametrize(
    ("texts", "first_row", "message"),
    [
        (["1", None, "abc"], 0, "r.csv, row 2: column 'r' holds 'abc', which is not a number"),
        (["true", "1"], 10, "r.csv, row 10: column 'r' holds 'true'"),  # booleans and numbers do not mix
        (["0x10"], 0, "r.csv, row 0: column 'r' holds '0x10', which is not a number"),
        ([" 1"], 0, "r.csv, row 0: column 'r' holds ' 1', which is not a number"),
        (
            ["1", "9007199254740993"],
            5,
            "r.csv, row 6: column 'r' holds the integer 9007199254740993, which float64",
        ),
        (["-9007199254740993"], 0, "r.csv, row 0: column 'r' holds the integer -9007199254740993"),
    ],
)
def test_numbers_from_text_refuses_what_is_no_exact_number(texts, first_row, message):
    with pytest.raises(GrpoError, match=f"^{__import__('re').escape(message)}"):
        numbers_from_text(
            pa.array(texts, pa.string()), "r", Shard(Path("nowhere/r.csv"), "r.csv", "csv", 0), first_row
        )


def test_concat_valid_fills_missing_masks_with_all_valid():
    values = [torch.zeros(2), torch.zeros(3)]
    assert _concat_valid([None, None], values) is None
    mask = _concat_valid([None, torch.tensor([True, False, True])], values)
    assert mask is not None and mask.dtype == torch.bool
    assert mask.tolist() == [True, True, True, False, True]
    mask = _concat_valid([torch.tensor([False, True]), None], values)
    assert mask is not None and mask.tolist() == [False, True, True, True, True]


def test_reward_batches_concatenate_channel_by_channel():
    a = RewardBatch([torch.tensor([1.0]), torch.tensor([2.0])], [None, None], torch.tensor([3.0]), None)
    nan = float("nan")
    b = RewardBatch(
        [torch.tensor([nan, 4.0]), torch.tensor([5.0, 6.0])],
        [torch.tensor([False, True]), None],
        torch.tensor([nan, 10.0]),
        torch.tensor([False, True]),
    )
    both = RewardBatch.concat([a, b])
    assert [c.tolist() for c in both.channels][1] == [2.0, 5.0, 6.0]
    assert both.channel_valid[0] is not None and both.channel_valid[0].tolist() == [True, False, True]
    assert both.channel_valid[1] is None
    assert both.combined_valid is not None and both.combined_valid.tolist() == [True, False, True]
    assert RewardBatch.concat([a]) is a


def test_weighted_sum_keeps_infinities_under_nansum():
    terms = [torch.tensor([math.inf, 1.0, math.nan]), torch.tensor([math.nan, math.nan, math.nan])]
    got = _weighted_sum(terms, nansum=True).tolist()
    assert got[:2] == [math.inf, 1.0] and math.isnan(got[2])
    plain = _weighted_sum(terms, nansum=False).tolist()
    assert all(math.isnan(v) for v in plain)
