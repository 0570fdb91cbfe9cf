"""An independent, deliberately slow reference: a per-group Python loop in float64.

It shares no code with the kernel: plain Python floats (IEEE float64), math.fsum for
exactly rounded sums, and the textbook definitions.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence


def reference_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[int],
    *,
    epsilon: float = 1e-6,
    std: str = "population",
    scale: str = "group",
    baseline: str = "mean",
    epsilon_mode: str = "add",
    singleton: str = "zero",
    valid: Sequence[bool] | None = None,
) -> tuple[list[float], dict[int, bool]]:
    """Advantages per rollout and activity per group ID present."""
    ddof = 1 if std == "sample" else 0
    keep = list(valid) if valid is not None else [True] * len(rewards)
    members: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        if keep[i]:
            members[int(g)].append(i)
    values = [float(r) for r in rewards]
    kept = [values[i] for i in range(len(values)) if keep[i]]
    batch_std = 0.0
    if kept:
        batch_mean = math.fsum(kept) / len(kept)
        batch_std = _deviation(kept, batch_mean, max(len(kept) - ddof, 1))

    def divide(centred: float, deviation: float) -> float:
        if scale == "none":
            return centred
        if scale == "batch":
            deviation = batch_std
        if epsilon_mode == "clamp":
            return centred / max(deviation, epsilon)
        if epsilon_mode == "add-if-nonzero":
            return centred / (deviation + epsilon) if deviation > 0 else centred
        return centred / (deviation + epsilon)

    out = [0.0] * len(values)
    active: dict[int, bool] = {}
    for g, idx in members.items():
        group = [values[i] for i in idx]
        n = len(group)
        is_active = max(group) > min(group)
        if n == 1 and singleton == "raw":
            active[g] = group[0] != 0
            out[idx[0]] = group[0] if scale == "none" else group[0] / (1 + epsilon)
            continue
        active[g] = is_active
        if not is_active:
            continue
        mean = math.fsum(group) / n
        if baseline == "mean":
            sd = _deviation(group, mean, max(n - ddof, 1))
            for i in idx:
                out[i] = divide(values[i] - mean, sd)
        else:
            for j, i in enumerate(idx):
                others = group[:j] + group[j + 1 :]
                m = math.fsum(others) / len(others)
                dof = max(len(others) - ddof, 1)
                sd = _deviation(others, m, dof)
                out[i] = divide(values[i] - m, sd)
    return out, active


def _deviation(values: Sequence[float], mean: float, dof: int) -> float:
    """``sqrt(sum((v - mean)**2) / dof)``, the squares taken in units of the largest
    deviation: squared as they are, deviations below 1e-154 underflow to 0 (a group of
    rewards near 1e-300 had no spread) and above 1e154 overflow."""
    largest = max(abs(v - mean) for v in values)
    if largest == 0.0:
        return 0.0
    return largest * math.sqrt(math.fsum(((v - mean) / largest) ** 2 for v in values) / dof)
