"""The Spark adapters of the stages: row conversion, the bucket's map state and its one timer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from streaming.processors import LIST_KEYS_AT, LIST_KEYS_RATIO, BucketTimer, MapStateStore, _records
from streaming.stages import _event_ms, split_due


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


class FakeMapState:
    """Spark's MapState surface the store uses: tuple keys and values, lazy iteration."""

    def __init__(self) -> None:
        self.data: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        #: Round trips a real MapState would make to the JVM's state server.
        self.calls: list[str] = []

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self.calls.append("getValue")
        return self.data.get(key)

    def keys(self) -> Any:
        self.calls.append("keys")
        return iter(list(self.data))

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self.data[key] = value

    def removeKey(self, key: tuple[Any, ...]) -> None:
        del self.data[key]

    def data_items(self) -> list[tuple[str, tuple[Any, ...]]]:
        return [(key[0], value) for key, value in self.data.items()]

    def iterator(self) -> Any:
        self.calls.append("iterator")
        return iter(self.data.items())  # changing the dict while this runs would raise


def test_map_state_store_can_be_changed_while_iterated() -> None:
    store = MapStateStore(FakeMapState())  # type: ignore[arg-type]
    store.put("a", ("s", 1))
    store.put("b", ("t", 2))
    assert store.get("a") == ("s", 1) and store.get("missing") is None
    for key, _ in store.items():
        store.remove(key)
    assert list(store.items()) == []


def test_a_call_with_many_keys_lists_the_bucket_once_and_reads_only_what_it_holds() -> None:
    state = FakeMapState()
    store = MapStateStore(state)  # type: ignore[arg-type]
    store.put("held", ("s", 1))
    wanted = ["held", *(f"new-{i}" for i in range(LIST_KEYS_AT))]
    store.begin((0,), len(wanted))
    state.calls.clear()
    assert [store.get(k) for k in wanted] == [("s", 1), *([None] * LIST_KEYS_AT)]
    assert state.calls == ["getValue"]  # the held key only; the new ones cost nothing
    store.put("new-0", ("t", 2))
    store.remove("held")
    assert store.get("new-0") == ("t", 2) and store.get("held") is None
    # A call with few keys asks per key, and so does a timer call (begin with 0).
    for keys in (LIST_KEYS_AT - 1, 0):
        store.begin((0,), keys)
        state.calls.clear()
        assert store.get("absent") is None and state.calls == ["getValue"]


def test_a_bucket_much_larger_than_the_call_is_not_listed_again() -> None:
    state = FakeMapState()
    store = MapStateStore(state)  # type: ignore[arg-type]
    for i in range(LIST_KEYS_RATIO * LIST_KEYS_AT + 1):
        store.put(f"k{i}", ("s", i))
    store.begin((1,), LIST_KEYS_AT)  # first call on the bucket: its size is unknown, so it is listed
    assert state.calls.count("keys") == 1
    store.begin((1,), LIST_KEYS_AT)  # now known to be too large for a call this small
    assert state.calls.count("keys") == 1 and store.get("k3") == ("s", 3)
    store.begin((2,), LIST_KEYS_AT)  # another bucket (Spark's grouping key) has its own size
    assert state.calls.count("keys") == 2


class FakeHandle:
    def __init__(self) -> None:
        self.timers: set[int] = set()

    def registerTimer(self, ms: int) -> None:
        self.timers.add(ms)

    def deleteTimer(self, ms: int) -> None:
        self.timers.remove(ms)


class FakeValueState:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


def test_a_bucket_has_at_most_one_timer() -> None:
    handle = FakeHandle()
    timer = BucketTimer(handle, FakeValueState())  # type: ignore[arg-type]
    assert timer.armed() is None
    timer.move(None, 50)
    timer.move(timer.armed(), 30)
    assert handle.timers == {30} and timer.armed() == 30
    timer.move(30, 30)
    assert handle.timers == {30}
    handle.timers.discard(30)  # it fired: Spark removed it
    timer.move(None, None)
    assert handle.timers == set() and timer.armed() is None


def test_a_timer_fire_reads_only_the_due_entries_through_the_index() -> None:
    state, index = FakeMapState(), FakeValueState()
    store = MapStateStore(state, index)  # type: ignore[arg-type]
    store.begin((0,), 0)
    for i in range(50):
        store.put(f"k{i}", (b"shard", b"routes", 1_000 + i))
    store.put("unset", (b"shard", b"", None))
    store.finish()
    assert index.value is not None
    store.begin((0,), 0)
    state.calls.clear()
    ready, later = store.due(1_002)
    # The same answer as listing the bucket, from the index and three reads: nothing else was listed.
    assert (ready, later) == split_due(state.data_items(), 1_002)
    assert sorted(key for key, _ in ready) == ["k0", "k1", "k2", "unset"] and later == 1_003
    assert state.calls == ["getValue"] * 4
    # Entries the call changes or removes are in the saved index afterwards.
    store.remove("k0")
    store.put("k1", (b"shard", b"", 5_000))
    store.finish()
    store.begin((0,), 0)
    ready, later = store.due(1_002)
    assert sorted(key for key, _ in ready) == ["k2", "unset"] and later == 1_003


def test_a_bucket_without_an_index_gets_one_from_its_entries() -> None:
    """A bucket saved before the index (or by a build without it) is listed once, then indexed."""
    state, index = FakeMapState(), FakeValueState()
    state.data = {("a",): (b"s", b"", 10), ("b",): (b"s", b"", 20)}
    store = MapStateStore(state, index)  # type: ignore[arg-type]
    store.begin((0,), 0)
    assert [key for key, _ in store.due(15)[0]] == ["a"]
    assert state.calls.count("iterator") == 1
    store.finish()
    store.begin((0,), 0)
    state.calls.clear()
    assert store.due(25)[0] == [("a", (b"s", b"", 10)), ("b", (b"s", b"", 20))]
    assert "iterator" not in state.calls
    # An index naming a key the bucket no longer holds forgets it; an empty bucket clears the index.
    del state.data[("a",)]
    store.remove("b")
    assert store.due(25) == ([], None)
    store.finish()
    assert index.value is None


def test_with_an_index_keys_the_bucket_does_not_hold_cost_no_round_trip() -> None:
    """Stage two's lookups are mostly for route keys it has never seen (a new producer id per producer
    session): the due index names every entry, so those cost no ``getValue`` and no listing."""
    state = FakeMapState()
    store = MapStateStore(state, FakeValueState())  # type: ignore[arg-type]
    store.begin((0,), 0)
    store.put("held", (b"s", b"", 10))
    store.finish()
    store.begin((0,), 10 * LIST_KEYS_AT)
    state.calls.clear()
    assert [store.get(f"new-{i}") for i in range(10 * LIST_KEYS_AT)] == [None] * (10 * LIST_KEYS_AT)
    assert state.calls == []
    assert store.get("held") == (b"s", b"", 10) and state.calls == ["getValue"]
    store.put("new-0", (b"t", b"", 20))
    store.remove("held")
    assert store.get("new-0") == (b"t", b"", 20) and store.get("held") is None
