"""streaming.frames: the mapInArrow stage's columns (``frame_columns``) are exactly the per-record
reference's (``frame_row``, built into a batch by ``from_pylist``, as the stage did before). A numeric
header that does not read as an integer of its column's type is null in both."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codec.taprecord import (
    DIRECTIONS,
    EXCHANGE,
    HEADERS,
    KINDS,
    LONE,
    LOST,
    MAGIC,
    MAGIC_3,
    ROW_COLUMNS,
    ROW_KEYS,
    SASL_TOKEN,
    Connection,
    Header,
    Part,
    TapFrame,
    frame_from_row,
    frame_to_packed,
    frames_from_columns,
    headers_dict,
    pack_flush,
    pack_record,
    pack_static,
)
from streaming.bundles import KAFKA_SOURCE_SCHEMA
from streaming.frames import (
    FRAME_ROW_SCHEMA,
    batch_frames,
    frame_columns,
    frame_row_batches,
    frame_values,
    record_rows,
)

#: The Kafka source's columns, as Spark hands them to ``mapInArrow``.
SOURCE_SCHEMA = KAFKA_SOURCE_SCHEMA
HEADERS_TYPE = SOURCE_SCHEMA.field("headers").type

Record = tuple[list[tuple[str, bytes | None]] | None, bytes | None, int | None, int]


def source_batch(records: list[Record]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "value": value,
                "headers": None if headers is None else [{"key": k, "value": v} for k, v in headers],
                "partition": partition,
                "offset": offset,
            }
            for headers, value, partition, offset in records
        ],
        schema=SOURCE_SCHEMA,
    )


def reference(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The stage as it was: a dict per record through ``codec.taprecord``, then ``from_pylist``."""
    rows = [
        frame
        for row, raw in zip(batch.to_pylist(), batch.column("headers").to_pylist(), strict=True)
        for frame in record_rows(
            headers_dict((item["key"], item["value"]) for item in raw or ()),
            row["value"],
            row["partition"],
            row["offset"],
        )
    ]
    return pa.RecordBatch.from_pylist(rows, schema=FRAME_ROW_SCHEMA)


def assert_same(batch: pa.RecordBatch) -> None:
    expected = reference(batch)
    got = frame_columns(batch)
    assert got.schema == FRAME_ROW_SCHEMA
    assert got.to_pylist() == expected.to_pylist()
    # What the router reads: the same values, whichever way they were read.
    assert frame_values(batch) == {name: expected.column(name).to_pylist() for name in FRAME_ROW_SCHEMA.names}
    assert got.equals(expected)
    # What the job decodes: each row's frame, and its event time as the row holds it.
    frames, times = batch_frames(batch)
    assert [_frame_facts(f) for f in frames] == [
        _frame_facts(frame_from_row(r)) for r in expected.to_pylist()
    ]
    assert times == expected.column(Header.TS_NS).to_pylist()


# --- generated batches -------------------------------------------------------------------------------------

INT_TEXTS = [
    "0", "-0", "007", "12", "-12", " 12", "12 ", "12\n", "+5", "-", "1_000", "_1", "1__0", "١٢", "٣", "x1",
    "1.0", "0x10", "", "2147483647", "2147483648", "-2147483648", "-2147483649", "9223372036854775807",
    "9223372036854775808", "-9223372036854775809", "+2147483648", "1" * 30, "0" * 25 + "1",
]  # fmt: skip
TEXTS = ["req", "resp", "open", "close", "conn-1", "", "full", "héllo", "x,y"]
REDACTED = [
    "",
    SASL_TOKEN,
    f"password,{SASL_TOKEN}",
    f"{SASL_TOKEN}s",
    f"x{SASL_TOKEN}",
    f"{SASL_TOKEN},",
    "password",
]
INVALID_UTF8 = [b"\xff", b"a\xe2,sasl_token", b"\xc3", b"1\x80", b"\xed\xa0\x80"]

header_values = st.one_of(
    st.none(),
    st.sampled_from(INT_TEXTS + TEXTS + REDACTED).map(str.encode),
    st.integers(min_value=-(2**64), max_value=2**64).map(lambda i: str(i).encode()),
    st.integers(min_value=-(2**40), max_value=2**40).map(lambda i: f"{i:_}".encode()),
    st.sampled_from(INVALID_UTF8),
    st.binary(max_size=6),
    st.text(max_size=4).map(str.encode),
)
header_names = st.sampled_from([*HEADERS, "x-other", ""])
header_lists = st.one_of(
    st.none(), st.lists(st.tuples(header_names, header_values), max_size=12)
)  # fmt: skip
records = st.tuples(
    header_lists,
    st.one_of(st.none(), st.binary(max_size=8)),
    st.one_of(st.integers(min_value=0, max_value=3), st.none()),
    st.integers(min_value=0, max_value=2**63 - 1),
)

small_ints = st.one_of(st.none(), st.integers(min_value=-(2**40), max_value=2**63 - 1))
parts = st.builds(
    Part,
    st.sampled_from(DIRECTIONS),
    st.integers(min_value=0, max_value=2**63 - 1),
    small_ints,
    small_ints,
    small_ints,
    st.one_of(st.none(), st.binary(max_size=6)),
    st.lists(st.sampled_from(["password", SASL_TOKEN, "x"]), max_size=2).map(tuple),
    st.dictionaries(
        st.sampled_from(["truncated", "orig_size", "capture_fallback", "error"]),
        st.sampled_from(["1", "", "meta"]),
        max_size=2,
    ),
)
connections = st.builds(
    Connection,
    st.sampled_from(["tap-1-1", "tap-1-2", ""]),
    st.sampled_from(["127.0.0.1:5000", ""]),
    st.just("127.0.0.1:9092"),
    st.one_of(st.none(), st.integers(min_value=-(2**33), max_value=2**33)),
    st.one_of(st.none(), st.just("PLAINTEXT")),
    st.just("tap-1"),
    st.sampled_from(["full", "headers", "meta"]),
)
packed_values = st.builds(
    lambda kind, seq, conn, ps, lost: pack_record(kind, seq, pack_static(conn), ps, lost),
    st.sampled_from(KINDS),
    st.integers(min_value=0, max_value=2**40),
    connections,
    st.lists(parts, min_size=1, max_size=2),
    st.one_of(st.just(0), st.integers(min_value=0, max_value=2**63 - 1)),
)
#: Schema-3 values: a connection's flush of several entries.
flush_values = st.builds(
    lambda conn, entries, lost: pack_flush(pack_static(conn), entries, lost),
    connections,
    st.lists(
        st.tuples(
            st.sampled_from(KINDS),
            st.integers(min_value=0, max_value=2**40),
            st.lists(parts, min_size=0, max_size=2),
        ),
        max_size=4,
    ),
    st.one_of(st.just(0), st.integers(min_value=0, max_value=2**63 - 1)),
)
#: Schema-2 and 3 records: valid, cut short or with bytes after them (read as not a tap record).
schema_2_records = st.tuples(
    st.one_of(st.none(), st.just([]), st.just([("x-other", b"1")])),
    st.one_of(
        packed_values,
        packed_values.map(lambda v: v[:-1]),
        packed_values.map(lambda v: v + b"!"),
        st.binary(max_size=8).map(lambda b: MAGIC + b),
        flush_values,
        flush_values.map(lambda v: v[:-1]),
        st.binary(max_size=8).map(lambda b: MAGIC_3 + b),
    ),
    st.one_of(st.integers(min_value=0, max_value=3), st.none()),
    st.integers(min_value=0, max_value=2**63 - 1),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(records, schema_2_records), max_size=12), st.integers(min_value=0, max_value=3))
def test_mixed_schemas_equal_the_per_record_reference(batch_records: list[Record], skip: int) -> None:
    """Records of schemas 1, 2 and 3 in one batch: each record's frames, in the records' order."""
    batch = source_batch(batch_records)
    assert_same(batch)
    assert_same(batch.slice(min(skip, batch.num_rows)))


def _frame_facts(frame: TapFrame) -> tuple[object, ...]:
    return (*frame_to_packed(frame), frame.raw, None if frame.error is None else str(frame.error))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(records, schema_2_records), max_size=12))
def test_the_job_reads_the_rows_column_by_column_as_row_by_row(batch_records: list[Record]) -> None:
    """The job's decode (``frames_from_columns``) reads every row as ``frame_from_row`` does."""
    rows = frame_columns(source_batch(batch_records))
    columns = {name: rows.column(name).to_pylist() for name in ROW_COLUMNS}
    by_column = frames_from_columns(columns, rows.num_rows)
    assert [_frame_facts(f) for f in by_column] == [_frame_facts(frame_from_row(r)) for r in rows.to_pylist()]


def test_a_missing_column_reads_as_null() -> None:
    frames = frames_from_columns({Header.CONN: ["c1"], Header.DIR: ["open"]}, 1)
    assert [(f.conn, f.seq, f.direction, f.api_key, f.partition, f.capture) for f in frames] == [
        ("c1", 0, "open", None, -1, "full")
    ]


def test_an_exchange_record_is_two_rows_with_the_record_seq() -> None:
    static = pack_static(Connection("tap-1-7", "10.0.0.1:5000", "b:9092", 3, "PLAINTEXT", "tap-1", "headers"))
    request = Part("req", 10, 18, 3, 5, b"REQ")
    response = Part("resp", 20, 18, 3, 5, b"RESP", (), {"truncated": "1"})
    value = pack_record(EXCHANGE, 4, static, [request, response])
    rows = frame_columns(source_batch([(None, value, 2, 77)])).to_pylist()
    assert [(r["dir"], r["seq"], r["ts_ns"], r["value"], r["truncated"]) for r in rows] == [
        ("req", 4, 10, b"REQ", False),
        ("resp", 4, 20, b"RESP", True),
    ]
    assert {(r["conn"], r["broker_id"], r["tap_partition"], r["tap_offset"], r["capture"]) for r in rows} == {
        ("tap-1-7", 3, 2, 77, "headers")
    }


def test_every_frame_of_a_record_carries_its_lost_count() -> None:
    """A schema-2 record's ``lost`` is on each of its frames' rows; a schema-1 record's is 0."""
    static = pack_static(Connection("tap-1-7", "10.0.0.1:5000", "b:9092", 3, "PLAINTEXT", "tap-1", "full"))
    parts = [Part("req", 10, 18, 3, 5, b"REQ"), Part("resp", 20, 18, 3, 5, b"RESP")]
    batch = source_batch(
        [(None, pack_record(EXCHANGE, 9, static, parts, 6), 0, 1), (tap_headers(), b"frame", 1, 2)]
    )
    assert_same(batch)
    rows = frame_columns(batch)
    assert rows.column(LOST).to_pylist() == [6, 6, 0]
    # Stage one's one decode reads it onto each frame.
    assert [frame_from_row(row).lost for row in rows.to_pylist()] == [6, 6, 0]


def test_a_response_the_tap_wrote_alone_is_lone_and_nothing_else_is() -> None:
    """A schema-2 ``resp`` record's frame is lone (its request went alone before it); an exchange's,
    a lone request's and a schema-1 record's frames are not."""
    static = pack_static(Connection("tap-1-7", "10.0.0.1:5000", "b:9092", 3, "PLAINTEXT", "tap-1", "full"))
    parts = [Part("req", 10, 18, 3, 5, b"REQ"), Part("resp", 20, 18, 3, 5, b"RESP")]
    batch = source_batch(
        [
            (None, pack_record(EXCHANGE, 9, static, parts), 0, 1),
            (None, pack_record("req", 10, static, parts[:1]), 0, 2),
            (None, pack_record("resp", 11, static, parts[1:]), 0, 3),
            (tap_headers(), b"frame", 1, 4),
        ]
    )
    assert_same(batch)
    rows = frame_columns(batch)
    assert rows.column(LONE).to_pylist() == [False, False, False, True, False]
    assert [frame_from_row(row).lone for row in rows.to_pylist()] == [False, False, False, True, False]


@pytest.mark.parametrize("wide", [2**31, -(2**31) - 1, 2**40, 2**63 - 1, -(2**40)])
def test_schema_2_integers_beyond_their_column_are_null(wide: int) -> None:
    """Each integer a schema-2 record packs, beyond its column's type, reads as null as the reference
    reads it (msgpack holds any int64; the columns are int32 or int64)."""
    static = pack_static(Connection("tap-1-7", "", "", wide, None, "", "full"))
    parts = [Part("req", wide if wide > 0 else 1, wide, 3, 5, b"R"), Part("resp", 2, 18, wide, wide, b"S")]
    batch = source_batch([(None, pack_record(EXCHANGE, wide if wide > 0 else 0, static, parts), 0, 1)])
    assert_same(batch)
    row = frame_columns(batch).to_pylist()[0]
    assert row["api_key"] is None and row["broker_id"] is None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records, max_size=12), st.integers(min_value=0, max_value=3))
def test_columns_equal_the_per_record_reference(batch_records: list[Record], skip: int) -> None:
    batch = source_batch(batch_records)
    assert_same(batch)
    # A slice of a batch (offsets into the list column) reads the same.
    assert_same(batch.slice(min(skip, batch.num_rows)))


#: The integer header columns, each ranged by its type.
INT_COLUMNS = [f for f in FRAME_ROW_SCHEMA if f.name in HEADERS and pa.types.is_integer(f.type)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(
                st.tuples(
                    st.sampled_from([f.name for f in INT_COLUMNS]),
                    st.one_of(
                        st.sampled_from(INT_TEXTS),
                        st.integers(min_value=-(2**65), max_value=2**65).map(str),
                        st.integers(min_value=-(2**31) - 2, max_value=2**31 + 1).map(str),
                        st.integers(min_value=-(2**33), max_value=2**33).map(lambda i: f"{i:+_}"),
                    ).map(str.encode),
                ),
                max_size=8,
            ),
            st.binary(max_size=4),
            st.integers(min_value=0, max_value=3),
            st.integers(min_value=0, max_value=100),
        ),
        max_size=12,
    )
)
def test_columns_equal_the_reference_on_integer_headers(batch_records: list[Record]) -> None:
    """Integer headers only, in and beyond their columns' ranges, plain and not: every draw exercises
    the range rule in both paths."""
    assert_same(source_batch(batch_records))


# --- explicit cases ----------------------------------------------------------------------------------------


def tap_headers(**extra: str) -> list[tuple[str, bytes | None]]:
    headers = {
        Header.DIR: "resp",
        Header.SEQ: "7",
        Header.TS_NS: "1700000000000000000",
        Header.API_KEY: "0",
        Header.API_VERSION: "9",
        Header.CORR_ID: "3",
        Header.REDACTED: "",
        Header.CONN: "c-1",
        Header.CLIENT: "10.0.0.1:4000",
        Header.BROKER: "127.0.0.1:9092",
        Header.BROKER_ID: "1",
        Header.LISTENER: "PLAINTEXT",
        Header.TAP: "tap-a",
        Header.CAPTURE: "headers",
        Header.SCHEMA: "1",
    }
    headers.update(extra)
    return [(k, v.encode()) for k, v in headers.items()]


def test_a_tap_record_reads_as_its_headers() -> None:
    batch = source_batch([(tap_headers(), b"frame", 1, 42)])
    (row,) = frame_columns(batch).to_pylist()
    assert row == {
        Header.CONN: "c-1",
        Header.SEQ: 7,
        Header.TS_NS: 1700000000000000000,
        Header.DIR: "resp",
        Header.API_KEY: 0,
        Header.API_VERSION: 9,
        Header.CORR_ID: 3,
        Header.CLIENT: "10.0.0.1:4000",
        Header.BROKER: "127.0.0.1:9092",
        Header.BROKER_ID: 1,
        Header.LISTENER: "PLAINTEXT",
        Header.TAP: "tap-a",
        Header.CAPTURE: "headers",
        Header.TRUNCATED: False,
        ROW_KEYS["partition"]: 1,
        ROW_KEYS["offset"]: 42,
        "size": 5,
        "value": b"frame",
        LOST: 0,
        LONE: False,
        ROW_KEYS["index"]: 0,
        "loss_ns": 0,
    }
    assert next(frame_row_batches([batch])).equals(frame_columns(batch))


@pytest.mark.parametrize(
    ("headers", "value", "partition"),
    [
        pytest.param(None, None, 2, id="null-headers-and-value"),
        pytest.param([], b"", 0, id="no-headers"),
        pytest.param([(Header.CONN, b"a"), (Header.CONN, b"")], b"x", 3, id="last-conn-empty-wins"),
        pytest.param([(Header.CONN, b""), (Header.CONN, b"b")], b"x", 3, id="last-conn-wins"),
        pytest.param([(Header.CONN, None)], b"x", 1, id="null-conn-value"),
        pytest.param(
            [(Header.SEQ, b" 12"), (Header.API_KEY, b"+5"), (Header.CORR_ID, b"1_000")], b"", 0, id="ints"
        ),
        pytest.param(
            [(Header.API_KEY, "١٢".encode()), (Header.BROKER_ID, b"")], b"", 0, id="unicode-and-empty"
        ),
        pytest.param([(Header.CLIENT, b"\xff\xfe"), (Header.SEQ, b"\xff1")], b"", 0, id="invalid-utf8"),
        pytest.param([(Header.REDACTED, f"password,{SASL_TOKEN}".encode())], b"", 0, id="sasl-token"),
        pytest.param([(Header.REDACTED, f"{SASL_TOKEN}s".encode())], b"", 0, id="not-the-sasl-token"),
        pytest.param([(Header.TRUNCATED, b"1"), (Header.DIR, b"req")], b"", 0, id="truncated"),
        pytest.param([(Header.TRUNCATED, b"")], b"", 0, id="empty-flag"),
        pytest.param([(Header.CAPTURE_FALLBACK, None), (Header.REDACTION_FAILED, b"y")], b"", 0, id="flags"),
        pytest.param([(Header.CONN, b"c")], b"x", None, id="null-partition"),
    ],
)
def test_explicit_records_match_the_reference(
    headers: list[tuple[str, bytes | None]] | None, value: bytes | None, partition: int | None
) -> None:
    batch = source_batch([(headers, value, partition, 5), (tap_headers(), b"frame", 1, 6)])
    assert_same(batch)


def test_an_empty_batch_has_the_schema() -> None:
    got = frame_columns(source_batch([]))
    assert got.num_rows == 0
    assert got.schema == FRAME_ROW_SCHEMA


def test_a_record_without_conn_is_keyed_by_its_partition() -> None:
    batch = source_batch([([], b"", 4, 0), ([(Header.CONN, b"")], b"", 2, 1), ([], b"", 4, 2)])
    assert frame_columns(batch).column(Header.CONN).to_pylist() == [
        "untracked-p4",
        "untracked-p2",
        "untracked-p4",
    ]


def bounds(type_: pa.DataType) -> tuple[int, int]:
    bits = type_.bit_width
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def test_the_integer_columns_are_int64_and_int32() -> None:
    """The range test below runs per integer header column: both widths are there to run."""
    assert {(f.name, f.type) for f in INT_COLUMNS} >= {(Header.SEQ, pa.int64()), (Header.API_KEY, pa.int32())}


@pytest.mark.parametrize("field", INT_COLUMNS, ids=lambda f: f.name)
@pytest.mark.parametrize(
    "written", ["{}", "{:+}", " {} ", "{:_}"], ids=["plain", "sign", "spaces", "underscores"]
)
def test_an_integer_beyond_its_column_is_null(field: pa.Field, written: str) -> None:
    """Just beyond either bound: null, as a header that is not an integer, and the batch's other
    records stay as they are; at the exact bounds: the value. Both paths alike."""
    lowest, highest = bounds(field.type)
    values = [lowest - 1, lowest, highest, highest + 1]
    records: list[Record] = [
        (tap_headers(**{field.name: written.format(v)}), b"", 3, offset) for offset, v in enumerate(values)
    ]
    batch = source_batch([*records, (tap_headers(), b"frame", 1, 9)])
    for got in (frame_columns(batch), reference(batch)):
        assert got.column(field.name).to_pylist()[:4] == [None, lowest, highest, None]
        assert got.slice(4).equals(reference(batch.slice(4)))
        assert got.column(ROW_KEYS["offset"]).to_pylist() == [0, 1, 2, 3, 9]
    assert_same(batch)


def test_a_null_header_entry_is_no_header() -> None:
    """Spark's Kafka source never writes one (a Kafka header always has a key). ``frame_row``'s callers
    would fail on it with a TypeError; the columns read it as absent."""
    headers = pa.array([[None, {"key": Header.CONN, "value": b"c"}]], HEADERS_TYPE)
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b""]), headers, pa.array([0], pa.int32()), pa.array([0], pa.int64())], schema=SOURCE_SCHEMA
    )
    assert frame_columns(batch).column(Header.CONN).to_pylist() == ["c"]


def test_large_arrow_types_read_the_same() -> None:
    """Spark hands strings and binaries over as their 64-bit-offset types with
    ``spark.sql.execution.arrow.useLargeVarTypes``."""
    batch = source_batch(
        [
            (tap_headers(), b"frame", 0, 1),
            ([(Header.CONN, b"\xff"), (Header.SEQ, b"+3")], None, 1, 2),
            (None, b"", 1, 3),
        ]
    )
    large = pa.schema(
        [
            ("value", pa.large_binary()),
            ("headers", pa.large_list(pa.struct([("key", pa.large_string()), ("value", pa.large_binary())]))),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
        ]
    )
    assert frame_columns(batch.cast(large)).equals(reference(batch))
