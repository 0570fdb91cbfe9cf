"""Reward columns to tensors, and one batch's new columns as Arrow arrays.

Arrow reward columns (floating, integer, boolean or decimal) become float tensors exactly:
integers beyond 2**53 are refused, decimals convert through text, nulls become NaN (invalid);
CSV's text becomes numbers under the same rules (:func:`numbers_from_text`). What is read is
a :class:`~grpo_cli.run.rewards.RewardBatch`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
from grpo_cli.options.advantage import AdvantageOptions, RewardSpec
from grpo_cli.run.rewards import RewardBatch, RewardCombination, refuse_bad_lengths


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
