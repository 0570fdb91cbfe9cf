"""The library's front door: :func:`group_advantages` with trainer presets.

It resolves ``preset=`` and ``estimator=`` into the kernel's options (defaults, then the
preset, then the estimator, then explicit keywords) and calls
:func:`grpo_cli.kernel.group_advantages`, which stays pure torch.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from grpo_cli import kernel
from grpo_cli.options import AdvantageOptions


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    epsilon: float | None = None,
    *,
    group_size: int | None = None,
    preset: str | None = None,
    estimator: str | None = None,
    std: str | None = None,
    scale: str | None = None,
    baseline: str | None = None,
    epsilon_mode: str | None = None,
    singleton: str | None = None,
    nan: str | None = None,
) -> kernel.GroupAdvantages:
    """GRPO advantages, optionally in a trainer's convention (``preset="trl"``, ...).

    Same call forms, shapes, dtypes and result as :func:`grpo_cli.kernel.group_advantages`;
    ``epsilon`` defaults to 1e-6, or to the preset's. ``estimator`` is ``"grpo"``,
    ``"dr_grpo"`` (no division) or ``"rloo"`` (leave-one-out baseline, no division).
    Options given explicitly override the preset and the estimator.

    >>> import torch
    >>> r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    >>> group_advantages(r, preset="nemo-rl")["advantages"]  # the others of row 0 are constant
    tensor([[ 1.0000, -0.5773, -0.5773, -0.5773]])
    >>> group_advantages(r, estimator="rloo")["advantages"]
    tensor([[ 1.0000, -0.3333, -0.3333, -0.3333]])
    """
    options = AdvantageOptions.resolve(
        preset=preset,
        estimator=estimator,
        epsilon=epsilon,
        std=std,
        scale=scale,
        baseline=baseline,
        epsilon_mode=epsilon_mode,
        singleton=singleton,
        nan=nan,
    )
    kwargs: dict[str, Any] = options.kernel_kwargs()
    epsilon_value = kwargs.pop("epsilon")
    return kernel.group_advantages(
        rewards,
        group_ids,
        epsilon_value,
        group_size=group_size,
        nan="ignore" if options.nan == "ignore" else "error",
        **kwargs,
    )
