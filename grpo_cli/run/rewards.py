"""Rewards as tensors: one batch's reward channels and combined reward, how several reward
columns combine, the refusals of bad rewards and lengths, and one batch's advantages. Pure
torch: the tensor API runs on it without Arrow (the columns it is read from:
:mod:`grpo_cli.run.reward_columns`).

With several weighted reward columns the batch carries either one channel (their weighted
sum, ``sum-then-normalize``) or one channel per column (``normalize-then-sum``, GDPO), and
always the combined reward for the summary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from grpo_cli.errors import GrpoError, mention
from grpo_cli.kernel import Normalization, apply_normalization, fold_sum
from grpo_cli.options.advantage import AdvantageOptions


@dataclass
class RewardBatch:
    """Rewards of one batch: per channel tensor and validity, plus the combined reward.

    Validity tensors are bool of the batch's length, or ``None`` when every value is finite.
    """

    channels: list[torch.Tensor]
    channel_valid: list[torch.Tensor | None]
    combined: torch.Tensor
    combined_valid: torch.Tensor | None
    unshaped: torch.Tensor | None = None  # the combined reward before the reward transforms

    def scored(self) -> torch.Tensor:
        """Which rows' combined reward counts (bool, the batch's length): ``combined_valid``, or
        every row where that is ``None``."""
        if self.combined_valid is None:
            return torch.ones(self.combined.numel(), dtype=torch.bool)
        return self.combined_valid

    @staticmethod
    def concat(parts: Sequence[RewardBatch]) -> RewardBatch:
        """The batches one after the other."""
        if len(parts) == 1:
            return parts[0]
        channels = len(parts[0].channels)
        channel_values = [[p.channels[c] for p in parts] for c in range(channels)]
        combined = [p.combined for p in parts]
        return RewardBatch(
            channels=[torch.cat(v) for v in channel_values],
            channel_valid=[
                _concat_valid([p.channel_valid[c] for p in parts], channel_values[c]) for c in range(channels)
            ],
            combined=torch.cat(combined),
            combined_valid=_concat_valid([p.combined_valid for p in parts], combined),
            unshaped=None
            if any(p.unshaped is None for p in parts)
            else torch.cat([p.unshaped for p in parts if p.unshaped is not None]),
        )


def _concat_valid(masks: list[torch.Tensor | None], values: list[torch.Tensor]) -> torch.Tensor | None:
    if all(m is None for m in masks):
        return None
    return torch.cat(
        [torch.ones_like(v, dtype=torch.bool) if m is None else m for m, v in zip(masks, values, strict=True)]
    )


@dataclass(frozen=True)
class RewardCombination:
    """How a row's reward columns become its rewards, on tensors: each column's weight, one
    channel or one per column (``per_column``), TRL's ``nansum``, the reward transforms
    (``shaping``), and whether the single column is floating (``floating``: it then keeps its
    dtype where nothing is combined or shaped).

    >>> one = RewardCombination((1.0,), per_column=False)
    >>> one.combine([torch.tensor([0.5, float("nan")])]).combined_valid
    tensor([ True, False])
    """

    weights: tuple[float, ...]
    per_column: bool
    nansum: bool = False
    shaping: AdvantageOptions | None = None
    floating: bool = True

    @property
    def native(self) -> bool:
        """One floating column of weight 1, neither summed by ``nansum`` nor shaped: its values
        are the rewards, in their own dtype (TRL's nansum adds even one column to +0.0, which
        turns a -0.0 reward into +0.0)."""
        return self.weights == (1.0,) and self.floating and self.shaping is None and not self.nansum

    def combine(
        self,
        values: Sequence[torch.Tensor],
        *,
        lengths: torch.Tensor | None = None,
        truncated: torch.Tensor | None = None,
    ) -> RewardBatch:
        """The rewards of rows whose reward columns hold ``values`` (one tensor a column, NaN
        for a null), with each row's length and truncation flag where a transform reads them."""
        if self.native:
            tensor = values[0]
            valid = _finite(tensor)
            return RewardBatch([tensor], [valid], tensor, valid)
        weighted = [v.to(torch.float64) * weight for v, weight in zip(values, self.weights, strict=True)]
        combined = _weighted_sum(weighted, nansum=self.nansum)
        unshaped = None
        if self.shaping is not None:
            unshaped = combined
            combined = self.shaping.shape(combined, lengths=lengths, truncated=truncated)
        combined_valid = _finite(combined)
        if unshaped is not None:  # a bad reward as read stays bad: --reward-clip turns inf into a bound
            combined_valid = _both(combined_valid, _finite(unshaped))
        if self.per_column:
            scaled = [v.to(torch.float64) for v in values]
            return RewardBatch(scaled, [_finite(v) for v in scaled], combined, combined_valid)
        return RewardBatch([combined], [combined_valid], combined, combined_valid, unshaped)


def refuse_bad_lengths(lengths: torch.Tensor, where: Callable[[int], str], *, column: str | None) -> None:
    """Refuse a NaN, negative or infinite length (float64 ``(N,)``), at its row as ``where``
    names it; ``column``: the ``--length-col`` it was read from (``None``: the caller's tensor)."""
    bad = ~(torch.isfinite(lengths) & (lengths >= 0))
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        named = mention("length_col") if column is None else f"{mention('length_col')} {column!r}"
        raise GrpoError(f"{where(row)}: {named} is {float(lengths[row])}; lengths must be finite and >= 0")


def bad_rewards_error(where: str, value: str, count: int) -> GrpoError:
    """The refusal of a null, NaN or infinite reward under ``--nan error``: the first one
    (``where``, its ``value`` as read) and how many there are."""
    return GrpoError(
        f"{where}: reward is {value}; {count} reward(s) in all are null, NaN or infinite "
        f"({mention('nan')} ignore leaves them out)"
    )


def _weighted_sum(weighted: Sequence[torch.Tensor], *, nansum: bool) -> torch.Tensor:
    """The combined reward: the plain sum (a NaN anywhere makes the row NaN), or TRL's
    ``nansum`` (a NaN counts as 0; the row is NaN only where every term is NaN).

    >>> nan = float("nan")
    >>> terms = [torch.tensor([1.0, nan, nan]), torch.tensor([0.5, 0.5, nan])]
    >>> _weighted_sum(terms, nansum=False).tolist()
    [1.5, nan, nan]
    >>> _weighted_sum(terms, nansum=True).tolist()
    [1.5, 0.5, nan]
    """
    if not nansum:
        combined = weighted[0]
        for extra in weighted[1:]:
            combined = combined + extra
        return combined
    terms = torch.stack(list(weighted))
    missing = torch.isnan(terms)
    total = fold_sum(torch.where(missing, torch.zeros_like(terms), terms), dim=0)  # in column order
    return torch.where(missing.all(dim=0), torch.full_like(total, float("nan")), total)


def _finite(values: torch.Tensor) -> torch.Tensor | None:
    """Validity mask, or ``None`` when every value is finite (the common case).

    On the CPU through NumPy, whose ``isfinite`` is a vector loop with no allocation
    per call: torch's took a tenth of a 10M-row run.

    >>> _finite(torch.tensor([1.0, 2.0])), _finite(torch.tensor([1.0, float("inf")]))
    (None, tensor([ True, False]))
    """
    if values.device.type == "cpu" and values.dtype != torch.bfloat16:  # NumPy has no bfloat16
        finite = np.isfinite(values.numpy())
        return None if finite.all() else torch.from_numpy(finite)
    mask = torch.isfinite(values)
    return None if bool(mask.all()) else mask


def _both(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """Two :func:`_finite` masks in one (``None``: every value finite in both).

    >>> _both(None, torch.tensor([True, False])), _both(None, None)
    (tensor([ True, False]), None)
    """
    if a is None or b is None:
        return b if a is None else a
    return a & b


def combined_advantages(
    rewards: RewardBatch,
    ids: torch.Tensor,
    norms: Sequence[Normalization],
    active: torch.Tensor,
    *,
    weights: Sequence[float],
    device: torch.device,
) -> torch.Tensor:
    """Advantages of one batch: one channel, or the ``weights``-weighted sum of per-reward channels."""
    ids_dev = ids.to(device)
    total: torch.Tensor | None = None
    for channel, (values, valid, norm) in enumerate(
        zip(rewards.channels, rewards.channel_valid, norms, strict=True)
    ):
        part = apply_normalization(
            values.to(device), ids_dev, norm, valid=None if valid is None else valid.to(device)
        )
        if len(norms) > 1:
            part = part.to(torch.float64) * weights[channel]
        total = part if total is None else total + part
    assert total is not None
    if len(norms) > 1:
        # each channel leaves inactive groups at exactly 0; so does the weighted sum
        total = torch.where(active.to(device)[ids_dev], total, torch.zeros_like(total))
    return total
