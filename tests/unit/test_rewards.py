"""Reward columns to tensors: CSV text parsed exactly, validity masks, the combined reward."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from grpo_cli.errors import GrpoError
from grpo_cli.inputs.sources import Shard
from grpo_cli.run.reward_columns import numbers_from_text
from grpo_cli.run.rewards import RewardBatch, _concat_valid, _weighted_sum

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


# --------------------------------------------------------------------------- the reader, value by value

PARQUET = Shard(Path("r.parquet"), "r.parquet", "parquet", 0)


def _reader(batch, specs, shard=PARQUET, **options):
    from grpo_cli.options.advantage import RewardSpec
    from grpo_cli.run.reward_columns import RewardReader

    specs = [s if isinstance(s, RewardSpec) else RewardSpec(*s) for s in specs]
    return RewardReader(specs, batch.schema, shard, per_column=options.pop("per_column", False), **options)


def test_weighted_float32_columns_are_summed_in_float64():
    batch = pa.record_batch(
        {"a": pa.array([0.1, 0.7], pa.float32()), "b": pa.array([0.2, 0.1], pa.float32())}
    )
    got = _reader(batch, [("a", 1.0), ("b", 1.0)]).read(batch).combined
    a = torch.tensor([0.1, 0.7], dtype=torch.float32).to(torch.float64)
    b = torch.tensor([0.2, 0.1], dtype=torch.float32).to(torch.float64)
    assert got.dtype == torch.float64 and got.tolist() == (a + b).tolist()
    channels = _reader(batch, [("a", 1.0), ("b", 1.0)], per_column=True).read(batch).channels
    assert [c.dtype for c in channels] == [torch.float64, torch.float64]


@pytest.mark.parametrize("weight", [0.5, 2.0])
def test_a_single_weighted_column_is_weighted(weight):
    batch = pa.record_batch({"a": pa.array([1.0, 0.25], pa.float32())})
    assert _reader(batch, [("a", weight)]).read(batch).combined.tolist() == [weight, weight * 0.25]
    assert _reader(batch, [("a", 1.0)]).read(batch).combined.dtype == torch.float32  # kept as it is


def test_nansum_of_one_column_is_trls_down_to_the_sign_of_zero():
    """TRL's line (trl/trainer/grpo_trainer.py, _generate_and_score_completions):
    ``rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)``.
    With one reward function it still adds to +0.0: a -0.0 reward comes out +0.0, which decides
    the sign of a zero advantage where the group's mean is 0."""
    values = [-0.0, 0.5, float("nan"), -1.0]
    batch = pa.record_batch({"a": pa.array(values, pa.float32())})
    got = _reader(batch, [("a", 1.0)], reward_sum="nansum").read(batch).combined
    rewards_per_func = torch.tensor(values, dtype=torch.float32).unsqueeze(1)
    trl = (rewards_per_func * torch.tensor([1.0]).unsqueeze(0)).nansum(dim=1)
    trl[torch.isnan(rewards_per_func).all(dim=1)] = float("nan")  # every function None: left out
    assert torch.equal(torch.signbit(got), torch.signbit(trl.to(torch.float64)))
    assert torch.equal(got.isnan(), trl.isnan())
    assert got[~got.isnan()].tolist() == trl[~trl.isnan()].tolist()
    plain = _reader(batch, [("a", 1.0)]).read(batch).combined
    assert torch.signbit(plain[0])  # the plain sum keeps the reward as it is


def test_the_reader_refuses_a_text_reward_outside_csv_naming_it():
    batch = pa.record_batch({"a": pa.array(["1", "0"])})
    with pytest.raises(
        GrpoError, match=r"^r.parquet: reward column 'a' has type string; it must be numeric$"
    ):
        _reader(batch, [("a", 1.0)])
    reader = _reader(pa.record_batch({"r": pa.array([1.0])}), [("r", 1.0)])
    with pytest.raises(GrpoError, match=r"^r.parquet: column 'a' has type string; it must be numeric$"):
        reader.column(batch, "a")


def test_errors_name_the_row_in_the_shard_by_default_and_with_an_offset():
    batch = pa.record_batch({"r": pa.array(["x", "1"]), "n": pa.array(["1", "y"])})
    reader = _reader(batch, [("r", 1.0)], shard=CSV)
    with pytest.raises(GrpoError, match=r"^r.csv, row 0: column 'r' holds 'x'"):
        reader.read(batch)
    with pytest.raises(GrpoError, match=r"^r.csv, row 10: column 'r' holds 'x'"):
        reader.read(batch, 10)
    with pytest.raises(GrpoError, match=r"^r.csv, row 1: column 'n' holds 'y'"):
        reader.lengths(batch, "n")
    with pytest.raises(GrpoError, match=r"^r.csv, row 11: column 'n' holds 'y'"):
        reader.lengths(batch, "n", 10)
    with pytest.raises(GrpoError, match=r"^r.csv, row 0: column 'r' holds 'x'"):
        numbers_from_text(batch.column(0), "r", CSV)
    with pytest.raises(GrpoError, match=r"^r.csv, row 1: column 'n' holds 'y'"):
        reader.column(batch, "n")


def test_lengths_may_be_zero_but_not_negative():
    batch = pa.record_batch({"r": pa.array([1.0, 0.0]), "n": pa.array([0, 7])})
    reader = _reader(batch, [("r", 1.0)])
    assert reader.lengths(batch, "n").tolist() == [0.0, 7.0]
    bad = pa.record_batch({"r": pa.array([1.0, 0.0]), "n": pa.array([3, -1])})
    with pytest.raises(
        GrpoError, match=r"^r.parquet, row 1: --length-col 'n' is -1.0; lengths must be finite"
    ):
        reader.lengths(bad, "n")


@pytest.mark.parametrize(
    ("value", "refused"), [(-5, False), (-(2**53), False), (-(2**53) - 1, True), (2**53 + 1, True)]
)
def test_int64_rewards_within_2_53_either_side_are_kept(value, refused):
    batch = pa.record_batch({"r": pa.array([value, 0], pa.int64())})
    reader = _reader(batch, [("r", 1.0)])
    if refused:
        with pytest.raises(GrpoError, match=r"is an integer beyond 2\*\*53"):
            reader.read(batch)
    else:
        assert reader.read(batch).combined.tolist() == [float(value), 0.0]


def test_advantage_dtype_of_one_float_column_is_its_width_and_of_several_the_widest():
    from grpo_cli.run.reward_columns import advantage_dtype

    assert advantage_dtype([pa.float16()]) == torch.float16
    assert advantage_dtype([pa.float32()]) == torch.float32
    assert advantage_dtype([pa.float32(), pa.float64()]) == torch.float64
    assert advantage_dtype([pa.float16(), pa.float16()]) == torch.float32


def test_combined_advantages_weigh_channels_but_not_a_single_combined_reward():
    from grpo_cli.kernel import group_stats, prepare_normalization
    from grpo_cli.run.rewards import combined_advantages

    r = torch.tensor([1.0, 0.0, 3.0, 1.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1])
    norm = prepare_normalization(group_stats(r, ids), epsilon=1e-6, scale="none")
    one = RewardBatch([r], [None], r, None)
    active = torch.ones(2, dtype=torch.bool)
    single = combined_advantages(one, ids, [norm], active, weights=[0.5, 0.5], device=torch.device("cpu"))
    assert single.tolist() == [0.5, -0.5, 1.0, -1.0]  # one channel: the weights are in the reward
    two = RewardBatch([r, r], [None, None], r, None)
    both = combined_advantages(two, ids, [norm, norm], active, weights=[1.0, 0.5], device=torch.device("cpu"))
    assert both.tolist() == [0.75, -0.75, 1.5, -1.5]


@pytest.mark.parametrize(
    "options",
    [
        ["-r", "accuracy", "-r", "format:0.5", "--nan", "ignore"],
        ["-r", "accuracy", "-r", "format:0.5", "--preset", "trl"],
        ["-r", "accuracy", "-r", "format", "--reward-aggregation", "normalize-then-sum", "--nan", "ignore"],
        ["-r", "count"],
    ],
    ids=["weighted", "trl-nansum", "per-column", "integer"],
)
def test_rewards_read_in_small_batches_give_the_one_batch_bits(cli, tmp_path, options):
    """Every reward path that is not a float column read as it is (several columns, weights,
    TRL's nansum, integers) joins its batches; batches of 3 rows give one batch's bits."""
    import pyarrow.parquet as pq

    n = 48
    table = pa.table(
        {
            "group_id": [i // 6 for i in range(n)],
            "accuracy": pa.array([float(i % 3 == 0) if i % 7 else None for i in range(n)], pa.float32()),
            "format": [0.25 * (i % 4) for i in range(n)],
            "count": pa.array([i % 5 for i in range(n)], pa.int32()),
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    outputs = []
    for batches in ([], ["--batch-rows", "3"]):
        out = tmp_path / f"out{len(batches)}.parquet"
        result = cli("compute", tmp_path / "in.parquet", "-o", out, *options, *batches)
        assert result.exit_code == 0, result.stderr
        outputs.append(pq.read_table(out))
    assert outputs[0].equals(outputs[1])
    assert outputs[0].num_rows == n


def test_an_int64_reward_beyond_2_53_is_named_on_its_row():
    batch = pa.record_batch({"r": pa.array([1, 2, 2**53 + 1, 2**60, 3], pa.int64())})
    reader = _reader(batch, [("r", 1.0)])
    for first_row, row in ((0, 2), (40, 42)):
        with pytest.raises(GrpoError) as caught:
            reader.read(batch, first_row)
        assert caught.value.message == (
            f"r.parquet, row {row}: reward 9007199254740993 in column 'r' is an integer beyond 2**53, "
            "which float64 cannot hold exactly"
        )


def test_float64_rewards_beyond_2_53_are_read_as_they_are():
    """The 2**53 limit is for integers, which a float64 would round; a float is already one."""
    values = [1e20, -3.5e300, 2.0**53 + 2, 0.5]
    batch = pa.record_batch({"r": pa.array(values, pa.float64()), "w": pa.array(values, pa.float64())})
    assert _reader(batch, [("r", 1.0)]).read(batch).combined.tolist() == values
    assert _reader(batch, [("r", 1.0), ("w", 0.0)]).read(batch).combined.tolist() == values


def test_decimal_rewards_are_the_doubles_their_text_names():
    """Through text, which rounds correctly (Arrow's decimal-to-double division is one ulp off
    for about half of all values)."""
    from decimal import Decimal

    texts = ["0.1", "0.7", "-2.675", "123456.789", "0"]
    for data_type in (pa.decimal128(12, 3), pa.decimal256(40, 3)):
        batch = pa.record_batch({"r": pa.array([Decimal(t) for t in texts] + [None], data_type)})
        got = _reader(batch, [("r", 1.0)]).read(batch).combined
        assert got.dtype == torch.float64
        assert got[:-1].tolist() == [float(t) for t in texts] and math.isnan(got[-1])


@pytest.mark.parametrize(
    "array",
    [pa.array([1, None, 0], pa.int32()), pa.array([True, None, False]), pa.array([1, None, 0], pa.uint8())],
    ids=["int32", "bool", "uint8"],
)
def test_integer_and_boolean_rewards_with_a_null_read_as_floats_with_nan(array):
    batch = pa.record_batch({"r": array})
    got = _reader(batch, [("r", 1.0)]).read(batch).combined
    assert got.dtype == torch.float64
    assert got[0] == 1.0 and math.isnan(got[1]) and got[2] == 0.0
