"""ReMax (verl): each row's reward less its own baseline reward (``--baseline-col``, the greedy
rollout's), :func:`~grpo_cli.kernel.row_baseline_advantages`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_cli.estimators.base import AdvantageEstimator, RowFacts

if TYPE_CHECKING:
    import torch


class Remax(AdvantageEstimator):
    def per_row(self, state: Any, rows: RowFacts) -> torch.Tensor:
        import torch

        from grpo_cli.kernel import row_baseline_advantages

        combined, baseline = rows.rewards.combined, rows.baselines
        assert baseline is not None
        valid = torch.isfinite(combined) & torch.isfinite(baseline)
        return row_baseline_advantages(combined, baseline, valid)


REMAX = Remax(
    "remax",
    {"baseline": "mean", "scale": "none"},
    summary="r - --baseline-col",
    origin="verl",
    description=(
        "`r - b`, `b` the row's `--baseline-col` (the greedy rollout's reward) (verl, `core_algos.py`)"
    ),
    needs=("row_baselines",),
    own_baseline=True,
    row_input="each row's baseline reward",
)
