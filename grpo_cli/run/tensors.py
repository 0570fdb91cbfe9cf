"""A whole run over rows held as tensors: the tensor API's path for every estimator the group
normalisation alone does not compute.

The same pieces both engines run over files, in the same order, on tensors: the plan's
statistics blocks (:meth:`~grpo_cli.run.plan.RunPlan.accumulators`), pass 1's figures
(:mod:`grpo_cli.run.figures`), the top two and every row of a group where the estimator needs
them, the plan's outcome with the estimator's step between the passes, the moments pass of a
batch transform, then pass 2's per-row step, the transform and the clip. The groups are
numbered by first appearance, as a file run numbers its keys, so every figure is folded in
the order a file run folds it, and the advantages are the file run's bits.

>>> from grpo_cli.options.advantage import AdvantageOptions, RewardSpec
>>> from grpo_cli.options.config import ComputeConfig
>>> config = ComputeConfig(
...     rewards=(RewardSpec("reward"),),
...     group_cols=("group_id",),
...     advantage=AdvantageOptions.resolve(estimator="reinforce_baseline"),
... )
>>> rows = TensorRows(torch.tensor([1.0, 0.0, 2.0, 2.0]), torch.tensor([5, 5, 2, 2]), 6)
>>> advantages, active = run_on_tensors(RunPlan(config), rows)
>>> [round(a, 4) for a in advantages.tolist()], active.tolist()  # whitened over the batch
([1.4142, -1.4142, 0.0, 0.0], [False, False, False, False, False, True])
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from grpo_cli.errors import GrpoError
from grpo_cli.kernel import WeightedMomentsAccumulator
from grpo_cli.run.figures import (
    FigureAccumulator,
    GroupRows,
    OneValueFigure,
    RowInputs,
    padded,
    second_value,
    wanted,
)
from grpo_cli.run.outcome import BatchLayout, GroupOutcome
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.rewards import RewardBatch, RewardCombination, bad_rewards_error, refuse_bad_lengths


@dataclass(frozen=True)
class TensorRows:
    """The rows of a run, flat, on the CPU: ``rewards`` ``(N,)`` floating (bfloat16 is widened
    to float64 first: the advantages are then float64, as a file holds it), ``group_ids``
    ``(N,)`` int64 in ``[0, num_groups)`` (a group may have no rows), and each row's length,
    baseline (float64) and training batch (int64) where the run reads them."""

    rewards: Tensor
    group_ids: Tensor
    num_groups: int
    lengths: Tensor | None = None
    baselines: Tensor | None = None
    batch_ids: Tensor | None = None


def run_on_tensors(plan: RunPlan, rows: TensorRows) -> tuple[Tensor, Tensor]:
    """Each row's advantage ``(N,)`` (CPU, in the rewards' dtype) and each group's active flag
    ``(num_groups,)`` bool (a group with no rows is inactive), as ``grpo-cli compute`` computes
    them over a file of these rows. A bad value is refused as ``rewards index N: ...``."""
    rewards = rows.rewards
    ids, groups = _by_first_appearance(rows.group_ids)
    k = int(groups.numel())
    lengths = rows.lengths
    if lengths is not None:
        refuse_bad_lengths(lengths, _index, column=None)
    options = plan.config.advantage
    combination = RewardCombination(
        (1.0,),
        per_column=False,
        nansum=options.reward_sum == "nansum",
        shaping=options if options.shapes_rewards else None,
        floating=True,
    )
    batch = combination.combine([rewards], lengths=lengths)
    if batch.combined_valid is not None and options.nan == "error":
        bad = ~batch.combined_valid
        row = int(bad.nonzero()[0])
        as_read = batch.combined if batch.unshaped is None else batch.unshaped
        raise bad_rewards_error(_index(row), str(float(as_read[row])), int(bad.sum()))
    outcome = _outcome(plan, batch, ids, k, rows)
    active_device = outcome.active.to(plan.device)
    if plan.needs_moments_pass:
        advantages, batch_ids = plan.advantages_of(
            batch, ids, outcome, active_device=active_device, baselines=rows.baselines
        )
        assert batch_ids is not None and outcome.batches is not None  # a moments pass reads each row's batch
        moments = WeightedMomentsAccumulator(
            num_batches=outcome.batches.count, block_rows=plan.config.stats_block_rows
        )
        moments.update(advantages, lengths, batch_ids, valid=batch.combined_valid)
        outcome = replace(outcome, transform=plan.transform(moments.compute()))
    advantages, batch_ids = plan.advantages_of(
        batch, ids, outcome, active_device=active_device, baselines=rows.baselines
    )
    advantages = plan.finish(advantages, batch_ids, outcome, scored=batch.combined_valid)
    active = torch.zeros(rows.num_groups, dtype=torch.bool)
    active[groups[outcome.active]] = True
    return advantages.to(rewards.dtype), active


def _outcome(plan: RunPlan, batch: RewardBatch, ids: Tensor, k: int, rows: TensorRows) -> GroupOutcome:
    """Pass 1 over every row at once, and the plan's outcome from it."""
    n = ids.numel()
    accumulators, separate = plan.accumulators()
    for accumulator, values, valid in zip(
        accumulators[: plan.channels], batch.channels, batch.channel_valid, strict=True
    ):
        accumulator.update(values, ids, valid)
    if separate:
        accumulators[-1].update(batch.combined, ids, batch.combined_valid)
    stats = [accumulator.compute(k) for accumulator in accumulators]
    figures = wanted(plan.needs)
    running = FigureAccumulator(figures, block_rows=accumulators[0].block_rows)
    ids_np = ids.numpy()
    summed_lengths = (
        rows.lengths.numpy() if rows.lengths is not None and "length_sums" in plan.needs else None
    )
    running.update(ids_np, RowInputs.of(batch, summed_lengths))
    totals = padded(figures, running.compute(), k)
    outcome = plan.outcome(
        stats[: plan.channels],
        stats[-1] if separate else stats[0],
        rows_per_group=totals["rows"],
        rows=n,
        nan_rewards=int(totals["nan_rewards"].sum()),
        figures=totals,
        batches=_batch_layout(rows.batch_ids, ids_np, k, totals),
    )
    if plan.keeps_group_rows:
        outcome = plan.with_group_rows(outcome, GroupRows.of_chunk(ids_np, batch))
    return outcome


def _batch_layout(
    batch_ids: Tensor | None, ids: np.ndarray, k: int, totals: dict[str, np.ndarray]
) -> BatchLayout:
    """Each group's training batch, the batches numbered by first appearance (one batch
    without ``batch_ids``); a group whose rows lie in two batches is refused."""
    if batch_ids is None:
        return BatchLayout.of_groups(np.zeros(k, dtype=np.int64), totals, [None])
    dense, keys = _by_first_appearance(batch_ids)
    values = dense.numpy()
    of_group, split = BATCHES.of_chunk(ids, values, k)
    if split.any():
        group = int(np.flatnonzero(split)[0])
        first, row = second_value(ids, values, group)
        raise GrpoError(
            f"{_index(row)}: a group spans {BATCHES.spans((int(keys[first]), int(keys[values[row]])))}"
        )
    return BatchLayout.of_groups(of_group, totals, keys.tolist())


BATCHES = OneValueFigure("", "batch_col")
"""The training batch of each group, from the tensor API's batch IDs (no column)."""


def _by_first_appearance(values: Tensor) -> tuple[Tensor, Tensor]:
    """``values`` (int64 ``(N,)``) renumbered
    ``0, 1, ...`` in the order each first appears, and the value each new number stands for.

    >>> _by_first_appearance(torch.tensor([7, 3, 7, 9]))
    (tensor([0, 1, 0, 2]), tensor([7, 3, 9]))
    """
    distinct, inverse = torch.unique(values, return_inverse=True)
    first = torch.full((distinct.numel(),), values.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(values.numel()), "amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    return rank[inverse], distinct[order]


def _index(row: int) -> str:
    return f"rewards index {row}"
