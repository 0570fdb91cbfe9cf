"""Reward transforms before the estimator, each against the trainers' own code, executed.

DAPO's overlong penalty: OpenRLHF ``apply_overlong_penalty`` caps the excess at the buffer
(``--overlong-style capped``), NeMo-RL ``apply_reward_shaping`` and AReaL
``reward_overlong_penalty`` do not (``uncapped``). ProRL's stop-properly penalty: NeMo-RL
multiplies a truncated rollout's reward by a coefficient in [0, 1]; OpenRLHF also sets it to
a negative coefficient. AReaL's ``(r + reward_bias) * reward_scaling``, clipped to
``+-reward_clip``; TRL RLOO's ``reward_clip_range``. Each cut verbatim from its source.
"""

from __future__ import annotations

import json
import random
import types
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli import add_advantages
from grpo_cli.kernel import shaped_rewards
from tests.conftest import assert_one_line_error
from tests.trainer_source import NEMO_RL, _cut, _function, source

OPENRLHF = ("OpenRLHF/OpenRLHF", "3c3be6234e0cb353e76bb8019947db9dfe99fca7")
AREAL = ("inclusionAI/AReaL", "4aef98d8d818af55b43621aaadba047ae10f4e77")


def batch(seed: int, size: int = 400) -> tuple[list[float], list[int], list[bool]]:
    """float32 rewards, response lengths around a 4096-token limit, truncation flags."""
    rng = random.Random(seed)
    rewards = [float(np.float32(rng.choice((0.0, 1.0, 0.5, rng.random())))) for _ in range(size)]
    lengths = [
        rng.choice((rng.randint(1, 3000), rng.randint(3000, 4096), rng.randint(4096, 6000)))
        for _ in range(size)
    ]
    truncated = [length >= 4096 or rng.random() < 0.1 for length in lengths]
    return rewards, lengths, truncated


def openrlhf_namespace() -> dict[str, Any]:
    text = source(OPENRLHF, "openrlhf/trainer/ppo_utils/length_penalty.py")
    namespace: dict[str, Any] = {"List": list, "logger": types.SimpleNamespace(info=lambda message: None)}
    exec(_function(text, "apply_overlong_penalty"), namespace)
    exec(_function(text, "apply_stop_properly_penalty"), namespace)
    return namespace


def experience(rewards: list[float], lengths: list[int], truncated: list[bool]) -> Any:
    return types.SimpleNamespace(
        rewards=torch.tensor(rewards, dtype=torch.float32),
        response_length=torch.tensor(lengths),
        truncated=torch.tensor(truncated),
    )


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("buffer", [512.0, 1024.0])
def test_overlong_capped_is_openrlhfs_apply_overlong_penalty(seed: int, buffer: float) -> None:
    rewards, lengths, truncated = batch(seed)
    one = experience(rewards, lengths, truncated)
    openrlhf_namespace()["apply_overlong_penalty"]([one], 4096, buffer, 0.8)
    ours = shaped_rewards(
        torch.tensor(rewards),
        lengths=torch.tensor(lengths, dtype=torch.float64),
        overlong=(4096, buffer),
        overlong_factor=0.8,
    )
    assert torch.allclose(ours, one.rewards.to(torch.float64), rtol=0, atol=1e-6)
    assert (ours >= torch.tensor(rewards, dtype=torch.float64) - 0.8 - 1e-12).all()  # capped at the factor


@pytest.mark.parametrize("coef", [0.0, 0.3, 1.0, -0.5])
def test_stop_properly_is_openrlhfs_apply_stop_properly_penalty(coef: float) -> None:
    rewards, lengths, truncated = batch(3)
    one = experience(rewards, lengths, truncated)
    openrlhf_namespace()["apply_stop_properly_penalty"]([one], coef)
    ours = shaped_rewards(torch.tensor(rewards), truncated=torch.tensor(truncated), stop_properly=coef)
    assert torch.allclose(ours, one.rewards.to(torch.float64), rtol=0, atol=1e-7)


def nemo_rl_shaping() -> Any:
    text = source(NEMO_RL, "nemo_rl/algorithms/reward_functions.py")
    namespace: dict[str, Any] = {"torch": torch, "BatchedDataDict": dict}
    exec(_function(text, "apply_reward_shaping"), namespace)
    return namespace["apply_reward_shaping"]


def test_overlong_uncapped_is_nemo_rls_apply_reward_shaping() -> None:
    rewards, lengths, _ = batch(4)
    config = types.SimpleNamespace(
        enabled=True,
        overlong_buffer_length=512,
        overlong_buffer_penalty=1.0,
        max_response_length=4096,
        stop_properly_penalty_coef=None,
    )
    shaped = nemo_rl_shaping()(
        {"total_reward": torch.tensor(rewards), "response_token_lengths": torch.tensor(lengths)}, config
    )
    ours = shaped_rewards(
        torch.tensor(rewards),
        lengths=torch.tensor(lengths, dtype=torch.float64),
        overlong=(4096, 512),
        overlong_capped=False,
    )
    assert torch.allclose(ours, shaped["total_reward"].to(torch.float64), rtol=0, atol=1e-5)
    assert (ours < torch.tensor(rewards, dtype=torch.float64) - 1.5).any()  # past the buffer: not capped


@pytest.mark.parametrize("coef", [0.0, 0.25, 1.0])
def test_stop_properly_is_nemo_rls_apply_reward_shaping(coef: float) -> None:
    rewards, _, truncated = batch(5)
    config = types.SimpleNamespace(
        enabled=True,
        overlong_buffer_length=None,
        overlong_buffer_penalty=None,
        max_response_length=None,
        stop_properly_penalty_coef=coef,
    )
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # it prints what it did
        shaped = nemo_rl_shaping()({"total_reward": torch.tensor(rewards), "truncated": truncated}, config)
    ours = shaped_rewards(torch.tensor(rewards), truncated=torch.tensor(truncated), stop_properly=coef)
    assert torch.allclose(ours, shaped["total_reward"].to(torch.float64), rtol=0, atol=1e-7)


def test_overlong_uncapped_is_areals_reward_overlong_penalty() -> None:
    text = source(AREAL, "areal/utils/functional/functional.py")
    namespace: dict[str, Any] = {"Any": Any}
    exec(_function(text, "reward_overlong_penalty"), namespace)
    rewards, lengths, _ = batch(6, size=120)
    width = max(lengths)
    mask = torch.zeros(len(lengths), width)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    data = {"rewards": torch.tensor(rewards), "input_ids": mask.long(), "loss_mask": mask}
    theirs = namespace["reward_overlong_penalty"](data, 512, 0.5, 4096)["rewards"]
    ours = shaped_rewards(
        torch.tensor(rewards),
        lengths=torch.tensor(lengths, dtype=torch.float64),
        overlong=(4096, 512),
        overlong_factor=0.5,
        overlong_capped=False,
    )
    assert torch.allclose(ours, theirs.to(torch.float64), rtol=0, atol=1e-5)


def test_bias_scale_and_clip_are_areals_reward_scaling_block() -> None:
    text = source(AREAL, "areal/trainer/ppo/actor.py")
    block = _cut(
        text,
        "reward_score = (reward_score + self.reward_bias) * self.reward_scaling",
        "min=-self.reward_clip",
    )
    rewards = torch.tensor([0.0, 1.0, 5.0, -3.0, 30.0], dtype=torch.float32)
    local: dict[str, Any] = {
        "torch": torch,
        "reward_score": rewards.clone(),
        "self": types.SimpleNamespace(reward_bias=-0.5, reward_scaling=4.0, reward_clip=10.0),
    }
    exec(block + "\n)", local)
    ours = shaped_rewards(rewards, bias=-0.5, scale=4.0, clip=(-10.0, 10.0))
    assert ours.tolist() == local["reward_score"].to(torch.float64).tolist()


def test_clip_is_trl_rloos_reward_clip_range() -> None:
    from tests.trainer_source import TRL

    text = source(TRL, "trl/trainer/rloo_trainer.py")
    block = _cut(text, "if self.reward_clip_range:", "rewards = rewards.clamp(min=self.reward_clip_range[0]")
    rewards = torch.tensor([-2.0, -0.5, 0.25, 3.0])
    local: dict[str, Any] = {
        "rewards": rewards.clone(),
        "self": types.SimpleNamespace(reward_clip_range=(-1.0, 1.0)),
    }
    exec(block, local)
    assert shaped_rewards(rewards, clip=(-1.0, 1.0)).tolist() == local["rewards"].to(torch.float64).tolist()


# --------------------------------------------------------------------------- the CLI


def dump(tmp_path: Path) -> Path:
    rows = []
    rng = random.Random(9)
    for group in range(30):
        for _ in range(6):
            length = rng.choice((100, 900, 1000, 1200))
            rows.append(
                {
                    "uid": group,
                    "reward": float(rng.random() < 0.5),
                    "tokens": length,
                    "finish_reason": "length" if length >= 1024 else "stop",
                }
            )
    path = tmp_path / "rollouts.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_compute_shapes_then_normalises_and_check_verifies(cli: Any, tmp_path: Path) -> None:
    path = dump(tmp_path)
    out = tmp_path / "out.parquet"
    args = ["-g", "uid", "--overlong", "1024", "256", "--length-col", "tokens"]
    args += ["--stop-properly", "0.5", "--truncated-col", "finish_reason", "--reward-clip", "-1", "1"]
    result = cli("compute", path, *args, "-o", out, "--summary-json", tmp_path / "s.json")
    assert result.exit_code == 0, result.stderr
    table = pq.read_table(out)
    rewards = torch.tensor(table.column("reward").to_pylist())
    lengths = torch.tensor(table.column("tokens").to_pylist(), dtype=torch.float64)
    truncated = torch.tensor([f == "length" for f in table.column("finish_reason").to_pylist()])
    shaped = shaped_rewards(
        rewards, lengths=lengths, truncated=truncated, overlong=(1024, 256), stop_properly=0.5, clip=(-1, 1)
    )
    expected = add_advantages(
        pa.table({"uid": table.column("uid"), "reward": shaped.numpy()}), group_col="uid"
    ).column("advantage")
    assert table.column("advantage").to_pylist() == expected.to_pylist()
    options = json.loads((tmp_path / "s.json").read_text())["options"]
    assert options["overlong"] == [1024, 256] and options["stop_properly"] == 0.5
    verified = cli("check", out, "--verify")
    assert verified.exit_code == 0, verified.stderr
    assert "PASS" in verified.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--overlong", "1024", "256"], "--overlong penalises long responses: it needs --length-col"),
        (
            ["--stop-properly", "0.5"],
            "--stop-properly penalises truncated rollouts: it needs --truncated-col",
        ),
        (["--truncated-col", "finish_reason"], "--truncated-col is read by --stop-properly"),
        (["--overlong", "100", "256", "--length-col", "tokens"], "--overlong needs 0 < BUFFER <= MAX_TOKENS"),
        (["--stop-properly", "1.5", "--truncated-col", "finish_reason"], "--stop-properly must be in [0, 1]"),
        (["--reward-clip", "1", "-1"], "--reward-clip needs finite LO <= HI, got 1.0 -1.0"),
        (["--reward-scale", "inf"], "--reward-scale must be a finite number"),
        (
            [
                "-r",
                "reward",
                "-r",
                "tokens",
                "--reward-aggregation",
                "normalize-then-sum",
                "--reward-bias",
                "1",
            ],
            "normalize-then-sum normalises each column first",
        ),
    ],
)
def test_refusals_are_one_line(args: list[str], fragment: str, cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    assert_one_line_error(cli("compute", dump(tmp_path), "-g", "uid", *args, "-o", out), fragment)
    assert not out.exists()


def test_a_null_truncation_flag_names_its_row(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "null.parquet"
    pq.write_table(pa.table({"uid": [0, 0, 0], "reward": [1.0, 0.0, 1.0], "cut": [False, None, True]}), path)
    result = cli(
        "compute",
        path,
        "-g",
        "uid",
        "--stop-properly",
        "0",
        "--truncated-col",
        "cut",
        "-o",
        tmp_path / "o.parquet",
    )
    assert_one_line_error(result, "row 1", "--truncated-col 'cut' is null")


@pytest.mark.parametrize("batches", [[], ["--batch-rows", "3"]], ids=["one-batch", "batches-of-3"])
def test_filter_unshaped_shows_what_nemo_rls_dynamic_sampling_drops(
    cli: Any, tmp_path: Path, batches: list[str]
) -> None:
    """A group of all-correct rollouts whose lengths differ is constant before the overlong
    penalty and active after it: NeMo-RL's filter (on the unshaped reward) drops it although
    the shaped rewards the estimator normalises carry a signal. Read in batches of 3 rows, the
    unshaped rewards of several batches are joined as the shaped ones are."""
    rows = [{"uid": 0, "reward": 1.0, "tokens": t} for t in (100, 900, 1000, 1100)]
    rows += [{"uid": 1, "reward": float(i % 2), "tokens": 100} for i in range(4)]
    path = tmp_path / "shaped.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    args = ["-g", "uid", "--overlong", "1024", "256", "--length-col", "tokens", "--trainer-filter", "nemo-rl"]
    args += batches
    shaped = cli("check", path, *args, "--summary-json", tmp_path / "a.json")
    unshaped = cli("check", path, *args, "--filter-unshaped", "--summary-json", tmp_path / "b.json")
    assert shaped.exit_code == unshaped.exit_code == 0, unshaped.stderr
    a = json.loads((tmp_path / "a.json").read_text())["trainer_filter"]
    b = json.loads((tmp_path / "b.json").read_text())["trainer_filter"]
    assert (a["rewards"], b["rewards"]) == ("shaped", "unshaped")
    assert a["dropped_although_active"] == 0 and b["dropped_although_active"] == 1
    assert "the rule saw the unshaped rewards" in unshaped.stderr
    refused = cli("check", path, "-g", "uid", "--trainer-filter", "nemo-rl", "--filter-unshaped")
    assert_one_line_error(refused, "--filter-unshaped gives --trainer-filter the rewards before")


@pytest.mark.parametrize(("true", "false"), [("true", "false"), ("TRUE", "False"), ("1", "0")])
def test_a_csv_truncation_flag_written_as_text_is_read_as_a_flag(
    true: str, false: str, cli: Any, tmp_path: Path
) -> None:
    """CSV columns are text: a flag column of ``true``/``false`` (or ``1``/``0``) once read as
    finish reasons, none of them ``length``, so no rollout counted as truncated."""
    path = tmp_path / "flags.csv"
    path.write_text(f"uid,reward,cut\n0,1,{true}\n0,0,{false}\n0,1,{false}\n")
    out = tmp_path / "out.jsonl"
    result = cli("compute", path, "-g", "uid", "--stop-properly", "0", "--truncated-col", "cut", "-o", out)
    assert result.exit_code == 0, result.stderr
    advantages = [json.loads(line)["advantage"] for line in out.read_text().splitlines()]
    expected = add_advantages(pa.table({"uid": [0, 0, 0], "reward": [0.0, 0.0, 1.0]}), group_col="uid")
    assert advantages == expected.column("advantage").to_pylist()


def test_a_text_flag_mixing_booleans_and_numbers_is_refused_with_its_line(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "mixed.csv"
    path.write_text("uid,reward,cut\n0,1,true\n0,0,0\n0,1,false\n")
    out = tmp_path / "out.parquet"
    result = cli("compute", path, "-g", "uid", "--stop-properly", "0", "--truncated-col", "cut", "-o", out)
    assert_one_line_error(result, "line 2", "'cut' holds 'true'")
    assert not out.exists()


FLAGS = [False, True, False, True, True, False]


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        (FLAGS, pa.bool_()),
        ([0, 1, 0, 2, -1, 0], pa.int64()),  # any non-zero number is truncated
        ([0.0, 1.0, 0.0, 0.5, 1.0, 0.0], pa.float32()),
        (["stop", "length", "stop", "length", "length", "eos"], pa.large_string()),
    ],
)
def test_each_kind_of_truncation_flag_marks_the_same_rollouts_in_every_batch(
    values: list[Any], kind: pa.DataType, cli: Any, tmp_path: Path
) -> None:
    rewards = [1.0, 1.0, 0.0, 1.0, 0.5, 1.0]
    path = tmp_path / "flags.parquet"
    pq.write_table(
        pa.table({"uid": [0, 0, 0, 1, 1, 1], "reward": rewards, "cut": pa.array(values, kind)}), path
    )
    out = tmp_path / "out.parquet"
    args = ["-g", "uid", "--stop-properly", "0.25", "--truncated-col", "cut", "--batch-rows", "2", "-o", out]
    result = cli("compute", path, *args)
    assert result.exit_code == 0, result.stderr
    shaped = [r * 0.25 if cut else r for r, cut in zip(rewards, FLAGS, strict=True)]
    expected = add_advantages(pa.table({"uid": [0, 0, 0, 1, 1, 1], "reward": shaped}), group_col="uid")
    assert pq.read_table(out).column("advantage").to_pylist() == expected.column("advantage").to_pylist()


@pytest.mark.parametrize(
    ("column", "values", "option", "fragment"),
    [
        (
            "cut",
            [False, False, False, None, False, False],
            ["--stop-properly", "0", "--truncated-col", "cut"],
            "row 3: --truncated-col 'cut' is null; every rollout needs its truncation flag",
        ),
        (
            "tokens",
            [10, 20, 30, 40, -5, 60],
            ["--overlong", "100", "10", "--length-col", "tokens"],
            "row 4",
        ),
        (  # issue #67 D.18: a NaN flag was taken as truncated where a null one is refused
            "cut",
            [0.0, 1.0, 0.0, 0.0, float("nan"), 0.0],
            ["--stop-properly", "0", "--truncated-col", "cut"],
            "row 4: --truncated-col 'cut' is NaN; every rollout needs its truncation flag",
        ),
    ],
)
def test_a_bad_flag_or_length_in_a_later_batch_names_its_own_row(
    column: str, values: list[Any], option: list[str], fragment: str, cli: Any, tmp_path: Path
) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"uid": [0] * 6, "reward": [1.0, 0.0] * 3, column: values}), path)
    out = tmp_path / "out.parquet"
    result = cli("compute", path, "-g", "uid", *option, "--batch-rows", "2", "-o", out)
    assert_one_line_error(result, f"bad.parquet, {fragment}")
    assert not out.exists()


def test_a_text_flag_refused_in_a_later_batch_names_its_line(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a CSV block of two or three lines
    monkeypatch.setattr("grpo_cli.inputs.readers.text.JSONL_BLOCK_BYTES", 24)
    path = tmp_path / "mixed.csv"
    path.write_text("uid,reward,cut\n0,1,0\n0,0,0\n0,1,true\n0,0,1\n")
    result = cli(
        "compute",
        path,
        "-g",
        "uid",
        "--stop-properly",
        "0",
        "--truncated-col",
        "cut",
        "--batch-rows",
        "2",
        "-o",
        tmp_path / "out.parquet",
    )
    assert_one_line_error(result, "line 4", "'cut' holds 'true'")


def test_a_truncation_flag_of_another_type_is_refused_in_one_line(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "listed.parquet"
    pq.write_table(pa.table({"uid": [0, 0], "reward": [1.0, 0.0], "cut": [[1], [0]]}), path)
    result = cli(
        "compute", path, "-g", "uid", "--stop-properly", "0", "--truncated-col", "cut", "-o", tmp_path / "o"
    )
    assert_one_line_error(
        result,
        "--truncated-col 'cut' has type list<element: int64>; it must be a boolean, a number or a finish "
        "reason",
    )


@pytest.mark.parametrize(
    "shaping", [["--reward-clip", "-1", "1"], ["--preset", "areal"]], ids=["reward-clip", "areal"]
)
def test_an_infinite_reward_stays_a_bad_reward_whatever_the_clip(
    cli: Any, tmp_path: Path, shaping: list[str]
) -> None:
    """--reward-clip turned an infinite reward into its bound and counted it as a reward: the
    check that refuses a null, NaN or infinite reward passed it (found by the whole-run fuzz).
    A bad reward as read is bad after any transform: refused, or left out with --nan ignore."""
    path = tmp_path / "r.parquet"
    rewards = [0.0, 1.0, float("inf"), 1.0, 0.0, 1.0, 0.5, 0.25]
    pq.write_table(pa.table({"uid": ["a"] * 4 + ["b"] * 4, "reward": rewards}), path)
    refused = cli("compute", path, "-g", "uid", *shaping, "-o", tmp_path / "x.parquet")
    assert_one_line_error(refused, "reward", "infinite")
    assert "row 2" in refused.stderr
    assert not (tmp_path / "x.parquet").exists()
    out = tmp_path / "out.parquet"
    left_out = cli(
        "compute", path, "-g", "uid", *shaping, "--nan", "ignore", "-o", out, "--summary-json", "-", "-q"
    )
    assert left_out.exit_code == 0, left_out.stderr
    assert json.loads(left_out.stdout)["nan_rewards"] == 1
    assert pq.read_table(out).column("advantage")[2].as_py() == 0.0
