"""The group-advantage kernel: pure PyTorch, no I/O.

Every path in grpo-cli (the in-memory API, the streaming CLI, ``check``) goes through
the same three steps, in the style of torchmetrics' update/compute split:

1. :func:`group_stats` turns one chunk of rewards into per-group sufficient statistics
   (count, mean, centred sum of squares, min and max), accumulated in float64;
2. :func:`merge_group_stats` combines the statistics of two chunks (Chan et al.);
3. :func:`advantages_from_stats` normalises rewards with the final statistics.

:func:`normalize_in_groups` is the one-call convenience wrapper over the three;
:func:`grpo_cli.api.group_advantages` adds trainer presets on top of it.

Numerical contract:

* a group is *active* when its rewards are not all identical; this is decided exactly,
  by comparing the group's minimum and maximum, never from a rounded variance;
* inactive groups get advantages of exactly ``+0.0``, whatever the dtype and epsilon;
* statistics accumulate in float64 (float32 on MPS, which has no float64) with a
  corrected two-pass centred variance, never ``E[x^2] - E[x]^2``;
* every finite reward gives the right advantage, 1e-300 and 1e300 alike: a group whose
  rewards lie outside ``[2**-256, 2**256)`` in magnitude (``[2**-32, 2**32)`` in float32)
  is computed in units of a power of two (:func:`group_scale`), which is exact, so that
  squares neither overflow nor underflow. Ordinary rewards have scale 1 and take the
  unscaled path, bit for bit;
* the same input gives the same bits on every CPU (x86-64 or ARM, any vector width, any
  thread count): every float64 operation is an IEEE one (``+ - * /``, each correctly
  rounded), :func:`sqrt_rn` where a square root is taken (torch's own ``sqrt`` goes through
  the vector-math library of the CPU it runs on, which is not correctly rounded), and every
  sum is a left fold in a set order (:func:`fold_sum`, the group folds) or exact
  (:class:`ExactSum`), never a reduction whose order follows the vector width or the threads;
* a batch's reward mean and std (``scale="batch"``'s divisor, the summary's reward figures)
  are exact sums over its groups rounded once (:class:`RewardTotals`), so groups held apart
  (a Ray run's buckets) give the bits of one machine holding them all.
"""

from __future__ import annotations

from grpo_cli.choices import Baseline, EpsilonMode, NanPolicy, Scale, Singleton, Std
from grpo_cli.kernel.accumulate import GroupStatsAccumulator, group_stats
from grpo_cli.kernel.baselines import gpg_row_scale, length_weighted_baseline, row_baseline_advantages
from grpo_cli.kernel.batch import (
    RewardTotals,
    batch_mean_std,
    batch_moments,
    batch_std,
    squared_deviations,
    squared_deviations_of,
)
from grpo_cli.kernel.exact import EXACT_LOWEST_EXPONENT, ExactSum, fold_sum, sqrt_rn
from grpo_cli.kernel.layout import flat_groups
from grpo_cli.kernel.normalize import (
    Divisor,
    GroupAdvantages,
    Normalization,
    advantages_from_stats,
    apply_normalization,
    normalize_in_groups,
    prepare_normalization,
)
from grpo_cli.kernel.passk import (
    NO_ROW,
    TopTwo,
    group_top_two,
    merge_top_two,
    pass_at_k_advantages,
    pass_at_k_weights,
    passk_advantages,
    passk_best_advantage,
)
from grpo_cli.kernel.shaping import shaped_rewards
from grpo_cli.kernel.stats import (
    GroupStats,
    RunningGroupStats,
    accumulator_dtype,
    active_groups,
    empty_group_stats,
    group_scale,
    group_scales,
    group_std,
    merge_group_stats,
)
from grpo_cli.kernel.whitening import (
    BatchTransform,
    WeightedMoments,
    WeightedMomentsAccumulator,
    merge_weighted_moments,
    weighted_moments,
    whitening,
)

__all__ = [
    "EXACT_LOWEST_EXPONENT",
    "NO_ROW",
    "Baseline",
    "BatchTransform",
    "Divisor",
    "EpsilonMode",
    "ExactSum",
    "GroupAdvantages",
    "GroupStats",
    "GroupStatsAccumulator",
    "NanPolicy",
    "Normalization",
    "RewardTotals",
    "RunningGroupStats",
    "Scale",
    "Singleton",
    "Std",
    "TopTwo",
    "WeightedMoments",
    "WeightedMomentsAccumulator",
    "accumulator_dtype",
    "active_groups",
    "advantages_from_stats",
    "apply_normalization",
    "batch_mean_std",
    "batch_moments",
    "batch_std",
    "empty_group_stats",
    "flat_groups",
    "fold_sum",
    "gpg_row_scale",
    "group_scale",
    "group_scales",
    "group_stats",
    "group_std",
    "group_top_two",
    "length_weighted_baseline",
    "merge_group_stats",
    "merge_top_two",
    "merge_weighted_moments",
    "normalize_in_groups",
    "pass_at_k_advantages",
    "pass_at_k_weights",
    "passk_advantages",
    "passk_best_advantage",
    "prepare_normalization",
    "row_baseline_advantages",
    "shaped_rewards",
    "sqrt_rn",
    "squared_deviations",
    "squared_deviations_of",
    "weighted_moments",
    "whitening",
]
