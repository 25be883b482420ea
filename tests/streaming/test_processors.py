"""The Spark adapters of the stages: row conversion, the bucket's map state and its one timer."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streaming.pages import PagedBucketStore
from streaming.processors import (
    OUTPUT_DDL,
    STAGE_ROWS_DDL,
    BucketTimer,
    SparkPages,
    _output_rows,
    _records,
    _row_records,
    _stage_rows,
)
from streaming.stages import EVENT_TIME_MS, STAGE_ROW_FIELDS, _event_ms


def test_rows_keep_every_value_and_carry_event_time_in_ms() -> None:
    pdf = pd.DataFrame(
        {
            "conn": ["a", None],
            "seq": [1.0, np.nan],
            "event_time": pd.to_datetime([1_700_000_000_123, 1_700_000_000_456], unit="ms"),
            "value": [b"x", None],
        }
    )
    rows = _records(iter([pdf, pdf.iloc[:1]]))
    reference = pdf.drop(columns="event_time").to_dict("records")
    assert len(rows) == 3
    for row, expected in zip(rows, [*reference, reference[0]], strict=True):
        assert {k: v for k, v in row.items() if k != "event_time_ms"}.keys() == expected.keys()
        assert row["conn"] == expected["conn"] and row["value"] == expected["value"]
    assert np.isnan(rows[1]["seq"]) and rows[0]["seq"] == 1.0
    assert [_event_ms(r) for r in rows] == [1_700_000_000_123, 1_700_000_000_456, 1_700_000_000_123]


def test_row_api_rows_carry_every_value_and_event_time_in_ms() -> None:
    """``transformWithState`` hands over ``Row`` objects; a timestamp is a datetime, aware or naive UTC."""
    aware = datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC)
    row = Row(conn="a", seq=None, event_time=aware, value=b"x")
    naive = Row(conn=None, seq=7, event_time=aware.replace(tzinfo=None), value=None)
    rows = _row_records(iter([row, naive, Row(conn="b", seq=1, value=b"")]))
    assert rows == [
        {"conn": "a", "seq": None, "value": b"x", EVENT_TIME_MS: 1_700_000_000_123},
        {"conn": None, "seq": 7, "value": None, EVENT_TIME_MS: 1_700_000_000_123},
        {"conn": "b", "seq": 1, "value": b""},
    ]
    assert [_event_ms(r) for r in rows[:2]] == [1_700_000_000_123] * 2


_DDL_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "long": LongType(),
    "int": IntegerType(),
    "binary": BinaryType(),
    "timestamp": TimestampType(),
}


def _struct(ddl: str) -> StructType:
    return StructType([StructField(n, _DDL_TYPES[t]) for n, t in (c.split() for c in ddl.split(", "))])


def _through_arrow(rows: list[Row], ddl: str) -> list[Row]:
    """What Spark makes of a call's output rows and hands the next stage: pyspark's row serializer
    (``TransformWithStateInPySparkRowSerializer``) writes ``asDict(True)`` into an Arrow batch of the
    output schema, and reads each cell back with ``as_py``."""
    schema = pa.schema(list(to_arrow_type(_struct(ddl), timezone="UTC", prefers_large_types=False)))
    batch = pa.RecordBatch.from_pylist([row.asDict(True) for row in rows], schema=schema)
    return [Row(**row) for row in batch.to_pylist()]


def test_row_api_output_rows_fit_the_output_schemas_and_read_back_whole() -> None:
    route = dict.fromkeys(STAGE_ROW_FIELDS)
    route.update(kind="route", route_key="producer|7", event_ms=1_700_000_000_123, ts_ns=2**62, frame=b"\x00")
    route.update(bucket=3, flags=1)
    clock = dict.fromkeys(STAGE_ROW_FIELDS)
    clock.update(kind="clock", route_key="~clock", event_ms=5, ts_ns=5_000_000, at_ms=5, bucket=0)
    finding = dict.fromkeys(STAGE_ROW_FIELDS)
    finding.update(kind="finding", route_key="~pass", event_ms=9, ts_ns=9, conn="c", seq=4, payload="{}")
    stage = [route, clock, finding]
    back = _row_records(iter(_through_arrow(list(_stage_rows(stage)), STAGE_ROWS_DDL)))
    assert back == [
        {**{k: v for k, v in row.items() if k != "event_ms"}, EVENT_TIME_MS: row["event_ms"]} for row in stage
    ]
    out = _through_arrow(list(_output_rows(stage)), OUTPUT_DDL)
    assert [r.asDict() for r in out] == [
        {"kind": r["kind"], "ts_ns": r["ts_ns"], "payload": r["payload"]} for r in stage
    ]


class FakeMapState:
    """Spark's MapState surface the pages use: tuple keys and values, lazy iteration."""

    def __init__(self) -> None:
        self.data: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        #: Round trips a real MapState would make to the JVM's state server.
        self.calls: list[str] = []

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self.calls.append("getValue")
        return self.data.get(key)

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self.calls.append("updateValue")
        self.data[key] = value

    def removeKey(self, key: tuple[Any, ...]) -> None:
        self.calls.append("removeKey")
        self.data.pop(key, None)

    def iterator(self) -> Any:
        self.calls.append("iterator")
        return iter(self.data.items())  # changing the dict while this runs would raise


class FakeValueState:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class FakeHandle:
    def __init__(self) -> None:
        self.timers: set[int] = set()

    def registerTimer(self, ms: int) -> None:
        self.timers.add(ms)

    def deleteTimer(self, ms: int) -> None:
        self.timers.remove(ms)


def spark_store(entries_per_page: int = 2) -> tuple[PagedBucketStore, FakeMapState, FakeValueState]:
    pages, meta = FakeMapState(), FakeValueState()
    backend = SparkPages(pages, meta)  # type: ignore[arg-type]
    return PagedBucketStore(backend, entries_per_page), pages, meta


def test_pages_in_spark_state_keep_entries_across_calls_and_splits() -> None:
    store, pages, meta = spark_store()
    store.begin()
    for i in range(9):
        store.put(f"k{i}", (b"shard", i))
    store.finish()  # nine entries at two per page: the bucket split to eight pages
    assert meta.value is not None and 2 <= len(pages.data) <= 8
    assert all(isinstance(key[0], int) and isinstance(value[0], bytes) for key, value in pages.data.items())
    store.begin()
    assert [store.get(f"k{i}") for i in range(9)] == [(b"shard", i) for i in range(9)]
    # A split reads every page while it rewrites them: the listing is read whole before any write.
    for i in range(9, 40):
        store.put(f"k{i}", (b"shard", i))
    store.finish()
    store.begin()
    assert sorted(store.items()) == sorted((f"k{i}", (b"shard", i)) for i in range(40))
    for i in range(40):
        store.remove(f"k{i}")
    store.finish()
    assert pages.data == {} and meta.value is None  # an empty bucket keeps nothing


def test_a_call_pays_a_round_trip_per_page_it_touches_not_per_key() -> None:
    """Stage one touches every live connection of its bucket in every batch: 200 connections are
    at most one read and one write per page, and keys the bucket does not hold cost nothing."""
    store, pages, _ = spark_store(entries_per_page=32)
    store.begin()
    for i in range(200):
        store.put(f"conn-{i}", (b"state", 10_000 + i))
    store.finish()
    page_count = len(pages.data)
    assert page_count <= 16
    store.begin()
    pages.calls.clear()
    for i in range(200):
        saved = store.get(f"conn-{i}")
        assert saved is not None
        store.put(f"conn-{i}", (saved[0] + b"!", saved[1]))
    assert all(store.get(f"new-{i}") is None for i in range(100))
    store.finish()
    assert pages.calls.count("getValue") == page_count and pages.calls.count("updateValue") == page_count
    assert len(pages.calls) == 2 * page_count


def test_a_timer_fire_reads_only_the_pages_of_due_entries() -> None:
    store, pages, _ = spark_store(entries_per_page=4)
    store.begin()
    for i in range(64):
        store.put(f"k{i}", (b"shard", b"routes", 1_000 + i))
    store.put("unset", (b"shard", b"", None))
    store.finish()
    store.begin()
    pages.calls.clear()
    ready, later = store.due(1_002)
    assert sorted(key for key, _ in ready) == ["k0", "k1", "k2", "unset"] and later == 1_003
    assert pages.calls == ["getValue"] * len(pages.calls) and 1 <= len(pages.calls) <= 4
    # Entries the call changes or removes are in the saved index afterwards.
    store.remove("k0")
    store.put("k1", (b"shard", b"", 5_000))
    store.finish()
    store.begin()
    ready, later = store.due(1_002)
    assert sorted(key for key, _ in ready) == ["k2", "unset"] and later == 1_003


def test_a_bucket_has_at_most_one_timer_and_keeps_it_in_its_meta() -> None:
    handle = FakeHandle()
    store, _, meta = spark_store()
    timer = BucketTimer(handle, store)  # type: ignore[arg-type]
    store.begin()
    assert store.armed is None
    timer.move(None, 50)
    timer.move(store.armed, 30)
    store.finish()
    assert handle.timers == {30} and meta.value is not None
    store.begin()  # the next call reads which timer is armed from the saved meta
    assert store.armed == 30
    timer.move(30, 30)
    assert handle.timers == {30}
    handle.timers.discard(30)  # it fired: Spark removed it
    timer.move(None, None)
    store.finish()
    assert handle.timers == set() and meta.value is None
    store.begin()
    assert store.armed is None
