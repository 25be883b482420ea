"""The tap-record rows: one row per frame of a tap record, its metadata as typed columns, plus the frame.

``frame_columns`` is pure: an Arrow batch of Kafka source rows (value, headers, partition, offset) in,
an Arrow batch of ``FRAME_ROW_SCHEMA`` rows out: a schema-1 record's headers, or a schema-2 or 3
record's packed metadata, one row per frame. ``frame_values`` gives the same columns as Python lists,
and ``batch_frames`` each row's frame, decoded once (``codec.taprecord.frame_of``): the first step of
the job's ``mapInArrow`` stage (``streaming.bundles``; the router, ``streaming.router``, routes the
frames), reading a batch of schema-2 and 3 records (what taps write) straight into frames.
It reads tap-record metadata only (``codec.taprecord``, the one tap-record contract); the codec runs
once per frame, in ``frame_of`` (docs/decisions.md, "Decode once, in stage one").

``frame_columns`` computes the batch column by column with Arrow kernels (the headers flattened once,
no Python per record); ``frame_row`` is the one-record reference it equals, kept for the tests, the
stage benchmark and ``LocalStages``. Where a kernel cannot read a value exactly as ``codec.taprecord``
does (an int not written as plain digits, invalid UTF-8, a record without ``conn``, a header-only
flag), the taprecord function itself runs, per distinct value or per such record.
tests/streaming/test_frames.py holds the two equal on generated batches.

A numeric header that does not read as an integer of its column's type is null: one that is not an
integer (``int_header``) and one its column cannot hold (``api_key`` of 2**31, ``seq`` beyond int64)
alike, so no record a foreign producer writes to the tap topic can fail the batch. The job judges
the record as it judges any without a usable header (``codec.taprecord.frame_from_row``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from codec.taprecord import (
    HEADER_ONLY_FLAGS,
    HEADER_ONLY_READS,
    HEADERS,
    LONE,
    LOSS_NS,
    LOST,
    MAGIC_3,
    PACKED_PREFIX,
    RESP,
    ROW_KEYS,
    SASL_TOKEN,
    Header,
    RawPart,
    RecordError,
    TapFrame,
    TapRecord,
    connection_of,
    frame_from_row,
    frame_of,
    frames_from_columns,
    header_only,
    header_text,
    int_header,
    is_packed,
    parse_records,
    part_of,
    read_record_2,
    read_record_3,
)

FRAME_ROW_SCHEMA = pa.schema(
    [
        (Header.CONN, pa.string()),
        (Header.SEQ, pa.int64()),
        (Header.TS_NS, pa.int64()),
        (Header.DIR, pa.string()),
        (Header.API_KEY, pa.int32()),
        (Header.API_VERSION, pa.int32()),
        (Header.CORR_ID, pa.int32()),
        (Header.CLIENT, pa.string()),
        (Header.BROKER, pa.string()),
        (Header.BROKER_ID, pa.int32()),
        (Header.LISTENER, pa.string()),
        (Header.TAP, pa.string()),
        (Header.CAPTURE, pa.string()),
        (Header.TRUNCATED, pa.bool_()),
        (ROW_KEYS["partition"], pa.int32()),
        (ROW_KEYS["offset"], pa.int64()),
        ("size", pa.int32()),
        #: The mirrored frame, decoded once by the router.
        ("value", pa.binary()),
        #: The connection's records the tap had lost before this one (``TapFrame.lost``; 0 in schema 1).
        (LOST, pa.int64()),
        #: A response the tap wrote as a record of its own (``TapFrame.lone``; false in schema 1).
        (LONE, pa.bool_()),
        #: The entry of a schema-3 record the frame came from (``TapFrame.index``; 0 in schemas 1, 2).
        (ROW_KEYS["index"], pa.int32()),
        #: When the tap last may have lost records before it wrote this one (``TapFrame.loss_ns``).
        (LOSS_NS, pa.int64()),
    ]
)


def frame_row(
    headers: dict[str, str], value: bytes | None, partition: int | None, offset: int | None
) -> dict[str, Any]:
    """One tap record as a row. Header-derived columns are named after their headers; the record's own
    place gets ``ROW_KEYS``. The api key, version and correlation id come from the tap's headers, on
    requests and responses alike; for a request, the router's decode replaces them with the frame's
    own header, exactly as ``codec.taprecord.frame_from_record`` does, so a request looks the same
    everywhere (and an undecodable one keeps what the tap read of its header)."""
    direction = headers.get(Header.DIR, "")
    row: dict[str, Any] = {
        Header.CONN: connection_of(headers.get(Header.CONN), partition),
        Header.SEQ: _int(headers, Header.SEQ),
        Header.TS_NS: _int(headers, Header.TS_NS),
        Header.DIR: direction,
        Header.API_KEY: _int(headers, Header.API_KEY),
        Header.API_VERSION: _int(headers, Header.API_VERSION),
        Header.CORR_ID: _int(headers, Header.CORR_ID),
        Header.CLIENT: headers.get(Header.CLIENT),
        Header.BROKER: headers.get(Header.BROKER),
        Header.BROKER_ID: _int(headers, Header.BROKER_ID),
        Header.LISTENER: headers.get(Header.LISTENER),
        Header.TAP: headers.get(Header.TAP),
        Header.CAPTURE: headers.get(Header.CAPTURE),
        Header.TRUNCATED: header_only(headers),
        ROW_KEYS["partition"]: partition,
        ROW_KEYS["offset"]: offset,
        "size": len(value) if value is not None else None,
        "value": value,
        ROW_KEYS["index"]: 0,
        LOST: 0,
        LONE: False,
        LOSS_NS: 0,
    }
    return row


#: The header-derived columns (named after their headers) by kind, in the schema's order.
_TEXTS: Final = tuple(f.name for f in FRAME_ROW_SCHEMA if f.name in HEADERS and pa.types.is_string(f.type))
_INTS: Final = tuple(f.name for f in FRAME_ROW_SCHEMA if f.name in HEADERS and pa.types.is_integer(f.type))
#: Every header ``frame_columns`` looks up, in the rows of its index table.
_LOOKED_UP: Final = tuple(dict.fromkeys((*_TEXTS, *_INTS, *HEADER_ONLY_READS)))
#: Integers ``int()`` reads exactly as Arrow's string cast does, and that int64 surely holds (at most 18
#: digits, or 19 below 9 * 10**18: a tap clock in ns has 19). Any other value (" 12", "+5", "1_000",
#: non-ASCII digits, "", longer digit strings) goes through ``int_header`` and ``_fitting``
#: themselves, once per distinct value.
_PLAIN_INT: Final = r"^-?(?:[0-9]{1,18}|[0-8][0-9]{18})$"


def _bounds(type_: pa.DataType) -> tuple[int, int]:
    """The lowest and highest integer an integer Arrow type holds."""
    info = np.iinfo(type_.to_pandas_dtype())
    return int(info.min), int(info.max)


#: The range of each integer header column, from its type in ``FRAME_ROW_SCHEMA``: the one range rule.
_INT_BOUNDS: Final = {name: _bounds(FRAME_ROW_SCHEMA.field(name).type) for name in _INTS}


def _fitting(name: str, value: int | None) -> int | None:
    """``value`` of integer header column ``name`` if its type holds it, else None (null, as a header
    that does not read as an integer at all)."""
    if value is None:
        return None
    lowest, highest = _INT_BOUNDS[name]
    return value if lowest <= value <= highest else None


def _int(headers: dict[str, str], name: str) -> int | None:
    """Integer header ``name`` as its column holds it: ``int_header``, null where the column cannot."""
    return _fitting(name, int_header(headers, name))


class _Headers:
    """The headers of a batch's rows, flattened once: for each looked-up name, each row's index into
    the flattened values of its last header of that name (a dict keeps the last one; -1: none)."""

    def __init__(self, headers: pa.Array) -> None:
        rows = len(headers)
        entries = pc.list_flatten(headers)
        # ``struct_field``, not ``field``: a null entry (no Kafka client writes one) has no name.
        keys = pc.struct_field(entries, "key")
        values = pc.struct_field(entries, "value")
        if values.type != pa.binary():
            values = values.cast(pa.binary())
        #: A header with a null value reads as "" (``header_text``), so only a missing header is null.
        self.values: pa.Array = values.fill_null(b"")
        codes = pc.index_in(keys, value_set=pa.array(_LOOKED_UP, pa.string())).fill_null(-1).to_numpy()
        found = np.flatnonzero(codes >= 0)
        index = np.full(len(_LOOKED_UP) * rows, -1, np.int64)
        if found.size:
            # Entries come in row order, and a row's in header order: sorted by name, stably (a
            # radix sort on the small codes), each name's entries stay so, and the last of a slot wins.
            order = np.argsort(codes[found].astype(np.int8), kind="stable")
            found = found[order]
            parents = pc.list_parent_indices(headers).to_numpy()[found]
            slots = codes[found].astype(np.int64) * rows + parents
            last = np.append(slots[1:] != slots[:-1], True)
            index[slots[last]] = found[last]
        self.index = index.reshape(len(_LOOKED_UP), rows)
        self._texts: pa.Array | None
        try:
            self._texts = self.values.cast(pa.string())
        except pa.ArrowInvalid:  # not all valid UTF-8: each text column checks its own
            self._texts = None

    def binary(self, name: str) -> pa.Array:
        """Each row's value of header ``name`` as bytes; null where the row has no such header."""
        return self.values.take(self._indices(name))

    def text(self, name: str) -> pa.Array:
        """Each row's value of header ``name`` as text (``header_text``); null where it has none."""
        if self._texts is not None:
            return self._texts.take(self._indices(name))
        column = self.binary(name)
        try:
            return column.cast(pa.string())
        except pa.ArrowInvalid:
            return pa.array([None if v is None else header_text(v) for v in column.to_pylist()], pa.string())

    def _indices(self, name: str) -> pa.Array:
        index = self.index[_LOOKED_UP.index(name)]
        return pa.array(index, pa.int64(), mask=index < 0)


def _int_column(headers: _Headers, name: str, type_: pa.DataType) -> pa.Array:
    """``_int(headers, name)`` per row, as a ``type_`` column: the plain ints by a cast, the rest
    (and only they) through ``int_header`` and ``_fitting`` once per distinct value."""
    column = headers.binary(name)
    plain = pc.match_substring_regex(column, _PLAIN_INT).fill_null(False)
    parsed = pc.if_else(plain, column, pa.scalar(None, pa.binary())).cast(pa.string()).cast(pa.int64())
    lowest, highest = _INT_BOUNDS[name]
    if len(parsed) and parsed.null_count < len(parsed):
        low, high = pc.min_max(parsed).values()
        if low.as_py() < lowest or high.as_py() > highest:
            held = pc.and_(pc.greater_equal(parsed, lowest), pc.less_equal(parsed, highest))
            parsed = pc.if_else(held, parsed, pa.scalar(None, pa.int64()))
    rest = pc.and_(pc.invert(plain), pc.is_valid(column))
    if pc.any(rest).as_py():
        read = _per_distinct(
            column.filter(rest),
            lambda v: _fitting(name, int_header({name: header_text(v)}, name)),
            pa.int64(),
        )
        parsed = pc.replace_with_mask(parsed, rest, read)
    return parsed.cast(type_)


def _per_distinct(values: pa.Array, read: Callable[[Any], Any], type_: pa.DataType) -> pa.Array:
    """``read`` of each of ``values``, as a ``type_`` column, calling it once per distinct value."""
    distinct = pc.unique(values)
    return pa.array([read(v) for v in distinct.to_pylist()], type_).take(
        pc.index_in(values, value_set=distinct)
    )


def record_rows(
    headers: dict[str, str], value: bytes | None, partition: int | None, offset: int | None
) -> list[dict[str, Any]]:
    """One tap record of any schema as its frames' rows: a schema-1 record is one frame
    (``frame_row``), a schema-2 record one row per part, each with the record's ``seq`` and ``lost``,
    a schema-3 record one row per part of each entry, with the entry's ``seq`` and ``index``. A value
    that claims schema 2 or 3 but breaks it is one row with no ``dir``, which the connection's entry
    reports as not a tap record."""
    if headers.get(Header.DIR) is not None or not is_packed(value):
        return [frame_row(headers, value, partition, offset)]
    assert value is not None
    try:
        records = parse_records(None, value)
    except RecordError:
        return [frame_row({}, value, partition, offset)]
    rows: list[dict[str, Any]] = []
    for record in records:
        rows.extend(_entry_rows(record, partition, offset))
    return rows


def _entry_rows(record: TapRecord, partition: int | None, offset: int | None) -> list[dict[str, Any]]:
    c = record.connection
    conn = connection_of(c.conn, partition)
    rows: list[dict[str, Any]] = []
    for part in record.parts:
        rows.append(
            {
                Header.CONN: conn,
                Header.SEQ: _fitting(Header.SEQ, record.seq),
                Header.TS_NS: _fitting(Header.TS_NS, part.ts_ns),
                Header.DIR: part.direction,
                Header.API_KEY: _fitting(Header.API_KEY, part.api_key),
                Header.API_VERSION: _fitting(Header.API_VERSION, part.api_version),
                Header.CORR_ID: _fitting(Header.CORR_ID, part.correlation_id),
                Header.CLIENT: c.client,
                Header.BROKER: c.broker,
                Header.BROKER_ID: _fitting(Header.BROKER_ID, c.broker_id),
                Header.LISTENER: c.listener,
                Header.TAP: c.tap,
                Header.CAPTURE: c.capture,
                Header.TRUNCATED: part.header_only,
                ROW_KEYS["partition"]: partition,
                ROW_KEYS["offset"]: offset,
                "size": len(part.value) if part.value is not None else None,
                "value": part.value,
                LOST: record.lost,
                LONE: record.kind == RESP,
                ROW_KEYS["index"]: record.index,
                LOSS_NS: record.loss_ns,
            }
        )
    return rows


def frame_columns(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Kafka-source rows (``value``, ``headers``, ``partition``, ``offset``) → tap-record rows, one per
    frame, exactly ``record_rows``'s. Schema-1 records go column by column: the headers are flattened
    once and each column is found with Arrow kernels; Python runs only per distinct value the kernels
    cannot read as ``codec.taprecord`` does (ints not written plainly, invalid UTF-8, a record without
    ``conn``, header-only flags). Schema-2 records (one per exchange, metadata packed in the value)
    are read per record, through ``codec.taprecord``. Rows keep the records' order."""
    return _columns(batch, *_packed_rows(batch))


def _packed_rows(batch: pa.RecordBatch) -> tuple[pa.Array, _Headers, pa.Array]:
    """The batch's values as binary, its headers, and which rows hold a record with its metadata packed
    in the value (schemas 2 and 3: the packed prefix, and no ``dir`` header as schema 1 has)."""
    value = batch.column("value")
    if value.type != pa.binary():
        value = value.cast(pa.binary())
    headers = _Headers(batch.column("headers"))
    packed = pc.and_(
        pc.starts_with(value, pattern=PACKED_PREFIX).fill_null(False),
        pa.array(headers.index[_LOOKED_UP.index(Header.DIR)] < 0),
    )
    return value, headers, packed


def _columns(batch: pa.RecordBatch, value: pa.Array, headers: _Headers, packed: pa.Array) -> pa.RecordBatch:
    """``frame_columns`` of a batch read by ``_packed_rows``."""
    if not pc.any(packed).as_py():
        return _schema_1_columns(batch, headers, value)
    lists, origins = _schema_2_lists(
        batch.filter(packed), np.flatnonzero(packed.to_numpy(zero_copy_only=False))
    )
    new_rows = _as_batch(lists)
    old = pc.invert(packed)
    if not pc.any(old).as_py():
        return new_rows
    kept = batch.filter(old)
    old_rows = _schema_1_columns(kept, _Headers(kept.column("headers")), value.filter(old))
    both = pa.Table.from_batches([old_rows, new_rows]).combine_chunks()
    origin = np.concatenate([np.flatnonzero(old.to_numpy(zero_copy_only=False)), np.array(origins, np.int64)])
    # A stable sort on the source row: the records' order, and each record's frames in theirs.
    order = pc.sort_indices(pa.array(origin))
    return both.take(order).to_batches()[0] if both.num_rows else new_rows


def frame_values(batch: pa.RecordBatch) -> dict[str, list[Any]]:
    """``frame_columns(batch)``'s columns as Python lists. A batch of schema-2 and 3 records only, what
    taps write, is read straight into lists: no Arrow arrays made to be read back."""
    value, headers, packed = _packed_rows(batch)
    if pc.all(packed).as_py():
        return _schema_2_lists(batch, np.arange(len(value)))[0]
    return _lists(_columns(batch, value, headers, packed))


def batch_frames(batch: pa.RecordBatch) -> tuple[list[TapFrame], list[int | None]]:
    """The frames of ``batch``'s records, decoded: the one decode of the streaming job (its
    ``mapInArrow`` stage, ``streaming.bundles``), each frame as ``codec.taprecord.frame_of`` makes it
    of its row of ``frame_values(batch)``; and each frame's ``ts_ns`` as its row holds it (None where the
    record gave none). A batch of schema-2 and 3 records only is read straight into frames: no
    columns made to be read back."""
    value, headers, packed = _packed_rows(batch)
    if pc.all(packed).as_py():
        frames: list[TapFrame] = []
        columns = _schema_2_lists(batch, np.arange(len(value)), frames)[0]
        return frames, columns[Header.TS_NS]
    columns = _lists(_columns(batch, value, headers, packed))
    return frames_from_columns(columns, len(columns[Header.CONN])), columns[Header.TS_NS]


def _lists(rows: pa.RecordBatch) -> dict[str, list[Any]]:
    return {name: rows.column(name).to_pylist() for name in rows.schema.names}


def _as_batch(lists: dict[str, list[Any]]) -> pa.RecordBatch:
    arrays = [pa.array(lists[f.name], f.type) for f in FRAME_ROW_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=FRAME_ROW_SCHEMA)


def _schema_2_lists(
    batch: pa.RecordBatch, sources: np.ndarray, frames: list[TapFrame] | None = None
) -> tuple[dict[str, list[Any]], list[int]]:
    """The frames' rows of schema-2 and 3 records as ``FRAME_ROW_SCHEMA``'s columns of Python values,
    and each row's source row (``sources[i]`` of record i). Given ``frames``, each row goes there as its
    decoded frame instead (``codec.taprecord.frame_of``), and of the columns only ``ts_ns`` is kept.

    Column by column, as ``record_rows`` would make them row by row: this runs for every record of
    the stream, and a dict per frame then ``from_pylist`` cost more than reading the records. A part
    with flags or redacted names, and a record that breaks the schema, take ``record_rows`` itself."""
    columns: dict[str, list[Any]] = {name: [] for name in FRAME_ROW_SCHEMA.names}
    conn_col, seq_col, ts_col, dir_col = (
        columns[n] for n in (Header.CONN, Header.SEQ, Header.TS_NS, Header.DIR)
    )
    api_col, ver_col, corr_col = (columns[n] for n in (Header.API_KEY, Header.API_VERSION, Header.CORR_ID))
    client_col, broker_col, broker_id_col = (
        columns[n] for n in (Header.CLIENT, Header.BROKER, Header.BROKER_ID)
    )
    listener_col, tap_col, capture_col = (columns[n] for n in (Header.LISTENER, Header.TAP, Header.CAPTURE))
    only_col, size_col, value_col = columns[Header.TRUNCATED], columns["size"], columns["value"]
    lost_col, lone_col = columns[LOST], columns[LONE]
    index_col, loss_col = columns[ROW_KEYS["index"]], columns[LOSS_NS]
    partition_col, offset_col = columns[ROW_KEYS["partition"]], columns[ROW_KEYS["offset"]]
    origins: list[int] = []
    seq_lo, seq_hi = _INT_BOUNDS[Header.SEQ]
    ts_lo, ts_hi = _INT_BOUNDS[Header.TS_NS]
    i32_lo, i32_hi = _INT_BOUNDS[Header.API_KEY]
    id_lo, id_hi = _INT_BOUNDS[Header.BROKER_ID]
    names = FRAME_ROW_SCHEMA.names
    for value, partition, offset, source in zip(
        batch.column("value").to_pylist(),
        batch.column("partition").to_pylist(),
        batch.column("offset").to_pylist(),
        sources.tolist(),
        strict=True,
    ):
        entries: list[tuple[str, int, list[RawPart]]]
        try:
            if value[:4] == MAGIC_3:
                c, entries, lost, loss_ns = read_record_3(value)
            else:
                kind, seq, c, parts, lost, loss_ns = read_record_2(value)
                entries = [(kind, seq, parts)]
        except RecordError:
            entries = []
        if not any(parts for _, _, parts in entries):
            # Broken, or (never written by a tap) a record of no frames: as the reference reads it.
            for row in record_rows({}, value, partition, offset):
                if frames is not None:
                    frames.append(frame_from_row(row))
                    ts_col.append(row[Header.TS_NS])
                else:
                    for name in names:
                        columns[name].append(row[name])
                origins.append(source)
            continue
        conn = connection_of(c.conn, partition)
        broker_id = c.broker_id
        if broker_id is not None and not id_lo <= broker_id <= id_hi:
            broker_id = None
        for index, (kind, seq, parts) in enumerate(entries):
            lone = kind == RESP
            seq_value = seq if seq_lo <= seq <= seq_hi else None
            for raw in parts:
                direction, ts_ns, api_key, api_version, corr, redacted, flags, size, pos = raw
                if flags or redacted:
                    part = part_of(value, raw)
                    header_only = part.header_only
                else:
                    header_only = False
                ts = ts_ns if type(ts_ns) is int else 0
                ts_value = ts if ts_lo <= ts <= ts_hi else None
                api = api_key if type(api_key) is int and i32_lo <= api_key <= i32_hi else None
                version = (
                    api_version if type(api_version) is int and i32_lo <= api_version <= i32_hi else None
                )
                corr_value = corr if type(corr) is int and i32_lo <= corr <= i32_hi else None
                ts_col.append(ts_value)
                origins.append(source)
                if frames is not None:
                    made = frame_of(
                        conn, seq_value, ts_value, direction, api, version, corr_value, c.client,
                        c.broker, broker_id, c.listener, partition, offset, c.capture, lost, lone,
                        value[pos : pos + size], header_only, index, loss_ns,
                    )  # fmt: skip
                    frames.append(made)
                    continue
                conn_col.append(conn)
                seq_col.append(seq_value)
                dir_col.append(direction)
                api_col.append(api)
                ver_col.append(version)
                corr_col.append(corr_value)
                client_col.append(c.client)
                broker_col.append(c.broker)
                broker_id_col.append(broker_id)
                listener_col.append(c.listener)
                tap_col.append(c.tap)
                capture_col.append(c.capture)
                only_col.append(header_only)
                partition_col.append(partition)
                offset_col.append(offset)
                size_col.append(size)
                value_col.append(value[pos : pos + size])
                lost_col.append(lost)
                lone_col.append(lone)
                index_col.append(index)
                loss_col.append(loss_ns)
    return columns, origins


def _schema_1_columns(batch: pa.RecordBatch, headers: _Headers, value: pa.Array) -> pa.RecordBatch:
    partition = batch.column("partition").cast(pa.int32())
    columns: dict[str, pa.Array] = {name: headers.text(name) for name in _TEXTS}
    columns[Header.DIR] = columns[Header.DIR].fill_null("")
    columns[Header.CONN] = _connections(columns[Header.CONN], partition)
    for name in _INTS:
        columns[name] = _int_column(headers, name, FRAME_ROW_SCHEMA.field(name).type)
    columns[Header.TRUNCATED] = _header_only(headers)
    columns[ROW_KEYS["partition"]] = partition
    columns[ROW_KEYS["offset"]] = batch.column("offset").cast(pa.int64())
    columns["size"] = pc.binary_length(value).cast(pa.int32())
    columns["value"] = value
    # Schema-1 taps never report losses: their gaps are all a reader learns.
    columns[LOST] = pa.array(np.zeros(len(value), np.int64))
    columns[LONE] = pa.array(np.zeros(len(value), np.bool_))
    columns[ROW_KEYS["index"]] = pa.array(np.zeros(len(value), np.int32))
    columns[LOSS_NS] = pa.array(np.zeros(len(value), np.int64))
    return pa.RecordBatch.from_arrays(
        [columns[name] for name in FRAME_ROW_SCHEMA.names], schema=FRAME_ROW_SCHEMA
    )


def _connections(conn: pa.Array, partition: pa.Array) -> pa.Array:
    """``connection_of`` per row: called once per partition that has records without a ``conn``."""
    missing = pc.equal(conn, "").fill_null(True)
    if not pc.any(missing).as_py():
        return conn
    names = _per_distinct(partition.filter(missing), lambda p: connection_of(None, p), pa.string())
    return pc.replace_with_mask(conn, missing, names)


def _header_only(headers: _Headers) -> pa.Array:
    """``header_only`` per row: called only for the rows that carry a flag or mention the SASL token."""
    columns = {name: headers.binary(name) for name in HEADER_ONLY_READS}
    candidates = pc.match_substring(columns[Header.REDACTED], SASL_TOKEN).fill_null(False)
    for name in HEADER_ONLY_FLAGS:
        candidates = pc.or_(candidates, pc.greater(pc.binary_length(columns[name]), 0).fill_null(False))
    result = np.zeros(len(candidates), np.bool_)
    rows = np.flatnonzero(candidates.to_numpy(zero_copy_only=False))
    if rows.size:
        picked = pa.array(rows)
        found = {name: column.take(picked).to_pylist() for name, column in columns.items()}
        for i, row in enumerate(rows):
            result[row] = header_only(
                {
                    name: header_text(found[name][i])
                    for name in HEADER_ONLY_READS
                    if found[name][i] is not None
                }
            )
    return pa.array(result, pa.bool_())


def frame_row_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` entry point of ``streaming.job.frame_rows`` (one row per record)."""
    for batch in batches:
        yield frame_columns(batch)
