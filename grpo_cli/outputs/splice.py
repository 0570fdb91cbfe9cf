"""Splice new columns into a Parquet file without decoding or re-encoding the others.

A spliced output is the input file's bytes up to its footer, copied by the kernel
(``os.copy_file_range``), then the new columns' chunks for each input row group (encoded
by pyarrow, one row group at a time), then a new footer. The footer is rewritten at the
level of Thrift fields with Apache Thrift's compact protocol: every field grpo-cli does
not change is copied as raw bytes, so fields of newer format versions that no library
here knows (size or geospatial statistics, ...) pass through unchanged, and the input
columns' chunks, statistics, page indexes and bloom filters stay valid because their
bytes do not move. What changes: the schema (new leaves appended, the root's child count),
each row group's column list and byte totals, the column orders, and the ``ARROW:schema``
and ``grpo_cli`` key-value entries (the others are kept as they were).
"""

from __future__ import annotations

import base64
import os
import struct
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq
from thrift.protocol.TCompactProtocol import VALUE_READ, VALUE_WRITE, TCompactProtocol
from thrift.Thrift import TType
from thrift.transport.TTransport import TTransportBase

MAGIC = b"PAR1"
ENCRYPTED_MAGIC = b"PARE"
ARROW_SCHEMA_KEY = "ARROW:schema"

# parquet.thrift field IDs, for the fields a splice reads or changes.
FILE_SCHEMA, FILE_NUM_ROWS, FILE_ROW_GROUPS, FILE_KEY_VALUES, FILE_COLUMN_ORDERS = 2, 3, 4, 5, 7
FILE_ENCRYPTION = 8
SCHEMA_NUM_CHILDREN = 5
ROW_GROUP_COLUMNS, ROW_GROUP_BYTES, ROW_GROUP_ROWS, ROW_GROUP_COMPRESSED = 1, 2, 3, 6
CHUNK_FILE_OFFSET, CHUNK_META, CHUNK_OFFSET_INDEX, CHUNK_COLUMN_INDEX = 2, 3, 4, 6
CHUNK_CRYPTO = 8
META_DATA_PAGE, META_INDEX_PAGE, META_DICTIONARY_PAGE, META_BLOOM_FILTER = 9, 10, 11, 14
KEY, VALUE = 1, 2


class SpliceRefused(Exception):
    """A file that cannot be spliced (the caller re-encodes it instead); says why."""


# --------------------------------------------------------------------------- Thrift fields


class _Bytes(TTransportBase):  # type: ignore[misc]  # Thrift ships no type hints
    """An in-memory transport that knows its position, for slicing raw field values."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = data
        self.pos = 0
        self.out: list[bytes] = []

    def read(self, sz: int) -> bytes:
        chunk = self.data[self.pos : self.pos + sz]
        self.pos += len(chunk)
        return chunk

    def write(self, buf: bytes) -> None:
        self.out.append(bytes(buf))

    def getvalue(self) -> bytes:
        return b"".join(self.out)


class _Protocol(TCompactProtocol):  # type: ignore[misc]  # Thrift ships no type hints
    """The compact protocol, reading Thrift strings as bytes: statistics hold binary.

    ``state`` (``VALUE_READ``, ``VALUE_WRITE``) starts it inside a field's value (a list
    or a scalar), as the protocol's state machine expects after a field header.
    """

    def __init__(self, transport: TTransportBase, *, state: int | None = None) -> None:
        super().__init__(transport)
        if state is not None:
            self.state = state

    def readString(self) -> bytes:
        return bytes(self.readBinary())


@dataclass
class Field:
    """One field of a Thrift struct: its ID, wire type, and raw value (a bool's value)."""

    fid: int
    ttype: int
    raw: bytes | bool


def read_struct(data: bytes) -> list[Field]:
    """The fields of the compact-protocol struct ``data``, in wire order, values raw."""
    transport = _Bytes(data)
    protocol = _Protocol(transport)
    fields: list[Field] = []
    protocol.readStructBegin()
    while True:
        _, ttype, fid = protocol.readFieldBegin()
        if ttype == TType.STOP:
            break
        if ttype == TType.BOOL:
            fields.append(Field(fid, ttype, bool(protocol.readBool())))
        else:
            start = transport.pos
            protocol.skip(ttype)
            fields.append(Field(fid, ttype, data[start : transport.pos]))
        protocol.readFieldEnd()
    protocol.readStructEnd()
    return fields


def write_struct(fields: Sequence[Field]) -> bytes:
    transport = _Bytes()
    protocol = _Protocol(transport)
    protocol.writeStructBegin(None)
    for field in fields:
        protocol.writeFieldBegin(None, field.ttype, field.fid)
        if isinstance(field.raw, bool):
            protocol.writeBool(field.raw)
        else:
            transport.write(field.raw)
        protocol.writeFieldEnd()
    protocol.writeFieldStop()
    protocol.writeStructEnd()
    return transport.getvalue()


def read_list(raw: bytes) -> tuple[int, list[bytes]]:
    """A raw list value's element type and its elements, each as raw bytes."""
    transport = _Bytes(raw)
    protocol = _Protocol(transport, state=VALUE_READ)
    element_type, size = protocol.readListBegin()
    elements = []
    for _ in range(size):
        start = transport.pos
        protocol.skip(element_type)
        elements.append(raw[start : transport.pos])
    protocol.readListEnd()
    return element_type, elements


def write_list(element_type: int, elements: Sequence[bytes]) -> bytes:
    transport = _Bytes()
    protocol = _Protocol(transport, state=VALUE_WRITE)
    protocol.writeListBegin(element_type, len(elements))
    for element in elements:
        transport.write(element)
    protocol.writeListEnd()
    return transport.getvalue()


def _read_scalar(raw: bytes, read: Callable[[_Protocol], Any]) -> Any:
    return read(_Protocol(_Bytes(raw), state=VALUE_READ))


def _encode(write: Callable[[_Protocol], None]) -> bytes:
    transport = _Bytes()
    write(_Protocol(transport, state=VALUE_WRITE))
    return transport.getvalue()


def read_int(field: Field) -> int:
    if field.ttype == TType.I64:
        return int(_read_scalar(_raw(field), lambda p: p.readI64()))
    return int(_read_scalar(_raw(field), lambda p: p.readI32()))


def int_field(fid: int, ttype: int, value: int) -> Field:
    if ttype == TType.I64:
        return Field(fid, ttype, _encode(lambda p: p.writeI64(value)))
    return Field(fid, ttype, _encode(lambda p: p.writeI32(value)))


def string_field(fid: int, value: str) -> Field:
    return Field(fid, TType.STRING, _encode(lambda p: p.writeString(value)))


def read_string(field: Field) -> str:
    return bytes(_read_scalar(_raw(field), lambda p: p.readBinary())).decode("utf-8", "surrogateescape")


def _get(fields: Sequence[Field], fid: int) -> Field | None:
    return next((f for f in fields if f.fid == fid), None)


def _replace(fields: list[Field], new: Field) -> list[Field]:
    """``fields`` with ``new`` in place of the field of its ID, or added in ID order."""
    if any(f.fid == new.fid for f in fields):
        return [new if f.fid == new.fid else f for f in fields]
    return sorted([*fields, new], key=lambda f: f.fid)


def _shift(fields: list[Field], fids: Sequence[int], by: int) -> list[Field]:
    out = list(fields)
    for fid in fids:
        field = _get(out, fid)
        if field is not None:
            out = _replace(out, int_field(fid, field.ttype, read_int(field) + by))
    return out


# --------------------------------------------------------------------------- footers


@dataclass
class Footer:
    """A Parquet file's footer: where it starts and its FileMetaData fields."""

    start: int
    fields: list[Field]

    @cached_property
    def row_groups(self) -> list[list[Field]]:
        """Each RowGroup's fields, parsed once."""
        field = _get(self.fields, FILE_ROW_GROUPS)
        return [] if field is None else [read_struct(g) for g in read_list(_raw(field))[1]]

    def row_counts(self) -> list[int]:
        return [read_int(_required(g, ROW_GROUP_ROWS, "RowGroup.num_rows")) for g in self.row_groups]


def _raw(field: Field) -> bytes:
    assert not isinstance(field.raw, bool)
    return field.raw


def _required(fields: Sequence[Field], fid: int, what: str) -> Field:
    field = _get(fields, fid)
    if field is None:
        raise SpliceRefused(f"its footer has no {what}")
    return field


def read_footer(handle: IO[bytes]) -> Footer:
    """The footer of the Parquet file open in ``handle``; refuses encrypted files."""
    size = handle.seek(0, os.SEEK_END)
    if size < 12:
        raise SpliceRefused("it is too short to be a Parquet file")
    handle.seek(size - 8)
    length, magic = struct.unpack("<I4s", handle.read(8))
    if magic == ENCRYPTED_MAGIC:
        raise SpliceRefused("it is encrypted")
    if magic != MAGIC or length > size - 12:
        raise SpliceRefused("its footer is not a Parquet footer")
    start = size - 8 - length
    handle.seek(start)
    fields = read_struct(handle.read(length))
    if _get(fields, FILE_ENCRYPTION) is not None:
        raise SpliceRefused("its columns are encrypted")
    return Footer(start, fields)


def _key_values(fields: Sequence[Field]) -> list[tuple[str, list[Field]]]:
    field = _get(fields, FILE_KEY_VALUES)
    if field is None:
        return []
    out = []
    for element in read_list(_raw(field))[1]:
        pair = read_struct(element)
        out.append((read_string(_required(pair, KEY, "KeyValue.key")), pair))
    return out


def arrow_schema_of(footer: Footer) -> pa.Schema | None:
    """The Arrow schema pyarrow stored in the footer (``ARROW:schema``), if any."""
    for key, pair in _key_values(footer.fields):
        value = _get(pair, VALUE)
        if key == ARROW_SCHEMA_KEY and value is not None:
            encoded = read_string(value)
            return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded)))
    return None


def _serialize_arrow_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


# --------------------------------------------------------------------------- the splice


COPY_PIECE_BYTES = 256 << 20  # a cancelled run stops copying within one piece


def copy_range(
    source: IO[bytes], target: IO[bytes], length: int, *, cancelled: Callable[[], bool] = lambda: False
) -> None:
    """Copy ``source``'s first ``length`` bytes to the start of ``target``, in the kernel.

    Where ``os.copy_file_range`` is missing or refuses (another file system, an old
    kernel), the rest is copied in user space. Both files are left positioned at ``length``.
    ``cancelled`` is asked between pieces; when it says so, :class:`CopyCancelled` is raised.
    """
    target.flush()
    copied = 0
    copy = getattr(os, "copy_file_range", None)
    if copy is not None:
        try:
            while copied < length:
                if cancelled():
                    raise CopyCancelled
                done = copy(
                    source.fileno(), target.fileno(), min(length - copied, COPY_PIECE_BYTES), copied, copied
                )
                if done == 0:
                    break
                copied += done
        except OSError:
            pass
    source.seek(copied)
    target.seek(copied)
    while copied < length:
        if cancelled():
            raise CopyCancelled
        chunk = source.read(min(length - copied, 16 << 20))
        if not chunk:
            raise SpliceRefused("it ended before its footer while being copied")
        target.write(chunk)
        copied += len(chunk)


ENCODERS = 2
"""Row groups of new columns a spliced file encodes at once."""


def _encoded_group(group: pa.Table, compression: str) -> bytes:
    """``group`` as a Parquet file of one row group (its footer names the chunks' offsets)."""
    sink = pa.BufferOutputStream()
    pq.write_table(
        group,
        sink,
        row_group_size=max(group.num_rows, 1),
        compression=compression,
        use_dictionary=False,
        store_schema=False,
    )
    encoded: bytes = sink.getvalue().to_pybytes()
    return encoded


class CopyCancelled(Exception):
    """The run stopped while a spliced file's prefix was being copied."""


class SplicedFile:
    """Writes ``target`` as ``source`` plus new columns, one input row group at a time.

    Made as soon as the run starts (the footer is read and checked: :class:`SpliceRefused`
    for a file that cannot be spliced). :meth:`copy_prefix` copies the input's bytes, on
    any thread, while the run computes; :meth:`begin` names the new columns once they are
    known. Then call :meth:`add` with the new columns' arrays for the next rows, in order
    (any batch sizes; it waits for the copy), then :meth:`close`. Row groups are encoded
    :data:`ENCODERS` at a time on threads of their own (pyarrow encodes without the GIL) and
    placed in order; memory holds at most ``ENCODERS + 1`` row groups of new columns.
    """

    def __init__(self, source: Path, target: IO[bytes]) -> None:
        self._source = open(source, "rb")  # noqa: SIM115 (closed in close() or abandon())
        try:
            self.footer = read_footer(self._source)
            self.row_counts = self.footer.row_counts()
            if any(count == 0 for count in self.row_counts):
                raise SpliceRefused("it has an empty row group")
            self._arrow = arrow_schema_of(self.footer)
        except BaseException:
            self._source.close()
            raise
        self._target = target
        self._copied = threading.Event()
        self._copy_error: BaseException | None = None
        self._new_schema = pa.schema([])
        self._metadata: dict[bytes, bytes] = {}
        self._compression = "snappy"
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._group = 0
        self._encoder: ThreadPoolExecutor | None = None
        self._encoding: deque[Future[bytes]] = deque()
        self._chunks: list[list[bytes]] = []
        self._totals: list[tuple[int, int]] = []
        self._leaves: list[bytes] = []
        self._orders: list[bytes] | None = None

    def copy_prefix(self, *, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Copy the input's bytes up to its footer, and flush them to disk.

        Flushed here, while the run computes, so that the commit's fsync has only the new
        columns and the footer left. An error is kept for :meth:`add` and :meth:`close`.
        """
        try:
            copy_range(self._source, self._target, self.footer.start, cancelled=cancelled)
            sync = getattr(os, "fdatasync", os.fsync)
            sync(self._target.fileno())
        except BaseException as exc:  # re-raised by the thread that writes the rest
            self._copy_error = exc
        finally:
            self._copied.set()

    def begin(self, new_schema: pa.Schema, metadata: dict[bytes, bytes], *, compression: str) -> None:
        """The new columns' schema, the key-value metadata to set, and their compression."""
        self._new_schema = new_schema
        self._metadata = metadata
        self._compression = compression

    def _wait_for_prefix(self) -> None:
        self._copied.wait()
        if self._copy_error is not None:
            raise self._copy_error

    def add(self, arrays: Sequence[pa.Array]) -> None:
        self._wait_for_prefix()
        batch = pa.RecordBatch.from_arrays(list(arrays), schema=self._new_schema)
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        while self._group < len(self.row_counts) and self._pending_rows >= self.row_counts[self._group]:
            self._encode_group(self.row_counts[self._group])

    def _encode_group(self, rows: int) -> None:
        """Start encoding the next ``rows`` pending rows as a row group (at once where the
        file has one); wait for the oldest group once :data:`ENCODERS` are under way."""
        table = pa.Table.from_batches(self._pending, schema=self._new_schema)
        group, rest = table.slice(0, rows), table.slice(rows)
        self._pending = rest.to_batches()
        self._pending_rows = rest.num_rows
        self._group += 1
        if len(self.row_counts) == 1:
            self._place_group(_encoded_group(group, self._compression))
            return
        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(ENCODERS, thread_name_prefix="grpo-cli-encoder")
        self._encoding.append(self._encoder.submit(_encoded_group, group, self._compression))
        self._place_encoded(under_way=ENCODERS)

    def _place_encoded(self, *, under_way: int) -> None:
        """Place the encoded row groups in order, oldest first: while the oldest is done, or
        (waiting for it) while more than ``under_way`` are left."""
        while self._encoding and (self._encoding[0].done() or len(self._encoding) > under_way):
            self._place_group(self._encoding.popleft().result())

    def _place_group(self, encoded: bytes) -> None:
        """Write an encoded row group of the new columns after the last, and note its chunks."""
        (length,) = struct.unpack("<I", encoded[-8:-4])
        body_end = len(encoded) - 8 - length
        mini = read_struct(encoded[body_end : len(encoded) - 8])
        position = self._target.tell()
        self._target.write(memoryview(encoded)[len(MAGIC) : body_end])
        shift = position - len(MAGIC)
        (mini_group,) = [
            read_struct(g) for g in read_list(_raw(_required(mini, FILE_ROW_GROUPS, "row group")))[1]
        ]
        chunks = []
        for chunk_raw in read_list(_raw(_required(mini_group, ROW_GROUP_COLUMNS, "columns")))[1]:
            chunk = _shift(
                read_struct(chunk_raw), [CHUNK_FILE_OFFSET, CHUNK_OFFSET_INDEX, CHUNK_COLUMN_INDEX], shift
            )
            meta = _get(chunk, CHUNK_META)
            if meta is not None:
                shifted = _shift(
                    read_struct(_raw(meta)),
                    [META_DATA_PAGE, META_INDEX_PAGE, META_DICTIONARY_PAGE, META_BLOOM_FILTER],
                    shift,
                )
                chunk = _replace(chunk, Field(CHUNK_META, TType.STRUCT, write_struct(shifted)))
            chunks.append(write_struct(chunk))
        self._chunks.append(chunks)
        total_bytes = read_int(_required(mini_group, ROW_GROUP_BYTES, "RowGroup.total_byte_size"))
        compressed = _get(mini_group, ROW_GROUP_COMPRESSED)
        self._totals.append((total_bytes, read_int(compressed) if compressed is not None else 0))
        if not self._leaves:
            self._leaves = read_list(_raw(_required(mini, FILE_SCHEMA, "schema")))[1][1:]
            orders = _get(mini, FILE_COLUMN_ORDERS)
            self._orders = read_list(_raw(orders))[1] if orders is not None else None

    def close(self) -> None:
        """Write the merged footer; the rows added must match the input's row groups."""
        try:
            self._wait_for_prefix()
            self._place_encoded(under_way=0)
            if self._group != len(self.row_counts) or self._pending_rows:
                added = sum(self.row_counts[: self._group]) + self._pending_rows
                raise ValueError(f"got {added} rows of new columns for {sum(self.row_counts)} input rows")
            footer = write_struct(self._merged_footer())
            self._target.write(footer)
            self._target.write(struct.pack("<I", len(footer)) + MAGIC)
        finally:
            self._stop_encoding()
            self._source.close()

    def abandon(self) -> None:
        self._stop_encoding()
        self._source.close()

    def _stop_encoding(self) -> None:
        """Drop the row groups not yet encoded and wait for those under way (no thread outlives
        the file)."""
        self._encoding.clear()
        if self._encoder is not None:
            self._encoder.shutdown(wait=True, cancel_futures=True)
            self._encoder = None

    def _merged_footer(self) -> list[Field]:
        fields = list(self.footer.fields)
        schema_type, elements = read_list(_raw(_required(fields, FILE_SCHEMA, "schema")))
        root = read_struct(elements[0])
        children = read_int(_required(root, SCHEMA_NUM_CHILDREN, "root num_children"))
        root = _replace(root, int_field(SCHEMA_NUM_CHILDREN, TType.I32, children + len(self._new_schema)))
        schema = write_list(schema_type, [write_struct(root), *elements[1:], *self._leaves])
        fields = _replace(fields, Field(FILE_SCHEMA, TType.LIST, schema))

        groups = []
        for group, chunks, (total, compressed) in zip(
            self.footer.row_groups, self._chunks, self._totals, strict=True
        ):
            column_type, columns = read_list(_raw(_required(group, ROW_GROUP_COLUMNS, "columns")))
            group = _replace(
                group, Field(ROW_GROUP_COLUMNS, TType.LIST, write_list(column_type, [*columns, *chunks]))
            )
            group = _shift(group, [ROW_GROUP_BYTES], total)
            group = _shift(group, [ROW_GROUP_COMPRESSED], compressed)
            groups.append(write_struct(group))
        fields = _replace(fields, Field(FILE_ROW_GROUPS, TType.LIST, write_list(TType.STRUCT, groups)))

        orders = _get(fields, FILE_COLUMN_ORDERS)
        if orders is not None:
            order_type, existing = read_list(_raw(orders))
            if self._orders is None or len(self._orders) != len(self._leaves):
                raise SpliceRefused("the new columns have no column order")
            merged = write_list(order_type, [*existing, *self._orders])
            fields = _replace(fields, Field(FILE_COLUMN_ORDERS, TType.LIST, merged))

        pairs = [
            (key, pair)
            for key, pair in _key_values(fields)
            if key.encode("utf-8", "surrogateescape") not in self._metadata
        ]
        if self._arrow is not None:
            arrow = self._arrow
            for field in self._new_schema:
                arrow = arrow.append(field)
            extra = {k: v for k, v in self._metadata.items() if k != ARROW_SCHEMA_KEY.encode()}
            arrow = arrow.with_metadata({**(arrow.metadata or {}), **extra})
            pairs = [(k, p) for k, p in pairs if k != ARROW_SCHEMA_KEY]
            pairs.append(
                (
                    ARROW_SCHEMA_KEY,
                    [
                        string_field(KEY, ARROW_SCHEMA_KEY),
                        string_field(VALUE, _serialize_arrow_schema(arrow)),
                    ],
                )
            )
        for key, value in self._metadata.items():
            pairs.append(
                (key.decode(), [string_field(KEY, key.decode()), string_field(VALUE, value.decode())])
            )
        key_values = write_list(TType.STRUCT, [write_struct(pair) for _, pair in pairs])
        return _replace(fields, Field(FILE_KEY_VALUES, TType.LIST, key_values))
