"""Group keys to dense group IDs, exactly, in order of first appearance.

Keys may be one column or several, of any scalar type or lists and structs of them, and
are compared on their exact values, whatever the input size: temporal keys on their
integer storage (nanoseconds apart are two groups), floats numerically (``-0.0`` and
``0.0`` are one group). Null and NaN keys are refused, and so are list or struct keys with
a NaN anywhere inside: NaN never equals itself. Integer keys are matched on their values.
A run of equal keys (a dump keeps a group's rows together) is matched by its first row
only. Other keys are matched in a dict while there are few, then hashed to 64 bits per
row (polars' vectorised row hash); then every row's key is compared with its group's
representative key, so a hash collision is caught, never silently merged, and the index
falls back to matching the key values themselves.

Matching is sort-based and vectorised (torch): each chunk's distinct hashes are found
with ``torch.unique`` and merged into the sorted hashes seen so far with one sort, so a
chunk costs O((n + K) log(n + K)) whatever the order of the rows.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from grpo_cli.arrow.columns import (
    field_type,
    holds_type,
    is_text_type,
    with_leaves,
    without_views,
)


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A zero-copy tensor view of a (possibly read-only) NumPy array.

    Arrow buffers are read-only; grpo-cli never writes into tensors made from them.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def arrow_of(values: np.ndarray) -> pa.Array:
    """A NumPy array of numbers or bools as an Arrow array, without nulls.

    ``pa.array`` would import pandas (pyarrow checks for pandas input), a quarter of a
    second of every run's start-up where pandas is installed.

    >>> arrow_of(np.array([True, False, True])).to_pylist(), arrow_of(np.arange(3)).type
    ([True, False, True], DataType(int64))
    """
    values = np.ascontiguousarray(values)
    if values.dtype == np.bool_:
        bits = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def scalar_of(value: float | int | bool, data_type: pa.DataType) -> pa.Scalar:
    """An Arrow scalar of a numeric ``data_type`` (what a compute function compares with),
    without pandas: ``pa.scalar`` and a plain Python number passed to ``pyarrow.compute``
    import it, as ``pa.array`` would.

    >>> scalar_of(1 << 53, pa.int64()), scalar_of(float("nan"), pa.float32()).type
    (<pyarrow.Int64Scalar: 9007199254740992>, DataType(float))
    """
    return arrow_of(np.array([value], dtype=data_type.to_pandas_dtype()))[0]


def numpy_of(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An Arrow array of numbers or bools without nulls as NumPy (a view where it can be).

    ``to_numpy`` would import pandas, as ``pa.array`` would. Other arrays go through it.

    >>> numpy_of(pa.chunked_array([[1, 2], [3]])), numpy_of(pa.array([True, False]).slice(1))
    (array([1, 2, 3]), array([False]))
    """
    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks == 1:
            return numpy_of(array.chunk(0))
        if array.num_chunks == 0 or array.null_count:
            return np.asarray(array.to_numpy())
        return np.concatenate([numpy_of(chunk) for chunk in array.chunks])
    data_type = array.type
    if array.null_count or not (
        pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or pa.types.is_boolean(data_type)
    ):
        return np.asarray(array.to_numpy(zero_copy_only=False))
    buffer = array.buffers()[1]
    if pa.types.is_boolean(data_type):
        bits = np.frombuffer(buffer, dtype=np.uint8)
        unpacked = np.unpackbits(bits, bitorder="little", count=array.offset + len(array))
        return unpacked[array.offset :].view(bool)
    kind = "f" if pa.types.is_floating(data_type) else "i" if pa.types.is_signed_integer(data_type) else "u"
    dtype = np.dtype(f"{kind}{data_type.bit_width // 8}")
    return np.frombuffer(buffer, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _comparable(data_type: pa.DataType) -> pa.DataType:
    """The type a key column is compared in: a temporal type's integer storage (Python objects
    drop nanoseconds), string and binary views as their ``large_`` types (pyarrow takes and
    hashes no views), an extension type's storage (a UUID's 16 bytes), float16 as float32 (the
    same values; pyarrow does not compare float16).

    >>> _comparable(pa.timestamp("ns")), _comparable(pa.string_view()), _comparable(pa.float16())
    (DataType(int64), DataType(large_string), DataType(float))
    """
    storage = _temporal_storage(data_type)
    data_type = storage if storage is not None else without_views(data_type)
    if isinstance(data_type, pa.BaseExtensionType):
        data_type = data_type.storage_type
    return pa.float32() if pa.types.is_float16(data_type) else data_type


class InvalidKeyError(ValueError):
    """A null or NaN group key, or a list or struct key with a NaN inside: NaN never equals
    itself, so such a key cannot name a group."""

    def __init__(self, column: str, row: int, what: str, count: int) -> None:
        self.column, self.row, self.what, self.count = column, row, what, count
        self.description = "holds a NaN" if what == "NaN-holding" else f"is {what}"
        super().__init__(f"group key {column!r} {self.description} at row {row} of the chunk")


def first_invalid_key(
    names: Sequence[str], arrays: Sequence[pa.Array | pa.ChunkedArray]
) -> tuple[str, int, str, int] | None:
    """The first null or NaN key: (column, row in the chunk, what, how many), where what is
    ``"null"``, ``"NaN"``, or ``"NaN-holding"`` (a list or struct key with a NaN inside)."""
    for name, array in zip(names, arrays, strict=True):
        if array.null_count:
            return name, int(pc.index(array.is_null(), True).as_py()), "null", array.null_count
        value_type = array.type.value_type if pa.types.is_dictionary(array.type) else array.type
        if pa.types.is_floating(value_type):
            nan = pc.is_nan(array.cast(value_type) if value_type != array.type else array)
            count = pc.sum(nan).as_py() or 0
            if count:
                return name, int(pc.index(nan, True).as_py()), "NaN", int(count)
        elif pa.types.is_nested(value_type) and holds_type(value_type, pa.types.is_floating):
            holding = _rows_holding_nan(array)
            if holding.any():
                return name, int(holding.argmax()), "NaN-holding", int(holding.sum())
    return None


def _rows_holding_nan(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """One bool per row of a float, list or struct array: whether a NaN lies anywhere in it."""
    if pa.types.is_dictionary(array.type):
        array = array.cast(array.type.value_type)
    data_type = array.type
    if pa.types.is_floating(data_type):
        return numpy_of(pc.fill_null(pc.is_nan(array), False))
    holding = np.zeros(len(array), dtype=bool)
    if pa.types.is_struct(data_type):
        for i in range(data_type.num_fields):
            if holds_type(data_type.field(i).type, pa.types.is_floating):
                holding |= _rows_holding_nan(pc.struct_field(array, [i]))
    elif holds_type(data_type, pa.types.is_floating):  # a list: its values, traced back to their rows
        values_holding = _rows_holding_nan(pc.list_flatten(array))
        holding[numpy_of(pc.list_parent_indices(array))[values_holding]] = True
    return holding


def key_kind(data_type: pa.DataType) -> str:
    """Key types that compare equal after a lossless cast share a kind (int32 and int64)."""
    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    if pa.types.is_integer(data_type):
        return "integer"
    if pa.types.is_floating(data_type):
        return "floating point"
    if is_text_type(data_type):
        return "string"
    if (
        pa.types.is_binary(data_type)
        or pa.types.is_large_binary(data_type)
        or pa.types.is_binary_view(data_type)
    ):
        return "binary"
    return str(data_type)


def check_key_types(schemas: Sequence[tuple[str, pa.Schema]], columns: Sequence[str]) -> None:
    """Refuse shards whose key columns are of different kinds: casting would merge groups.

    ``schemas`` pairs each shard's name with its schema; an empty schema (a JSONL file
    with no records) is skipped. Raises :class:`~grpo_cli.errors.GrpoError`.
    """
    from grpo_cli.errors import GrpoError

    first: dict[str, tuple[str, pa.DataType]] = {}
    for shard, schema in schemas:
        if len(schema) == 0:
            continue
        for column in columns:
            data_type = field_type(schema, column)
            if data_type is None:
                continue
            seen = first.setdefault(column, (shard, data_type))
            if key_kind(seen[1]) != key_kind(data_type):
                raise GrpoError(
                    f"group column {column!r} is {seen[1]} in {seen[0]} but {data_type} in {shard}; "
                    "keys of different types would be cast and merged: make them one type"
                )


RUN_PROBE_ROWS = 4096
FEW_VALUES_MIN_ROWS = 256  # below, a chunk's rows are matched as they are
EXACT_MAX_KEYS = 1 << 16  # fewer keys are matched in a dict: no hashing library to import


def run_starts(table: pa.Table) -> np.ndarray | None:
    """The rows where a run of equal keys starts, when runs are long enough to pay.

    Rollout dumps keep a group's rows together: matching only each run's first row is
    exact (the other rows compare equal to it, value by value) and costs one comparison
    per row instead of a hash and a sort. ``None`` for shuffled keys (runs shorter than
    two rows on average, judged on the first rows), a single row, or list and struct keys.

    >>> run_starts(pa.table({"uid": ["a", "a", "b", "b", "b", "a"]})).tolist()
    [0, 2, 5]
    """
    rows = table.num_rows
    if rows < 2 or any(pa.types.is_nested(t) for t in table.schema.types):
        return None
    probe = min(rows, RUN_PROBE_ROWS)
    if (1 + int(_changed(table.slice(0, probe)).sum())) * 2 > probe:
        return None
    changed = _changed(table)
    starts = np.flatnonzero(np.concatenate(([True], changed)))
    return starts if starts.size * 2 <= rows else None


def _changed(table: pa.Table) -> np.ndarray:
    """Per row after the first: whether its key differs from the row before."""
    rows = table.num_rows
    changed = np.zeros(rows - 1, dtype=bool)
    for column in table.columns:
        differs = pc.not_equal(column.slice(1), column.slice(0, rows - 1))
        changed |= numpy_of(differs)
    return changed


def row_hashes(table: pa.Table) -> np.ndarray:
    """A 64-bit hash of each row's key, int64 ``(rows,)``, the same in every process of one
    installation: a single integer column is its own hash (its values as int64); other keys
    are hashed by polars with a fixed seed. ``table`` holds the key columns, normalised as
    :class:`GroupKeyIndex` holds them (no dictionaries, one comparable type per column).

    >>> row_hashes(pa.table({"g": pa.array([3, -1], pa.int32())})).tolist()
    [3, -1]
    """
    if table.num_columns == 1 and pa.types.is_integer(table.column(0).type):
        column = table.column(0)
        if column.type == pa.uint64():
            values = numpy_of(column).view(np.int64)  # a bijection onto int64
        else:
            values = numpy_of(pc.cast(column, pa.int64()))
        return np.ascontiguousarray(values)
    import polars as pl

    frame = pl.from_arrow(table, rechunk=False)
    assert isinstance(frame, pl.DataFrame)
    return frame.hash_rows(seed=0).to_numpy().view(np.int64)


def key_buckets(table: pa.Table, buckets: int) -> np.ndarray:
    """Each row's bucket in ``0 .. buckets - 1`` by its key's :func:`row_hashes` (mixed, so that
    consecutive integer keys spread evenly): equal keys always share a bucket.

    >>> buckets = key_buckets(pa.table({"g": [7, 8, 7]}), 4).tolist()
    >>> buckets[0] == buckets[2], all(0 <= b < 4 for b in buckets)
    (True, True)
    """
    hashes = row_hashes(table).view(np.uint64)
    mixed = (hashes * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
    return (mixed % np.uint64(buckets)).astype(np.int64)


@dataclass(frozen=True)
class EncodedKeys:
    """One chunk's group IDs: ``ids`` (int64, one per row) and, where the chunk's rows came in
    runs of one key (sorted or grouped input), ``runs``: each run's ID and its first row (int64),
    else ``None``."""

    ids: np.ndarray
    runs: tuple[np.ndarray, np.ndarray] | None = None


class GroupKeyIndex:
    """Maps group-key rows to dense int64 IDs ``0..K-1`` in order of first appearance.

    The mapping depends only on the rows and their order, never on how they were split
    into chunks.

    >>> index = GroupKeyIndex(["uid"])
    >>> index.encode([pa.array(["b", "a", "b"])]).tolist()
    [0, 1, 0]
    >>> index.encode([pa.array(["c", "a"])]).tolist(), len(index), index.key_at(2)
    ([2, 1], 3, 'c')
    """

    def __init__(self, columns: Sequence[str], *, exact: bool = False, few_values: bool = False) -> None:
        """Key values are matched in a Python dict while there are few (``EXACT_MAX_KEYS``,
        counting each chunk's rows), then by 64-bit hashes checked against each group's
        first key. ``exact=True`` keeps the dict whatever the size.

        ``few_values``: one column whose values are few next to its rows (``--by``,
        ``--batch-col``: a value per group). Each chunk's distinct values are found first
        (Arrow's dictionary encoding, which lists them in order of first appearance, so the
        IDs are those of matching every row) and only those are matched, for as long as they
        are at most half the rows."""
        self.columns = tuple(columns)
        self._few_values = few_values and len(self.columns) == 1
        self._types: list[pa.DataType] | None = None
        # the known hashes, sorted, and their IDs: pieces laid end to end (joined when searched)
        self._hash_parts: list[torch.Tensor] = []
        self._id_parts: list[torch.Tensor] = []
        self._rep_chunks: list[pa.Table] = []
        self._reps: pa.Table | None = None
        self._count = 0
        # Keys are matched in a dict until there are too many for it: hashing (polars) then
        # pays for its import. exact=True, or a hash collision, keeps the dict for good.
        self._exact: dict[Any, int] | None = {}
        self._stay_exact = exact

    def __len__(self) -> int:
        return self._count

    def key_table(self, empty_like: pa.Table) -> pa.Table:
        """One row per group, in ID order: the key columns (``empty_like``'s, if no group yet)."""
        if not self._count:
            return empty_like.select(list(self.columns)).slice(0, 0)
        return self._representatives()

    def key_at(self, group_id: int) -> Any:
        """The key of a group: a scalar, or a tuple for a composite key."""
        row = self._representatives().slice(group_id, 1).to_pylist()[0]
        values = tuple(row[c] for c in self.columns)
        return values[0] if len(values) == 1 else values

    def encode(self, arrays: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
        """Dense int64 IDs for one chunk of key columns (no nulls, no NaN)."""
        return self.encode_runs(arrays).ids

    def encode_runs(self, arrays: Sequence[pa.Array | pa.ChunkedArray]) -> EncodedKeys:
        """:meth:`encode`'s IDs, with the runs of one key the chunk came in, where it did.

        >>> GroupKeyIndex(["uid"]).encode_runs([pa.array(["b", "b", "a", "a"])]).runs
        (array([0, 1]), array([0, 2]))
        """
        invalid = first_invalid_key(self.columns, arrays)
        if invalid is not None:
            raise InvalidKeyError(*invalid)
        table = self._normalise(arrays)
        if table.num_rows == 0:
            return EncodedKeys(np.empty(0, dtype=np.int64))
        starts = run_starts(table)
        if starts is not None:
            # Each run's rows equal its first row exactly: match the first rows only.
            of_runs = self._encode_distinct(table.take(arrow_of(starts)))
            lengths = np.diff(starts, append=table.num_rows)
            return EncodedKeys(np.repeat(of_runs, lengths), (of_runs, starts))
        return EncodedKeys(self._encode_distinct(table))

    def _encode_distinct(self, table: pa.Table) -> np.ndarray:
        """IDs of ``table``'s rows; with ``few_values``, its distinct values matched once."""
        if self._few_values and table.num_rows >= FEW_VALUES_MIN_ROWS:
            try:
                encoded = pc.dictionary_encode(table.column(0).combine_chunks())
            except pa.ArrowNotImplementedError:  # a type Arrow cannot encode: match the rows
                self._few_values = False
                return self._encode_table(table)
            # Arrow may tell apart values the index takes as one (0.0 and -0.0): the distinct
            # values go through the index, which joins them again
            if len(encoded.dictionary) * 2 <= table.num_rows:
                ids = self._encode_table(pa.table([encoded.dictionary], names=list(self.columns)))
                of_rows: np.ndarray = ids[numpy_of(encoded.indices)]
                return of_rows
            self._few_values = False  # values as many as rows: match the rows from now on
        return self._encode_table(table)

    def _encode_table(self, table: pa.Table) -> np.ndarray:
        grows_past_a_dict = not self._hashed or len(self._exact or ()) + table.num_rows > EXACT_MAX_KEYS
        if self._exact is not None and not self._stay_exact and grows_past_a_dict:
            self._start_hashing()
        if self._exact is not None:
            return self._encode_exact(table)
        saved = (list(self._hash_parts), list(self._id_parts), list(self._rep_chunks), self._count)
        ids = self._encode_hashed(table)
        if not self._hashed or self._matches_representatives(table, ids):
            return ids.numpy()
        # A 64-bit hash collision: undo this chunk and match on the values from now on.
        self._hash_parts, self._id_parts, self._rep_chunks, self._count = saved
        self._reps = None
        self._exact = self._exact_lookup()
        self._stay_exact = True
        return self._encode_exact(table)

    def _start_hashing(self) -> None:
        """Leave the dict for the sorted hashes of the keys seen so far (kept on a collision)."""
        if self._count:
            hashes, order = torch.sort(self._row_hashes(self._representatives()))
            if bool((hashes[1:] == hashes[:-1]).any()):
                self._stay_exact = True
                return
            self._hash_parts, self._id_parts = [hashes], [order]
        self._exact = None

    # ----------------------------------------------------------------- hashing

    @property
    def _hashed(self) -> bool:
        assert self._types is not None
        return not (len(self._types) == 1 and pa.types.is_integer(self._types[0]))

    def _normalise(self, arrays: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Table:
        columns = [a.cast(a.type.value_type) if pa.types.is_dictionary(a.type) else a for a in arrays]
        columns = [c if (same := _comparable(c.type)) == c.type else c.cast(same) for c in columns]
        if self._types is None:
            self._types = [c.type for c in columns]
        else:
            try:
                columns = [c if c.type == t else c.cast(t) for c, t in zip(columns, self._types, strict=True)]
            except (pa.ArrowException, ValueError) as exc:
                raise TypeError(f"group keys change type between shards: {exc}") from None
        return pa.table(columns, names=list(self.columns))

    def _row_hashes(self, table: pa.Table) -> torch.Tensor:
        return as_tensor(row_hashes(table))

    def _encode_hashed(self, table: pa.Table) -> torch.Tensor:
        hashes = self._row_hashes(table)
        if self._all_new_in_order(hashes):
            # Sorted integer keys (or their run heads): every key is new and comes in
            # order, so the IDs follow on and the sorted hashes grow at the end.
            ids = torch.arange(self._count, self._count + hashes.numel())
            self._hash_parts.append(hashes)  # joined only when a chunk is searched: no copy per chunk
            self._id_parts.append(ids)
            self._add_groups(table)
            return ids
        n = hashes.numel()
        uniques, inverse = torch.unique(hashes, sorted=True, return_inverse=True)
        first_row = torch.full((uniques.numel(),), n, dtype=torch.int64).scatter_reduce_(
            0, inverse, torch.arange(n), "amin"
        )
        # Each distinct hash of the chunk is looked up among the known ones (a binary search);
        # the new ones are then merged in by position, so the known hashes stay sorted.
        known, known_ids = self._sorted()
        k = known.numel()
        position = torch.searchsorted(known, uniques)
        found = torch.zeros(uniques.numel(), dtype=torch.bool)
        if k:
            found = (position < k) & (known[position.clamp(max=k - 1)] == uniques)
        unique_ids = torch.empty(uniques.numel(), dtype=torch.int64)
        unique_ids[found] = known_ids[position[found]]
        new = torch.nonzero(~found).flatten()
        by_appearance = new[torch.argsort(first_row[new])]
        unique_ids[by_appearance] = torch.arange(self._count, self._count + new.numel())
        if new.numel():
            self._add_groups(table.take(arrow_of(first_row[by_appearance].numpy())))
            slots = position[new] + torch.arange(new.numel())  # where each new hash lands
            is_new = torch.zeros(k + new.numel(), dtype=torch.bool)
            is_new[slots] = True
            merged = torch.empty(k + new.numel(), dtype=torch.int64)
            merged_ids = torch.empty(k + new.numel(), dtype=torch.int64)
            merged[is_new], merged_ids[is_new] = uniques[new], unique_ids[new]
            merged[~is_new], merged_ids[~is_new] = known, known_ids
            self._hash_parts, self._id_parts = [merged], [merged_ids]
        return unique_ids[inverse]

    def _all_new_in_order(self, values: torch.Tensor) -> bool:
        """Whether ``values`` (one chunk's, never empty) rise strictly, from above every
        value already known."""
        rising = bool((values[1:] > values[:-1]).all())
        return rising and (not self._hash_parts or bool(values[0] > self._hash_parts[-1][-1]))

    def _sorted(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The known hashes, sorted, and their IDs, each one tensor."""
        if not self._hash_parts:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        if len(self._hash_parts) > 1:
            self._hash_parts, self._id_parts = [torch.cat(self._hash_parts)], [torch.cat(self._id_parts)]
        return self._hash_parts[0], self._id_parts[0]

    def _add_groups(self, keys: pa.Table) -> None:
        """New groups, one row of ``keys`` each, take the next IDs."""
        self._rep_chunks.append(keys)
        self._reps = None
        self._count += keys.num_rows

    def _representatives(self) -> pa.Table:
        if self._reps is None:
            if not self._rep_chunks:
                raise IndexError("no group keys seen yet")
            self._reps = pa.concat_tables(self._rep_chunks).combine_chunks()
            self._rep_chunks = [self._reps]
        return self._reps

    def _matches_representatives(self, table: pa.Table, ids: torch.Tensor) -> bool:
        if len(self.columns) == 1:
            row_bytes = fixed_width_bytes(table.column(0))
            rep_bytes = (
                fixed_width_bytes(self._representatives().column(0)) if row_bytes is not None else None
            )
            if row_bytes is not None and rep_bytes is not None and row_bytes.shape[1] == rep_bytes.shape[1]:
                # keys of one byte length (uids, hashes): whole rows of bytes, gathered and compared
                return bool(np.array_equal(row_bytes, np.take(rep_bytes, ids.numpy(), axis=0)))
        # polars gathers and compares on all cores, about 4x faster than pyarrow here
        import polars as pl

        reps = pl.from_arrow(self._representatives(), rechunk=False)
        rows = pl.from_arrow(table, rechunk=False)
        assert isinstance(reps, pl.DataFrame) and isinstance(rows, pl.DataFrame)
        index = pl.Series(ids.numpy())
        for name in self.columns:
            same = rows.get_column(name) == reps.get_column(name).gather(index)
            if same.null_count() or not same.all():
                return False
        return True

    # ----------------------------------------------------------------- exact fallback

    def _exact_lookup(self) -> dict[Any, int]:
        if not self._rep_chunks:
            return {}
        reps = self._representatives()
        return {key: gid for gid, key in enumerate(self._python_keys(reps))}

    def _python_keys(self, table: pa.Table) -> list[Any]:
        columns = []
        for c in self.columns:
            values = table.column(c)
            storage = integer_storage(values.type)
            columns.append((values if storage.equals(values.type) else values.cast(storage)).to_pylist())
        nested = [pa.types.is_nested(table.schema.field(c).type) for c in self.columns]
        columns = [
            [_frozen(v) for v in values] if n else values for values, n in zip(columns, nested, strict=True)
        ]
        return columns[0] if len(columns) == 1 else list(zip(*columns, strict=True))

    def _encode_exact(self, table: pa.Table) -> np.ndarray:
        lookup = self._exact
        assert lookup is not None
        ids = np.empty(table.num_rows, dtype=np.int64)
        new_rows = []
        for row, key in enumerate(self._python_keys(table)):
            gid = lookup.get(key)
            if gid is None:
                gid = len(lookup)
                lookup[key] = gid
                new_rows.append(row)
            ids[row] = gid
        if new_rows:
            self._add_groups(table.take(arrow_of(np.asarray(new_rows, dtype=np.int64))))
        return ids


def fixed_width_bytes(values: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """A string or binary column without nulls whose values all have one byte length ``L``,
    as one row per value of its bytes: ``(N, L // 8)`` uint64 words when ``L`` and the first
    value's offset are multiples of 8, else ``(N, L)`` uint8; ``None`` for any other column.
    Two values are equal exactly when their rows are (integers, never floats: ``-0.0 == 0.0``).

    >>> fixed_width_bytes(pa.array(["ab", "cd"])).tolist(), fixed_width_bytes(pa.array(["a", "bc"]))
    ([[97, 98], [99, 100]], None)
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    kind = values.type
    if values.null_count or not (
        pa.types.is_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_large_binary(kind)
    ):
        return None
    n = len(values)
    _, offset_buffer, data = values.buffers()
    wide = pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)
    if n == 0:
        return None
    offsets = np.frombuffer(offset_buffer, np.int64 if wide else np.int32)
    offsets = offsets[values.offset : values.offset + n + 1]
    width = int(offsets[1] - offsets[0])
    if width == 0 or not bool((np.diff(offsets) == width).all()):
        return None
    raw = np.frombuffer(data, np.uint8)[int(offsets[0]) : int(offsets[-1])]
    if width % 8 == 0 and int(offsets[0]) % 8 == 0:
        return raw.view(np.uint64).reshape(n, width // 8)
    return raw.reshape(n, width)


def integer_storage(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` with every temporal type inside replaced by its integer storage: Python's
    ``datetime``, ``time`` and ``timedelta`` hold microseconds, so two keys a nanosecond apart
    would be one dict key.

    >>> integer_storage(pa.struct([("t", pa.time64("ns")), ("d", pa.date32()), ("s", pa.string())]))
    StructType(struct<t: int64, d: int32, s: string>)
    """
    return with_leaves(data_type, _temporal_storage)


def _temporal_storage(data_type: pa.DataType) -> pa.DataType | None:
    if not pa.types.is_temporal(data_type):
        return None
    return pa.int32() if data_type.bit_width == 32 else pa.int64()


def _frozen(value: Any) -> Any:
    """A list or struct value as nested tuples, so that it can be a dict key (exact match)."""
    if isinstance(value, list):
        return ("list", *(_frozen(v) for v in value))
    if isinstance(value, dict):
        return ("struct", *((k, _frozen(v)) for k, v in value.items()))
    return value
