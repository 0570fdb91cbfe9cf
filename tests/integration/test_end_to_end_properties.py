"""A whole run against the slow float64 reference, over drawn inputs and options.

Each example writes a small rollout dataset in a drawn format and layout (Parquet with small
row groups, a folder of Parquet shards, JSON lines, CSV), with drawn key and reward types,
bad rewards and reward options, runs ``compute`` through the library entry (readers, key
index, both passes, the writer), and checks what a user reads back: each row's advantage
against :func:`tests.reference.reference_advantages` (within the rounding of the reference's
exact sums against the kernel's left folds), each group's mask, the rows kept and their order,
the input columns unchanged, the summary's counts and reward figures, and ``check``'s
advantage range against ``compute``'s. This differential run found a JSON lines shard of only
null rewards refused as a type error.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_cli.errors import GrpoError
from grpo_cli.jobs import check_dataset, compute_dataset
from grpo_cli.options.advantage import AdvantageOptions
from grpo_cli.options.checks import CheckBounds
from grpo_cli.options.config import ComputeConfig
from tests.conftest import REWARD_SHAPINGS, rollout_cases, write_case
from tests.reference import reference_advantages


def _rewards_as_read(path: Path, case: dict[str, Any], table: pa.Table) -> list[float | None]:
    """The rewards as grpo-cli reads them: a text format's numbers are its text's."""
    if case["format"] == "jsonl":
        column = pa_json.read_json(path).column("reward")
    elif case["format"] == "csv":
        column = pa_csv.read_csv(path).column("reward")
    else:
        column = table.column("reward")
    return [None if v is None else float(v) for v in column.to_pylist()]


def _allowed(
    expected: float, group: list[float], divisor: float, dtype: np.dtype, cancel: float = 1.0
) -> float:
    """The distance allowed from the reference: a few ulps of the output dtype, and the
    rounding of a mean of the group's magnitude (the reference's sums are exact, the kernel's
    are left folds) divided by the divisor. ``cancel`` (leave-one-out): the group's M2 over the
    others', by which the reverse update magnifies the M2's rounding."""
    ulps = 8 * float(np.spacing(np.abs(np.array(expected, dtype=dtype))))
    largest = max(abs(v) for v in group)
    return ulps + 64 * 2.3e-16 * (largest / max(divisor, 1e-6) + abs(expected) * cancel)


def _m2(values: list[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values)


def _shaped(reward: float, shaping: dict[str, Any]) -> float:
    """``(r + bias) * scale``, then the clamp, in float64 as the README gives them."""
    value = (reward + shaping.get("reward_bias", 0.0)) * shaping.get("reward_scale", 1.0)
    low, high = shaping.get("reward_clip", (-math.inf, math.inf))
    return float(min(max(value, low), high))


EXAMPLES = int(os.environ.get("GRPO_PROPERTY_EXAMPLES", "40"))  # more for a differential fuzz


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=rollout_cases(),
    std=st.sampled_from(["population", "sample"]),
    scale=st.sampled_from(["group", "batch", "none"]),
    baseline=st.sampled_from(["mean", "leave-one-out"]),
    epsilon=st.sampled_from([1e-6, 1e-4, 0.5]),
    clip=st.sampled_from([None, (-1.0, 1.0), (-0.25, 3.0)]),
    shaping=st.sampled_from(REWARD_SHAPINGS),
    tolerance=st.sampled_from([0.0, 0.3]),
    epsilon_mode=st.sampled_from(["add", "clamp", "add-if-nonzero"]),
    singleton=st.sampled_from(["zero", "raw"]),
    nan=st.sampled_from(["error", "ignore"]),
    batch_rows=st.sampled_from([None, 1, 5]),
    streaming=st.booleans(),
    stats_block_rows=st.sampled_from([3, 16, 1 << 22]),
    drop_inactive=st.booleans(),
)
def test_a_run_gives_the_references_advantages_masks_rows_and_summary(
    tmp_path_factory: pytest.TempPathFactory,
    case: dict[str, Any],
    std: str,
    scale: str,
    baseline: str,
    epsilon: float,
    clip: tuple[float, float] | None,
    shaping: dict[str, Any],
    tolerance: float,
    epsilon_mode: str,
    singleton: str,
    nan: str,
    batch_rows: int | None,
    streaming: bool,
    stats_block_rows: int,
    drop_inactive: bool,
) -> None:
    tmp = tmp_path_factory.mktemp("run")
    source, table = write_case(tmp, case)
    config = ComputeConfig(
        group_cols=("uid",),
        advantage=AdvantageOptions(
            std=std,
            scale=scale,
            baseline=baseline,
            epsilon=epsilon,
            clip=clip,
            epsilon_mode=epsilon_mode,
            singleton=singleton,
            nan=nan,
            inactive_tolerance=tolerance,
            **shaping,
        ),
        batch_rows=batch_rows,
        memory_budget_bytes=0 if streaming else 1 << 30,
        stats_block_rows=stats_block_rows,
        drop_inactive=drop_inactive,
    )
    rewards = _rewards_as_read(source, case, table)
    valid = [v is not None and math.isfinite(v) for v in rewards]
    rewards = [_shaped(v, shaping) if ok else v for v, ok in zip(rewards, valid, strict=True)]  # type: ignore[arg-type]
    out = tmp / ("out" if case["format"] == "shards" else "out.parquet")
    if nan == "error" and not all(valid):
        with pytest.raises(GrpoError, match="null, NaN or infinite"):
            compute_dataset(source, out, config)
        assert not out.exists()
        return
    summary = compute_dataset(source, out, config)
    files = sorted(out.glob("*.parquet")) if out.is_dir() else [out]
    got = pa.concat_tables([pq.read_table(f) for f in files], promote_options="permissive")

    rows_of = case["rows_of"]
    expected, active = reference_advantages(
        [v if ok else 0.0 for v, ok in zip(rewards, valid, strict=True)],  # type: ignore[misc]
        rows_of,
        std=std,
        epsilon=epsilon,
        scale=scale,
        baseline=baseline,
        epsilon_mode=epsilon_mode,
        singleton=singleton,
        valid=valid,
    )
    for g in set(rows_of) if tolerance else ():  # a group spanning at most T is inactive
        spanned = [float(rewards[i]) for i in range(len(rows_of)) if rows_of[i] == g and valid[i]]  # type: ignore[arg-type]
        if len(spanned) > 1 and max(spanned) - min(spanned) <= tolerance:
            active[g] = False
            expected = [0.0 if rows_of[i] == g else e for i, e in enumerate(expected)]
    if clip is not None:
        expected = [min(max(value, clip[0]), clip[1]) for value in expected]
    kept = [i for i in range(len(rows_of)) if not drop_inactive or active.get(rows_of[i], False)]
    assert [int(r[1:]) for r in got.column("row").to_pylist()] == kept  # the rows kept, in order
    if case["format"] in ("parquet", "shards"):
        for name in table.column_names:
            before = table.column(name).take(pa.array(kept, pa.int64())).to_pylist()
            after = got.column(name).to_pylist()
            assert all(a == b or (a != a and b != b) for a, b in zip(before, after, strict=True)), name

    members: dict[int, list[float]] = {}
    for i, g in enumerate(rows_of):
        if valid[i]:
            members.setdefault(g, []).append(rewards[i])  # type: ignore[arg-type]
    ddof = 1 if std == "sample" else 0
    everything = [v for vs in members.values() for v in vs]
    batch_sd = float(np.std(everything, ddof=ddof)) if len(everything) > ddof else 0.0
    advantages = got.column("advantage").to_numpy(zero_copy_only=False)
    masks = got.column("group_active").to_pylist()
    for place, i in enumerate(kept):
        g = rows_of[i]
        assert masks[place] == active.get(g, False), (i, g)
        if not valid[i]:
            assert advantages[place] == 0.0
            continue
        group = members[g]
        spread, cancel = group, 1.0
        own = float(rewards[i])  # type: ignore[arg-type]
        if baseline == "leave-one-out" and len(group) > 1:
            spread = list(group)
            spread.remove(own)
            lone = group.count(own) == 1 and own in (min(group), max(group))
            # a lone extreme is divided by its others' own statistics; the rest by the reverse update
            cancel = 1.0 if lone else _m2(group) / max(_m2(spread), 1e-300)
        divisor = {"none": 1.0, "batch": batch_sd}.get(
            scale, float(np.std(spread, ddof=ddof)) if len(spread) > ddof else 0.0
        )
        allowed = _allowed(expected[i], group, divisor, advantages.dtype, cancel)
        assert abs(float(advantages[place]) - expected[i]) <= allowed, (
            i,
            float(advantages[place]),
            expected[i],
        )

    sizes = [rows_of.count(g) for g in sorted(set(rows_of))]
    assert (summary.groups, summary.active_groups) == (
        len(sizes),
        sum(active.get(g, False) for g in set(rows_of)),
    )
    assert (summary.rows, summary.nan_rewards, summary.singleton_groups) == (
        len(rows_of),
        valid.count(False),
        sizes.count(1),
    )
    assert (summary.group_size["min"], summary.group_size["max"]) == (min(sizes), max(sizes))
    if everything:
        assert (summary.reward["min"], summary.reward["max"]) == (min(everything), max(everything))
        mean, got_mean = math.fsum(everything) / len(everything), summary.reward["mean"]
        assert got_mean is not None and abs(got_mean - mean) <= 1e-12 * max(abs(v) for v in everything)
    if not drop_inactive:
        checked = check_dataset(source, CheckBounds(), config)
        assert checked.advantage == summary.advantage  # from the statistics where it can be
        if advantages.size:
            assert (float(advantages.min()), float(advantages.max())) == (
                summary.advantage["min"],
                summary.advantage["max"],
            )
