"""The summary's figures of the groups as partial findings that merge exactly, in any order.

A run's groups may be held in parts: chunks of groups on one machine (the local engine), or,
for a Ray run, its reducers' buckets (each the groups whose key hashes to it; the Ray engine
still gathers the groups on its driver first). Each part reports what it
sees in two rounds, and the parts' reports merge by rules that give the same result whichever
way the groups were cut and in whatever order the parts arrive:

- round 1 (:class:`FirstRound`): counts, the sizes' counts, extremes, the constant groups' values
  and the exact sum of the rewards;
- the run's figures that round 2 needs (:class:`RunFigures`): the reward mean, the common group
  size, the histogram's kind and bounds;
- round 2 (:class:`SecondRound`): the exact sum of squared deviations from the run's mean, the
  histogram's counts, and the first groups (in the run's order) off the common size.

Sums are exact (:class:`~grpo_cli.kernel.ExactSum`: every term's bits kept in one integer,
rounded once at the end), so the reward mean and standard deviation (the kernel's batch
moments, :class:`~grpo_cli.kernel.RewardTotals`) are the same bits for any cut and any order:
a float sum folded left to right would depend on the order of the groups, which only a
machine holding all of them knows.

>>> import numpy as np
>>> part = GroupPart(count=np.array([2, 2]), mean=np.array([0.5, 1.0]), m2=np.array([0.5, 0.0]),
...     m2_scale=np.ones(2), minimum=np.array([0.0, 1.0]), maximum=np.array([1.0, 1.0]),
...     active=np.array([True, False]), rows=np.array([2, 2]), order=np.array([0, 1]))
>>> findings = findings_of([part], options={})
>>> findings.reward, findings.groups, findings.active_groups
({'mean': 0.75, 'std': 0.4330127018922193, 'min': 0.0, 'max': 1.0}, 2, 1)
"""

from __future__ import annotations

import heapq
import json
import math
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from grpo_cli.arrow.plain import plain_key

if TYPE_CHECKING:
    import torch

    from grpo_cli.kernel import ExactSum, RewardTotals

HISTOGRAM_BINS = 10
TOP_INACTIVE_VALUES = 10
OFF_SIZE_EXAMPLES = 5
MERGED_EXAMPLES = 3
"""How many keys of merged groups a warning names."""
SINGLETON_KEYS = 256
"""How many singletons' keys a run looks at for a part that varies in each (a time, a path)."""
SIZE_COUNTS_SHOWN = 64


@dataclass(frozen=True)
class GroupPart:
    """Some of a run's groups, each array of shape ``(k,)``: the valid rewards' ``count``
    (int64), ``mean``, ``m2`` in units of ``m2_scale**2`` (powers of two, see
    :func:`grpo_cli.kernel.group_scale`; ``None``: every scale is 1), ``minimum`` and
    ``maximum`` (float64; an empty group holds +inf and -inf), whether each is ``active``
    (bool), its ``rows`` (a null or NaN reward's included) and its place in the run's order
    of groups (``order``, int64: the group ID, or any key that sorts as the IDs do).
    ``label_at(i)`` names group ``i`` of the part: its key where ``named``, else its ID."""

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    m2_scale: np.ndarray | None
    minimum: np.ndarray
    maximum: np.ndarray
    active: np.ndarray
    rows: np.ndarray
    order: np.ndarray
    label_at: Callable[[int], Any] | None = None
    named: bool = False
    spans: np.ndarray | None = None  # bool: the group's rows hold several values of the watched step

    def label(self, i: int) -> Any:
        return self.label_at(i) if self.label_at is not None else int(self.order[i])

    def slice(self, start: int, stop: int, *, label_at: Callable[[int], Any] | None = None) -> GroupPart:
        """Groups ``start`` to ``stop - 1`` (views), named by ``label_at`` of the run's group."""
        pieces = {
            name: getattr(self, name)[start:stop]
            for name in ("count", "mean", "m2", "minimum", "maximum", "active", "rows", "order")
        }
        pieces["m2_scale"] = None if self.m2_scale is None else self.m2_scale[start:stop]
        pieces["spans"] = None if self.spans is None else self.spans[start:stop]
        return replace(self, **pieces, label_at=label_at)


def _kernel() -> Any:
    """:mod:`grpo_cli.kernel`, imported when a run needs it: the summary's JSON form and the
    jobs that name it load before torch (copying a spliced shard's bytes while it loads)."""
    from grpo_cli import kernel

    return kernel


def _tensor(values: np.ndarray) -> torch.Tensor:
    """A NumPy array as a tensor over its memory (read only here, though Arrow's may be)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
        return torch.from_numpy(values)


def reward_totals(
    count: np.ndarray, mean: np.ndarray, minimum: np.ndarray, maximum: np.ndarray
) -> RewardTotals:
    """:class:`~grpo_cli.kernel.RewardTotals` of groups given as NumPy arrays, shape ``(k,)``:
    the exact reward mean of any set of groups (the run's, a ``--by`` value's)."""
    totals: RewardTotals = _kernel().RewardTotals.of(*(_tensor(a) for a in (count, mean, minimum, maximum)))
    return totals


def _min(values: np.ndarray, identity: float) -> float:
    return float(values.min()) if values.size else identity


def _max(values: np.ndarray, identity: float) -> float:
    return float(values.max()) if values.size else identity


def _holding_rewards(part: GroupPart) -> GroupPart:
    """The part's groups that hold a valid reward: the part itself where every group does."""
    seen = part.count > 0
    if seen.all():
        return part
    pieces = {
        name: getattr(part, name)[seen]
        for name in ("count", "mean", "m2", "minimum", "maximum", "active", "rows", "order")
    }
    pieces["m2_scale"] = None if part.m2_scale is None else part.m2_scale[seen]
    pieces["spans"] = None if part.spans is None else part.spans[seen]
    return replace(part, **pieces)


def _binary(seen: GroupPart, low: float, high: float) -> bool:
    """Whether the groups' rewards (every group holding one, all within [``low``, ``high``])
    are all in {0, 1} with the largest spread [0, 1] allows (``m2 = count * p * (1 - p)``):
    binary rewards."""
    if low < 0.0 or high > 1.0:
        return False
    # within [0, 1], a group's extreme is 0 or 1 where each non-zero one is 1
    for extreme in (seen.minimum, seen.maximum):
        if np.count_nonzero(extreme) != np.count_nonzero(extreme == 1.0):
            return False
    largest = seen.count * seen.mean
    largest *= 1.0 - seen.mean
    # np.allclose's test, written out (every figure here is finite and largest >= 0)
    tolerance = largest * 1e-9
    tolerance += 1e-12
    difference = seen.m2 - largest
    np.abs(difference, out=difference)
    return bool((difference <= tolerance).all())


@dataclass(frozen=True)
class FirstRound:
    """What a part of the groups shows on its own; ``+`` merges two parts' (any order)."""

    groups: int = 0
    active_groups: int = 0
    singleton_groups: int = 0
    size_counts: Counter[int] = field(default_factory=Counter)
    scored_sizes: frozenset[int] = frozenset()  # the distinct counts of valid rewards of a group
    # the valid rewards' count, extremes and exact sum
    reward: RewardTotals = field(default_factory=lambda: _kernel().RewardTotals())
    seen_groups: int = 0  # groups holding a valid reward
    mean_low: float = math.inf
    mean_high: float = -math.inf
    binary: bool = True
    constant_values: Counter[float] = field(default_factory=Counter)
    tolerated_groups: int = 0  # inactive within --inactive-tolerance, not exactly constant
    spanning_groups: int = 0  # groups whose rows hold several values of the watched step

    @classmethod
    def of(cls, part: GroupPart) -> FirstRound:
        seen = _holding_rewards(part)
        inactive = ~part.active
        constant = inactive & (part.count >= 2) & (part.minimum == part.maximum)
        # + 0.0: a constant group of -0.0 and one of 0.0 share a value, whichever part comes first
        values, counts = np.unique(part.minimum[constant] + 0.0, return_counts=True)
        sizes, size_counts = _value_counts(part.rows)
        reward = reward_totals(seen.count, seen.mean, seen.minimum, seen.maximum)
        return cls(
            groups=int(part.count.size),
            active_groups=int(np.count_nonzero(part.active)),
            singleton_groups=int(np.count_nonzero(part.rows == 1)),
            size_counts=Counter(dict(zip(sizes.tolist(), size_counts.tolist(), strict=True))),
            scored_sizes=frozenset(_value_counts(seen.count)[0].tolist()),
            reward=reward,
            seen_groups=int(seen.count.size),
            mean_low=_min(seen.mean, math.inf),
            mean_high=_max(seen.mean, -math.inf),
            binary=_binary(seen, reward.low, reward.high),
            constant_values=Counter(dict(zip(values.tolist(), counts.tolist(), strict=True))),
            tolerated_groups=int(np.count_nonzero(inactive & (part.maximum > part.minimum))),
            spanning_groups=0 if part.spans is None else int(np.count_nonzero(part.spans)),
        )

    def __add__(self, other: FirstRound) -> FirstRound:
        return FirstRound(
            groups=self.groups + other.groups,
            active_groups=self.active_groups + other.active_groups,
            singleton_groups=self.singleton_groups + other.singleton_groups,
            size_counts=self.size_counts + other.size_counts,
            scored_sizes=self.scored_sizes | other.scored_sizes,
            reward=self.reward + other.reward,
            seen_groups=self.seen_groups + other.seen_groups,
            mean_low=min(self.mean_low, other.mean_low),
            mean_high=max(self.mean_high, other.mean_high),
            binary=self.binary and other.binary,
            constant_values=self.constant_values + other.constant_values,
            tolerated_groups=self.tolerated_groups + other.tolerated_groups,
            spanning_groups=self.spanning_groups + other.spanning_groups,
        )


def _value_counts(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct sizes and how many groups have each: counted, not sorted, where the sizes
    are small next to the groups (as group sizes are).

    >>> [a.tolist() for a in _value_counts(np.array([8, 8, 3]))]
    [[3, 8], [1, 2]]
    """
    if rows.size and int(rows.min()) >= 0 and int(rows.max()) <= 4 * rows.size:
        counts = np.bincount(rows)
        sizes = np.flatnonzero(counts)
        return sizes, counts[sizes]
    return np.unique(rows, return_counts=True)


def common_size(size_counts: Counter[int]) -> tuple[int, int]:
    """The most common group size (the smallest of them on a tie) and how many groups have it.

    >>> common_size(Counter({8: 2, 16: 1, 3: 2}))
    (3, 2)
    """
    size, count = min(size_counts.items(), key=lambda item: (-item[1], item[0]))
    return size, count


@dataclass(frozen=True)
class RunFigures:
    """What round 2 needs from the whole run's round 1."""

    reward: RewardTotals  # the run's: its mean is what round 2's squared deviations are from
    common_size: int
    histogram: tuple[str, float, float, int]  # kind, low and high bound, the group size of solve_rate

    @classmethod
    def of(cls, first: FirstRound) -> RunFigures:
        common = common_size(first.size_counts)[0] if first.groups else 0
        # binary rewards whose every group's scored count divides the common size (a singleton
        # beside groups of 8, or groups of 4): each group's solve rate is a whole number of
        # 1/common, so each value the data holds is a bin of its own
        whole = 1 <= common <= 64 and all(common % scored == 0 for scored in first.scored_sizes)
        if not first.seen_groups:
            histogram = ("none", 0.0, 0.0, 0)
        elif first.binary and whole:
            histogram = ("solve_rate", 0.0, 1.0, common)
        elif first.mean_low == first.mean_high:
            histogram = ("single", first.mean_low, first.mean_high, 0)
        elif first.mean_low >= 0.0 and first.mean_high <= 1.0:
            histogram = ("unit", 0.0, 1.0, 0)
        elif _bins_fit(first.mean_low, first.mean_high):
            histogram = ("range", first.mean_low, first.mean_high, 0)
        else:  # means a few ulps apart, or a span past the largest float: one bar
            histogram = ("single", first.mean_low, first.mean_high, 0)
        return cls(first.reward, common, histogram)


def _bins_fit(low: float, high: float) -> bool:
    """Whether :data:`HISTOGRAM_BINS` bins of positive, finite width fit from ``low`` to ``high``
    (numpy's histogram refuses a range that does not hold them: group means a few ulps apart,
    as ``-1/3`` summed two ways, or a span past the largest float).

    >>> _bins_fit(0.0, 1.0), _bins_fit(-1 / 3, -1 / 3 + 2**-54), _bins_fit(-1e308, 1e308)
    (True, False, False)
    """
    with np.errstate(over="ignore", invalid="ignore"):
        edges = np.linspace(low, high, HISTOGRAM_BINS + 1)
    return bool(np.all(np.isfinite(edges)) and np.all(edges[:-1] < edges[1:]))


@dataclass(frozen=True)
class Example:
    """A group a warning or the off-size figures name: its place in the run's order, its
    label (key or ID) and rows."""

    order: int
    label: Any
    rows: int


@dataclass(frozen=True)
class SecondRound:
    """What a part shows once the run's figures are known; ``+`` merges (any order)."""

    # the sum over the rewards of (reward - run mean)**2
    squares: ExactSum = field(default_factory=lambda: _kernel().ExactSum())
    histogram: tuple[int, ...] = ()
    off_size: tuple[Example, ...] = ()  # the part's first OFF_SIZE_EXAMPLES, in the run's order
    merged: tuple[Example, ...] = ()  # its first MERGED_EXAMPLES of 2 or more times the common size
    spanning: tuple[Example, ...] = ()  # its first MERGED_EXAMPLES across steps
    singletons: tuple[Example, ...] = ()  # its first SINGLETON_KEYS singletons (their keys: a pattern?)

    @classmethod
    def of(cls, part: GroupPart, run: RunFigures) -> SecondRound:
        seen = _holding_rewards(part)
        mean = seen.mean
        squares = _kernel().squared_deviations(
            _tensor(seen.count),
            _tensor(seen.mean),
            _tensor(seen.m2),
            None if seen.m2_scale is None else _tensor(seen.m2_scale),
            totals=run.reward,
        )
        kind, low, high, size = run.histogram
        if kind == "solve_rate":
            solved = mean * seen.count  # the rewards of 1: a whole number, to within rounding
            bins = np.rint(solved, out=solved).astype(np.int64) * (size // seen.count)  # in 1/size
            binned = np.bincount(bins, minlength=size + 1)
        elif kind == "single":
            binned = np.array([mean.size])
        elif kind in ("unit", "range"):
            binned, _ = np.histogram(mean, bins=HISTOGRAM_BINS, range=(low, high))
        else:
            binned = np.zeros(0, np.int64)
        common = run.common_size
        off = np.flatnonzero(part.rows != common)
        off_rows = part.rows[off]  # few: the modulo runs on these alone
        merged = off[(off_rows > common) & (off_rows % common == 0)] if common > 1 else off[:0]
        spanning = np.flatnonzero(part.spans) if part.spans is not None else off[:0]
        singletons = np.flatnonzero(part.rows == 1) if part.named else off[:0]
        return cls(
            squares=squares,
            histogram=tuple(int(c) for c in binned),
            off_size=_first(part, off, OFF_SIZE_EXAMPLES),
            merged=_first(part, merged, MERGED_EXAMPLES),
            spanning=_first(part, spanning, MERGED_EXAMPLES),
            singletons=_first(part, singletons, SINGLETON_KEYS),
        )

    def __add__(self, other: SecondRound) -> SecondRound:
        histogram = (
            tuple(a + b for a, b in zip(self.histogram, other.histogram, strict=True))
            if self.histogram and other.histogram
            else self.histogram or other.histogram
        )
        return SecondRound(
            squares=self.squares + other.squares,
            histogram=histogram,
            off_size=tuple(heapq.nsmallest(OFF_SIZE_EXAMPLES, (*self.off_size, *other.off_size), key=_order)),
            merged=tuple(heapq.nsmallest(MERGED_EXAMPLES, (*self.merged, *other.merged), key=_order)),
            spanning=tuple(heapq.nsmallest(MERGED_EXAMPLES, (*self.spanning, *other.spanning), key=_order)),
            singletons=tuple(
                heapq.nsmallest(SINGLETON_KEYS, (*self.singletons, *other.singletons), key=_order)
            ),
        )


def _order(example: Example) -> int:
    return example.order


def _first(part: GroupPart, where: np.ndarray, n: int) -> tuple[Example, ...]:
    """The first ``n`` of the part's groups ``where`` in the run's order."""
    if not where.size:
        return ()
    picked = where[np.argsort(part.order[where], kind="stable")[:n]]
    return tuple(Example(int(part.order[i]), part.label(int(i)), int(part.rows[i])) for i in picked)


@dataclass(frozen=True)
class GroupFindings:
    """What the per-group outcome shows, whatever the run wrote: the summary's figures of the
    groups (:func:`findings_of` makes them from the parts' rounds)."""

    groups: int
    active_groups: int
    singleton_groups: int
    group_size: dict[str, float | None]
    reward: dict[str, float | None]
    inactive_by_value: list[dict[str, Any]]
    inactive_other_values: int
    group_mean_histogram: dict[str, Any]
    off_size_groups: dict[str, Any]
    findings: list[dict[str, Any]]
    warnings: list[str]
    group_size_counts: dict[str, int]
    tolerance: dict[str, Any] | None
    by: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def findings_of(parts: Iterable[GroupPart], *, options: dict[str, Any]) -> GroupFindings:
    """The findings of the groups ``parts`` hold between them (each group in one part), both
    rounds run here; an engine that holds its parts elsewhere runs :meth:`FirstRound.of` and
    :meth:`SecondRound.of` where they are and :func:`merged_findings` on what they send."""
    held = list(parts)
    first = sum((FirstRound.of(part) for part in held), FirstRound())
    run = RunFigures.of(first)
    second = sum((SecondRound.of(part, run) for part in held), SecondRound())
    named = any(part.named for part in held)
    return merged_findings(first, second, options=options, named=named)


def merged_findings(
    first: FirstRound, second: SecondRound, *, options: dict[str, Any], named: bool
) -> GroupFindings:
    """The findings from every part's two rounds, merged (``named``: the examples are keys)."""
    run = RunFigures.of(first)
    groups = first.groups
    reward: dict[str, float | None] = {"mean": None, "std": None, "min": None, "max": None}
    if first.reward.rewards:
        reward = {
            "mean": first.reward.mean,
            "std": first.reward.std(second.squares),
            "min": first.reward.low,
            "max": first.reward.high,
        }
    values = sorted(first.constant_values.items(), key=lambda item: (-item[1], item[0]))
    tolerance = float(options.get("inactive_tolerance") or 0.0)
    found = _grouping_findings(first, second, options, named=named)
    return GroupFindings(
        groups=groups,
        active_groups=first.active_groups,
        singleton_groups=first.singleton_groups,
        group_size=_size_figures(first.size_counts),
        reward=reward,
        inactive_by_value=[{"value": float(v), "groups": int(n)} for v, n in values[:TOP_INACTIVE_VALUES]],
        inactive_other_values=sum(int(n) for _, n in values[TOP_INACTIVE_VALUES:]),
        group_mean_histogram=_histogram(run, second),
        off_size_groups=_off_size(first, second, named=named),
        findings=found,
        warnings=[f["message"] for f in found if f["severity"] == "warning"],
        group_size_counts=_size_counts(first.size_counts),
        tolerance=None
        if tolerance == 0
        else {"tolerance": tolerance, "groups_beyond_exact": first.tolerated_groups},
    )


def _size_figures(size_counts: Counter[int]) -> dict[str, float | None]:
    """The smallest, median and largest group size, from the sizes' counts."""
    if not size_counts:
        return {"min": None, "median": None, "max": None}
    sizes = sorted(size_counts)
    total = sum(size_counts.values())
    ends = np.cumsum([size_counts[s] for s in sizes])

    def at(rank: int) -> int:  # the size of the rank-th smallest group (from 0)
        return sizes[int(np.searchsorted(ends, rank, side="right"))]

    median = (at((total - 1) // 2) + at(total // 2)) / 2
    return {"min": sizes[0], "median": float(median), "max": sizes[-1]}


def _size_counts(size_counts: Counter[int]) -> dict[str, int]:
    """Groups of each size (the most common :data:`SIZE_COUNTS_SHOWN` sizes), by size."""
    top = sorted(size_counts.items(), key=lambda item: (-item[1], item[0]))[:SIZE_COUNTS_SHOWN]
    return {str(size): count for size, count in sorted(top)}


def _histogram(run: RunFigures, second: SecondRound) -> dict[str, Any]:
    """The distribution of the groups' mean rewards (see :func:`grpo_cli.results.summary.group_findings`)."""
    kind, low, high, size = run.histogram
    counts = list(second.histogram)
    if kind == "none":
        return {"kind": "range", "edges": [], "counts": []}
    if kind == "solve_rate":
        return {
            "kind": "solve_rate",
            "edges": [max(0.0, (k - 0.5) / size) for k in range(size + 1)] + [1.0],
            "counts": counts,
            "labels": [f"{k}/{size}" for k in range(size + 1)],
        }
    if kind == "single":
        return {"kind": "single", "edges": [low, high], "counts": counts}
    edges = np.histogram_bin_edges(np.zeros(0), bins=HISTOGRAM_BINS, range=(low, high))
    return {"kind": kind, "edges": [float(e) for e in edges], "counts": counts}


def _off_size(first: FirstRound, second: SecondRound, *, named: bool) -> dict[str, Any]:
    """The groups whose size is not the most common one: how many, and the first few."""
    if not first.groups:
        return {}
    common, of_common = common_size(first.size_counts)
    if of_common == first.groups:
        return {}
    examples = [
        {"group": plain_key(e.label) if named else int(e.label), "rows": e.rows} for e in second.off_size
    ]
    return {"common_size": common, "groups": first.groups - of_common, "examples": examples}


def _examples_text(examples: Sequence[Example]) -> str:
    """``, e.g. key [1, "p"] (8 rows), ...``: the groups a finding names by their keys."""
    return ", e.g. key " + ", ".join(
        f"{json.dumps(plain_key(e.label), ensure_ascii=False)[:80]} ({e.rows} rows)" for e in examples
    )


def _grouping_findings(
    first: FirstRound, second: SecondRound, options: dict[str, Any], *, named: bool
) -> list[dict[str, Any]]:
    """What the groups say about the grouping itself, each a finding: its ``kind``, whether it
    is a ``warning`` (a grouping a user got wrong) or an ``info`` (the trainer's own grouping,
    never advised against: ``options["grouping_of"]``), its one-line ``message``, the ``groups``
    it counts and, where one follows from the data, the ``fix`` (the group key that mends it).

    Trainers sample a fixed number G of rollouts per prompt, within a step: groups whose rows
    hold several values of the step column mean a key without the step (every step's rollouts
    of a prompt in one group); most groups of one size and some of two or more times it mean
    groups were merged (a prompt drawn twice in a step, the same ID in two data sources);
    mostly singletons means the key names rollouts, not prompts (a uid per rollout, a time or a
    path in the prompt).
    """
    groups = first.groups
    columns = list(options.get("group_cols") or [])
    keys = ", ".join(columns) or f"--group-size {options.get('group_size')}"
    trainer = options.get("grouping_of")
    found: list[dict[str, Any]] = []
    step = options.get("step_col")
    if step is not None and first.spanning_groups:
        spanning = first.spanning_groups
        named_text = _examples_text(second.spanning) if named else ""
        if columns:
            fix = [*columns, step]
            found.append(
                _finding(
                    "groups_span_steps",
                    f"{spanning:,} of {groups:,} groups span several values of {step!r}{named_text}: the key "
                    f"{keys} puts rollouts of several steps in one group; -g {' -g '.join(fix)} keys each "
                    "group within its step",
                    spanning,
                    fix={"group_cols": fix},
                )
            )
        else:
            found.append(
                _finding(
                    "groups_span_steps",
                    f"{spanning:,} of {groups:,} --group-size {options.get('group_size')} blocks span "
                    f"several values of {step!r}: a block holds rollouts of two steps (are the rows of each "
                    "step a whole number of blocks, in order?)",
                    spanning,
                )
            )
    if groups < 2:
        return found
    if first.singleton_groups * 2 > groups:
        found.append(
            _finding(
                "singleton_groups",
                f"{first.singleton_groups:,} of {groups:,} groups "
                f"({100 * first.singleton_groups / groups:.1f}%) are singletons: the group key {keys} seems "
                "to name rollouts, not prompts (a uid per rollout, a path or a time in the prompt?)"
                + _varying_part(second.singletons),
                first.singleton_groups,
            )
        )
        return found
    common, groups_of_common = common_size(first.size_counts)
    multiples = (
        sum(n for size, n in first.size_counts.items() if size > common and size % common == 0)
        if common > 1
        else 0
    )
    if not (multiples and groups_of_common * 2 > groups) or found:
        return found  # groups across steps are the merge to mend first
    named_text = _examples_text(second.merged) if named else ""
    head = f"{multiples:,} of {groups:,} groups have 2 or more times the {common} rows most groups have"
    if trainer is not None and not options.get("own_grouping"):
        found.append(
            _finding(
                "merged_groups",
                f"{head}{named_text}: groups sharing a key were merged (a prompt drawn twice in a step); "
                f"{trainer} kept the draws apart by an ID its dump does not hold: they cannot be split here",
                multiples,
            )
        )
        return found
    if trainer is not None:
        found.append(
            _finding(
                "merged_groups",
                f"{head}{named_text}: the key is {trainer}'s own grouping, which puts a prompt drawn twice "
                f"in a step in one group: {trainer} trained on them so",
                multiples,
                severity="info",
            )
        )
        return found
    stepped = len(columns) > 1 and options.get("batch_col") in columns
    found.append(
        _finding(
            "merged_groups",
            f"{head}: groups sharing a key were merged (a prompt drawn twice in a step, or one ID in two "
            "data sources"
            + (")" if stepped else f", or a prompt key {keys} without the step: add the step column with -g)")
            + f"{named_text}; where the trainer keeps a prompt's rollouts in consecutive rows, "
            f"--group-size {common} splits them",
            multiples,
            fix={"group_size": common},
        )
    )
    return found


def _finding(
    kind: str, message: str, groups: int, *, severity: str = "warning", fix: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"kind": kind, "severity": severity, "message": message, "groups": groups, "fix": fix}


_VARYING = re.compile(r"[0-9a-fA-F]{8,}|\d+")
"""What varies between keys that should be one: digits (a time, a counter, a path with a
number) and long hexadecimal runs (a uid, a hash)."""


def _varying_part(singletons: Sequence[Example]) -> str:
    """Where the singletons' keys (text) are alike but for their digits or a long hexadecimal run
    (a time, a counter, a uid, a path with either): keys that differ in a varying part each make
    a group of one where the prompt's rollouts should share one.

    >>> keys = [Example(i, f"Solve 2+2 [{t}]", 1) for i, t in enumerate(["12:00:01", "12:00:07", "12:01:13"])]
    >>> _varying_part(keys).split(": ")[1]
    "'Solve 2+2 [12:00:01]' and 'Solve 2+2 [12:00:07]' are one text"
    """
    texts = [e.label for e in singletons if isinstance(e.label, str)]
    if len(texts) < 2:
        return ""
    by_template: dict[str, list[str]] = {}
    for text in texts:
        template = _VARYING.sub("#", text)
        if len(template.replace("#", "").strip()) >= 4:  # text besides what varies: not a bare uid
            by_template.setdefault(template, []).append(text)
    shared = [alike for alike in by_template.values() if len(alike) > 1]
    if not shared or len(by_template) * 2 > len(texts):
        return ""
    first, second = shared[0][:2]
    return (
        f"; the keys differ only in their digits or hexadecimal runs: {first[:60]!r} and {second[:60]!r} "
        "are one text"
    )


def parts_of(
    *,
    count: np.ndarray,
    mean: np.ndarray,
    m2: np.ndarray,
    m2_scale: np.ndarray | None,
    minimum: np.ndarray,
    maximum: np.ndarray,
    active: np.ndarray,
    rows: np.ndarray,
    key_at: Callable[[int], Any] | None,
    chunk: int,
) -> list[GroupPart]:
    """A run's groups in ID order as parts of ``chunk`` groups (their temporaries a chunk's),
    each named by ``key_at`` of the run's group ID where there are keys."""
    order = np.arange(count.size, dtype=np.int64)
    whole = GroupPart(
        count, mean, m2, m2_scale, minimum, maximum, active, rows, order, None, key_at is not None
    )
    return in_chunks(whole, chunk, key_at=key_at)


def in_chunks(whole: GroupPart, chunk: int, *, key_at: Callable[[int], Any] | None) -> list[GroupPart]:
    """``whole`` as parts of ``chunk`` groups (at least one part), each naming group ``i`` of
    its own by ``key_at`` of the group's place in ``whole``."""
    parts = []
    for start in range(0, max(whole.count.size, 1), chunk):
        label_at = None if key_at is None else _shifted(key_at, start)
        parts.append(whole.slice(start, start + chunk, label_at=label_at))
    return parts


def _shifted(key_at: Callable[[int], Any], start: int) -> Callable[[int], Any]:
    return lambda i: key_at(start + i)
