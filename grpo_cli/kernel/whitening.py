"""Batch whitening: weighted moments of a batch's advantages and the transform they give."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_cli.kernel.exact import sqrt_rn


@dataclass(frozen=True)
class WeightedMoments:
    """Per-batch weighted moments of advantages, all float64 of shape ``(num_batches,)``.

    ``weight`` is the sum of the weights (rows, or tokens with a length weight), ``mean``
    the weighted mean and ``m2`` the weighted centred sum of squares. Merge chunks with
    :func:`merge_weighted_moments`.
    """

    weight: Tensor
    mean: Tensor
    m2: Tensor
    count: Tensor  # rows, int64


def weighted_moments(
    values: Tensor,
    weights: Tensor | None,
    batch_ids: Tensor,
    num_batches: int,
    *,
    valid: Tensor | None = None,
) -> WeightedMoments:
    """Weighted moments of ``values`` per batch (corrected two-pass), in float64.

    ``valid`` (bool, the rows' shape; ``None``: all): rows whose reward was left out of the
    statistics are left out here too, as TRL's ``nanstd`` leaves out unscorable rows.

    >>> m = weighted_moments(torch.tensor([1.0, 3.0, 10.0]), None, torch.tensor([0, 0, 1]), 2)
    >>> m.weight.tolist(), m.mean.tolist(), m.m2.tolist()
    ([2.0, 1.0], [2.0, 10.0], [2.0, 0.0])
    >>> weighted_moments(torch.tensor([1.0, 3.0, 0.0]), None, torch.tensor([0, 0, 0]), 1,
    ...                  valid=torch.tensor([True, True, False])).count.tolist()
    [2]
    """
    if valid is not None:
        values, batch_ids = values[valid], batch_ids[valid]
        weights = None if weights is None else weights[valid]
    x = values.to(torch.float64)
    w = torch.ones_like(x) if weights is None else weights.to(torch.float64)
    ids = batch_ids.to(torch.int64)

    def total(v: Tensor) -> Tensor:
        return torch.zeros(num_batches, dtype=torch.float64, device=x.device).index_add_(0, ids, v)

    weight = total(w)
    safe = torch.where(weight > 0, weight, torch.ones_like(weight))
    mean = total(w * x) / safe
    deviation = x - torch.take(mean, ids)
    correction = total(w * deviation) / safe
    m2 = (total(w * deviation * deviation) - correction * total(w * deviation)).clamp_min(0)
    count = torch.bincount(ids, minlength=num_batches)
    return WeightedMoments(weight, mean + correction, m2, count)


def merge_weighted_moments(a: WeightedMoments, b: WeightedMoments) -> WeightedMoments:
    """Combine the moments of two disjoint sets of rows (Chan et al., weighted)."""
    weight = a.weight + b.weight
    safe = torch.where(weight > 0, weight, torch.ones_like(weight))
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.weight / safe)
    m2 = a.m2 + b.m2 + delta * delta * (a.weight * b.weight / safe)
    return WeightedMoments(weight, mean, m2, a.count + b.count)


class WeightedMomentsAccumulator:
    """:func:`weighted_moments` over chunks fed in row order, cut into blocks at fixed global row
    positions (multiples of ``block_rows``) as :class:`GroupStatsAccumulator` cuts them: the
    moments, and so the whitened advantages, depend only on the rows and their order, not on the
    sizes of the record batches they were read in.

    >>> acc = WeightedMomentsAccumulator(num_batches=1, block_rows=4)
    >>> acc.update(torch.tensor([1.0, 3.0]), None, torch.tensor([0, 0]))
    >>> acc.update(torch.tensor([5.0]), None, torch.tensor([0]))
    >>> m = acc.compute()
    >>> m.mean.tolist(), m.m2.tolist(), m.count.tolist()
    ([3.0], [8.0], [3])
    """

    def __init__(self, *, num_batches: int, block_rows: int = 1 << 22) -> None:
        if block_rows < 1:
            raise ValueError(f"block_rows must be positive, got {block_rows}")
        self.num_batches = num_batches
        self.block_rows = block_rows
        self._pending: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self._pending_rows = 0
        self._total = weighted_moments(torch.zeros(0), None, torch.zeros(0, dtype=torch.int64), num_batches)

    def update(
        self, values: Tensor, weights: Tensor | None, batch_ids: Tensor, *, valid: Tensor | None = None
    ) -> None:
        """Add a chunk: values ``(n,)``, weights ``(n,)`` or ``None``, batch IDs ``(n,)`` int,
        ``valid`` bool ``(n,)`` or ``None`` (see :func:`weighted_moments`)."""
        n = values.numel()
        if n == 0:
            return
        x = values.reshape(-1).to(torch.float64)
        w = torch.ones_like(x) if weights is None else weights.reshape(-1).to(torch.float64)
        keep = torch.ones_like(x, dtype=torch.bool) if valid is None else valid.reshape(-1)
        self._pending.append((x, w, batch_ids.reshape(-1).to(torch.int64), keep))
        self._pending_rows += n
        while self._pending_rows >= self.block_rows:
            self._flush(self.block_rows)

    def compute(self) -> WeightedMoments:
        if self._pending_rows:
            self._flush(self._pending_rows)
        return self._total

    def _flush(self, rows: int) -> None:
        x, w, ids, keep = (torch.cat([p[i] for p in self._pending]) for i in range(4))
        self._pending = [(x[rows:], w[rows:], ids[rows:], keep[rows:])] if x.numel() > rows else []
        self._pending_rows = x.numel() - rows
        block = weighted_moments(x[:rows], w[:rows], ids[:rows], self.num_batches, valid=keep[:rows])
        self._total = merge_weighted_moments(self._total, block)


@dataclass(frozen=True)
class BatchTransform:
    """``A = (A0 - shift[b]) * factor[b]`` for a row of batch ``b``; float64 ``(num_batches,)``."""

    shift: Tensor
    factor: Tensor

    def apply(self, advantages: Tensor, batch_ids: Tensor) -> Tensor:
        """The transformed advantages, in float64."""
        x = advantages.to(torch.float64)
        ids = batch_ids.to(torch.int64)
        return (x - torch.take(self.shift, ids)) * torch.take(self.factor, ids)


def whitening(moments: WeightedMoments, *, method: str) -> BatchTransform:
    """The batch transform that whitens advantages with these moments.

    ``method``:

    * ``"unbiased"``: verl's ``masked_whiten`` (ROLL's whitening): weighted mean, unbiased
      variance ``m2 / (W - 1)``, ``(x - mean) * rsqrt(var + 1e-8)``;
    * ``"population"``: OpenRLHF's advantage whitening: ``m2 / W``,
      ``(x - mean) * rsqrt(max(var, 1e-8))``;
    * ``"trl-rloo"``: TRL RLOOTrainer's ``normalize_advantages``: mean and sample std over the
      batch's rows, ``(x - mean) / (std + 1e-4)``;
    * ``"areal"``: AReaL's ``Normalization`` at the batch level (``adv_norm``): weighted mean,
      unbiased std ``sqrt(m2 / (W - 1))`` (1 where ``W <= 1``), ``(x - mean) / (std + 1e-5)``;
    * ``"trl"``: TRL's re-normalisation of the summed per-reward advantages: no shift (the
      exact mean is 0: each reward's advantages sum to 0 in every group), sample std over
      rows, ``x / (std + 1e-4)``;
    * ``"gdpo"``: NeMo-RL's GDPO: ``(x - mean) / std`` with the sample std over rows, or
      only ``x - mean`` where that std is 0.

    >>> m = weighted_moments(torch.tensor([1.0, 3.0]), None, torch.tensor([0, 0]), 1)
    >>> whitening(m, method="population").apply(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    tensor([-1.,  1.], dtype=torch.float64)
    """
    weight, mean, m2 = moments.weight, moments.mean, moments.m2
    rows = moments.count.to(torch.float64)
    if method == "unbiased":
        variance = m2 / (weight - 1).clamp_min(1)
        return BatchTransform(mean, 1 / sqrt_rn(variance + 1e-8))
    if method == "population":
        variance = m2 / weight.clamp_min(1)
        return BatchTransform(mean, 1 / sqrt_rn(variance.clamp_min(1e-8)))
    if method == "trl-rloo":
        rows_std = sqrt_rn(m2 / (rows - 1).clamp_min(1))
        return BatchTransform(mean, 1 / (rows_std + 1e-4))
    if method == "areal":
        std = torch.where(weight > 1, sqrt_rn(m2 / (weight - 1).clamp_min(1)), torch.ones_like(m2))
        return BatchTransform(mean, 1 / (std + 1e-5))
    sample_std = sqrt_rn(m2 / (rows - 1).clamp_min(1))
    if method == "trl":
        return BatchTransform(torch.zeros_like(mean), 1 / (sample_std + 1e-4))
    if method == "gdpo":
        return BatchTransform(mean, 1 / torch.where(sample_std > 0, sample_std, torch.ones_like(sample_std)))
    raise ValueError(f"method must be unbiased, population, areal, trl-rloo, trl or gdpo, got {method!r}")
