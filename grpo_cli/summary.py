"""The run summary: figures computed from the per-group statistics, and their JSON form.

The JSON keys are stable and documented in the README ("Summary JSON"); the text and
rich renderings are in :mod:`grpo_cli.report`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from grpo_cli.plan import GroupOutcome
    from grpo_cli.sources import Shard

HISTOGRAM_BINS = 10
TOP_INACTIVE_VALUES = 10


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
        if self.verify is not None:
            out["verify"] = self.verify
        if self.checks:
            out["checks"] = self.checks
            out["checks_passed"] = all(c["passed"] for c in self.checks)
        return out

    def to_json(self) -> str:
        return json.dumps(_finite_or_none(self.to_dict()), indent=2)


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


@dataclass(frozen=True)
class GroupFindings:
    """What the per-group outcome shows, whatever the run wrote: :class:`RunSummary`'s figures
    of the groups (:func:`group_findings` computes them)."""

    groups: int
    active_groups: int
    singleton_groups: int
    group_size: dict[str, float | None]
    reward: dict[str, float | None]
    inactive_by_value: list[dict[str, Any]]
    inactive_other_values: int
    group_mean_histogram: dict[str, Any]
    off_size_groups: dict[str, Any]
    warnings: list[str]
    group_size_counts: dict[str, int]
    tolerance: dict[str, Any] | None
    by: dict[str, list[dict[str, Any]]]


def group_findings(
    outcome: GroupOutcome,
    *,
    options: dict[str, Any],
    key_at: Callable[[int], Any] | None = None,
    by: Sequence[ByValues] = (),
) -> GroupFindings:
    """The figures of the groups, from the run's per-group ``outcome`` alone (an engine may
    compute them while it writes: nothing here reads the output).

    ``key_at`` gives a group's key from its ID, to name the groups off the common size;
    ``by``: each ``--by`` column's value of every group, for the figures per value
    (:func:`figures_by_value`). The warnings are those the figures show (see
    :func:`grouping_warnings`).
    """
    from grpo_cli.kernel import batch_mean_std

    cpu = outcome.stats.to("cpu")
    count = cpu.count.numpy()
    mean = cpu.mean.numpy()
    minimum = cpu.minimum.numpy()
    maximum = cpu.maximum.numpy()
    active_np = outcome.active.numpy().astype(bool)
    groups = int(count.size)
    sizes = np.asarray(outcome.rows_per_group)  # rows, a null or NaN reward's included

    n_all, mean_all, std_all = batch_mean_std(cpu)
    reward: dict[str, float | None] = {"mean": None, "std": None, "min": None, "max": None}
    if n_all:  # a group with no reward holds the identities, +inf and -inf: no mask needed
        reward = {
            "mean": float(mean_all),
            "std": float(std_all),
            "min": float(minimum.min()),
            "max": float(maximum.max()),
        }

    tolerance = float(options.get("inactive_tolerance") or 0.0)
    tolerated = (~active_np) & (maximum > minimum)
    constant = (~active_np) & (count >= 2) & (minimum == maximum)
    values, value_counts = np.unique(minimum[constant], return_counts=True)
    order = sorted(range(values.size), key=lambda i: (-int(value_counts[i]), float(values[i])))

    return GroupFindings(
        groups=groups,
        active_groups=int(active_np.sum()),
        singleton_groups=int((sizes == 1).sum()),
        group_size={
            "min": int(sizes.min()) if groups else None,
            "median": float(np.median(sizes)) if groups else None,
            "max": int(sizes.max()) if groups else None,
        },
        reward=reward,
        inactive_by_value=[
            {"value": float(values[i]), "groups": int(value_counts[i])} for i in order[:TOP_INACTIVE_VALUES]
        ],
        inactive_other_values=int(sum(int(value_counts[i]) for i in order[TOP_INACTIVE_VALUES:])),
        group_mean_histogram=group_mean_histogram(mean, count, minimum, maximum, cpu.m2.numpy(), sizes),
        off_size_groups=off_size_groups(sizes, key_at),
        warnings=grouping_warnings(sizes, options, key_at),
        group_size_counts=_size_counts(sizes),
        tolerance=None
        if tolerance == 0
        else {"tolerance": tolerance, "groups_beyond_exact": int(tolerated.sum())},
        by={
            values.column: figures_by_value(
                values,
                GroupFigures(
                    count=count,
                    mean=mean,
                    m2=cpu.m2.numpy(),
                    minimum=minimum,
                    maximum=maximum,
                    active=active_np,
                    rows=sizes,
                ),
                run_range=(reward["min"], reward["max"]),
            )
            for values in by
        },
    )


def build_summary(
    outcome: GroupOutcome,
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
) -> RunSummary:
    """The figures of a run from its per-group ``outcome`` and how it ran.

    ``input`` and ``output`` are the summary's ``input`` and ``output`` objects
    (:func:`input_info` makes the first). ``warnings`` are the engine's own. ``findings``:
    :func:`group_findings` of the same ``outcome``, ``options``, ``key_at`` and ``by``,
    where the engine computed them already; otherwise they are computed here.
    """
    if findings is None:
        findings = group_findings(outcome, options=options, key_at=key_at, by=by)
    return RunSummary(
        rows=outcome.rows,
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
        nan_rewards=outcome.nan_rewards,
        dropped={
            "groups": outcome.dropped_groups,
            "rows": outcome.dropped_rows,
            "reasons": outcome.drop_reasons,
            "by_reason": outcome.drops_by_reason,
            "rows_written": outcome.rows - outcome.dropped_rows,
        },
        input=input,
        output=output,
        options=options,
        mode=mode,
        device=device,
        elapsed_seconds=elapsed,
        verify=verify,
        off_size_groups=findings.off_size_groups,
        warnings=[*warnings, *findings.warnings],
        trainer_filter=trainer_filter,
        group_size_counts=findings.group_size_counts,
        tolerance=findings.tolerance,
        by=findings.by,
    )


SIZE_COUNTS_SHOWN = 64


def _size_counts(sizes: np.ndarray) -> dict[str, int]:
    """Groups of each size (the most common :data:`SIZE_COUNTS_SHOWN` sizes), by size."""
    values, counts = np.unique(sizes, return_counts=True)
    top = np.argsort(-counts, kind="stable")[:SIZE_COUNTS_SHOWN]
    return {str(int(values[i])): int(counts[i]) for i in sorted(top, key=lambda i: int(values[i]))}


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
    order = sorted(range(len(values.keys)), key=lambda v: _sort_key(values.keys[v]))
    out = []
    for value in order:
        member = values.of_group == value
        if not member.any():
            continue
        count, mean, m2 = groups.count[member], groups.mean[member], groups.m2[member]
        minimum, maximum, active = groups.minimum[member], groups.maximum[member], groups.active[member]
        rows = groups.rows[member]
        scored = count > 0
        constant = ~active & scored & (minimum == maximum)
        std = np.sqrt(np.divide(m2, count, out=np.zeros_like(m2), where=scored))
        total = float(count.sum())
        reward_sum = float((mean[scored] * count[scored]).sum())
        at_low = int((constant & (minimum == low)).sum())
        at_high = int((constant & (maximum == high)).sum()) if high != low else 0
        entry: dict[str, Any] = {
            "value": plain_key(values.keys[value]),
            "groups": int(member.sum()),
            "rows": int(rows.sum()),
            "active_groups": int(active.sum()),
            "inactive_groups": int((~active).sum()),
            "inactive": {
                "all_min": at_low,
                "all_max": at_high,
                "other": int(constant.sum()) - at_low - at_high,
            },
            "effective_row_fraction": round(float(rows[active].sum()) / float(rows.sum()), 6)
            if rows.sum()
            else 0.0,
            "group_mean": _percentiles(mean[scored]),
            "group_std": _percentiles(std[scored]),
            "singleton_groups": int((rows == 1).sum()),
            "inactive_with_spread": int((~active & (maximum > minimum)).sum()),
            "reward_mean": reward_sum / total if total else None,
            "homogeneous": _homogeneous(count, mean, m2, minimum, maximum, constant),
        }
        out.append(entry)
    return out


def _sort_key(key: Any) -> tuple[int, Any]:
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
    from fractions import Fraction

    rate = Fraction(p)
    sizes_seen, groups = np.unique(sizes, return_counts=True)
    total = sum(
        (rate**size + (1 - rate) ** size) * int(n)
        for size, n in zip(sizes_seen.tolist(), groups.tolist(), strict=True)
    )
    return float(total / int(groups.sum()))


def _percentiles(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {f"p{p}": None for p in PERCENTILES}
    return {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}


def _homogeneous(
    count: np.ndarray,
    mean: np.ndarray,
    m2: np.ndarray,
    minimum: np.ndarray,
    maximum: np.ndarray,
    constant: np.ndarray,
) -> dict[str, float] | None:
    """Observed and expected all-0-or-all-1 fractions, where every reward is 0 or 1; else None.

    A reward r in [0, 1] has r**2 <= r, equal only at 0 and 1: the rewards are binary exactly
    when the sum of squares (``m2 + n * mean**2``) equals the sum.
    """
    scored = count > 0
    if not scored.any() or minimum[scored].min() < 0 or maximum[scored].max() > 1:
        return None
    sums = mean[scored] * count[scored]
    squares = m2[scored] + count[scored] * mean[scored] ** 2
    if not np.allclose(squares, sums, rtol=1e-9, atol=1e-9):
        return None
    several = count >= 2
    if not several.any():
        return None
    p = float(sums.sum() / count[scored].sum())
    expected = _expected_constant_fraction(p, count[several])
    return {
        "observed": round(float(constant[several].mean()), 6),
        "expected": round(expected, 6),
        "pass_rate": round(p, 6),
    }


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


OFF_SIZE_EXAMPLES = 5


def common_size(sizes: np.ndarray) -> tuple[int, int]:
    """The most common group size (the smallest of them on a tie) and how many groups have it.

    >>> common_size(np.array([8, 8, 16, 3, 3]))
    (3, 2)
    """
    values, counts = np.unique(sizes, return_counts=True)
    most = int(np.argmax(counts))
    return int(values[most]), int(counts[most])


def off_size_groups(sizes: np.ndarray, key_at: Callable[[int], Any] | None) -> dict[str, Any]:
    """The groups whose size is not the most common one: how many, and the first few.

    >>> off_size_groups(np.array([8, 8, 16, 8, 3]), None)
    {'common_size': 8, 'groups': 2, 'examples': [{'group': 2, 'rows': 16}, {'group': 4, 'rows': 3}]}
    >>> off_size_groups(np.array([4, 4]), None)
    {}
    """
    if not sizes.size:
        return {}
    common, _ = common_size(sizes)
    off = np.flatnonzero(sizes != common)
    if not off.size:
        return {}
    examples = [
        {"group": plain_key(key_at(int(g))) if key_at is not None else int(g), "rows": int(sizes[g])}
        for g in off[:OFF_SIZE_EXAMPLES]
    ]
    return {"common_size": common, "groups": int(off.size), "examples": examples}


def plain_key(key: Any) -> Any:
    """A group key as JSON data: tuples as lists, other objects as their text."""
    if isinstance(key, tuple):
        return [plain_key(k) for k in key]
    if isinstance(key, str | int | float | bool) or key is None:
        return key
    return str(key)


MERGED_EXAMPLES = 3
"""How many keys of merged groups a warning names."""


def grouping_warnings(
    sizes: np.ndarray, options: dict[str, Any], key_at: Callable[[int], Any] | None = None
) -> list[str]:
    """What the group sizes say about the grouping itself, as one line each.

    Trainers sample a fixed number G of rollouts per prompt: most groups of one size and some
    of two or more times it means groups were merged (a prompt drawn twice in a step, the same
    ID in two data sources, or a prompt key without the step), named by their first keys (from
    ``key_at``); mostly singletons means the key names rollouts, not prompts.

    >>> grouping_warnings(np.array([8] * 10 + [16, 24]), {"group_cols": ["input"]})[0][:60]
    '2 of 12 groups have 2 or more times the 8 rows most groups h'
    >>> grouping_warnings(np.array([1, 1, 1, 2]), {"group_cols": ["uid"]})[0][:48]
    '3 of 4 groups are singletons: the group key uid '
    >>> text = grouping_warnings(np.array([8, 8, 16]), {"group_cols": ["step", "id"], "batch_col": "step"},
    ...                          key_at=lambda g: (1, str(g)))[0]
    >>> print(text.split("sources)", 1)[1])
    , e.g. key [1, "2"] (16 rows); where the trainer keeps a prompt's rollouts in consecutive rows, \
--group-size 8 splits them
    """
    out: list[str] = []
    groups = int(sizes.size)
    if groups < 2:
        return out
    keys = ", ".join(options.get("group_cols") or []) or f"--group-size {options.get('group_size')}"
    singletons = int((sizes == 1).sum())
    if singletons * 2 > groups:
        out.append(
            f"{singletons:,} of {groups:,} groups are singletons: the group key {keys} seems to name "
            "rollouts, not prompts (a uid per rollout, a path or a timestamp in the prompt?)"
        )
        return out
    common, groups_of_common = common_size(sizes)
    multiples = int(((sizes > common) & (sizes % common == 0)).sum()) if common > 1 else 0
    if multiples and groups_of_common * 2 > groups:
        stepped = (
            len(options.get("group_cols") or []) > 1 and options.get("batch_col") in options["group_cols"]
        )
        merged = np.flatnonzero((sizes > common) & (sizes % common == 0))[:MERGED_EXAMPLES]
        named = ""
        if key_at is not None:
            shown = ", ".join(
                f"{json.dumps(plain_key(key_at(int(g))), ensure_ascii=False)[:80]} ({int(sizes[g])} rows)"
                for g in merged
            )
            named = f", e.g. key {shown}"
        out.append(
            f"{multiples:,} of {groups:,} groups have 2 or more times the {common} rows most groups have: "
            "groups sharing a key were merged (a prompt drawn twice in a step, or one ID in two data sources"
            + (")" if stepped else f", or a prompt key {keys} without the step: add the step column with -g)")
            + f"{named}; where the trainer keeps a prompt's rollouts in consecutive rows, "
            f"--group-size {common} splits them"
        )
    return out


def group_mean_histogram(
    mean: np.ndarray,
    count: np.ndarray,
    minimum: np.ndarray,
    maximum: np.ndarray,
    m2: np.ndarray,
    sizes: np.ndarray,
) -> dict[str, Any]:
    """The distribution of the groups' mean rewards, binned to be read at a glance.

    ``kind`` says how: ``solve_rate`` for binary rewards in groups of one size G (one bar
    per attainable rate k/G, ``labels`` "k/G"); ``unit`` for means in [0, 1] (ten bins over
    [0, 1]); ``range`` otherwise (ten bins from the lowest to the highest mean); ``single``
    when every group has the same mean (one bar). ``edges`` has one more entry than
    ``counts``.

    >>> h = group_mean_histogram(np.array([0.0, 0.5, 0.5, 1.0]), np.array([2, 2, 2, 2]),
    ...     np.array([0.0, 0.0, 0.0, 1.0]), np.array([0.0, 1.0, 1.0, 1.0]),
    ...     np.array([0.0, 0.5, 0.5, 0.0]), np.array([2, 2, 2, 2]))
    >>> h["kind"], h["labels"], h["counts"]
    ('solve_rate', ['0/2', '1/2', '2/2'], [1, 2, 1])
    """
    seen = count > 0
    means = mean[seen]
    if not means.size:
        return {"kind": "range", "edges": [], "counts": []}
    low, high = float(means.min()), float(means.max())
    group_size = int(sizes[0]) if sizes.size and np.all(sizes == sizes[0]) else 0
    # a chunk of groups at a time: the checks' temporaries are a chunk's, not the run's
    chunks = [
        slice(start, start + HISTOGRAM_CHUNK_GROUPS) for start in range(0, mean.size, HISTOGRAM_CHUNK_GROUPS)
    ]
    every_group_seen = means.size == mean.size

    def of_seen(figure: np.ndarray, part: slice) -> np.ndarray:
        return figure[part] if every_group_seen else figure[part][seen[part]]

    binary = all(
        _binary(*(of_seen(figure, part) for figure in (mean, count, minimum, maximum, m2))) for part in chunks
    )
    if binary and 1 <= group_size <= 64:
        per_rate = sum(
            (
                np.bincount(
                    np.rint(of_seen(mean, part) * group_size).astype(np.int64), minlength=group_size + 1
                )
                for part in chunks
            ),
            start=np.zeros(group_size + 1, dtype=np.int64),
        )
        return {
            "kind": "solve_rate",
            "edges": [max(0.0, (k - 0.5) / group_size) for k in range(group_size + 1)] + [1.0],
            "counts": [int(c) for c in per_rate],
            "labels": [f"{k}/{group_size}" for k in range(group_size + 1)],
        }
    if low == high:
        return {"kind": "single", "edges": [low, high], "counts": [int(means.size)]}
    kind, bounds = ("unit", (0.0, 1.0)) if low >= 0.0 and high <= 1.0 else ("range", (low, high))
    binned, bin_edges = np.histogram(means, bins=HISTOGRAM_BINS, range=bounds)
    return {"kind": kind, "edges": [float(e) for e in bin_edges], "counts": [int(c) for c in binned]}


HISTOGRAM_CHUNK_GROUPS = 1 << 20
"""Groups :func:`group_mean_histogram` checks at a time."""


def _binary(
    p: np.ndarray, count: np.ndarray, minimum: np.ndarray, maximum: np.ndarray, m2: np.ndarray
) -> bool:
    """Whether groups of rewards in {0, 1} (``p``: their means) are binary: their spread is the
    largest that [0, 1] values allow."""
    in_unit = bool(
        np.all((minimum == 0.0) | (minimum == 1.0)) and np.all((maximum == 0.0) | (maximum == 1.0))
    )
    if not in_unit:
        return False
    # np.allclose's test, written out: every figure here is finite, which its extra passes handle
    largest = count * p * (1 - p)
    return bool((np.abs(m2 - largest) <= 1e-12 + 1e-9 * np.abs(largest)).all())


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
