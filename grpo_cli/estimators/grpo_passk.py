"""verl's Pass@k GRPO: only each group's first best rollout gets an advantage,
``(r_max - r_second) / (std + eps)`` (:func:`~grpo_cli.kernel.passk_best_advantage`), from pass
1's top two rewards of each group."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_cli.estimators.base import AdvantageEstimator, GroupFacts, RowFacts

if TYPE_CHECKING:
    import torch


class GrpoPassk(AdvantageEstimator):
    def between_passes(self, facts: GroupFacts) -> tuple[torch.Tensor, torch.Tensor]:
        """Each group's first best row (its place in the input) and that row's advantage."""
        from grpo_cli.kernel import passk_best_advantage

        options, top_two = facts.options, facts.top_two
        assert top_two is not None
        best = passk_best_advantage(
            facts.stats.to("cpu"),
            top_two,
            facts.active,
            epsilon=options.epsilon,
            std=options.std,
            scale=options.scale,
        )
        return top_two.best_row, best

    def per_row(self, state: Any, rows: RowFacts) -> torch.Tensor:
        import torch

        from grpo_cli.kernel import passk_advantages

        best_row, best = state
        positions = torch.arange(rows.first_position, rows.first_position + rows.ids.numel())
        return passk_advantages(rows.ids.cpu(), positions, best_row, best)


GRPO_PASSK = GrpoPassk(
    "grpo_passk",
    {"baseline": "mean", "std": "sample"},
    summary="the best rollout only",
    origin="verl",
    description=(
        "only the first row of a group that reaches its best reward gets `(r_max - r_second) / "
        "(sample std + eps)` (`--scale none`: no division); every other row 0; a singleton 0, "
        "where verl raises (verl, `core_algos.py`)"
    ),
    needs=("top_two",),
    own_baseline=True,
)
