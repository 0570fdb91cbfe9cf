"""The tensor-level front door: :func:`group_advantages` with trainer presets and every estimator.

It resolves ``preset=`` and ``estimator=`` into the kernel's options (defaults, then the
preset, then the estimator, then explicit keywords). An estimator that the group
normalisation alone computes (grpo, dr_grpo, rloo) goes straight to
:func:`grpo_cli.kernel.normalize_in_groups`, on the tensors' device. The others need a step
over the whole batch, a per-row input or the rows' order: they run on the tensors through the
pieces a file run goes through (:func:`grpo_cli.run.tensors.run_on_tensors`: the plan, its
statistics blocks and figures, the estimator's steps), so that every entry point computes
each estimator exactly as ``grpo-cli compute`` does. Jobs over files are in :mod:`grpo_cli.jobs`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from grpo_cli import kernel
from grpo_cli.choices import (
    Baseline,
    EpsilonMode,
    Estimator,
    NanPolicy,
    Preset,
    Scale,
    Singleton,
    Std,
)
from grpo_cli.errors import GrpoError, mention
from grpo_cli.estimators import ESTIMATORS
from grpo_cli.options.advantage import AdvantageOptions
from grpo_cli.options.catalog import keyword_named

if TYPE_CHECKING:
    from grpo_cli.options.config import ComputeConfig


class PerRow(NamedTuple):
    """A per-row input of the tensor API: the option its column stands for, the column it
    becomes on the engine path, and the estimator need that requires it (``None``: optional)."""

    option: str
    column: str
    need: str | None


PER_ROW = {
    "lengths": PerRow("length_col", "length", "row_lengths"),
    "baselines": PerRow("baseline_col", "baseline", "row_baselines"),
    "batch_ids": PerRow("batch_col", "batch", None),
}


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
    pass_k: int | None = None,
    lengths: Tensor | None = None,
    baselines: Tensor | None = None,
    batch_ids: Tensor | None = None,
) -> kernel.GroupAdvantages:
    """GRPO-family advantages, optionally in a trainer's convention (``preset="trl"``, ...).

    Same call forms, shapes, dtypes and result as :func:`grpo_cli.kernel.normalize_in_groups`;
    ``epsilon`` defaults to 1e-6, or to the preset's. Options given explicitly override the
    preset and the estimator. Every ``--estimator`` is computed as the CLI computes it:

    * ``lengths``: each rollout's response length, the rewards' shape: OPO's baseline (required
      for ``estimator="opo"``), or the weights of a whitening estimator's batch statistics;
    * ``baselines``: each rollout's baseline reward (required for ``estimator="remax"``);
    * ``batch_ids``: each rollout's training batch (integers; default: one batch), for a batch
      whitening, GPG's alpha and ``scale="batch"``. Each group must lie in one batch.

    ``grpo_passk`` gives its advantage to each group's first best rollout in row order (row-major
    for 2-D rewards); ``pass_at_k`` (PKPO) takes its k as ``pass_k=``. The advantages are
    float64 on the CPU inside, then the rewards' dtype and device, as for every other estimator.

    >>> r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    >>> group_advantages(r, preset="nemo-rl")["advantages"]  # the others of row 0 are constant
    tensor([[ 1.0000, -0.5773, -0.5773, -0.5773]])
    >>> group_advantages(r, estimator="rloo")["advantages"]
    tensor([[ 1.0000, -0.3333, -0.3333, -0.3333]])
    >>> group_advantages(r, estimator="opo", lengths=torch.tensor([[3.0, 1.0, 1.0, 1.0]]))["advantages"]
    tensor([[ 0.5000, -0.5000, -0.5000, -0.5000]])
    >>> group_advantages(r, estimator="opo")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    grpo_cli.errors.GrpoError: estimator='opo' needs lengths= (its baseline is the length-weighted ...
    """
    try:
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
            pass_k=pass_k,
        )
    except GrpoError as exc:
        raise _in_tensor_words(exc) from None
    per_row = {"lengths": lengths, "baselines": baselines, "batch_ids": batch_ids}
    spec = ESTIMATORS[options.estimator]
    for name, row in PER_ROW.items():
        if row.need in spec.needs and per_row[name] is None:
            raise GrpoError(
                f"estimator={options.estimator!r} needs {name}= ({spec.row_input}, shape of rewards)"
            )
    if spec.group_only and options.whiten == "none" and all(value is None for value in per_row.values()):
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
    return _through_the_engine(rewards, group_ids, group_size, options, per_row)


def _through_the_engine(
    rewards: Tensor,
    group_ids: Tensor | None,
    group_size: int | None,
    options: AdvantageOptions,
    per_row: dict[str, Tensor | None],
) -> kernel.GroupAdvantages:
    """The run a file of these rows gets (:func:`grpo_cli.run.tensors.run_on_tensors`), on
    the tensors, its result in the rewards' shape, dtype and device."""
    from grpo_cli.run.plan import RunPlan
    from grpo_cli.run.tensors import TensorRows, run_on_tensors

    flat, ids, num_groups = kernel.flat_groups(rewards, group_ids, group_size=group_size)
    inputs = {
        name: _per_row_tensor(name, values, rewards) for name, values in per_row.items() if values is not None
    }
    if not flat.numel():  # no rollouts: nothing to normalise, as on the kernel's path
        return kernel.GroupAdvantages(
            advantages=torch.zeros_like(rewards),
            active_group_mask=torch.zeros(num_groups, dtype=torch.bool, device=rewards.device),
            active_group_count=0,
        )
    values = flat.detach().cpu()
    if values.dtype == torch.bfloat16:  # as a file holds it: float64, exactly
        values = values.to(torch.float64)
    rows = TensorRows(values, ids.cpu(), num_groups, **inputs)
    try:
        advantages, mask = run_on_tensors(
            RunPlan(_engine_config(options, per_row, str(rewards.device))), rows
        )
    except GrpoError as exc:
        raise _in_tensor_words(exc) from None
    mask = mask.to(rewards.device)
    return kernel.GroupAdvantages(
        advantages=advantages.to(rewards.device, rewards.dtype).view(rewards.shape),
        active_group_mask=mask,
        active_group_count=int(mask.sum()),
    )


def _engine_config(
    options: AdvantageOptions, per_row: dict[str, Tensor | None], device: str
) -> ComputeConfig:
    from grpo_cli.options.advantage import RewardSpec
    from grpo_cli.options.config import ComputeConfig

    given = {name: PER_ROW[name].column for name, values in per_row.items() if values is not None}
    return ComputeConfig(
        rewards=(RewardSpec("reward"),),
        group_cols=("group_id",),
        advantage=options,
        device=device,
        length_col=given.get("lengths"),
        baseline_col=given.get("baselines"),
        batch_col=given.get("batch_ids"),
    )


def _per_row_tensor(name: str, values: Tensor, rewards: Tensor) -> Tensor:
    """A per-row input, checked and flat on the CPU: float64 (a length, a baseline; an integer
    beyond 2**53, which float64 cannot hold, refused) or int64 (a batch ID)."""
    if not isinstance(values, Tensor):
        raise GrpoError(f"{name}= must be a torch.Tensor, got {type(values).__name__}")
    if values.shape != rewards.shape:
        raise GrpoError(
            f"{name}= must have the rewards' shape {tuple(rewards.shape)}, got {tuple(values.shape)}"
        )
    flat = values.detach().reshape(-1).cpu()
    if name == "batch_ids":
        if values.dtype.is_floating_point or values.dtype.is_complex:
            raise GrpoError(f"batch_ids= must be an integer tensor, got dtype {values.dtype}")
        return flat.to(torch.int64)
    if not (values.dtype.is_floating_point or values.dtype in _INTEGERS):
        raise GrpoError(f"{name}= must be a numeric tensor, got dtype {values.dtype}")
    if values.dtype == torch.int64:
        beyond = flat.abs() > (1 << 53)
        if bool(beyond.any()):
            index = int(beyond.nonzero()[0])
            raise GrpoError(
                f"{name}= index {index}: {int(flat[index])} is an integer beyond 2**53, which float64 "
                "cannot hold exactly"
            )
    return flat.to(torch.float64)


_INTEGERS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _in_tensor_words(error: GrpoError) -> GrpoError:
    """The run's error in the tensor API's words: ``lengths=`` for ``--length-col`` (the
    column it was given is the caller's tensor), the keyword for another option."""
    template = error.template
    for row in PER_ROW.values():
        template = template.replace(f"{mention(row.option)} {row.column!r}", mention(row.option))
    tensor_keyword = {row.option: f"{name}=" for name, row in PER_ROW.items()}

    def keyword(option: str) -> str:
        return tensor_keyword.get(option) or keyword_named(option)

    return type(error)(template, exit_code=error.exit_code).worded(keyword)
