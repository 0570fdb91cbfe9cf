"""``--estimator pass_at_k --pass-k K``: PKPO (arXiv:2505.15201), against brute force.

The estimator's only trainer implementation, rllm PR #743, is an open pull request whose code
is not in the fetched rllm snapshot (rllm-org/rllm 9beb6e0f has no ``pkpo``). So it is tested
against its definition, enumerated: every k-subset of the group, the subset's maximum reward,
the credit of each rollout the subset holds, in exact fractions; against the paper's closed
form for binary rewards (Theorem 2: a correct rollout's credit is k/n, an incorrect one's
(k/n) rho(n-1, c, k-1)); and against the pull request's own worked example (n=4, c=2, k=2:
+-1/12).
"""

from __future__ import annotations

import itertools
import json
import random
from fractions import Fraction
from math import comb
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli import add_advantages, group_advantages
from grpo_cli.kernel import pass_at_k_advantages
from tests.conftest import assert_one_line_error, bits


def brute_force(rewards: list[float], k: int) -> list[Fraction]:
    """Each rollout's PKPO advantage, by enumerating the k-subsets, in exact fractions."""
    n = len(rewards)
    k = min(max(k, 1), n)
    credit = [Fraction(0)] * n
    for subset in itertools.combinations(range(n), k):
        best = max(Fraction(rewards[j]) for j in subset)
        for i in subset:
            credit[i] += best
    credit = [Fraction(c, comb(n, k)) for c in credit]
    mean = sum(credit, Fraction(0)) / n
    return [c - mean for c in credit]


def random_groups(seed: int, count: int = 400) -> list[list[float]]:
    """Binary, few-valued (ties), continuous and constant groups of uneven size, singletons."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.choice((1, 2, 3, 4, 5, 6, 8, 9))
        kind = rng.random()
        if kind < 0.35:
            values = [float(rng.random() < rng.random()) for _ in range(n)]
        elif kind < 0.6:
            values = [rng.choice((0.0, 0.25, 0.5, 1.0)) for _ in range(n)]
        elif kind < 0.85:
            values = [rng.uniform(-2, 3) for _ in range(n)]
        else:
            values = [rng.choice((0.1, 0.7, 1.0))] * n
        out.append(values)
    return out


def shuffled_table(groups: list[list[float]], dtype: Any, seed: int) -> pa.Table:
    rows = [(g, v) for g, values in enumerate(groups) for v in values]
    random.Random(seed).shuffle(rows)
    return pa.table(
        {
            "group_id": pa.array([g for g, _ in rows], pa.int64()),
            "reward": pa.array(np.array([v for _, v in rows], dtype=dtype)),
        }
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 7, 12])
def test_every_rollouts_advantage_is_the_enumerated_one(dtype: Any, k: int) -> None:
    groups = random_groups(k)
    table = shuffled_table(groups, dtype, seed=k)
    out = add_advantages(table, estimator="pass_at_k", pass_k=k)
    rewards = table.column("reward").to_numpy()
    ids = table.column("group_id").to_numpy()
    ours = out.column("advantage").to_numpy()
    worst = 0.0
    for g in range(len(groups)):
        rows = np.flatnonzero(ids == g)
        stored = [float(v) for v in rewards[rows]]  # the values as the file holds them
        expected = brute_force(stored, k)
        got = ours[rows]
        if all(e == 0 for e in expected):  # constant, or fewer than k below the best: exactly +0.0
            assert (bits(got) == bits(np.zeros_like(got))).all(), (stored, got)
            continue
        for value, want in zip(got, expected, strict=True):
            worst = max(worst, abs(float(value) - float(want)))
        for value in set(stored):  # tied rewards get the very same advantage
            assert len(set(bits(got[[r == value for r in stored]]).tolist())) == 1
    bound = 1e-15 if dtype == np.float64 else 2 * np.finfo(np.float32).eps
    assert worst <= bound, worst


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fewer_than_k_failures_give_exactly_zero_not_a_residue(dtype: Any) -> None:
    """Issue #67 B.6: ``[0, 0, 1, 1, 1, 1]`` at k = 3 gave -5.55e-17 on the failed rows (every
    3-subset holds a success, so every credit is 1/2 and the exact advantage 0); in float32
    output a non-zero float32. Every group with fewer than k rollouts below its best is +0.0."""
    table = pa.table({"group_id": [0] * 6, "reward": pa.array(np.array([0, 0, 1, 1, 1, 1], dtype=dtype))})
    got = add_advantages(table, estimator="pass_at_k", pass_k=3).column("advantage").to_numpy()
    assert bits(got).tolist() == bits(np.zeros(6, dtype=got.dtype)).tolist()
    rng = np.random.default_rng(16)
    groups = [list(map(float, rng.random(16) < rng.uniform(0.5, 1.0))) for _ in range(300)]
    ours = add_advantages(shuffled_table(groups, dtype, seed=16), estimator="pass_at_k", pass_k=16)
    ids, values = ours.column("group_id").to_numpy(), ours.column("advantage").to_numpy()
    structural = [g for g, rewards in enumerate(groups) if rewards.count(0.0) < 16]
    assert len(structural) > 250  # at k = 16 of 16 every group with a success is one
    held = np.isin(ids, structural)
    assert bits(values[held]).tolist() == bits(np.zeros(int(held.sum()), dtype=values.dtype)).tolist()


def test_rollouts_with_fewer_than_k_below_them_share_one_credit() -> None:
    """Below the k-th lowest reward every rollout's credit is the same exact fraction: one
    value, whatever the rounding of the terms that would make each."""
    r = torch.tensor([0.1, 0.2, 0.3, 0.9, 1.0, 0.7], dtype=torch.float64)
    got = pass_at_k_advantages(r, torch.zeros(6, dtype=torch.int64), 1, k=4)
    expected = brute_force(r.tolist(), 4)
    assert expected[0] == expected[1] == expected[2] == expected[5]
    assert len({got[i].item() for i in (0, 1, 2, 5)}) == 1
    assert got.tolist() == pytest.approx([float(e) for e in expected], abs=1e-15)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 16])
def test_binary_credit_is_the_papers_theorem_2(n: int) -> None:
    """Correct: k/n; incorrect: (k/n) rho(n-1, c, k-1), rho(n, c, k) = 1 - C(n-c, k)/C(n, k)."""

    def rho(total: int, correct: int, k: int) -> Fraction:
        return 1 - Fraction(comb(total - correct, k), comb(total, k))

    for c in range(1, n):
        for k in range(1, n + 1):
            rewards = [1.0] * c + [0.0] * (n - c)
            right, wrong = Fraction(k, n), Fraction(k, n) * rho(n - 1, c, k - 1)
            mean = (c * right + (n - c) * wrong) / n
            expected = [right - mean] * c + [wrong - mean] * (n - c)
            ours = pass_at_k_advantages(torch.tensor(rewards), torch.zeros(n, dtype=torch.int64), 1, k=k)
            assert ours.tolist() == pytest.approx([float(e) for e in expected], abs=1e-15)
            assert expected == brute_force(rewards, k)


def test_the_pull_requests_example_and_k_one() -> None:
    """rllm PR #743: n=4, c=2, k=2 gives +-1/12. k=1 is the mean-centred reward over n."""
    result = group_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0]]), estimator="pass_at_k", pass_k=2)
    assert (result["advantages"] * 12).flatten().tolist() == pytest.approx([1, -1, 1, -1], abs=1e-12)
    r = torch.tensor([[0.3, 0.9, 0.1, 0.5, 0.2]], dtype=torch.float64)
    one = group_advantages(r, estimator="pass_at_k", pass_k=1)["advantages"]
    assert torch.allclose(one, (r - r.mean()) / r.numel(), rtol=0, atol=1e-16)


def test_k_beyond_a_groups_size_is_its_size() -> None:
    r = torch.tensor([0.2, 1.0, 0.6], dtype=torch.float64)
    ids = torch.zeros(3, dtype=torch.int64)
    big = pass_at_k_advantages(r, ids, 1, k=50)
    assert bits(big.numpy()).tolist() == bits(pass_at_k_advantages(r, ids, 1, k=3).numpy()).tolist()
    # k = n: every rollout is in the one subset, whose best is 1.0: no rollout stands out
    assert big.tolist() == [0.0, 0.0, 0.0]


def test_streaming_gives_the_same_bits_as_in_memory(cli: Any, tmp_path: Path) -> None:
    table = shuffled_table(random_groups(7, 300), np.float32, seed=3)
    path = tmp_path / "in.parquet"
    pq.write_table(table, path, row_group_size=97)
    outputs = []
    for extra in ([], ["--memory-limit-mb", "0", "--batch-rows", "53"]):
        out = tmp_path / f"out{len(extra)}.parquet"
        result = cli("compute", path, "--estimator", "pass_at_k", "--pass-k", "3", "-o", out, *extra)
        assert result.exit_code == 0, result.stderr
        outputs.append(pq.read_table(out).column("advantage").to_numpy())
    assert (bits(outputs[0]) == bits(outputs[1])).all()


def test_nan_rewards_left_out_are_left_out_of_the_subsets(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "nan.parquet"
    pq.write_table(pa.table({"group_id": [0, 0, 0, 0], "reward": [1.0, float("nan"), 0.0, 0.0]}), path)
    out = tmp_path / "out.parquet"
    result = cli("compute", path, "--estimator", "pass_at_k", "--pass-k", "2", "--nan", "ignore", "-o", out)
    assert result.exit_code == 0, result.stderr
    got = pq.read_table(out).column("advantage").to_pylist()
    expected = brute_force([1.0, 0.0, 0.0], 2)
    assert got[1] == 0.0
    assert [got[0], got[2], got[3]] == pytest.approx([float(e) for e in expected], abs=1e-15)


def test_check_verify_passes_its_own_output_and_names_a_corrupted_row(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(shuffled_table(random_groups(11, 60), np.float64, seed=1), path)
    out = tmp_path / "out.parquet"
    args = ["--estimator", "pass_at_k", "--pass-k", "4"]
    assert cli("compute", path, *args, "-o", out).exit_code == 0
    passed = cli("check", out, *args, "--verify-advantage-col", "advantage")
    assert passed.exit_code == 0, passed.stderr
    table = pq.read_table(out)
    advantage = table.column("advantage").to_pylist()
    row = next(i for i, a in enumerate(advantage) if a != 0.0)
    advantage[row] += 0.01
    bad = tmp_path / "bad.parquet"
    pq.write_table(
        table.set_column(table.schema.get_field_index("advantage"), "advantage", pa.array(advantage)), bad
    )
    failed = cli("check", bad, *args, "--verify-advantage-col", "advantage")
    assert failed.exit_code == 1
    assert f"row {row}" in failed.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--estimator", "pass_at_k"], "--estimator pass_at_k needs --pass-k K"),
        (["--estimator", "pass_at_k", "--pass-k", "0"], "--pass-k must be a whole number >= 1, got 0"),
        (["--pass-k", "3"], "--pass-k 3 is the k of --estimator pass_at_k; --estimator grpo has none"),
    ],
)
def test_refusals_are_one_line(
    args: list[str], fragment: str, cli: Any, parquet_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.parquet"
    assert_one_line_error(cli("compute", parquet_file, *args, "-o", out), fragment)
    assert not out.exists()


def test_the_summary_records_k(cli: Any, parquet_file: Path, tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    result = cli(
        "check", parquet_file, "--estimator", "pass_at_k", "--pass-k", "4", "--summary-json", summary
    )
    assert result.exit_code == 0, result.stderr
    options = json.loads(summary.read_text())["options"]
    assert options["estimator"] == "pass_at_k" and options["pass_k"] == 4


def test_passk_best_advantage_defaults_to_verls_sample_std_and_group_scale():
    """The public kernel's defaults are verl's: unbiased std, divided (what the plan passes)."""
    import torch

    from grpo_cli.kernel import active_groups, group_stats, group_top_two, passk_best_advantage

    r, g = torch.tensor([1.0, 0.0, 0.5, 0.0, 3.0, 2.0]), torch.tensor([0, 0, 0, 0, 1, 1])
    stats = group_stats(r, g)
    top, active = group_top_two(r, g, 2), active_groups(stats)
    default = passk_best_advantage(stats, top, active, epsilon=1e-6)
    explicit = passk_best_advantage(stats, top, active, std="sample", scale="group", epsilon=1e-6)
    assert torch.equal(default, explicit)
    population = passk_best_advantage(stats, top, active, std="population", epsilon=1e-6)
    assert not torch.equal(default, population)


@pytest.mark.parametrize("seed", range(6))
def test_a_table_per_group_and_reward_gives_every_rows_advantage_bit_for_bit(seed):
    """The Ray reducers hand pass@k on as a table per group and distinct reward (``RewardCredit``,
    made from parts of the groups, laid end to end): each row's lookup is the bits the kernel
    gives it over every row at once, ties (-0.0 beside 0.0 among them) and unscored rows too."""
    from grpo_cli.estimators.credit import RewardCredit

    rng = np.random.default_rng(seed)
    groups = 30
    sizes = rng.integers(1, 9, groups)
    ids = rng.permutation(np.repeat(np.arange(groups), sizes))
    rewards = rng.choice([0.0, -0.0, 1.0, 0.5, 0.25, 3.0], ids.size) + (
        rng.random(ids.size) < 0.2
    ) * rng.random(ids.size)
    scored = rng.random(ids.size) < 0.9
    active = torch.from_numpy(rng.random(groups) < 0.8)
    x, g = torch.from_numpy(rewards), torch.from_numpy(ids)
    expected = torch.zeros(ids.size, dtype=torch.float64)
    expected[scored] = pass_at_k_advantages(x[scored], g[scored], groups, k=2, active=active)
    cut = int(rng.integers(0, groups + 1))  # the groups in two parts, as two buckets hold them
    parts = []
    for low, high in ((0, cut), (cut, groups)):
        rows = np.flatnonzero(scored & (ids >= low) & (ids < high))
        local = torch.from_numpy(ids[rows] - low)
        part_advantages = pass_at_k_advantages(x[rows], local, high - low, k=2, active=active[low:high])
        parts.append(RewardCredit.of(x[rows], local, part_advantages, high - low))
    got = RewardCredit.concat(parts).advantages_of(ids, x, torch.from_numpy(scored))
    assert bits(got.numpy()).tolist() == bits(expected.numpy()).tolist()
