"""summary.py and report.py at their own level: figures from hand-made group statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli.cli.report import check_lines, render_compact, render_plain
from grpo_cli.inputs.sources import Shard
from grpo_cli.kernel import group_stats
from grpo_cli.options.config import ComputeConfig
from grpo_cli.results.findings import SIZE_COUNTS_SHOWN, TOP_INACTIVE_VALUES, GroupPart, findings_of
from grpo_cli.results.summary import RunSummary, build_summary, input_info
from grpo_cli.run.outcome import GroupOutcome
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.reward_counts import RewardCounts

# group 0 active (1, 3); group 1 constant 4; group 2 a singleton 7; group 3 constant 0
REWARDS = [1.0, 3.0, 4.0, 4.0, 7.0, 0.0, 0.0, 0.0]
IDS = [0, 0, 1, 1, 2, 3, 3, 3]


def outcome_of(rewards, ids, config: ComputeConfig | None = None) -> GroupOutcome:
    r = torch.tensor(rewards, dtype=torch.float64)
    g = torch.tensor(ids, dtype=torch.long)
    stats = group_stats(r, g)
    rows_per_group = np.bincount(np.asarray(ids, dtype=np.int64))
    plan = RunPlan(config or ComputeConfig())
    return plan.outcome([stats], stats, rows_per_group=rows_per_group, rows=len(rewards), nan_rewards=0)


def part_of(count, mean, m2, minimum, maximum, rows, *, active=None, key_at=None) -> GroupPart:
    """Groups given by their figures (an inactive group where ``active`` is left out)."""
    arrays = [np.asarray(a, dtype=np.float64) for a in (mean, m2)]
    count, rows = np.asarray(count, dtype=np.int64), np.asarray(rows, dtype=np.int64)
    return GroupPart(
        count=count,
        mean=arrays[0],
        m2=arrays[1],
        m2_scale=np.ones(count.size),
        minimum=np.asarray(minimum, dtype=np.float64),
        maximum=np.asarray(maximum, dtype=np.float64),
        active=np.zeros(count.size, bool) if active is None else np.asarray(active, bool),
        rows=rows,
        order=np.arange(count.size, dtype=np.int64),
        label_at=key_at,
        named=key_at is not None,
    )


def of_sizes(sizes, options, key_at=None):
    """The findings of groups of these sizes, each holding its rows' reward 1.0."""
    sizes = np.asarray(sizes)
    ones = np.ones(sizes.size)
    part = part_of(sizes, ones, np.zeros(sizes.size), ones, ones, sizes, key_at=key_at)
    return findings_of([part], options=options)


def summarize(outcome: GroupOutcome, **overrides) -> RunSummary:
    arguments = {
        "input": {"path": "x.parquet", "format": ["parquet"], "shards": 1, "bytes": 10, "bytes_decoded": 20},
        "output": None,
        "options": {},
        "advantage_range": (-1.0, 1.0),
        "mode": "in-memory",
        "device": "cpu",
        "elapsed": 0.5,
        "reward_counts": RewardCounts.empty(),
    }
    return build_summary(outcome, **{**arguments, **overrides})


def test_group_figures_match_a_direct_count():
    summary = summarize(outcome_of(REWARDS, IDS))
    assert (summary.rows, summary.groups, summary.active_groups, summary.inactive_groups) == (8, 4, 1, 3)
    assert summary.singleton_groups == 1
    assert summary.group_size == {"min": 1, "median": 2.0, "max": 3}
    values = np.array(REWARDS)
    assert summary.reward["mean"] == pytest.approx(values.mean(), rel=1e-15)
    assert summary.reward["std"] == pytest.approx(values.std(), rel=1e-12)
    assert (summary.reward["min"], summary.reward["max"]) == (0.0, 7.0)
    # the singleton is inactive but not a constant group of two or more
    assert summary.inactive_by_value == [{"value": 0.0, "groups": 1}, {"value": 4.0, "groups": 1}]
    assert summary.inactive_other_values == 0
    histogram = summary.group_mean_histogram
    assert sum(histogram["counts"]) == 4 and len(histogram["edges"]) == len(histogram["counts"]) + 1
    assert histogram["kind"] == "range" and histogram["edges"][0] == 0.0 and histogram["edges"][-1] == 7.0


@pytest.mark.parametrize(
    ("rewards", "ids", "kind", "counts"),
    [
        # binary, groups of 4: one bar per solve rate k/4, the empty ones included
        ([1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0], [0] * 4 + [1] * 4 + [2] * 4, "solve_rate", [1, 0, 1, 0, 1]),
        # continuous in [0, 1]: ten fixed bins over [0, 1]
        ([0.1, 0.3, 0.9, 1.0], [0, 0, 1, 1], "unit", [0, 0, 1, 0, 0, 0, 0, 0, 0, 1]),
        # every group the same mean: one bar
        ([0.5, 0.5, 0.2, 0.8], [0, 0, 1, 1], "single", [2]),
        # -1/3 summed two ways, 4 ulps apart: ten bins do not fit, one bar (numpy's histogram
        # raised "Too many bins"; found by Hypothesis in tests/integration/test_formats.py)
        ([0.0, 0.0, -1.0, 0.0, 2.0, -3.0], [0] * 3 + [1] * 3, "single", [2]),
        # beyond [0, 1]: from the lowest to the highest mean
        ([-3.0, 5.0, 10.0, 10.0], [0, 0, 1, 1], "range", [1, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        # binary, groups of one: a bar for 0/1 and one for 1/1
        ([1, 0, 1], [0, 1, 2], "solve_rate", [1, 2]),
        # binary, but groups of two sizes: no single k/G scale
        ([1, 0, 1, 0, 0], [0, 0, 1, 1, 1], "unit", [0, 0, 0, 1, 0, 1, 0, 0, 0, 0]),
        # binary, groups of 4 beside a singleton and a pair, whose rates are whole quarters too
        ([1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0], [0] * 4 + [1] + [2] * 4 + [3] * 2, "solve_rate", [1, 0, 2, 0, 1]),
        # means of exactly 0 and 1 (not binary rewards): still the unit bins
        ([0.0, 0.0, 0.5, 1.5], [0, 0, 1, 1], "unit", [1, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        # a mean above 1, though none below 0: the range
        ([0.0, 0.0, 1.5, 2.5], [0, 0, 1, 1], "range", [1, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        # a 1e-8 among 0s and 1s is not a binary reward, though its spread nearly is one's
        ([0.0, 1.0, 1e-8, 1.0, 1.0, 0.0], [0] * 3 + [1] * 3, "unit", [0, 0, 0, 1, 0, 0, 1, 0, 0, 0]),
        # a spread exactly a binary group's, from values that are not all 0 or 1
        (
            [0.0, 0.5, (1 + 2**0.5) / 2, 0.0, 0.0, 1.0],
            [0] * 3 + [1] * 3,
            "unit",
            [0, 0, 0, 1, 0, 1, 0, 0, 0, 0],
        ),
    ],
)
def test_histogram_bins_read_at_a_glance(rewards, ids, kind, counts):
    summary = summarize(outcome_of([float(r) for r in rewards], ids))
    histogram = summary.group_mean_histogram
    assert (histogram["kind"], histogram["counts"]) == (kind, counts)
    assert len(histogram["edges"]) == len(counts) + 1
    text = render_plain(summary)
    if kind == "solve_rate":
        size = len(counts) - 1
        assert histogram["labels"] == [f"{k}/{size}" for k in range(size + 1)]
        assert "group solve rate histogram" in text
        assert all(
            f"  {label}  {n}  " in text for label, n in zip(histogram["labels"], counts, strict=True) if n
        )
    else:
        assert "group mean reward histogram" in text and "solve rate" not in text


def test_solve_rate_bars_are_centred_on_k_over_g():
    summary = summarize(outcome_of([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [0] * 4 + [1] * 4))
    assert summary.group_mean_histogram["edges"] == [0.0, 0.125, 0.375, 0.625, 0.875, 1.0]


@pytest.mark.parametrize(("size", "kind"), [(64, "solve_rate"), (65, "single")])
def test_solve_rates_are_binned_for_groups_of_up_to_64(size, kind):
    solved = size // 2
    p = solved / size
    part = part_of([size], [p], [size * p * (1 - p)], [0.0], [1.0], [size], active=[True])
    histogram = findings_of([part], options={}).group_mean_histogram
    assert histogram["kind"] == kind
    if kind == "solve_rate":
        assert len(histogram["counts"]) == size + 1 and histogram["counts"][solved] == 1


def test_a_group_with_no_valid_reward_is_left_out_of_the_histogram():
    part = part_of(
        [2, 0], [0.5, 0.0], [0.5, 0.0], [0.0, math.inf], [1.0, -math.inf], [2, 2], active=[True, False]
    )
    histogram = findings_of([part], options={}).group_mean_histogram
    assert (histogram["kind"], histogram["counts"]) == ("solve_rate", [0, 1, 0])


def test_a_group_with_a_reward_left_out_is_binned_by_the_rewards_it_holds():
    """Groups of 4 rows, one of them with a reward left out (--nan ignore): 1 of its 3 rewards
    is not a whole number of quarters; it was binned as 1/4 (rint(1/3 * 4)), silently."""
    thirds = part_of([4, 3], [0.5, 1 / 3], [1.0, 2 / 3], [0.0, 0.0], [1.0, 1.0], [4, 4], active=[True, True])
    histogram = findings_of([thirds], options={}).group_mean_histogram
    assert histogram["kind"] == "unit" and histogram["counts"][3] == 1 and histogram["counts"][5] == 1
    halves = part_of([4, 2], [0.5, 0.5], [1.0, 0.5], [0.0, 0.0], [1.0, 1.0], [4, 4], active=[True, True])
    histogram = findings_of([halves], options={}).group_mean_histogram
    assert (histogram["kind"], histogram["counts"]) == ("solve_rate", [0, 0, 2, 0, 0])


def test_reward_figures_skip_a_group_whose_rewards_are_all_left_out():
    from grpo_cli.tables import summarize as summarize_table

    table = pa.table({"group_id": [0, 0, 1, 1, 2, 2], "reward": [None, None, -2.0, 1.0, 3.0, 0.5]})
    summary = summarize_table(table, nan="ignore")
    assert summary.reward == {
        "mean": 0.625,
        "std": pytest.approx(math.sqrt(12.6875 / 4)),
        "min": -2.0,
        "max": 3.0,
    }
    assert summary.groups == 3 and summary.nan_rewards == 2


def test_group_sizes_count_rows_whose_reward_is_left_out():
    from grpo_cli.tables import summarize as summarize_table

    table = pa.table({"group_id": [0, 0, 0, 1, 1, 1], "reward": [1.0, None, 0.0, 1.0, 0.0, float("nan")]})
    summary = summarize_table(table, nan="ignore")
    assert summary.group_size == {"min": 3, "median": 3.0, "max": 3}
    assert summary.nan_rewards == 2 and summary.singleton_groups == 0


def test_inactive_values_are_ranked_by_count_and_the_rest_counted():
    rewards: list[float] = []
    ids: list[int] = []
    for group in range(TOP_INACTIVE_VALUES + 2):
        copies = 3 if group == 5 else 1  # value 5.0 is the commonest constant
        for _ in range(copies):
            rewards += [float(group)] * 2
            ids += [len(set(ids)) if ids else 0] * 2
    summary = summarize(outcome_of(rewards, ids))
    assert summary.inactive_by_value[0] == {"value": 5.0, "groups": 3}
    assert len(summary.inactive_by_value) == TOP_INACTIVE_VALUES
    listed = sum(item["groups"] for item in summary.inactive_by_value)
    assert listed + summary.inactive_other_values == summary.inactive_groups


def test_dropped_groups_and_rows_come_from_the_filter():
    outcome = outcome_of(REWARDS, IDS, ComputeConfig(drop_inactive=True, keep_mean_range=(0.5, 10.0)))
    summary = summarize(outcome, output={"path": "o.parquet", "shards": 1, "bytes": 1})
    inactive, outside = (
        "inactive group (--drop-inactive)",
        "group mean reward outside [0.5, 10.0] (--keep-mean-range)",
    )
    # groups: [1, 3] active, mean 2; [4, 4] constant; [7] singleton; [0, 0, 0] constant, mean 0
    assert summary.dropped == {
        "groups": 3,
        "rows": 6,
        "reasons": [inactive, outside],
        "by_reason": [
            {"reason": inactive, "groups": 3, "rows": 6},
            {"reason": outside, "groups": 1, "rows": 3},
        ],
        "rows_written": 2,
    }
    text = render_plain(summary)
    assert "dropped                    3 groups, 6 rows; 2 rows written" in text
    assert f"because                  {outside}: 1 groups, 3 rows" in text


def test_a_zero_in_the_advantage_range_is_reported_as_positive_zero():
    """A zero's sign depends on where an engine cut its rows, and a Parquet footer stores a zero
    minimum as -0.0 (the Ray engine reads its range there): the summary says 0.0 either way."""
    summary = summarize(outcome_of(REWARDS, IDS), advantage_range=(-0.0, -0.0))
    assert json.loads(summary.to_json())["advantage"] == {"min": 0.0, "max": 0.0}
    assert math.copysign(1.0, summary.advantage["min"]) == math.copysign(1.0, summary.advantage["max"]) == 1.0
    assert summarize(outcome_of(REWARDS, IDS), advantage_range=(-2.5, -0.0)).advantage == {
        "min": -2.5,
        "max": 0.0,
    }


def test_the_advantage_range_is_that_of_the_rows_written(tmp_path):
    """With rows filtered out, the summary's advantage range is the output's: a dropped group's
    larger advantages are not in it (the Ray engine reads it from the written files)."""
    from grpo_cli.jobs import compute_dataset

    source, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    # group a: mean 0.5, advantages +-1; group b: mean 0.25, one 1 among three 0s (+1.73, -0.58)
    pq.write_table(
        pa.table({"uid": ["a", "a", "b", "b", "b", "b"], "reward": [0.0, 1.0, 1.0, 0.0, 0.0, 0.0]}), source
    )
    summary = compute_dataset(source, out, ComputeConfig(group_cols=("uid",), keep_mean_range=(0.4, 0.6)))
    written = pq.read_table(out).column("advantage").to_numpy()
    assert written.size == 2
    assert (summary.advantage["min"], summary.advantage["max"]) == (
        float(written.min()),
        float(written.max()),
    )
    everything = compute_dataset(source, tmp_path / "all.parquet", ComputeConfig(group_cols=("uid",)))
    assert everything.advantage["max"] == pytest.approx(3**0.5, rel=1e-5)  # group b's one success


def test_json_has_no_nan_and_optional_keys_only_when_present():
    summary = summarize(outcome_of(REWARDS, IDS), advantage_range=(-math.inf, math.nan))
    data = json.loads(summary.to_json())
    assert data["advantage"] == {"min": None, "max": None}
    assert "checks" not in data and "verify" not in data
    summary.checks = [
        {"name": "min-groups", "value": 4, "op": ">=", "bound": 5, "passed": False}
        | {"value_text": "4", "bound_text": ">= 5"}
    ]
    data = json.loads(summary.to_json())
    assert data["checks_passed"] is False and data["active_fraction"] == 0.25


def test_an_empty_run_has_no_figures_to_invent():
    empty = GroupOutcome(
        norms=[],
        active=torch.zeros(0, dtype=torch.bool),
        stats=group_stats(torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.long)),
        rows_per_group=np.zeros(0, dtype=np.int64),
        rows=0,
        nan_rewards=0,
        kept=None,
        group_columns=None,
        drop_reasons=[],
    )
    summary = summarize(empty, advantage_range=None)
    assert summary.groups == 0 and summary.active_fraction == 0.0
    assert summary.group_size == {"min": None, "median": None, "max": None}
    assert summary.reward == {"mean": None, "std": None, "min": None, "max": None}
    assert summary.group_mean_histogram == {"kind": "range", "edges": [], "counts": []}


def test_input_info_counts_shards_bytes_and_formats(tmp_path):
    shards = [
        Shard(Path("a.parquet"), "a.parquet", "parquet", 100),
        Shard(Path("b.jsonl"), "b.jsonl", "jsonl", 50),
    ]
    info = input_info("data/", shards, stdin=False, bytes_decoded=400)
    assert info == {
        "path": "data/",
        "format": ["jsonl", "parquet"],
        "shards": 2,
        "bytes": 150,
        "bytes_decoded": 400,
    }
    assert input_info("-", shards[:1], stdin=True, bytes_decoded=0)["path"] == "<stdin>"


def test_reports_show_the_figures_and_each_check():
    summary = summarize(outcome_of(REWARDS, IDS))
    text = render_plain(summary)
    assert "active groups" in text and "1 (25.0%)" in text
    assert "  all 0.0" in text and "group mean reward histogram:" in text
    summary.checks = [
        {"name": "min-groups", "value": 4, "op": ">=", "bound": 2, "passed": True}
        | {"value_text": "4", "bound_text": ">= 2"},
        {"name": "max-inactive-fraction", "value": 0.75, "op": "<=", "bound": 0.5, "passed": False}
        | {"value_text": "0.75", "bound_text": "<= 0.5"},
    ]
    assert check_lines(summary) == [
        "PASS  min-groups: 4 (bound >= 2)",
        "FAIL  max-inactive-fraction: 0.75 (bound <= 0.5)",
    ]
    compact = render_compact(summary).splitlines()
    assert compact[0] == "x.parquet: 8 rows, 4 groups, 1 active (25.0%), 3 inactive, 1 singleton"
    assert compact[1:] == check_lines(summary)


def check(
    name: str,
    value: float | None,
    op: str,
    bound: float,
    passed: bool,
    *,
    value_text: str | None = None,
    bound_text: str | None = None,
    detail: str | None = None,
) -> dict[str, object]:
    """A check's record as the summary's JSON holds it: numbers as numbers, beside the words the
    report prints (the value's own text unless given, ``op bound`` unless given)."""
    record: dict[str, object] = {
        "name": name,
        "value": value,
        "op": op,
        "bound": bound,
        "passed": passed,
        "value_text": value_text if value_text is not None else "none" if value is None else f"{value}",
        "bound_text": bound_text if bound_text is not None else f"{op} {bound}",
    }
    if detail is not None:
        record["detail"] = detail
    return record


def test_every_check_reports_its_measured_value_and_bound():
    """The exact records check prints and writes to JSON, for every check at once."""
    from grpo_cli.options.checks import CheckBounds
    from grpo_cli.results.checks import evaluate_checks

    summary = summarize(outcome_of([*REWARDS, 2.0], [*IDS, 4]))  # 5 groups, 1 active: 4/5 inactive
    summary.verify = {"mismatched": 2}
    bounds = CheckBounds(
        max_inactive_fraction=0.5,
        min_active_groups=1,
        min_groups=6,
        min_group_size=2,
        max_group_size=3,
        uniform_group_size=True,
        max_singleton_groups=1,
    )
    assert evaluate_checks(summary, bounds) == [
        check("max-inactive-fraction", 0.8, "<=", 0.5, False),
        check("min-active-groups", 1, ">=", 1, True),
        check("min-groups", 5, ">=", 6, False),
        check("min-group-size", 1, ">=", 2, False),
        check("max-group-size", 3, "<=", 3, True),
        check(
            "uniform-group-size",
            2,
            "==",
            0,
            False,
            value_text="1..3",
            bound_text="min == max",
            detail="3 groups are not of the common size 1: group 0 (2 rows), group 1 (2 rows), "
            "group 3 (3 rows)",
        ),
        check("max-singleton-groups", 2, "<=", 1, False),
        check(
            "verify-advantage-col", 2, "==", 0, False, value_text="2 rows differ", bound_text="0 rows differ"
        ),
    ]
    thirds = summarize(outcome_of([0.0, 1.0, 2.0, 2.0, 3.0, 3.0], [0, 0, 1, 1, 2, 2]))
    (inactive,) = evaluate_checks(thirds, CheckBounds(max_inactive_fraction=1.0))
    assert inactive["value"] == 0.666667  # rounded to six places


def test_checks_on_no_rows_report_none_and_fail_the_rows_check():
    from grpo_cli.options.checks import CheckBounds
    from grpo_cli.results.checks import evaluate_checks

    empty = summarize(
        outcome_of([], []),
        advantage_range=None,
    )
    results = evaluate_checks(empty, CheckBounds(min_group_size=1, max_group_size=1, uniform_group_size=True))
    assert results == [
        check("rows", 0, ">=", 1, False),
        check("min-group-size", None, ">=", 1, True),
        check("max-group-size", None, "<=", 1, True),
        check("uniform-group-size", None, "==", 0, True, bound_text="min == max"),
    ]


def test_the_json_summary_keeps_its_documented_keys_and_precision():
    """Pipelines read these keys by name (README, "JSON summary"): renaming one breaks them."""
    outcome = outcome_of([*REWARDS, 5.0, 6.0, 8.0], [*IDS, 4, 4, 4])  # 2 active of 5: 0.4
    summary = summarize(outcome, elapsed=1.23456789, mode="streaming", device="cuda:0")
    summary.groups, summary.active_groups = 7, 2  # a fraction with more than six decimals
    text = summary.to_json()
    assert text.startswith('{\n  "rows": 11,\n  "groups": 7,'), text[:40]
    data = json.loads(text)
    assert list(data) == [
        "rows", "groups", "active_groups", "inactive_groups", "active_fraction", "singleton_groups",
        "group_size", "group_size_counts", "reward", "advantage", "inactive_by_value",
        "inactive_other_values", "group_mean_histogram", "reward_histogram", "nan_rewards", "dropped",
        "input", "output", "options", "mode", "device", "elapsed_seconds", "off_size_groups", "warnings",
        "findings",
    ]  # fmt: skip
    assert data["active_fraction"] == 0.285714 and data["elapsed_seconds"] == 1.235
    assert data["mode"] == "streaming" and data["device"] == "cuda:0"
    assert data["group_size"] == {"min": 1, "median": 2, "max": 3}
    assert data["group_size_counts"] == {"1": 1, "2": 2, "3": 2}
    assert data["inactive_other_values"] == 0
    assert data["off_size_groups"] == {
        "common_size": 2,
        "groups": 3,
        "examples": [{"group": 2, "rows": 1}, {"group": 3, "rows": 3}, {"group": 4, "rows": 3}],
    }


@pytest.mark.parametrize(
    ("strict", "differ", "found", "bound", "passed"),
    [
        (False, 2, "2 rows differ (3 more by rounding residue)", "0 rows differ", False),
        (True, 5, "5 rows differ", "0 rows differ (--strict)", False),
    ],
)
def test_verify_check_counts_residue_only_under_strict(strict, differ, found, bound, passed):
    from grpo_cli.options.checks import CheckBounds
    from grpo_cli.results.checks import evaluate_checks

    summary = summarize(outcome_of(REWARDS, IDS))
    summary.verify = {"mismatched": 2, "residue": 3, "strict": strict}
    (result,) = evaluate_checks(summary, CheckBounds())
    assert result == check(
        "verify-advantage-col", differ, "==", 0, passed, value_text=found, bound_text=bound
    )
    summary.verify = {"mismatched": 0, "residue": 0, "strict": strict}
    (result,) = evaluate_checks(summary, CheckBounds())
    assert (result["value"], result["value_text"], result["passed"]) == (0, "0 rows differ", True)


def test_size_counts_keep_the_most_common_sizes_and_the_smallest_on_a_tie():
    twice = [s for s in range(1, 101) if s % 3 == 0]
    once = [s for s in range(1, 101) if s % 3]
    sizes = np.array(sorted([*twice, *twice, *once]))
    shown = of_sizes(sizes, {}).group_size_counts
    expected = sorted([*twice, *once[: SIZE_COUNTS_SHOWN - len(twice)]])
    assert [int(k) for k in shown] == expected
    assert all(shown[str(s)] == 2 for s in twice)


def test_grouping_warnings_name_the_group_size_option_and_see_merged_pairs():
    singles = of_sizes([1, 1, 1, 2], {"group_cols": [], "group_size": 8}).warnings
    assert "the group key --group-size 8 seems to name rollouts" in singles[0]
    merged = of_sizes([2] * 10 + [4, 6], {"group_cols": ["prompt"]}, key_at=lambda g: f"p{g}").warnings
    assert merged[0].startswith("2 of 12 groups have 2 or more times the 2 rows most groups have")
    assert 'e.g. key "p10" (4 rows), "p11" (6 rows);' in merged[0]


def test_the_local_engine_computes_the_group_findings_beside_pass_2_and_raises_their_error(
    tmp_path, monkeypatch
):
    """compute's figures of the groups run on a thread of their own while pass 2 writes (check
    without a second pass computes them in line); an error there is the run's error, never a
    summary quietly missing its figures."""
    import threading

    import grpo_cli.engines.local as local
    import grpo_cli.results.summary as summary_module
    from grpo_cli.jobs import check_dataset, compute_dataset
    from grpo_cli.options.checks import CheckBounds
    from tests.conftest import write_parquet

    path = write_parquet(
        tmp_path / "in.parquet", [{"group_id": i // 4, "reward": float(i % 3)} for i in range(16)]
    )
    real = summary_module.group_findings
    threads: list[str] = []

    def recorded(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(local.engine, "group_findings", recorded)
    beside = compute_dataset(path, tmp_path / "out.parquet")
    in_line = check_dataset(path, CheckBounds())
    assert threads == ["grpo-cli-beside", "MainThread"]
    assert (
        beside.to_dict()["reward"]
        == in_line.to_dict()["reward"]
        == summarize(outcome_of([float(i % 3) for i in range(16)], [i // 4 for i in range(16)])).to_dict()[
            "reward"
        ]
    )

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the group figures")

    monkeypatch.setattr(local.engine, "group_findings", broken)
    with pytest.raises(RuntimeError, match="a bug in the group figures"):
        compute_dataset(path, tmp_path / "again.parquet")


@pytest.mark.parametrize("spread_in_last_group", [False, True])
def test_the_findings_of_groups_cut_into_parts_are_those_of_one_part(spread_in_last_group):
    """Binary rewards are told from the others part by part (the checks' temporaries a part's,
    as the Ray engine's buckets hold them): the same kind and counts as one part of every group,
    the one non-binary group in the last part included, and empty groups skipped."""
    from grpo_cli.results.findings import parts_of

    rewards = [float(i % 3 == 0) for i in range(40)]
    if spread_in_last_group:
        rewards[-1] = 0.5  # the last group, in the last part, is not binary
    outcome = outcome_of(rewards, [i // 4 for i in range(40)])
    stats = outcome.stats
    figures = [t.numpy() for t in (stats.count, stats.mean, stats.m2, stats.minimum, stats.maximum)]
    count, mean, m2, minimum, maximum = (
        np.append(f, empty) for f, empty in zip(figures, [0, 0.0, 0.0, np.inf, -np.inf], strict=True)
    )
    arrays = dict(
        count=count,
        mean=mean,
        m2=m2,
        m2_scale=np.ones(count.size),
        minimum=minimum,
        maximum=maximum,
        active=np.append(outcome.active.numpy(), False),
        rows=np.append(outcome.rows_per_group, 4),
    )

    def findings(chunk: int) -> Any:
        return findings_of(parts_of(**arrays, key_at=None, chunk=chunk), options={})

    whole = findings(1 << 20)
    assert whole.group_mean_histogram["kind"] == ("unit" if spread_in_last_group else "solve_rate")
    assert findings(3) == findings(1) == whole
