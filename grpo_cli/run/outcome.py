"""What pass 1 decided for each group, as both engines hand it on: the outcome (normalisations,
active and kept groups, the columns of --stats-cols), the totals the summary counts, the
training batches of groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from grpo_cli.kernel import (
    BatchTransform,
    GroupStats,
    Normalization,
)


@dataclass(frozen=True)
class BatchLayout:
    """Which training batch (``--batch-col``) each group belongs to, and per-batch counts.

    Without ``--batch-col`` the whole input is one batch.
    """

    of_group: np.ndarray  # int64 (num_groups,)
    rows: np.ndarray  # int64 (num_batches,)
    nonzero_rewards: np.ndarray | None  # int64 (num_batches,): rows whose reward is finite and
    # not 0, where the estimator needs them (GPG's alpha: "batch_nonzero")
    keys: list[Any]  # the batch column's value of each batch ID

    @property
    def count(self) -> int:
        return int(self.rows.size)

    @classmethod
    def of_groups(cls, of_group: np.ndarray, figures: dict[str, np.ndarray], keys: list[Any]) -> BatchLayout:
        """Each batch's rows and non-zero rewards, from each group's batch and per-group figures.

        >>> figures = {"rows": np.array([2, 3, 4]), "nonzero_rewards": np.array([1, 0, 4])}
        >>> layout = BatchLayout.of_groups(np.array([0, 1, 0]), figures, ["a", "b"])
        >>> layout.rows.tolist(), layout.nonzero_rewards.tolist()
        ([6, 3], [5, 0])
        >>> one = BatchLayout.of_groups(np.zeros(3, np.int64), figures, [None])
        >>> one.rows.tolist(), one.nonzero_rewards.tolist()
        ([9], [5])
        """
        count = len(keys)

        def per_batch(per_group: np.ndarray) -> np.ndarray:
            if count == 1:  # one batch (no --batch-col): the total, without a float per group
                return np.array([per_group.sum()], dtype=np.int64)
            return np.bincount(of_group, weights=per_group, minlength=count).astype(np.int64)

        nonzero = figures.get("nonzero_rewards")
        nonzero_per_batch = None if nonzero is None else per_batch(nonzero)
        return cls(of_group, per_batch(figures["rows"]), nonzero_per_batch, keys)


@dataclass(frozen=True)
class GroupOutcome:
    """Per-group results of a run once pass 1 is done: what pass 2 applies and the summary reports.

    ``norms`` has one :class:`~grpo_cli.kernel.Normalization` per channel; ``active`` is
    bool ``(num_groups,)`` on the CPU (a group is active if any channel is); ``stats`` are
    the statistics of the combined reward; ``kept`` is bool ``(num_groups,)`` or ``None``
    without a filter; ``group_columns`` holds ``--stats-cols``' mean, std and size per group.
    """

    norms: list[Normalization]
    active: torch.Tensor
    stats: GroupStats
    rows_per_group: np.ndarray
    rows: int
    nan_rewards: int
    kept: torch.Tensor | None
    group_columns: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    drop_reasons: list[str]
    drops_by_reason: list[dict[str, Any]] = field(default_factory=list)
    batches: BatchLayout | None = None
    transform: BatchTransform | None = None  # per batch: whitening, set after the moments pass
    estimator_state: Any = None  # what it keeps for its per-row step (RunPlan.estimator)
    step_spans: np.ndarray | None = None  # per group: its rows hold several values of the watched step

    @property
    def dropped_groups(self) -> int:
        return 0 if self.kept is None else int((~self.kept).sum())

    @property
    def dropped_rows(self) -> int:
        return 0 if self.kept is None else int(self.rows_per_group[~self.kept.numpy()].sum())

    @property
    def totals(self) -> OutcomeTotals:
        """The run's counts, which the summary and the provenance report."""
        return OutcomeTotals(
            rows=self.rows,
            nan_rewards=self.nan_rewards,
            groups=int(self.active.numel()),
            active_groups=int(self.active.sum()),
            dropped_groups=self.dropped_groups,
            dropped_rows=self.dropped_rows,
            drop_reasons=tuple(self.drop_reasons),
            drops_by_reason=tuple(self.drops_by_reason),
        )


@dataclass(frozen=True)
class OutcomeTotals:
    """A run's counts from its outcome (:attr:`GroupOutcome.totals`): what the summary and the
    provenance report besides the findings of the groups. ``+`` merges the totals of two parts
    of the groups (a Ray reducer's bucket each), in any order.

    >>> part = OutcomeTotals(rows=4, nan_rewards=0, groups=2, active_groups=1)
    >>> (part + part).active_groups, part.dropped_rows
    (2, 0)
    """

    rows: int
    nan_rewards: int
    groups: int
    active_groups: int
    dropped_groups: int = 0
    dropped_rows: int = 0
    drop_reasons: tuple[str, ...] = ()
    drops_by_reason: tuple[dict[str, Any], ...] = ()

    def __add__(self, other: OutcomeTotals) -> OutcomeTotals:
        if self.drop_reasons != other.drop_reasons:
            raise ValueError(f"parts of one run dropped for {self.drop_reasons} and {other.drop_reasons}")
        return OutcomeTotals(
            rows=self.rows + other.rows,
            nan_rewards=self.nan_rewards + other.nan_rewards,
            groups=self.groups + other.groups,
            active_groups=self.active_groups + other.active_groups,
            dropped_groups=self.dropped_groups + other.dropped_groups,
            dropped_rows=self.dropped_rows + other.dropped_rows,
            drop_reasons=self.drop_reasons,
            drops_by_reason=tuple(
                {**mine, "groups": mine["groups"] + theirs["groups"], "rows": mine["rows"] + theirs["rows"]}
                for mine, theirs in zip(self.drops_by_reason, other.drops_by_reason, strict=True)
            ),
        )
