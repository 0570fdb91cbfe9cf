"""Reward columns to tensors, and one batch's advantages and new columns.

Arrow reward columns (floating, integer, boolean or decimal) become float tensors
exactly: integers beyond 2**53 are refused, decimals convert through text, nulls become
NaN (invalid). With several weighted reward columns the batch carries either one
channel (their weighted sum, ``sum-then-normalize``) or one channel per column
(``normalize-then-sum``, GDPO), and always the combined reward for the summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from grpo_cli.arrow.columns import column_of, field_type, is_numeric_type, is_text_type, text_kernel_input
from grpo_cli.arrow.keys import arrow_of, as_tensor, numpy_of, scalar_of
from grpo_cli.choices import RewardSum
from grpo_cli.errors import GrpoError, mention
from grpo_cli.inputs.readers import describe_row
from grpo_cli.inputs.sources import Shard
from grpo_cli.kernel import Normalization, apply_normalization, fold_sum
from grpo_cli.options.advantage import AdvantageOptions, RewardSpec


@dataclass
class RewardBatch:
    """Rewards of one batch: per channel tensor and validity, plus the combined reward.

    Validity tensors are bool of the batch's length, or ``None`` when every value is finite.
    """

    channels: list[torch.Tensor]
    channel_valid: list[torch.Tensor | None]
    combined: torch.Tensor
    combined_valid: torch.Tensor | None
    unshaped: torch.Tensor | None = None  # the combined reward before the reward transforms

    @staticmethod
    def concat(parts: Sequence[RewardBatch]) -> RewardBatch:
        """The batches one after the other."""
        if len(parts) == 1:
            return parts[0]
        channels = len(parts[0].channels)
        channel_values = [[p.channels[c] for p in parts] for c in range(channels)]
        combined = [p.combined for p in parts]
        return RewardBatch(
            channels=[torch.cat(v) for v in channel_values],
            channel_valid=[
                _concat_valid([p.channel_valid[c] for p in parts], channel_values[c]) for c in range(channels)
            ],
            combined=torch.cat(combined),
            combined_valid=_concat_valid([p.combined_valid for p in parts], combined),
            unshaped=None
            if any(p.unshaped is None for p in parts)
            else torch.cat([p.unshaped for p in parts if p.unshaped is not None]),
        )


def _concat_valid(masks: list[torch.Tensor | None], values: list[torch.Tensor]) -> torch.Tensor | None:
    if all(m is None for m in masks):
        return None
    return torch.cat(
        [torch.ones_like(v, dtype=torch.bool) if m is None else m for m, v in zip(masks, values, strict=True)]
    )


@dataclass(frozen=True)
class RewardCombination:
    """How a row's reward columns become its rewards, on tensors: each column's weight, one
    channel or one per column (``per_column``), TRL's ``nansum``, the reward transforms
    (``shaping``), and whether the single column is floating (``floating``: it then keeps its
    dtype where nothing is combined or shaped).

    >>> one = RewardCombination((1.0,), per_column=False)
    >>> one.combine([torch.tensor([0.5, float("nan")])]).combined_valid
    tensor([ True, False])
    """

    weights: tuple[float, ...]
    per_column: bool
    nansum: bool = False
    shaping: AdvantageOptions | None = None
    floating: bool = True

    @property
    def native(self) -> bool:
        """One floating column of weight 1, neither summed by ``nansum`` nor shaped: its values
        are the rewards, in their own dtype (TRL's nansum adds even one column to +0.0, which
        turns a -0.0 reward into +0.0)."""
        return self.weights == (1.0,) and self.floating and self.shaping is None and not self.nansum

    def combine(
        self,
        values: Sequence[torch.Tensor],
        *,
        lengths: torch.Tensor | None = None,
        truncated: torch.Tensor | None = None,
    ) -> RewardBatch:
        """The rewards of rows whose reward columns hold ``values`` (one tensor a column, NaN
        for a null), with each row's length and truncation flag where a transform reads them."""
        if self.native:
            tensor = values[0]
            valid = _finite(tensor)
            return RewardBatch([tensor], [valid], tensor, valid)
        weighted = [v.to(torch.float64) * weight for v, weight in zip(values, self.weights, strict=True)]
        combined = _weighted_sum(weighted, nansum=self.nansum)
        unshaped = None
        if self.shaping is not None:
            unshaped = combined
            combined = self.shaping.shape(combined, lengths=lengths, truncated=truncated)
        combined_valid = _finite(combined)
        if unshaped is not None:  # a bad reward as read stays bad: --reward-clip turns inf into a bound
            combined_valid = _both(combined_valid, _finite(unshaped))
        if self.per_column:
            scaled = [v.to(torch.float64) for v in values]
            return RewardBatch(scaled, [_finite(v) for v in scaled], combined, combined_valid)
        return RewardBatch([combined], [combined_valid], combined, combined_valid, unshaped)


def refuse_bad_lengths(lengths: torch.Tensor, where: Callable[[int], str], *, column: str | None) -> None:
    """Refuse a NaN, negative or infinite length (float64 ``(N,)``), at its row as ``where``
    names it; ``column``: the ``--length-col`` it was read from (``None``: the caller's tensor)."""
    bad = ~(torch.isfinite(lengths) & (lengths >= 0))
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        named = mention("length_col") if column is None else f"{mention('length_col')} {column!r}"
        raise GrpoError(f"{where(row)}: {named} is {float(lengths[row])}; lengths must be finite and >= 0")


def bad_rewards_error(where: str, value: str, count: int) -> GrpoError:
    """The refusal of a null, NaN or infinite reward under ``--nan error``: the first one
    (``where``, its ``value`` as read) and how many there are."""
    return GrpoError(
        f"{where}: reward is {value}; {count} reward(s) in all are null, NaN or infinite "
        f"({mention('nan')} ignore leaves them out)"
    )


class RewardReader:
    """Turns a shard's reward columns into tensors: one channel, or one per column."""

    def __init__(
        self,
        specs: Sequence[RewardSpec],
        schema: pa.Schema,
        shard: Shard,
        *,
        per_column: bool,
        reward_sum: RewardSum = "sum",
        shaping: AdvantageOptions | None = None,
        length_col: str | None = None,
        truncated_col: str | None = None,
    ) -> None:
        self.specs = tuple(specs)
        self.shaping = shaping if shaping is not None and shaping.shapes_rewards else None
        self.length_col = length_col
        self.truncated_col = truncated_col
        self.shard = shard
        self.per_column = per_column
        self.nansum = reward_sum == "nansum"
        types = []
        for spec in self.specs:
            column_type = field_type(schema, spec.column)
            assert column_type is not None  # the plan checked the columns
            if not (self._numeric(column_type) or pa.types.is_null(column_type)):
                raise GrpoError(
                    f"{shard.display}: reward column {spec.column!r} has type {column_type}; "
                    "it must be numeric"
                )
            types.append(column_type)
        self.combination = RewardCombination(
            tuple(spec.weight for spec in self.specs),
            per_column=per_column,
            nansum=self.nansum,
            shaping=self.shaping,
            floating=pa.types.is_floating(types[0]),
        )

    def read(self, batch: pa.RecordBatch, first_row: int = 0) -> RewardBatch:
        """The batch's rewards; ``first_row`` (its row in the shard) locates errors."""
        values = [self._column(column_of(batch, spec.column), spec.column, first_row) for spec in self.specs]
        lengths = truncated = None
        if self.shaping is not None and self.shaping.overlong is not None:
            assert self.length_col is not None
            lengths = self.lengths(batch, self.length_col, first_row)
        if self.shaping is not None and self.shaping.stop_properly is not None:
            assert self.truncated_col is not None
            truncated = self.truncated(batch, self.truncated_col, first_row)
        return self.combination.combine(values, lengths=lengths, truncated=truncated)

    def truncated(self, batch: pa.RecordBatch, name: str, first_row: int = 0) -> torch.Tensor:
        """The ``--truncated-col`` column as bool: a boolean, a number (non-zero: truncated), or a
        finish reason, ``"length"`` where the rollout was cut; a null is refused with its row.
        Text that is all booleans or numbers (a CSV column: ``true``, ``0``) is read as those."""
        array = column_of(batch, name)
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if array.null_count:
            row = int(pc.index(pc.is_null(array), True).as_py())
            raise GrpoError(
                f"{describe_row(self.shard, first_row + row)}: {mention('truncated_col')} {name!r} is null; "
                "every "
                "rollout needs its truncation flag"
            )
        if pa.types.is_boolean(array.type):
            flags = array
        elif is_text_type(array.type):
            array = text_kernel_input(array)
            if pc.all(pc.match_substring_regex(array, _FLAG_TEXT, ignore_case=True)).as_py():
                flags = pc.not_equal(numbers_from_text(array, name, self.shard, first_row), 0.0)
            else:
                flags = pc.equal(array, "length")
        elif is_numeric_type(array.type):
            if pa.types.is_floating(array.type) and pc.any(pc.is_nan(array)).as_py():
                row = int(pc.index(pc.is_nan(array), True).as_py())
                raise GrpoError(
                    f"{describe_row(self.shard, first_row + row)}: {mention('truncated_col')} {name!r} is "
                    "NaN; every "
                    "rollout needs its truncation flag"
                )
            flags = pc.not_equal(array, scalar_of(0, array.type))
        else:
            raise GrpoError(
                f"{self.shard.display}: {mention('truncated_col')} {name!r} has type {array.type}; it must "
                "be a "
                "boolean, a number or a finish reason"
            )
        return torch.from_numpy(numpy_of(flags).astype(bool))

    def column(self, batch: pa.RecordBatch, name: str, first_row: int = 0) -> torch.Tensor:
        """Another numeric column of the batch (a length, a baseline) as float64, nulls as NaN."""
        array = column_of(batch, name)
        if pa.types.is_null(array.type):
            raise GrpoError(f"{self.shard.display}: column {name!r} holds only nulls; it must hold numbers")
        if not self._numeric(array.type):
            raise GrpoError(
                f"{self.shard.display}: column {name!r} has type {array.type}; it must be numeric"
            )
        return self._column(array, name, first_row).to(torch.float64)

    def lengths(self, batch: pa.RecordBatch, name: str, first_row: int = 0) -> torch.Tensor:
        """The ``--length-col`` column as float64; a null, negative or infinite length is refused."""
        lengths = self.column(batch, name, first_row)
        refuse_bad_lengths(lengths, lambda row: describe_row(self.shard, first_row + row), column=name)
        return lengths

    def _numeric(self, data_type: pa.DataType) -> bool:
        """Whether a column of ``data_type`` holds numbers: a CSV column is text, parsed here."""
        return is_numeric_type(data_type) or (self.shard.format == "csv" and pa.types.is_string(data_type))

    def _column(self, array: pa.Array, name: str, first_row: int) -> torch.Tensor:
        if pa.types.is_null(array.type):  # a column of only nulls, as JSON lines and CSV readers type it
            array = pa.nulls(len(array), pa.float64())
        if pa.types.is_string(array.type):
            array = numbers_from_text(array, name, self.shard, first_row)
        if pa.types.is_integer(array.type) and array.type.bit_width == 64:
            limit = scalar_of(1 << 53, array.type)
            too_large = pc.greater(array, limit)
            if pa.types.is_signed_integer(array.type):
                too_large = pc.or_(too_large, pc.less(array, scalar_of(-(1 << 53), array.type)))
            if pc.any(too_large).as_py():
                index = int(pc.index(too_large, True).as_py())
                raise GrpoError(
                    f"{describe_row(self.shard, first_row + index)}: reward {array[index].as_py()} in column "
                    f"{name!r} is an integer beyond 2**53, which float64 cannot hold exactly"
                )
        if pa.types.is_decimal(array.type):
            # through text, which rounds correctly: Arrow's decimal-to-double division is
            # off by one ulp for about half of all values
            array = pc.cast(pc.cast(array, pa.string()), pa.float64())
        elif pa.types.is_boolean(array.type) or pa.types.is_integer(array.type):
            array = pc.cast(array, pa.float64(), safe=False)
        if array.null_count:
            array = pc.fill_null(array, scalar_of(math.nan, array.type))
        return as_tensor(numpy_of(array))


def _weighted_sum(weighted: Sequence[torch.Tensor], *, nansum: bool) -> torch.Tensor:
    """The combined reward: the plain sum (a NaN anywhere makes the row NaN), or TRL's
    ``nansum`` (a NaN counts as 0; the row is NaN only where every term is NaN).

    >>> nan = float("nan")
    >>> terms = [torch.tensor([1.0, nan, nan]), torch.tensor([0.5, 0.5, nan])]
    >>> _weighted_sum(terms, nansum=False).tolist()
    [1.5, nan, nan]
    >>> _weighted_sum(terms, nansum=True).tolist()
    [1.5, 0.5, nan]
    """
    if not nansum:
        combined = weighted[0]
        for extra in weighted[1:]:
            combined = combined + extra
        return combined
    terms = torch.stack(list(weighted))
    missing = torch.isnan(terms)
    total = fold_sum(torch.where(missing, torch.zeros_like(terms), terms), dim=0)  # in column order
    return torch.where(missing.all(dim=0), torch.full_like(total, float("nan")), total)


_NUMBER = r"^[+-]?((\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?|nan|inf|infinity)$"
_INTEGER = r"^[+-]?\d+$"
_BOOLEAN = r"^(true|false)$"
_FLAG_TEXT = r"^[+-]?\d+(\.\d*)?$|^(true|false)$"  # a truncation flag written as text (CSV)


def numbers_from_text(array: pa.Array, name: str, shard: Shard, first_row: int = 0) -> pa.Array:
    """A CSV column's text as float64, each value correctly rounded; nulls stay null.

    Decimal and scientific notation, ``nan`` and ``inf``; a column of only ``true`` and
    ``false`` (any case) is 1 and 0. An integer beyond 2**53 that float64 cannot hold
    exactly, and text that is no number, are refused with the row.

    >>> from pathlib import Path
    >>> shard = Shard(Path("r.csv"), "r.csv", "csv", 0)
    >>> numbers_from_text(pa.array(["1", "0.5", "-1e-3", None, "NaN"]), "r", shard).to_pylist()
    [1.0, 0.5, -0.001, None, nan]
    >>> numbers_from_text(pa.array(["True", "false"]), "r", shard).to_pylist()
    [1.0, 0.0]
    >>> numbers_from_text(pa.array([None, None], pa.string()), "r", shard).to_pylist()
    [None, None]
    >>> numbers_from_text(pa.array(["1", "9007199254740993"]), "r", shard)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    grpo_cli.errors.GrpoError: r.csv, row 1: column 'r' holds the integer 9007199254740993, which ...
    """
    is_number = pc.match_substring_regex(array, _NUMBER, ignore_case=True)
    if not pc.all(is_number, min_count=0).as_py():  # min_count=0: a column of only nulls is all numbers
        if pc.all(pc.match_substring_regex(array, _BOOLEAN, ignore_case=True)).as_py():
            return pc.cast(pc.equal(pc.utf8_lower(array), "true"), pa.float64())
        bad = int(pc.index(pc.fill_null(is_number, True), False).as_py())
        raise GrpoError(
            f"{describe_row(shard, first_row + bad)}: column {name!r} holds {array[bad].as_py()!r}, "
            "which is not a number"
        )
    values = pc.cast(array, pa.float64())
    past_2_53 = pc.greater_equal(pc.abs(values), float(1 << 53))
    integer = pc.and_(pc.match_substring_regex(array, _INTEGER), past_2_53)
    for index in pc.indices_nonzero(pc.fill_null(integer, False)).to_pylist():
        text = array[index].as_py()
        if float(int(text)) != int(text):
            raise GrpoError(
                f"{describe_row(shard, first_row + index)}: column {name!r} holds the integer {text}, "
                "which float64 cannot hold exactly"
            )
    return values


def _finite(values: torch.Tensor) -> torch.Tensor | None:
    """Validity mask, or ``None`` when every value is finite (the common case).

    On the CPU through NumPy, whose ``isfinite`` is a vector loop with no allocation
    per call: torch's took a tenth of a 10M-row run.

    >>> _finite(torch.tensor([1.0, 2.0])), _finite(torch.tensor([1.0, float("inf")]))
    (None, tensor([ True, False]))
    """
    if values.device.type == "cpu" and values.dtype != torch.bfloat16:  # NumPy has no bfloat16
        finite = np.isfinite(values.numpy())
        return None if finite.all() else torch.from_numpy(finite)
    mask = torch.isfinite(values)
    return None if bool(mask.all()) else mask


def _both(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """Two :func:`_finite` masks in one (``None``: every value finite in both).

    >>> _both(None, torch.tensor([True, False])), _both(None, None)
    (tensor([ True, False]), None)
    """
    if a is None or b is None:
        return b if a is None else a
    return a & b


def advantage_dtype(types: Sequence[pa.DataType]) -> torch.dtype:
    """The advantage column's dtype for reward columns of ``types``.

    One floating column keeps its width; anything combined or converted is float32,
    or float64 when a float64, decimal or text column (CSV) is involved, or a column of
    only nulls (type ``null``, as JSON lines and CSV readers type it: a JSON number reads
    as float64).

    >>> advantage_dtype([pa.float32()]), advantage_dtype([pa.int64()]), advantage_dtype([pa.null()])
    (torch.float32, torch.float32, torch.float64)
    """
    if any(pa.types.is_decimal(t) or pa.types.is_string(t) or pa.types.is_null(t) for t in types):
        return torch.float64
    floats = [t for t in types if pa.types.is_floating(t)]
    if len(types) == 1 and floats:
        return {16: torch.float16, 32: torch.float32, 64: torch.float64}[floats[0].bit_width]
    if any(t.bit_width == 64 for t in floats):
        return torch.float64
    return torch.float32


def combined_advantages(
    rewards: RewardBatch,
    ids: torch.Tensor,
    norms: Sequence[Normalization],
    active: torch.Tensor,
    *,
    weights: Sequence[float],
    device: torch.device,
) -> torch.Tensor:
    """Advantages of one batch: one channel, or the ``weights``-weighted sum of per-reward channels."""
    ids_dev = ids.to(device)
    total: torch.Tensor | None = None
    for channel, (values, valid, norm) in enumerate(
        zip(rewards.channels, rewards.channel_valid, norms, strict=True)
    ):
        part = apply_normalization(
            values.to(device), ids_dev, norm, valid=None if valid is None else valid.to(device)
        )
        if len(norms) > 1:
            part = part.to(torch.float64) * weights[channel]
        total = part if total is None else total + part
    assert total is not None
    if len(norms) > 1:
        # each channel leaves inactive groups at exactly 0; so does the weighted sum
        total = torch.where(active.to(device)[ids_dev], total, torch.zeros_like(total))
    return total


def new_column_arrays(
    advantages: torch.Tensor,
    row_active: torch.Tensor,
    ids: np.ndarray,
    group_columns: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
) -> list[pa.Array]:
    """The appended columns of one batch, in the order of ``ComputeConfig.new_columns``."""
    arrays = [arrow_of(advantages.numpy()), arrow_of(row_active.numpy())]
    if group_columns is not None:
        arrays += [arrow_of(column[ids]) for column in group_columns]
    return arrays
