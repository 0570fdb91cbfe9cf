"""The run summary: figures computed from the per-group statistics, and their JSON form.

The JSON keys are stable and documented in the README ("Summary JSON"); the text and
rich renderings are in :mod:`grpo_cli.cli.report`.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from grpo_cli.arrow.plain import plain_key
from grpo_cli.results.findings import (
    GroupFindings,
    GroupPart,
    findings_of,
    in_chunks,
    reward_totals,
)
from grpo_cli.run.reward_counts import RewardCounts

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from grpo_cli.inputs.sources import Shard
    from grpo_cli.run.outcome import GroupOutcome, OutcomeTotals


@dataclass
class RunSummary:
    """What one ``compute`` or ``check`` run found. :meth:`to_dict` is the JSON form."""

    rows: int
    groups: int
    active_groups: int
    inactive_groups: int
    singleton_groups: int
    group_size: dict[str, float | None]
    reward: dict[str, float | None]
    advantage: dict[str, float | None]
    inactive_by_value: list[dict[str, Any]]
    inactive_other_values: int
    group_mean_histogram: dict[str, Any]
    reward_histogram: dict[str, Any]
    nan_rewards: int
    dropped: dict[str, Any]
    input: dict[str, Any]
    output: dict[str, Any] | None
    options: dict[str, Any]
    mode: str
    device: str
    elapsed_seconds: float
    verify: dict[str, Any] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    off_size_groups: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    by: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    tolerance: dict[str, Any] | None = None
    trainer_filter: dict[str, Any] | None = None
    group_size_counts: dict[str, int] = field(default_factory=dict)

    @property
    def active_fraction(self) -> float:
        return self.active_groups / self.groups if self.groups else 0.0

    @property
    def inactive_fraction(self) -> float:
        return self.inactive_groups / self.groups if self.groups else 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rows": self.rows,
            "groups": self.groups,
            "active_groups": self.active_groups,
            "inactive_groups": self.inactive_groups,
            "active_fraction": round(self.active_fraction, 6),
            "singleton_groups": self.singleton_groups,
            "group_size": self.group_size,
            "group_size_counts": self.group_size_counts,
            "reward": self.reward,
            "advantage": self.advantage,
            "inactive_by_value": self.inactive_by_value,
            "inactive_other_values": self.inactive_other_values,
            "group_mean_histogram": self.group_mean_histogram,
            "reward_histogram": self.reward_histogram,
            "nan_rewards": self.nan_rewards,
            "dropped": self.dropped,
            "input": self.input,
            "output": self.output,
            "options": self.options,
            "mode": self.mode,
            "device": self.device,
            "elapsed_seconds": round(self.elapsed_seconds, 3),
        }
        if self.off_size_groups:
            out["off_size_groups"] = self.off_size_groups
        if self.by:
            out["by"] = self.by
        if self.tolerance is not None:
            out["inactive_tolerance"] = self.tolerance
        if self.trainer_filter is not None:
            out["trainer_filter"] = self.trainer_filter
        out["warnings"] = self.warnings
        out["findings"] = self.findings
        if self.verify is not None:
            out["verify"] = self.verify
        if self.checks:
            out["checks"] = self.checks
            out["checks_passed"] = all(c["passed"] for c in self.checks)
        return out

    def to_json(self) -> str:
        return json.dumps(_finite_or_none(self.to_dict()), indent=2)


def summary_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) every summary meets, as published beside this module
    (``summary.schema.json``): what a CI step that reads ``--summary-json`` may rely on.

    >>> summary_schema()["title"]
    'grpo-cli run summary'
    """
    from importlib.resources import files

    schema: dict[str, Any] = json.loads(files("grpo_cli.results").joinpath("summary.schema.json").read_text())
    return schema


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def group_findings(
    outcome: GroupOutcome,
    *,
    options: dict[str, Any],
    key_at: Callable[[int], Any] | None = None,
    by: Sequence[ByValues] = (),
) -> GroupFindings:
    """The figures of the groups, from the run's per-group ``outcome`` alone (an engine may
    compute them while it writes: nothing here reads the output), made from parts of
    :data:`FINDINGS_CHUNK_GROUPS` groups through the exact merge of :mod:`grpo_cli.results.findings`
    (which parts held on other machines can use too).

    ``key_at`` gives a group's key from its ID, to name the groups off the common size;
    ``by``: each ``--by`` column's value of every group, for the figures per value
    (:func:`figures_by_value`).
    """
    whole = outcome_part(
        outcome, order=np.arange(outcome.active.numel(), dtype=np.int64), named=key_at is not None
    )
    findings = findings_of(in_chunks(whole, FINDINGS_CHUNK_GROUPS, key_at=key_at), options=options)
    run_range = (findings.reward["min"], findings.reward["max"])
    figures = GroupFigures(
        count=whole.count,
        mean=whole.mean,
        m2=whole.m2,
        minimum=whole.minimum,
        maximum=whole.maximum,
        active=whole.active,
        rows=whole.rows,
    )
    return replace(
        findings,
        by={values.column: figures_by_value(values, figures, run_range=run_range) for values in by},
    )


def outcome_part(outcome: GroupOutcome, *, order: np.ndarray, named: bool = False) -> GroupPart:
    """The groups of ``outcome`` (all of a run's, or a Ray reducer's bucket) as one part of the
    summary's findings: ``order`` (int64, one per group) sorts them as the run's group IDs do;
    ``named``: the labels :func:`~grpo_cli.results.findings.in_chunks` gives them are keys."""
    from grpo_cli.kernel import group_scales

    cpu = outcome.stats.to("cpu")
    scales = group_scales(cpu)
    return GroupPart(
        count=cpu.count.numpy(),
        mean=cpu.mean.numpy(),
        m2=cpu.m2.numpy(),
        m2_scale=None if scales is None else scales.numpy(),
        minimum=cpu.minimum.numpy(),
        maximum=cpu.maximum.numpy(),
        active=outcome.active.numpy().astype(bool),
        rows=np.asarray(outcome.rows_per_group),  # rows, a null or NaN reward's included
        order=order,
        named=named,
        spans=None if outcome.step_spans is None else np.asarray(outcome.step_spans),
    )


FINDINGS_CHUNK_GROUPS = 1 << 18
"""Groups :func:`group_findings` takes at a time (the temporaries are a chunk's). The findings
run on a thread beside pass 2, whose memory they add to: chunks of 1M groups left some 30 MB
more of the process's pages behind them than chunks of 256K (the 10M-row sorted file)."""


def build_summary(
    outcome: GroupOutcome | OutcomeTotals,
    *,
    input: dict[str, Any],
    output: dict[str, Any] | None,
    options: dict[str, Any],
    advantage_range: tuple[float, float] | None,
    mode: str,
    device: str,
    elapsed: float,
    verify: dict[str, Any] | None = None,
    key_at: Callable[[int], Any] | None = None,
    warnings: Sequence[str] = (),
    by: Sequence[ByValues] = (),
    trainer_filter: dict[str, Any] | None = None,
    findings: GroupFindings | None = None,
    reward_counts: RewardCounts,
) -> RunSummary:
    """The figures of a run from its per-group ``outcome`` and how it ran.

    ``input`` and ``output`` are the summary's ``input`` and ``output`` objects
    (:func:`input_info` makes the first). ``warnings`` are the engine's own. ``findings``:
    :func:`group_findings` of the same ``outcome``, ``options``, ``key_at`` and ``by``,
    where the engine computed them already; otherwise they are computed here. An engine
    that holds no per-group outcome (the Ray engine's reducers hold it) gives the outcome's
    merged :class:`~grpo_cli.run.outcome.OutcomeTotals` and the merged ``findings``.
    ``reward_counts``: every scored row's reward counted in pass 1, drawn as the summary's
    ``reward_histogram``.
    """
    from grpo_cli.run.outcome import OutcomeTotals  # imports torch: only once there is an outcome

    if isinstance(outcome, OutcomeTotals):
        if findings is None:
            raise ValueError("a summary from an outcome's totals needs the findings of its groups")
        totals = outcome
    else:
        if findings is None:
            findings = group_findings(outcome, options=options, key_at=key_at, by=by)
        totals = outcome.totals
    return RunSummary(
        rows=totals.rows,
        groups=findings.groups,
        active_groups=findings.active_groups,
        inactive_groups=findings.groups - findings.active_groups,
        singleton_groups=findings.singleton_groups,
        group_size=findings.group_size,
        reward=findings.reward,
        # a zero's sign depends on where the engine cut the rows (and Parquet statistics
        # store a zero minimum as -0.0): the summary says 0.0
        advantage={
            "min": advantage_range[0] + 0.0 if advantage_range else None,
            "max": advantage_range[1] + 0.0 if advantage_range else None,
        },
        inactive_by_value=findings.inactive_by_value,
        inactive_other_values=findings.inactive_other_values,
        group_mean_histogram=findings.group_mean_histogram,
        reward_histogram=reward_counts.histogram(),
        nan_rewards=totals.nan_rewards,
        dropped={
            "groups": totals.dropped_groups,
            "rows": totals.dropped_rows,
            "reasons": list(totals.drop_reasons),
            "by_reason": list(totals.drops_by_reason),
            "rows_written": totals.rows - totals.dropped_rows,
        },
        input=input,
        output=output,
        options=options,
        mode=mode,
        device=device,
        elapsed_seconds=elapsed,
        verify=verify,
        off_size_groups=findings.off_size_groups,
        findings=findings.findings,
        warnings=[*warnings, *findings.warnings],
        trainer_filter=trainer_filter,
        group_size_counts=findings.group_size_counts,
        tolerance=findings.tolerance,
        by=findings.by,
    )


@dataclass(frozen=True)
class ByValues:
    """One ``--by`` column: the value (an index into ``keys``) of every group."""

    column: str
    of_group: np.ndarray  # int64 (num_groups,)
    keys: list[Any]


@dataclass(frozen=True)
class GroupFigures:
    """Per-group arrays (num_groups,): the valid rewards' count, mean, sum of squared
    deviations, minimum and maximum (float64), whether the group is active, its rows."""

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray
    active: np.ndarray
    rows: np.ndarray


PERCENTILES = (10, 50, 90)


def figures_by_value(
    values: ByValues, groups: GroupFigures, *, run_range: tuple[float | None, float | None]
) -> list[dict[str, Any]]:
    """The summary's figures for each value of a ``--by`` column, in the values' order.

    Per value: groups, rows, active and inactive groups, the inactive split into all at the
    run's minimum reward, all at its maximum, and other constant groups; the effective-row
    fraction (rows in active groups); p10/p50/p90 of the group mean and the group std
    (population); singletons; the mean reward; and, where every reward of the value is 0 or 1,
    the fraction of groups of two or more that are all-0 or all-1 beside the fraction expected
    if every rollout passed independently at the value's pass rate p: the mean over those
    groups of ``p**G + (1 - p)**G``.

    >>> groups = GroupFigures(count=np.array([2.0, 2, 2]), mean=np.array([0.0, 0.5, 1.0]),
    ...     m2=np.array([0.0, 0.5, 0.0]), minimum=np.array([0.0, 0, 1]), maximum=np.array([0.0, 1, 1]),
    ...     active=np.array([False, True, False]), rows=np.array([2, 2, 2]))
    >>> [v["inactive"] for v in figures_by_value(ByValues("step", np.array([0, 0, 1]), [1, 2]), groups,
    ...     run_range=(0.0, 1.0))]
    [{'all_min': 1, 'all_max': 0, 'other': 0}, {'all_min': 0, 'all_max': 1, 'other': 0}]
    """
    low, high = run_range
    # Each figure for every value at once, over the groups sorted by value (a pass per value
    # would cost values x groups; a call per value, a millisecond each: --by over a column of
    # 100,000 values took a minute).
    k = len(values.keys)
    by_value = np.argsort(values.of_group, kind="stable")
    sizes = np.bincount(values.of_group, minlength=k)
    count, mean, m2 = groups.count[by_value], groups.mean[by_value], groups.m2[by_value]
    minimum, maximum = groups.minimum[by_value], groups.maximum[by_value]
    active, rows = groups.active[by_value].astype(bool), groups.rows[by_value]
    scored = count > 0
    constant = ~active & scored & (minimum == maximum)
    std = np.sqrt(np.divide(m2, count, out=np.zeros_like(m2, dtype=np.float64), where=scored))
    value_of = np.repeat(np.arange(k), sizes)

    def per_value(terms: np.ndarray) -> np.ndarray:
        return np.bincount(value_of, weights=terms.astype(np.float64), minlength=k).astype(np.int64)

    rows_of, active_rows = per_value(rows), per_value(np.where(active, rows, 0))
    counts = {
        "active": per_value(active),
        "at_low": per_value(constant & (minimum == low)),
        "at_high": per_value(constant & (maximum == high)) if high != low else np.zeros(k, np.int64),
        "constant": per_value(constant),
        "singletons": per_value(rows == 1),
        "spread": per_value(~active & (maximum > minimum)),
    }
    means = _segment_percentiles(value_of[scored], mean[scored], k)
    stds = _segment_percentiles(value_of[scored], std[scored], k)
    # binary rewards: a reward r in [0, 1] has r**2 <= r, equal only at 0 and 1, so a group's
    # rewards are binary exactly when its sum of squares (m2 + n * mean**2) equals its sum
    sums = mean * count
    squares = m2 + count * mean**2
    with np.errstate(invalid="ignore"):  # an empty group's NaN mean: not scored
        close = np.abs(squares - sums) <= 1e-9 + 1e-9 * np.abs(sums)  # numpy's allclose, as before
        binary_group = (minimum >= 0) & (maximum <= 1) & close
    several = count >= 2
    binary = (per_value(scored & ~binary_group) == 0) & (per_value(scored) > 0)
    several_of, constant_several = per_value(several), per_value(constant & several)
    starts = np.concatenate(([0], np.cumsum(sizes)))
    rewards_of = per_value(np.where(scored, count, 0))
    whole = np.where(scored, sums, 0.0)
    # integer group sums (binary rewards, counts): each value's exact sum in float64 directly
    integral = bool(np.all(np.isfinite(whole) & (whole == np.round(whole)))) and (
        float(np.abs(whole).sum()) < 2.0**53
    )
    integer_sums = np.bincount(value_of, weights=whole, minlength=k) if integral else None
    out = []
    for value in sorted(np.flatnonzero(sizes).tolist(), key=lambda v: value_sort_key(values.keys[v])):
        at = slice(int(starts[value]), int(starts[value + 1]))
        if integer_sums is not None:
            held = int(rewards_of[value])
            reward: Any = _Totals(held, int(integer_sums[value]) / held if held else 0.0)
        else:
            reward = _reward_totals(count[at], mean[at], minimum[at], maximum[at])
        at_low, at_high = int(counts["at_low"][value]), int(counts["at_high"][value])
        total_rows = int(rows_of[value])
        entry: dict[str, Any] = {
            "value": plain_key(values.keys[value]),
            "groups": int(sizes[value]),
            "rows": total_rows,
            "active_groups": int(counts["active"][value]),
            "inactive_groups": int(sizes[value] - counts["active"][value]),
            "inactive": {
                "all_min": at_low,
                "all_max": at_high,
                "other": int(counts["constant"][value]) - at_low - at_high,
            },
            "effective_row_fraction": round(float(active_rows[value]) / float(total_rows), 6)
            if total_rows
            else 0.0,
            "group_mean": means[value],
            "group_std": stds[value],
            "singleton_groups": int(counts["singletons"][value]),
            "inactive_with_spread": int(counts["spread"][value]),
            "reward_mean": reward.mean if reward.rewards else None,
            "homogeneous": None
            if not (binary[value] and several_of[value])
            else {
                "observed": round(float(constant_several[value]) / float(several_of[value]), 6),
                "expected": round(_expected_constant_fraction(reward.mean, count[at][several[at]]), 6),
                "pass_rate": round(reward.mean, 6),
            },
        }
        out.append(entry)
    return out


SMALL_VALUE_GROUPS = 64
"""A ``--by`` value of at most this many groups has its exact reward sum taken in Python's
integers (a kernel call costs more than its arithmetic there); the same bits either way."""


def _reward_totals(count: np.ndarray, mean: np.ndarray, minimum: np.ndarray, maximum: np.ndarray) -> Any:
    """:func:`~grpo_cli.results.findings.reward_totals` of a few groups, in exact rationals where each
    group's sum ``count * mean`` (rounded once, as the kernel rounds it) is finite: the exact sum
    and its quotient rounded once, as :class:`~grpo_cli.kernel.ExactSum` gives them."""
    if count.size > SMALL_VALUE_GROUPS:
        return reward_totals(count, mean, minimum, maximum)
    seen = count > 0
    sums = count[seen] * mean[seen]
    if not np.isfinite(sums).all():
        return reward_totals(count, mean, minimum, maximum)
    rewards = int(count[seen].sum())
    if not rewards:
        return _Totals(0, 0.0)
    # each float is an integer over a power of two: the sum over the largest of them, exactly,
    # and an integer quotient (rounded once)
    ratios = [v.as_integer_ratio() for v in sums.tolist()]
    denominator = max(d for _, d in ratios)
    total = sum(n * (denominator // d) for n, d in ratios)
    return _Totals(rewards, total / (rewards * denominator))


@dataclass(frozen=True)
class _Totals:
    rewards: int
    mean: float


def _segment_percentiles(segment: np.ndarray, values: np.ndarray, k: int) -> list[dict[str, float | None]]:
    """p10/p50/p90 of the ``values`` of each of ``k`` segments (``segment``: each value's, in
    ``[0, k)``), as :func:`numpy.percentile` gives them one segment at a time (linear
    interpolation between the order statistics), computed for all segments at once."""
    order = np.lexsort((values, segment))
    ranked, segment = values[order], segment[order]
    sizes = np.bincount(segment, minlength=k)
    starts = np.concatenate(([0], np.cumsum(sizes)))[:-1]
    out: list[dict[str, float | None]] = [{f"p{p}": None for p in PERCENTILES} for _ in range(k)]
    held = np.flatnonzero(sizes)
    if not held.size:
        return out
    n, first = sizes[held], starts[held]
    figures = {}
    for p in PERCENTILES:
        virtual = (n - 1) * np.true_divide(p, 100)
        previous = np.floor(virtual)
        at_end = virtual >= n - 1
        below = np.where(at_end, n - 1, previous).astype(np.int64)
        above = np.where(at_end, n - 1, previous + 1).astype(np.int64)
        gamma = virtual - np.where(at_end, -1, previous)  # numpy's, where both ends are the last
        a, b = ranked[first + below], ranked[first + above]
        lerp = a + (b - a) * gamma
        np.subtract(b, (b - a) * (1 - gamma), out=lerp, where=gamma >= 0.5)
        figures[p] = lerp
    for i, value in enumerate(held.tolist()):
        out[value] = {f"p{p}": float(figures[p][i]) for p in PERCENTILES}
    return out


def value_sort_key(key: Any) -> tuple[int, Any]:
    """Where a ``--by`` value's figures come in the summary: numbers, then text, then the rest."""
    if isinstance(key, bool) or key is None:
        return (2, str(key))
    if isinstance(key, int | float):
        return (0, key)
    return (1, str(key))


def _expected_constant_fraction(p: float, sizes: np.ndarray) -> float:
    """The mean over groups of ``p**G + (1 - p)**G``, in exact rational arithmetic rounded once: the
    same bits on every CPU (numpy's ``power`` takes the CPU's vector-math library).

    >>> _expected_constant_fraction(0.5, np.array([2, 2, 4]))
    0.375
    """
    return _expected_of(p, tuple(sorted(Counter(sizes.tolist()).items())))


@functools.lru_cache(maxsize=4096)
def _expected_of(p: float, size_counts: tuple[tuple[int, int], ...]) -> float:
    """:func:`_expected_constant_fraction` of groups given as (size, how many) pairs: many
    ``--by`` values share a pass rate and sizes."""
    from fractions import Fraction

    rate = Fraction(p)
    total = sum((rate**size + (1 - rate) ** size) * n for size, n in size_counts)
    return float(total / sum(n for _, n in size_counts))


KEY_TEXT_LIMIT = 60
"""Characters of a group key shown in an example line: a prompt can be kilobytes long."""


def short_key(key: Any) -> str:
    """A group key as one short piece of text (the JSON summary keeps it whole).

    >>> short_key(["What is 2 + 2? " * 10, 3])
    "['What is 2 + 2? What is 2 + 2? What is 2 + 2? What is 2 + …"
    >>> short_key(7), short_key("prompt 3")
    ('7', "'prompt 3'")
    """
    text = repr(key) if isinstance(key, str) else str(key)
    return text if len(text) <= KEY_TEXT_LIMIT else f"{text[: KEY_TEXT_LIMIT - 1]}…"


def input_info(
    spec: str,
    shards: Sequence[Shard],
    *,
    stdin: bool,
    bytes_decoded: int,
    about: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary's ``input`` object: what was read, how much it decoded to, and (``--from``)
    which trainer's dump it was and how its groups were rebuilt."""
    info = {
        "path": "<stdin>" if stdin else spec,
        "format": sorted({s.format for s in shards}),
        "shards": len(shards),
        "bytes": sum(s.size_bytes for s in shards),
        "bytes_decoded": bytes_decoded,
    }
    if about is not None:
        info["from"] = about
    return info
