"""Edges that plausible bugs slip through: each test here was checked against the bug it names.

Numerical edges of the kernel, multi-shard ``--group-size``, the boundaries of the
filters and checks, and the atomicity of a single-file output and of the summary file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli.errors import GrpoError
from grpo_cli.jobs import check_dataset, compute_dataset
from grpo_cli.kernel import GroupStatsAccumulator, apply_normalization, group_stats, normalize_in_groups
from grpo_cli.options.advantage import AdvantageOptions
from grpo_cli.options.checks import CheckBounds
from grpo_cli.options.config import ComputeConfig, VerifySpec
from grpo_cli.results.checks import evaluate_checks
from grpo_cli.run import reward_columns
from tests.conftest import write_parquet
from tests.reference import reference_advantages

# --------------------------------------------------------------------------- kernel


def test_distinct_rewards_whose_variance_underflows_are_active():
    """Activity comes from min != max: m2 of [0, 1e-170] underflows to 0 in float64."""
    r = torch.tensor([0.0, 1e-170], dtype=torch.float64)
    out = normalize_in_groups(r, torch.tensor([0, 0]), scale="none")
    assert out["active_group_count"] == 1
    assert out["advantages"].tolist() == [-5e-171, 5e-171]
    scaled = normalize_in_groups(r, torch.tensor([0, 0]), 1e-300)["advantages"]
    assert scaled.tolist() == pytest.approx([-1.0, 1.0], rel=1e-12)


def test_a_constant_group_near_the_largest_float_keeps_its_mean():
    """Summing three 1.7e308 overflows: the mean must come from the scaled path."""
    r = torch.tensor([1.7e308, 1.7e308, 1.7e308, 1.0, 2.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 0, 1, 1])
    stats = group_stats(r, ids)
    assert stats.mean.tolist() == [1.7e308, 1.5]
    out = normalize_in_groups(r, ids)
    assert out["active_group_mask"].tolist() == [False, True]
    assert out["advantages"][:3].tolist() == [0.0, 0.0, 0.0]
    assert torch.isfinite(out["advantages"]).all()


@pytest.mark.parametrize("block_rows", [1, 2, 3, 5])
def test_extreme_counts_survive_block_merges(block_rows):
    """Tied minima split over statistics blocks are counted once each: [0.1, 0.1, 0.7]."""
    r = torch.tensor([0.1, 0.1, 0.7, 0.3, 0.3, 0.3, 0.9, 0.2], dtype=torch.float64)
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    whole = group_stats(r, ids, count_extremes=True)
    acc = GroupStatsAccumulator(block_rows=block_rows, count_extremes=True)
    for start in range(0, 8, 3):  # chunks that straddle the blocks
        acc.update(r[start : start + 3], ids[start : start + 3])
    merged = acc.compute(3)
    assert merged.at_minimum is not None and merged.at_maximum is not None
    assert merged.at_minimum.tolist() == [2, 3, 1] == whole.at_minimum.tolist()  # type: ignore[union-attr]
    assert merged.at_maximum.tolist() == [1, 3, 1] == whole.at_maximum.tolist()  # type: ignore[union-attr]
    options = AdvantageOptions.resolve(preset="nemo-rl")
    expected, _ = reference_advantages(
        r.tolist(), ids.tolist(), baseline="leave-one-out", std="sample", epsilon_mode="add-if-nonzero"
    )
    got = apply_normalization(r, ids, options.normalization(merged))
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(("group_size", "block_rows"), [(3, 4), (4, 6), (5, 3), (2, 7)])
def test_group_size_that_does_not_divide_the_block(group_size, block_rows):
    generator = torch.Generator().manual_seed(group_size * 10 + block_rows)
    r = torch.rand(group_size * 7, generator=generator, dtype=torch.float64)
    acc = GroupStatsAccumulator(block_rows=block_rows, group_size=group_size, count_extremes=True)
    for start in range(0, r.numel(), 5):
        acc.update(r[start : start + 5])
    streamed = acc.compute(7)
    whole = group_stats(r, group_size=group_size, count_extremes=True)
    assert streamed.count.tolist() == [group_size] * 7
    assert torch.allclose(streamed.mean, whole.mean, rtol=1e-15, atol=0)
    assert torch.allclose(streamed.m2, whole.m2, rtol=1e-12, atol=1e-18)
    assert torch.equal(streamed.minimum, whole.minimum) and torch.equal(streamed.maximum, whole.maximum)


# --------------------------------------------------------------------------- engine


@pytest.mark.parametrize("memory_limit", [0, 1 << 30])
def test_group_size_groups_continue_across_shards(tmp_path, memory_limit):
    """Shard 2's rows form groups 2 and 3, not groups 0 and 1 again."""
    first = [{"reward": v} for v in (0.0, 1.0, 2.0, 5.0, 5.0, 5.0)]
    second = [{"reward": v} for v in (10.0, 30.0, 20.0, 7.0, 7.0, 8.0)]
    folder = tmp_path / "shards"
    folder.mkdir()
    write_parquet(folder / "a.parquet", first)
    write_parquet(folder / "b.parquet", second)
    config = ComputeConfig(group_size=3, group_cols=(), memory_budget_bytes=memory_limit, batch_rows=2)
    out = tmp_path / "out.parquet"
    summary = compute_dataset(folder, out, config)
    assert (summary.groups, summary.active_groups, summary.inactive_groups) == (4, 3, 1)
    values = [row["reward"] for row in first + second]
    expected, _ = reference_advantages(values, [i // 3 for i in range(12)])
    assert pq.read_table(out).column("advantage").to_pylist() == pytest.approx(expected, rel=1e-12)


def test_a_group_mean_exactly_at_the_range_ends_is_kept(tmp_path):
    groups = [[0.0, 0.5], [1.0, 1.0], [1.0, 2.0]]  # means 0.25 (= LO), 1.0 (= HI), 1.5
    rows = [{"group_id": g, "reward": r} for g, group in enumerate(groups) for r in group]
    path = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "out.parquet"
    summary = compute_dataset(path, out, ComputeConfig(keep_mean_range=(0.25, 1.0)))
    assert pq.read_table(out).column("group_id").to_pylist() == [0, 0, 1, 1]
    reason = "group mean reward outside [0.25, 1.0] (--keep-mean-range)"
    assert summary.dropped == {
        "groups": 1,
        "rows": 2,
        "reasons": [reason],
        "by_reason": [{"reason": reason, "groups": 1, "rows": 2}],
        "rows_written": 4,
    }


def test_a_difference_exactly_at_atol_passes_verification(tmp_path):
    # advantages of [0, 2] are exactly [-1, 1] with eps 1e-300; offsets of 2**-10 are exact
    atol = 2.0**-10
    rows = [
        {"group_id": 0, "reward": 0.0, "given": -1.0 + atol},
        {"group_id": 0, "reward": 2.0, "given": 1.0 + 2 * atol},
    ]
    path = write_parquet(tmp_path / "in.parquet", rows)
    advantage = AdvantageOptions.resolve(epsilon=1e-300)
    config = ComputeConfig(advantage=advantage, verify=VerifySpec("given", atol=atol, rtol=0.0))
    summary = check_dataset(path, CheckBounds(), config)
    assert summary.verify is not None
    assert (summary.verify["compared"], summary.verify["mismatched"]) == (2, 1)
    assert summary.verify["examples"][0]["row"] == 1


def test_group_size_checks_on_an_empty_dataset_pass_but_the_rows_check_fails(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    bounds = CheckBounds(min_group_size=2, max_group_size=8, uniform_group_size=True)
    summary = check_dataset(path, bounds)
    by_name = {c["name"]: c for c in summary.checks}
    assert by_name["rows"]["passed"] is False
    assert [by_name[n]["passed"] for n in ("min-group-size", "max-group-size", "uniform-group-size")] == [
        True,
        True,
        True,
    ]
    assert evaluate_checks(summary, CheckBounds()) == [by_name["rows"]]


# --------------------------------------------------------------------------- atomicity


def test_a_failed_forced_run_leaves_the_old_single_file_untouched(tmp_path, monkeypatch):
    rows = [{"group_id": i // 4, "reward": float(i % 3)} for i in range(40)]
    path = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "out.parquet"
    out.write_bytes(b"the user's previous output")
    calls = {"n": 0}
    real = reward_columns.new_column_arrays

    def fail_on_third_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr("grpo_cli.engines.local.engine.new_column_arrays", fail_on_third_batch)
    with pytest.raises(OSError, match="No space left"):
        compute_dataset(path, out, ComputeConfig(batch_rows=8), force=True)
    assert calls["n"] == 3  # two batches were written before the failure
    assert out.read_bytes() == b"the user's previous output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet", "out.parquet"]


def test_a_summary_that_cannot_be_moved_into_place_leaves_no_temporary(tmp_path, monkeypatch):
    rows = [{"group_id": i // 4, "reward": float(i % 3)} for i in range(16)]
    path = write_parquet(tmp_path / "in.parquet", rows)
    out, summary_path = tmp_path / "out.parquet", tmp_path / "summary.json"
    real_replace, real_link = os.replace, os.link

    def refuse_summary(move):
        def patched(src, dst, *args, **kwargs):
            if Path(dst).name == "summary.json":
                raise OSError(5, "Input/output error")
            return move(src, dst, *args, **kwargs)

        return patched

    monkeypatch.setattr(os, "replace", refuse_summary(real_replace))
    monkeypatch.setattr(os, "link", refuse_summary(real_link))
    with pytest.raises(GrpoError, match=r"summary\.json") as error:
        compute_dataset(path, out, summary_json=summary_path)
    assert error.value.exit_code == 3  # the data was written; the summary was not
    assert out.exists() and not summary_path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet", "out.parquet"]
    assert pa.Table.equals(pq.read_table(out).select(["group_id", "reward"]), pq.read_table(path))


@pytest.mark.parametrize(
    ("options"),
    [
        {"estimator": "reinforce_plus_plus_baseline"},
        {"estimator": "reinforce_baseline"},
        {"whiten": True},
        {"preset": "areal"},
        {"preset": "trl-rloo", "whiten": True},
        {"preset": "trl"},
    ],
)
def test_a_row_left_out_by_nan_ignore_keeps_advantage_zero_under_a_batch_transform(options):
    """``--nan ignore`` gives a left-out row advantage 0; a whitening shifts every other row
    by the batch mean, and used to shift that row too (to -mean / std: here about -0.37)."""
    import pyarrow as pa

    from grpo_cli import add_advantages

    table = pa.table({"g": [0, 0, 0, 1, 1, 1, 2], "reward": [1.0, 0.0, 1.0, 0.0, None, 1.0, 0.7]})
    out = add_advantages(table, group_col="g", nan="ignore", **options)
    advantages = out.column("advantage").to_pylist()
    assert advantages[4] == 0.0 and str(advantages[4]) == "0.0"
    assert any(a != 0.0 for a in advantages)
