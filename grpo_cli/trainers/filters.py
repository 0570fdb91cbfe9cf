"""Trainers' own "this group has no signal" rules, each in its own dtype and arithmetic.

``check --trainer-filter NAME`` applies one of :data:`FILTERS` to every group's rewards and
sets its decision beside the exact one (a group is active when its rewards are not all
identical): the groups the trainer's rule keeps although they are constant, and those it
drops although they carry a signal. Each rule follows the trainer's code, named in its
``source``; ``tests/oracles/test_trainer_filters.py`` runs that code, cut from the trainer's source,
on the same groups and checks that the decisions are the same.

>>> import numpy as np
>>> group = np.array([0.1, 0.1, 0.1], dtype=np.float64)  # constant: no signal
>>> FILTERS["dapo"].keeps(group), FILTERS["verl-v1"].keeps(group), FILTERS["skyrl"].keeps(group)
(False, True, False)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_cli.arrow.plain import plain_key


@dataclass(frozen=True)
class TrainerFilter:
    """One trainer's rule: whether it keeps (trains on) a group, given the group's rewards in
    input order (float64, or the reward column's float32)."""

    name: str
    trainer: str
    source: str
    rule: str
    keeps: Callable[[np.ndarray], bool]
    rows: Callable[[np.ndarray], np.ndarray] | None = None  # a rule on rows: which it keeps
    batch_rule: Callable[[Sequence[np.ndarray]], np.ndarray] | None = None  # a rule on a batch's groups
    batch_figure: Callable[[Sequence[np.ndarray], np.ndarray], tuple[str, Any]] | None = None  # per batch


def _dapo(dtype: Any) -> Callable[[np.ndarray], bool]:
    def keeps(rewards: np.ndarray) -> bool:
        metric_vals = [dtype(r) for r in rewards]  # a list of numpy scalars, as the recipe collects them
        return bool(np.std(metric_vals) > 0 or len(metric_vals) == 1)

    return keeps


def _verl_v1(rewards: np.ndarray) -> bool:
    values = [float(r) for r in rewards]
    return not (len(values) > 1 and float(np.std(values)) == 0.0)


def _skyrl(rewards: np.ndarray, tol: float = 1e-6) -> bool:
    vals = [float(r) for r in rewards]
    return not (len(vals) > 1 and (max(vals) - min(vals)) <= tol)


def _slime(rewards: np.ndarray) -> bool:
    import torch

    with warnings.catch_warnings():  # a group of one: std is NaN (and slime drops it), torch warns
        warnings.simplefilter("ignore", UserWarning)
        return bool(torch.tensor([float(r) for r in rewards], dtype=torch.float64).std() > 1e-6)


def _roll(rewards: np.ndarray) -> bool:
    """ROLL's ``agentic_reward_norm`` (group mean and std): the group's advantages are zeros
    unless it has more than one rollout and its float32 sample std exceeds 1e-6 in magnitude."""
    import torch

    scores_float = torch.tensor([float(r) for r in rewards], dtype=torch.float64).float()
    if scores_float.numel() < 2:
        return False
    return bool(scores_float.std().abs() > 1e-6)


def _trl_nanstd(values: Any, dim: int | None) -> Any:
    """TRL's ``nanstd`` (trl/trainer/utils.py): the unbiased std of the values that are not NaN,
    NaN where fewer than two are; over ``dim`` (keeping it), or over every value."""
    import torch

    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(values), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    return torch.sqrt(variance * correction)


def _trl(rewards: np.ndarray) -> bool:
    """TRL's ``is_std_zero`` (logged as ``frac_reward_zero_std``) under ``scale_rewards="group"``:
    the float32 ``nanstd`` of the group's row of ``rewards.view(-1, num_generations)`` (its NaN
    slots, the unscorable rollouts, in place), ``torch.isclose`` to 0; a group of one gets std 0
    (TRL's ``num_generations == 1``). "Kept" here means not counted as zero: a NaN std (fewer
    than two scored rollouts) is not close to 0."""
    import torch

    values = torch.tensor(rewards, dtype=torch.float32)
    if values.numel() < 2:
        return False
    std = _trl_nanstd(values.view(1, -1), dim=1)
    return not bool(torch.isclose(std, torch.zeros_like(std)))


def _trl_batch_groups(groups: Sequence[np.ndarray]) -> np.ndarray:
    """TRL's ``is_std_zero`` under ``scale_rewards="batch"``: one float32 ``nanstd`` of the whole
    batch (std 0 for a batch of one row), the same flag on every group, so TRL logs
    ``frac_reward_zero_std`` as 0 or 1."""
    import torch

    values = torch.tensor(np.concatenate(list(groups)) if groups else np.zeros(0), dtype=torch.float32)
    std = _trl_nanstd(values, dim=None) if values.numel() > 1 else torch.zeros(1)
    flag = not bool(torch.isclose(std, torch.zeros_like(std)).all())
    return np.full(len(groups), flag, dtype=bool)


def _slime_fallback(groups: Sequence[np.ndarray]) -> np.ndarray:
    """slime ``_post_process_rewards``: groups of one size are normalised each on its own
    (``rewards.reshape(-1, n_samples_per_prompt)``); a batch of uneven groups falls back to
    ``rewards.view(-1, N)``, one baseline for the whole batch, so every group whose float32
    ``r - batch mean`` is not all 0 is trained on, constant or not."""
    import torch

    sizes = {g.size for g in groups}
    if len(sizes) <= 1:
        return np.array([_mean_offset_float32(g) for g in groups], dtype=bool)
    batch = torch.tensor([float(r) for g in groups for r in g], dtype=torch.float)
    offsets = (batch - batch.mean()) != 0
    kept, start = [], 0
    for g in groups:
        kept.append(bool(offsets[start : start + g.size].any()))
        start += g.size
    return np.array(kept, dtype=bool)


def _mean_offset_float32(rewards: np.ndarray) -> bool:
    """Whether some float32 ``r - mean`` of the group is not 0.0. prime-rl: GRPO's
    ``rewards - rewards.mean()``, after which ``_prune_zero_advantages`` drops every token whose
    advantage is exactly 0.0, so the group is kept when any rollout keeps its tokens; slime:
    its group normalisation's numerator, so the group is trained on."""
    import torch

    values = torch.tensor([float(r) for r in rewards], dtype=torch.float32)
    return bool(((values - values.mean()) != 0.0).any())


def _nemo_rl_rows(rewards: np.ndarray) -> np.ndarray:
    """NeMo-RL's dynamic sampling keeps a row where the leave-one-out std of the other rewards
    of its prompt is not 0.0, computed as ``calculate_baseline_and_std_per_prompt`` does: float32,
    ``E[x^2] - E[x]^2`` over the others by a matrix product, times ``(n-1)/(n-2)``, NaN as 0."""
    import torch

    values = torch.tensor([float(r) for r in rewards], dtype=torch.float32)
    n = values.numel()
    if n <= 1:  # no other valid response: its std is 0
        return np.zeros(n, dtype=bool)
    others = 1 - torch.eye(n)
    num_valid = torch.ones(n).sum() - 1
    mean = torch.matmul(others, values) / num_valid
    square = torch.matmul(others, torch.pow(values, 2)) / num_valid
    std = ((square - mean.square()) * (num_valid / (num_valid - 1))).sqrt().nan_to_num(0)
    kept: np.ndarray = (std != 0.0).numpy()
    return kept


FILTERS: dict[str, TrainerFilter] = {
    "dapo": TrainerFilter(
        "dapo",
        "verl DAPO recipe",
        "verl-recipe dapo/dapo_ray_trainer.py (filter_groups, metric seq_final_reward: float32)",
        "keep if np.std(metric_vals) > 0 or len == 1, on float32 values",
        _dapo(np.float32),
    ),
    "dapo-float64": TrainerFilter(
        "dapo-float64",
        "verl DAPO recipe",
        "verl-recipe dapo/dapo_ray_trainer.py (filter_groups, a float64 metric such as acc)",
        "keep if np.std(metric_vals) > 0 or len == 1, on float64 values",
        _dapo(np.float64),
    ),
    "verl-v1": TrainerFilter(
        "verl-v1",
        "verl v1 replay buffer",
        "verl/trainer/ppo/v1/replay_buffer.py (the DAPO classification)",
        "drop if len > 1 and float(np.std(values)) == 0.0, on float64 values",
        _verl_v1,
    ),
    "skyrl": TrainerFilter(
        "skyrl",
        "SkyRL",
        "skyrl/train/utils/trainer_utils.py zero_variance_filter (zero_variance_filter_tol 1e-6)",
        "drop if len > 1 and max - min <= 1e-6",
        _skyrl,
    ),
    "slime": TrainerFilter(
        "slime",
        "slime",
        "slime/rollout/filter_hub/dynamic_sampling_filters.py check_reward_nonzero_std",
        "keep if torch float64 std (unbiased) > 1e-6",
        _slime,
    ),
    "roll": TrainerFilter(
        "roll",
        "ROLL",
        "roll/pipeline/agentic/utils.py agentic_reward_norm (norm_mean_type and norm_std_type 'group')",
        "zero advantages unless numel > 1 and |float32 std (unbiased)| > 1e-6",
        _roll,
    ),
    "nemo-rl": TrainerFilter(
        "nemo-rl",
        "NeMo-RL dynamic sampling",
        "nemo_rl/algorithms/grpo.py dynamic_sampling + algorithms/utils.py "
        "calculate_baseline_and_std_per_prompt",
        "keeps a row where the float32 leave-one-out std of the others is not 0.0 (it splits groups)",
        lambda rewards: bool(_nemo_rl_rows(rewards).any()),
        rows=_nemo_rl_rows,
    ),
    "prime-rl": TrainerFilter(
        "prime-rl",
        "prime-rl",
        "prime_rl/orchestrator/algo/grpo.py score_group, orchestrator/train_sink.py _prune_zero_advantages",
        "tokens dropped where the float32 advantage r - mean is exactly 0.0",
        _mean_offset_float32,
    ),
    "trl": TrainerFilter(
        "trl",
        "TRL",
        "trl/trainer/grpo_trainer.py is_std_zero (frac_reward_zero_std), scale_rewards='group'",
        "counted as zero std if isclose(float32 nanstd, 0)",
        _trl,
    ),
    "trl-batch": TrainerFilter(
        "trl-batch",
        "TRL",
        "trl/trainer/grpo_trainer.py is_std_zero (frac_reward_zero_std), scale_rewards='batch'",
        "every group of a batch counted as zero std if isclose(float32 nanstd of the whole batch, 0); "
        "the batch is --batch-col's value, else the whole input",
        _trl,
        batch_rule=_trl_batch_groups,
        batch_figure=lambda groups, kept: ("batch_kept", bool(kept[0]) if kept.size else False),
    ),
    "slime-fallback": TrainerFilter(
        "slime-fallback",
        "slime",
        "slime/ray/rollout.py RolloutManager._post_process_rewards (rewards.view(-1, N) on uneven groups)",
        "a batch of one group size: each group normalised on its own (float32 r - mean); a batch of "
        "uneven groups (--batch-col's value, else the whole input): one baseline for the whole batch, "
        "so its constant groups get advantages",
        _mean_offset_float32,
        batch_rule=_slime_fallback,
        batch_figure=lambda groups, kept: ("uneven", len({g.size for g in groups}) > 1),
    ),
}
"""The ``--trainer-filter`` choices."""


def split_by_group(group_ids: np.ndarray, rewards: np.ndarray, num_groups: int) -> list[np.ndarray]:
    """Each group's rewards in input order (a stable sort by group).

    >>> [g.tolist() for g in split_by_group(np.array([1, 0, 1]), np.array([3.0, 4.0, 5.0]), 2)]
    [[4.0], [3.0, 5.0]]
    """
    order = np.argsort(group_ids, kind="stable")
    counts = np.bincount(group_ids, minlength=num_groups)
    return np.split(rewards[order], np.cumsum(counts)[:-1])


def compare(
    name: str,
    groups: Sequence[np.ndarray],
    active: np.ndarray,
    *,
    key_at: Callable[[int], Any] | None = None,
    value_of_group: tuple[str, np.ndarray, list[Any]] | None = None,
    examples: int = 5,
) -> dict[str, Any]:
    """The summary's ``trainer_filter`` object: ``name``'s decision on each group against the
    exact ``active`` one; the groups it keeps although constant, those it drops although
    active, with examples, and per value of ``value_of_group`` (column, value ID per group,
    values) when given, each value a batch of a whole-batch rule."""
    part = filter_part(
        name,
        groups,
        active,
        order=np.arange(len(groups), dtype=np.int64),
        key_at=key_at,
        value_of_group=value_of_group,
        batch_of_group=None if value_of_group is None else value_of_group[1],
        examples=examples,
    )
    return filter_report(name, part, column=None if value_of_group is None else value_of_group[0])


_VALUE_COUNTS = ("value", "groups", "kept_although_inactive", "dropped_although_active")
"""A value's figures that add up over parts of its groups (its batch figure does not)."""


@dataclass(frozen=True)
class FilterPart:
    """What some of a run's groups show under a trainer's filter; ``+`` merges two parts (any
    order) where each value's groups lie in one part or the rule is the group's own (no batch
    figure to merge). ``examples``: the part's first flagged groups in the run's order, each
    ``(order, example)``; ``values``: per value, ``(value, first order, figures)``."""

    groups: int = 0
    kept: int = 0
    kept_although_inactive: int = 0
    dropped_although_active: int = 0
    split: int = 0
    examples: tuple[tuple[int, dict[str, Any]], ...] = ()
    values: tuple[tuple[Any, int, dict[str, Any]], ...] = ()
    room: int = 5  # how many examples a report keeps
    whole_batches: bool = False  # the rule decides a value's groups together

    def __add__(self, other: FilterPart) -> FilterPart:
        values: dict[Any, tuple[int, dict[str, Any]]] = {}
        for value, first, figures in (*self.values, *other.values):
            if value not in values:
                values[value] = (first, figures)
                continue
            seen_first, seen = values[value]
            if set(seen) - set(_VALUE_COUNTS) or set(figures) - set(_VALUE_COUNTS):
                # a batch's figure and decisions need all of its groups at once
                raise ValueError(f"batch {value!r} of a whole-batch rule is in two parts")
            merged = {**seen, **{k: seen[k] + figures[k] for k in _VALUE_COUNTS if k != "value"}}
            values[value] = (min(seen_first, first), merged)
        return FilterPart(
            groups=self.groups + other.groups,
            kept=self.kept + other.kept,
            kept_although_inactive=self.kept_although_inactive + other.kept_although_inactive,
            dropped_although_active=self.dropped_although_active + other.dropped_although_active,
            split=self.split + other.split,
            examples=tuple(sorted((*self.examples, *other.examples), key=lambda e: e[0])[: self.room]),
            values=tuple((value, first, figures) for value, (first, figures) in values.items()),
            room=self.room,
            whole_batches=self.whole_batches or other.whole_batches,
        )


def filter_part(
    name: str,
    groups: Sequence[np.ndarray],
    active: np.ndarray,
    *,
    order: np.ndarray,
    key_at: Callable[[int], Any] | None = None,
    value_of_group: tuple[str, np.ndarray, list[Any]] | None = None,
    batch_of_group: np.ndarray | None = None,
    examples: int = 5,
) -> FilterPart:
    """:class:`FilterPart` of ``groups`` (each one's rewards in input order), with their exact
    decision ``active``, their places in the run's order of groups (``order``, int64) and
    their value of ``value_of_group`` (column, value ID per group, values), the report's view
    of them. A whole-batch rule takes each batch's groups (``batch_of_group``, a batch ID per
    group; ``None``: all of them, in the run's order) as one batch, whatever the view; a value's
    batch figure is given where each value is a batch (``value_of_group``'s IDs are the batches)."""
    chosen = FILTERS[name]
    # The trainers' arithmetic on a NaN, or on one value, warns (numpy's "Degrees of freedom <=
    # 0", "invalid value", torch's std of one); its NaN is the trainer's answer, not the user's news.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        if chosen.batch_rule is not None:
            kept = _batch_decisions(chosen.batch_rule, groups, batch_of_group)
        else:
            kept = np.array([chosen.keeps(g) for g in groups], dtype=bool)
        split = (
            np.array([bool(0 < int(chosen.rows(g).sum()) < g.size) for g in groups], dtype=bool)
            if chosen.rows is not None
            else np.zeros(len(groups), dtype=bool)
        )
    constant_kept = kept & ~active
    active_dropped = ~kept & active
    flagged = np.flatnonzero(constant_kept | active_dropped | split)
    chosen_examples = []
    for group in flagged[np.argsort(order[flagged], kind="stable")][:examples]:
        values = groups[group]
        what = (
            "kept although constant"
            if constant_kept[group]
            else "dropped although active"
            if active_dropped[group]
            else f"split: {int(chosen.rows(values).sum()) if chosen.rows else 0} of {values.size} rows kept"
        )
        chosen_examples.append(
            (
                int(order[group]),
                {
                    "group": None if key_at is None else plain_key(key_at(int(group))),
                    "what": what,
                    "rewards": [float(v) if v == v else None for v in values[:8]],  # NaN: JSON null
                    "size": int(values.size),
                },
            )
        )
    per_value = []
    if value_of_group is not None:
        _, of_group, keys = value_of_group
        values_are_batches = (
            chosen.batch_figure is not None
            and batch_of_group is not None
            and (batch_of_group is of_group or np.array_equal(batch_of_group, of_group))
        )
        for value, member in _members(of_group, len(keys)):
            if member.size:
                figures = {
                    "value": plain_key(keys[value]),
                    "groups": int(member.size),
                    "kept_although_inactive": int(constant_kept[member].sum()),
                    "dropped_although_active": int(active_dropped[member].sum()),
                }
                if values_are_batches:
                    assert chosen.batch_figure is not None
                    figure_name, value_figure = chosen.batch_figure(
                        [groups[int(g)] for g in member], kept[member]
                    )
                    figures[figure_name] = value_figure
                per_value.append((figures["value"], int(order[member].min()), figures))
    return FilterPart(
        groups=len(groups),
        kept=int(kept.sum()),
        kept_although_inactive=int(constant_kept.sum()),
        dropped_although_active=int(active_dropped.sum()),
        split=int(split.sum()),
        examples=tuple(chosen_examples),
        values=tuple(per_value),
        room=examples,
        whole_batches=chosen.batch_rule is not None,
    )


def filter_report(name: str, part: FilterPart, *, column: str | None) -> dict[str, Any]:
    """The summary's ``trainer_filter`` object from the groups' merged :class:`FilterPart`
    (``column``: the column whose values it has figures for, or None)."""
    chosen = FILTERS[name]
    out: dict[str, Any] = {
        "name": name,
        "trainer": chosen.trainer,
        "source": chosen.source,
        "rule": chosen.rule,
        "groups": part.groups,
        "kept": part.kept,
        "kept_although_inactive": part.kept_although_inactive,
        "dropped_although_active": part.dropped_although_active,
        "split": part.split,
        "examples": [example for _, example in part.examples],
    }
    if column is not None:
        values = sorted(part.values, key=lambda entry: entry[1])
        out["by"] = {"column": column, "values": [figures for _, _, figures in values]}
    return out


def _batch_decisions(
    rule: Callable[[Sequence[np.ndarray]], np.ndarray],
    groups: Sequence[np.ndarray],
    batch_of_group: np.ndarray | None,
) -> np.ndarray:
    """A whole-batch rule's decision for every group, given the groups of its batch (one
    batch when ``batch_of_group`` is None)."""
    batches = np.zeros(len(groups), np.int64) if batch_of_group is None else np.asarray(batch_of_group)
    kept = np.zeros(len(groups), dtype=bool)
    for _, member in _members(batches, int(batches.max()) + 1 if batches.size else 0):
        if member.size:
            kept[member] = rule([groups[int(g)] for g in member])
    return kept


def _members(of_group: np.ndarray, values: int) -> Iterator[tuple[int, np.ndarray]]:
    """Each value ID below ``values`` with its groups' indices in ascending order, the groups
    sorted by value once (a comparison per value would cost values x groups)."""
    order = np.argsort(of_group, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(of_group, minlength=values))))
    for value in range(values):
        yield value, order[bounds[value] : bounds[value + 1]]
