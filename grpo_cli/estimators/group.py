"""The estimators the group normalisation alone computes, given their settings: the kernel's
:func:`~grpo_cli.kernel.prepare_normalization` and, for the whitening ones, the batch
transform (:func:`~grpo_cli.kernel.whitening`)."""

from __future__ import annotations

from grpo_cli.estimators.base import AdvantageEstimator

GRPO = AdvantageEstimator("grpo", {"baseline": "mean"}, "(r - mean) / (std + eps)", range_from_extremes=True)
DR_GRPO = AdvantageEstimator(
    "dr_grpo", {"baseline": "mean", "scale": "none"}, "Dr. GRPO: r - mean", range_from_extremes=True
)
RLOO = AdvantageEstimator(
    "rloo", {"baseline": "leave-one-out", "scale": "none"}, "RLOO: r - the mean of the others"
)
REINFORCE_PLUS_PLUS_BASELINE = AdvantageEstimator(
    "reinforce_plus_plus_baseline",
    {"baseline": "mean", "scale": "none", "singleton": "raw", "whiten": "unbiased"},
    "verl: r - group mean (a singleton's mean is 0), then masked_whiten over the batch",
)
REINFORCE_BASELINE = AdvantageEstimator(
    "reinforce_baseline",
    {"baseline": "mean", "scale": "none", "singleton": "zero", "whiten": "population"},
    "OpenRLHF: r - group mean, then its advantage whitening over the batch (population)",
)
MAXRL = AdvantageEstimator(
    "maxrl",
    {"baseline": "mean", "scale": "mean", "epsilon_mode": "clamp", "singleton": "zero"},
    "MaxRL (prime-rl MaxRLAlgorithm.score_group): (r - mean) / mean; a group with mean <= 0 "
    "and a singleton get 0",
)
