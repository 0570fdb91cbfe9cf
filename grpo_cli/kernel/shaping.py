"""Reward transforms applied before grouping."""

from __future__ import annotations

import torch
from torch import Tensor


def shaped_rewards(
    rewards: Tensor,
    *,
    lengths: Tensor | None = None,
    truncated: Tensor | None = None,
    overlong: tuple[float, float] | None = None,
    overlong_factor: float = 1.0,
    overlong_capped: bool = True,
    stop_properly: float | None = None,
    bias: float = 0.0,
    scale: float = 1.0,
    clip: tuple[float, float] | None = None,
) -> Tensor:
    """The rewards after the transforms trainers apply before their estimator, in this order;
    float64, shape of ``rewards`` ``(N,)`` (a NaN stays NaN).

    1. ``overlong = (max_tokens, buffer)``: DAPO's overlong penalty on a response of
       ``lengths`` tokens, ``-(length - (max_tokens - buffer)) / buffer * overlong_factor``
       where positive; ``overlong_capped`` caps the excess at ``buffer`` (a floor of
       ``-overlong_factor``: OpenRLHF ``apply_overlong_penalty``, the DAPO paper), else it
       grows without bound (NeMo-RL ``apply_reward_shaping``);
    2. ``stop_properly``: ProRL's penalty on a ``truncated`` rollout (bool, ``(N,)``): a factor
       in ``[0, 1]`` on its reward, or, negative, its reward (OpenRLHF);
    3. ``(r + bias) * scale`` (AReaL's ``reward_bias`` and ``reward_scaling``);
    4. ``clip = (lo, hi)``: clamp (TRL RLOO's ``reward_clip_range``, AReaL's ``reward_clip``).

    >>> r = torch.tensor([1.0, 1.0, 0.0, 1.0])
    >>> shaped_rewards(r, lengths=torch.tensor([10.0, 90.0, 99.0, 200.0]), overlong=(100, 20)).tolist()
    [1.0, 0.5, -0.95, 0.0]
    >>> shaped_rewards(r, truncated=torch.tensor([False, True, True, False]), stop_properly=0.5).tolist()
    [1.0, 0.5, 0.0, 1.0]
    """
    x = rewards.to(torch.float64)
    if overlong is not None:
        if lengths is None:
            raise ValueError("the overlong penalty needs each response's length")
        max_tokens, buffer = overlong
        exceed = lengths.to(torch.float64) - (max_tokens - buffer)
        if overlong_capped:
            exceed = exceed.clamp(max=buffer)
        x = x + torch.clamp(-exceed / buffer * overlong_factor, max=0.0)
    if stop_properly is not None:
        if truncated is None:
            raise ValueError("the stop-properly penalty needs each rollout's truncation flag")
        cut = truncated.to(torch.bool)
        penalised = torch.full_like(x, stop_properly) if stop_properly < 0 else x * stop_properly
        x = torch.where(cut & ~torch.isnan(x), penalised, x)
    if bias != 0.0 or scale != 1.0:
        x = (x + bias) * scale
    if clip is not None:
        x = x.clamp(clip[0], clip[1])
    return x
