"""Presets, estimators, multiple rewards, the NaN policy and filters."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_cli import add_advantages, group_advantages
from grpo_cli.errors import GrpoError
from grpo_cli.options.advantage import PRESETS, AdvantageOptions, RewardSpec
from tests import trainers
from tests.conftest import rollout_rows, write_parquet

GROUPS = [
    [1.0, 0.0, 0.0, 1.0],  # mixed binary
    [0.0, 0.0, 0.0, 0.0],  # all wrong
    [1.0, 1.0, 1.0, 1.0],  # all right
    [0.3, -1.25, 2.5, 0.75, 0.1],  # continuous
    [1.0, 0.0, 0.0, 0.0],  # one success: its leave-one-out others are constant
    [0.7],  # singleton
    [2.0, 3.0],  # pair
]


def flat_inputs(groups):
    rewards = torch.tensor(trainers.flatten(groups), dtype=torch.float64)
    ids = torch.tensor([g for g, group in enumerate(groups) for _ in group])
    return rewards, ids


def assert_close_lists(got, expected, tol=1e-9):
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert math.isclose(a, b, rel_tol=tol, abs_tol=tol), (i, a, b)


# --------------------------------------------------------------------------- golden, hand-computed


def test_golden_grpo_population():
    out = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long), 1e-12)
    assert out["advantages"].tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-9)


def test_golden_sample_std_and_estimators():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    sample = group_advantages(r, std="sample", epsilon=1e-12)["advantages"][0].tolist()
    # mean 0.25, sample std sqrt(0.25) = 0.5
    assert sample == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-9)
    dr = group_advantages(r, estimator="dr_grpo")["advantages"][0].tolist()
    assert dr == [0.75, -0.25, -0.25, -0.25]
    rloo = group_advantages(r, estimator="rloo")["advantages"][0].tolist()
    assert rloo == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3], abs=1e-12)


def test_golden_verl_singleton_and_torchrl_clamp():
    r = torch.tensor([0.5, 2.0, 2.0], dtype=torch.float64)
    ids = torch.tensor([0, 1, 1])
    verl = group_advantages(r, ids, preset="verl")
    assert verl["advantages"].tolist() == [0.5 / (1 + 1e-6), 0.0, 0.0]
    assert verl["active_group_mask"].tolist() == [True, False]
    clamp = group_advantages(torch.tensor([[0.0, 2e-7]], dtype=torch.float64), preset="torchrl")
    # sample std 1.414e-7 is clamped to 1e-6
    assert clamp["advantages"][0].tolist() == pytest.approx([-0.1, 0.1], rel=1e-9)


def test_golden_nan_ignore():
    r = torch.tensor([1.0, float("nan"), 0.0, 5.0], dtype=torch.float64)
    out = group_advantages(r, torch.tensor([0, 0, 0, 1]), 1e-12, nan="ignore")
    assert out["advantages"].tolist() == pytest.approx([1.0, 0.0, -1.0, 0.0], abs=1e-9)
    with pytest.raises(ValueError, match="NaN or infinite"):
        group_advantages(r, torch.tensor([0, 0, 0, 1]))


# --------------------------------------------------------------------------- each preset against its trainer


@pytest.mark.parametrize(
    ("preset", "reference", "options"),
    [
        ("trl", trainers.trl, {}),
        ("verl", trainers.verl, {}),
        ("openrlhf", trainers.openrlhf, {}),
        ("nemo-rl", trainers.nemo_rl, {}),
        ("roll", trainers.roll, {}),
        ("torchrl", trainers.torchrl, {}),
    ],
)
def test_preset_matches_trainer(preset, reference, options):
    rewards, ids = flat_inputs(GROUPS)
    got = group_advantages(rewards, ids, preset=preset, **options)["advantages"].tolist()
    expected = trainers.flatten(trainers.constant_zero(GROUPS, reference(GROUPS)))
    if preset not in ("verl",):
        # grpo-cli zeroes singletons under every preset but verl's
        expected = trainers.flatten(
            [
                [0.0] * len(g) if len(g) == 1 else a
                for g, a in zip(GROUPS, trainers.constant_zero(GROUPS, reference(GROUPS)), strict=True)
            ]
        )
    assert_close_lists(got, expected)


def test_trl_with_nan_rewards_and_scale_modes():
    groups = [[1.0, float("nan"), 0.0, 0.5], [2.0, 2.0, float("nan")], [0.0, 1.0, 1.0]]
    rewards, ids = flat_inputs(groups)
    for scale in ("group", "batch", "none"):
        got = group_advantages(rewards, ids, preset="trl", scale=scale)["advantages"].tolist()
        assert_close_lists(got, trainers.flatten(trainers.trl(groups, scale=scale)))


def test_trainer_variants_through_options():
    rewards, ids = flat_inputs(GROUPS)
    multi = [g for g in GROUPS if len(g) > 1]
    r2, i2 = flat_inputs(multi)
    got = group_advantages(r2, i2, preset="openrlhf", estimator="dr_grpo")["advantages"].tolist()
    assert_close_lists(
        got, trainers.flatten(trainers.constant_zero(multi, trainers.openrlhf(multi, dr_grpo=True)))
    )
    got = group_advantages(rewards, ids, preset="verl", scale="none")["advantages"].tolist()
    assert_close_lists(
        got, trainers.flatten(trainers.constant_zero(GROUPS, trainers.verl(GROUPS, norm_adv_by_std=False)))
    )


def test_presets_only_change_what_they_say():
    default = asdict(AdvantageOptions())
    for name, preset in PRESETS.items():
        resolved = asdict(AdvantageOptions.resolve(preset=name))
        changed = {k for k in default if resolved[k] != default[k]} - {"preset"}
        assert changed == {k for k, v in preset.settings.items() if default[k] != v}, name
        assert resolved["preset"] == name
        assert preset.source and preset.note


def test_explicit_options_override_preset_and_estimator():
    options = AdvantageOptions.resolve(preset="trl", estimator="rloo", epsilon=0.5, scale="group")
    assert (options.epsilon, options.baseline, options.scale, options.std) == (
        0.5,
        "leave-one-out",
        "group",
        "sample",
    )
    with pytest.raises(GrpoError, match="unknown preset 'grpo'"):
        AdvantageOptions.resolve(preset="grpo")


@pytest.mark.parametrize("preset", list(PRESETS))
def test_constant_groups_exactly_zero_under_every_preset(preset):
    rewards = torch.tensor([0.1] * 7 + [0.2, 0.9], dtype=torch.float32)
    ids = torch.tensor([0] * 7 + [1, 1])
    out = group_advantages(rewards, ids, preset=preset)["advantages"]
    assert out[:7].tolist() == [0.0] * 7
    assert not torch.signbit(out[:7]).any()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=2, max_size=9),
        min_size=1,
        max_size=8,
    )
)
def test_rloo_is_n_over_n_minus_one_times_dr_grpo(groups):
    rewards, ids = flat_inputs(groups)
    rloo = group_advantages(rewards, ids, estimator="rloo")["advantages"]
    dr = group_advantages(rewards, ids, estimator="dr_grpo")["advantages"]
    n = torch.tensor([len(g) for g in groups], dtype=torch.float64)[ids]
    torch.testing.assert_close(rloo, dr * n / (n - 1), rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- through the CLI


def test_cli_preset_matches_library(cli, tmp_path):
    rows = rollout_rows(seed=5)
    source = write_parquet(tmp_path / "in.parquet", rows)
    for preset in PRESETS:
        out = tmp_path / f"{preset}.parquet"
        result = cli("compute", source, "-o", out, "--preset", preset, "--summary-json", "-", "-q")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["options"]["preset"] == preset
        keys = list(dict.fromkeys(r["group_id"] for r in rows))
        ids = torch.tensor([keys.index(r["group_id"]) for r in rows])
        rewards = torch.tensor([r["reward"] for r in rows], dtype=torch.float64)
        expected = group_advantages(rewards, ids, preset=preset)["advantages"].tolist()
        assert pq.read_table(out).column("advantage").to_pylist() == expected


def test_cli_estimator_and_epsilon_mode(cli, tmp_path):
    source = write_parquet(tmp_path / "in.parquet", rollout_rows(seed=6))
    out = tmp_path / "o.parquet"
    result = cli("compute", source, "-o", out, "--estimator", "rloo", "--summary-json", "-", "-q")
    assert result.exit_code == 0
    options = json.loads(result.stdout)["options"]
    assert (options["baseline"], options["scale"], options["estimator"]) == ("leave-one-out", "none", "rloo")
    result = cli("compute", source, "-o", out, "-f", "--epsilon-mode", "clamp", "--singleton", "raw", "-q")
    assert result.exit_code == 0


def test_multiple_rewards_weighted_sum(cli, tmp_path):
    rows = rollout_rows(seed=7)
    source = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "o.parquet"
    result = cli("compute", source, "-o", out, "-r", "correct:0.5", "-r", "reward:2", "-q")
    assert result.exit_code == 0, result.stderr
    written = pq.read_table(out)
    assert {"correct", "reward"} <= set(written.column_names)
    keys = list(dict.fromkeys(r["group_id"] for r in rows))
    ids = torch.tensor([keys.index(r["group_id"]) for r in rows])
    combined = torch.tensor([0.5 * r["correct"] + 2 * r["reward"] for r in rows], dtype=torch.float64)
    expected = group_advantages(combined, ids)["advantages"]
    assert written.schema.field("advantage").type == pa.float64()
    torch.testing.assert_close(
        torch.tensor(written.column("advantage").to_pylist(), dtype=torch.float64), expected
    )


def test_normalize_then_sum(cli, tmp_path):
    rows = rollout_rows(seed=8)
    source = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "o.parquet"
    args = ["-r", "correct:0.5", "-r", "reward:2", "--reward-aggregation", "normalize-then-sum", "-q"]
    assert cli("compute", source, "-o", out, *args).exit_code == 0
    keys = list(dict.fromkeys(r["group_id"] for r in rows))
    ids = torch.tensor([keys.index(r["group_id"]) for r in rows])
    parts = [
        group_advantages(torch.tensor([float(r[c]) for r in rows], dtype=torch.float64), ids)["advantages"]
        * w
        for c, w in (("correct", 0.5), ("reward", 2.0))
    ]
    got = torch.tensor(pq.read_table(out).column("advantage").to_pylist(), dtype=torch.float64)
    torch.testing.assert_close(got, parts[0] + parts[1])


def test_reward_spec_parsing():
    assert RewardSpec.parse("a:b") == RewardSpec("a:b")
    assert RewardSpec.parse("score:-1") == RewardSpec("score", -1.0)
    with pytest.raises(GrpoError, match="finite"):
        RewardSpec.parse("score:inf")


def test_cli_nan_ignore_counts(cli, tmp_path):
    rows = [dict(r) for r in rollout_rows(seed=9)]
    rows[3]["reward"] = None
    rows[9]["reward"] = float("nan")
    source = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "o.parquet"
    result = cli("compute", source, "-o", out, "--nan", "ignore", "--summary-json", "-")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["nan_rewards"] == 2
    assert "NaN rewards left out" in result.stderr
    advantages = pq.read_table(out).column("advantage").to_pylist()
    assert advantages[3] == 0.0 and advantages[9] == 0.0


def test_drop_inactive_and_keep_mean_range(cli, tmp_path):
    rows = rollout_rows(seed=10)
    source = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "o.parquet"
    result = cli("compute", source, "-o", out, "-r", "correct", "--drop-inactive", "--summary-json", "-")
    assert result.exit_code == 0
    written = pq.read_table(out)
    assert all(written.column("group_active").to_pylist())
    summary = json.loads(result.stdout)
    assert summary["dropped"]["groups"] == summary["inactive_groups"]
    assert summary["dropped"]["rows"] == len(rows) - written.num_rows
    assert "inactive" in summary["dropped"]["reasons"][0]
    out2 = tmp_path / "o2.parquet"
    result = cli("compute", source, "-o", out2, "-r", "correct", "--keep-mean-range", "0.2", "0.8", "-q")
    assert result.exit_code == 0
    by_group: dict[str, list[int]] = {}
    for r in rows:
        by_group.setdefault(r["group_id"], []).append(r["correct"])
    kept = {g for g, v in by_group.items() if 0.2 <= sum(v) / len(v) <= 0.8}
    assert set(pq.read_table(out2).column("group_id").to_pylist()) == kept
    result = cli("compute", source, "-o", out2, "-f", "--keep-mean-range", "0.9", "0.1")
    assert result.exit_code == 2 and "LO <= HI" in result.stderr


def test_stats_cols(cli, tmp_path):
    rows = rollout_rows(seed=11)
    source = write_parquet(tmp_path / "in.parquet", rows)
    out = tmp_path / "o.parquet"
    assert cli("compute", source, "-o", out, "--stats-cols", "-q").exit_code == 0
    written = pq.read_table(out).to_pylist()
    by_group: dict[str, list[float]] = {}
    for r in rows:
        by_group.setdefault(r["group_id"], []).append(r["reward"])
    for row in written:
        values = by_group[row["group_id"]]
        assert row["advantage_group_size"] == len(values)
        assert row["advantage_group_mean"] == pytest.approx(sum(values) / len(values), abs=1e-12)
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        assert row["advantage_group_std"] == pytest.approx(std, abs=1e-12)


# --------------------------------------------------------------------------- TRL, several reward functions


def _trl_dump(tmp_path, aggregation, *, seed=0, rows=1024, generations=8):
    """Two reward functions, each None (null) on about 5% of rows; advantages from TRL's
    arithmetic in float32, as TRL's log_completions writes them (doubles of float32 values)."""
    g = torch.Generator().manual_seed(seed)
    accuracy = torch.randint(0, 2, (rows,), generator=g).to(torch.float32)
    fmt = torch.rand(rows, generator=g)
    accuracy[torch.rand(rows, generator=g) < 0.05] = float("nan")
    fmt[torch.rand(rows, generator=g) < 0.05] = float("nan")
    fmt[:3] = float("nan")
    accuracy[:2] = float("nan")  # rows 0 and 1: every function returned None
    per_func = torch.stack([accuracy, fmt], dim=1)
    advantages = trainers.trl_multi_reward(
        per_func.tolist(), [1.0, 0.5], generations, aggregation=aggregation, dtype=torch.float32
    )
    table = pa.table(
        {
            "prompt": [f"prompt {i // generations}" for i in range(rows)],
            "accuracy_reward": pa.array(accuracy.double().numpy(), from_pandas=True),
            "format_reward": pa.array(fmt.double().numpy(), from_pandas=True),
            "advantage": advantages,
        }
    )
    path = tmp_path / f"completions_{aggregation}.parquet"
    pq.write_table(table, path)
    return path, per_func, advantages


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_trl_several_rewards_with_nulls_match_trl(cli, tmp_path, aggregation):
    """A null from one reward function counts as 0 (nansum); only a row where every function
    is null is left out. grpo-cli dropped the whole row before, and 72 of 4,096 rows differed."""
    path, per_func, trl = _trl_dump(tmp_path, aggregation)
    assert torch.isnan(per_func).any(dim=1).sum() > 50  # many partly null rows
    option = aggregation.replace("_", "-")
    args = ["--preset", "trl", "-r", "accuracy_reward", "-r", "format_reward:0.5", "-g", "prompt"]
    args += ["--reward-aggregation", option]
    result = cli("check", path, *args, "--verify-advantage-col", "advantage", "--summary-json", "-")
    assert result.exit_code == 0, result.stderr
    verify = json.loads(result.stdout)["verify"]
    assert (verify["mismatched"], verify["residue"]) == (0, 0)
    out = tmp_path / "out.parquet"
    assert cli("compute", path, *args, "-o", out, "-q", "--advantage-col", "grpo_advantage").exit_code == 0
    got = pq.read_table(out).column("grpo_advantage").to_pylist()
    exact = trainers.trl_multi_reward(per_func.tolist(), [1.0, 0.5], 8, aggregation=aggregation)
    assert got[:2] == [0.0, 0.0]  # unscorable rows
    assert_close_lists(got, exact, tol=1e-9)
    assert_close_lists(got, trl, tol=1e-5)


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_trl_oracle_is_trls_own_code(aggregation, scale):
    """The re-implementation above against TRL's advantage block itself, read from a mirror of
    huggingface/trl at f2cd5771 and executed (skips where no mirror is present)."""
    from tests.trainer_source import trl_advantages

    g = torch.Generator().manual_seed(3)
    per_func = torch.rand(256, 3, generator=g)
    per_func[torch.rand(256, 3, generator=g) < 0.2] = float("nan")
    per_func[5] = float("nan")
    weights = [1.0, 0.5, 2.0]
    own = trl_advantages(per_func, weights, 4, scale_rewards=scale, aggregation=aggregation)
    ours = trainers.trl_multi_reward(
        per_func.tolist(), weights, 4, aggregation=aggregation, scale=scale, dtype=torch.float32
    )
    assert own.tolist() == ours


@pytest.mark.parametrize("preset", ["verl", "openrlhf", "nemo-rl", "roll", "torchrl"])
def test_other_presets_refuse_a_partly_null_reward_row(cli, tmp_path, preset):
    """Their reward functions return one number per rollout (no None): a null in one of several
    reward columns is refused, not summed as TRL sums it."""
    table = pa.table({"group_id": [0, 0, 1, 1], "a": [1.0, 0.0, None, 1.0], "b": [0.5, 0.5, 0.5, 0.0]})
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    result = cli("compute", path, "-o", tmp_path / "o.parquet", "--preset", preset, "-r", "a", "-r", "b")
    assert result.exit_code == 2
    assert "row 2" in result.stderr and not (tmp_path / "o.parquet").exists()


SLIME = ("THUDM/slime", "624b824a898ab0ec1fcb4d373004c7f3852bf515")


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("seed", [1, 2])
def test_slime_preset_is_its_post_process_rewards(normalize_std: bool, seed: int) -> None:
    """slime's group normalisation, cut verbatim from ``_post_process_rewards``, on groups of
    n_samples_per_prompt rollouts (float32): the preset within float32 rounding, and exact 0
    for a constant group."""
    import random
    import textwrap
    import types

    from tests.trainer_source import _cut, source

    text = source(SLIME, "slime/ray/rollout.py")
    block = textwrap.dedent(
        _cut(
            text, "rewards = torch.tensor(raw_rewards, dtype=torch.float)", "rewards = rewards / (std + 1e-6)"
        )
    )
    rng = random.Random(seed)
    n, prompts = 8, 300
    raw = [
        float(v)
        for _ in range(prompts)
        for v in (
            [rng.choice((0.0, 1.0))] * n
            if rng.random() < 0.3
            else [rng.choice((0.0, 0.25, 0.5, 1.0)) for _ in range(n)]
        )
    ]
    args = types.SimpleNamespace(
        n_samples_per_prompt=n,
        rollout_batch_size=prompts,
        advantage_estimator="grpo",
        grpo_std_normalization=normalize_std,
    )
    local: dict[str, Any] = {"torch": torch, "raw_rewards": raw, "self": types.SimpleNamespace(args=args)}
    exec(block, local)
    theirs = local["rewards"].flatten().to(torch.float64)
    options = {} if normalize_std else {"scale": "none"}
    result = group_advantages(
        torch.tensor(raw, dtype=torch.float32).reshape(-1, n), preset="slime", **options
    )
    ours = result["advantages"].flatten()
    assert torch.allclose(ours.to(torch.float64), theirs, rtol=1e-5, atol=1e-6)
    constant = torch.tensor(raw).reshape(-1, n).eq(torch.tensor(raw).reshape(-1, n)[:, :1]).all(dim=1)
    assert (ours.reshape(-1, n)[constant] == 0).all()


AREAL = ("inclusionAI/AReaL", "4aef98d8d818af55b43621aaadba047ae10f4e77")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_areal_preset_is_its_normalization_class(seed: int) -> None:
    """AReaL's ``Normalization``, cut verbatim from ``areal/utils/data.py``, configured as
    ``examples/math/gsm8k_grpo.yaml`` does: ``reward_norm`` group mean and std over blocks of
    n_samples rollouts, then ``adv_norm`` over the batch's tokens (the loss mask). With
    discount 1, lambda 1, no critic and no KL, every response token's advantage is the
    normalised reward. The preset within float32 rounding (AReaL returns float32)."""
    import random
    import types

    import numpy as np

    from tests.trainer_source import _cut, source

    text = source(AREAL, "areal/utils/data.py")
    block = _cut(text, "class Normalization:", "return (x_sum_sq / factor).sqrt()")
    namespace: dict[str, Any] = {
        "torch": torch,
        "np": np,
        "dist": types.SimpleNamespace(is_initialized=lambda: False),
        "NormConfig": Any,
    }
    exec(block, namespace)

    def config(level: str, group_size: int) -> Any:
        return types.SimpleNamespace(
            mean_level=level,
            mean_leave1out=False,
            std_level=level,
            std_unbiased=True,
            eps=1e-5,
            group_size=group_size,
        )

    rng = random.Random(seed)
    n, prompts, width = 8, 64, 16
    rewards = [
        float(np.float32(v))
        for _ in range(prompts)
        for v in (
            [rng.choice((0.0, 1.0))] * n
            if rng.random() < 0.3
            else [rng.choice((0.0, 0.1, 0.25, 0.5, 1.0)) for _ in range(n)]
        )
    ]
    lengths = [rng.randint(1, width) for _ in rewards]
    normalized = namespace["Normalization"](config("group", n))(torch.tensor(rewards, dtype=torch.float32))
    mask = torch.zeros(len(rewards), width)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    tokens = normalized.unsqueeze(-1) * mask
    theirs = namespace["Normalization"](config("batch", 1))(tokens, mask)[:, 0].to(torch.float64)
    table = pa.table(
        {
            "group_id": [row // n for row in range(len(rewards))],
            "reward": pa.array(rewards, pa.float32()),
            "length": lengths,
        }
    )
    out = add_advantages(table, preset="areal", length_col="length")
    ours = torch.tensor(out.column("advantage").to_pylist(), dtype=torch.float64)
    assert out.column("advantage").type == pa.float32()
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=2e-6), (ours - theirs).abs().max()


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_trl_rloo_preset_is_its_rloo_trainer(normalize: bool, seed: int) -> None:
    """TRL's RLOOTrainer advantage block, cut verbatim from ``rloo_trainer.py`` (beta 0, no
    reward clipping): several reward functions with nulls summed with nansum, a row where all
    are null left out, the nan-aware leave-one-out baseline, and ``normalize_advantages`` over
    the batch (``--whiten`` under this preset). Every group keeps two scorable rollouts: TRL
    leaves a group's lone scorable rollout out of its normalisation (NaN), which grpo-cli does
    not (see the README). Within float32 rounding."""
    import types

    from tests.trainer_source import TRL, _cut, _function, source

    utils = source(TRL, "trl/trainer/utils.py")
    trainer = source(TRL, "trl/trainer/rloo_trainer.py")
    block = _cut(
        trainer,
        "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)",
        "advantages = torch.nan_to_num(advantages, nan=0.0)",
    )
    namespace: dict[str, Any] = {"torch": torch}
    exec(_function(utils, "nanstd"), namespace)
    g = torch.Generator().manual_seed(seed)
    n, prompts = 6, 80
    per_func = (torch.rand(n * prompts, 2, generator=g) < 0.5).float()
    per_func[:, 1] = per_func[:, 1] * 0.5 + 0.25
    per_func[torch.rand(n * prompts, 2, generator=g) < 0.15] = float("nan")
    per_func[::n][:, :] = torch.tensor([1.0, 0.5])  # two scorable rollouts in every group
    per_func[1::n][:, :] = torch.tensor([0.0, 0.25])
    per_func[n * 3 + 4] = float("nan")  # an unscorable row
    weights = torch.tensor([1.0, 0.5])
    local: dict[str, Any] = {
        **namespace,
        "rewards_per_func": per_func.clone(),
        "num_generations": n,
        "device": "cpu",
        "self": types.SimpleNamespace(
            reward_weights=weights, reward_clip_range=None, beta=0.0, normalize_advantages=normalize
        ),
    }
    exec(block, local)
    theirs = local["advantages"].to(torch.float64)
    table = pa.table(
        {
            "prompt": [row // n for row in range(n * prompts)],
            "accuracy": pa.array(per_func[:, 0].double().numpy(), from_pandas=True),
            "format": pa.array(per_func[:, 1].double().numpy(), from_pandas=True),
        }
    )
    out = add_advantages(
        table,
        reward_col={"accuracy": 1.0, "format": 0.5},
        group_col="prompt",
        preset="trl-rloo",
        whiten=normalize,
    )
    ours = torch.tensor(out.column("advantage").to_pylist(), dtype=torch.float64)
    assert ours[n * 3 + 4] == 0.0
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6), (ours - theirs).abs().max()


def test_trl_preset_with_one_reward_column_has_trls_signs_of_zero(cli, tmp_path):
    """A -0.0 reward in a group whose mean is 0: TRL's own block (nansum adds even one function
    to +0.0) gives +0.0, and so must --preset trl, bit for bit, sign included."""
    from tests.trainer_source import trl_advantages

    rewards = [-1.0, 1.0, -0.0, 0.0, -0.0, -0.0, 1.0, 0.0]
    per_func = torch.tensor(rewards, dtype=torch.float32).unsqueeze(1)
    own = trl_advantages(per_func, [1.0], 4)
    table = pa.table({"group_id": [0] * 4 + [1] * 4, "r": pa.array(rewards, pa.float32())})
    pq.write_table(table, tmp_path / "in.parquet")
    result = cli(
        "compute", tmp_path / "in.parquet", "-o", tmp_path / "o.parquet", "--preset", "trl", "-r", "r"
    )
    assert result.exit_code == 0, result.stderr
    got = torch.tensor(
        pq.read_table(tmp_path / "o.parquet").column("advantage").to_pylist(), dtype=torch.float32
    )
    assert torch.equal(torch.signbit(got), torch.signbit(own)), (got.tolist(), own.tolist())
    assert got.tolist() == own.tolist()
