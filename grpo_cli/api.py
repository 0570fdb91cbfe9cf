"""The tensor-level front door: :func:`group_advantages` with trainer presets.

It resolves ``preset=`` and ``estimator=`` into the kernel's options (defaults, then the
preset, then the estimator, then explicit keywords) and calls
:func:`grpo_cli.kernel.normalize_in_groups`, which stays pure torch. Jobs over files
(``compute_dataset``, ``check_dataset``) are in :mod:`grpo_cli.jobs`.
"""

from __future__ import annotations

from torch import Tensor

from grpo_cli import kernel
from grpo_cli.choices import Baseline, EpsilonMode, Estimator, NanPolicy, Preset, Scale, Singleton, Std
from grpo_cli.errors import GrpoError
from grpo_cli.options import ESTIMATOR_NEEDS, AdvantageOptions


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    epsilon: float | None = None,
    *,
    group_size: int | None = None,
    preset: Preset | None = None,
    estimator: Estimator | None = None,
    std: Std | None = None,
    scale: Scale | None = None,
    baseline: Baseline | None = None,
    epsilon_mode: EpsilonMode | None = None,
    singleton: Singleton | None = None,
    nan: NanPolicy | None = None,
) -> kernel.GroupAdvantages:
    """GRPO advantages, optionally in a trainer's convention (``preset="trl"``, ...).

    Same call forms, shapes, dtypes and result as :func:`grpo_cli.kernel.normalize_in_groups`;
    ``epsilon`` defaults to 1e-6, or to the preset's. ``estimator`` is ``"grpo"``,
    ``"dr_grpo"`` (no division) or ``"rloo"`` (leave-one-out baseline, no division); the
    others need more than rewards and groups (a batch whitening, lengths, a baseline column)
    and are refused here with what they need: :func:`grpo_cli.add_advantages` computes them.
    Options given explicitly override the preset and the estimator.

    >>> import torch
    >>> r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    >>> group_advantages(r, preset="nemo-rl")["advantages"]  # the others of row 0 are constant
    tensor([[ 1.0000, -0.5773, -0.5773, -0.5773]])
    >>> group_advantages(r, estimator="rloo")["advantages"]
    tensor([[ 1.0000, -0.3333, -0.3333, -0.3333]])
    >>> group_advantages(r, estimator="opo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    grpo_cli.errors.GrpoError: estimator='opo' needs each row's response length (length_col=), ...
    """
    if estimator is not None and estimator in ESTIMATOR_NEEDS:
        raise GrpoError(
            f"estimator={estimator!r} needs {ESTIMATOR_NEEDS[estimator]}, which group_advantages does not "
            "take; use grpo_cli.add_advantages"
        )
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
    return kernel.normalize_in_groups(
        rewards,
        group_ids,
        options.epsilon,
        group_size=group_size,
        std=options.std,
        scale=options.scale,
        baseline=options.baseline,
        epsilon_mode=options.epsilon_mode,
        singleton=options.singleton,
        nan=options.nan,
    )
