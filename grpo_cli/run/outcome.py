"""What pass 1 decided for each group, as both engines hand it on: the outcome (normalisations,
active and kept groups, the columns of --stats-cols), the totals the summary counts, the
training batches of groups, and pass@k's credit per reward."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from grpo_cli.errors import GrpoError
from grpo_cli.kernel import (
    BatchTransform,
    GroupStats,
    Normalization,
    TopTwo,
    group_top_two,
)
from grpo_cli.run.rewards import RewardBatch

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass(frozen=True)
class RewardCredit:
    """pass_at_k's advantages as a table: each group's distinct scored rewards, sorted, with the
    advantage of a row that holds each (``values``, ``advantages``: float64; ``starts``: int64,
    ``(num_groups + 1,)``, where each group's entries begin). Tied rewards share their credit,
    so a row's advantage is its group's and reward's entry, bit for bit what
    :func:`~grpo_cli.kernel.pass_at_k_advantages` gives it over every row of the run.

    >>> credit = RewardCredit.of(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 0]),
    ...     torch.tensor([0.25, -0.25, 0.25, -0.25], dtype=torch.float64), 1)
    >>> rows = credit.advantages_of(np.array([0, 0]), torch.tensor([0.0, 1.0]), None)
    >>> credit.values.tolist(), rows.tolist()
    ([0.0, 1.0], [-0.25, 0.25])
    """

    starts: np.ndarray
    values: np.ndarray
    advantages: np.ndarray

    @classmethod
    def of(
        cls, values: torch.Tensor, ids: torch.Tensor, advantages: torch.Tensor, num_groups: int
    ) -> RewardCredit:
        """From scored rows' rewards, group IDs and advantages, shape ``(N,)``."""
        x, g, a = values.to(torch.float64).numpy(), ids.numpy(), advantages.numpy()
        order = np.lexsort((x, g))  # by group, then reward
        x, g, a = x[order], g[order], a[order]
        first = np.ones(x.size, dtype=bool)
        first[1:] = (g[1:] != g[:-1]) | (x[1:] != x[:-1])  # -0.0 and 0.0 are one reward, as in the sort
        return cls.of_counts(np.bincount(g[first], minlength=num_groups), x[first], a[first])

    @classmethod
    def of_counts(cls, counts: np.ndarray, values: np.ndarray, advantages: np.ndarray) -> RewardCredit:
        """From each group's count of entries and the entries in order (by group, then reward)."""
        return cls(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), values, advantages)

    @classmethod
    def concat(cls, parts: Sequence[RewardCredit]) -> RewardCredit:
        """The tables of parts of the groups laid end to end, in order."""
        if not parts:
            return cls.of_counts(np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
        return cls.of_counts(
            np.concatenate([np.diff(part.starts) for part in parts]),
            np.concatenate([part.values for part in parts]),
            np.concatenate([part.advantages for part in parts]),
        )

    @property
    def groups(self) -> np.ndarray:
        """Each entry's group ID, int64."""
        return np.repeat(np.arange(self.starts.size - 1, dtype=np.int64), np.diff(self.starts))

    def advantages_of(
        self, ids: np.ndarray, rewards: torch.Tensor, scored: torch.Tensor | None
    ) -> torch.Tensor:
        """Each row's advantage (float64; 0 where not ``scored``): its reward's entry among its
        group's, found by bisection over every row at once."""
        x = rewards.to(torch.float64).numpy()
        keep = np.ones(x.size, dtype=bool) if scored is None else scored.numpy().astype(bool)
        at = np.flatnonzero(keep)
        low, high = self.starts[ids[at]], self.starts[ids[at] + 1]
        wanted = x[at]
        last = max(self.values.size - 1, 0)
        while True:
            open_ = low < high
            if not open_.any():
                break
            middle = (low + high) // 2
            below = self.values[np.minimum(middle, last)] < wanted
            low = np.where(open_ & below, middle + 1, low)
            high = np.where(open_ & ~below, middle, high)
        out = np.zeros(x.size, dtype=np.float64)
        if at.size:
            if not np.array_equal(self.values[np.minimum(low, last)], wanted):
                raise GrpoError(
                    "pass_at_k: a row's reward is not among its group's (the statistics and rows differ)"
                )
            out[at] = self.advantages[low]
        return torch.from_numpy(out)


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


def batch_of_groups(
    group_ids: np.ndarray, batch_ids: np.ndarray, num_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per group, its rows' batch ID (-1 for a group with no rows) and whether they span two.

    >>> batch_of_groups(np.array([0, 0, 1, 1]), np.array([3, 3, 2, 5]), 3)
    (array([ 3,  5, -1]), array([False,  True, False]))
    """
    high = np.full(num_groups, -1, dtype=np.int64)
    np.maximum.at(high, group_ids, batch_ids)
    low = np.full(num_groups, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(low, group_ids, batch_ids)
    return high, (high >= 0) & (low != high)


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
    row_scale: torch.Tensor | None = None  # per batch: GPG's alpha / f_norm
    transform: BatchTransform | None = None  # per batch: whitening, set after the moments pass
    group_baseline: torch.Tensor | None = None  # per group: opo's length-weighted mean reward
    top_two: TopTwo | None = None  # per group: grpo_passk's best two rewards
    best_advantage: torch.Tensor | None = None  # per group: grpo_passk's value for the best rollout
    row_advantages: torch.Tensor | None = None  # per row, input order: pass_at_k's (0 where unscored)
    reward_credit: RewardCredit | None = None  # per group and reward: pass_at_k's, where rows meet it by key
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


def scored_top_two(rewards: RewardBatch, ids: torch.Tensor, positions: torch.Tensor, k: int) -> TopTwo:
    """grpo_passk: the top two combined rewards of each of ``k`` groups over a chunk's scored
    rows, and each group's first best row (``positions``: the rows' places in the whole input;
    both engines)."""
    values = rewards.combined.to(torch.float64)
    if rewards.combined_valid is not None:
        valid = rewards.combined_valid
        values, ids, positions = values[valid], ids[valid], positions[valid]
    return group_top_two(values, ids, k, positions=positions)
