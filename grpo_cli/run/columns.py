"""A shard's columns against the options, before any work: missing columns named with a close
match, the option that names them and the columns there are; new columns that would clash;
key columns of types that cannot be keys. Standard library and pyarrow only, so a run checks
a Parquet input's schema before torch loads (a typo's one line comes at once)."""

from __future__ import annotations

import difflib
from collections import Counter
from typing import TYPE_CHECKING

import pyarrow as pa

from grpo_cli.arrow.columns import (
    MAX_NESTING,
    field_type,
    is_key_type,
    is_numeric_type,
    leaf_fields,
    nesting_depth,
)
from grpo_cli.errors import GrpoError, LayoutError, mention

if TYPE_CHECKING:
    from grpo_cli.inputs.sources import Shard
    from grpo_cli.options.config import ComputeConfig

REWARD_WORDS = ("reward", "score", "correct", "acc", "pass", "success")
"""Words in a column name that say it holds a reward (verl's ``score``, TRL's ``accuracy_reward``)."""


def check_columns(config: ComputeConfig, shard: Shard, schema: pa.Schema, *, writes_output: bool) -> None:
    """Refuse, before any work, a shard whose columns do not fit the options (standard library
    and pyarrow only: a run checks a Parquet input's columns before torch loads)."""
    if len(schema) == 0:  # an empty JSONL file: no records, no columns
        return
    names = schema.names
    for column in schema:
        depth = nesting_depth(column.type)
        if depth > MAX_NESTING:
            raise GrpoError(
                f"{shard.display}: column {column.name!r} nests {depth} levels deep; grpo-cli reads "
                f"at most {MAX_NESTING}"
            )
    repeated = [name for name, count in Counter(names).items() if count > 1]
    if repeated:
        raise GrpoError(
            f"{shard.display}: the input has {names.count(repeated[0])} columns named {repeated[0]!r}; "
            "column names must be unique (rename or drop the copies)"
        )
    for column in config.input_columns:
        if field_type(schema, column) is None:
            raise LayoutError(f"{shard.display}: no column {column!r}{_hint(config, column, schema)}")
    for column in config.new_columns if writes_output else ():
        if field_type(schema, column) is not None:
            option = mention("active_col" if column == config.active_col else "advantage_col")
            what = "column" if column in names else "nested field"
            raise GrpoError(
                f"{shard.display}: the input already has a {what} {column!r}; "
                f"choose another name with {option}"
            )
    if config.verify is not None and field_type(schema, config.verify.column) is None:
        raise GrpoError(
            f"{shard.display}: no column {config.verify.column!r} to verify; "
            f"the columns are {', '.join(names)}"
        )
    for column in config.group_cols if config.group_size is None else ():
        column_type = field_type(schema, column)
        if column_type is not None and pa.types.is_null(column_type):
            raise GrpoError(
                f"{shard.display}: group column {column!r} has type null: it holds only nulls "
                "(every key is null), and null keys cannot be grouped"
            )
        if not is_key_type(column_type):
            raise GrpoError(
                f"{shard.display}: group column {column!r} has type {column_type}; group keys must be "
                "scalars (integers, strings, ...), lists or structs of them"
            )


def _hint(config: ComputeConfig, column: str, schema: pa.Schema) -> str:
    """What to tell a user whose column is missing: a close name, the option, the columns."""
    names = schema.names
    top, dot, _ = column.partition(".")
    if dot and top in names:
        # walk down the fields that are there: name the deepest struct and the first missing part
        parts, data_type, at = column.split("."), schema.field(top).type, top
        for part in parts[1:]:
            if not pa.types.is_struct(data_type):
                return f" ({at!r} is {data_type}, not a struct with fields)"
            inner = [data_type.field(i).name for i in range(data_type.num_fields)]
            if part not in inner:
                return f" (struct {at!r} has fields {', '.join(inner)}; {part!r} is not one of them)"
            data_type, at = data_type.field(part).type, f"{at}.{part}"
        return f" ({at!r} is there, but not as {column!r})"
    fields = leaf_fields(schema)
    close = difflib.get_close_matches(column, fields, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    is_reward = column in {spec.column for spec in config.rewards}
    if is_reward and not (close and is_numeric_type(fields[close[0]])):
        numeric = [name for name, data_type in fields.items() if is_numeric_type(data_type)]
        by_name = difflib.get_close_matches(column, numeric, n=1, cutoff=0.6)
        by_role = sorted(
            (name for name in numeric if any(word in name.lower() for word in REWARD_WORDS)),
            key=lambda name: -difflib.SequenceMatcher(None, column, name).ratio(),
        )
        if by_name or by_role:
            suggestion = (by_name or by_role)[0]
            hint = f"; did you mean {suggestion!r} (a numeric column named like a reward)? pass it with -r"
    if column in config.group_cols and column == "group_id" and not close:
        hint = (
            f"; name the group column with -g/{mention('group_col')}, or use {mention('group_size')} N "
            "for consecutive groups"
        )
    weight = column.rpartition(":")
    if weight[1] and weight[0] in names:
        hint = f"; {column!r} looks like {weight[0]!r} with a weight, but {weight[2]!r} is not a number"
    return f"{hint} (the columns are {', '.join(names)})"
