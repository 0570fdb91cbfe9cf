"""pass_at_k's state between the passes: a table of each group's distinct scored rewards and
the advantage of a row that holds each (:class:`RewardCredit`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from grpo_cli.errors import GrpoError


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
