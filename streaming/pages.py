"""A bucket's entries kept in pages: one state value per page, not one per connection or route key.

Every value a ``transformWithStateInPandas`` call reads or writes is a round trip to the JVM's state
server, and a round trip costs about the same whether it carries one entry or a hundred
(``benchmarks/state_api_bench.py``: ~0.85 ms each on the 2-core machine). A bucket that held one
``MapState`` entry per key paid a round trip for every key a call touched, twice (read and write): a
fleet's long-lived connections are all touched in every batch, so the connection entries' state work
grew with the fleet, not with the traffic. Here a bucket's entries live in ``2**depth`` pages (a key's page is
a hash of the key), and a call pays a round trip per page it touches, plus one to read and one to
write the bucket's *meta*: the format, each page's entry count and every key's next call (the due
index, so a lookup of a key the bucket does not hold and a timer's sweep read no page in vain).

The page count doubles when the entries average more than ``entries_per_page`` per page (each
existing page splits in two, read and written once), so a page's size stays bounded as the state
grows and the cost of a split is paid once per doubling.

Pure: no Spark. ``streaming.processors`` backs it with Spark state (``PageBackend``); tests and
benchmarks back it with ``DictPageBackend``, which counts the round trips a Spark backend would make.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Final, Protocol

import msgpack

#: Layout number of the meta and pages; a meta of another number is refused, never misread.
PAGES_FORMAT: Final = 1
#: A bucket doubles its page count when its entries average more than this many per page. A round trip
#: costs about the same for one entry or 128 (``benchmarks/state_api_bench.py``: ~0.85 ms, and 1.0 ms for
#: a 40 kB value), so larger pages mean fewer trips: 128 against 32 cut the stages' trips by 35 % on
#: 6,000-frame batches and by 51 % on 20,000-frame ones (``stages_bench.py``), their CPU within the
#: run-to-run spread. Only when a split happens depends on it (the page count is in the meta), so a
#: bucket saved with smaller pages is read as it is.
ENTRIES_PER_PAGE: Final = 128

Entry = tuple[Any, ...]


def earliest(a: int | None, b: int | None) -> int | None:
    """The earlier of two optional times (None: unset)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


def split_due(
    entries: Iterable[tuple[str, tuple[Any, ...]]], watermark_ms: int
) -> tuple[list[tuple[str, tuple[Any, ...]]], int | None]:
    """``streaming.stages.BucketStore.due`` over entries: an entry is due when its last field (its
    next call, event-time ms) is at or before the watermark, or unset."""
    due: list[tuple[str, tuple[Any, ...]]] = []
    later: int | None = None
    for key, value in entries:
        at = value[-1]
        if at is not None and at > watermark_ms:
            later = earliest(later, at)
        else:
            due.append((key, value))
    return due, later


class PageFormatError(ValueError):
    """A bucket's saved meta has a layout this build does not read."""


class PageBackend(Protocol):
    """Where one bucket's meta and pages are kept. Each method is one round trip in the job."""

    def read_meta(self) -> bytes | None: ...

    def write_meta(self, data: bytes | None) -> None:
        """None: the bucket is empty, drop the meta."""
        ...

    def read_page(self, page: int) -> bytes | None: ...

    def write_page(self, page: int, data: bytes | None) -> None:
        """None: the page is empty, drop it."""
        ...

    def read_pages(self) -> Iterable[tuple[int, bytes]]:
        """Every page the bucket holds (one listing)."""
        ...


class DictPageBackend:
    """A ``PageBackend`` in memory that counts the round trips a Spark backend would make."""

    def __init__(self) -> None:
        self.meta: bytes | None = None
        self.pages: dict[int, bytes] = {}
        self.round_trips = 0

    def read_meta(self) -> bytes | None:
        self.round_trips += 1
        return self.meta

    def write_meta(self, data: bytes | None) -> None:
        self.round_trips += 1
        self.meta = data

    def read_page(self, page: int) -> bytes | None:
        self.round_trips += 1
        return self.pages.get(page)

    def write_page(self, page: int, data: bytes | None) -> None:
        self.round_trips += 1
        if data is None:
            self.pages.pop(page, None)
        else:
            self.pages[page] = data

    def read_pages(self) -> Iterable[tuple[int, bytes]]:
        self.round_trips += 1
        return list(self.pages.items())


def page_hash(key: str) -> int:
    """A key's page hash. Not CRC-32: a stage key's bucket is CRC-32 of the key modulo the bucket
    count (``streaming.rows.bucket_index``), so CRC-32's low bits are the same for every key of a
    bucket and would fill one page."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def _pack_page(entries: dict[str, Entry]) -> bytes:
    return msgpack.packb(entries, use_bin_type=True)


def _unpack_page(data: bytes) -> dict[str, Entry]:
    return {key: tuple(value) for key, value in msgpack.unpackb(data, raw=False).items()}


class PagedBucketStore:
    """``streaming.stages.BucketStore`` over a ``PageBackend``, for one call at a time: ``begin`` before
    a call, ``finish`` after it (which writes what the call changed). The last field of every entry is
    its next call (event-time ms, or None: due at once), as ``split_due`` reads it."""

    def __init__(self, backend: PageBackend, entries_per_page: int = ENTRIES_PER_PAGE) -> None:
        self.backend = backend
        self.entries_per_page = entries_per_page
        self.begin()

    def begin(self) -> None:
        """Before a call: forget what the last call read (another bucket may have run in between)."""
        self._loaded = False
        #: Entries per page (its length is the page count, a power of two).
        self._counts: list[int] = [0]
        #: Every entry's next call: the due index.
        self._dues: dict[str, int | None] = {}
        #: The bucket's armed event-time timer, kept with the meta (``armed``).
        self._armed: int | None = None
        self._meta_dirty = False
        self._pages: dict[int, dict[str, Entry]] = {}
        self._dirty: set[int] = set()

    # -- the meta ----------------------------------------------------------------------------------

    def _meta(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        data = self.backend.read_meta()
        if data is None:
            return
        saved = msgpack.unpackb(data, raw=False)
        if not isinstance(saved, list) or not saved or saved[0] != PAGES_FORMAT:
            found = saved[0] if isinstance(saved, list) and saved else "?"
            raise PageFormatError(f"bucket state pages of format {found!r}; this build reads {PAGES_FORMAT}")
        _, self._counts, self._dues, self._armed = saved

    @property
    def armed(self) -> int | None:
        """The bucket's event-time timer as last armed (None: none)."""
        self._meta()
        return self._armed

    def set_armed(self, at_ms: int | None) -> None:
        self._meta()
        if at_ms != self._armed:
            self._armed = at_ms
            self._meta_dirty = True

    def __len__(self) -> int:
        self._meta()
        return len(self._dues)

    # -- pages -------------------------------------------------------------------------------------

    def _page_of(self, key: str) -> int:
        return page_hash(key) & (len(self._counts) - 1)

    def _page(self, page: int) -> dict[str, Entry]:
        entries = self._pages.get(page)
        if entries is None:
            # A page the meta counts empty is not asked for.
            data = self.backend.read_page(page) if self._counts[page] else None
            entries = _unpack_page(data) if data is not None else {}
            self._pages[page] = entries
        return entries

    # -- BucketStore -------------------------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        self._meta()
        if key not in self._dues:
            return None  # the due index names every entry the bucket holds
        return self._page(self._page_of(key)).get(key)

    def put(self, key: str, value: Entry) -> None:
        self._meta()
        page = self._page_of(key)
        entries = self._page(page)
        if key not in entries:
            self._counts[page] += 1
            self._meta_dirty = True
        entries[key] = value
        self._dirty.add(page)
        due = value[-1]
        if key not in self._dues or self._dues[key] != due:
            self._dues[key] = due
            self._meta_dirty = True

    def remove(self, key: str) -> None:
        self._meta()
        if key not in self._dues:
            return
        del self._dues[key]
        self._meta_dirty = True
        page = self._page_of(key)
        entries = self._page(page)
        if entries.pop(key, None) is not None:
            self._counts[page] -= 1
            self._dirty.add(page)

    def items(self) -> list[tuple[str, Entry]]:
        """Every entry (one listing of the pages, merged with what this call changed)."""
        return [item for entries in self._all_pages().values() for item in entries.items()]

    def due(self, watermark_ms: int) -> tuple[list[tuple[str, Entry]], int | None]:
        """``BucketStore.due`` from the due index: only the pages that hold due entries are read."""
        self._meta()
        keys, later = split_due(((key, (at,)) for key, at in self._dues.items()), watermark_ms)
        ready: list[tuple[str, Entry]] = []
        for key, _ in keys:
            entry = self._page(self._page_of(key)).get(key)
            if entry is None:  # named by the index but in no page: nothing to do for it
                del self._dues[key]
                self._meta_dirty = True
                continue
            ready.append((key, entry))
        return ready, later

    def finish(self) -> None:
        """After the call: split the pages if the bucket outgrew them, then write what changed."""
        self._meta()
        if len(self._dues) > self.entries_per_page * len(self._counts):
            self._split()
        for page in sorted(self._dirty):
            entries = self._pages[page]
            self.backend.write_page(page, _pack_page(entries) if entries else None)
        self._dirty.clear()
        if self._meta_dirty:
            empty = not self._dues and self._armed is None
            self.backend.write_meta(
                None if empty else msgpack.packb([PAGES_FORMAT, self._counts, self._dues, self._armed])
            )
            self._meta_dirty = False

    def _all_pages(self) -> dict[int, dict[str, Entry]]:
        return self._listing()[0]

    def _listing(self) -> tuple[dict[int, dict[str, Entry]], set[int]]:
        """Every page, merged with what this call changed; and the pages the backend holds."""
        self._meta()
        pages = {page: _unpack_page(data) for page, data in self.backend.read_pages()}
        saved = set(pages)
        pages.update(self._pages)  # what this call read and changed wins over what is saved
        self._pages = pages
        return pages, saved

    def _split(self) -> None:
        """Double the page count until the entries fit: every page is read once and written once."""
        pages, saved = self._listing()
        entries = {key: value for page in pages.values() for key, value in page.items()}
        size = len(self._counts)
        while len(entries) > self.entries_per_page * size:
            size *= 2
        split: dict[int, dict[str, Entry]] = {page: {} for page in range(size)}
        for key, value in entries.items():
            split[page_hash(key) & (size - 1)][key] = value
        self._counts = [len(split[page]) for page in range(size)]
        # A saved page that holds no entry now must be dropped too, including one this call emptied
        # before the split (judged by what is saved, not by this call's copy of the page, which is
        # already empty: such a page was left behind and its entries came back).
        self._dirty = {page for page in range(size) if split[page]} | saved
        self._pages = split
        self._meta_dirty = True
