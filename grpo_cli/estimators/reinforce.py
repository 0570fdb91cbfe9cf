"""REINFORCE: the raw reward, no baseline (the batch whitening of its settings follows)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_cli.estimators.base import AdvantageEstimator, RowFacts

if TYPE_CHECKING:
    import torch


class Reinforce(AdvantageEstimator):
    def per_row(self, state: Any, rows: RowFacts) -> torch.Tensor:
        import torch

        from grpo_cli.kernel import row_baseline_advantages

        combined = rows.rewards.combined
        return row_baseline_advantages(combined, torch.zeros_like(combined), torch.isfinite(combined))


REINFORCE = Reinforce(
    "reinforce",
    {"baseline": "mean", "scale": "none", "whiten": "population"},
    summary="the raw reward, whitened over the batch",
    description=(
        "REINFORCE without a baseline: the raw reward, whitened over the batch's tokens "
        "(`--length-col`; rows without it), `(r - mean) * rsqrt(max(var, 1e-8))`, population "
        "variance (OpenRLHF `reinforce`, `experience_maker.py`; NeMo-RL "
        "`RawRewardAdvantageEstimator` with `normalize_advantages`). With `--whiten`, verl's "
        "`masked_whiten` instead (unbiased, `rsqrt(var + 1e-8)`): verl's `reinforce_plus_plus` "
        "and SkyRL's `reinforce++` at gamma 1. No group is zeroed: a constant group carries its "
        "reward's offset from the batch mean"
    ),
    own_baseline=True,
)
