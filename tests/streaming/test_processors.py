"""The Spark adapter of the stage: its output rows, the bucket's map state and its one timer."""

from __future__ import annotations

from typing import Any

import numpy as np

from streaming.pages import PagedBucketStore
from streaming.processors import OUTPUT_DDL, BucketTimer, SparkPages, _output_frame
from streaming.rows import OutputRow


def test_output_rows_become_the_columns_spark_was_promised() -> None:
    rows = [OutputRow("finding", 7, '{"id": "x"}'), OutputRow("stat", 2**62, '{"frames": 1}')]
    frame = _output_frame(rows)
    assert list(frame.columns) == [c.split()[0] for c in OUTPUT_DDL.split(", ")]
    assert frame.to_dict("records") == [r._asdict() for r in rows]
    assert frame["ts_ns"].dtype == np.int64


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


def test_pages_in_spark_state_keep_entries_across_calls() -> None:
    store, pages, meta = spark_store()
    store.begin()
    for i in range(9):
        store.put(f"k{i}", (b"shard", i))
    store.finish()  # nine entries at two per page: five pages
    assert meta.value is not None and len(pages.data) == 5
    assert all(isinstance(key[0], int) and isinstance(value[0], bytes) for key, value in pages.data.items())
    store.begin()
    assert [store.get(f"k{i}") for i in range(9)] == [(b"shard", i) for i in range(9)]
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
