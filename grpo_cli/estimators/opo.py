"""OPO (verl): each row's reward less its group's length-weighted mean reward
(:func:`~grpo_cli.kernel.length_weighted_baseline`, from pass 1's ``length_sums`` and
``weighted_reward_sums`` figures)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_cli.estimators.base import AdvantageEstimator, GroupFacts, RowFacts

if TYPE_CHECKING:
    import torch


class Opo(AdvantageEstimator):
    def between_passes(self, facts: GroupFacts) -> torch.Tensor:
        """Each group's baseline, float64 ``(K,)``."""
        import torch

        from grpo_cli.kernel import length_weighted_baseline

        return length_weighted_baseline(
            facts.stats.count.cpu(),
            torch.from_numpy(facts.figures["length_sums"]),
            torch.from_numpy(facts.figures["weighted_reward_sums"]),
        )

    def per_row(self, state: Any, rows: RowFacts) -> torch.Tensor:
        import torch

        from grpo_cli.kernel import row_baseline_advantages

        combined = rows.rewards.combined
        valid = torch.isfinite(combined) & rows.active[rows.ids]
        return row_baseline_advantages(combined, state[rows.ids], valid)


OPO = Opo(
    "opo",
    {"baseline": "mean", "scale": "none", "singleton": "raw"},
    summary="r - length-weighted mean",
    origin="verl",
    description=(
        "`r - sum(length * r) / sum(length)` over the group, `--length-col` (a singleton's "
        "baseline is 0); no division (verl, `core_algos.py`)"
    ),
    needs=("row_lengths", "length_sums"),
    own_baseline=True,
    row_input="its baseline is the length-weighted mean reward",
)
