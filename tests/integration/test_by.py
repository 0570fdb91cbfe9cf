"""``--by COL``: every figure per value, against an independent per-value computation."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli import summarize
from tests.conftest import assert_one_line_error


def steps_table(seed: int, *, binary: bool) -> pa.Table:
    """Several steps and data sources; groups of varied size, constant ones at 0, 1 and 0.5."""
    rng = random.Random(seed)
    rows: dict[str, list[Any]] = {"step": [], "source": [], "uid": [], "reward": []}
    for step in range(1, 7):
        for g in range(rng.randint(5, 14)):
            size = rng.choice((1, 2, 4, 8, 8, 8))
            kind = rng.random()
            if binary:
                rewards = (
                    [0.0] * size
                    if kind < 0.3
                    else [1.0] * size
                    if kind < 0.45
                    else [float(rng.random() < 0.5) for _ in range(size)]
                )
            else:
                rewards = (
                    [0.5] * size
                    if kind < 0.2
                    else [0.0] * size
                    if kind < 0.3
                    else [rng.choice((0.0, 0.25, 0.5, 1.0)) for _ in range(size)]
                )
            source = rng.choice(("math", "code"))
            for r in rewards:
                rows["step"].append(step)
                rows["source"].append(source)
                rows["uid"].append(f"{step}-{g}")
                rows["reward"].append(r)
    return pa.table(rows)


def independent(table: pa.Table, column: str) -> dict[Any, dict[str, Any]]:
    """Each value's figures, from a plain loop over the groups in float64."""
    data = table.to_pylist()
    groups: dict[str, list[float]] = {}
    value_of: dict[str, Any] = {}
    for row in data:
        groups.setdefault(row["uid"], []).append(row["reward"])
        value_of[row["uid"]] = row[column]
    low = min(r["reward"] for r in data)
    high = max(r["reward"] for r in data)
    out: dict[Any, dict[str, Any]] = {}
    for uid, rewards in groups.items():
        entry = out.setdefault(
            value_of[uid],
            {
                "groups": 0,
                "rows": 0,
                "active": 0,
                "all_min": 0,
                "all_max": 0,
                "other": 0,
                "active_rows": 0,
                "means": [],
                "stds": [],
                "singletons": 0,
                "sum": 0.0,
                "constant_several": 0,
                "several": [],
            },
        )
        values = np.array(rewards, dtype=np.float64)
        active = len(values) >= 2 and values.max() != values.min()
        entry["groups"] += 1
        entry["rows"] += len(values)
        entry["active"] += active
        entry["active_rows"] += len(values) if active else 0
        if not active:
            if values.min() == low:
                entry["all_min"] += 1
            elif values.max() == high:
                entry["all_max"] += 1
            else:
                entry["other"] += 1
        entry["means"].append(values.mean())
        entry["stds"].append(values.std())
        entry["singletons"] += len(values) == 1
        entry["sum"] += values.sum()
        if len(values) >= 2:
            entry["several"].append(len(values))
            entry["constant_several"] += not active
    return out


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("column", ["step", "source"])
@pytest.mark.parametrize(
    ("memory_limit_mb", "chunk_rows", "shuffled"),
    [(1024, None, False), (0, None, False), (1024, 7, False), (1024, 7, True)],
)
def test_every_figure_per_value_equals_an_independent_computation(
    binary: bool,
    column: str,
    memory_limit_mb: int,
    chunk_rows: int | None,
    shuffled: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys matched 7 rows at a time: a group's value is taken from several chunks, each over
    its own groups (shuffled, a chunk spans groups it holds no row of)."""
    table = steps_table(11 if binary else 12, binary=binary)
    if shuffled:
        table = table.take(np.random.default_rng(3).permutation(table.num_rows))
    if column == "source":  # a group must lie in one value: key the groups by source too
        table = table.set_column(
            2,
            "uid",
            pa.array(
                [
                    f"{u}-{s}"
                    for u, s in zip(table["uid"].to_pylist(), table["source"].to_pylist(), strict=True)
                ]
            ),
        )
    if chunk_rows is not None:
        from grpo_cli.engines import local

        monkeypatch.setattr(local.statistics, "MIN_KEY_CHUNK_ROWS", chunk_rows)
        monkeypatch.setattr(local.statistics, "KEY_CHUNK_ROWS", chunk_rows)
    summary = summarize(
        table, group_col="uid", by=[column], memory_limit_mb=memory_limit_mb, batch_rows=chunk_rows
    )
    expected = independent(table, column)
    figures = summary.by[column]
    assert [v["value"] for v in figures] == sorted(expected)
    for value in figures:
        e = expected[value["value"]]
        assert value["groups"] == e["groups"] and value["rows"] == e["rows"]
        assert value["active_groups"] == e["active"]
        assert value["inactive_groups"] == e["groups"] - e["active"]
        assert value["inactive"] == {"all_min": e["all_min"], "all_max": e["all_max"], "other": e["other"]}
        assert value["effective_row_fraction"] == round(e["active_rows"] / e["rows"], 6)
        assert value["singleton_groups"] == e["singletons"]
        assert value["reward_mean"] == pytest.approx(e["sum"] / e["rows"], rel=1e-12)
        for p in (10, 50, 90):
            assert value["group_mean"][f"p{p}"] == pytest.approx(np.percentile(e["means"], p), abs=1e-12)
            assert value["group_std"][f"p{p}"] == pytest.approx(np.percentile(e["stds"], p), abs=1e-12)
        if binary and e["several"]:
            rate = e["sum"] / e["rows"]
            sizes = np.array(e["several"], dtype=np.float64)
            assert value["homogeneous"] == {
                "observed": round(e["constant_several"] / len(sizes), 6),
                "expected": round(float(np.mean(rate**sizes + (1 - rate) ** sizes)), 6),
                "pass_rate": round(rate, 6),
            }
        elif not binary:
            assert value["homogeneous"] is None
    totals = {k: sum(v[k] for v in figures) for k in ("groups", "rows", "active_groups")}
    assert totals == {"groups": summary.groups, "rows": summary.rows, "active_groups": summary.active_groups}


def test_check_by_step_prints_a_table_and_the_json_holds_the_same_figures(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "steps.parquet"
    pq.write_table(steps_table(3, binary=True), path)
    result = cli("check", path, "-g", "uid", "--by", "step", "--summary-json", tmp_path / "s.json")
    assert result.exit_code == 0, result.stderr
    record = json.loads((tmp_path / "s.json").read_text())
    lines = result.stderr.splitlines()
    start = lines.index("by step (6 values):")
    assert lines[start + 1].split()[:3] == ["step", "groups", "inactive"]
    for line, value in zip(lines[start + 2 : start + 8], record["by"]["step"], strict=True):
        cells = line.split()
        assert cells[0] == str(value["value"]) and cells[1] == str(value["groups"])
        assert cells[2] == f"{100 * value['inactive_groups'] / value['groups']:.1f}%"
    assert lines[start + 8].startswith("  inactive fraction over step: ")


def test_a_long_step_column_shows_its_last_values_and_the_trend(cli: Any, tmp_path: Path) -> None:
    rows = [
        {"step": s, "uid": f"{s}-{g}", "reward": float((s + g + i) % 2 if g else 0)}
        for s in range(40)
        for g in range(3)
        for i in range(2)
    ]
    path = tmp_path / "long.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = cli("check", path, "-g", "uid", "--by", "step")
    assert "by step (40 values, the last 12 shown):" in result.stderr
    assert "\n  39 " in result.stderr and "\n  27 " not in result.stderr


def test_max_inactive_fraction_by_step_fails_naming_the_steps(cli: Any, tmp_path: Path) -> None:
    rows = []
    for step, inactive in ((1, 0), (2, 3), (3, 1)):
        for g in range(4):
            constant = g < inactive
            rows += [
                {"step": step, "uid": f"{step}-{g}", "reward": 1.0 if constant else float(i % 2)}
                for i in range(4)
            ]
    path = tmp_path / "steps.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = cli("check", path, "-g", "uid", "--by", "step", "--max-inactive-fraction", "0.5")
    assert result.exit_code == 1, result.stderr
    assert "PASS  max-inactive-fraction: 0.333333" in result.stderr
    assert (
        "FAIL  max-inactive-fraction by step: 1 of 3 values above (bound <= 0.5 in every value): "
        "step 2 (75.0%)" in result.stderr
    )
    passing = cli("check", path, "-g", "uid", "--by", "step", "--max-inactive-fraction", "0.75")
    assert passing.exit_code == 0, passing.stderr


@pytest.mark.parametrize("failing_steps", [8, 9])
def test_max_inactive_fraction_by_step_names_eight_values_then_an_ellipsis(
    cli: Any, tmp_path: Path, failing_steps: int
) -> None:
    rows = [
        {"step": step, "uid": f"{step}-{g}", "reward": 1.0 if step <= failing_steps else float(i % 2)}
        for step in range(1, 12)
        for g in range(2)
        for i in range(2)
    ]
    path = tmp_path / "steps.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    result = cli("check", path, "-g", "uid", "--by", "step", "--max-inactive-fraction", "0.5")
    assert result.exit_code == 1, result.stderr
    line = next(x for x in result.stderr.splitlines() if x.startswith("FAIL  max-inactive-fraction by step"))
    named = ", ".join(f"step {step} (100.0%)" for step in range(1, 9))
    suffix = ", ..." if failing_steps > 8 else ""
    assert line.endswith(f"{failing_steps} of 11 values above (bound <= 0.5 in every value): {named}{suffix}")


def test_a_group_across_two_values_is_refused_in_one_line(cli: Any, tmp_path: Path) -> None:
    rows = [{"uid": "a", "step": 1, "reward": 1.0}, {"uid": "a", "step": 2, "reward": 0.0}]
    path = tmp_path / "split.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert_one_line_error(
        cli("check", path, "-g", "uid", "--by", "step"),
        "split.parquet, row 1: a group spans two values of --by 'step' (1, then 2); "
        "each group must lie in one value of it",
    )


@pytest.mark.parametrize("option", ["--by", "--batch-col"])
def test_a_group_across_two_values_in_two_chunks_is_refused(option: str, cli: Any, tmp_path: Path) -> None:
    """Each shard's keys are matched as one chunk: the group's value in the first shard is held
    over to the second, where its rows hold another (the merge rule "one", not a chunk's own check)."""
    folder = tmp_path / "shards"
    folder.mkdir()
    for part, step in ((0, 1), (1, 2)):
        rows = [{"uid": uid, "step": step, "reward": float(i % 2)} for i, uid in enumerate("abab")]
        rows = rows if part == 0 else rows[:2]  # group "a" and "b" again, at step 2
        pq.write_table(pa.Table.from_pylist(rows), folder / f"part-{part}.parquet")
    result = cli("check", folder, "-g", "uid", option, "step")
    named = "--by 'step'" if option == "--by" else "--batch-col 'step'"
    assert_one_line_error(
        result, "part-1.parquet, row 0: a group spans two values of " + named, "(1, then 2)"
    )


def test_by_on_compute_reports_and_writes_the_data_unchanged(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "steps.parquet"
    pq.write_table(steps_table(5, binary=False), path)
    plain, by = tmp_path / "plain.parquet", tmp_path / "by.parquet"
    assert cli("compute", path, "-g", "uid", "-o", plain, "-q").exit_code == 0
    result = cli(
        "compute", path, "-g", "uid", "--by", "source", "-o", by, "--summary-json", tmp_path / "s.json"
    )
    assert result.exit_code == 0, result.stderr
    assert "by source (2 values):" in result.stderr
    assert pq.read_table(by).equals(pq.read_table(plain))
    assert sorted(v["value"] for v in json.loads((tmp_path / "s.json").read_text())["by"]["source"]) == [
        "code",
        "math",
    ]


def test_by_a_missing_column_is_refused_naming_it(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "steps.parquet"
    pq.write_table(steps_table(5, binary=False), path)
    assert_one_line_error(cli("check", path, "-g", "uid", "--by", "epoch"), "epoch")


def test_a_values_reward_mean_is_the_exact_one_as_the_runs_is():
    """Groups whose float sum in order would lose the small rewards: each value's reward mean is
    the exact sum over its rewards rounded once, by the rule of the run's reward mean (with one
    value, the two are the same figure)."""
    from fractions import Fraction

    rewards = [1e16, 1.0, 1.0, -1e16, 3.0, 1.0, 0.5, 0.25]
    table = pa.table(
        {"uid": [0, 1, 2, 3, 4, 4, 5, 5], "step": [7] * 6 + [8] * 2, "reward": rewards},
    )
    summary = summarize(table, group_col="uid", by=["step"])
    figures = {v["value"]: v["reward_mean"] for v in summary.by["step"]}
    assert figures[7] == float(sum(Fraction(r) for r in rewards[:6]) / 6) == 1.0
    assert figures[8] == 0.375
    whole = summarize(table.slice(0, 6), group_col="uid", by=["step"])
    assert whole.by["step"][0]["reward_mean"] == whole.reward["mean"] == 1.0


def _figures_one_value_at_a_time(values, groups, run_range):
    """``figures_by_value`` as it was written before it was vectorised (issue #67 D.18: a mask
    and a dozen calls per value, a minute for 100,000 values): numpy's own percentile, the
    kernel's exact sums and Python's fractions, one value at a time. The reference."""
    from fractions import Fraction

    from grpo_cli.arrow.plain import plain_key
    from grpo_cli.results.findings import reward_totals
    from grpo_cli.results.summary import PERCENTILES, value_sort_key

    def percentiles(x):
        if x.size == 0:
            return {f"p{p}": None for p in PERCENTILES}
        return {f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(x, PERCENTILES), strict=True)}

    low, high = run_range
    out = []
    for value in sorted(range(len(values.keys)), key=lambda v: value_sort_key(values.keys[v])):
        member = values.of_group == value
        if not member.any():
            continue
        count, mean, m2 = groups.count[member], groups.mean[member], groups.m2[member]
        minimum, maximum, active = groups.minimum[member], groups.maximum[member], groups.active[member]
        rows = groups.rows[member]
        scored = count > 0
        constant = ~active & scored & (minimum == maximum)
        std = np.sqrt(np.divide(m2, count, out=np.zeros_like(m2), where=scored))
        reward = reward_totals(count, mean, minimum, maximum)
        at_low = int((constant & (minimum == low)).sum())
        at_high = int((constant & (maximum == high)).sum()) if high != low else 0
        homogeneous = None
        if scored.any() and minimum[scored].min() >= 0 and maximum[scored].max() <= 1:
            sums, squares = mean[scored] * count[scored], m2[scored] + count[scored] * mean[scored] ** 2
            several = count >= 2
            if np.allclose(squares, sums, rtol=1e-9, atol=1e-9) and several.any():
                rate = Fraction(reward.mean)
                sizes, n = np.unique(count[several], return_counts=True)
                total = sum(
                    (rate**s + (1 - rate) ** s) * int(c)
                    for s, c in zip(sizes.tolist(), n.tolist(), strict=True)
                )
                homogeneous = {
                    "observed": round(float(constant[several].mean()), 6),
                    "expected": round(float(total / int(n.sum())), 6),
                    "pass_rate": round(reward.mean, 6),
                }
        out.append(
            {
                "value": plain_key(values.keys[value]),
                "groups": int(member.sum()),
                "rows": int(rows.sum()),
                "active_groups": int(active.sum()),
                "inactive_groups": int((~active).sum()),
                "inactive": {
                    "all_min": at_low,
                    "all_max": at_high,
                    "other": int(constant.sum()) - at_low - at_high,
                },
                "effective_row_fraction": round(float(rows[active].sum()) / float(rows.sum()), 6)
                if rows.sum()
                else 0.0,
                "group_mean": percentiles(mean[scored]),
                "group_std": percentiles(std[scored]),
                "singleton_groups": int((rows == 1).sum()),
                "inactive_with_spread": int((~active & (maximum > minimum)).sum()),
                "reward_mean": reward.mean if reward.rewards else None,
                "homogeneous": homogeneous,
            }
        )
    return out


@pytest.mark.parametrize("seed", range(8))
def test_the_figures_per_value_are_those_of_one_value_at_a_time(seed):
    """All values at once give the bits one value at a time gave: binary and continuous rewards,
    constant groups at the run's extremes, empty and singleton groups, values of one group and
    of more than SMALL_VALUE_GROUPS (the kernel's exact sums), values with no group."""
    from grpo_cli.results.summary import SMALL_VALUE_GROUPS, ByValues, GroupFigures, figures_by_value

    rng = np.random.default_rng(seed)
    k = 400
    sizes = rng.choice([0, 1, 2, 4, 8], k, p=[0.05, 0.15, 0.3, 0.3, 0.2])
    binary = seed % 2 == 0
    count = sizes.astype(np.int64)
    mean, m2 = np.zeros(k), np.zeros(k)
    minimum, maximum = np.full(k, np.inf), np.full(k, -np.inf)
    for g, n in enumerate(sizes):
        if n:
            r = (
                (rng.random(n) < rng.random()).astype(float)
                if binary
                else rng.choice([0.1, 0.7, 1e16, -3.0], n) + rng.random(n) * (g % 3)
            )
            mean[g], m2[g] = r.mean(), ((r - r.mean()) ** 2).sum()
            minimum[g], maximum[g] = r.min(), r.max()
        else:
            mean[g], m2[g] = np.nan, 0.0
    active = maximum > minimum
    groups = GroupFigures(
        count=count,
        mean=mean,
        m2=m2,
        minimum=minimum,
        maximum=maximum,
        active=active,
        rows=sizes + (sizes == 0),
    )
    values = np.where(
        np.arange(k) < SMALL_VALUE_GROUPS + 20, 0, rng.integers(1, 60, k)
    )  # value 0: many groups
    by = ByValues("step", values.astype(np.int64), list(range(65)))  # values 60-64 hold no group
    finite = np.isfinite(minimum)
    run_range = (float(minimum[finite].min()), float(maximum[finite].max()))
    got = figures_by_value(by, groups, run_range=run_range)
    expected = _figures_one_value_at_a_time(by, groups, run_range)
    assert json.dumps(got) == json.dumps(expected)


def test_categories_are_ranked_worst_first_within_80_columns(tmp_path: Path, monkeypatch: Any) -> None:
    """A data source has no order: its most inactive values come first (the rest counted), no
    trend is drawn over them, and the table fits 80 columns, its narrower columns chosen."""
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    rows = []
    for s in range(15):  # source s has s of its 15 groups constant
        for g in range(15):
            rows += [
                {"source": f"source-{s:02d}", "uid": f"{s}-{g}", "reward": 1.0 if g < s else float(i % 2)}
                for i in range(2)
            ]
    path = tmp_path / "sources.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(app, ["check", str(path), "-g", "uid", "--by", "source"])
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    start = lines.index("by source (15 values, the 12 most inactive shown):")
    table = lines[start + 1 : start + 14]
    assert [line.split()[0] for line in table[1:4]] == ["source-14", "source-13", "source-12"]
    assert "source-02" not in result.stderr  # among the three least inactive, not shown
    assert max(len(line) for line in table) <= 80
    assert lines[start + 14] == "  inactive fraction across source: 0.0% to 93.3%, most inactive first"
    assert "inactive fraction over source" not in result.stderr
