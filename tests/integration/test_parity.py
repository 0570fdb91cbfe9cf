"""Every entry point computes every estimator, under every preset, as the CLI's local engine does.

The tensor API (``group_advantages``), the table API (``add_advantages``) and ``grpo-cli
compute`` on the local engine get the same random rollouts (sizes, dtypes, group layouts, NaN
policies, training batches, record batch sizes): their advantages must agree bit for bit and
their active masks exactly, or each must refuse in one line. The Ray engine's half of the
comparison is in test_ray.py (one Ray instance per session).
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli import GrpoError, add_advantages, group_advantages
from tests.conftest import PARITY_ESTIMATORS, PARITY_PRESETS, bits, parity_case, run_python

CASES = [
    (estimator, preset, seed)
    for e, estimator in enumerate(PARITY_ESTIMATORS)
    for p, preset in enumerate(PARITY_PRESETS)
    for seed in (7 * e + 3 * p, 7 * e + 3 * p + 100)
]


def _entry_points(case, cli, tmp_path):
    """Each entry point's (advantages, per-row active mask), or the GrpoError message it raised."""
    out: dict[str, object] = {}
    try:
        result = group_advantages(case["rewards"], **case["tensor_args"])
        mask = result["active_group_mask"].reshape(-1)[torch.from_numpy(case["row_ids"])]
        out["tensor"] = (result["advantages"].reshape(-1).numpy(), mask.numpy())
    except GrpoError as exc:
        out["tensor"] = str(exc)
    try:
        table = add_advantages(case["table"], **case["keywords"])
        out["table"] = (table.column("advantage").to_numpy(), table.column("group_active").to_numpy())
    except GrpoError as exc:
        out["table"] = str(exc)
    source, target = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(case["table"], source)
    run = cli("compute", source, "-o", target, "-r", "reward", "-q", "--force", *case["flags"])
    if run.exit_code == 0:
        written = pq.read_table(target)
        out["cli"] = (written.column("advantage").to_numpy(), written.column("group_active").to_numpy())
    else:
        assert run.exit_code == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        out["cli"] = run.stderr.strip()
    return out


@pytest.mark.parametrize(("estimator", "preset", "seed"), CASES)
def test_every_entry_point_computes_each_estimator_as_the_cli_does(estimator, preset, seed, cli, tmp_path):
    case = parity_case(seed, estimator=estimator, preset=preset)
    results = _entry_points(case, cli, tmp_path)
    reference = results["cli"]
    for name, got in results.items():
        if isinstance(reference, str) or isinstance(got, str):
            # a refusal everywhere, each in one line (their words differ: flags, keywords)
            assert isinstance(got, str) and isinstance(reference, str), (name, got, reference)
            continue
        advantages, active = got
        assert advantages.dtype == reference[0].dtype, name
        assert np.array_equal(bits(advantages), bits(reference[0])), (name, advantages, reference[0])
        assert np.array_equal(active, reference[1]), name


def test_the_cases_reach_every_layout_dtype_and_option():
    cases = [parity_case(seed, estimator=e, preset=p) for e, p, seed in CASES]
    assert {c["layout"] for c in cases} == {"ids", "size", "2d"}
    assert {c["rewards"].dtype for c in cases} == {torch.float32, torch.float64}
    used = {k for c in cases for k in c["keywords"]}
    assert {"length_col", "baseline_col", "batch_col", "batch_rows", "group_size", "scale"} <= used
    assert any(np.isnan(c["table"].column("reward").to_numpy()).any() for c in cases)


@pytest.mark.parametrize(
    ("estimator", "missing"), [("opo", "lengths= (its baseline is"), ("remax", "baselines= (each row's")]
)
def test_the_tensor_api_names_the_input_an_estimator_needs(estimator, missing):
    with pytest.raises(GrpoError, match=rf"^estimator='{estimator}' needs {re.escape(missing)}"):
        group_advantages(torch.tensor([[1.0, 0.0, 0.5, 0.0]]), estimator=estimator)


def test_the_tensor_api_refuses_a_group_across_two_batches_in_its_own_words():
    message = r"^rewards index 1: a group spans two values of batch_ids= \(0, then 1\)"
    with pytest.raises(GrpoError, match=message):
        group_advantages(
            torch.tensor([1.0, 0.0, 0.5, 0.0]),
            torch.tensor([0, 0, 1, 1]),
            estimator="gpg",
            batch_ids=torch.tensor([0, 1, 1, 1]),
        )


def test_the_tensor_api_keeps_the_device_dtype_and_shape_on_the_engine_path():
    rewards = torch.tensor([[1.0, 0.0, 0.5], [2.0, 2.0, 2.0]], dtype=torch.bfloat16)
    out = group_advantages(rewards, estimator="reinforce_baseline")
    assert out["advantages"].dtype == torch.bfloat16 and out["advantages"].shape == (2, 3)
    assert out["active_group_mask"].tolist() == [True, False] and out["active_group_count"] == 1


@pytest.mark.parametrize("estimator", ["gpg", "reinforce_baseline", "grpo_passk", "opo"])
def test_the_tensor_api_takes_group_ids_with_gaps_in_any_order(estimator):
    rewards = torch.tensor([0.5, 1.0, 0.0, 2.0, 0.25, 0.0, 1.0, 3.0], dtype=torch.float64)
    group_ids = torch.tensor([9, 9, 4, 4, 7, 7, 4, 9])  # 0-3, 5, 6 and 8 hold no rows
    batch_ids = torch.tensor([5, 5, 2, 2, 2, 2, 2, 5])
    lengths = torch.tensor([3.0, 1.0, 2.0, 5.0, 1.0, 1.0, 4.0, 2.0])
    extra = {"lengths": lengths} if estimator == "opo" else {"batch_ids": batch_ids}
    got = group_advantages(rewards, group_ids, estimator=estimator, **extra)
    table = pa.table(
        {
            "reward": rewards.numpy(),
            "group_id": group_ids.numpy(),
            "batch": batch_ids.numpy(),
            "length": lengths.numpy(),
        }
    )
    columns = {"length_col": "length"} if estimator == "opo" else {"batch_col": "batch"}
    expected = add_advantages(table, group_col="group_id", estimator=estimator, **columns)
    assert np.array_equal(bits(got["advantages"].numpy()), bits(expected.column("advantage").to_numpy()))
    active = got["active_group_mask"]
    assert active.shape == (10,) and not active[[0, 1, 2, 3, 5, 6, 8]].any()
    assert active[group_ids].tolist() == expected.column("group_active").to_pylist()


def test_the_tensor_api_runs_every_estimator_without_importing_pyarrow():
    """The tensor path plans and computes on tensors: a fresh process that calls it for every
    estimator (an error included, which the engine's refusals word) never imports pyarrow, whose
    import cost the first call 0.2 s before."""

    from grpo_cli.estimators import ESTIMATORS

    script = (
        "import sys, torch\n"
        "from grpo_cli import GrpoError, group_advantages\n"
        "rewards, ids = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.5]), torch.tensor([0, 0, 0, 1, 1, 1])\n"
        "lengths = torch.tensor([3.0, 4.0, 5.0, 2.0, 2.0, 6.0])\n"
        "refused = 0\n"
        f"for name in {sorted(ESTIMATORS)!r}:\n"
        "    needs = ({}, {'lengths': lengths}, {'pass_k': 2}, {'baselines': rewards / 2})\n"
        "    for extra in needs:  # what some estimators need beside the rewards\n"
        "        try:\n"
        "            group_advantages(rewards, ids, estimator=name, **extra)\n"
        "            break\n"
        "        except GrpoError:  # refused in the engine's words\n"
        "            refused += 1\n"
        "    else:\n"
        "        raise AssertionError(name)\n"
        "assert refused, 'no call was refused: the error path went untested'\n"
        "assert 'pyarrow' not in sys.modules, 'the tensor API imported pyarrow'\n"
    )
    done = run_python(script)
    assert done.returncode == 0, done.stderr
