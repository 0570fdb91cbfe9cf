"""NaN, infinite, empty and one-row rewards through every entry point, for every estimator and
preset, on every kernel path (issue #67 C.8).

``group_advantages(torch.tensor([1., nan, 0., 0.5]), zeros(4), preset="nemo-rl")`` raised
``RuntimeError: shape '[1, 3]' is invalid``: the leave-one-out statistics of equal blocks looked
for each group's row at its extreme, which a NaN group has none of. Each call here must end in a
``ValueError`` that names the value (``nan="error"``), or in finite advantages with 0 on the row
left out (``nan="ignore"``): never another exception, never a NaN written.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from grpo_cli import add_advantages, group_advantages
from grpo_cli.choices import Estimator, Preset, choices_of
from grpo_cli.kernel import normalize_in_groups
from grpo_cli.options.advantage import AdvantageOptions
from tests.conftest import assert_one_line_error

METHODS = [{"preset": p} for p in choices_of(Preset)] + [{"estimator": e} for e in choices_of(Estimator)]
BAD = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
# every layout the kernel tells apart: one block, equal blocks, scattered IDs, a fixed group size
LAYOUTS: dict[str, dict[str, Any]] = {
    "one block": {"group_ids": [0, 0, 0, 0]},
    "blocks": {"group_ids": [0, 0, 1, 1]},
    "scattered": {"group_ids": [1, 0, 1, 0]},
    "group size": {"group_size": 2},
}


def _needs(method: dict[str, str], n: int) -> dict[str, Any]:
    """The per-row inputs and k an estimator needs, for ``n`` rollouts."""
    estimator = method.get("estimator")
    needs: dict[str, dict[str, Any]] = {
        "opo": {"lengths": torch.arange(1.0, n + 1)},
        "remax": {"baselines": torch.full((n,), 0.25)},
        "pass_at_k": {"pass_k": 2},
    }
    return needs.get(str(estimator), {})


def _ignores_nan(method: dict[str, str]) -> bool:
    k = _needs(method, 1).get("pass_k")
    return AdvantageOptions.resolve(**method, pass_k=k).nan == "ignore"  # type: ignore[arg-type]


def _call(rewards: list[float], layout: dict[str, Any], method: dict[str, str]) -> torch.Tensor:
    where = {k: torch.tensor(v) if k == "group_ids" else v for k, v in layout.items()}
    ids = where.pop("group_ids", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing may reach the user's terminal as a warning
        result = group_advantages(
            torch.tensor(rewards), ids, **where, **method, **_needs(method, len(rewards))
        )
    return result["advantages"]


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
@pytest.mark.parametrize("method", METHODS, ids=lambda m: next(iter(m.values())))
@pytest.mark.parametrize("bad", BAD, ids=list(BAD))
def test_a_bad_reward_is_refused_by_value_or_left_out(bad: str, method: dict[str, str], layout: str) -> None:
    rewards = [1.0, BAD[bad], 0.0, 0.5]
    if _ignores_nan(method):
        advantages = _call(rewards, LAYOUTS[layout], method)
        assert torch.isfinite(advantages).all(), advantages
        assert advantages[1].item() == 0.0
        return
    with pytest.raises(ValueError, match=r"\b" + bad.lstrip("-") + r"\b") as caught:
        _call(rewards, LAYOUTS[layout], method)
    assert "index 1" in str(caught.value)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: next(iter(m.values())))
def test_one_rollout_and_no_rollouts_give_finite_advantages(method: dict[str, str]) -> None:
    one = _call([0.7], {"group_ids": [0]}, method)
    assert one.shape == (1,) and torch.isfinite(one).all()
    none = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.int64), **method, **_needs(method, 0))[
        "advantages"
    ]
    assert none.shape == (0,)


@pytest.mark.parametrize("baseline", ["mean", "leave-one-out"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_the_kernel_refuses_by_value_on_every_layout(layout: str, baseline: str) -> None:
    where = {k: torch.tensor(v) if k == "group_ids" else v for k, v in LAYOUTS[layout].items()}
    ids = where.pop("group_ids", None)
    for bad in BAD.values():
        with pytest.raises(ValueError, match=r"the first is .* at index 1"):
            normalize_in_groups(torch.tensor([1.0, bad, 0.0, 0.5]), ids, baseline=baseline, **where)
        kept = normalize_in_groups(
            torch.tensor([1.0, bad, 0.0, 0.5]), ids, baseline=baseline, nan="ignore", **where
        )
        assert torch.isfinite(kept["advantages"]).all() and kept["advantages"][1].item() == 0.0


@pytest.mark.parametrize("method", METHODS, ids=lambda m: next(iter(m.values())))
def test_the_table_api_and_the_cli_refuse_as_the_tensor_api_does(
    method: dict[str, str], cli: Any, tmp_path: Path
) -> None:
    columns: dict[str, Any] = {"group_id": [0, 0, 1, 1], "reward": [1.0, math.nan, 0.0, 0.5]}
    needs = _needs(method, 4)
    keywords: dict[str, Any] = dict(method)
    flags = [f"--{k}" for k in method] + list(method.values())
    if "lengths" in needs:
        columns["length"], keywords["length_col"] = needs["lengths"].tolist(), "length"
        flags += ["--length-col", "length"]
    if "baselines" in needs:
        columns["baseline"], keywords["baseline_col"] = needs["baselines"].tolist(), "baseline"
        flags += ["--baseline-col", "baseline"]
    if "pass_k" in needs:
        keywords["pass_k"] = 2
        flags += ["--pass-k", "2"]
    table = pa.table(columns)
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    out = tmp_path / "out.parquet"
    result = cli("compute", path, "-o", out, *flags)
    if _ignores_nan(method):
        assert result.exit_code == 0, result.stderr
        written = pq.read_table(out).column("advantage").to_numpy()
        assert np.isfinite(written).all() and written[1] == 0.0
        assert add_advantages(table, **keywords).column("advantage").to_numpy()[1] == 0.0
        return
    assert_one_line_error(result, "row 1", "nan")
    assert not out.exists()
    with pytest.raises(ValueError, match="nan"):
        add_advantages(table, **keywords)
