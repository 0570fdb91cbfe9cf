"""``--estimator maxrl``: MaxRL's ``(r - mean) / mean``, against prime-rl's and SkyRL's own code.

prime-rl's edge rules are the default (a group whose mean is <= 0 gets 0, a singleton 0);
SkyRL's divisor ``mean + 1e-6`` and its singleton ``r`` are ``--epsilon-mode add
--singleton raw``. Both trainers compute in float32; grpo-cli in float64, with exact zeros:
the difference is rounding residue, which ``check --verify-advantage-col`` passes.
"""

from __future__ import annotations

import random
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli import add_advantages
from tests.trainer_source import _cut, _function, source

PRIME_RL = ("PrimeIntellect-ai/prime-rl", "559b44772e471d1538537b8805cc77f3824a5e64")
SKYRL = ("NovaSky-AI/SkyRL", "a9564572eb8e91076be43c1bd5e4615e3de17265")


def random_groups(seed: int, count: int = 1500, *, negative: bool = False) -> list[list[float]]:
    """Binary, continuous, tied and constant groups of uneven size, singletons; float32 values."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.choice((1, 2, 3, 4, 5, 8, 16))
        kind = rng.random()
        if kind < 0.35:
            values = [float(rng.random() < rng.random()) for _ in range(n)]
        elif kind < 0.6:
            values = [rng.choice((0.0, 0.25, 0.5, 1.0)) for _ in range(n)]
        elif kind < 0.75:
            values = [rng.choice((0.1, 0.3, 0.7))] * n
        else:
            values = [rng.uniform(-1.0 if negative else 0.0, 2.0) for _ in range(n)]
        out.append([float(np.float32(v)) for v in values])
    return out


def prime_rl_advantages(groups: list[list[float]]) -> list[float]:
    """prime-rl's ``MaxRLAlgorithm.score_group``, its computing lines verbatim."""
    text = source(PRIME_RL, "src/prime_rl/orchestrator/algo/max_rl.py")
    block = _cut(
        text,
        "rewards = torch.tensor([trace.reward for trace in traces]",
        "advantages = torch.zeros_like(rewards)",
    )
    out: list[float] = []
    for values in groups:
        local: dict[str, Any] = {"torch": torch, "traces": [types.SimpleNamespace(reward=v) for v in values]}
        exec(block, local)
        out += local["advantages"].tolist()
    return out


def skyrl_advantages(groups: list[list[float]]) -> list[float]:
    """SkyRL's ``compute_maxrl_advantage``, verbatim."""
    namespace: dict[str, Any] = {"torch": torch, "np": np, "defaultdict": defaultdict}
    exec(
        _function(source(SKYRL, "skyrl/backends/skyrl_train/utils/ppo_utils.py"), "compute_maxrl_advantage"),
        namespace,
    )
    rewards = torch.tensor([v for g in groups for v in g], dtype=torch.float32)
    index = np.array([i for i, g in enumerate(groups) for _ in g])
    token_level = torch.zeros((rewards.numel(), 3), dtype=torch.float32)
    token_level[:, -1] = rewards
    scores, _ = namespace["compute_maxrl_advantage"](token_level, torch.ones_like(token_level), index)
    return [float(v) for v in scores[:, 0]]


def float32_bound(groups: list[list[float]], advantages: np.ndarray) -> np.ndarray:
    """How far a float32 ``(r - mean) / mean`` may fall from the exact value, per row: the
    float32 mean's error (about n ulps of the largest reward) amplified by 1 / |mean|."""
    u = 2.0**-24
    rows = []
    for g in groups:
        n, largest, mean = len(g), max(abs(v) for v in g), abs(float(np.mean(g)))
        rows += [(n + 2) * u * largest / max(mean, 1e-300)] * n
    scale = np.array(rows)
    bound: np.ndarray = 4 * (scale * (1 + np.abs(advantages)) + u * np.abs(advantages)) + 1e-12
    return bound


def ours(groups: list[list[float]], **options: Any) -> np.ndarray:
    table = pa.table(
        {
            "group_id": [i for i, g in enumerate(groups) for _ in g],
            "reward": pa.array([v for g in groups for v in g], pa.float32()),
        }
    )
    result = add_advantages(table, estimator="maxrl", **options)
    advantages: np.ndarray = result.column("advantage").to_numpy().astype(np.float64)
    return advantages


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_maxrl_is_prime_rls_score_group_within_float32_rounding(seed: int) -> None:
    groups = random_groups(seed, negative=True)
    theirs = np.array(prime_rl_advantages(groups))
    mine = ours(groups)
    assert (np.abs(mine - theirs) <= float32_bound(groups, mine)).all()
    zero_mean = np.array([np.mean(g) <= 0 for g in groups for _ in g])
    assert (mine[zero_mean] == 0).all() and (theirs[zero_mean] == 0).all()  # the mean <= 0 guard


@pytest.mark.parametrize("seed", [4, 5])
def test_maxrl_with_skyrls_options_is_skyrls_compute_maxrl_advantage(seed: int) -> None:
    groups = random_groups(seed)  # SkyRL has no guard for a mean <= 0: rewards here are >= 0
    theirs = np.array(skyrl_advantages(groups))
    mine = ours(groups, epsilon_mode="add", singleton="raw")
    assert (np.abs(mine - theirs) <= float32_bound(groups, mine)).all()
    singles = np.array([len(g) == 1 for g in groups for _ in g])
    assert (mine[singles] == np.array([g[0] for g in groups if len(g) == 1])).all()


def test_check_verify_passes_prime_rls_float32_advantages_as_rounding(cli: Any, tmp_path: Path) -> None:
    groups = random_groups(6)
    table = pa.table(
        {
            "group_id": [i for i, g in enumerate(groups) for _ in g],
            "reward": pa.array([v for g in groups for v in g], pa.float32()),
            "prime_rl": pa.array(prime_rl_advantages(groups), pa.float32()),
        }
    )
    path = tmp_path / "maxrl.parquet"
    pq.write_table(table, path)
    result = cli("check", path, "--estimator", "maxrl", "--verify-advantage-col", "prime_rl")
    assert result.exit_code == 0, result.stderr
    assert "PASS  verify-advantage-col: 0 rows differ" in result.stderr
    corrupted = table.set_column(
        2,
        "prime_rl",
        pa.array(
            [a + (0.5 if i == 7 else 0.0) for i, a in enumerate(prime_rl_advantages(groups))], pa.float32()
        ),
    )
    pq.write_table(corrupted, path)
    failed = cli("check", path, "--estimator", "maxrl", "--verify-advantage-col", "prime_rl")
    assert failed.exit_code == 1 and "1 rows differ" in failed.stderr


def test_maxrl_on_binary_rewards_is_the_paper_formula_exactly() -> None:
    groups = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0]]
    assert ours(groups).tolist() == [3.0, -1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_maxrl_refuses_the_leave_one_out_baseline() -> None:
    from grpo_cli.kernel import group_stats, prepare_normalization

    stats = group_stats(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), count_extremes=True)
    with pytest.raises(ValueError, match="MaxRL"):
        prepare_normalization(stats, scale="mean", baseline="leave-one-out")


@pytest.mark.parametrize(
    ("group", "ulps", "passes"),
    [
        # bound: 76.8 ulps of float32 at 1 for a row on its group's mean, scaled by max |r| / mean;
        # with the std as the divisor it would be 164 ulps, so 120 would pass
        ([1.0, 2.0, 3.0], 120, False),
        # a mean below 1 divides as itself: clamped to 1, the bound would be 46.8 ulps
        ([0.25, 0.5, 0.75], 60, True),
    ],
)
def test_check_verify_holds_a_maxrl_row_on_the_mean_to_what_the_mean_as_divisor_allows(
    cli: Any, tmp_path: Path, group: list[float], ulps: int, passes: bool
) -> None:
    """The rounding a float32 trainer may leave on a row whose exact advantage is 0 is
    bounded through the group's divisor, which under MaxRL is the mean, not the std."""
    mean = sum(group) / len(group)
    advantages = [(r - mean) / (mean + 1e-6) for r in group]
    advantages[1] = ulps * 2.0**-24  # the row on the mean, moved off 0
    table = pa.table(
        {
            "group_id": [0] * len(group),
            "reward": pa.array(group, pa.float32()),
            "given": pa.array(advantages, pa.float32()),
        }
    )
    path = tmp_path / "maxrl.parquet"
    pq.write_table(table, path)
    result = cli("check", path, "--estimator", "maxrl", "--verify-advantage-col", "given")
    assert result.exit_code == (0 if passes else 1), result.stderr
