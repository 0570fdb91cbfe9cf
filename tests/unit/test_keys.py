"""Group keys to dense IDs: exact, first-appearance order, chunk-independent."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pyarrow as pa
import pytest
import torch

from grpo_cli.arrow import keys as keys_module
from grpo_cli.arrow.columns import is_key_type, without_views
from grpo_cli.arrow.keys import GroupKeyIndex, check_key_types, fixed_width_bytes, run_starts
from grpo_cli.errors import GrpoError
from tests.conftest import run_python


@pytest.fixture(autouse=True)
def hashed_from_the_start(monkeypatch):
    """These tests target the hashed path; small inputs would otherwise use the dict."""
    monkeypatch.setattr(keys_module, "EXACT_MAX_KEYS", 0)


def encode_in_chunks(values, chunk, columns=("k",), types=None):
    index = GroupKeyIndex(list(columns))
    types = types or [None] * len(values)
    out = []
    for start in range(0, len(values[0]), chunk):
        arrays = [pa.array(v[start : start + chunk], t) for v, t in zip(values, types, strict=True)]
        out += index.encode(arrays).tolist()
    return out, index


def first_appearance_ids(rows):
    seen: dict[object, int] = {}
    return [seen.setdefault(r, len(seen)) for r in rows]


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
@pytest.mark.parametrize(
    ("values", "arrow_type"),
    [
        ([f"{random.Random(i).getrandbits(40):x}" for i in range(200)] * 2, None),
        ([random.Random(i).randint(-5, 5) * 10**12 for i in range(300)], None),
        ([2**64 - 1, 0, 2**63, 2**64 - 1, 5], pa.uint64()),
        ([1.5, -0.0, 2.5, 1.5], None),
        ([True, False, True], None),
    ],
)
def test_ids_are_first_appearance_and_chunk_independent(values, arrow_type, chunk):
    values = list(values)
    random.Random(1).shuffle(values)
    got, index = encode_in_chunks([values], chunk, types=[arrow_type])
    assert got == first_appearance_ids(values)
    assert len(index) == len(set(values))
    assert index.key_at(got[0]) == values[0]


@pytest.mark.parametrize(
    "chunks",
    [
        [[1, 2, 5], [6, 9], [10]],  # each chunk rising, each past the last: IDs follow on
        [[1, 2, 5], [5, 6], [0, 7]],  # rising chunks that start at or below a known key
        [[3, 4], [8, 6, 7], [9, 10]],  # a chunk that does not rise
        [[1, 1, 2], [2, 3]],  # a repeat in a chunk too short for runs
        [[1, 5, 3, 5]],  # above its first key, but not rising
        [[-(2**63), -1, 0, 2**63 - 1], [-5, 2**63 - 1]],
    ],
)
def test_rising_integer_chunks_get_first_appearance_ids(chunks):
    index = GroupKeyIndex(["k"])
    got = [index.encode([pa.array(chunk, pa.int64())]).tolist() for chunk in chunks]
    flat = [v for chunk in chunks for v in chunk]
    assert [i for ids in got for i in ids] == first_appearance_ids(flat)
    assert [index.key_at(i) for i in range(len(index))] == list(dict.fromkeys(flat))


def test_rising_integer_keys_need_no_sort(monkeypatch):
    def no_sort(*args, **kwargs):
        raise AssertionError("rising keys were sorted")

    index = GroupKeyIndex(["k"])
    monkeypatch.setattr(torch, "unique", no_sort)
    monkeypatch.setattr(torch, "sort", no_sort)
    chunks = ([1, 1, 2, 2], [3, 3, 7, 7], [9])  # runs of equal keys, and a single row
    got = [index.encode([pa.array(chunk, pa.int64())]).tolist() for chunk in chunks]
    assert got == [[0, 0, 1, 1], [2, 2, 3, 3], [4]]


@pytest.mark.parametrize("exact", [False, True])
def test_composite_keys_differ_in_any_column(exact):
    index = GroupKeyIndex(["a", "b"], exact=exact)
    a, b = ["x", "x", "y", "x"], [1, 2, 1, 1]
    assert index.encode([pa.array(a), pa.array(b)]).tolist() == [0, 1, 2, 0]
    assert [index.key_at(i) for i in range(3)] == [("x", 1), ("x", 2), ("y", 1)]


def test_composite_keys():
    rng = random.Random(2)
    a = [rng.choice(["x", "y", "z"]) for _ in range(500)]
    b = [rng.randint(0, 4) for _ in range(500)]
    got, index = encode_in_chunks([a, b], 64, columns=("a", "b"))
    assert got == first_appearance_ids(list(zip(a, b, strict=True)))
    assert index.key_at(0) == (a[0], b[0])


def test_hash_collision_falls_back_to_exact_matching(monkeypatch):
    # Make every row hash alike: the check against the representatives must catch it.
    def constant_hashes(self, table):
        return torch.zeros(table.num_rows, dtype=torch.int64)

    monkeypatch.setattr(GroupKeyIndex, "_row_hashes", constant_hashes)
    values = ["a", "b", "a", "c", "b", "d"]
    got, index = encode_in_chunks([values], 2)
    assert got == first_appearance_ids(values)
    assert len(index) == 4
    assert index._exact is not None


@pytest.mark.parametrize(
    ("width", "data_type"),
    [
        (8, pa.string()),  # whole uint64 words
        (32, pa.large_string()),
        (12, pa.binary()),  # bytes
        (None, pa.string()),  # lengths differ: compared by polars
    ],
)
def test_a_hash_collision_is_caught_whatever_the_keys_width(monkeypatch, width, data_type):
    """Keys of one byte length are compared as rows of bytes; one differing byte, at either
    end, is a collision, never a merge."""
    real = GroupKeyIndex._row_hashes

    def colliding(self, table):  # the two keys that differ only in their last (or first) byte collide
        hashes = real(self, table)
        text = table.column(0).to_pylist()
        return torch.where(torch.tensor([v[1:-1] == base[1:-1] for v in text]), 7, hashes)

    size = width or 10
    as_value = (lambda text: text.encode()) if data_type == pa.binary() else (lambda text: text)
    base = as_value("u" * size)
    others = [as_value("w" * (size if width else i + 3)) for i in range(4)]
    last, first = as_value("u" * (size - 1) + "v"), as_value("v" + "u" * (size - 1))
    values = [others[0], base, others[1], last, base, first, others[2], last, others[3], first]
    monkeypatch.setattr(GroupKeyIndex, "_row_hashes", colliding)
    monkeypatch.setattr("grpo_cli.arrow.keys.EXACT_MAX_KEYS", 0)  # hash from the first chunk on
    got, index = encode_in_chunks([values], 3, types=[data_type])
    assert got == first_appearance_ids(values)
    assert index._exact is not None  # the collision was seen, and matching went on by value


def test_collision_in_a_later_chunk_keeps_earlier_ids(monkeypatch):
    real = GroupKeyIndex._row_hashes
    calls = {"n": 0}

    def sometimes_constant(self, table):
        calls["n"] += 1
        hashes = real(self, table)
        return torch.zeros_like(hashes) if calls["n"] == 2 else hashes

    monkeypatch.setattr(GroupKeyIndex, "_row_hashes", sometimes_constant)
    values = ["a", "b", "c", "a", "d", "e", "b", "f"]
    got, _ = encode_in_chunks([values], 3)
    assert got == first_appearance_ids(values)


def test_key_type_change_between_chunks_is_cast_or_refused():
    index = GroupKeyIndex(["k"])
    index.encode([pa.array([1, 2], pa.int32())])
    assert index.encode([pa.array([2, 3], pa.int64())]).tolist() == [1, 2]
    with pytest.raises(TypeError, match="change type"):
        index.encode([pa.array(["x"])])


def test_large_shuffled_strings_match_a_dict():
    rng = np.random.default_rng(3)
    uids = [f"{x:032x}" for x in rng.integers(0, 2**62, 5000)]
    rows = [uids[i] for i in rng.integers(0, 5000, 40000)]
    got, _ = encode_in_chunks([rows], 8192)
    assert got == first_appearance_ids(rows)


def test_exact_mode_gives_the_same_ids():
    rng = random.Random(5)
    rows = [rng.choice(["a", "b", "c", "d"]) for _ in range(300)]
    hashed, _ = encode_in_chunks([rows], 50)
    index = GroupKeyIndex(["k"], exact=True)
    exact = [
        i for start in range(0, 300, 50) for i in index.encode([pa.array(rows[start : start + 50])]).tolist()
    ]
    assert exact == hashed == first_appearance_ids(rows)
    assert index.key_at(exact[-1]) == rows[-1]


# --------------------------------------------------------------------------- runs of equal keys


def grouped(keys, rng, *, max_run=9):
    """Each key as a run of 1..max_run rows, runs in order, some keys coming back later."""
    rows = []
    for key in keys:
        rows += [key] * rng.randint(1, max_run)
        if rng.random() < 0.2 and rows:
            rows += [rng.choice(rows)] * rng.randint(1, 3)  # a key seen in a second run
    return rows


@pytest.mark.parametrize("chunk", [1, 5, 64, 100_000])
@pytest.mark.parametrize(
    ("keys", "arrow_type"),
    [
        ([f"uid-{i:05d}" for i in range(400)], None),
        (list(range(-200, 200)), None),
        ([2**64 - 1 - i for i in range(300)], pa.uint64()),
        ([0.0, -0.0, 1.5, 0.0, 2.5, -0.0], None),
        ([b"\x00a", b"\x00b", b""], None),
        ([i * 10**9 + 1 for i in range(100)], pa.timestamp("ns")),
    ],
)
def test_runs_of_equal_keys_are_matched_by_their_first_row(monkeypatch, keys, arrow_type, chunk):
    rows = grouped(keys, random.Random(chunk))
    got, index = encode_in_chunks([rows], chunk, types=[arrow_type])
    expected = first_appearance_ids(rows)
    assert got == expected
    monkeypatch.setattr(keys_module, "run_starts", lambda table: None)
    without_runs, _ = encode_in_chunks([rows], chunk, types=[arrow_type])
    assert got == without_runs
    assert len(index) == len(set(rows))


def test_composite_keys_in_runs_split_where_either_column_changes():
    a = ["p"] * 6 + ["q"] * 6 + ["p"] * 3
    b = [0, 0, 0, 1, 1, 1] * 2 + [1, 1, 1]
    got, index = encode_in_chunks([a, b], 1000, columns=("a", "b"))
    assert got == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 1, 1, 1]
    assert index.key_at(3) == ("q", 1)


def test_a_hash_collision_between_run_heads_is_still_caught(monkeypatch):
    def constant_hashes(self, table):
        return torch.zeros(table.num_rows, dtype=torch.int64)

    monkeypatch.setattr(GroupKeyIndex, "_row_hashes", constant_hashes)
    rows = ["a"] * 4 + ["b"] * 4 + ["a"] * 2 + ["c"] * 4
    got, _ = encode_in_chunks([rows], 1000)
    assert got == first_appearance_ids(rows)


def test_run_detection_is_skipped_where_it_does_not_pay():

    assert run_starts(pa.table({"k": ["a", "b", "c", "a"]})) is None  # every row starts a run
    assert run_starts(pa.table({"k": ["a"]})) is None
    nested = pa.table({"k": pa.array([[1], [1], [2], [2]])})
    assert run_starts(nested) is None  # list keys: matched whole
    starts = run_starts(pa.table({"k": [1, 1, 2, 2]}))
    assert starts is not None and starts.tolist() == [0, 2]
    shuffled_start = pa.table({"k": [str(i) for i in range(5000)] + ["x"] * 100_000})
    assert run_starts(shuffled_start) is None  # judged on the first rows


def test_run_detection_is_judged_on_the_first_rows_then_on_all():
    probe = keys_module.RUN_PROBE_ROWS
    two_rows = run_starts(pa.table({"k": ["a", "a"]}))
    assert two_rows is not None and two_rows.tolist() == [0]  # two rows, one run
    # the first rows in one run, then too many short runs for the whole to pay
    runs_then_shuffled = pa.table({"k": ["x"] * probe + [str(i) for i in range(10_000)]})
    assert run_starts(runs_then_shuffled) is None
    # ... but enough rows after the first ones to pay: the first rows alone decide
    runs_then_some = pa.table({"k": ["x"] * probe + [str(i) for i in range(3_000)]})
    starts = run_starts(runs_then_some)
    assert starts is not None and starts.tolist() == [0, *range(probe, probe + 3_000)]
    # one row more than half of the first rows start a run: judged on exactly those rows
    pairs = ["u"] + [f"p{i // 2}" for i in range(probe)] + ["z"] * 20_000
    assert run_starts(pa.table({"k": pairs})) is None


def test_runs_are_matched_by_their_first_rows_only(monkeypatch):
    seen = []
    encode_table = GroupKeyIndex._encode_table

    def spy(self, table):
        seen.append(table.column("k").to_pylist())
        return encode_table(self, table)

    monkeypatch.setattr(GroupKeyIndex, "_encode_table", spy)
    index = GroupKeyIndex(["k"])
    assert index.encode([pa.array(["a"] * 5 + ["b"] * 3 + ["a"] * 2)]).tolist() == [0] * 5 + [1] * 3 + [0] * 2
    assert seen == [["a", "b", "a"]]


@pytest.mark.parametrize("exact", [False, True])
def test_an_empty_chunk_gives_no_ids_and_no_groups(exact):
    index = GroupKeyIndex(["k"], exact=exact)
    ids = index.encode([pa.array([], pa.string())])
    assert ids.dtype == np.int64 and ids.shape == (0,) and len(index) == 0
    assert index.encode([pa.array(["b", "a", "b"])]).tolist() == [0, 1, 0]
    assert index.encode([pa.array([], pa.string())]).shape == (0,) and len(index) == 2


def test_distinct_keys_stay_on_the_hashed_path():
    """Only a real 64-bit collision switches to matching values in a dict (slower, same IDs)."""
    rows = [f"uid-{i}" for i in range(3000)] * 2
    random.Random(9).shuffle(rows)
    got, index = encode_in_chunks([rows], 1000)
    assert got == first_appearance_ids(rows)
    assert index._exact is None, "a false collision sent the index to exact matching"


def test_an_empty_index_has_no_key_to_show():
    with pytest.raises(IndexError, match="no group keys seen yet"):
        GroupKeyIndex(["k"]).key_at(0)


def test_few_keys_are_matched_in_a_dict_then_hashed_when_they_grow(monkeypatch):
    monkeypatch.setattr(keys_module, "EXACT_MAX_KEYS", 100)
    rows = [f"uid-{i}" for i in range(150)] * 2
    random.Random(4).shuffle(rows)
    index = GroupKeyIndex(["k"])
    first = index.encode([pa.array(rows[:60])]).tolist()
    assert index._exact is not None  # 60 keys: a dict
    rest = index.encode([pa.array(rows[60:])]).tolist()
    assert index._exact is None  # more than 100: hashed, the dict's keys carried over
    assert first + rest == first_appearance_ids(rows)


def test_a_collision_among_the_dicts_keys_keeps_the_dict(monkeypatch):
    monkeypatch.setattr(keys_module, "EXACT_MAX_KEYS", 3)

    def constant_hashes(self, table):
        return torch.zeros(table.num_rows, dtype=torch.int64)

    monkeypatch.setattr(GroupKeyIndex, "_row_hashes", constant_hashes)
    rows = ["a", "b", "a", "c", "d", "b", "e"]
    got, index = encode_in_chunks([rows], 3)
    assert got == first_appearance_ids(rows)
    assert index._exact is not None


def test_integer_keys_need_no_dict():
    index = GroupKeyIndex(["k"])
    assert index.encode([pa.array([5, 5, 9])]).tolist() == [0, 0, 1]
    assert index._exact is None


def test_key_table_has_one_row_per_group_in_id_order():
    template = pa.table({"k": ["template"], "other": [1]})  # its rows are never keys
    index = GroupKeyIndex(["k"])
    empty = index.key_table(template)
    assert empty.schema == pa.schema([("k", pa.string())]) and empty.num_rows == 0
    index.encode([pa.array(["b", "a", "b", "c"])])
    assert index.key_table(template).column("k").to_pylist() == ["b", "a", "c"]


@pytest.mark.parametrize(
    "arrow_type", [pa.date32(), pa.time32("s"), pa.date64(), pa.timestamp("ns")], ids=str
)
def test_temporal_keys_of_every_width_group_on_their_storage(arrow_type):
    values = [1, 1, 2, 1, 3]
    if arrow_type == pa.date64():
        values = [v * 86_400_000 for v in values]
    got, index = encode_in_chunks([values], 2, types=[arrow_type])
    assert got == [0, 0, 1, 0, 2]
    assert len(index) == 3


@pytest.mark.parametrize(
    ("data_type", "is_key"),
    [
        (None, False),  # no such column
        (pa.null(), False),
        (pa.int32(), True),
        (pa.dictionary(pa.int32(), pa.string()), True),
        (pa.struct([]), False),
        (pa.struct([("role", pa.string())]), True),
        (pa.struct([("role", pa.string()), ("content", pa.null())]), False),
        (pa.list_(pa.string()), True),
        (pa.large_list(pa.string()), True),
        (pa.list_(pa.int64(), 2), True),  # fixed size
        (pa.large_list(pa.null()), False),
        (pa.map_(pa.string(), pa.int32()), False),
        (pa.sparse_union([pa.field("a", pa.int32())]), False),
        (pa.month_day_nano_interval(), False),  # no compare, no cast: refused before any work
        (pa.float16(), True),
        (pa.uuid(), True),
    ],
)
def test_which_types_can_be_group_keys(data_type, is_key):

    assert is_key_type(data_type) is is_key


def schemas_of(*types):
    return [(f"{i}.parquet", pa.schema([("k", t), ("reward", pa.float64())])) for i, t in enumerate(types)]


@pytest.mark.parametrize(
    "types",
    [
        (pa.int32(), pa.int64(), pa.uint8()),
        (pa.float32(), pa.float64()),
        (pa.string(), pa.large_string(), pa.string_view(), pa.dictionary(pa.int32(), pa.string())),
        (pa.binary(), pa.large_binary(), pa.binary_view()),
    ],
)
def test_key_types_of_one_kind_may_mix_across_shards(types):

    check_key_types(schemas_of(*types), ["k"])


@pytest.mark.parametrize(
    "types",
    [
        (pa.int64(), pa.string()),
        (pa.int64(), pa.float64()),
        (pa.string(), pa.binary()),
        (pa.date32(), pa.timestamp("s")),
    ],
)
def test_key_types_of_different_kinds_are_refused(types):

    with pytest.raises(GrpoError) as raised:
        check_key_types(schemas_of(*types), ["k"])
    assert raised.value.message == (
        f"group column 'k' is {types[0]} in 0.parquet but {types[1]} in 1.parquet; "
        "keys of different types would be cast and merged: make them one type"
    )


def test_key_types_are_checked_past_empty_and_narrow_schemas_and_per_column():

    composite = pa.schema([("a", pa.int64()), ("b", pa.string())])
    check_key_types([("0.parquet", composite), ("1.parquet", composite)], ["a", "b"])
    empty = ("empty.jsonl", pa.schema([]))
    only_key = [(f"{i}.parquet", pa.schema([("k", t)])) for i, t in enumerate((pa.int64(), pa.string()))]
    with pytest.raises(GrpoError, match="would be cast and merged"):
        check_key_types([empty, *only_key], ["k"])
    with pytest.raises(GrpoError, match="would be cast and merged"):
        check_key_types(schemas_of(pa.int64(), pa.string()), ["absent", "k"])


NAN = float("nan")


@pytest.mark.parametrize(
    ("arrays", "expected"),
    [
        ([pa.array([1, 2, 3])], None),
        ([pa.array(["a", None, None])], ("k", 1, "null", 2)),
        ([pa.array([1.0, NAN, 2.0, NAN])], ("k", 1, "NaN", 2)),
        ([pa.array([0.5, 0.5, NAN]).dictionary_encode()], ("k", 2, "NaN", 1)),
        ([pa.chunked_array([[1.0], [2.0, NAN]])], ("k", 2, "NaN", 1)),
        # a NaN anywhere inside a list or struct key
        ([pa.array([[1.0], [2.0, NAN], [NAN]])], ("k", 1, "NaN-holding", 2)),
        ([pa.array([{"x": 1.0}, {"x": 2.0}, {"x": NAN}])], ("k", 2, "NaN-holding", 1)),
        ([pa.array([{"x": NAN, "y": 1.0}, {"x": 2.0, "y": 3.0}])], ("k", 0, "NaN-holding", 1)),
        (
            [pa.array([[0.5], [NAN, 0.5]], pa.list_(pa.dictionary(pa.int8(), pa.float64())))],
            ("k", 1, "NaN-holding", 1),
        ),
        (
            [pa.chunked_array([pa.array([[{"x": 1.0}]]), pa.array([[{"x": 2.0}], [{"x": NAN}]])])],
            ("k", 2, "NaN-holding", 1),
        ),
        (
            [pa.array([{"role": "a", "w": [[1.0], [NAN]]}, {"role": "b", "w": [[2.0]]}])],
            ("k", 0, "NaN-holding", 1),
        ),
        ([pa.array([[1.0], [NAN]], pa.list_(pa.float32(), 1))], ("k", 1, "NaN-holding", 1)),
        ([pa.array([[NAN], [1.0], [NAN]]).slice(1)], ("k", 1, "NaN-holding", 1)),
        ([pa.chunked_array([[[1.0]], [[2.0], [NAN]]])], ("k", 2, "NaN-holding", 1)),
        ([pa.array([[1.0], []]), pa.array([[NAN], []])], ("j", 0, "NaN-holding", 1)),
        # nulls inside a list are values like any other; strings hold no NaN
        ([pa.array([[None], [1.0]], pa.list_(pa.float64()))], None),
        ([pa.array([["nan"], ["a"]])], None),
    ],
)
def test_the_first_invalid_key_names_its_column_row_and_count(arrays, expected):
    names = ["k", "j"][: len(arrays)]
    assert keys_module.first_invalid_key(names, arrays) == expected


def test_the_first_invalid_key_is_in_the_first_column_that_has_one():
    arrays = [pa.array([1.0, 2.0, 3.0]), pa.array([None, 1, 2]), pa.array([NAN, 1.0, 2.0])]
    assert keys_module.first_invalid_key(["a", "b", "c"], arrays) == ("b", 0, "null", 1)


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize(
    ("array", "message"),
    [
        (pa.array([1.0, None]), "group key 'k' is null at row 1 of the chunk"),
        (pa.array([NAN, 1.0]), "group key 'k' is NaN at row 0 of the chunk"),
        (pa.array([[1.0], [1.0], [NAN]]), "group key 'k' holds a NaN at row 2 of the chunk"),
    ],
)
def test_invalid_keys_are_refused_on_every_path(exact, array, message):
    """A NaN inside a list never equals itself in Python: the dict would split its group."""
    index = GroupKeyIndex(["k"], exact=exact)
    with pytest.raises(keys_module.InvalidKeyError) as raised:
        index.encode([array])
    assert str(raised.value) == message
    assert len(index) == 0


NUMERIC_ARRAYS = [
    pa.array([1, -2, 3], pa.int8()),
    pa.array([0, 255, 7], pa.uint8()),
    pa.array([2**63 + 5, 1], pa.uint64()),
    pa.array([-(2**62), 2**62], pa.int64()),
    pa.array([0.5, -1.5, 2.25], pa.float32()),
    pa.array([1e300, -0.0], pa.float64()),
    pa.array([True, False, True, True, False, False, True, False, True]),
    pa.array([10, 20, 30, 40], pa.int16()).slice(1, 2),
    pa.array([True, False, True, True, False, False, True, False, True]).slice(3, 5),
    pa.array([1.0, 2.0, 3.0]).slice(2),
]


@pytest.mark.parametrize("array", NUMERIC_ARRAYS, ids=lambda a: f"{a.type}[{a.offset}:{a.offset + len(a)}]")
@pytest.mark.parametrize("chunks", [None, 1, 2, 3])
def test_numpy_of_gives_the_values_and_dtype_of_any_numeric_array(array, chunks):
    expected = np.array(array.to_pylist(), dtype=array.type.to_pandas_dtype())
    if chunks is not None:  # the same values over `chunks` chunks, the last ones possibly empty
        cuts = [len(array) * i // chunks for i in range(chunks + 1)]
        array = pa.chunked_array([array.slice(a, b - a) for a, b in itertools.pairwise(cuts)], array.type)
    values = keys_module.numpy_of(array)
    assert values.dtype == expected.dtype and values.tolist() == expected.tolist()


def test_numpy_of_views_one_chunk_in_place():
    backing = np.arange(10, dtype=np.int64)
    array = pa.array(backing).slice(3, 4)
    for view in (keys_module.numpy_of(array), keys_module.numpy_of(pa.chunked_array([array]))):
        assert view.tolist() == [3, 4, 5, 6] and np.shares_memory(view, backing)


@pytest.mark.parametrize(
    ("array", "expected"),
    [
        (pa.array([1, None, 3]), [1.0, None, 3.0]),  # nulls: through to_numpy, as NaN
        (pa.chunked_array([[1, 2], [None]]), [1.0, 2.0, None]),
        (pa.chunked_array([], pa.int64()), []),
        (pa.array(["a", "b"]), ["a", "b"]),
        (pa.chunked_array([["a"], ["b", "c"]]), ["a", "b", "c"]),
    ],
)
def test_numpy_of_takes_other_arrays_through_arrow(array, expected):
    values = keys_module.numpy_of(array)
    assert [None if isinstance(v, float) and np.isnan(v) else v for v in values.tolist()] == expected


def test_numpy_of_leaves_pandas_unimported_for_numeric_arrays():
    """pyarrow's to_numpy imports pandas when it is installed: a quarter of a second of start-up."""

    # called here too, so that mutmut maps this test to numpy_of (it records calls in-process)
    assert keys_module.numpy_of(keys_module.arrow_of(np.array([1.5]))).tolist() == [1.5]
    code = (
        "import sys, numpy as np, pyarrow as pa; from grpo_cli.arrow.keys import arrow_of, numpy_of; "
        "arrays = [arrow_of(np.array(v)) for v in ([1, 2], [1.5], [True, False], np.array([1], np.uint8))]; "
        "arrays += [a.slice(1) for a in arrays] + [pa.chunked_array([a, a]) for a in arrays]; "
        "[numpy_of(a) for a in arrays]; "
        "print('pandas' in sys.modules)"
    )
    result = run_python(code, check=True)
    assert result.stdout.strip() == "False"


def test_a_dict_holds_exactly_its_limit_before_hashing(monkeypatch):
    monkeypatch.setattr(keys_module, "EXACT_MAX_KEYS", 4)
    index = GroupKeyIndex(["k"])
    assert index.encode([pa.array(["a", "b", "c", "d"])]).tolist() == [0, 1, 2, 3]
    assert index._exact is not None  # four keys: still the dict
    assert index.encode([pa.array(["d", "e"])]).tolist() == [3, 4]
    assert index._exact is None


def test_exact_mode_never_hashes(monkeypatch):
    def no_hashing(self, table):
        raise AssertionError("exact=True hashed a key")

    monkeypatch.setattr(GroupKeyIndex, "_row_hashes", no_hashing)
    rows = [f"uid-{i % 7}" for i in range(50)]
    got: list[int] = []
    index = GroupKeyIndex(["k"], exact=True)
    for start in range(0, len(rows), 9):
        got += index.encode([pa.array(rows[start : start + 9])]).tolist()
    assert got == first_appearance_ids(rows)


@pytest.mark.parametrize("exact", [False, True])
def test_dictionary_keys_match_on_their_values_whatever_each_chunks_dictionary(exact):
    """Each chunk (and each Arrow chunk within one) may carry its own dictionary."""
    chunks = [
        pa.chunked_array(
            [
                pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), pa.array(["a", "b"])),
                pa.DictionaryArray.from_arrays(pa.array([1, 0], pa.int32()), pa.array(["a", "c"])),
            ]
        ),
        pa.DictionaryArray.from_arrays(pa.array([0, 1, 2], pa.int32()), pa.array(["c", "b", "a"])),
        pa.array(["d", "a"]),
    ]
    index = GroupKeyIndex(["k"], exact=exact)
    got = [index.encode([chunk]).tolist() for chunk in chunks]
    assert got == [[0, 1, 0, 2, 0], [2, 1, 0], [3, 0]]
    assert [index.key_at(i) for i in range(len(index))] == ["a", "b", "c", "d"]
    assert index.key_table(pa.table({"k": chunks[2]})).schema.field("k").type == pa.string()


def _near_duplicates() -> list[pa.Array]:
    """Columns whose values differ by the smallest step their type has, with repeats."""
    import datetime
    import decimal

    ns = pa.time64("ns")
    return [
        pa.array([1, 2, 1, 3], pa.time64("ns")),
        pa.array([1, 2, 1, 2], pa.timestamp("ns", "UTC")),
        pa.array([1, 2, 1, 2], pa.duration("ns")),
        pa.array([1, 2, 1, 2], pa.date64()),
        pa.array(
            [{"t": 1, "s": "a"}, {"t": 2, "s": "a"}, {"t": 1, "s": "a"}],
            pa.struct([("t", ns), ("s", pa.string())]),
        ),
        pa.array([[1], [2], [1], [1, 2]], pa.list_(pa.timestamp("ns"))),
        pa.array([[{"d": 1}], [{"d": 2}], [{"d": 1}]], pa.list_(pa.struct([("d", pa.duration("us"))]))),
        pa.array([[1, 2], [1, 3], [1, 2]], pa.list_(pa.time32("ms"), 2)),
        pa.array([0.1, 0.1 + 2**-56, 0.1, -0.0, 0.0]),
        pa.array([{"x": 0.0}, {"x": -0.0}, {"x": 1e-300}]),
        pa.array(
            [decimal.Decimal("1.01"), decimal.Decimal("1.02"), decimal.Decimal("1.01")], pa.decimal128(5, 2)
        ),
        pa.array(["a", "a ", "a", "A"]),
        pa.array([b"\x00", b"\x00\x00", b"\x00"]),
        pa.array(["x", "y", "x"]).dictionary_encode(),
        pa.array([[datetime.date(2026, 1, 1)], [datetime.date(2026, 1, 2)], [datetime.date(2026, 1, 1)]]),
        pa.array([True, False, True]),
        pa.array([2**63, 2**63 + 1, 2**63], pa.uint64()),
    ]


@pytest.mark.parametrize("column", _near_duplicates(), ids=lambda a: str(a.type))
def test_the_dict_path_and_the_hashed_path_agree_on_every_key_type(column):
    """Python's datetime holds microseconds: the dict path merged struct keys of time64[ns] a
    nanosecond apart that the hashed path kept apart."""
    hashed = GroupKeyIndex(["k"]).encode([column]).tolist()
    exact = GroupKeyIndex(["k"], exact=True).encode([column]).tolist()
    assert exact == hashed


def _views_and_their_plain_types() -> list[tuple[pa.Array, pa.DataType]]:
    """Polars writes text to Arrow files as views; pyarrow's take has no kernel for them."""
    sv, bv = pa.string_view(), pa.binary_view()
    return [
        (pa.array(["b", "a", "b", "c", "a "], sv), pa.large_string()),
        (pa.array([b"\x00", b"\x00\x00", b"\x00"], bv), pa.large_binary()),
        (
            pa.array(
                [{"p": "x", "n": 1}, {"p": "y", "n": 1}, {"p": "x", "n": 1}],
                pa.struct([("p", sv), ("n", pa.int64())]),
            ),
            None,
        ),
        (pa.array([["a"], ["a", "b"], ["a"]], pa.list_(sv)), None),
        (pa.array([[("k", "v")], [("k", "w")], [("k", "v")]], pa.map_(sv, sv)), None),
    ]


@pytest.mark.parametrize(
    ("column", "plain"), _views_and_their_plain_types(), ids=lambda v: str(getattr(v, "type", v))
)
@pytest.mark.parametrize("exact", [False, True])
def test_view_keys_group_as_the_same_values_of_plain_types(column, plain, exact):
    expected = first_appearance_ids([json.dumps(v, default=repr) for v in column.to_pylist()])
    index = GroupKeyIndex(["k"], exact=exact)
    assert index.encode([column.slice(0, 2)]).tolist() + index.encode([column.slice(2)]).tolist() == expected
    assert index.key_at(0) == column[0].as_py()
    if plain is not None:
        assert without_views(column.type) == plain
        assert GroupKeyIndex(["k"], exact=exact).encode([column.cast(plain)]).tolist() == expected


@pytest.mark.parametrize("exact", [False, True])
def test_float16_and_extension_keys_group_on_their_values(exact):
    import uuid

    halves = pa.array([0.5, 1.5, 0.5, -0.0, 0.0], pa.float16())
    # as float32 and float64 keys: -0.0 and 0.0 are one value
    assert GroupKeyIndex(["k"], exact=exact).encode([halves]).tolist() == [0, 1, 0, 2, 2]
    ids = [uuid.UUID(int=i).bytes for i in (1, 2, 1)]
    uuids = pa.ExtensionArray.from_storage(pa.uuid(), pa.array(ids, pa.binary(16)))
    index = GroupKeyIndex(["k"], exact=exact)
    assert index.encode([pa.chunked_array([uuids])]).tolist() == [0, 1, 0]
    assert index.key_at(1) == ids[1]


def test_nested_temporal_keys_a_nanosecond_apart_are_two_groups():
    key = pa.struct([("t", pa.time64("ns")), ("s", pa.string())])
    column = pa.array([{"t": 1, "s": "a"}, {"t": 2, "s": "a"}, {"t": 1, "s": "a"}], key)
    assert GroupKeyIndex(["k"], exact=True).encode([column]).tolist() == [0, 1, 0]


@pytest.mark.parametrize("data_type", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
@pytest.mark.parametrize("width", [1, 8, 12, 32])
@pytest.mark.parametrize("start", [0, 3])
def test_fixed_width_bytes_is_each_values_bytes_row_by_row(data_type, width, start):
    """The fast compare reads each value's own bytes, in a slice too; a None would only be slower,
    a wrong row would pass a collision."""
    texts = [bytes([65 + (i * 7 + j) % 26 for j in range(width)]) for i in range(9)]
    values = [
        t if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type) else t.decode()
        for t in texts
    ]
    array = pa.array(values, data_type).slice(start)
    rows = fixed_width_bytes(pa.chunked_array([array]))
    assert rows is not None
    assert rows.shape == (9 - start, width // 8 if width % 8 == 0 and start * width % 8 == 0 else width)
    assert [
        row.tobytes() for row in np.ascontiguousarray(rows).view(np.uint8).reshape(9 - start, width)
    ] == texts[start:]


@pytest.mark.parametrize(
    "array",
    [
        pa.array(["ab", "cd", None]),  # a null
        pa.array(["ab", "cde"]),  # two lengths
        pa.array(["abc", "de", "fgh"]),  # lengths that add up to a width times the rows
        pa.array(["", ""]),  # empty values
        pa.array([], pa.string()),
        pa.array([1, 2]),
        pa.array(["ab", "cd"], pa.string_view()),
    ],
)
def test_fixed_width_bytes_declines_what_it_cannot_read_as_rows(array):
    assert fixed_width_bytes(array) is None


def test_fixed_width_rows_differ_wherever_the_bytes_do():
    """Compared as integers, never as floats: as float64 the words of these two keys would be
    +0.0 and -0.0, which compare equal."""
    rows = fixed_width_bytes(pa.array([b"\0" * 8, b"\0" * 7 + b"\x80"]))
    assert rows is not None and not np.array_equal(rows[0], rows[1])


def test_a_collision_in_a_composite_key_is_caught_beyond_its_first_column(monkeypatch):
    monkeypatch.setattr(
        GroupKeyIndex, "_row_hashes", lambda self, table: torch.zeros(table.num_rows, dtype=torch.int64)
    )
    monkeypatch.setattr("grpo_cli.arrow.keys.EXACT_MAX_KEYS", 0)
    a, b = ["uid-a", "uid-a", "uid-b", "uid-a"], [1, 2, 1, 1]
    got, _ = encode_in_chunks([a, b], 2, columns=("a", "b"))
    assert got == first_appearance_ids(list(zip(a, b, strict=True)))


def test_uniform_width_keys_in_many_chunks_stay_on_the_hashed_path(monkeypatch):
    """A chunk's key column arrives in several Arrow chunks: read whole, it shows no false
    collision (which would send every later chunk to the slow exact dict)."""
    monkeypatch.setattr("grpo_cli.arrow.keys.EXACT_MAX_KEYS", 0)
    index = GroupKeyIndex(["uid"])
    for start in range(0, 60, 20):
        parts = [pa.array([f"{(start + i) % 25:08d}" for i in range(j, j + 10)]) for j in (0, 10)]
        index.encode([pa.chunked_array(parts)])
    assert index._exact is None and len(index) == 25


@pytest.mark.parametrize("kind", ["string", "int", "bool", "large_string", "float", "dictionary"])
@pytest.mark.parametrize("distinct", [1, 3, 40, 100_000])
def test_few_values_match_each_chunk_once_with_the_ids_of_every_row(kind, distinct):
    """An index of few values (--by, --batch-col) matches each chunk's distinct values once,
    in their order of first appearance, which gives every row the ID matching it alone gives;
    where the values are as many as the rows it matches the rows, from then on too."""
    rng = np.random.default_rng(distinct)
    few, plain = GroupKeyIndex(["v"], few_values=True), GroupKeyIndex(["v"])
    for rows, runs in ((300, False), (2000, True), (5000, False), (100, False), (3000, True)):
        values = rng.integers(0, distinct, rows)
        if runs:  # a value per group of 8 rows, as a sorted dump holds them
            values = np.repeat(values[: rows // 8], 8)
        if kind == "int":
            array = pa.array(values * 7 - 11)
        elif kind == "bool":
            array = pa.array(values % 2 == 0)
        elif kind == "float":
            array = pa.array(values * 0.5)
        elif kind == "dictionary":
            array = pa.array([f"source-{v}" for v in values]).dictionary_encode()
        else:
            array = pa.array(
                [f"source-{v}" for v in values], pa.large_string() if kind == "large_string" else None
            )
        chunked = pa.chunked_array([array.slice(0, rows // 3), array.slice(rows // 3)])
        assert few.encode([chunked]).tolist() == plain.encode([chunked]).tolist()
    assert len(few) == len(plain)
    assert [few.key_at(i) for i in range(len(few))] == [plain.key_at(i) for i in range(len(plain))]
    if kind != "bool":  # many values: the rows were matched after the first chunk
        assert few._few_values == (distinct < 100_000)


def test_few_values_keep_zero_and_negative_zero_as_one_as_the_index_does():
    few, plain = GroupKeyIndex(["v"], few_values=True), GroupKeyIndex(["v"])
    array = pa.array([-0.0, 0.0, 1.5] * 200)  # Arrow's dictionary holds both zeros
    assert few.encode([array]).tolist() == plain.encode([array]).tolist() == [0, 0, 1] * 200
