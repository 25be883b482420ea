"""The paged bucket store (``streaming.pages``) against the dict it stands in for."""

from __future__ import annotations

import zlib
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
@given(calls=st.lists(st.lists(OP, max_size=30), max_size=12), per_page=st.integers(1, 4))
def test_pages_answer_as_the_dict_does_across_calls_and_splits(
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


def test_a_page_emptied_before_a_split_is_dropped() -> None:
    """Hypothesis found it in CI: a call empties a saved page, then its puts make the bucket split. The
    emptied page must be deleted, or the removed entry comes back in the next listing."""
    backend = DictPageBackend()
    store = PagedBucketStore(backend, entries_per_page=1)
    for key in ("key-1", "key-3", "key-4", "key-16"):
        store.put(key, (b"", None))
    store.finish()
    assert len(backend.pages) == 3  # key-16 alone in its page
    store = PagedBucketStore(backend, entries_per_page=1)
    store.put("key-0", (b"", None))
    store.put("key-2", (b"", None))
    store.remove("key-16")
    store.finish()
    listed = sorted(key for key, _ in PagedBucketStore(backend, entries_per_page=1).items())
    assert listed == ["key-0", "key-1", "key-2", "key-3", "key-4"]
    assert sum(len(msgpack.unpackb(page)) for page in backend.pages.values()) == 5


def test_the_page_count_doubles_as_the_bucket_grows_and_pages_stay_small() -> None:
    backend = DictPageBackend()
    store = PagedBucketStore(backend, entries_per_page=8)
    for batch in range(10):
        store.begin()
        for i in range(100):
            store.put(f"p{batch}-{i}", (b"x" * 10, None))
        store.finish()
        sizes = [len(msgpack.unpackb(page)) for page in backend.pages.values()]
        entries = 100 * (batch + 1)
        assert sum(sizes) == entries
        # Pages average at most eight entries; hashing keeps the fullest page near that.
        assert len(backend.pages) >= entries / 8 / 2 and max(sizes) <= 4 * 8


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


def test_keys_of_one_crc32_bucket_spread_over_the_pages() -> None:
    """Stage one's bucket is CRC-32 of the connection modulo the bucket count: the page hash must not
    be, or every connection of a bucket would share one page."""
    keys = [f"tap-1-{i}" for i in range(20_000) if zlib.crc32(f"tap-1-{i}".encode()) % 16 == 0]
    used = {page_hash(key) & 63 for key in keys}
    assert len(keys) > 1_000 and len(used) == 64


def test_a_meta_of_another_format_is_refused_not_misread() -> None:
    backend = DictPageBackend()
    backend.meta = msgpack.packb([PAGES_FORMAT + 1, [0], {}, None])
    store = PagedBucketStore(backend)
    store.begin()
    with pytest.raises(PageFormatError, match=f"format {PAGES_FORMAT + 1}.*reads {PAGES_FORMAT}"):
        store.get("k")
