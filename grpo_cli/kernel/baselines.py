"""Per-row baselines and scales of single estimators (GPG's alpha, OPO's length-weighted baseline)."""

from __future__ import annotations

import torch
from torch import Tensor


def gpg_row_scale(batch_rows: Tensor, batch_nonzero: Tensor, *, f_norm: float = 1.0) -> Tensor:
    """verl's GPG factor of each training batch: ``alpha / f_norm``, with ``alpha`` the batch's
    rows over its rows with a non-zero reward (at least 1); float64, shape ``(B,)``.

    >>> gpg_row_scale(torch.tensor([8, 4]), torch.tensor([2, 0]))
    tensor([4., 4.], dtype=torch.float64)
    """
    alpha = batch_rows.to(torch.float64) / batch_nonzero.clamp_min(1).to(torch.float64)
    return alpha / f_norm


def length_weighted_baseline(count: Tensor, length_sums: Tensor, weighted_sums: Tensor) -> Tensor:
    """verl's OPO baseline of each group: ``sum(length * r) / sum(length)`` over its valid rows;
    0 for a one-rollout group or one whose lengths sum to 0. Shapes ``(K,)``; float64.

    >>> length_weighted_baseline(torch.tensor([2, 1]), torch.tensor([3.0, 5.0]), torch.tensor([2.0, 5.0]))
    tensor([0.6667, 0.0000], dtype=torch.float64)
    """
    lengths = length_sums.to(torch.float64)
    safe = torch.where(lengths > 0, lengths, torch.ones_like(lengths))
    baseline = weighted_sums.to(torch.float64) / safe
    return torch.where((count.to(lengths.device) > 1) & (lengths > 0), baseline, torch.zeros_like(baseline))


def row_baseline_advantages(rewards: Tensor, baseline: Tensor, valid: Tensor) -> Tensor:
    """``r - baseline`` per row where ``valid``, else 0 (ReMax's greedy baseline, OPO's group
    baseline gathered per row); float64, shape ``(N,)``.

    >>> valid = torch.tensor([True, False])
    >>> row_baseline_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.25, 0.5]), valid)
    tensor([0.7500, 0.0000], dtype=torch.float64)
    """
    difference = rewards.to(torch.float64) - baseline.to(torch.float64)
    return torch.where(valid, difference, torch.zeros_like(difference))
