"""PKPO's pass@k (:func:`~grpo_cli.kernel.pass_at_k_advantages`): each rollout's credit over the
k-subsets of its group, centred in the group. It reads every reward of each group between
the passes and keeps a table per group and distinct reward
(:class:`~grpo_cli.estimators.credit.RewardCredit`), which pass 2 searches for each row's reward."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from grpo_cli.estimators.base import AdvantageEstimator, GroupFacts, RowFacts

if TYPE_CHECKING:
    import numpy as np
    import torch

    from grpo_cli.estimators.credit import RewardCredit

_COLUMNS = ("group", "reward", "advantage")


class PassAtK(AdvantageEstimator):
    def of_group_rows(
        self, facts: GroupFacts, ids: torch.Tensor, values: torch.Tensor, scored: torch.Tensor
    ) -> RewardCredit:
        from grpo_cli.estimators.credit import RewardCredit
        from grpo_cli.kernel import pass_at_k_advantages

        k = facts.options.pass_k
        assert k is not None
        groups = int(facts.active.numel())
        values, ids = values[scored], ids[scored]
        advantages = pass_at_k_advantages(values, ids, groups, k=k, active=facts.active)
        return RewardCredit.of(values, ids, advantages, groups)

    def state_columns(self, state: Any) -> dict[str, np.ndarray]:
        return dict(zip(_COLUMNS, (state.groups, state.values, state.advantages), strict=True))

    def state_of_columns(
        self, parts: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[int]
    ) -> RewardCredit:
        import numpy as np

        from grpo_cli.estimators.credit import RewardCredit

        return RewardCredit.concat(
            [
                RewardCredit.of_counts(
                    np.bincount(part["group"], minlength=size), part["reward"], part["advantage"]
                )
                for part, size in zip(parts, sizes, strict=True)
            ]
        )

    def per_row(self, state: Any, rows: RowFacts) -> torch.Tensor:
        result: torch.Tensor = state.advantages_of(
            rows.ids.cpu().numpy(), rows.rewards.combined, rows.rewards.combined_valid
        )
        return result


PASS_AT_K = PassAtK(
    "pass_at_k",
    {"baseline": "mean", "scale": "none"},
    summary="the rollout's share of the best of k, centred (--pass-k)",
    origin="PKPO",
    description=(
        "PKPO (Pass@K Policy Optimization, arXiv:2505.15201): each rollout's credit is `sum over "
        "the k-subsets S of its group that hold it of max(r in S) / C(n, k)`, the advantage that "
        "credit minus its group mean; exact for binary and continuous rewards (computed from the "
        "sorted rewards with exact binomial ratios, float64), `k` clamped to `[1, n]` per group "
        "(`k = 1` is `(r - mean) / n`); tied rewards get the same value, a constant group `+0.0`. "
        "Its one trainer implementation, rllm PR #743, is an open pull request not in the fetched "
        "rllm snapshot: tested against the definition enumerated in exact fractions, the paper's "
        "Theorem 2 (a correct rollout `k/n`, an incorrect one `(k/n) rho(n-1, c, k-1)`) and the "
        "pull request's example (`n=4, c=2, k=2`: `+-1/12`). It holds every row's reward and "
        "group in memory (16 bytes a row)"
    ),
    needs=("group_rewards",),
    own_baseline=True,
    takes={"pass_k": "the k of pass@k it optimises"},
)
