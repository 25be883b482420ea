"""A bucket's entries kept in pages: one state value per page, not one per connection or route key.

Every value a ``transformWithStateInPandas`` call reads or writes is a round trip to the JVM's state
server, and a round trip costs about the same whether it carries one entry or a hundred
(``benchmarks/state_api_bench.py``: ~0.85 ms each on the 2-core machine). A bucket that held one
``MapState`` entry per key paid a round trip for every key a call touched, twice (read and write): a
fleet's long-lived connections are all touched in every batch, so the connection entries' state work
grew with the fleet, not with the traffic. Here a bucket's entries live in pages of at most
``entries_per_page``, and a call pays a round trip per page it touches, plus one to read and one to
write the bucket's *meta*: the format, every key's page and next call (the index, so a lookup of a key
the bucket does not hold and a timer's sweep read no page in vain), the armed timer and the open page.

**Pages by arrival.** A new key goes to the bucket's *open* page, and a new open page is started when it
is full, so keys that arrive together share pages. Keys that arrive together are mostly touched together
after (a producer's routes wait for the watermark and are released a batch or two later; short sessions
idle out together), so a call that meets many new keys touches a page or two, not every page of the
bucket, as placing keys by a hash of the key did: with a hash, the producers a live batch brings a bucket
and those it releases (20-30 each in ``benchmarks/stream_bench.py``) touched 15 of its 16 pages once it
held 1,200 entries, so the state round trips of a live batch grew with the state. A page the call writes
anyway that has fallen to a quarter full or less moves its entries to the open page, so removals do not
leave a bucket of long-lived keys spread thin.

Format 1 placed keys by ``page_hash``; it is read (each key's page is its hash modulo the page count)
and written back as format 2.

Pure: no Spark. ``streaming.processors`` backs it with Spark state (``PageBackend``); tests and
benchmarks back it with ``DictPageBackend``, which counts the round trips a Spark backend would make.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Final, Protocol

import msgpack

#: Layout number of the meta this build writes; ``READABLE_PAGES_FORMATS`` are read, any other is
#: refused, never misread.
PAGES_FORMAT: Final = 2
READABLE_PAGES_FORMATS: Final = frozenset({1, 2})
#: The most entries a page holds. A round trip costs about the same for one entry or 128
#: (``benchmarks/state_api_bench.py``: ~0.85 ms, and 1.0 ms for a 40 kB value), so larger pages mean
#: fewer trips: 128 against 32 cut the stages' trips by 35 % on 6,000-frame batches and by 51 % on
#: 20,000-frame ones (``stages_bench.py``), their CPU within the run-to-run spread. Only where new keys
#: go depends on it (every key's page is in the meta), so a bucket saved with other pages is read as it is.
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
        #: Every key's page.
        self._place: dict[str, int] = {}
        #: Entries per page that holds any.
        self._counts: dict[int, int] = {}
        #: Every entry's next call: the due index.
        self._dues: dict[str, int | None] = {}
        #: The page new keys go to.
        self._open = 0
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
        layout = saved[0] if isinstance(saved, list) and saved else "?"
        if layout not in READABLE_PAGES_FORMATS:
            readable = ", ".join(map(str, sorted(READABLE_PAGES_FORMATS)))
            raise PageFormatError(f"bucket state pages of format {layout!r}; this build reads {readable}")
        if layout == 1:
            _, counts, self._dues, self._armed = saved
            mask = len(counts) - 1
            self._place = {key: page_hash(key) & mask for key in self._dues}
            self._meta_dirty = True  # written back as this build's format
        else:
            _, keys, pages, dues, self._armed, self._open = saved
            self._place = dict(zip(keys, pages, strict=True))
            self._dues = dict(zip(keys, dues, strict=True))
        for page in self._place.values():
            self._counts[page] = self._counts.get(page, 0) + 1

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

    def _page(self, page: int) -> dict[str, Entry]:
        entries = self._pages.get(page)
        if entries is None:
            # A page the meta counts empty is not asked for.
            data = self.backend.read_page(page) if self._counts.get(page) else None
            entries = _unpack_page(data) if data is not None else {}
            self._pages[page] = entries
        return entries

    def _place_new(self, key: str, value: Entry) -> None:
        """A key the bucket does not hold, into the open page (a new one when it is full)."""
        page = self._open
        if self._counts.get(page, 0) >= self.entries_per_page:
            page = self._open = next(p for p in range(len(self._counts) + 1) if not self._counts.get(p))
        self._page(page)[key] = value
        self._place[key] = page
        self._counts[page] = self._counts.get(page, 0) + 1
        self._dirty.add(page)
        self._meta_dirty = True

    # -- BucketStore -------------------------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        self._meta()
        page = self._place.get(key)
        if page is None:
            return None  # the index names every entry the bucket holds
        return self._page(page).get(key)

    def put(self, key: str, value: Entry) -> None:
        self._meta()
        page = self._place.get(key)
        if page is None:
            self._place_new(key, value)
        else:
            self._page(page)[key] = value
            self._dirty.add(page)
        due = value[-1]
        if key not in self._dues or self._dues[key] != due:
            self._dues[key] = due
            self._meta_dirty = True

    def remove(self, key: str) -> None:
        self._meta()
        page = self._place.pop(key, None)
        if page is None:
            return
        self._dues.pop(key, None)
        self._meta_dirty = True
        self._page(page).pop(key, None)
        self._counts[page] -= 1
        if not self._counts[page]:
            del self._counts[page]
        self._dirty.add(page)

    def items(self) -> list[tuple[str, Entry]]:
        """Every entry (one listing of the pages, merged with what this call changed)."""
        self._meta()
        pages = {page: _unpack_page(data) for page, data in self.backend.read_pages()}
        pages.update(self._pages)  # what this call read and changed wins over what is saved
        self._pages = pages
        return [item for entries in pages.values() for item in entries.items()]

    def due(self, watermark_ms: int) -> tuple[list[tuple[str, Entry]], int | None]:
        """``BucketStore.due`` from the due index: only the pages that hold due entries are read."""
        self._meta()
        keys, later = split_due(((key, (at,)) for key, at in self._dues.items()), watermark_ms)
        ready: list[tuple[str, Entry]] = []
        for key, _ in keys:
            entry = self._page(self._place[key]).get(key)
            if entry is None:  # named by the index but in no page: nothing to do for it
                self.remove(key)
                continue
            ready.append((key, entry))
        return ready, later

    def finish(self) -> None:
        """After the call: move the entries of thin pages it touched to the open page, then write what
        changed."""
        self._meta()
        thin = self.entries_per_page // 4
        for page in sorted(self._dirty):
            if page != self._open and 0 < self._counts.get(page, 0) <= thin:
                moving = self._pages[page]
                self._pages[page] = {}
                del self._counts[page]
                for key, value in moving.items():
                    self._place_new(key, value)
        for page in sorted(self._dirty):
            entries = self._pages[page]
            self.backend.write_page(page, _pack_page(entries) if entries else None)
        self._dirty.clear()
        if self._meta_dirty:
            empty = not self._dues and self._armed is None
            keys = list(self._dues)
            self.backend.write_meta(
                None
                if empty
                else msgpack.packb(
                    [
                        PAGES_FORMAT,
                        keys,
                        [self._place[key] for key in keys],
                        [self._dues[key] for key in keys],
                        self._armed,
                        self._open,
                    ]
                )
            )
            self._meta_dirty = False
