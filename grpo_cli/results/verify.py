"""``check --verify-advantage-col``: compare an existing advantage column with recomputed values.

A row *differs* when ``|given - expected| > atol + rtol * |expected|`` (NaN always
differs). When the column was computed in float32 (a ``--preset`` names a trainer, or the
column itself is float32 or float16), the bound also holds the rounding that the
trainer's arithmetic can leave in that dtype: its mean, its std (NeMo-RL's
``E[x^2] - E[x]^2`` loses more than a two-pass std) and its division, from the forward error
bounds of each step (``(n + 2) u`` for a sum of ``n`` terms, ``u`` the unit roundoff).

A differing row is a trainer's rounding *residue*, not a mismatch, only when it has the
shape that arithmetic gives; everything else is a mismatch:

* its group is exactly constant (two or more identical rewards, exact advantage 0), the
  float32 mean of those values can round (their significand and the group size need more
  than float32's 24 bits: a group of 0s, 1s or halves has an exact mean and so exactly 0
  advantages), *every* row of the group carries the same value (identical inputs go through
  the same arithmetic), and that value is within what the mean's rounding divided by the
  smallest divisor can give, ``8 (n + 2) ulp32(max |r|) / eps`` (OpenRLHF: -119.2 for 13
  rewards of 0.7804687 at eps 1e-9);
* with the leave-one-out baseline, the row's *other* rollouts are exactly identical, their
  squares can round in float32 (NeMo-RL's std of the others is then a rounding residue:
  235.9 for ``[0.9, 0.9, 0.9, 1.0]``, where the exact value is 0.1), and the row has the
  exact value's sign and at most its size over eps (the residue std is >= 0);
* its group's offset swallows its spread in float32 (``(n + 2) ulp32(max |r|)`` is more
  than ``2**-10`` of ``max - min``: float32 resolves the spread to fewer than ten bits)
  and the difference is within what that rounding can move an advantage,
  ``8 (n + 2) ulp32(max |r|) / d`` with ``d`` the group's divisor (std + eps, or 1):
  ``[1e6, 1e6 + 0.0625]`` gives ``[0, 1]`` in verl and OpenRLHF, where the exact value
  is ``[-0.707, 0.707]``.

Residue rows are reported but do not fail the check unless ``strict``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import torch

from grpo_cli.arrow.keys import as_tensor
from grpo_cli.errors import GrpoError
from grpo_cli.inputs.sources import Shard
from grpo_cli.kernel import GroupStats, group_std
from grpo_cli.options.advantage import AdvantageOptions
from grpo_cli.options.config import VerifySpec
from grpo_cli.run.reward_columns import numbers_from_text

if TYPE_CHECKING:
    from collections.abc import Sequence

FLOAT32_BITS = 24
"""Significand bits of float32, the dtype the trainers compute advantages in."""


class KeyNames(Protocol):
    """What names a group by its ID (:class:`~grpo_cli.arrow.keys.GroupKeyIndex`, or the Ray
    engine's keys)."""

    def key_at(self, group_id: int) -> Any: ...


class Verifier:
    """Compares batches of an existing column with recomputed advantages; counts and examples.

    Rows of constant groups that differ are settled once every row has been seen: they are
    residue only when the whole group carries one value, which a later batch can break.
    """

    def __init__(
        self,
        spec: VerifySpec,
        stats: GroupStats,
        options: AdvantageOptions,
        keys: KeyNames | None,
        *,
        batch_transform: bool = False,
        first_row: int = 0,
    ) -> None:
        self.spec = spec
        self.keys = keys
        self.options = options
        self.batch_transform = batch_transform  # whitening or a re-normalisation follows the groups
        cpu = stats.to("cpu")
        self._stats = cpu
        self._constant = (cpu.count >= 2) & (cpu.minimum == cpu.maximum)
        magnitude = _finite_or_zero(torch.maximum(cpu.minimum.abs(), cpu.maximum.abs()))
        self._magnitude = magnitude
        self._ulp32 = _ulp32(magnitude)
        self._rounding = (cpu.count.to(torch.float64) + 2) * self._ulp32
        bits = _significand_bits(cpu.minimum)
        self._mean_can_round = self._constant & (bits + _bit_length(cpu.count) > FLOAT32_BITS)
        floor = 1.0 if options.scale == "none" else min(options.epsilon, 1.0)
        self._constant_bound = 8 * self._rounding / floor
        self._divisor = _group_divisor(cpu, options)
        # an offset that swallows the spread: a group with no spread (one rollout) has none to swallow
        spread = cpu.maximum - cpu.minimum
        self._lost_offset = (cpu.count >= 2) & (spread > 0) & (self._rounding > spread * 2.0**-10)
        self._residue_bound = 8 * self._rounding / self._divisor
        self._float32: bool | None = None
        self._unit_roundoff = 2.0**-FLOAT32_BITS
        # constant groups: the smallest and largest value given, the differing rows still
        # unsettled and the first of them
        num_groups = cpu.num_groups
        self._given_low = torch.full((num_groups,), float("inf"), dtype=torch.float64)
        self._given_high = torch.full((num_groups,), float("-inf"), dtype=torch.float64)
        self._pending = torch.zeros(num_groups, dtype=torch.int64)
        self._pending_row = torch.full((num_groups,), -1, dtype=torch.int64)
        self._pending_given = torch.zeros(num_groups, dtype=torch.float64)
        self._pending_expected = torch.zeros(num_groups, dtype=torch.float64)
        self._shards: list[tuple[int, str]] = []  # (first global row, display) in row order
        self._settled = False
        self._next_row = first_row  # the next batch's first row in the whole input
        self.compared = 0
        self.mismatched = 0
        self.residue = 0
        self.max_abs_diff = 0.0
        self.examples: list[dict[str, Any]] = []
        self.residue_examples: list[dict[str, Any]] = []

    def compare(
        self,
        column: pa.Array,
        expected_advantages: torch.Tensor,
        rewards: torch.Tensor,
        ids: torch.Tensor,
        shard: Shard,
        shard_row: int,
    ) -> None:
        """One batch: ``column`` as given, the recomputed advantages, the combined rewards, group IDs."""
        spec = self.spec
        if shard.format == "csv" and pa.types.is_string(column.type):
            column = numbers_from_text(column, spec.column, shard, shard_row)
        if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
            raise GrpoError(
                f"{shard.display}: column {spec.column!r} has type {column.type}; "
                "it must be numeric to verify"
            )
        if self._float32 is None:
            self._float32 = self.options.preset is not None or (
                pa.types.is_floating(column.type) and column.type.bit_width <= 32
            )
            if pa.types.is_float16(column.type):
                self._unit_roundoff = 2.0**-11
        if not self._shards or self._shards[-1][1] != shard.display:
            self._shards.append((self._next_row - shard_row, shard.display))
        first_global = self._next_row
        given = as_tensor(
            pc.cast(column, pa.float64()).fill_null(float("nan")).to_numpy(zero_copy_only=False)
        )
        expected = expected_advantages.to(torch.float64)
        rewards = rewards.to(torch.float64)
        diff = (given - expected).abs()
        constant = self._constant[ids]
        bound = spec.atol + spec.rtol * expected.abs()
        if self._float32:
            # constant and offset-swallowed groups have rules of their own, below
            own_rule = constant | self._lost_offset[ids]
            bound = bound + torch.where(own_rule, 0.0, self._trainer_rounding(rewards, ids, expected))
        differs = ~(diff <= bound)  # NaN differs
        self.compared += given.numel()
        self._next_row += given.numel()
        if diff.numel():
            finite = diff[torch.isfinite(diff)]
            if finite.numel():
                self.max_abs_diff = max(self.max_abs_diff, float(finite.max()))
            if not bool(torch.isfinite(diff).all()):
                self.max_abs_diff = float("inf")
        if bool(constant.any()):
            self._track_constant_groups(given, expected, ids, constant, differs, first_global)
        differs &= ~constant
        if not bool(differs.any()):
            return
        residue = differs & self._is_residue(given, expected, rewards, ids, diff)
        mismatch = differs & ~residue
        self.residue += int(residue.sum())
        self.mismatched += int(mismatch.sum())
        for rows, examples in ((mismatch, self.examples), (residue, self.residue_examples)):
            room = max(0, spec.max_examples - len(examples))
            for index in rows.nonzero().flatten()[:room].tolist():
                examples.append(
                    self._example(
                        first_global + index, int(ids[index]), float(expected[index]), float(given[index])
                    )
                )

    def _track_constant_groups(
        self,
        given: torch.Tensor,
        expected: torch.Tensor,
        ids: torch.Tensor,
        constant: torch.Tensor,
        differs: torch.Tensor,
        first_global: int,
    ) -> None:
        rows = constant.nonzero().flatten()
        groups, values = ids[rows], given[rows]
        self._given_low.scatter_reduce_(0, groups, values, "amin")
        self._given_high.scatter_reduce_(0, groups, values, "amax")
        late = rows[differs[rows]]
        if not late.numel():
            return
        late_groups = ids[late]
        self._pending.index_add_(0, late_groups, torch.ones_like(late_groups))
        # the first differing row of each group that has none yet (rows are in order:
        # the first occurrence of each group in ``late`` is its first row)
        unique, inverse = torch.unique(late_groups, return_inverse=True)
        first = torch.full((unique.numel(),), late.numel(), dtype=torch.int64)
        first.scatter_reduce_(0, inverse, torch.arange(late.numel()), "amin")
        first_rows = late[first]
        fresh = self._pending_row[unique] < 0
        targets, chosen = unique[fresh], first_rows[fresh]
        self._pending_row[targets] = chosen + first_global
        self._pending_given[targets] = given[chosen]
        self._pending_expected[targets] = expected[chosen]

    def _settle(self) -> None:
        """Decide the differing rows of constant groups, now that every row has been seen."""
        if self._settled:
            return
        self._settled = True
        pending = self._pending > 0
        if not bool(pending.any()):
            return
        # NaN given values leave low or high NaN: never one value
        uniform = self._given_low == self._given_high
        within = (self._given_high - self._pending_expected).abs() <= self._constant_bound
        within &= (self._given_low - self._pending_expected).abs() <= self._constant_bound
        residue_groups = pending & uniform & within & self._mean_can_round
        mismatch_groups = pending & ~residue_groups
        self.residue += int(self._pending[residue_groups].sum())
        self.mismatched += int(self._pending[mismatch_groups].sum())
        for groups, examples in ((mismatch_groups, self.examples), (residue_groups, self.residue_examples)):
            chosen = groups.nonzero().flatten()
            rows = self._pending_row[chosen]
            order = torch.argsort(rows)[: self.spec.max_examples]
            for gid, row in zip(chosen[order].tolist(), rows[order].tolist(), strict=True):
                examples.append(
                    self._example(
                        row, gid, float(self._pending_expected[gid]), float(self._pending_given[gid])
                    )
                )
            examples.sort(key=lambda e: e["_row"])
            del examples[self.spec.max_examples :]

    def _example(self, global_row: int, gid: int, expected: float, actual: float) -> dict[str, Any]:
        first_row, display = next((s for s in reversed(self._shards) if s[0] <= global_row), self._shards[0])
        key = self.keys.key_at(gid) if self.keys is not None else gid
        return {
            "file": display,
            "row": global_row - first_row,
            "group": _jsonable(key),
            "expected": expected,
            "actual": actual,
            "_row": global_row,
            "_group": gid,
        }

    def _trainer_rounding(
        self, rewards: torch.Tensor, ids: torch.Tensor, expected: torch.Tensor
    ) -> torch.Tensor:
        """Per row: how far float arithmetic of the trainer can move a non-constant group's advantage."""
        stats, options = self._stats, self.options
        u = self._unit_roundoff
        count = stats.count[ids].to(torch.float64)
        magnitude = self._magnitude[ids]
        leave_one_out = options.baseline == "leave-one-out"
        terms = count - 1 if leave_one_out else count
        centred = rewards - stats.mean[ids]
        if leave_one_out:
            centred = centred * count / (count - 1).clamp_min(1)
        size = expected.abs()
        divisor = self._divisor[ids]
        if not self.batch_transform and options.scale != "none":
            derived = centred.abs() / size
            divisor = torch.where((size > 0) & torch.isfinite(derived) & (derived > 0), derived, divisor)
        deviation = (divisor - options.epsilon).clamp_min(0) if options.scale != "none" else divisor
        if options.epsilon_mode == "add-if-nonzero" or leave_one_out:
            # the std from E[x^2] - E[x]^2: its error is relative to max |r|, not to the spread
            relative = 3 * (terms + 3) * u * magnitude.square() / (2 * deviation.square())
        else:
            relative = (terms + 3) * u * torch.ones_like(size)
        if options.scale == "none":
            relative = torch.zeros_like(size)
        bound = 8 * ((terms + 2) * u * magnitude / divisor + size * (relative + 2 * u))
        bound = torch.where(stats.count[ids] <= 1, 8 * u * size, bound)
        return torch.nan_to_num(bound, nan=0.0, posinf=0.0)

    def _is_residue(
        self,
        given: torch.Tensor,
        expected: torch.Tensor,
        rewards: torch.Tensor,
        ids: torch.Tensor,
        diff: torch.Tensor,
    ) -> torch.Tensor:
        stats = self._stats
        residue = self._lost_offset[ids] & (diff <= self._residue_bound[ids])
        if stats.at_minimum is not None and stats.at_maximum is not None:
            others = stats.count[ids] - 1
            lone_max = (rewards == stats.maximum[ids]) & (stats.at_maximum[ids] == 1)
            lone_min = (rewards == stats.minimum[ids]) & (stats.at_minimum[ids] == 1)
            other_value = torch.where(lone_max, stats.minimum[ids], stats.maximum[ids])
            others_identical = (lone_max & (stats.at_minimum[ids] == others)) | (
                lone_min & (stats.at_maximum[ids] == others)
            )
            squares_can_round = 2 * _significand_bits(other_value) + _bit_length(others) > FLOAT32_BITS
            same_sign = torch.sign(given) == torch.sign(expected)
            bounded = given.abs() <= expected.abs() / self.options.epsilon * (1 + 2.0**-10)
            residue |= others_identical & (others >= 2) & squares_can_round & same_sign & bounded
        return residue

    def partial(self) -> VerifyPartial:
        """What this verifier saw of its rows, for :meth:`merge` into the run's verifier (before
        settling: a constant group's rows may lie in other parts)."""
        touched = (self._pending > 0) | (self._given_low != math.inf) | (self._given_high != -math.inf)
        groups = touched.nonzero().flatten()
        return VerifyPartial(
            compared=self.compared,
            mismatched=self.mismatched,
            residue=self.residue,
            max_abs_diff=self.max_abs_diff,
            examples=self.examples,
            residue_examples=self.residue_examples,
            shards=self._shards,
            float32=self._float32,
            unit_roundoff=self._unit_roundoff,
            groups=groups,
            given_low=self._given_low[groups],
            given_high=self._given_high[groups],
            pending=self._pending[groups],
            pending_row=self._pending_row[groups],
            pending_given=self._pending_given[groups],
            pending_expected=self._pending_expected[groups],
        )

    def merge(self, part: VerifyPartial, *, named: bool = False) -> None:
        """Add what another verifier saw of the rows after those seen so far (parts in input
        order): the result is that of one verifier over all the rows. Examples found without
        the keys are named here (``named``: the part named them already)."""
        self.compared += part.compared
        self.mismatched += part.mismatched
        self.residue += part.residue
        self.max_abs_diff = max(self.max_abs_diff, part.max_abs_diff)
        if self._float32 is None and part.float32 is not None:
            self._float32, self._unit_roundoff = part.float32, part.unit_roundoff
        self._shards = sorted({*self._shards, *part.shards})
        for mine, theirs in ((self.examples, part.examples), (self.residue_examples, part.residue_examples)):
            for example in theirs:
                if named:
                    mine.append(example)
                    continue
                key = self.keys.key_at(example["_group"]) if self.keys is not None else example["_group"]
                mine.append({**example, "group": _jsonable(key)})
            mine.sort(key=lambda e: e["_row"])
            del mine[self.spec.max_examples :]
        groups = part.groups
        # NaN stays, as in the scatter that found them
        self._given_low[groups] = torch.minimum(self._given_low[groups], part.given_low)
        self._given_high[groups] = torch.maximum(self._given_high[groups], part.given_high)
        self._pending[groups] += part.pending
        # the first differing row of each group: the earlier part's, unless it had none
        fresh = (self._pending_row[groups] < 0) & (part.pending_row >= 0)
        targets = groups[fresh]
        self._pending_row[targets] = part.pending_row[fresh]
        self._pending_given[targets] = part.pending_given[fresh]
        self._pending_expected[targets] = part.pending_expected[fresh]

    @property
    def passed(self) -> bool:
        self._settle()
        return self.mismatched == 0 and (not self.spec.strict or self.residue == 0)

    def result(self) -> dict[str, Any]:
        """The summary's ``verify`` object."""
        self._settle()
        spec = self.spec
        return {
            "column": spec.column,
            "atol": spec.atol,
            "rtol": spec.rtol,
            "trainer_rounding": bool(self._float32),
            "strict": spec.strict,
            "compared": self.compared,
            "mismatched": self.mismatched,
            "residue": self.residue,
            "max_abs_diff": self.max_abs_diff,
            "examples": [_public(e) for e in self.examples],
            "residue_examples": [_public(e) for e in self.residue_examples],
        }


@dataclass(frozen=True)
class VerifyPartial:
    """What one :class:`Verifier` saw of a part of the rows (:meth:`Verifier.partial`): its
    counts and examples, and its constant groups' given values and first differing rows
    (``groups``: the groups it saw such rows of, int64; the other tensors per such group)."""

    compared: int
    mismatched: int
    residue: int
    max_abs_diff: float
    examples: list[dict[str, Any]]
    residue_examples: list[dict[str, Any]]
    shards: list[tuple[int, str]]
    float32: bool | None
    unit_roundoff: float
    groups: torch.Tensor
    given_low: torch.Tensor
    given_high: torch.Tensor
    pending: torch.Tensor
    pending_row: torch.Tensor
    pending_given: torch.Tensor
    pending_expected: torch.Tensor


GROUP_STATE = ("given_low", "given_high", "pending", "pending_row", "pending_given", "pending_expected")
"""The per-group fields of a :class:`VerifyPartial` (beside ``groups``)."""


def split_by_groups(part: VerifyPartial, starts: Sequence[int]) -> tuple[VerifyPartial, list[VerifyPartial]]:
    """``part`` without its constant groups' state, and that state cut by ranges of group IDs
    (``starts``: each range's first ID, ascending from 0), each range's IDs counted from its
    start: the Ray engine settles each reducer's groups where their statistics are."""
    rest = replace(part, groups=part.groups[:0], **{name: getattr(part, name)[:0] for name in GROUP_STATE})
    which = torch.searchsorted(torch.tensor(list(starts), dtype=torch.int64), part.groups, right=True) - 1
    cuts = []
    for r, start in enumerate(starts):
        mine = which == r
        cuts.append(
            replace(
                part,
                compared=0,
                mismatched=0,
                residue=0,
                max_abs_diff=0.0,
                examples=[],
                residue_examples=[],
                float32=None,
                groups=part.groups[mine] - start,
                **{name: getattr(part, name)[mine] for name in GROUP_STATE},
            )
        )
    return rest, cuts


def settled(verifier: Verifier) -> VerifyPartial:
    """What ``verifier`` found once its constant groups are settled: its counts and examples
    (named), no group state, to merge into another verifier with ``named=True``."""
    verifier._settle()
    return split_by_groups(verifier.partial(), [])[0]


def _public(example: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in example.items() if not k.startswith("_")}


def _finite_or_zero(values: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(values), values, torch.zeros_like(values)).to(torch.float64)


def _ulp32(magnitude: torch.Tensor) -> torch.Tensor:
    """float32's unit in the last place at ``magnitude`` (float64)."""
    _, exponent = torch.frexp(magnitude)
    ulp = torch.ldexp(torch.ones_like(magnitude), (exponent - FLOAT32_BITS).clamp_min(-149))
    return torch.where(magnitude > 0, ulp, 2.0**-149)  # 0: the smallest step float32 has


def _significand_bits(values: torch.Tensor) -> torch.Tensor:
    """Bits of the significand each value needs once rounded to float32 (0 for 0).

    >>> _significand_bits(torch.tensor([0.0, 1.0, 0.75, 0.1], dtype=torch.float64)).tolist()
    [0, 1, 2, 24]
    """
    as32 = _finite_or_zero(values).to(torch.float32).to(torch.float64)
    fraction, _ = torch.frexp(as32.abs())
    significand = torch.ldexp(fraction, torch.full_like(fraction, FLOAT32_BITS, dtype=torch.int64))
    integer = significand.to(torch.int64)
    lowest = integer & -integer  # the lowest set bit
    trailing = _bit_length(lowest) - 1  # the lowest set bit's place, exactly (frexp, not a log)
    return torch.where(integer > 0, FLOAT32_BITS - trailing, 0)


def _bit_length(counts: torch.Tensor) -> torch.Tensor:
    """Bits of each non-negative count (0 for 0, 1 for 1, 3 for 4), from its exponent: exact, where
    ``log2`` goes through the CPU's vector-math library.

    >>> _bit_length(torch.tensor([0, 1, 4, 7, 8, 2**52 + 1])).tolist()
    [0, 1, 3, 3, 4, 53]
    """
    _, exponent = torch.frexp(counts.clamp_min(1).to(torch.float64))
    return torch.where(counts > 0, exponent.to(torch.int64), 0)


def _group_divisor(stats: GroupStats, options: AdvantageOptions) -> torch.Tensor:
    """Each group's divisor under ``options`` (std + eps, std clamped at eps, or 1)."""
    if options.scale == "none":
        return torch.ones_like(stats.mean, dtype=torch.float64)
    ddof = 1 if options.std == "sample" else 0
    if options.scale == "mean":  # MaxRL divides by the group mean
        deviation = torch.nan_to_num(stats.mean.to(torch.float64), nan=0.0).clamp_min(0)
    else:
        deviation = torch.nan_to_num(group_std(stats, ddof=ddof).to(torch.float64), nan=0.0)
    if options.epsilon_mode == "clamp":
        return deviation.clamp_min(options.epsilon)
    return deviation + options.epsilon


def _jsonable(key: Any) -> Any:
    if isinstance(key, tuple):
        return [_jsonable(k) for k in key]
    if isinstance(key, (str, int, float, bool)) or key is None:
        return key
    return str(key)
