"""The estimators the group normalisation alone computes, given their settings: the kernel's
:func:`~grpo_cli.kernel.prepare_normalization` and, for the whitening ones, the batch
transform (:func:`~grpo_cli.kernel.whitening`)."""

from __future__ import annotations

from grpo_cli.estimators.base import AdvantageEstimator

GRPO = AdvantageEstimator(
    "grpo",
    {"baseline": "mean"},
    summary="(r - mean) / std",
    description="`(r - mean_g) / (std_g + eps)`",
    range_from_extremes=True,
)
DR_GRPO = AdvantageEstimator(
    "dr_grpo",
    {"baseline": "mean", "scale": "none"},
    summary="r - mean",
    description="`r - mean_g` (Dr. GRPO: no division)",
    range_from_extremes=True,
)
RLOO = AdvantageEstimator(
    "rloo",
    {"baseline": "leave-one-out", "scale": "none"},
    summary="r - mean of the others",
    description="`r_i - mean of the other rewards of the group` (zero for singletons)",
)
REINFORCE_PLUS_PLUS_BASELINE = AdvantageEstimator(
    "reinforce_plus_plus_baseline",
    {"baseline": "mean", "scale": "none", "singleton": "raw", "whiten": "unbiased"},
    summary="r - mean, whitened over the batch",
    origin="verl",
    description=(
        "`r - mean_g` (a singleton's mean is 0), then whitened over the batch as verl's "
        "`masked_whiten`: `(x - mean) * rsqrt(var + 1e-8)`, unbiased variance, weighted by "
        "`--length-col` (verl, `core_algos.py`)"
    ),
)
REINFORCE_BASELINE = AdvantageEstimator(
    "reinforce_baseline",
    {"baseline": "mean", "scale": "none", "singleton": "zero", "whiten": "population"},
    summary="r - mean, whitened over the batch",
    origin="OpenRLHF",
    description=(
        "`r - mean_g`, then OpenRLHF's whitening: `(x - mean) * rsqrt(max(var, 1e-8))`, "
        "population variance, weighted by `--length-col` (OpenRLHF, `experience_maker.py`)"
    ),
)
MAXRL = AdvantageEstimator(
    "maxrl",
    {"baseline": "mean", "scale": "mean", "epsilon_mode": "clamp", "singleton": "zero"},
    summary="(r - mean) / mean",
    origin="prime-rl",
    description=(
        "MaxRL, `(r - mean) / mean` (`--scale mean`), with prime-rl's edge rules: a group whose "
        "mean is `<= 0` gets 0, a singleton 0 (prime-rl, `orchestrator/algo/max_rl.py` "
        "`MaxRLAlgorithm.score_group`); the divisor is `max(mean, eps)` (`--epsilon-mode clamp`), "
        "prime-rl's own for any mean `>= eps`. SkyRL's `compute_maxrl_advantage` (`ppo_utils.py`) "
        "is `--epsilon-mode add --singleton raw`: `/(mean + 1e-6)`, a singleton `r`; SkyRL does "
        "not guard a mean `<= 0` (negative rewards flip the sign there) and grpo-cli does. TRL's "
        "PR #5026 (`/(mean + 1e-4)`) would be `--epsilon-mode add --epsilon 1e-4`, not checked "
        "against TRL's code (it is not in the snapshot fetched). Both trainers compute in "
        "float32: the difference is rounding residue, which `check --verify-advantage-col` passes"
    ),
)
