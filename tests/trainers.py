"""Straightforward re-implementations of each trainer's GRPO advantage formula.

Written from the trainers' descriptions (see the README's preset table), independently
of grpo-cli's kernel: per-group Python loops over float64 tensors, in the trainers' own
style (torch.std is Bessel-corrected). Each takes a list of groups (lists of floats,
NaN allowed where the trainer allows it) and returns the advantages group by group.
"""

from __future__ import annotations

import math

import torch

Groups = list[list[float]]


def _t(group: list[float]) -> torch.Tensor:
    return torch.tensor(group, dtype=torch.float64)


def _std(r: torch.Tensor) -> torch.Tensor:
    """torch.std (Bessel), NaN for one value, as torch gives without the warning."""
    return r.std() if r.numel() > 1 else torch.tensor(float("nan"), dtype=torch.float64)


def trl(groups: Groups, *, scale: str = "group") -> Groups:
    """TRL: (r - nanmean) / (nanstd + 1e-4); NaN rewards get 0."""
    everything = torch.cat([_t(g) for g in groups])
    kept = everything[~torch.isnan(everything)]
    batch_std = kept.std() if kept.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
    out = []
    for g in groups:
        r = _t(g)
        valid = r[~torch.isnan(r)]
        mean = valid.mean()
        std = valid.std() if valid.numel() > 1 else torch.tensor(float("nan"), dtype=torch.float64)
        divisor = batch_std if scale == "batch" else std
        a = r - mean if scale == "none" else (r - mean) / (divisor + 1e-4)
        out.append(torch.nan_to_num(a, nan=0.0).tolist())
    return out


def verl(groups: Groups, *, norm_adv_by_std: bool = True) -> Groups:
    """verl compute_grpo_outcome_advantage: singleton groups use mean 0 and std 1."""
    out = []
    for g in groups:
        r = _t(g)
        if r.numel() == 1:
            mean, std = torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
        else:
            mean, std = r.mean(), r.std()
        a = (r - mean) / (std + 1e-6) if norm_adv_by_std else r - mean
        out.append(a.tolist())
    return out


def openrlhf(groups: Groups, *, dr_grpo: bool = False) -> Groups:
    out = []
    for g in groups:
        r = _t(g)
        a = r - r.mean() if dr_grpo else (r - r.mean()) / (_std(r) + 1e-9)
        out.append(a.tolist())
    return out


def nemo_rl(groups: Groups) -> Groups:
    """Leave-one-out baseline; sample std over the same others; + 1e-6 only where std > 0."""
    out = []
    for g in groups:
        r = _t(g)
        n = r.numel()
        if n <= 1:
            out.append([0.0] * n)  # baseline = reward
            continue
        advantages = []
        for i in range(n):
            others = torch.cat((r[:i], r[i + 1 :]))
            baseline = others.mean()
            std = others.std() if others.numel() > 1 else torch.tensor(float("nan"))
            std = torch.nan_to_num(std, nan=0.0)
            a = r[i] - baseline
            if std > 0:
                a = a / (std + 1e-6)
            advantages.append(float(a))
        out.append(advantages)
    return out


def roll(groups: Groups) -> Groups:
    return [((_t(g) - _t(g).mean()) / (_std(_t(g)) + 1e-6)).tolist() for g in groups]


def torchrl(groups: Groups) -> Groups:
    return [((_t(g) - _t(g).mean()) / _std(_t(g)).clamp_min(1e-6)).tolist() for g in groups]


def flatten(groups: Groups) -> list[float]:
    return [v for g in groups for v in g]


def constant_zero(groups: Groups, advantages: Groups) -> Groups:
    """What grpo-cli guarantees over a trainer: constant groups are exactly 0."""
    return [
        [0.0] * len(a) if len(g) > 1 and len({v for v in g if not math.isnan(v)}) <= 1 else a
        for g, a in zip(groups, advantages, strict=True)
    ]


def verl_float32(groups: Groups) -> Groups:
    """verl's grpo in float32, as it runs: torch.mean, torch.std, (r - mean) / (std + 1e-6)."""
    out = []
    for g in groups:
        r = torch.tensor(g, dtype=torch.float32)
        if r.numel() == 1:
            out.append([float(r[0]) / (1 + 1e-6)])
            continue
        out.append(((r - r.mean()) / (r.std() + 1e-6)).tolist())
    return out


def nemo_rl_float32(groups: Groups) -> Groups:
    """NeMo-RL's calculate_baseline_and_std_per_prompt in float32: the others' std from
    E[x^2] - E[x]^2 (matrix products with 1 - I), divided by std + 1e-6 only where std > 0."""
    out = []
    for g in groups:
        r = torch.tensor(g, dtype=torch.float32)
        n = r.numel()
        if n <= 1:
            out.append([0.0] * n)
            continue
        others = 1 - torch.eye(n)
        num_valid = torch.tensor(float(n - 1))
        baseline = others @ r / num_valid
        square = others @ r.pow(2) / num_valid
        std = ((square - baseline.square()) * (num_valid / (num_valid - 1))).sqrt().nan_to_num(0)
        a = r - baseline
        nonzero = std > 0
        a[nonzero] = a[nonzero] / (std[nonzero] + 1e-6)
        out.append(a.tolist())
    return out
