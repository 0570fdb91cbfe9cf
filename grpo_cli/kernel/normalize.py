"""Normalisation of rewards into advantages with the final group statistics: the compute step."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypedDict

import torch
from torch import Tensor

from grpo_cli.choices import Baseline, EpsilonMode, NanPolicy, Scale, Singleton, Std, check_choice
from grpo_cli.kernel.accumulate import _group_stats
from grpo_cli.kernel.batch import batch_mean_std
from grpo_cli.kernel.exact import sqrt_rn
from grpo_cli.kernel.layout import _check_epsilon, _check_rewards, _Layout, _layout, _row_group_ids
from grpo_cli.kernel.stats import GroupStats, _scales, active_groups


class GroupAdvantages(TypedDict):
    """What :func:`normalize_in_groups` returns.

    ``advantages`` has the rewards' shape, dtype and device; ``active_group_mask`` is a
    bool tensor of shape ``(num_groups,)`` ordered by group ID; ``active_group_count``
    is a plain ``int``.
    """

    advantages: Tensor
    active_group_mask: Tensor
    active_group_count: int


def advantages_from_stats(
    rewards: Tensor,
    group_ids: Tensor | None,
    stats: GroupStats,
    *,
    group_size: int | None = None,
    epsilon: float = 1e-6,
    std: Std = "population",
    scale: Scale = "group",
    baseline: Baseline = "mean",
    epsilon_mode: EpsilonMode = "add",
    singleton: Singleton = "zero",
    valid: Tensor | None = None,
    batch_std: Tensor | None = None,
) -> Tensor:
    """Normalise rewards with final group statistics (the *compute* step).

    Args:
        rewards: floating tensor ``(N,)`` (or ``(P, G)`` grouped by row), one chunk of the
            rollouts that ``stats`` describes.
        group_ids: int tensor ``(N,)`` indexing ``stats``, or ``None`` with ``group_size``
            or 2-D rewards.
        stats: :class:`GroupStats` over *all* rollouts of the groups involved.
        epsilon: added to (``"add"``), or a floor for (``"clamp"``), the std.
        std: ``"population"`` (divide by n) or ``"sample"`` (n - 1).
        scale: ``"group"`` std, ``"batch"`` std of all rewards in ``stats``, or ``"none"``.
        baseline: subtract the group ``"mean"``, or the ``"leave-one-out"`` mean of the
            other rollouts of the group (RLOO); with ``scale="group"`` the std is then
            taken over the same other rollouts (NeMo-RL).
        epsilon_mode: ``"add"`` (``std + eps``), ``"clamp"`` (``max(std, eps)``), or
            ``"add-if-nonzero"`` (divide by ``std + eps`` only where std > 0).
        singleton: ``"zero"``, or ``"raw"``: a one-rollout group gets ``r / (1 + eps)``
            (verl: mean 0, std 1), or ``r`` with ``scale="none"``.
        valid: optional bool tensor; ``False`` rows get advantage 0.
        batch_std: the batch std to use with ``scale="batch"``; computed from ``stats``
            when omitted.

    Returns:
        Advantages with the rewards' shape, dtype and device. Rollouts of inactive
        groups are exactly ``+0.0``.

    >>> from grpo_cli.kernel import group_stats
    >>> r, ids = torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1])
    >>> advantages_from_stats(r, ids, group_stats(r, ids), epsilon=1e-8)
    tensor([-1.,  1.,  0.,  0.])
    """
    norm = prepare_normalization(
        stats,
        epsilon=epsilon,
        std=std,
        scale=scale,
        baseline=baseline,
        epsilon_mode=epsilon_mode,
        singleton=singleton,
        batch_std=batch_std,
    )
    return apply_normalization(rewards, group_ids, norm, group_size=group_size, valid=valid)


@dataclass(frozen=True)
class Normalization:
    """The per-group terms of the *compute* step, prepared once for many chunks.

    With the mean baseline, ``A = (r / units[g] - center[g]) / denominator[g]`` row by
    row, ``units`` being the groups' powers of two (``None``: all 1, see
    :func:`group_scale`); the leave-one-out baseline works from ``stats`` row by row. Build it with
    :func:`prepare_normalization`, apply it with :func:`apply_normalization`.
    """

    stats: GroupStats
    active: Tensor
    center: Tensor | None
    denominator: Tensor | None
    divisor: Divisor
    singleton: Singleton
    units: Tensor | None = None
    tolerated: Tensor | None = None  # bool (K,): groups with a spread that are inactive (zeroed)


@dataclass(frozen=True)
class Divisor:
    """What the centred rewards are divided by: the options of :func:`prepare_normalization`."""

    scale: Scale
    ddof: int
    epsilon: float
    epsilon_mode: EpsilonMode
    batch_std: Tensor | None

    def groups(self, start: int, end: int) -> Divisor:
        """The divisor of groups ``start`` to ``end - 1``: a batch std given per group is cut
        to theirs (a run's one std stays whole)."""
        if self.batch_std is None or self.batch_std.numel() <= 1:
            return self
        return replace(self, batch_std=self.batch_std[start:end])

    def of(
        self,
        m2: Tensor,
        count: Tensor,
        units: Tensor | None = None,
        mean: Tensor | None = None,
        *,
        deviation: Tensor | None = None,
    ) -> Tensor:
        """Per-group (or per-row, for leave-one-out) divisor for groups with ``count`` and ``m2``
        (``scale="mean"``: the groups' ``mean``, MaxRL's divisor).

        ``m2`` and the result are in ``units`` (powers of two; ``None``: 1); ``deviation``, in
        ``units`` too, is the standard deviation where the caller has it (``scale="group"``).
        """
        one = torch.ones_like(m2) if units is None else 1 / units
        if self.scale == "none":
            return one
        if self.scale == "mean":
            if mean is None:
                raise ValueError("scale='mean' divides by the group mean: it takes the mean baseline")
            deviation = mean if units is None else mean / units
        elif self.scale == "batch":
            assert self.batch_std is not None
            deviation = self.batch_std.expand_as(m2) if units is None else self.batch_std / units
        elif deviation is None:
            dof = (count - self.ddof).clamp_min(1).to(m2.dtype)
            deviation = sqrt_rn(m2 / dof)
        eps: float | Tensor = self.epsilon if units is None else self.epsilon / units
        if self.epsilon_mode == "clamp":
            return (
                deviation.clamp_min(self.epsilon)
                if units is None
                else torch.maximum(deviation, self.epsilon / units)
            )
        if self.epsilon_mode == "add-if-nonzero":
            return torch.where(deviation > 0, deviation + eps, one)
        return deviation + eps


def prepare_normalization(
    stats: GroupStats,
    *,
    epsilon: float = 1e-6,
    std: Std = "population",
    scale: Scale = "group",
    baseline: Baseline = "mean",
    epsilon_mode: EpsilonMode = "add",
    singleton: Singleton = "zero",
    batch_std: Tensor | None = None,
    inactive_tolerance: float = 0.0,
) -> Normalization:
    """Per-group centers and divisors from final statistics (options as in :func:`advantages_from_stats`).

    ``inactive_tolerance`` T: a group whose rewards span at most T is inactive (see
    :func:`active_groups`) and its rollouts get advantage ``+0.0``, as an exactly constant
    group's do.

    >>> from grpo_cli.kernel import group_stats
    >>> r, ids = torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1])
    >>> norm = prepare_normalization(group_stats(r, ids), epsilon=1e-8)
    >>> apply_normalization(r, ids, norm)
    tensor([-1.,  1.,  0.,  0.])
    """
    _check_epsilon(epsilon)
    check_choice("std", std, Std)
    check_choice("scale", scale, Scale)
    check_choice("baseline", baseline, Baseline)
    check_choice("epsilon_mode", epsilon_mode, EpsilonMode)
    check_choice("singleton", singleton, Singleton)
    ddof = 1 if std == "sample" else 0
    if scale == "mean" and baseline != "mean":
        raise ValueError("scale='mean' (MaxRL) divides by the group mean: use baseline='mean'")
    if baseline != "mean" and (stats.at_minimum is None or stats.at_maximum is None):
        raise ValueError("baseline='leave-one-out' needs stats computed with count_extremes=True")
    if scale == "batch" and batch_std is None:
        batch_std = batch_mean_std(stats, ddof=ddof)[2]
    divisor = Divisor(scale, ddof, epsilon, epsilon_mode, batch_std)
    k = stats.num_groups
    if k <= NORMALIZATION_CHUNK_GROUPS:
        parts = _normalization_of(stats, divisor, baseline, singleton, inactive_tolerance)
        return Normalization(stats, *parts[:3], divisor, singleton, *parts[3:])
    # Chunk by chunk: every figure is a group's own, so the chunks' parts are the whole's, and
    # a chunk's temporaries (a dozen per group in the roots) are a chunk's, not the run's.
    active = torch.empty(k, dtype=torch.bool, device=stats.mean.device)
    center = denominator = units = tolerated = None
    if baseline == "mean":
        center, denominator = torch.empty_like(stats.mean), torch.empty_like(stats.mean)
    for start in range(0, k, NORMALIZATION_CHUNK_GROUPS):
        end = min(start + NORMALIZATION_CHUNK_GROUPS, k)
        part_active, part_center, part_denominator, part_units, part_tolerated = _normalization_of(
            stats.groups(start, end), divisor.groups(start, end), baseline, singleton, inactive_tolerance
        )
        active[start:end] = part_active
        if center is not None and part_center is not None:
            center[start:end] = part_center
        if denominator is not None and part_denominator is not None:
            denominator[start:end] = part_denominator
        if part_units is not None:  # a chunk's units of 1 are no units: 1 where no chunk had them
            if units is None:
                units = torch.ones_like(stats.mean)
            units[start:end] = part_units
        if part_tolerated is not None:
            if tolerated is None:
                tolerated = torch.zeros(k, dtype=torch.bool, device=stats.mean.device)
            tolerated[start:end] = part_tolerated
    return Normalization(stats, active, center, denominator, divisor, singleton, units, tolerated)


NORMALIZATION_CHUNK_GROUPS = 1 << 18
"""Groups normalised at a time: their temporaries (about 100 bytes a group) stay a chunk's. They
come at the top of a run's heap, when pass 1's figures of every group are held: chunks of 1M
groups left the heap 30 MB larger than chunks of 256K (the 10M-row sorted file's 1.25M groups)."""


def _normalization_of(
    stats: GroupStats, divisor: Divisor, baseline: Baseline, singleton: Singleton, inactive_tolerance: float
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """:func:`prepare_normalization` of some groups: their activity, center, denominator, units
    and tolerated mask, each figure a group's own."""
    scale, epsilon = divisor.scale, divisor.epsilon
    active = active_groups(stats, singleton=singleton, tolerance=inactive_tolerance)
    if scale == "mean":  # MaxRL: a group whose mean reward is <= 0 carries no signal (prime-rl)
        active = active & ((stats.mean > 0) | ((stats.count == 1) & (singleton == "raw")))
    # Groups with a spread that a tolerance or MaxRL's mean <= 0 rule calls inactive: zeroed by hand
    # (the inactive center, the group minimum, zeroes only constant groups).
    tolerated = (
        (stats.maximum > stats.minimum) & ~active if inactive_tolerance > 0 or scale == "mean" else None
    )
    units = _scales(stats.minimum, stats.maximum)
    center = denominator = None
    if baseline == "mean":
        center = torch.where(active, stats.mean, stats.minimum)
        if units is not None:
            center = center / units
        # x - (-0.0) is +0.0 for both signed zeros: inactive groups of zeros give +0.0.
        center = torch.where(center == 0, torch.full_like(center, -0.0), center)
        denominator = divisor.of(stats.m2, stats.count, units, stats.mean)
        if singleton == "raw":
            lone = stats.count == 1
            center = torch.where(lone, torch.full_like(center, -0.0), center)
            lone_scale = torch.full_like(denominator, 1.0 if scale in ("none", "mean") else 1 + epsilon)
            denominator = torch.where(lone, lone_scale if units is None else lone_scale / units, denominator)
        denominator = torch.where(active, denominator, torch.ones_like(denominator))
    return active, center, denominator, units, tolerated


def apply_normalization(
    rewards: Tensor,
    group_ids: Tensor | None,
    norm: Normalization,
    *,
    group_size: int | None = None,
    valid: Tensor | None = None,
) -> Tensor:
    """Advantages of one chunk of rewards, with the rewards' shape, dtype and device.

    ``group_ids`` (or ``group_size``, or 2-D rewards) index the groups of ``norm``.
    """
    _check_rewards(rewards, allow_nonfinite=True)
    flat, layout = _layout(rewards, group_ids, group_size)
    if layout.num_groups > norm.stats.num_groups:
        raise ValueError(
            f"group IDs reach {layout.num_groups - 1} but stats describe {norm.stats.num_groups} groups"
        )
    out = _apply(flat, layout, norm, None if valid is None else valid.reshape(-1))
    return out.to(rewards.dtype).view(rewards.shape)


def _apply(flat: Tensor, layout: _Layout, norm: Normalization, valid: Tensor | None) -> Tensor:
    """Advantages of flat rows, in the accumulator dtype (the caller casts back)."""
    stats = norm.stats
    center, denominator = norm.center, norm.denominator
    blocks = layout.group_size is not None and valid is None and norm.tolerated is None
    if center is not None and denominator is not None and blocks:
        return _apply_blocks(flat, layout, center, denominator, norm.units)
    x = flat.to(stats.mean.dtype)
    ids = _row_group_ids(layout, flat.device)
    if center is not None and denominator is not None:
        if norm.units is not None:
            x = x / torch.take(norm.units, ids)
        out = (x - torch.take(center, ids)) / torch.take(denominator, ids)
    else:
        out = _leave_one_out(x, ids, norm)
        if norm.singleton == "raw":
            lone = torch.take(stats.count, ids) == 1
            divisor = norm.divisor
            # x + 0.0 is +0.0 for both signed zeros, as under the mean baseline
            out = torch.where(
                lone, (x + 0.0) / (1.0 if divisor.scale == "none" else 1 + divisor.epsilon), out
            )
    if norm.tolerated is not None:
        out = torch.where(torch.take(norm.tolerated, ids), torch.zeros_like(out), out)
    if valid is not None:
        out = torch.where(valid, out, torch.zeros_like(out))
    return out


def _apply_blocks(
    flat: Tensor, layout: _Layout, center: Tensor, denominator: Tensor, units: Tensor | None
) -> Tensor:
    """:func:`_apply`'s operations on rows in blocks of ``layout.group_size``, a block a group:
    the same bits, each group's figures broadcast over its block instead of gathered per row.
    Narrower rewards are widened exactly by the first operation's type promotion."""
    first, end, g = layout.first_group, layout.num_groups, layout.group_size
    assert g is not None
    acc = center.dtype
    rows = (flat if torch.promote_types(flat.dtype, acc) == acc else flat.to(acc)).view(end - first, g)
    if units is not None:
        rows = rows / units[first:end, None]
    out = rows - center[first:end, None]
    return out.div_(denominator[first:end, None]).view(-1)


def _leave_one_out(x: Tensor, ids: Tensor, norm: Normalization) -> Tensor:
    """``(r_i - mean of the others) / std of the others``, from the group moments.

    Removing one point from (n, mean, M2) is the reverse Welford update, so no second
    pass over the group is needed: mean' = (n mean - r) / (n - 1) and
    M2' = M2 - (r - mean)^2 n / (n - 1). Works in the groups' units (powers of two).
    """
    stats = norm.stats
    n = torch.take(stats.count, ids).to(x.dtype)
    mean = torch.take(stats.mean, ids)
    units = None if norm.units is None else torch.take(norm.units, ids)
    scaled = x if units is None else x / units
    if units is not None:
        mean = mean / units
    row_active = torch.take(norm.active, ids) & (n > 1)
    others = (n - 1).clamp_min(1)
    deviation = scaled - mean
    centred = deviation * (n / others)  # r - (n mean - r) / (n - 1)
    m2_others = (torch.take(stats.m2, ids) - deviation * deviation * (n / others)).clamp_min(0)
    assert stats.at_minimum is not None and stats.at_maximum is not None
    # The reverse update cancels when the others are identical (binary rewards: one
    # success among failures): decide that case exactly from the extreme counts.
    others_n = n - 1
    at_min = torch.take(stats.at_minimum, ids).to(x.dtype)
    at_max = torch.take(stats.at_maximum, ids).to(x.dtype)
    lone_max = (x == torch.take(stats.maximum, ids)) & (at_max == 1)
    lone_min = (x == torch.take(stats.minimum, ids)) & (at_min == 1)
    identical = (lone_max & (at_min == others_n)) | (lone_min & (at_max == others_n))
    m2_others = torch.where(identical, torch.zeros_like(m2_others), m2_others)
    divisor = norm.divisor
    if divisor.batch_std is not None and divisor.batch_std.numel() > 1:  # one per group: per row here
        divisor = replace(divisor, batch_std=torch.take(divisor.batch_std, ids))
    spread: Tensor | None = None  # the others' standard deviation, in the groups' units
    if divisor.scale == "group":
        # It cancels too where the row left out dominates the group's M2 (an outlier): then it is
        # the group's lone maximum or minimum, whose others' statistics the group carries.
        dof = (others_n - divisor.ddof).clamp_min(1)
        spread = sqrt_rn(m2_others / dof)
        for lone, without in ((lone_max, stats.but_max), (lone_min, stats.but_min)):
            if without is None or not bool((lone & ~identical).any()):
                continue
            without_scale = _scales(torch.take(without.minimum, ids), torch.take(without.maximum, ids))
            exact = sqrt_rn(torch.take(without.m2, ids) / dof)
            if without_scale is not None:
                exact = exact * without_scale
            if units is not None:
                exact = exact / units
            spread = torch.where(lone & ~identical, exact, spread)
    denominator = divisor.of(m2_others, (n - 1).to(torch.int64), units, deviation=spread)
    out = centred / denominator
    return torch.where(row_active, out, torch.zeros_like(out))


def normalize_in_groups(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    epsilon: float = 1e-6,
    *,
    group_size: int | None = None,
    std: Std = "population",
    scale: Scale = "group",
    baseline: Baseline = "mean",
    epsilon_mode: EpsilonMode = "add",
    singleton: Singleton = "zero",
    nan: NanPolicy = "error",
) -> GroupAdvantages:
    """GRPO group-relative advantages: ``A_i = (r_i - mean_g) / (std_g + epsilon)``.

    Three call forms, one result:

    * ``normalize_in_groups(rewards, group_ids)``: rewards ``(N,)`` float, group_ids ``(N,)``
      int with values in ``[0, K)``; ``K = max(group_ids) + 1`` (IDs with no rollouts are
      inactive groups);
    * ``normalize_in_groups(rewards_2d)``: rewards ``(P, G)``, each row a group;
    * ``normalize_in_groups(rewards, group_size=G)``: rewards ``(N,)`` in consecutive blocks of G.

    Args:
        rewards: float16, bfloat16, float32 or float64 tensor; never modified.
        group_ids: integer tensor of the rewards' shape, on the same device.
        epsilon: positive finite number added to the std (default 1e-6).
        group_size: consecutive block size for flat rewards without group_ids.
        std: ``"population"`` (divide by n, default) or ``"sample"`` (Bessel-corrected:
            TRL, verl, OpenRLHF).
        scale: ``"group"`` (default), ``"batch"`` (group mean, std of all rewards in the
            call: TRL's ``scale_rewards="batch"``) or ``"none"`` (Dr. GRPO).
        baseline, epsilon_mode, singleton: see :func:`advantages_from_stats`.
        nan: ``"error"`` (default) raises on NaN or infinite rewards; ``"ignore"`` leaves
            them out of the statistics and gives them advantage 0 (TRL's convention).

    Returns:
        :class:`GroupAdvantages`: ``advantages`` (rewards' shape, dtype, device),
        ``active_group_mask`` (bool, ``(K,)``, by group ID) and ``active_group_count``.

    Raises:
        ValueError: naming the offending value, for mismatched shapes or devices,
            non-integer or negative IDs, non-floating or non-finite rewards, a bad epsilon
            or option, or a length that ``group_size`` does not divide.

    >>> out = normalize_in_groups(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]), 1e-8)
    >>> out["advantages"], out["active_group_mask"], out["active_group_count"]
    (tensor([-1.,  1.]), tensor([True]), 1)
    >>> out = normalize_in_groups(torch.tensor([1.0, 3.0, 4.0, 4.0]), torch.tensor([0, 0, 1, 1]), 1e-8)
    >>> out["advantages"], out["active_group_mask"], out["active_group_count"]
    (tensor([-1.,  1.,  0.,  0.]), tensor([ True, False]), 1)
    >>> out = normalize_in_groups(torch.tensor([4.0, 4.0]), torch.tensor([0, 0]))
    >>> out["advantages"], out["active_group_mask"], out["active_group_count"]
    (tensor([0., 0.]), tensor([False]), 0)
    >>> normalize_in_groups(torch.tensor([[0.0, 1.0], [1.0, 1.0]]), epsilon=1e-8)["advantages"]
    tensor([[-1.,  1.],
            [ 0.,  0.]])
    """
    _check_rewards(rewards, allow_nonfinite=True)
    _check_epsilon(epsilon)
    check_choice("std", std, Std)
    check_choice("scale", scale, Scale)
    flat, layout = _layout(rewards, group_ids, group_size)
    check_choice("baseline", baseline, Baseline)
    check_choice("epsilon_mode", epsilon_mode, EpsilonMode)
    check_choice("singleton", singleton, Singleton)
    check_choice("nan", nan, NanPolicy)
    valid = None
    if nan == "ignore":
        finite = torch.isfinite(flat)
        valid = None if bool(finite.all()) else finite
    stats = _group_stats(flat, layout, valid, count_extremes=baseline == "leave-one-out")
    if nan == "error" and not bool(torch.isfinite(stats.mean).all()):
        # A NaN or infinite reward makes its group's sum non-finite: checking the K
        # group means instead of the N rewards keeps a pass off the common path.
        _check_rewards(rewards)
    norm = prepare_normalization(
        stats,
        epsilon=epsilon,
        std=std,
        scale=scale,
        baseline=baseline,
        epsilon_mode=epsilon_mode,
        singleton=singleton,
    )
    advantages = _apply(flat, layout, norm, valid)
    mask = norm.active
    return GroupAdvantages(
        advantages=advantages.to(rewards.dtype).view(rewards.shape),
        active_group_mask=mask,
        active_group_count=int(mask.sum()),
    )
