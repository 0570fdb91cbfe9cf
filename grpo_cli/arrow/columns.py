"""Column references: a top-level column, or a struct field addressed with dots.

Trainer exports nest their scores (``{"reward": {"score": 1.0, "format": 0.5}}``):
``reward.score`` names the ``score`` field of the struct column ``reward``. A top-level
column whose own name holds a dot wins over a nested field of the same spelling, and
the longest top-level prefix is tried first.

>>> schema = pa.schema([("reward", pa.struct([("score", pa.float64())])), ("a.b", pa.int64())])
>>> find_field(schema, "reward.score")
('reward', ('score',))
>>> find_field(schema, "a.b"), find_field(schema, "reward.missing")
(('a.b', ()), None)
>>> batch = pa.record_batch([pa.array([{"score": 0.5}, None]), pa.array([1, 2])], schema=schema)
>>> column_of(batch, "reward.score").to_pylist()
[0.5, None]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc


def find_field(schema: pa.Schema, name: str) -> tuple[str, tuple[str, ...]] | None:
    """``(top-level column, struct field path)`` that ``name`` addresses, or ``None``."""
    if name in schema.names:
        return name, ()
    parts = name.split(".")
    for split in range(len(parts) - 1, 0, -1):
        top = ".".join(parts[:split])
        if top not in schema.names:
            continue
        data_type = schema.field(top).type
        path = []
        for part in parts[split:]:
            if not pa.types.is_struct(data_type) or data_type.get_field_index(part) < 0:
                break
            data_type = data_type.field(part).type
            path.append(part)
        else:
            return top, tuple(path)
    return None


def field_type(schema: pa.Schema, name: str) -> pa.DataType | None:
    """The type of the column or nested field ``name`` addresses, or ``None``."""
    found = find_field(schema, name)
    if found is None:
        return None
    data_type = schema.field(found[0]).type
    for part in found[1]:
        data_type = data_type.field(part).type
    return data_type


def column_of(data: pa.RecordBatch | pa.Table, name: str) -> pa.Array | pa.ChunkedArray:
    """The values of the column or nested field ``name`` (null where a parent struct is null).

    Raises :class:`KeyError` when ``name`` addresses nothing in ``data``.
    """
    found = find_field(data.schema, name)
    if found is None:
        raise KeyError(name)
    top, path = found
    values = data.column(top)
    return pc.struct_field(values, list(path)) if path else values


def leaf_fields(schema: pa.Schema) -> dict[str, pa.DataType]:
    """Every column, and every field of a struct column addressed with dots, with its type.

    >>> leaf_fields(pa.schema([("meta", pa.struct([("score", pa.float64())])), ("uid", pa.string())]))
    {'meta': StructType(struct<score: double>), 'meta.score': DataType(double), 'uid': DataType(string)}
    """
    out: dict[str, pa.DataType] = {}
    stack = [(field.name, field.type) for field in reversed(list(schema))]
    while stack:
        name, data_type = stack.pop()
        out[name] = data_type
        if pa.types.is_struct(data_type) and name.count(".") < MAX_NESTING:
            stack.extend(
                (f"{name}.{data_type.field(i).name}", data_type.field(i).type)
                for i in reversed(range(data_type.num_fields))
            )
    return out


def top_level(schema: pa.Schema, names: Sequence[str]) -> list[str]:
    """The top-level columns to read for ``names`` (nested fields read their struct), in order."""
    tops = []
    for name in names:
        found = find_field(schema, name)
        tops.append(found[0] if found is not None else name)
    return list(dict.fromkeys(tops))


def is_numeric_type(data_type: pa.DataType) -> bool:
    """Whether a column of ``data_type`` holds numbers a reward can be: integers, floats,
    booleans or decimals."""
    return bool(
        pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_boolean(data_type)
        or pa.types.is_decimal(data_type)
    )


def is_text_type(data_type: pa.DataType) -> bool:
    """Whether a column of ``data_type`` holds text: ``string``, ``large_string`` or
    ``string_view`` (what polars writes to Arrow files)."""
    return bool(
        pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_string_view(data_type)
    )


def text_kernel_input(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Text ``values`` as pyarrow's text kernels take them: a ``string_view`` column, which
    they do not, cast to ``large_string`` (the same characters).

    >>> text_kernel_input(pa.array(["a_1"], pa.string_view())).type
    DataType(large_string)
    """
    return values.cast(pa.large_string()) if pa.types.is_string_view(values.type) else values


def with_leaves(data_type: pa.DataType, leaf: Callable[[pa.DataType], pa.DataType | None]) -> pa.DataType:
    """``data_type`` with ``leaf(t)`` in place of each type ``t`` inside it for which ``leaf``
    gives one (``None``: keep looking inside), through structs, maps and lists of every size.
    List views are left as they are: pyarrow 26 casts a sliced one to invalid offsets.

    >>> widen = lambda t: pa.int64() if t == pa.int8() else None  # noqa: E731
    >>> with_leaves(pa.map_(pa.string(), pa.list_(pa.int8(), 2)), widen)
    MapType(map<string, fixed_size_list<item: int64>[2]>)
    """
    replaced = leaf(data_type)
    if replaced is not None:
        return replaced
    if pa.types.is_struct(data_type):
        return pa.struct([f.with_type(with_leaves(f.type, leaf)) for f in data_type])
    if pa.types.is_map(data_type):
        return pa.map_(
            data_type.key_field.with_type(with_leaves(data_type.key_type, leaf)),
            data_type.item_field.with_type(with_leaves(data_type.item_type, leaf)),
        )
    if pa.types.is_fixed_size_list(data_type):
        return pa.list_(
            data_type.value_field.with_type(with_leaves(data_type.value_type, leaf)), data_type.list_size
        )
    if pa.types.is_list(data_type):
        return pa.list_(data_type.value_field.with_type(with_leaves(data_type.value_type, leaf)))
    if pa.types.is_large_list(data_type):
        return pa.large_list(data_type.value_field.with_type(with_leaves(data_type.value_type, leaf)))
    return data_type


def without_views(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` with each string or binary view (polars' Arrow text), at any depth of a
    struct, list or map, made its ``large_`` type: the same values, which pyarrow's take and
    hash kernels accept.

    >>> without_views(pa.struct([("p", pa.string_view()), ("n", pa.list_(pa.binary_view()))]))
    StructType(struct<p: large_string, n: list<item: large_binary>>)
    """
    return with_leaves(data_type, _view_leaf)


def _view_leaf(data_type: pa.DataType) -> pa.DataType | None:
    if pa.types.is_string_view(data_type):
        return pa.large_string()
    return pa.large_binary() if pa.types.is_binary_view(data_type) else None


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with :func:`without_views` applied to each field (its metadata kept)."""
    return pa.schema([f.with_type(without_views(f.type)) for f in schema], metadata=schema.metadata)


Rows = TypeVar("Rows", pa.Table, pa.RecordBatch, pa.Array, pa.ChunkedArray)


def _through_plain_types(data: Rows, step: Callable[[Rows], Rows]) -> Rows:
    """``step(data)``, with any string or binary views cast to their ``large_`` types for it
    and back after: pyarrow 26 has no take or filter kernel for views."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        schema = data.schema
        plain = plain_schema(schema)
        return step(data) if plain == schema else step(data.cast(plain)).cast(schema)
    original = data.type
    plain_type = without_views(original)
    return step(data) if plain_type == original else step(data.cast(plain_type)).cast(original)


def take_rows(data: Rows, indices: pa.Array | Sequence[int]) -> Rows:
    """``data.take(indices)`` for columns of any type, views among them.

    >>> take_rows(pa.table({"t": pa.array(["a", "b"], pa.string_view())}), [1, 1]).to_pydict()
    {'t': ['b', 'b']}
    """
    return _through_plain_types(data, lambda plain: plain.take(indices))


def filter_rows(data: Rows, mask: pa.Array | Sequence[bool]) -> Rows:
    """``data.filter(mask)`` for columns of any type, views among them; the types are kept.

    >>> filter_rows(pa.array(["a", "b"], pa.string_view()), pa.array([False, True])).type
    DataType(string_view)
    """
    return _through_plain_types(data, lambda plain: plain.filter(mask))


def holds_type(data_type: pa.DataType, leaf: Callable[[pa.DataType], bool]) -> bool:
    """Whether ``leaf`` holds for ``data_type`` or for any type inside it (the values of
    a dictionary, list, list view or run-end encoding, the fields of a struct or union, the
    keys and items of a map, the storage of an extension type).

    >>> holds_type(pa.list_(pa.struct([("w", pa.float32())])), pa.types.is_floating)
    True
    >>> holds_type(pa.map_(pa.string(), pa.list_view(pa.binary())), pa.types.is_binary)
    True
    """
    stack = [data_type]
    while stack:  # a loop, not recursion: a JSON value may nest thousands of levels deep
        current = stack.pop()
        if leaf(current):
            return True
        stack.extend(inner_types(current))
    return False


MAX_NESTING = 64
"""The deepest a column's type may nest: deeper JSON is refused before any recursion meets it."""


def nesting_depth(data_type: pa.DataType) -> int:
    """How many types deep ``data_type`` goes (1 for a flat type).

    >>> nesting_depth(pa.int64()), nesting_depth(pa.list_(pa.struct([("a", pa.list_(pa.int8()))])))
    (1, 4)
    """
    deepest, stack = 0, [(data_type, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((inner, depth + 1) for inner in inner_types(current))
    return deepest


def inner_types(data_type: pa.DataType) -> list[pa.DataType]:
    """The types directly inside a nested ``data_type`` (none for a flat one)."""
    if isinstance(data_type, pa.BaseExtensionType):
        return [data_type.storage_type]
    if pa.types.is_dictionary(data_type):
        return [data_type.value_type]
    if pa.types.is_map(data_type):
        return [data_type.key_type, data_type.item_type]
    if pa.types.is_struct(data_type) or pa.types.is_union(data_type):
        return [data_type.field(i).type for i in range(data_type.num_fields)]
    if pa.types.is_run_end_encoded(data_type):
        return [data_type.value_type]
    if (
        pa.types.is_list(data_type)
        or pa.types.is_large_list(data_type)
        or pa.types.is_fixed_size_list(data_type)
        or pa.types.is_list_view(data_type)
        or pa.types.is_large_list_view(data_type)
    ):
        return [data_type.value_type]
    return []


def is_key_type(data_type: pa.DataType | None) -> bool:
    """Whether a column of this type can be a group key: a scalar, or a list or struct of
    them (a chat prompt as a list of messages), compared on its exact value."""
    if data_type is None or pa.types.is_null(data_type) or pa.types.is_interval(data_type):
        return False
    if pa.types.is_dictionary(data_type):
        return is_key_type(data_type.value_type)
    if pa.types.is_struct(data_type):
        return data_type.num_fields > 0 and all(
            is_key_type(data_type.field(i).type) for i in range(data_type.num_fields)
        )
    if (
        pa.types.is_list(data_type)
        or pa.types.is_large_list(data_type)
        or pa.types.is_fixed_size_list(data_type)
    ):
        return is_key_type(data_type.value_type)
    return not (pa.types.is_nested(data_type) or pa.types.is_union(data_type))
