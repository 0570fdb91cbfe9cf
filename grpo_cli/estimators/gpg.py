"""GPG (verl): each row's group-centred reward times its batch's ``alpha / f_norm``
(:func:`~grpo_cli.kernel.gpg_row_scale`), from each batch's rows with a non-zero reward."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_cli.estimators.base import AdvantageEstimator, GroupFacts, RowFacts

if TYPE_CHECKING:
    import torch


class Gpg(AdvantageEstimator):
    def between_passes(self, facts: GroupFacts) -> torch.Tensor:
        """Each batch's ``alpha / f_norm``, float64 ``(B,)``."""
        import torch

        from grpo_cli.kernel import gpg_row_scale

        batches = facts.batches
        assert batches is not None and batches.nonzero_rewards is not None
        return gpg_row_scale(
            torch.from_numpy(batches.rows),
            torch.from_numpy(batches.nonzero_rewards),
            f_norm=facts.options.gpg_f_norm,
        )

    def per_row(self, state: Any, rows: RowFacts) -> torch.Tensor:
        import torch

        assert rows.batch_ids is not None
        result: torch.Tensor = rows.advantages.to(torch.float64) * state[rows.batch_ids]
        return result


GPG = Gpg(
    "gpg",
    {"baseline": "mean", "scale": "none", "singleton": "raw"},
    summary="alpha (r - mean)",
    origin="verl",
    description=(
        "`alpha * (r - mean_g) / f_norm`, `alpha` = rows in the batch / rows with a non-zero "
        "reward, `--gpg-f-norm` (default 1); a singleton's mean is 0 (verl, `core_algos.py`)"
    ),
    needs=("batch_nonzero",),
)
