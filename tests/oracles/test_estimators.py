"""The outcome estimators beyond GRPO, batch whitening, re-normalisation, clipping and
--batch-col, each checked against the trainer's own formula (tests/trainers.py) on random
groups (singletons and constant groups included), in memory and streaming."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli.errors import GrpoError
from grpo_cli.jobs import compute_dataset
from grpo_cli.options.advantage import AdvantageOptions, RewardSpec
from grpo_cli.options.config import ComputeConfig
from tests import trainers

MODES = {"in-memory": {}, "streaming": {"memory_budget_bytes": 0, "batch_rows": 7}}


Row = dict[str, Any]


def random_rows(seed: int, *, groups: int = 30, uniform: int | None = None, steps: int = 1) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for g in range(groups):
        size = uniform or rng.choice([1, 2, 3, 4, 8])
        kind = rng.random()
        for _ in range(size):
            correct = 1.0 if kind < 0.2 else float(rng.random() < 0.5)  # below 0.2: a constant group
            rows.append(
                {
                    "group_id": g,
                    "step": g % steps,
                    "correct": correct,
                    "score": round(rng.uniform(-1, 1), 3),
                    "fmt": 1.0 if kind < 0.2 else float(rng.random() < 0.7),
                    "length": rng.randint(1, 50),
                    "greedy": round(rng.uniform(-1, 1), 3),
                }
            )
    rng.shuffle(rows)
    return rows


def run(tmp_path, rows, mode, *, dtype=None, **config_kwargs):
    dtype = dtype or pa.float64()
    table = pa.Table.from_pylist(rows)
    for name in ("correct", "score", "fmt", "greedy"):
        if name in table.column_names:
            table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(dtype))
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    out = tmp_path / f"out-{mode}.parquet"
    summary = compute_dataset(path, out, ComputeConfig(**config_kwargs, **MODES[mode]), force=True)
    return pq.read_table(out).column("advantage").to_pylist(), summary


def by_group(rows, column="score"):
    order = sorted({r["group_id"] for r in rows})
    return [[r[column] for r in rows if r["group_id"] == g] for g in order], order


def in_row_order(rows, groups_out, order):
    """Reference values laid out group by group, back in the rows' order."""
    position = {g: iter(values) for g, values in zip(order, groups_out, strict=True)}
    return [next(position[r["group_id"]]) for r in rows]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("weighted", [False, True])
def test_reinforce_plus_plus_baseline_matches_verl(tmp_path, mode, seed, weighted):
    rows = random_rows(seed)
    lengths = [r["length"] if weighted else 1 for r in rows]
    expected = trainers.verl_reinforce_plus_plus_baseline(
        [r["score"] for r in rows], [r["group_id"] for r in rows], lengths
    )
    got, _ = run(
        tmp_path,
        rows,
        mode,
        rewards=(RewardSpec("score"),),
        advantage=AdvantageOptions.resolve(estimator="reinforce_plus_plus_baseline"),
        length_col="length" if weighted else None,
    )
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weighted", [False, True])
def test_reinforce_baseline_matches_openrlhf(tmp_path, mode, weighted):
    rows = random_rows(3, uniform=4)
    groups, order = by_group(rows)
    lengths_by_group, _ = by_group(rows, "length")
    flat_lengths = [n if weighted else 1 for group in lengths_by_group for n in group]
    expected_flat = trainers.openrlhf_reinforce_baseline(groups, flat_lengths)
    sizes = [len(g) for g in groups]
    chunks, start = [], 0
    for size in sizes:
        chunks.append(expected_flat[start : start + size])
        start += size
    expected = in_row_order(rows, chunks, order)
    # grpo-cli reads the rows in file order: give it the same per-row values the reference used
    got, _ = run(
        tmp_path,
        rows,
        mode,
        rewards=(RewardSpec("score"),),
        advantage=AdvantageOptions.resolve(estimator="reinforce_baseline"),
        length_col="length" if weighted else None,
    )
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("mode", MODES)
def test_gpg_matches_verl(tmp_path, mode):
    rows = random_rows(4)
    expected = trainers.verl_gpg([r["correct"] for r in rows], [r["group_id"] for r in rows], f_norm=2.0)
    got, _ = run(
        tmp_path,
        rows,
        mode,
        rewards=(RewardSpec("correct"),),
        advantage=AdvantageOptions.resolve(estimator="gpg", gpg_f_norm=2.0),
    )
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_remax_matches_verl(tmp_path, mode):
    rows = random_rows(5)
    expected = trainers.verl_remax([r["score"] for r in rows], [r["greedy"] for r in rows])
    got, _ = run(
        tmp_path,
        rows,
        mode,
        rewards=(RewardSpec("score"),),
        advantage=AdvantageOptions.resolve(estimator="remax"),
        baseline_col="greedy",
    )
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_trl_normalize_then_sum_renormalises_over_the_batch(tmp_path, mode):
    rows = sorted(random_rows(6, uniform=4), key=lambda r: r["group_id"])  # TRL: groups contiguous
    weights = [1.0, 0.5]
    expected = trainers.trl_normalize_then_sum([[r["correct"], r["fmt"]] for r in rows], weights, 4)
    got, _ = run(
        tmp_path,
        rows,
        mode,
        rewards=(RewardSpec("correct", 1.0), RewardSpec("fmt", 0.5)),
        aggregation="normalize-then-sum",
        advantage=AdvantageOptions.resolve(preset="trl"),
    )
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)
    constant = {
        g
        for g in {r["group_id"] for r in rows}
        if len({(r["correct"], r["fmt"]) for r in rows if r["group_id"] == g}) == 1
    }
    assert constant  # the exact mean of the summed advantages is 0: constant groups stay +0.0
    assert all(a == 0.0 for a, r in zip(got, rows, strict=True) if r["group_id"] in constant)


@pytest.mark.parametrize("mode", MODES)
def test_nemo_rl_gdpo_renormalises_over_the_batch(tmp_path, mode):
    rows = random_rows(7)
    weights = [1.0, 0.25]
    expected = trainers.nemo_rl_gdpo(
        [[r["correct"], r["fmt"]] for r in rows], [r["group_id"] for r in rows], weights
    )
    got, _ = run(
        tmp_path,
        rows,
        mode,
        rewards=(RewardSpec("correct", 1.0), RewardSpec("fmt", 0.25)),
        aggregation="normalize-then-sum",
        advantage=AdvantageOptions.resolve(preset="nemo-rl"),
    )
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("mode", MODES)
def test_whiten_and_clip_as_roll_does(tmp_path, mode):
    rows = random_rows(8)
    groups, order = by_group(rows)
    grpo = in_row_order(rows, trainers.roll(groups), order)
    grpo = trainers.constant_zero_rows(rows, grpo)
    grpo = [0.0 if a != a else a for a in grpo]  # a singleton: NaN in ROLL, 0 in grpo-cli
    whitened = trainers.verl_whiten(grpo, [r["length"] for r in rows])
    expected = [min(max(a, -1.5), 1.5) for a in whitened]
    got, _ = run(
        tmp_path,
        rows,
        mode,
        rewards=(RewardSpec("score"),),
        advantage=AdvantageOptions.resolve(preset="roll", whiten="unbiased", clip=(-1.5, 1.5)),
        length_col="length",
    )
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert min(got) >= -1.5 and max(got) <= 1.5


@pytest.mark.parametrize("mode", MODES)
def test_batch_col_takes_each_batchs_statistics(tmp_path, mode):
    """Per step: the same values as running each step's rows on their own."""
    rows = random_rows(9, steps=3)
    options = {"rewards": (RewardSpec("correct"),), "advantage": AdvantageOptions.resolve(estimator="gpg")}
    got, summary = run(tmp_path, rows, mode, batch_col="step", **options)
    alphas = set()
    for step in range(3):
        part = [r for r in rows if r["step"] == step]
        alphas.add(len(part) / sum(r["correct"] != 0 for r in part))
        expected = trainers.verl_gpg([r["correct"] for r in part], [r["group_id"] for r in part])
        assert [a for a, r in zip(got, rows, strict=True) if r["step"] == step] == pytest.approx(
            expected, rel=1e-12, abs=1e-12
        )
    assert summary.options["batch_col"] == "step"
    assert len(alphas) == 3  # each step has its own alpha


def test_batch_scale_per_batch(tmp_path):
    rows = random_rows(10, steps=2)
    options = AdvantageOptions.resolve(preset="trl", scale="batch")
    got, _ = run(
        tmp_path, rows, "in-memory", rewards=(RewardSpec("score"),), advantage=options, batch_col="step"
    )
    for step in range(2):
        part = [r for r in rows if r["step"] == step]
        groups, order = by_group(part)
        expected = in_row_order(part, trainers.trl(groups, scale="batch"), order)
        expected = trainers.constant_zero_rows(part, expected)
        assert [a for a, r in zip(got, rows, strict=True) if r["step"] == step] == pytest.approx(
            expected, rel=1e-9, abs=1e-12
        )


def test_a_group_in_two_batches_is_refused(tmp_path):
    rows = [
        {"group_id": 0, "step": 0, "score": 1.0},
        {"group_id": 0, "step": 1, "score": 0.0},
    ]
    with pytest.raises(GrpoError, match="a group spans two values of --batch-col 'step'"):
        run(tmp_path, rows, "in-memory", rewards=(RewardSpec("score"),), batch_col="step")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"advantage": AdvantageOptions.resolve(estimator="remax")}, "needs --baseline-col"),
        ({"baseline_col": "greedy"}, "add --estimator remax"),
        ({"length_col": "length"}, "--length-col weights the batch whitening"),
    ],
)
def test_column_options_that_do_not_fit_are_refused(tmp_path, kwargs, message):
    rows = random_rows(11)
    with pytest.raises(GrpoError, match=message):
        run(tmp_path, rows, "in-memory", rewards=(RewardSpec("score"),), **kwargs)


def test_float32_rewards_match_to_float32_rounding(tmp_path):
    rows = random_rows(12)
    expected = trainers.verl_reinforce_plus_plus_baseline(
        [float(pa.scalar(r["score"], pa.float32()).as_py()) for r in rows],
        [r["group_id"] for r in rows],
        [r["length"] for r in rows],
    )
    got, _ = run(
        tmp_path,
        rows,
        "streaming",
        dtype=pa.float32(),
        rewards=(RewardSpec("score"),),
        advantage=AdvantageOptions.resolve(estimator="reinforce_plus_plus_baseline"),
        length_col="length",
    )
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_estimators_through_the_cli(cli, tmp_path):
    rows = random_rows(13, steps=2)
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    out = tmp_path / "out.parquet"
    args = ["-r", "score", "--estimator", "reinforce_plus_plus_baseline", "--length-col", "length"]
    result = cli(
        "compute", path, "-o", out, *args, "--batch-col", "step", "--clip-advantage", "-2", "2", "-q"
    )
    assert result.exit_code == 0, result.stderr
    expected = []
    for step in range(2):
        part = [r for r in rows if r["step"] == step]
        values = trainers.verl_reinforce_plus_plus_baseline(
            [r["score"] for r in part], [r["group_id"] for r in part], [r["length"] for r in part]
        )
        expected.append(iter(values))
    expected_rows = [min(max(next(expected[r["step"]]), -2.0), 2.0) for r in rows]
    assert pq.read_table(out).column("advantage").to_pylist() == pytest.approx(
        expected_rows, rel=1e-9, abs=1e-9
    )
    summary = cli("check", out, *args, "--batch-col", "step", "--summary-json", "-", "-q")
    assert json.loads(summary.stdout)["options"]["whiten"] == "unbiased"


@pytest.mark.parametrize("mode", MODES)
def test_opo_matches_verl(tmp_path, mode):
    rows = random_rows(15)
    expected = trainers.verl_opo(
        [r["score"] for r in rows], [r["group_id"] for r in rows], [r["length"] for r in rows]
    )
    got, _ = run(
        tmp_path,
        rows,
        mode,
        rewards=(RewardSpec("score"),),
        advantage=AdvantageOptions.resolve(estimator="opo"),
        length_col="length",
    )
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale", ["group", "none"])
@pytest.mark.parametrize("reward", ["correct", "score"])
def test_grpo_passk_matches_verl(tmp_path, mode, scale, reward):
    rows = random_rows(16)
    expected = trainers.verl_grpo_passk(
        [r[reward] for r in rows], [r["group_id"] for r in rows], norm=scale == "group"
    )
    got, _ = run(
        tmp_path,
        rows,
        mode,
        rewards=(RewardSpec(reward),),
        advantage=AdvantageOptions.resolve(estimator="grpo_passk", scale=scale),
    )
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert sum(a != 0 for a in got) <= len({r["group_id"] for r in rows})  # one row per group at most


def test_grpo_passk_gives_the_first_best_row_its_advantage(tmp_path):
    rows = [{"group_id": 0, "score": v} for v in (0.2, 0.9, 0.5, 0.9)] + [
        {"group_id": 1, "score": v} for v in (0.1, 0.7, 0.3)
    ]
    got, _ = run(
        tmp_path,
        rows,
        "streaming",
        rewards=(RewardSpec("score"),),
        advantage=AdvantageOptions.resolve(estimator="grpo_passk", scale="none"),
    )
    assert got == pytest.approx([0.0, 0.0, 0.0, 0.0, 0.0, 0.4, 0.0], abs=1e-15)  # a tie at the top: 0


def _f32(value: float) -> float:
    return float(pa.scalar(value, pa.float32()).as_py())


ESTIMATOR_CASES = {
    "reinforce_plus_plus_baseline": (
        {"length_col": "length"},
        lambda rows, r: trainers.verl_reinforce_plus_plus_baseline(
            r, [x["group_id"] for x in rows], [x["length"] for x in rows]
        ),
    ),
    "gpg": ({}, lambda rows, r: trainers.verl_gpg(r, [x["group_id"] for x in rows])),
    "remax": (
        {"baseline_col": "greedy"},
        lambda rows, r: trainers.verl_remax(r, [x["greedy"] for x in rows]),
    ),
    "opo": (
        {"length_col": "length"},
        lambda rows, r: trainers.verl_opo(r, [x["group_id"] for x in rows], [x["length"] for x in rows]),
    ),
    "grpo_passk": ({}, lambda rows, r: trainers.verl_grpo_passk(r, [x["group_id"] for x in rows])),
}


@pytest.mark.parametrize("estimator", ESTIMATOR_CASES)
@pytest.mark.parametrize("mode", MODES)
def test_each_estimator_on_float32_rewards(tmp_path, estimator, mode):
    """float32 rewards: the reference on the same float32 values, to float32 rounding."""
    columns, reference = ESTIMATOR_CASES[estimator]
    rows = random_rows(17)
    if estimator == "remax":  # the baseline column is float32 too
        rows = [{**r, "greedy": _f32(r["greedy"])} for r in rows]
    expected = reference(rows, [_f32(r["score"]) for r in rows])
    got, _ = run(
        tmp_path,
        rows,
        mode,
        dtype=pa.float32(),
        rewards=(RewardSpec("score"),),
        advantage=AdvantageOptions.resolve(estimator=estimator),
        **columns,
    )
    assert got == pytest.approx(expected, rel=2e-6, abs=2e-6)


@pytest.mark.parametrize("estimator", ESTIMATOR_CASES)
def test_each_estimator_through_the_cli(cli, tmp_path, estimator):
    columns, reference = ESTIMATOR_CASES[estimator]
    rows = random_rows(18)
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    options = [f"--{name.replace('_', '-')}" for name in columns]
    args = [arg for option, value in zip(options, columns.values(), strict=True) for arg in (option, value)]
    out = tmp_path / "out.parquet"
    result = cli("compute", path, "-o", out, "-r", "score", "--estimator", estimator, *args, "-q")
    assert result.exit_code == 0, result.stderr
    expected = reference(rows, [r["score"] for r in rows])
    assert pq.read_table(out).column("advantage").to_pylist() == pytest.approx(
        expected, rel=1e-9, abs=1e-9
    )  # verl divides by tokens + 1e-8


@pytest.mark.parametrize("estimator", ["opo", "reinforce_plus_plus_baseline"])
def test_a_bad_length_is_one_line_naming_the_row(cli, tmp_path, estimator):
    rows = random_rows(19)
    rows[5]["length"] = None
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    out = tmp_path / "out.parquet"
    result = cli(
        "compute", path, "-o", out, "-r", "score", "--estimator", estimator, "--length-col", "length"
    )
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {path}, row 5: --length-col 'length' is nan; lengths must be finite and >= 0"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("estimator", "extra"),
    [
        ("reinforce_plus_plus_baseline", {}),
        ("reinforce_baseline", {}),
        ("gpg", {}),
        ("remax", {"baselines": [[0.5, 0.0, 0.5, 1.0]]}),
        ("opo", {"lengths": [[3.0, 1.0, 2.0, 2.0]]}),
        ("grpo_passk", {}),
    ],
)
def test_the_tensor_api_computes_the_estimators_it_once_got_wrong(estimator, extra):
    """It returned r - mean for each of these (plain GRPO for grpo_passk), silently; then it
    refused them; now it computes each as the table API (the CLI's engine) does."""
    from grpo_cli import add_advantages, group_advantages

    rewards = [1.0, 0.0, 0.5, 0.0]
    tensors = {name: torch.tensor(values, dtype=torch.float64) for name, values in extra.items()}
    got = group_advantages(torch.tensor([rewards], dtype=torch.float64), estimator=estimator, **tensors)
    columns = {"group_id": [0] * 4, "reward": rewards}
    keywords = {}
    for name, column in (("baselines", "baseline"), ("lengths", "length")):
        if name in extra:
            columns[column] = extra[name][0]
            keywords[f"{column}_col"] = column
    table = add_advantages(pa.table(columns), estimator=estimator, **keywords)
    assert got["advantages"][0].tolist() == table.column("advantage").to_pylist()
    assert got["advantages"][0].tolist() != [0.625, -0.375, 0.125, -0.375]  # r - mean


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_the_tensor_api_matches_the_table_api_where_it_computes(estimator):
    from grpo_cli import add_advantages, group_advantages

    rewards = [1.0, 0.0, 0.5, 0.0, 0.25, 0.75, 0.75, 0.0]
    grouped = torch.tensor([rewards[:4], rewards[4:]], dtype=torch.float64)
    tensor = group_advantages(grouped, estimator=estimator)
    table = add_advantages(pa.table({"group_id": [0] * 4 + [1] * 4, "reward": rewards}), estimator=estimator)
    assert tensor["advantages"].flatten().tolist() == table.column("advantage").to_pylist()


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus_baseline", "reinforce_baseline"])
def test_whitened_advantages_do_not_depend_on_the_record_batch_size(estimator):
    """The batch moments were merged per record batch: --batch-rows moved the last bit."""
    from grpo_cli import add_advantages

    rng = np.random.default_rng(5)
    table = pa.table(
        {
            "group_id": np.repeat(np.arange(40), 5),
            "reward": rng.normal(0, 1, 200),
            "length": rng.integers(1, 60, 200),
        }
    )
    results = [
        add_advantages(table, estimator=estimator, length_col="length", batch_rows=rows)
        .column("advantage")
        .to_numpy()
        .view(np.uint64)
        for rows in (None, 1, 7, 64)
    ]
    for other in results[1:]:
        assert np.array_equal(other, results[0])


def test_opo_baselines_do_not_depend_on_the_record_batch_size(monkeypatch):
    """OPO's length-weighted sums were folded per key chunk, and a chunk ends at the first record
    batch past its size: --batch-rows moved the last bits of 1.44 of 1.5 million advantages. They
    now fold at the statistics blocks' rows, as the group statistics do."""
    from grpo_cli import add_advantages
    from grpo_cli.engines import local

    monkeypatch.setattr(local.statistics, "MIN_KEY_CHUNK_ROWS", 50)
    monkeypatch.setattr(local.statistics, "KEY_CHUNK_ROWS", 50)
    rng = np.random.default_rng(8)
    n = 3000
    table = pa.table(
        {
            "group_id": rng.integers(0, 3, n),
            "reward": rng.random(n) * 10.0 ** rng.integers(-8, 8, n),
            "length": rng.integers(1, 5000, n),
        }
    )
    results = [
        add_advantages(table, estimator="opo", length_col="length", batch_rows=rows)
        .column("advantage")
        .to_numpy()
        .view(np.uint64)
        for rows in (None, 7, 64, 997)
    ]
    for other in results[1:]:
        assert np.array_equal(other, results[0])


def test_grpo_passk_credits_each_groups_first_best_row_across_key_chunks(monkeypatch):
    """grpo_passk's top two are a pass-1 figure folded a key chunk at a time: a group whose best
    row comes in a later chunk must still credit that row (its place in the whole input, not in
    its chunk), and only it."""
    from grpo_cli import add_advantages
    from grpo_cli.engines import local

    monkeypatch.setattr(local.statistics, "MIN_KEY_CHUNK_ROWS", 50)
    monkeypatch.setattr(local.statistics, "KEY_CHUNK_ROWS", 50)
    rng = np.random.default_rng(11)
    n = 1000
    groups = rng.integers(0, 7, n)  # every group spans every chunk
    rewards = rng.random(n)
    rewards[[0, 1]] = 0.0  # a NaN row would be left out of the top two; a tie is not wanted here
    table = pa.table({"group_id": groups, "reward": rewards})
    for rows in (None, 13):
        advantages = (
            add_advantages(table, estimator="grpo_passk", batch_rows=rows).column("advantage").to_numpy()
        )
        best = {int(np.flatnonzero(groups == g)[np.argmax(rewards[groups == g])]) for g in range(7)}
        assert set(np.flatnonzero(advantages).tolist()) == best
