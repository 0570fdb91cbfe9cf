"""How each trainer groups its rollouts, as a rule a dump's columns are keyed by: key columns,
a uid's prefix, consecutive blocks of one size, the prompt's tokens."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from grpo_cli.arrow.columns import is_text_type, text_kernel_input
from grpo_cli.errors import GrpoError, mention
from grpo_cli.inputs.sources import Shard
from grpo_cli.trainers.dumps.columns import (
    DERIVED_KEY,
    _at,
    _length,
    _one_element,
    _whole_table,
    _with_column,
)


@dataclass(frozen=True)
class KeyColumns:
    """The group is the tuple of these fields' values."""

    columns: tuple[str, ...]
    meaning: str

    def describe(self) -> str:
        return f"({', '.join(self.columns)}): {self.meaning}"

    def derive(self, table: pa.Table, file: str) -> pa.Table:
        return table


@dataclass(frozen=True)
class KeyPrefix:
    """The group is the part of ``column`` before the first ``separator``, within the step."""

    step: str
    column: str
    separator: str

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.step, DERIVED_KEY)

    def describe(self) -> str:
        return f"(step, the part of {self.column} before the first {self.separator!r}), as {DERIVED_KEY}"

    def derive(self, table: pa.Table, file: str) -> pa.Table:
        values = table.column(self.column)
        if not is_text_type(values.type):
            raise GrpoError(f"{file}: the field {self.column} is {values.type}, not text")
        values = text_kernel_input(values)
        if values.null_count:
            row = pc.index(pc.is_null(values), True).as_py()
            raise GrpoError(f"{_at(file, row, 'record')}: the field {self.column} is null")
        prefix = pc.list_element(pc.split_pattern(values, self.separator, max_splits=1), 0)
        return _with_column(table, DERIVED_KEY, prefix, file)


@dataclass(frozen=True)
class ConsecutiveBlocks:
    """The group is a block of G consecutive rows of one file; G is given, or read from the
    runs of equal ``prompt`` values (their greatest common divisor). ``within``: fields whose
    change also ends a run (ROLL's ``domain``: two domains' prompts may share an ``id``, and
    a block never holds two domains)."""

    prompt: str
    within: tuple[str, ...] = ()
    size_name: str = "num_generations"

    columns: tuple[str, ...] = ()

    @property
    def run_fields(self) -> list[str]:
        """The fields whose values, taken together, stay the same along one prompt's rows."""
        return [*self.within, self.prompt]

    @property
    def runs_of(self) -> str:
        return " and ".join(self.run_fields)

    def describe(self) -> str:
        return (
            f"consecutive blocks of {self.size_name} rows in each file (told from the runs of "
            f"equal {self.runs_of})"
        )

    def missing(self, names: Sequence[str]) -> list[str]:
        """The ``within`` fields a file or table with these column names lacks."""
        return [name for name in self.within if name not in names]

    def describe_size(self, size: int) -> str:
        """The rule with the group size the run took."""
        within = f", none across two {' or '.join(self.within)} values" if self.within else ""
        return f"consecutive blocks of {size} rows in each file{within}"

    def derive(self, table: pa.Table, file: str) -> pa.Table:
        return table


@dataclass(frozen=True)
class PromptTokens:
    """NeMo-RL's: the prompt's token IDs (the tokens before the first one the loss mask
    keeps) within the step, as ``calculate_baseline_and_std_per_prompt`` groups them."""

    step: str
    tokens: str
    loss_mask: str

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.step, DERIVED_KEY)

    def describe(self) -> str:
        return (
            f"(step, the prompt's token IDs: {self.tokens} before the first token "
            f"{self.loss_mask} keeps), as {DERIVED_KEY}"
        )

    def derive(self, table: pa.Table, file: str) -> pa.Table:
        tokens = _one_element(table, self.tokens, file).to_pylist()
        masks = _one_element(table, self.loss_mask, file).to_pylist()
        prompts = []
        for row, (ids, mask) in enumerate(zip(tokens, masks, strict=True)):
            if ids is None or mask is None or len(ids) != len(mask):
                raise GrpoError(
                    f"{_at(file, row)}: {self.tokens} and {self.loss_mask} differ in length "
                    f"({_length(ids)} and {_length(mask)})"
                )
            first = next((i for i, keep in enumerate(mask) if keep), None)
            if first is None:
                raise GrpoError(f"{_at(file, row)}: {self.loss_mask} keeps no token (no response)")
            prompts.append(ids[:first])
        return _with_column(table, DERIVED_KEY, pa.array(prompts, pa.list_(pa.int64())), file)


GroupRule = KeyColumns | KeyPrefix | ConsecutiveBlocks | PromptTokens


def _blocks(rule: ConsecutiveBlocks, shards: list[Shard], given: int | None, notes: list[str]) -> int:
    """The group size of a dump whose groups are consecutive blocks in each file (see
    :func:`_block_size`), read from the files' runs of equal prompts."""
    from grpo_cli.inputs.readers import describe_row, read_schema

    for shard in shards:
        missing = rule.missing(read_schema(shard).names)
        if missing:
            raise GrpoError(
                f"{shard.display}: holds no {', '.join(missing)} field, which tells the trainer's groups "
                "apart (the trainer writes it in every record)"
            )
    files = [
        (
            shard.display,
            _run_lengths(*_whole_table(shard, rule.run_fields).columns),
            functools.partial(describe_row, shard),
        )
        for shard in shards
    ]
    return _block_size(rule.runs_of, files, given, mention("group_size"), notes, size_name=rule.size_name)


def _block_size(
    prompt: str,
    files: Sequence[tuple[str, list[int], Callable[[int], str]]],
    given: int | None,
    option: str,
    notes: list[str],
    *,
    size_name: str = "num_generations",
) -> int:
    """``given``, or the greatest common divisor of the runs of equal ``prompt`` values; each
    file (its name, its runs' lengths, and how a row of it is named) must be whole groups, and
    no group may hold two prompts.

    Blocks start at each file's first row, so a group holds one prompt only where every run,
    the first and last of a file among them, is a whole number of groups: the divisor of all
    runs is the largest size that puts no two prompts in one group. Where the runs inside the
    files agree on a size that a file's first or last run breaks (a generation batch cut
    across two files), that size is taken so that the file is named.

    >>> _block_size("prompt", [("a", [8, 16, 8], str)], None, "--group-size", notes := [])
    8
    >>> notes[1].split(";")[0]
    '1 run(s) of one prompt span several groups of 8 (a prompt drawn twice in a row)'
    """
    runs = [run for _, lengths, _ in files for run in lengths]
    size = given
    if size is None:
        size = math.gcd(*runs)
        if size <= 1:
            size = math.gcd(*(run for _, lengths, _ in files for run in lengths[1:-1]))
        if size <= 1:
            raise GrpoError(
                f"{files[0][0]}: cannot tell {size_name} from the dump (no two consecutive rows "
                f"share a {prompt}); give {option}"
            )
        longer = sum(1 for run in runs if run > size)
        notes.append(
            f"group size {size}: told from the runs of equal {prompt} (the dump does not record {size_name})"
        )
        if longer:
            notes.append(
                f"{longer} run(s) of one {prompt} span several groups of {size} (a prompt "
                "drawn twice in a row); "
                "they are split by position, as the trainer groups them"
            )
    named = f" ({option})" if given is not None else ""
    for name, lengths, where in files:
        count = sum(lengths)
        if count % size:
            raise GrpoError(
                f"{name}: {count} rows are not a whole number of groups of {size} (the "
                "trainer writes "
                "whole generation batches): the file is truncated, or the group size is not "
                f"{size}{named}"
            )
        start = 0
        for run in lengths:
            if start % size:
                first = start - start % size
                raise GrpoError(
                    f"{where(start)}: a new {prompt} starts inside a group of {size} "
                    f"(rows {first}-{first + size - 1} hold two): the "
                    f"file is cut, or the group size is not {size}{named}"
                )
            start += run
    return size


def _run_lengths(*columns: pa.ChunkedArray) -> list[int]:
    """Lengths of the runs of equal consecutive values (of all ``columns`` together).

    >>> _run_lengths(pa.chunked_array([["3", "3", "3", "3"]]), pa.chunked_array([["a", "a", "b", "b"]]))
    [2, 2]
    """
    items = list(zip(*(column.to_pylist() for column in columns), strict=True))
    out, start = [], 0
    for i in range(1, len(items) + 1):
        if i == len(items) or items[i] != items[start]:
            out.append(i - start)
            start = i
    return out
