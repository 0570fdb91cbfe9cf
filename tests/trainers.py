"""Straightforward re-implementations of each trainer's GRPO advantage formula.

Written from the trainers' descriptions (see the README's preset table), independently
of grpo-cli's kernel: per-group Python loops over float64 tensors, in the trainers' own
style (torch.std is Bessel-corrected). Each takes a list of groups (lists of floats,
NaN allowed where the trainer allows it) and returns the advantages group by group.
"""

from __future__ import annotations

import math
from typing import Any

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


# --------------------------------------------------------------------------- outcome estimators
# Written from the trainers' code (verl core_algos.py and torch_functional.py at b178a3cd,
# OpenRLHF experience_maker.py at 3c3be623, TRL grpo_trainer.py at f2cd5771, NeMo-RL
# advantage_estimator.py at 7ea279ab), token-level where the trainer is: each row's value is
# spread over ``length`` tokens and the batch statistics are taken over valid tokens.


def _token_mask(lengths: list[int]) -> torch.Tensor:
    longest = max(lengths)
    return (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]).to(torch.float64)


def _verl_masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl_F.masked_whiten: masked mean, unbiased masked variance, rsqrt(var + 1e-8)."""

    def masked_mean(v: torch.Tensor) -> torch.Tensor:
        return (v * mask).sum() / (mask.sum() + 1e-8)

    mean = masked_mean(values)
    variance = masked_mean((values - mean) ** 2)
    count = mask.sum()
    variance = variance * count / (count - 1)
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def _group_means_verl(scores: torch.Tensor, index: list[int]) -> torch.Tensor:
    """verl's id2mean: the group's mean, 0 for a one-rollout group."""
    out = torch.empty_like(scores)
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g]
        out[rows] = 0.0 if len(rows) == 1 else scores[rows].mean()
    return out


def verl_reinforce_plus_plus_baseline(
    scores: list[float], index: list[int], lengths: list[int]
) -> list[float]:
    s = torch.tensor(scores, dtype=torch.float64)
    s = s - _group_means_verl(s, index)
    mask = _token_mask(lengths)
    tokens = s[:, None] * mask
    whitened = _verl_masked_whiten(tokens, mask) * mask
    return [float(whitened[i, 0]) for i in range(len(scores))]


def verl_whiten(advantages: list[float], lengths: list[int]) -> list[float]:
    """ROLL's and verl's masked_whiten of final advantages, token-weighted."""
    mask = _token_mask(lengths)
    tokens = torch.tensor(advantages, dtype=torch.float64)[:, None] * mask
    whitened = _verl_masked_whiten(tokens, mask) * mask
    return [float(whitened[i, 0]) for i in range(len(advantages))]


def openrlhf_reinforce_baseline(groups: Groups, lengths: list[int]) -> list[float]:
    """rewards - rewards.mean(-1) per prompt (uniform group size), then whitening over the
    batch's action tokens: mean, population variance, (x - mean) * var.clamp(min=1e-8).rsqrt()."""
    rewards = torch.tensor(groups, dtype=torch.float64)
    rewards = (rewards - rewards.mean(-1, keepdim=True)).reshape(-1)
    mask = _token_mask(lengths)
    tokens = rewards[:, None] * mask
    count = mask.sum()
    mean = (tokens * mask).sum() / count
    variance = ((tokens - mean).pow(2) * mask).sum() / count
    out = (tokens - mean) * variance.clamp(min=1e-8).rsqrt()
    return [float(out[i, 0]) for i in range(len(lengths))]


def verl_gpg(scores: list[float], index: list[int], f_norm: float = 1.0) -> list[float]:
    s = torch.tensor(scores, dtype=torch.float64)
    alpha = len(scores) / max(1, int(torch.count_nonzero(s)))
    return (alpha * (s - _group_means_verl(s, index)) / f_norm).tolist()


def verl_remax(scores: list[float], baselines: list[float]) -> list[float]:
    return (torch.tensor(scores, dtype=torch.float64) - torch.tensor(baselines, dtype=torch.float64)).tolist()


def trl_normalize_then_sum(
    per_func: list[list[float]], weights: list[float], num_generations: int
) -> list[float]:
    """TRL's multi_objective_aggregation="normalize_then_sum"."""
    rewards_per_func = torch.tensor(per_func, dtype=torch.float64)
    grouped = rewards_per_func.view(-1, num_generations, len(weights))
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = grouped.std(dim=1, keepdim=True)
    reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, len(weights))
    rewards = (reward_k * torch.tensor(weights, dtype=torch.float64)).nansum(dim=1)
    std = rewards.std()
    return ((rewards - rewards.mean()) / (std + 1e-4)).tolist()


def nemo_rl_gdpo(per_func: list[list[float]], prompt_ids: list[int], weights: list[float]) -> list[float]:
    """NeMo-RL's GDPOAdvantageEstimator: each component against its leave-one-out baseline
    (std of the others, + 1e-6 where > 0), weighted sum, then (A - mean) / std over the batch."""
    components = torch.tensor(per_func, dtype=torch.float64)
    total = torch.zeros(components.shape[0], dtype=torch.float64)
    for k, weight in enumerate(weights):
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(prompt_ids):
            groups.setdefault(p, []).append(i)
        part = torch.zeros_like(total)
        for rows in groups.values():
            advantages = nemo_rl([components[rows, k].tolist()])[0]
            part[rows] = torch.tensor(advantages, dtype=torch.float64)
        total = total + weight * part
    std = total.std()
    return ((total - total.mean()) / std if std > 0 else total - total.mean()).tolist()


def constant_zero_rows(
    rows: list[dict[str, Any]], advantages: list[float], column: str = "score"
) -> list[float]:
    """:func:`constant_zero` for rows in any order: rows of constant groups get 0."""
    values: dict[int, set[float]] = {}
    sizes: dict[int, int] = {}
    for r in rows:
        values.setdefault(r["group_id"], set()).add(r[column])
        sizes[r["group_id"]] = sizes.get(r["group_id"], 0) + 1
    return [
        0.0 if sizes[r["group_id"]] > 1 and len(values[r["group_id"]]) == 1 else a
        for r, a in zip(rows, advantages, strict=True)
    ]


def verl_opo(scores: list[float], index: list[int], lengths: list[int]) -> list[float]:
    """verl's opo: r - sum(length * r) / sum(length) over the group; a one-rollout group: 0."""
    s = torch.tensor(scores, dtype=torch.float64)
    n = torch.tensor(lengths, dtype=torch.float64)
    out = s.clone()
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g]
        baseline = 0.0 if len(rows) == 1 else (n[rows] * s[rows]).sum() / n[rows].sum()
        out[rows] = s[rows] - baseline
    return out.tolist()


def verl_grpo_passk(scores: list[float], index: list[int], *, norm: bool = True) -> list[float]:
    """verl's grpo_passk: torch.topk(rewards, 2); only the best row gets r_max - r_second,
    divided by torch.std + 1e-6. verl raises on a one-rollout group; grpo-cli gives it 0."""
    s = torch.tensor(scores, dtype=torch.float64)
    out = torch.zeros_like(s)
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g]
        rewards = s[rows]
        if rewards.numel() < 2:
            continue
        top, top_index = torch.topk(rewards, 2)
        advantage = top[0] - top[1]
        if norm:
            advantage = advantage / (rewards.std() + 1e-6)
        out[rows[int(top_index[0])]] = advantage
    return out.tolist()


def trl_multi_reward(
    per_func: list[list[float]],
    weights: list[float],
    num_generations: int,
    *,
    aggregation: str = "sum_then_normalize",
    scale: str = "group",
    dtype: torch.dtype = torch.float64,
) -> list[float]:
    """TRL's _generate_and_score_completions with several reward functions (grpo_trainer.py at
    f2cd5771): ``nansum`` of the weighted rewards (a None counts as 0), a row is NaN (left out
    of nanmean/nanstd) only when every function returned None, its advantage then 0.
    ``per_func`` is rows x functions; rows are consecutive groups of ``num_generations``."""
    table = torch.tensor(per_func, dtype=dtype)
    w = torch.tensor(weights, dtype=dtype)
    unscorable = torch.isnan(table).all(dim=1)

    def nanstd(t: torch.Tensor, dim: int | None = None) -> torch.Tensor:
        keep = dim is not None
        mean = torch.nanmean(t, dim=dim, keepdim=True) if keep else torch.nanmean(t)
        count = (~torch.isnan(t)).sum(dim=dim, keepdim=True) if keep else (~torch.isnan(t)).sum()
        variance = (
            torch.nanmean((t - mean) ** 2, dim=dim, keepdim=True) if keep else torch.nanmean((t - mean) ** 2)
        )
        # TRL divides the integer counts, which gives float32: in float64, the exact correction
        correction = count.to(dtype) / (count - 1).to(dtype)
        variance = variance * torch.where(count > 1, correction, torch.full_like(variance, float("nan")))
        return variance.sqrt()

    if aggregation == "sum_then_normalize":
        rewards = (table * w).nansum(dim=1)
        rewards[unscorable] = float("nan")
        grouped = rewards.view(-1, num_generations)
        mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
        if scale == "batch":
            std = nanstd(rewards).expand_as(rewards)
        else:
            std = nanstd(grouped, dim=1).squeeze(1).repeat_interleave(num_generations)
        advantages = rewards - mean
        if scale != "none":
            advantages = advantages / (std + 1e-4)
    else:
        grouped = table.view(-1, num_generations, len(weights))
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1)
        reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, len(weights))
        rewards = (reward_k * w).nansum(dim=1)
        rewards[unscorable] = float("nan")
        advantages = (rewards - torch.nanmean(rewards)) / (nanstd(rewards) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0).tolist()
