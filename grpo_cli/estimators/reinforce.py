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
    "REINFORCE: the raw reward, no baseline, whitened over the batch's tokens (--length-col): "
    "(r - mean) * rsqrt(max(var, 1e-8)), population var (OpenRLHF reinforce, NeMo-RL "
    "RawRewardAdvantageEstimator); --whiten: verl's masked_whiten (reinforce_plus_plus, gamma 1)",
    own_baseline=True,
)
