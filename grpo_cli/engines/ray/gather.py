"""The driver's side of the reducers: their reports gathered in bucket order, the groups placed
by first appearance, the outcome and the figures the summary needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch

from grpo_cli.engines.ray.blocks import FilePart
from grpo_cli.engines.ray.fields import BatchStds, _report_of
from grpo_cli.engines.ray.reducers import (
    BucketReport,
    _merged_by_key,
    _value_cuts,
    block_partials,
    bucket_batch_squares,
    bucket_round_two,
    by_batch_filter,
    by_value_figures,
    merge_bucket,
)
from grpo_cli.engines.ray.shipping import _raise_first_refusal, _task
from grpo_cli.kernel import (
    BatchTransform,
)
from grpo_cli.results.findings import (
    FirstRound,
    RunFigures,
)
from grpo_cli.run.outcome import OutcomeTotals
from grpo_cli.run.plan import RunPlan
from grpo_cli.run.reward_counts import RewardCounts
from grpo_cli.trainers.filters import FilterPart

# the statistics job's reducers; None: one per CPU of the instance, at most one per block
REDUCERS: int | None = None


@dataclass(frozen=True)
class HeldStatistics:
    """Job 1, which the reducers finish: each bucket's figures and keys stay in the object
    store (``figures``, ``keys``: references, ``sizes``: its groups); the driver holds the
    buckets' merged totals and round 1 of the findings."""

    figures: list[Any]
    keys: list[Any]
    sizes: list[int]
    totals: OutcomeTotals
    first: FirstRound
    batch_stds: BatchStds | None  # --scale batch: each batch's std, merged from the buckets
    by: dict[str, list[dict[str, Any]]]  # --by: each column's figures per value, in the summary's order
    group_row_states: list[Any] | None  # the estimator's state of each bucket's groups (references)
    filtered: FilterPart | None  # check --trainer-filter: the rule on every group, merged
    reward_counts: RewardCounts  # every scored row's reward counted, the blocks' merged

    def payload(self, ray: Any, transform: BatchTransform | None = None) -> Any:
        """What each worker of the moments and advantage jobs reads once: the buckets'
        references, the batches' stds with ``--scale batch``, and the run's batch transform
        where there is one (after the moments job)."""
        return ray.put(
            {
                "buckets": (self.figures, self.keys, self.sizes),
                "transform": transform,
                "batch_stds": self.batch_stds,
                "group_row_states": self.group_row_states,
            }
        )

    def round_two(self, ray: Any, plan: RunPlan, dtype: torch.dtype | None) -> list[Any]:
        """Round 2 of the findings, a task per bucket (:func:`bucket_round_two`), started."""
        run = RunFigures.of(self.first)
        return [
            _task(ray, bucket_round_two, num_returns=1).remote(
                plan.config, run, dtype, self.batch_stds, figures, keys
            )
            for figures, keys in zip(self.figures, self.keys, strict=True)
        ]


def _held_statistics(
    ray: Any, blocks: list[list[FilePart]], plan: RunPlan, group_size: int | None
) -> HeldStatistics:
    """Job 1: each statistics block reduced to per-group partials on a worker, cut by key
    bucket; each bucket merged on a worker in block order, which computes its outcome and
    round 1 of its findings; the driver gets one report a bucket, no per-group figure.

    With ``--scale batch`` the advantages (and ``check``'s range) need each batch's std: the
    reports carry each batch's count, extremes and exact reward sum, merged here; a task per
    bucket then sums its squared deviations from the batches' means, merged here into each
    batch's std, which round 2 of the findings and the advantage job's workers are given.

    With ``--by`` each reducer also cut its groups of each column by a hash of their value; a
    task per such cut takes it from every bucket and computes the figures of its values, given
    the run's reward range; the driver holds the figures per value."""
    reports, figures, keys, states, by_parts, counts = _reduced(ray, blocks, plan, group_size)
    held: list[BucketReport] = [_report_of(table) for table in reports]
    batch_stds = None
    if plan.config.advantage.scale == "batch":
        totals = _merged_by_key([report.batch_totals for report in held if report.batch_totals is not None])
        squares = ray.get(
            [_task(ray, bucket_batch_squares, num_returns=1).remote(plan.config, totals, f) for f in figures]
        )
        batch_stds = plan.batch_stds(totals, _merged_by_key([_report_of(table) for table in squares]))
    nothing = OutcomeTotals(
        rows=0,
        nan_rewards=0,
        groups=0,
        active_groups=0,
        drop_reasons=tuple(plan.drop_reasons()),
        drops_by_reason=tuple({"reason": r, "groups": 0, "rows": 0} for r in plan.drop_reasons()),
    )
    first = sum((report.first for report in held), FirstRound())
    return HeldStatistics(
        figures,
        keys,
        [report.groups for report in held],
        sum((report.totals for report in held), nothing),
        first,
        batch_stds,
        _by_values(ray, plan, first, by_parts),
        states if plan.keeps_group_rows else None,
        _merged_filter([report.filtered for report in held] + _batch_filters(ray, plan, by_parts)),
        RewardCounts.of_parts(ray.get(counts)),
    )


def _batch_filters(ray: Any, plan: RunPlan, by_parts: list[list[Any]]) -> list[FilterPart | None]:
    """``check --trainer-filter`` with a whole-batch rule: a task per cut of the batches
    (:func:`by_batch_filter`), after the ``--by`` columns' cuts; their parts."""
    config = plan.config
    if not plan.whole_batch_filter:
        return []
    buckets = len(by_parts)
    at = len(config.by_cols) * buckets
    refs = [
        _task(ray, by_batch_filter, num_returns=1).remote(config, *[parts[at + r] for parts in by_parts])
        for r in range(buckets)
    ]
    return [_report_of(table) for table in ray.get(refs)]


def _merged_filter(parts: Sequence[FilterPart | None]) -> FilterPart | None:
    """The buckets' :class:`FilterPart` merged (``None`` without ``--trainer-filter``)."""
    seen = [part for part in parts if part is not None]
    return sum(seen[1:], seen[0]) if seen else None


def _by_values(
    ray: Any, plan: RunPlan, first: FirstRound, by_parts: list[list[Any]]
) -> dict[str, list[dict[str, Any]]]:
    """``--by``: each column's figures per value (:func:`by_value_figures`), a task per cut of
    the values, sorted as the local engine lists them."""
    buckets = len(by_parts)
    run_range = (first.reward.low, first.reward.high) if first.reward.rewards else (None, None)
    started = {
        column: [
            _task(ray, by_value_figures, num_returns=1).remote(
                column, run_range, *[parts[c * buckets + r] for parts in by_parts]
            )
            for r in range(buckets)
        ]
        for c, column in enumerate(plan.config.by_cols)
    }
    by = {}
    for column, refs in started.items():
        entries = [entry for table in ray.get(refs) for entry in _report_of(table)]
        by[column] = [entry for _, entry in sorted(entries, key=lambda pair: pair[0])]
    return by


def _reduced(
    ray: Any, blocks: list[list[FilePart]], plan: RunPlan, group_size: int | None
) -> tuple[list[pa.Table], list[Any], list[Any], list[Any], list[list[Any]], list[Any]]:
    """Job 1's map and reduce tasks (:func:`merge_bucket`): their first answers (fetched; a
    refusal raised, the first block's), references to their figures, keys and the estimator's
    states built from rows, with ``--by`` to each bucket's groups of each column cut by
    value (a list a bucket: column-major), and references to each block's reward counts."""
    if not blocks:
        return [], [], [], [], [], []
    cpus = int(ray.cluster_resources().get("CPU", 1))
    buckets = max(1, min(len(blocks), REDUCERS or cpus))
    shared = ray.put(blocks)
    # an estimator that reads its groups' rows, a trainer's filter: every row to its group's bucket
    with_rows = plan.keeps_group_rows or plan.config.trainer_filter is not None
    per_task = buckets * (2 if with_rows else 1)
    per_block = [
        _task(ray, block_partials, num_returns=per_task + 1).remote(
            i, shared, plan.config, group_size, buckets, with_rows
        )
        for i in range(len(blocks))
    ]
    returns = 4 + _value_cuts(plan) * buckets
    reduced = [
        _task(ray, merge_bucket, num_returns=returns).remote(
            plan.config,
            buckets,
            with_rows,
            *[refs[r] for refs in per_block],
            *([refs[buckets + r] for refs in per_block] if with_rows else []),
        )
        for r in range(buckets)
    ]
    answers = ray.get([refs[0] for refs in reduced])
    _raise_first_refusal(answers)
    return (
        answers,
        [refs[1] for refs in reduced],
        [refs[2] for refs in reduced],
        [refs[3] for refs in reduced],
        [refs[4:] for refs in reduced],
        [refs[-1] for refs in per_block],
    )
