"""A dump's cells read and added: one-element lists, per-token values, rows made into tables,
every error on the row (or line) it came from."""

from __future__ import annotations

import json
import math
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc

from grpo_cli.arrow.columns import is_text_type
from grpo_cli.errors import GrpoError, first_line, mention
from grpo_cli.inputs.sources import Shard
from grpo_cli.scratch import spool

DERIVED_KEY = "group_key"
"""The column that holds a group key rebuilt from the dump (verl v1's uid prefix, NeMo-RL's
prompt tokens): it is written with the other columns, so the output shows each row's group."""


def _whole_table(shard: Shard, columns: list[str] | None = None) -> pa.Table:
    """A shard's rows (``columns`` of them), read through its format's hardened reader."""
    from grpo_cli.inputs.readers import MAX_TYPE_SETTLINGS, SchemaDrift, iter_batches, read_schema

    for _ in range(MAX_TYPE_SETTLINGS):
        try:
            batches = list(iter_batches(shard, columns, 1 << 16))
            break
        except SchemaDrift as drift:  # a line longer than the read block, types that drift: again
            drift.settle()
    else:
        raise GrpoError(f"{shard.display}: the column types could not be settled")
    if batches:
        return pa.Table.from_batches(batches, schema=batches[0].schema)
    schema = read_schema(shard)
    return (schema if columns is None else pa.schema([schema.field(c) for c in columns])).empty_table()


def _plain(value: Any) -> Any:
    """A sample's value as JSON data: tensors as lists; an empty dict as null (no fields)."""
    if hasattr(value, "tolist") and not isinstance(value, list | tuple | dict | str):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()} or None
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else value
    return value


def _table_of_rows(rows: list[dict[str, Any]], label: str) -> pa.Table:
    """Rows as a table, types settled as grpo-cli's JSON-lines reader settles them."""
    lines = b"".join(
        json.dumps(row, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass") + b"\n"
        for row in rows
    )
    with spool(None, label=label, write=lambda out: _write_all(out, lines)) as scratch:
        return _whole_table(Shard(scratch, label, "jsonl", len(lines), record_word="element"))


def _write_all(out: IO[bytes], data: bytes) -> None:
    out.write(data)


def _with_column(table: pa.Table, name: str, values: Any, label: str) -> pa.Table:
    if name in table.schema.names:
        raise GrpoError(f"{label}: already has a field {name}, the name of the column grpo-cli derives")
    return table.append_column(name, values)


TABLE = "the table"
"""The name a table held in memory (``of_table``) goes by in messages."""


def _at(label: str, row: int, word: str = "line") -> str:
    """Where the 0-based ``row`` of a dump file is (its 1-based line or record), or of a table
    in memory (its row, 0-based as the table API counts).

    >>> _at("3.jsonl", 0), _at(TABLE, 0)
    ('3.jsonl, line 1', 'the table, row 0')
    """
    return f"{TABLE}, row {row}" if label == TABLE else f"{label}, {word} {row + 1}"


def _one_element(table: pa.Table, name: str, label: str) -> pa.ChunkedArray:
    """A field written as one-element lists (``[x]``), as its elements."""
    column = table.column(name)
    if not pa.types.is_list(column.type) and not pa.types.is_large_list(column.type):
        raise GrpoError(f"{label}: the field {name} is {column.type}, not a one-element list")
    lengths = pc.list_value_length(column)
    wrong = pc.or_kleene(pc.is_null(lengths), pc.not_equal(lengths, 1))
    if pc.any(wrong).as_py():
        row = pc.index(wrong, True).as_py()
        raise GrpoError(f"{_at(label, row)}: the field {name} holds {lengths[row].as_py()} elements, not one")
    return pc.list_flatten(column)


def _per_token_value(table: pa.Table, advantages: str, mask: str, label: str) -> pa.Array:
    """Each row's advantage from its per-token list: the value on every token the mask keeps
    (NaN where those tokens disagree, so that a verification names the row)."""
    values = _one_element(table, advantages, label).to_pylist()
    masks = _one_element(table, mask, label).to_pylist()
    out: list[float | None] = []
    for row, (tokens, keep) in enumerate(zip(values, masks, strict=True)):
        if tokens is None or keep is None or len(tokens) != len(keep):
            raise GrpoError(
                f"{_at(label, row)}: {advantages} and {mask} differ in length "
                f"({_length(tokens)} and {_length(keep)})"
            )
        kept = {float(a) for a, k in zip(tokens, keep, strict=True) if k}
        out.append(kept.pop() if len(kept) == 1 else (math.nan if kept else None))
    return pa.array(out, pa.float64())


def _length(value: Any) -> str:
    return "null" if value is None else str(len(value))


def _parsed_json(table: pa.Table, column: str, label: str) -> pa.Table:
    """A column of JSON text (prime-rl's metrics) as the values it holds (a struct of fields)."""
    if column not in table.schema.names:
        raise GrpoError(
            f"{label}: {mention('json_col')} {column!r} is not a column (columns: "
            f"{', '.join(table.schema.names[:8])})"
        )
    values = table.column(column)
    if not is_text_type(values.type):
        raise GrpoError(f"{label}: {mention('json_col')} {column!r} is {values.type}, not JSON text")
    parsed = []
    for row, text in enumerate(values.to_pylist()):
        try:
            parsed.append(None if text is None else json.loads(text))
        except json.JSONDecodeError as exc:
            raise GrpoError(
                f"{label}, row {row}: {mention('json_col')} {column!r} is not JSON ({exc.msg})"
            ) from None
    try:
        array = pa.array(parsed)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise GrpoError(
            f"{label}: {mention('json_col')} {column!r} holds values of different kinds ({first_line(exc)})"
        ) from None
    index = table.schema.get_field_index(column)
    return table.set_column(index, column, array)
