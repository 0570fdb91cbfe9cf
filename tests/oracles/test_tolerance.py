"""``--inactive-tolerance T``: a group spanning at most T is inactive, its advantages +0.0;
checked against SkyRL's own ``zero_variance_filter`` (cut from its source), and the exact rule
left bit for bit as it was."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from grpo_cli import add_advantages, summarize
from grpo_cli.kernel import (
    active_groups,
    advantages_from_stats,
    apply_normalization,
    group_stats,
    prepare_normalization,
)
from tests.conftest import assert_one_line_error, bits
from tests.trainer_source import _function, source

SKYRL = ("NovaSky-AI/SkyRL", "a9564572eb8e91076be43c1bd5e4615e3de17265")


def judge_groups(seed: int, groups: int = 400) -> tuple[list[float], list[str]]:
    """LLM-judge-like rewards: groups that differ by float noise, by a little, or by a lot."""
    rng = random.Random(seed)
    rewards: list[float] = []
    uids: list[str] = []
    for g in range(groups):
        size = rng.choice((1, 2, 3, 4, 8))
        base = rng.choice((0.0, 0.1, 0.7, 1 / 3, 0.5))
        spread = rng.choice((0.0, 1e-9, 5e-7, 1e-6, 2e-6, 1e-3, 0.2))
        for _ in range(size):
            rewards.append(base + rng.choice((0.0, 1.0)) * spread)
            uids.append(f"u{g}")
    return rewards, uids


@pytest.mark.parametrize("tol", [0.0, 1e-6, 1e-3])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_inactive_decision_is_skyrls_zero_variance_filter(tol: float, seed: int) -> None:
    namespace: dict[str, Any] = {"defaultdict": defaultdict, "List": list, "Optional": Any}
    exec(_function(source(SKYRL, "skyrl/train/utils/trainer_utils.py"), "zero_variance_filter"), namespace)
    rewards, uids = judge_groups(seed)
    kept = set(namespace["zero_variance_filter"](rewards, uids, tol=tol))
    summary_table = add_advantages(pa.table({"group_id": uids, "reward": rewards}), inactive_tolerance=tol)
    active = summary_table.column("group_active").to_pylist()
    sizes: dict[str, int] = defaultdict(int)
    for uid in uids:
        sizes[uid] += 1
    for row, uid in enumerate(uids):
        if sizes[uid] > 1:  # SkyRL keeps a group of one; grpo-cli calls it inactive (no signal)
            assert (row in kept) == active[row], (uid, tol)


def test_groups_within_the_tolerance_get_exact_zeros_and_the_others_are_unchanged() -> None:
    rewards, uids = judge_groups(7)
    table = pa.table({"group_id": uids, "reward": rewards})
    exact = add_advantages(table)
    tolerant = add_advantages(table, inactive_tolerance=1e-6)
    ours, theirs = tolerant.column("advantage").to_numpy(), exact.column("advantage").to_numpy()
    inactive = ~np.array(tolerant.column("group_active").to_pylist())
    assert (bits(ours[inactive]) == bits(np.zeros(inactive.sum()))).all()  # +0.0, not -0.0
    assert (bits(ours[~inactive]) == bits(theirs[~inactive])).all()
    assert add_advantages(table, inactive_tolerance=0.0).equals(exact)


@pytest.mark.parametrize("baseline", ["mean", "leave-one-out"])
def test_the_kernel_zeroes_tolerated_groups_with_ids_and_with_a_group_size(baseline: str) -> None:
    r = torch.tensor([1.0, 0.0, 0.5, 0.5000001, 0.2, 0.2], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    stats = group_stats(r, ids, count_extremes=True)
    norm = prepare_normalization(stats, baseline=baseline, inactive_tolerance=1e-6)
    by_ids = apply_normalization(r, ids, norm)
    by_size = apply_normalization(r, None, norm, group_size=2)
    assert by_ids.tolist() == by_size.tolist()
    assert by_ids[2:].tolist() == [0.0] * 4 and by_ids[0] != 0
    assert active_groups(stats, tolerance=1e-6).tolist() == [True, False, False]
    exact = advantages_from_stats(r, ids, stats, baseline=baseline)
    assert exact[2] != 0


def test_the_summary_states_the_tolerance_and_the_groups_it_made_inactive(cli: Any, tmp_path: Any) -> None:
    import json

    import pyarrow.parquet as pq

    rewards, uids = judge_groups(5)
    path = tmp_path / "judge.parquet"
    pq.write_table(pa.table({"group_id": uids, "reward": rewards}), path)
    result = cli(
        "check",
        path,
        "--inactive-tolerance",
        "1e-6",
        "--summary-json",
        tmp_path / "s.json",
        "--by",
        "group_id",
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads((tmp_path / "s.json").read_text())
    exact = summarize(pa.table({"group_id": uids, "reward": rewards}))
    beyond = record["inactive_tolerance"]["groups_beyond_exact"]
    assert record["inactive_tolerance"]["tolerance"] == 1e-6
    assert beyond == record["inactive_groups"] - exact.inactive_groups > 0
    assert sum(v["inactive_with_spread"] for v in record["by"]["group_id"]) == beyond
    assert f"  within the tolerance     {beyond:,} (span <= 1e-06" in result.stderr
    assert record["options"]["inactive_tolerance"] == 1e-6


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_tolerance_is_refused_in_one_line(value: str, cli: Any, parquet_file: Any) -> None:
    assert_one_line_error(
        cli("check", parquet_file, "--inactive-tolerance", value),
        "--inactive-tolerance must be a finite number >= 0",
    )


def test_an_estimator_with_its_own_baseline_refuses_a_tolerance(cli: Any, parquet_file: Any) -> None:
    assert_one_line_error(
        cli(
            "check",
            parquet_file,
            "--inactive-tolerance",
            "1e-6",
            "--estimator",
            "remax",
            "--baseline-col",
            "reward",
        ),
        "--estimator remax subtracts a baseline of its own",
    )
