"""The verifier's pieces against their documented arithmetic, value by value.

The CLI tests (test_check.py) show what a user sees; these pin the bounds and bit counts
that decide residue from mismatch, so that no constant in them can drift unnoticed.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from grpo_cli.errors import GrpoError
from grpo_cli.inputs.sources import Shard
from grpo_cli.kernel import group_stats
from grpo_cli.options.advantage import AdvantageOptions
from grpo_cli.options.config import VerifySpec
from grpo_cli.results.verify import Verifier, _bit_length, _group_divisor, _significand_bits, _ulp32

U = 2.0**-24
SHARD = Shard(Path("x.parquet"), "x.parquet", "parquet", 0)


def stats_of(groups: list[list[float]]):
    rewards = torch.tensor([r for g in groups for r in g], dtype=torch.float64)
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    return rewards, ids, group_stats(rewards, ids, count_extremes=True)


def test_bit_length_of_counts():
    counts = torch.tensor([0, 1, 2, 3, 4, 7, 8, 1 << 20, (1 << 20) + 1])
    bits = _bit_length(counts)
    assert bits.tolist() == [0, 1, 2, 2, 3, 3, 4, 21, 21]
    assert bits.dtype == torch.int64


def test_significand_bits_of_values_rounded_to_float32():
    values = torch.tensor(
        [0.0, 1.0, 0.75, 0.1, -0.5, 3.0, 2.0**-10, 1 + 2.0**-23, 1 + 2.0**-30, math.inf, math.nan, 5.0, 7.0],
        dtype=torch.float64,
    )
    bits = _significand_bits(values)
    # 1 + 2**-30 rounds to 1.0 in float32; infinities and NaN count as 0
    assert bits.tolist() == [0, 1, 2, 24, 1, 2, 1, 24, 1, 0, 0, 3, 3]
    assert bits.dtype == torch.int64


def test_ulp32():
    values = torch.tensor([1.0, 1.5, 2.0, 0.75, 0.0, 1e-45], dtype=torch.float64)
    assert _ulp32(values).tolist() == [2.0**-23, 2.0**-23, 2.0**-22, 2.0**-24, 2.0**-149, 2.0**-149]
    assert _ulp32(values).dtype == torch.float64


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"scale": "none"}, [1.0, 1.0, 1.0]),
        ({"std": "population", "epsilon": 1e-3}, [1.0 + 1e-3, 0.0 + 1e-3, 0.0 + 1e-3]),
        ({"std": "sample", "epsilon": 1e-3}, [math.sqrt(2.0) + 1e-3, 1e-3, 1e-3]),
        ({"std": "sample", "epsilon": 0.5, "epsilon_mode": "clamp"}, [math.sqrt(2.0), 0.5, 0.5]),
    ],
)
def test_group_divisor(options, expected):
    _, _, stats = stats_of([[1.0, 3.0], [2.0, 2.0], [5.0]])
    divisor = _group_divisor(stats, AdvantageOptions.resolve(**options))
    assert divisor.dtype == torch.float64
    assert divisor.tolist() == pytest.approx(expected, rel=1e-15, abs=0)


def _verifier(groups, **options):
    rewards, ids, stats = stats_of(groups)
    verifier = Verifier(VerifySpec("a", atol=0.0, rtol=0.0), stats, AdvantageOptions.resolve(**options), None)
    return verifier, rewards, ids, None


def _bound(verifier, rewards, ids, expected):
    return verifier._trainer_rounding(rewards, ids, expected).tolist()


def test_trainer_rounding_of_a_two_pass_std_is_its_documented_bound():
    groups = [[0.0, 1.0, 1.0, 0.0], [0.25, 0.75, 0.5], [2.0]]
    verifier, rewards, ids, _ = _verifier(groups, preset="verl")
    expected = torch.tensor([-0.8660, 0.8660, 0.8660, -0.8660, -1.0, 1.0, 0.0, 2.0], dtype=torch.float64)
    got = _bound(verifier, rewards, ids, expected)
    want = []
    for row, (r, g) in enumerate(zip(rewards.tolist(), ids.tolist(), strict=True)):
        group = groups[g]
        n, m = len(group), max(abs(v) for v in group)
        size = abs(float(expected[row]))
        if n == 1:
            want.append(8 * U * size)
            continue
        mean = sum(group) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in group) / (n - 1))
        divisor = abs(r - mean) / size if size > 0 and r != mean else std + 1e-6
        want.append(8 * ((n + 2) * U * m / divisor + size * ((n + 3) * U + 2 * U)))
    assert got == pytest.approx(want, rel=1e-12, abs=0)


def test_trainer_rounding_of_nemo_rls_leave_one_out_std_is_its_documented_bound():
    groups = [[0.0, 1.0, 1.0, 0.5, 0.25]]
    verifier, rewards, ids, _ = _verifier(groups, preset="nemo-rl")
    expected = torch.tensor([-1.2, 0.9, 0.9, -0.1, -0.6], dtype=torch.float64)
    got = _bound(verifier, rewards, ids, expected)
    group = groups[0]
    n, m, mean = len(group), 1.0, sum(group) / len(group)
    want = []
    for r, e in zip(group, expected.tolist(), strict=True):
        centred = (r - mean) * n / (n - 1)
        divisor = abs(centred) / abs(e)
        deviation = divisor - 1e-6
        relative = 3 * (n - 1 + 3) * U * m**2 / (2 * deviation**2)
        want.append(8 * ((n - 1 + 2) * U * m / divisor + abs(e) * (relative + 2 * U)))
    assert got == pytest.approx(want, rel=1e-12, abs=0)


def test_trainer_rounding_without_a_division_has_no_std_term():
    groups = [[0.0, 1.0, 3.0]]
    verifier, rewards, ids, _ = _verifier(groups, preset="verl", scale="none")
    expected = rewards - rewards.mean()
    got = _bound(verifier, rewards, ids, expected)
    want = [8 * (5 * U * 3.0 / 1.0 + abs(float(e)) * 2 * U) for e in expected]
    assert got == pytest.approx(want, rel=1e-12, abs=0)


def test_trainer_rounding_is_finite_and_zero_where_undefined():
    groups = [[1.0, 2.0]]
    verifier, rewards, ids, _ = _verifier(groups, preset="verl")
    expected = torch.tensor([math.nan, math.inf], dtype=torch.float64)
    assert _bound(verifier, rewards, ids, expected) == [0.0, 0.0]


def _compare(verifier, given, expected, rewards, ids, shard=SHARD, row=0):
    verifier.compare(
        pa.array(given, pa.float32()), torch.tensor(expected, dtype=torch.float64), rewards, ids, shard, row
    )


def test_the_float32_rounding_applies_with_a_preset_or_a_float32_column_only():
    groups = [[0.0, 1.0, 1.0, 0.0]]
    exact = [-0.8660254037844386, 0.8660254037844386, 0.8660254037844386, -0.8660254037844386]
    nudged = [v + 4e-7 for v in exact]
    rewards, ids, stats = stats_of(groups)
    for options, column, differs in (
        ({"preset": "verl"}, pa.float64(), 0),
        ({"std": "sample"}, pa.float32(), 0),
        ({"std": "sample"}, pa.float64(), 4),
    ):
        verifier = Verifier(
            VerifySpec("a", atol=0.0, rtol=0.0), stats, AdvantageOptions.resolve(**options), None
        )
        verifier.compare(
            pa.array(nudged, column), torch.tensor(exact, dtype=torch.float64), rewards, ids, SHARD, 0
        )
        assert verifier.mismatched + verifier.residue == differs, (options, column)
        assert verifier.result()["trainer_rounding"] is (differs == 0)


def test_compare_counts_the_largest_difference_and_an_infinite_one():
    verifier, rewards, ids, _ = _verifier([[0.0, 1.0], [2.0, 5.0]])
    _compare(verifier, [-1.0, 1.5, -1.0, 1.0], [-1.0, 1.0, -1.0, 1.0], rewards, ids)
    assert verifier.max_abs_diff == 0.5 and verifier.compared == 4 and verifier.mismatched == 1
    _compare(verifier, [math.inf, 1.0, -1.0, math.nan], [-1.0, 1.0, -1.0, 1.0], rewards, ids, row=4)
    assert verifier.max_abs_diff == math.inf and verifier.compared == 8 and verifier.mismatched == 3
    result = verifier.result()
    assert [(e["file"], e["row"], e["group"]) for e in result["examples"]] == [
        ("x.parquet", 1, 0),
        ("x.parquet", 4, 0),
        ("x.parquet", 7, 1),
    ]
    assert result["examples"][0] == {
        "file": "x.parquet",
        "row": 1,
        "group": 0,
        "expected": 1.0,
        "actual": 1.5,
    }


def test_compare_refuses_a_column_that_is_not_numeric():
    verifier, rewards, ids, _ = _verifier([[0.0, 1.0]])
    with pytest.raises(
        GrpoError, match=r"^x.parquet: column 'a' has type string; it must be numeric to verify$"
    ):
        verifier.compare(pa.array(["a", "b"]), torch.zeros(2, dtype=torch.float64), rewards, ids, SHARD, 0)


def test_examples_are_the_first_rows_in_row_order_up_to_the_limit():
    groups = [[1.0] * 4, [0.0, 1.0], [1.0] * 4, [0.0, 1.0], [1.0] * 4]
    rewards, ids, stats = stats_of(groups)
    spec = VerifySpec("a", atol=0.0, rtol=0.0, max_examples=2)
    verifier = Verifier(spec, stats, AdvantageOptions(), None)
    given = [0.5, 0, 0, 0, 9.0, -1.0, 0.5, 0, 0, 0, 9.0, -1.0, 0.5, 0, 0, 0]
    expected = [0.0] * 4 + [1.0, -1.0] + [0.0] * 4 + [1.0, -1.0] + [0.0] * 4
    _compare(verifier, given, expected, rewards, ids)
    result = verifier.result()
    assert result["mismatched"] == 5  # three constant groups (one example each) and two active rows
    assert [(e["row"], e["group"]) for e in result["examples"]] == [(0, 0), (4, 1)]


def test_a_constant_group_is_residue_only_within_its_bound_and_one_value():
    groups = [[0.1] * 8]
    rewards, ids, stats = stats_of(groups)
    n, m = 8, 0.1
    bound = 8 * (n + 2) * float(_ulp32(torch.tensor([m], dtype=torch.float64))[0]) / 1e-6
    for value, residue in ((bound * 0.999, 8), (bound * 1.001, 0), (-bound * 0.999, 8)):
        verifier = Verifier(VerifySpec("a"), stats, AdvantageOptions.resolve(preset="verl"), None)
        _compare(verifier, [value] * 8, [0.0] * 8, rewards, ids)
        result = verifier.result()
        assert (result["residue"], result["mismatched"]) == (residue, 8 - residue), value
    exact = VerifySpec("a", atol=0.0, rtol=0.0)
    for value, residue in ((bound * 1e-6 * 0.999, 8), (bound * 1e-6 * 1.001, 0)):
        # no division: 1, not eps, is the floor
        verifier = Verifier(exact, stats, AdvantageOptions.resolve(preset="verl", scale="none"), None)
        _compare(verifier, [value] * 8, [0.0] * 8, rewards, ids)
        assert verifier.result()["residue"] == residue
    verifier = Verifier(VerifySpec("a"), stats, AdvantageOptions.resolve(preset="verl"), None)
    _compare(verifier, [1e-3] * 7 + [math.nan], [0.0] * 8, rewards, ids)
    assert verifier.result()["mismatched"] == 8  # a NaN breaks the one value


def test_a_lone_leave_one_out_row_is_residue_only_with_the_sign_and_within_size_over_eps():
    groups = [[0.9, 0.9, 0.9, 1.0]]
    rewards, ids, stats = stats_of(groups)
    exact = [-0.0333, -0.0333, -0.0333, 0.1]
    for value, residue in ((235.9, 1), (0.1 / 1e-6 * 0.999, 1), (0.1 / 1e-6 * 1.01, 0), (-235.9, 0)):
        verifier = Verifier(VerifySpec("a"), stats, AdvantageOptions.resolve(preset="nemo-rl"), None)
        _compare(verifier, [*exact[:3], value], exact, rewards, ids)
        assert verifier.result()["residue"] == residue, value


def test_examples_stay_within_the_limit_over_many_batches():
    """Each batch added up to the limit: a long input with many mismatches kept them all."""
    verifier, rewards, ids, _ = _verifier([[0.0, 1.0]])
    for batch in range(10):
        _compare(verifier, [5.0, 5.0], [-1.0, 1.0], rewards, ids, row=2 * batch)
    result = verifier.result()
    assert result["mismatched"] == 20
    assert [e["row"] for e in result["examples"]] == [0, 1, 2, 3, 4]


def test_a_csv_column_to_verify_is_parsed_from_its_text():
    verifier, rewards, ids, _ = _verifier([[0.0, 1.0]])
    csv = Shard(Path("nowhere/x.csv"), "x.csv", "csv", 0)
    verifier.compare(
        pa.array(["-1", "1.5"]), torch.tensor([-1.0, 1.0], dtype=torch.float64), rewards, ids, csv, 3
    )
    assert (verifier.compared, verifier.mismatched, verifier.max_abs_diff) == (2, 1, 0.5)
    with pytest.raises(GrpoError, match=r"^x.csv, row 4: column 'a' holds 'x', which is not a number$"):
        verifier.compare(pa.array(["1", "x"]), torch.zeros(2, dtype=torch.float64), rewards, ids, csv, 3)
    with pytest.raises(GrpoError, match="has type string; it must be numeric"):
        verifier.compare(pa.array(["1", "2"]), torch.zeros(2, dtype=torch.float64), rewards, ids, SHARD, 0)


def test_a_null_given_value_is_a_mismatch():
    verifier, rewards, ids, _ = _verifier([[0.0, 1.0]])
    verifier.compare(
        pa.array([None, 1.0], pa.float64()),
        torch.tensor([-1.0, 1.0], dtype=torch.float64),
        rewards,
        ids,
        SHARD,
        0,
    )
    assert verifier.mismatched == 1 and verifier.max_abs_diff == math.inf


def test_float16_columns_get_float16s_rounding_and_float64_columns_none():
    groups = [[0.0, 1.0, 1.0, 0.0]]
    rewards, ids, stats = stats_of(groups)
    exact = torch.tensor([-1.0, 1.0, 1.0, -1.0], dtype=torch.float64)
    for column, nudge, differs in ((pa.float16(), 1e-3, 0), (pa.float32(), 1e-3, 4), (pa.float64(), 1e-7, 4)):
        spec = VerifySpec("a", atol=0.0, rtol=0.0)
        verifier = Verifier(spec, stats, AdvantageOptions.resolve(std="population"), None)
        given = pa.array((exact + nudge).tolist(), pa.float64()).cast(column, safe=False)
        verifier.compare(given, exact, rewards, ids, SHARD, 0)
        assert verifier.mismatched == differs, column


def test_examples_name_each_shard_and_its_own_rows():
    verifier, rewards, ids, _ = _verifier([[0.0, 1.0]])
    other = Shard(Path("y.parquet"), "y.parquet", "parquet", 0)
    for shard, start in ((SHARD, 0), (SHARD, 2), (other, 0), (other, 2)):
        _compare(verifier, [5.0, 1.0], [-1.0, 1.0], rewards, ids, shard=shard, row=start)
    assert [(e["file"], e["row"]) for e in verifier.result()["examples"]] == [
        ("x.parquet", 0),
        ("x.parquet", 2),
        ("y.parquet", 0),
        ("y.parquet", 2),
    ]


@pytest.mark.parametrize(
    ("group", "row", "given", "residue"),
    [
        ([0.9, 0.9, 0.9, 1.0], 3, 235.9, 1),  # the lone maximum
        ([0.1, 0.6, 0.6, 0.6], 0, -235.9, 1),  # the lone minimum
        ([0.6, 0.6, 0.1], 2, -235.9, 1),  # two others: enough
        ([0.6, 0.1], 1, -235.9, 0),  # one other: its std is undefined, not a residue
        ([0.9, 0.9, 0.9, 1.0, 1.0], 3, 235.9, 0),  # two at the maximum: no lone row
        ([0.5, 0.5, 0.5, 1.0], 3, 235.9, 0),  # the others' squares are exact
    ],
)
def test_the_lone_row_rule_of_leave_one_out(group, row, given, residue):
    rewards, ids, stats = stats_of([group])
    options = AdvantageOptions.resolve(preset="nemo-rl")
    exact = torch.tensor([float(v) for v in torch.zeros(len(group))], dtype=torch.float64)
    others = [v for i, v in enumerate(group) if i != row]
    exact[row] = group[row] - sum(others) / len(others)
    values = exact.tolist()
    values[row] = given
    verifier = Verifier(VerifySpec("a", atol=0.0, rtol=0.0), stats, options, None)
    verifier.compare(pa.array(values, pa.float64()), exact, rewards, ids, SHARD, 0)
    assert verifier.residue == residue and verifier.mismatched == 1 - residue


def test_the_lone_row_bound_is_size_over_eps_within_2_to_the_minus_10():
    group = [0.9, 0.9, 0.9, 1.0]
    rewards, ids, stats = stats_of([group])
    exact = torch.tensor([0.0, 0.0, 0.0, 1.0 - 0.9], dtype=torch.float64)
    limit = float(exact[3]) / 1e-6 * (1 + 2.0**-10)
    for given, residue in ((limit * (1 - 2.0**-20), 1), (limit * (1 + 2.0**-20), 0)):
        verifier = Verifier(
            VerifySpec("a", atol=0.0, rtol=0.0), stats, AdvantageOptions.resolve(preset="nemo-rl"), None
        )
        verifier.compare(pa.array([0.0, 0.0, 0.0, given], pa.float64()), exact, rewards, ids, SHARD, 0)
        assert verifier.residue == residue, given


def test_an_offset_groups_residue_bound_is_inclusive():
    group = [1e6, 1e6 + 0.0625]
    rewards, ids, stats = stats_of([group])
    verifier = Verifier(
        VerifySpec("a", atol=0.0, rtol=0.0), stats, AdvantageOptions.resolve(preset="verl"), None
    )
    bound = float(verifier._residue_bound[0])
    exact = torch.tensor([-0.7071, 0.7071], dtype=torch.float64)
    verifier.compare(
        pa.array([-0.7071 + bound, 0.7071 + bound * 1.001], pa.float64()), exact, rewards, ids, SHARD, 0
    )
    assert (verifier.residue, verifier.mismatched) == (1, 1)


def _documented_bound(verifier, groups, expected, options):
    """The bound ``Verifier._trainer_rounding`` documents, row by row in float64 Python."""
    leave_one_out = options.baseline == "leave-one-out"
    divisors = verifier._divisor.tolist()
    out, row = [], 0
    for g, group in enumerate(groups):
        n, m, mean = len(group), max(abs(v) for v in group), sum(group) / len(group)
        terms = n - 1 if leave_one_out else n
        for r in group:
            size = abs(expected[row])
            row += 1
            if n <= 1:
                out.append(8 * U * size)
                continue
            centred = (r - mean) * (n / max(n - 1, 1) if leave_one_out else 1)
            divisor = divisors[g]
            if options.scale != "none" and size > 0 and centred != 0:
                divisor = abs(centred) / size
            deviation = max(divisor - options.epsilon, 0.0) if options.scale != "none" else divisor
            if options.scale == "none":
                relative = 0.0
            elif options.epsilon_mode == "add-if-nonzero" or leave_one_out:
                relative = 3 * (terms + 3) * U * m**2 / (2 * deviation**2)
            else:
                relative = (terms + 3) * U
            out.append(8 * ((terms + 2) * U * m / divisor + size * (relative + 2 * U)))
    return out


@pytest.mark.parametrize(
    ("options", "groups"),
    [
        ({"preset": "verl"}, [[0.0, 1.0], [0.0, 1.0, 2.0]]),  # two rows; a row on the mean
        ({"preset": "nemo-rl"}, [[0.0, 1.0], [1000.0, 1001.0, 1003.0]]),  # leave-one-out of two; large |r|
        ({"preset": "nemo-rl", "scale": "none"}, [[0.0, 1.0, 4.0]]),
        ({"std": "population", "epsilon_mode": "add-if-nonzero"}, [[300.0, 301.0, 302.5, 300.0]]),
        ({"preset": "verl", "scale": "none"}, [[0.0, 1.0, 4.0], [2.0, 2.5]]),
    ],
)
def test_trainer_rounding_is_its_documented_bound_on_every_branch(options, groups):
    resolved = AdvantageOptions.resolve(**options)
    verifier, rewards, ids, _ = _verifier(groups, **options)
    from grpo_cli.api import group_advantages

    expected = torch.cat(
        [group_advantages(torch.tensor([g], dtype=torch.float64), **options)["advantages"][0] for g in groups]
    )
    got = _bound(verifier, rewards, ids, expected)
    assert got == pytest.approx(
        _documented_bound(verifier, groups, expected.tolist(), resolved), rel=1e-12, abs=0
    )
    assert all(b > 0 for b in got)


def test_residue_adds_up_over_batches_and_over_constant_groups():
    """Each batch's residue and the constant groups' were assigned, not added, in a mutant."""
    groups = [[0.9, 0.9, 0.9, 1.0], [0.9, 0.9, 0.9, 1.0], [0.1] * 8]
    rewards, ids, stats = stats_of(groups)
    lone = [-0.0333, -0.0333, -0.0333, 0.1]
    exact = lone * 2 + [0.0] * 8
    given = [*lone[:3], 235.9, *lone[:3], 235.9] + [1e-3] * 8  # two lone-row residues, eight constant
    verifier = Verifier(VerifySpec("a"), stats, AdvantageOptions.resolve(preset="nemo-rl"), None)
    for start in (0, 4, 8, 12):  # four batches of four rows
        chunk = slice(start, start + 4)
        _compare(verifier, given[chunk], exact[chunk], rewards[chunk], ids[chunk], row=start)
    assert verifier.passed  # settles the constant group
    first = verifier.result()
    assert (first["residue"], first["mismatched"]) == (10, 0)
    assert verifier.result() == first  # settling twice counts nothing twice


def test_a_constant_groups_example_is_its_first_differing_row_across_batches():
    groups = [[0.5] * 6]
    rewards, ids, stats = stats_of(groups)
    spec = VerifySpec("a", atol=0.0, rtol=0.0)
    verifier = Verifier(spec, stats, AdvantageOptions.resolve(std="sample"), None)
    given = [0.25, 0.0, 0.0, 0.0, 0.75, 0.0]  # differing rows 0 and 4, in different batches
    for start in (0, 3):
        _compare(verifier, given[start : start + 3], [0.0] * 3, rewards[:3], ids[:3], row=start)
    result = verifier.result()
    assert result["mismatched"] == 2
    assert [(e["row"], e["actual"]) for e in result["examples"]] == [(0, 0.25)]
    verifier = Verifier(spec, stats, AdvantageOptions.resolve(std="sample"), None)
    given = [0.0, 0.0, 0.0, 0.0, 0.75, 0.5]  # the first differing row is in the second batch
    for start in (0, 3):
        _compare(verifier, given[start : start + 3], [0.0] * 3, rewards[:3], ids[:3], row=start)
    assert [(e["row"], e["actual"]) for e in verifier.result()["examples"]] == [(4, 0.75)]


def test_a_whitened_constant_group_is_residue_around_its_own_nonzero_value():
    """Whitening gives a constant group a non-zero advantage: the residue is measured from it."""
    groups = [[0.1] * 8]
    rewards, ids, stats = stats_of(groups)
    options = AdvantageOptions.resolve(preset="verl", whiten="unbiased")
    verifier = Verifier(VerifySpec("a"), stats, options, None, batch_transform=True)
    expected = [-0.75] * 8
    _compare(verifier, [-0.75 + 1e-3] * 8, expected, rewards, ids)
    result = verifier.result()
    assert (result["residue"], result["mismatched"]) == (8, 0)


def test_an_offset_rule_applies_to_offset_groups_only():
    """An active group whose offset swallows nothing is held to the float32 rounding bound."""
    groups = [[0.0, 1.0, 1.0, 0.0]]
    rewards, ids, stats = stats_of(groups)
    verifier = Verifier(
        VerifySpec("a", atol=0.0, rtol=0.0), stats, AdvantageOptions.resolve(preset="verl"), None
    )
    exact = [-0.8660254037844386, 0.8660254037844386, 0.8660254037844386, -0.8660254037844386]
    _compare(verifier, [v + 4e-7 for v in exact], exact, rewards, ids)
    assert (verifier.mismatched, verifier.residue) == (0, 0)


def test_float16_rounding_is_float16s_unit_roundoff():
    groups = [[0.0, 1.0, 1.0, 0.0]]
    rewards, ids, stats = stats_of(groups)
    exact = torch.tensor([-1.0, 1.0, 1.0, -1.0], dtype=torch.float64)
    spec = VerifySpec("a", atol=0.0, rtol=0.0)
    for nudge, differs in ((4.5e-2, 0), (2e-1, 4)):  # the bound is about 0.058
        verifier = Verifier(spec, stats, AdvantageOptions.resolve(std="population"), None)
        given = pa.array((exact + nudge).tolist(), pa.float64()).cast(pa.float16(), safe=False)
        verifier.compare(given, exact, rewards, ids, SHARD, 0)
        assert verifier.mismatched == differs, nudge


def test_a_constant_group_with_an_exact_mean_gets_no_rounding_allowance():
    """Its rows are held to the constant rule, not to the active groups' rounding bound."""
    rewards, ids, stats = stats_of([[0.5] * 4])
    verifier = Verifier(
        VerifySpec("a", atol=0.0, rtol=0.0), stats, AdvantageOptions.resolve(preset="verl"), None
    )
    _compare(verifier, [1e-9] * 4, [0.0] * 4, rewards, ids)
    assert (verifier.result()["mismatched"], verifier.residue) == (4, 0)


def test_a_one_rollout_groups_value_is_held_to_float32_rounding_not_to_the_offset_rule():
    """A singleton has no spread, so the offset rule (an offset that swallows the spread) took
    it: any value within 8 (n + 2) ulp / eps of verl's r / (1 + eps), 2.9 for r = 1, was residue."""
    rewards, ids, stats = stats_of([[0.0, 1.0], [1.0]])
    expected = [-0.7071063, 0.7071063, 1.0 / (1 + 1e-6)]
    for given, mismatched in ((1.5, 1), (expected[2] + 2.0**-23, 0)):
        verifier = Verifier(VerifySpec("a"), stats, AdvantageOptions.resolve(preset="verl"), None)
        _compare(verifier, [*expected[:2], given], expected, rewards, ids)
        result = verifier.result()
        assert (result["mismatched"], result["residue"]) == (mismatched, 0), given


def test_a_two_rollout_constant_group_takes_the_constant_rule():
    rewards, ids, stats = stats_of([[0.1, 0.1]])
    verifier = Verifier(VerifySpec("a"), stats, AdvantageOptions.resolve(preset="verl"), None)
    _compare(verifier, [1e-3, 1e-3], [0.0, 0.0], rewards, ids)
    assert verifier.result()["residue"] == 2


def test_a_mean_whose_bits_fit_exactly_in_float32_cannot_round():
    value = 1 + 2.0**-21  # 22 significand bits, plus 2 for a count of 2: 24, a float32's
    rewards, ids, stats = stats_of([[value, value]])
    verifier = Verifier(VerifySpec("a"), stats, AdvantageOptions.resolve(preset="verl"), None)
    _compare(verifier, [1e-3, 1e-3], [0.0, 0.0], rewards, ids)
    assert (verifier.result()["mismatched"], verifier.residue) == (2, 0)


def test_the_constant_rules_floor_is_eps_up_to_one():
    rewards, ids, stats = stats_of([[0.1] * 8])
    bound = 8 * 10 * float(_ulp32(torch.tensor([0.1], dtype=torch.float64))[0]) / 1.0
    for value, residue in ((bound * 0.99, 8), (bound * 1.01, 0)):
        options = AdvantageOptions.resolve(preset="verl", epsilon=1.5)
        verifier = Verifier(VerifySpec("a", atol=0.0, rtol=0.0), stats, options, None)
        _compare(verifier, [value] * 8, [0.0] * 8, rewards, ids)
        assert verifier.result()["residue"] == residue, value


def test_an_offset_that_swallows_the_spread_is_residue_within_its_bound_only():
    group = [1000.0, 1000.125]
    rewards, ids, stats = stats_of([group])
    std = 0.125 / math.sqrt(2)
    bound = 8 * 4 * float(_ulp32(torch.tensor([1000.125], dtype=torch.float64))[0]) / (std + 1e-6)
    exact = [-0.7071067811865476 * std / (std + 1e-6), 0.7071067811865476 * std / (std + 1e-6)]
    for factor, residue in ((0.99, 2), (1.05, 1)):  # row 0 is given in float32: residue too
        verifier = Verifier(
            VerifySpec("a", atol=0.0, rtol=0.0), stats, AdvantageOptions.resolve(preset="verl"), None
        )
        _compare(verifier, [exact[0], exact[1] + factor * bound], exact, rewards, ids)
        assert (verifier.residue, verifier.mismatched) == (residue, 2 - residue), factor


def test_example_group_keys_are_json_values():
    import datetime

    from grpo_cli.results.verify import _jsonable

    day = datetime.date(2026, 12, 1)
    assert _jsonable(("p", 3, 0.5, True, None)) == ["p", 3, 0.5, True, None]
    assert _jsonable(("p", ("q", 1))) == ["p", ["q", 1]]
    assert _jsonable(day) == "2026-12-01" and _jsonable(None) is None


@pytest.mark.parametrize(
    ("group", "row"), [([0.9, 0.9, 0.9, 1.0], 0), ([0.1, 0.6, 0.6, 0.6], 1), ([0.0, 0.0, 0.0, 0.1], 0)]
)
def test_only_the_lone_row_of_a_leave_one_out_group_takes_its_rule(group, row):
    """A row beside the lone one, changed to a same-signed value within size / eps, is a mismatch."""
    rewards, ids, stats = stats_of([group])
    n, total = len(group), sum(group)
    exact = [v - (total - v) / (n - 1) for v in group]
    given = list(exact)
    given[row] = exact[row] * 50
    verifier = Verifier(
        VerifySpec("a"), stats, AdvantageOptions.resolve(preset="nemo-rl", scale="none"), None
    )
    _compare(verifier, given, exact, rewards, ids)
    assert (verifier.mismatched, verifier.residue) == (1, 0)


@pytest.mark.parametrize(("bits", "residue"), [(11, 0), (12, 1)])
def test_identical_others_can_round_only_when_their_squares_need_more_than_24_bits(bits, residue):
    """Three others of ``bits`` significand bits: 2 * bits + 2 (three's bit length) against 24."""
    value = 1 + 2.0 ** (1 - bits)
    group = [value, value, value, 2.0]
    rewards, ids, stats = stats_of([group])
    mean_others = value
    exact = [value - (2.0 + 2 * value) / 3] * 3 + [2.0 - mean_others]
    given = [*exact[:3], exact[3] * 3]
    verifier = Verifier(
        VerifySpec("a"), stats, AdvantageOptions.resolve(preset="nemo-rl", scale="none"), None
    )
    _compare(verifier, given, exact, rewards, ids)
    assert (verifier.residue, verifier.mismatched) == (residue, 1 - residue)


def test_without_a_division_the_bound_keeps_the_groups_divisor_of_one():
    """No division (ReMax's r - baseline): the std-derived divisor does not apply."""
    rewards, ids, stats = stats_of([[0.0, 1.0]])
    options = AdvantageOptions.resolve(preset="verl", estimator="remax")
    expected = [0.0 - 0.1, 1.0 - 0.9]
    for nudge, mismatched in ((1.5e-6, 0), (4e-6, 1)):
        verifier = Verifier(VerifySpec("a", atol=0.0, rtol=0.0), stats, options, None)
        _compare(verifier, [expected[0], expected[1] + nudge], expected, rewards, ids)
        assert verifier.mismatched == mismatched, nudge


def test_after_a_batch_transform_the_bound_keeps_the_groups_divisor():
    """A whitened advantage is not centred / divisor: the derived divisor would loosen the bound."""
    rewards, ids, stats = stats_of([[0.0, 1.0]])
    options = AdvantageOptions.resolve(preset="verl", whiten="unbiased")
    expected = [-5.0, 5.0]
    verifier = Verifier(VerifySpec("a", atol=0.0, rtol=0.0), stats, options, None, batch_transform=True)
    _compare(verifier, [expected[0], expected[1] + 2.5e-5], expected, rewards, ids)
    assert verifier.mismatched == 1


def test_a_spread_above_1024_roundings_is_no_swallowed_offset():
    """[1024, 1024.75]: its spread is 1,536 times its float32 rounding, so the trainer-rounding
    bound (about 3.7e-3 here), not the offset rule's (7.4e-3), holds its rows."""
    group = [1024.0, 1024.75]
    rewards, ids, stats = stats_of([group])
    std = 0.75 / math.sqrt(2)
    exact = [-0.7071067811865476 * std / (std + 1e-6), 0.7071067811865476 * std / (std + 1e-6)]
    verifier = Verifier(
        VerifySpec("a", atol=0.0, rtol=0.0), stats, AdvantageOptions.resolve(preset="verl"), None
    )
    _compare(verifier, [exact[0], exact[1] + 5e-3], exact, rewards, ids)
    assert (verifier.mismatched, verifier.residue) == (1, 0)


def test_examples_name_the_group_by_its_key():
    from grpo_cli.arrow.keys import GroupKeyIndex

    keys = GroupKeyIndex(["prompt"])
    keys.encode([pa.chunked_array([pa.array(["p7", "p7", "p9", "p9"])])])
    rewards, ids, stats = stats_of([[0.0, 1.0], [2.0, 5.0]])
    verifier = Verifier(VerifySpec("a", atol=0.0, rtol=0.0), stats, AdvantageOptions(), keys)
    _compare(verifier, [-1.0, 1.0, 4.0, 1.0], [-1.0, 1.0, -1.0, 1.0], rewards, ids)
    assert [e["group"] for e in verifier.result()["examples"]] == ["p9"]


class _Names:
    def key_at(self, group_id: int) -> str:
        return f"key-{group_id}"


@pytest.mark.parametrize("cuts", [(4, 24), (3, 9, 22), (1, 5, 8, 13, 24), (8, 26)])
def test_verifiers_of_parts_merged_in_order_are_one_verifier_over_all_rows(cuts):
    """The Ray engine compares each part of the input with a verifier of its own (no keys) and
    merges what they saw: the result is one verifier's over every row, examples named by key."""
    groups = [[0.9, 0.9, 0.9, 1.0], [0.5] * 6, [0.1] * 8, [0.2, 0.7], [0.3] * 8]
    rewards, ids, stats = stats_of(groups)
    exact = [-0.0333, -0.0333, -0.0333, 0.1, *[0.0] * 14, -0.5, 0.5, *[0.0] * 8]
    # lone-row residue, a constant group off in two rows of two parts, a constant group of one
    # small value (residue), two plain mismatches, and a constant group whose parts each give
    # one value, the later part the smaller (mismatches: two values)
    given = [-0.0333, -0.0333, -0.0333, 235.9, 0.25, 0.0, 0.0, 0.0, 0.75, 0.0, *[1e-3] * 8, 0.5, 0.5]
    given += [2e-3] * 4 + [1e-3] * 4
    options = AdvantageOptions.resolve(preset="nemo-rl")
    spec = VerifySpec("a", max_examples=2)
    whole = Verifier(spec, stats, options, _Names())
    _compare(whole, given, exact, rewards, ids)
    merged = Verifier(spec, stats, options, _Names())
    bounds = [0, *cuts, len(given)]
    for start, stop in itertools.pairwise(bounds):
        part = Verifier(spec, stats, options, None, first_row=start)
        _compare(part, given[start:stop], exact[start:stop], rewards[start:stop], ids[start:stop], row=start)
        merged.merge(part.partial())
    assert merged.result() == whole.result()
    assert whole.result()["mismatched"] >= 11 and whole.result()["residue"] >= 9
