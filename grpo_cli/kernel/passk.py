"""Pass@k: each group's two best scored rewards and the advantages they give, exact where the estimator is."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_cli.choices import Scale, Std
from grpo_cli.kernel.exact import fold_sum
from grpo_cli.kernel.stats import GroupStats, group_std

NO_ROW = torch.iinfo(torch.int64).max
""":attr:`TopTwo.best_row` of a group with no scored reward."""


@dataclass(frozen=True)
class TopTwo:
    """Per group, the largest reward and the second largest (equal to it on a tie), float64,
    and ``best_row`` (int64): the input position of the first row whose reward is the largest.

    An empty group has ``-inf`` for both and :data:`NO_ROW`; a one-rollout group ``-inf``
    for the second. Every figure merges exactly, in any order (:func:`merge_top_two`).
    """

    first: Tensor
    second: Tensor
    best_row: Tensor


def group_top_two(
    values: Tensor, group_ids: Tensor, num_groups: int, *, positions: Tensor | None = None
) -> TopTwo:
    """The two largest values of each group, as ``torch.topk(rewards, 2)`` gives them, and the
    position of the first row holding the largest (``positions``: each value's row in the whole
    input, int64 ``(N,)``; by default ``0 .. N-1``).

    >>> top = group_top_two(torch.tensor([0.25, 0.75, 0.75, 0.5]), torch.tensor([0, 0, 0, 1]), 2)
    >>> top.first.tolist(), top.second.tolist(), top.best_row.tolist()
    ([0.75, 0.5], [0.75, -inf], [1, 3])
    """
    x = values.to(torch.float64)
    ids = group_ids.to(torch.int64)
    rows = torch.arange(x.numel(), device=x.device) if positions is None else positions.to(torch.int64)
    empty = torch.full((num_groups,), -math.inf, dtype=torch.float64, device=x.device)
    first = empty.clone().scatter_reduce_(0, ids, x, "amax")
    at_first = x == torch.take(first, ids)
    ties = torch.zeros(num_groups, dtype=torch.int64, device=x.device).index_add_(
        0, ids, at_first.to(torch.int64)
    )
    below = torch.where(at_first, torch.full_like(x, -math.inf), x)
    second = empty.clone().scatter_reduce_(0, ids, below, "amax")
    best_row = torch.full((num_groups,), NO_ROW, dtype=torch.int64, device=x.device)
    best_row = best_row.scatter_reduce_(0, ids[at_first], rows[at_first], "amin")
    return TopTwo(first, torch.where(ties >= 2, first, second), best_row)


def merge_top_two(a: TopTwo, b: TopTwo) -> TopTwo:
    """The top two of the union of two sets of rows, per group, and its first best row."""
    first = torch.maximum(a.first, b.first)
    # on a tie of the two firsts, the second is that same value (-inf when both sides are empty)
    second = torch.where(
        a.first > b.first,
        torch.maximum(a.second, b.first),
        torch.where(b.first > a.first, torch.maximum(b.second, a.first), a.first),
    )
    best_row = torch.where(
        a.first > b.first,
        a.best_row,
        torch.where(b.first > a.first, b.best_row, torch.minimum(a.best_row, b.best_row)),
    )
    return TopTwo(first, second, best_row)


def passk_best_advantage(
    stats: GroupStats,
    top: TopTwo,
    active: Tensor,
    *,
    epsilon: float,
    std: Std = "sample",
    scale: Scale = "group",
) -> Tensor:
    """verl's Pass@k advantage of each group's best rollout: ``(r_max - r_second) / (std + eps)``.

    Shapes ``(K,)``; float64; 0 for an inactive group or one with fewer than two rollouts,
    and no division with ``scale="none"``. The other rollouts get 0 (:func:`passk_advantages`).

    >>> from grpo_cli.kernel import active_groups, group_stats
    >>> r, g = torch.tensor([1.0, 0.0, 0.5, 2.0]), torch.tensor([0, 0, 0, 1])
    >>> stats = group_stats(r, g)
    >>> best = passk_best_advantage(stats, group_top_two(r, g, 2), active_groups(stats), epsilon=1e-6)
    >>> best.tolist()
    [0.999998000004, 0.0]
    """
    stats = stats.to(str(top.first.device))
    gap = torch.where(stats.count >= 2, top.first - top.second, torch.zeros_like(top.first))
    if scale != "none":
        gap = gap / (group_std(stats, ddof=1 if std == "sample" else 0) + epsilon)
    return torch.where(active.to(gap.device), gap, torch.zeros_like(gap))


def passk_advantages(group_ids: Tensor, positions: Tensor, best_row: Tensor, best: Tensor) -> Tensor:
    """Pass@k row advantages: ``best[g]`` on group ``g``'s best row (the first, in input
    order, whose reward is the group's largest: :attr:`TopTwo.best_row`), 0 elsewhere;
    float64, shape ``(N,)`` of ``group_ids``. ``positions`` (int64 ``(N,)``) are the rows'
    places in the whole input, so that any slice of the rows can be passed on its own.

    >>> ids, best_row, best = torch.tensor([0, 0, 0]), torch.tensor([1]), torch.tensor([0.5])
    >>> passk_advantages(ids, torch.tensor([0, 1, 2]), best_row, best)
    tensor([0.0000, 0.5000, 0.0000], dtype=torch.float64)
    >>> passk_advantages(ids[:1], torch.tensor([2]), best_row, best)  # a later slice
    tensor([0.], dtype=torch.float64)
    """
    ids = group_ids.to(torch.int64)
    at_best = positions.to(device=ids.device, dtype=torch.int64) == best_row.to(ids.device)[ids]
    values = best.to(device=ids.device, dtype=torch.float64)[ids]
    return torch.where(at_best, values, torch.zeros_like(values))


def pass_at_k_weights(n: int, k: int) -> tuple[Tensor, Tensor]:
    """PKPO's weights for a group of ``n`` rollouts sorted by reward, ``k`` clamped to
    ``[1, n]``: at 1-based position ``m``, ``own[m-1] = C(m-1, k-1) / C(n, k)`` (the
    k-subsets that hold the rollout and whose maximum it is) and ``above[m-1] =
    C(m-2, k-2) / C(n, k)`` (the k-subsets that hold a given lower rollout and whose maximum
    is this one). Each is the correctly rounded float64 of an exact ratio of integers;
    shapes ``(n,)``.

    >>> own, above = pass_at_k_weights(4, 2)
    >>> (own * 6).tolist(), (above * 6).tolist()
    ([0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 1.0, 1.0])
    """
    k = min(max(k, 1), n)
    total = math.comb(n, k)
    # int / int is correctly rounded in Python, however large the binomials
    own = [math.comb(m - 1, k - 1) / total for m in range(1, n + 1)]
    above = [math.comb(m - 2, k - 2) / total if k >= 2 and m >= 2 else 0.0 for m in range(1, n + 1)]
    return torch.tensor(own, dtype=torch.float64), torch.tensor(above, dtype=torch.float64)


def pass_at_k_advantages(
    rewards: Tensor, group_ids: Tensor, num_groups: int, *, k: int, active: Tensor | None = None
) -> Tensor:
    """Pass@k policy optimisation (PKPO, arXiv:2505.15201): each rollout's credit is the mean,
    over the k-subsets of its group, of the subset's maximum reward counted where the subset
    holds the rollout, ``credit_i = sum_{S ni i, |S| = k} max_{j in S} r_j / C(n, k)``; the
    advantage is the credit minus its group mean. Exact for any ``k``, binary or continuous
    rewards (clamped to ``[1, n]`` per group); tied rewards get the same credit.

    ``rewards``, ``group_ids``: shape ``(N,)`` (the valid rows only); ``active`` (bool,
    ``(num_groups,)``): a group not active gets exactly 0. Computed in float64 from the sorted
    rewards: a rollout at position ``m`` gets ``own[m] r_m + sum_{p > m} above[p] r_p``
    (:func:`pass_at_k_weights`). Returns float64, shape ``(N,)``.

    >>> r = torch.tensor([1.0, 0.0, 1.0, 0.0])  # n = 4, two correct, k = 2: +-1/12
    >>> advantages = pass_at_k_advantages(r, torch.zeros(4, dtype=torch.int64), 1, k=2)
    >>> [round(12 * a, 12) for a in advantages.tolist()]
    [1.0, -1.0, 1.0, -1.0]
    """
    x = rewards.to(torch.float64)
    ids = group_ids.to(torch.int64)
    result = torch.zeros(x.numel(), dtype=torch.float64, device=x.device)
    if x.numel() == 0:
        return result
    by_reward = torch.argsort(x, stable=True)
    order = by_reward[torch.argsort(ids[by_reward], stable=True)]  # by group, then by reward
    counts = torch.bincount(ids, minlength=num_groups)
    sizes_of_rows = counts[ids[order]]
    for n in torch.unique(sizes_of_rows).tolist():
        rows = order[sizes_of_rows == n]  # whole groups of n rows, each sorted by reward
        ranked = x[rows].view(-1, n)
        own, above = (w.to(x.device) for w in pass_at_k_weights(int(n), k))
        higher = ranked * above
        after = torch.flip(torch.cumsum(torch.flip(higher, [1]), 1), [1])
        after = torch.cat([after[:, 1:], torch.zeros_like(after[:, :1])], dim=1)  # positions above m
        credit = own * ranked + after
        last_tie = torch.searchsorted(ranked, ranked, right=True) - 1  # each tie run's last credit
        # Every rollout with fewer than k rollouts below it has one exact credit (each of its
        # k-subsets holds a rollout at least as good as the others'): the credit of the last of
        # them, at or past sorted position k - 1, so that rounding cannot tell them apart.
        lowest = last_tie[:, min(max(k, 1), int(n)) - 1 :][:, :1]
        credit = credit.gather(1, torch.maximum(last_tie, lowest))
        advantage = credit - (fold_sum(credit, dim=1) / n)[:, None]
        # where every rollout shares that credit (fewer than k below the best) the exact
        # advantages are 0: the mean of n equal credits, rounded, may not be the credit
        uniform = lowest[:, 0] == int(n) - 1
        result[rows] = torch.where(uniform[:, None], torch.zeros_like(advantage), advantage).flatten()
    if active is not None:
        result = torch.where(active.to(x.device)[ids], result, torch.zeros_like(result))
    return result
