"""The paged bucket store (``streaming.pages``) against the dict it stands in for."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.pages import (
    PAGES_FORMAT,
    DictPageBackend,
    PagedBucketStore,
    PageFormatError,
    page_hash,
)
from streaming.stages import DictBucketStore

KEYS = [f"key-{i}" for i in range(40)]
ENTRY = st.tuples(st.binary(max_size=8), st.none() | st.integers(0, 100))
OP = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), ENTRY),
    st.tuples(st.just("remove"), st.sampled_from(KEYS)),
    st.tuples(st.just("get"), st.sampled_from(KEYS)),
    st.tuples(st.just("due"), st.integers(0, 100)),
    st.tuples(st.just("items")),
)


def apply(store: Any, op: tuple[Any, ...]) -> Any:
    name = op[0]
    if name == "put":
        return store.put(op[1], op[2])
    if name == "remove":
        return store.remove(op[1])
    if name == "get":
        return store.get(op[1])
    if name == "due":
        ready, later = store.due(op[1])
        return sorted(ready), later
    return sorted(store.items())


@settings(max_examples=300, deadline=None)
@given(calls=st.lists(st.lists(OP, max_size=30), max_size=12), per_page=st.integers(1, 8))
def test_pages_answer_as_the_dict_does_across_calls_and_moves(
    calls: list[list[tuple[Any, ...]]], per_page: int
) -> None:
    """Any calls of any operations: the same answers as ``DictBucketStore``. Each call starts from the
    saved bytes alone (a new store over the same backend: another worker may run the next call)."""
    backend = DictPageBackend()
    reference = DictBucketStore()
    for ops in calls:
        store = PagedBucketStore(backend, per_page)
        store.begin()
        for op in ops:
            assert apply(store, op) == apply(reference, op), op
        store.finish()
    store = PagedBucketStore(backend, per_page)
    assert sorted(store.items()) == sorted(reference.items())
    assert len(store) == len(reference.entries)
    if not reference.entries:
        assert backend.pages == {} and backend.meta is None


def test_a_page_emptied_by_removals_is_dropped() -> None:
    backend = DictPageBackend()
    store = PagedBucketStore(backend, entries_per_page=1)
    for key in ("key-1", "key-3", "key-4", "key-16"):
        store.put(key, (b"", None))
    store.finish()
    assert len(backend.pages) == 4
    store = PagedBucketStore(backend, entries_per_page=1)
    store.put("key-0", (b"", None))
    store.remove("key-16")
    store.remove("key-3")
    store.finish()
    listed = sorted(key for key, _ in PagedBucketStore(backend, entries_per_page=1).items())
    assert listed == ["key-0", "key-1", "key-4"]
    assert sorted(len(msgpack.unpackb(page)) for page in backend.pages.values()) == [1, 1, 1]


def test_pages_fill_in_arrival_order_and_never_overflow() -> None:
    backend = DictPageBackend()
    for batch in range(10):
        store = PagedBucketStore(backend, entries_per_page=8)
        for i in range(100):
            store.put(f"p{batch}-{i}", (b"x" * 10, None))
        store.finish()
        sizes = [len(msgpack.unpackb(page)) for page in backend.pages.values()]
        entries = 100 * (batch + 1)
        assert sum(sizes) == entries and max(sizes) <= 8
        assert len(backend.pages) == -(-entries // 8)  # every page full but the open one


def test_new_keys_of_a_call_touch_the_open_page_not_every_page() -> None:
    """A live batch brings a bucket a few new keys (producers starting) and releases those of a batch
    or two before: they touch the pages they arrived in, not every page of the bucket."""
    backend = DictPageBackend()
    store = PagedBucketStore(backend)
    for i in range(1_200):
        store.put(f"producer|{i}", (b"shard", b"", 10_000 + i))
    store.finish()
    assert len(backend.pages) == 10
    for batch in range(5):
        store = PagedBucketStore(backend)
        backend.round_trips = 0
        arrived = [f"producer|new-{batch}-{i}" for i in range(20)]
        for key in arrived:
            store.put(key, (None, b"routes", 20_000))
        if batch:
            for key in [f"producer|new-{batch - 1}-{i}" for i in range(20)]:
                saved = store.get(key)
                assert saved is not None
                store.put(key, (b"shard", b"", 30_000))
        store.finish()
        # The meta, read and written, and at most two pages (the open page and the one before it).
        assert backend.round_trips <= 2 + 2 * 2, batch


def test_a_thin_page_a_call_writes_moves_to_the_open_page() -> None:
    """Long-lived keys outlive their neighbours: a page left a quarter full or less is merged into the
    open page when a call writes it anyway, so a bucket of long-lived keys stays on few pages."""
    backend = DictPageBackend()
    store = PagedBucketStore(backend, entries_per_page=8)
    for i in range(64):
        store.put(f"k{i}", (b"s", None))
    store.finish()
    assert len(backend.pages) == 8
    store = PagedBucketStore(backend, entries_per_page=8)
    for i in range(64):
        if i % 8 != 0:
            store.remove(f"k{i}")
    store.finish()
    # Eight survivors, one per page, gathered on as few pages as they fill.
    assert len(backend.pages) == 1
    store = PagedBucketStore(backend, entries_per_page=8)
    assert sorted(key for key, _ in store.items()) == sorted(f"k{i}" for i in range(0, 64, 8))


def test_a_format_1_bucket_is_read_and_written_back_as_format_2() -> None:
    """Format 1 placed each key on the page its hash named (of a power-of-two page count)."""
    backend = DictPageBackend()
    keys = [f"conn|tap-1-{i}" for i in range(40)]
    pages: dict[int, dict[str, list[Any]]] = {}
    for i, key in enumerate(keys):
        pages.setdefault(page_hash(key) & 3, {})[key] = [b"state", 100 + i]
    backend.pages = {page: msgpack.packb(entries, use_bin_type=True) for page, entries in pages.items()}
    counts = [len(pages.get(page, {})) for page in range(4)]
    backend.meta = msgpack.packb([1, counts, {key: 100 + i for i, key in enumerate(keys)}, 105])
    store = PagedBucketStore(backend)
    assert store.get(keys[7]) == (b"state", 107) and store.armed == 105
    ready, later = store.due(102)
    assert sorted(key for key, _ in ready) == sorted(keys[:3]) and later == 103
    store.put("conn|new", (b"state", 500))
    store.finish()
    assert msgpack.unpackb(backend.meta)[0] == PAGES_FORMAT == 2
    again = PagedBucketStore(backend)
    assert sorted(again.items()) == sorted(
        [(key, (b"state", 100 + i)) for i, key in enumerate(keys)] + [("conn|new", (b"state", 500))]
    )


def test_lookups_of_keys_the_bucket_does_not_hold_read_no_page() -> None:
    backend = DictPageBackend()
    store = PagedBucketStore(backend)
    store.begin()
    store.put("held", (b"s", 1))
    store.finish()
    store.begin()
    backend.round_trips = 0
    assert [store.get(f"new-{i}") for i in range(50)] == [None] * 50
    assert backend.round_trips == 1  # the meta, once
    store.finish()
    assert backend.round_trips == 1  # nothing changed: nothing written


def test_a_call_on_a_busy_bucket_costs_a_round_trip_per_page() -> None:
    """1,000 live connections touched in one call: at most a read and a write per page plus the meta,
    against two round trips per connection with an entry per key."""
    backend = DictPageBackend()
    store = PagedBucketStore(backend)
    keys = [f"conn-{i}" for i in range(1_000)]
    store.begin()
    for key in keys:
        store.put(key, (b"state", 1))
    store.finish()
    store.begin()
    backend.round_trips = 0
    for key in keys:
        saved = store.get(key)
        assert saved is not None
        store.put(key, (saved[0], 2))
    store.finish()
    pages = len(backend.pages)
    assert pages <= 64 and backend.round_trips == 2 * pages + 2


def test_a_meta_of_another_format_is_refused_not_misread() -> None:
    backend = DictPageBackend()
    backend.meta = msgpack.packb([PAGES_FORMAT + 1, [0], {}, None])
    store = PagedBucketStore(backend)
    store.begin()
    with pytest.raises(PageFormatError, match=f"format {PAGES_FORMAT + 1}; this build reads 1, 2$"):
        store.get("k")
