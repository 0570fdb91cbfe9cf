"""The advantage estimators, one object each (:class:`~grpo_cli.estimators.base.AdvantageEstimator`),
registered once here: the ``--estimator`` choices, in their documented order.

An estimator's settings, needs and steps are read from here by the options (what it sets,
what it refuses), :class:`~grpo_cli.run.plan.RunPlan` (its steps, for both engines), the
tensor API and the documentation. Its math is a kernel function; adding one is a module here
and a line below.

>>> ESTIMATORS["rloo"].settings
{'baseline': 'leave-one-out', 'scale': 'none'}
>>> ESTIMATORS["opo"].needs
('row_lengths', 'length_sums')
>>> [name for name, estimator in ESTIMATORS.items() if estimator.group_only]
['grpo', 'dr_grpo', 'rloo', 'maxrl']
"""

from __future__ import annotations

from grpo_cli.estimators.base import AdvantageEstimator, GroupFacts, Need, RowFacts
from grpo_cli.estimators.gpg import GPG
from grpo_cli.estimators.group import (
    DR_GRPO,
    GRPO,
    MAXRL,
    REINFORCE_BASELINE,
    REINFORCE_PLUS_PLUS_BASELINE,
    RLOO,
)
from grpo_cli.estimators.grpo_passk import GRPO_PASSK
from grpo_cli.estimators.opo import OPO
from grpo_cli.estimators.pass_at_k import PASS_AT_K
from grpo_cli.estimators.reinforce import REINFORCE
from grpo_cli.estimators.remax import REMAX

ESTIMATORS: dict[str, AdvantageEstimator] = {
    estimator.name: estimator
    for estimator in (
        GRPO,
        DR_GRPO,
        RLOO,
        REINFORCE_PLUS_PLUS_BASELINE,
        REINFORCE_BASELINE,
        GPG,
        REMAX,
        OPO,
        GRPO_PASSK,
        MAXRL,
        REINFORCE,
        PASS_AT_K,
    )
}
"""Every estimator, by name."""

__all__ = ["ESTIMATORS", "AdvantageEstimator", "GroupFacts", "Need", "RowFacts"]
