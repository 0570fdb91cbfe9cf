"""Column references and type helpers (``grpo_cli.arrow.columns``): a nested field found at any
depth, the fields and types a type holds, and rows taken or filtered whatever their type."""

from __future__ import annotations

import pyarrow as pa
import pytest

from grpo_cli.arrow.columns import (
    MAX_NESTING,
    filter_rows,
    find_field,
    holds_type,
    is_text_type,
    leaf_fields,
    plain_schema,
    take_rows,
    text_kernel_input,
    without_views,
)


def _nested(depth: int) -> pa.DataType:
    data_type: pa.DataType = pa.float64()
    for _ in range(depth):
        data_type = pa.struct([("f", data_type)])
    return data_type


def test_a_field_is_found_at_any_depth_under_the_longest_top_level_name():
    schema = pa.schema(
        [
            ("a", pa.struct([("b", pa.struct([("c", pa.float64())]))])),
            ("x.y", pa.struct([("z", pa.int64())])),
            ("p", pa.struct([("q", pa.int64())])),
            ("p.q", pa.int64()),
        ]
    )
    assert find_field(schema, "a.b.c") == ("a", ("b", "c"))
    assert find_field(schema, "a.b") == ("a", ("b",))
    assert find_field(schema, "x.y.z") == ("x.y", ("z",))
    assert find_field(schema, "p.q") == ("p.q", ())  # a top-level name wins over a nested field
    assert find_field(schema, "a.b.d") is None
    assert find_field(schema, "a.c") is None


def test_leaf_fields_name_each_struct_field_to_the_nesting_limit_and_no_list_item():
    schema = pa.schema(
        [
            ("meta", pa.struct([("score", pa.float64()), ("tags", pa.list_(pa.string()))])),
            ("tokens", pa.list_(pa.struct([("id", pa.int64())]))),
            ("deep", _nested(MAX_NESTING + 2)),
        ]
    )
    fields = leaf_fields(schema)
    assert list(fields)[:5] == ["meta", "meta.score", "meta.tags", "tokens", "deep"]
    assert fields["meta.tags"] == pa.list_(pa.string())
    assert "tokens.item" not in fields and "meta.tags.item" not in fields
    deepest = max((name for name in fields if name.startswith("deep")), key=len)
    assert deepest.count(".") == MAX_NESTING
    assert fields[deepest] == _nested(2)


@pytest.mark.parametrize(
    "data_type",
    [
        pa.list_view(pa.float32()),
        pa.large_list_view(pa.float32()),
        pa.list_(pa.float32()),
        pa.large_list(pa.float32()),
        pa.list_(pa.float32(), 2),
        pa.map_(pa.string(), pa.float32()),
        pa.struct([("x", pa.float32())]),
        pa.dictionary(pa.int32(), pa.float32()),
        pa.run_end_encoded(pa.int32(), pa.float32()),
    ],
)
def test_a_float_inside_any_container_is_found(data_type):
    assert holds_type(data_type, pa.types.is_floating)
    assert not holds_type(data_type, pa.types.is_decimal)


def test_text_types_and_the_kernels_input():
    assert [is_text_type(t) for t in (pa.string(), pa.large_string(), pa.string_view(), pa.binary())] == [
        True,
        True,
        True,
        False,
    ]
    views = pa.array(["a_1", None], pa.string_view())
    assert text_kernel_input(views).type == pa.large_string()
    assert text_kernel_input(views).to_pylist() == ["a_1", None]
    plain = pa.array(["a"])
    assert text_kernel_input(plain) is plain


def test_views_become_their_large_types_at_any_depth_and_the_schema_keeps_its_metadata():
    sv, bv = pa.string_view(), pa.binary_view()
    assert without_views(pa.map_(sv, pa.list_(bv, 2))) == pa.map_(
        pa.large_string(), pa.list_(pa.large_binary(), 2)
    )
    assert without_views(pa.large_list(pa.struct([("s", sv)]))) == pa.large_list(
        pa.struct([("s", pa.large_string())])
    )
    assert without_views(pa.list_(sv)) == pa.list_(pa.large_string())
    assert without_views(pa.list_view(sv)) == pa.list_view(sv)  # left: see with_leaves
    schema = pa.schema([("t", sv), ("n", pa.int64())], metadata={b"k": b"v"})
    assert plain_schema(schema) == pa.schema([("t", pa.large_string()), ("n", pa.int64())])
    assert plain_schema(schema).metadata == {b"k": b"v"}


@pytest.mark.parametrize(
    "values",
    [
        pa.array(["a", "b", None, "d"], pa.string_view()),
        pa.array([b"a", b"b", None, b"d"], pa.binary_view()),
        pa.array([{"s": "a"}, {"s": "b"}, None, {"s": "d"}], pa.struct([("s", pa.string_view())])),
        pa.array(["a", "b", None, "d"]),
        pa.array([1, 2, None, 4]),
    ],
    ids=lambda a: str(a.type),
)
def test_rows_are_taken_and_filtered_whatever_their_type_and_keep_it(values):
    table = pa.table({"v": values, "n": [0, 1, 2, 3]}).replace_schema_metadata({"k": "v"})
    taken = take_rows(table, [3, 0, 3])
    assert taken.column("v").to_pylist() == [values[3].as_py(), values[0].as_py(), values[3].as_py()]
    assert taken.schema == table.schema and taken.schema.metadata == {b"k": b"v"}
    kept = filter_rows(table.to_batches()[0], pa.array([False, True, True, False]))
    assert kept.column(0).to_pylist() == values.to_pylist()[1:3]
    assert kept.schema == table.schema
    for array in (values, pa.chunked_array([values])):
        assert take_rows(array, pa.array([1])).to_pylist() == [values[1].as_py()]
        assert filter_rows(array, [True, False, False, True]).type == values.type


def test_a_column_or_nested_field_is_read_null_where_its_parent_is():
    from grpo_cli.arrow.columns import column_of

    meta = pa.array([{"score": 0.5}, None, {"score": 1.0}], pa.struct([("score", pa.float64())]))
    batch = pa.record_batch([meta, pa.array([1, 2, 3])], names=["meta", "n"])
    assert column_of(batch, "meta.score").to_pylist() == [0.5, None, 1.0]
    assert column_of(pa.Table.from_batches([batch]), "n").to_pylist() == [1, 2, 3]
    with pytest.raises(KeyError):
        column_of(batch, "meta.missing")


@pytest.mark.parametrize(
    ("data_type", "numeric"),
    [
        (pa.int8(), True),
        (pa.uint64(), True),
        (pa.float16(), True),
        (pa.bool_(), True),
        (pa.decimal128(5, 2), True),
        (pa.string(), False),
        (pa.timestamp("s"), False),
        (pa.list_(pa.float64()), False),
    ],
)
def test_which_types_hold_numbers_a_reward_can_be(data_type, numeric):
    from grpo_cli.arrow.columns import is_numeric_type

    assert is_numeric_type(data_type) is numeric


def test_the_top_level_columns_to_read_for_names_once_each_in_order():
    from grpo_cli.arrow.columns import top_level

    schema = pa.schema([("n", pa.int64()), ("meta", pa.struct([("a", pa.int64()), ("b", pa.int64())]))])
    assert top_level(schema, ["meta.b", "n", "meta.a", "missing", "meta"]) == ["meta", "n", "missing"]
