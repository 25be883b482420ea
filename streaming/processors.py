"""The ``transformWithStateInPandas`` adapter around ``streaming.stages``: state in, state out, nothing else.

The stage is grouped by a *bucket* (a hash of the stage key, a connection's or an entity's, modulo
``stream.state_buckets``), so Spark makes one Python call per bucket and batch instead of one per
key. Inside a bucket each key has its own entry, and the
entries are kept in a few pages (``streaming.pages``), so a call pays a state-server round trip per
page it touches, not per key; the per-key steps in ``streaming.stages`` do the work. Each bucket arms
one event-time timer, at or before the earliest entry that needs a call (TTL expiry, a rule's timer,
routes waiting for the watermark).

State lives in Spark's RocksDB state store. The shard state is bytes carrying their own format number
(``checks.engine.STATE_FORMAT``), and the store's Avro encoding lets the columns evolve.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    MapState,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from checks.settings import ChecksSettings
from streaming.pages import PagedBucketStore
from streaming.router import PASS_BUCKET, read_bundle, read_passed
from streaming.rows import OutputRow
from streaming.stages import BucketResult, monitor_bucket, monitor_bucket_expired
from streaming.workergc import tune_worker_gc

#: A bucket's pages (``streaming.pages``): a map from page number to the page's entries (msgpack).
PAGE_KEY = StructType([StructField("page", IntegerType())])
PAGE = StructType([StructField("entries", BinaryType())])
#: A bucket's meta (``streaming.pages``): page counts, every entry's next call and the armed timer.
BUCKET_META = StructType([StructField("meta", BinaryType())])

#: The stage's output (``streaming.rows.OutputRow``): what foreachBatch sees.
OUTPUT_DDL = "kind string, ts_ns long, payload string"


class SparkPages:
    """``streaming.pages.PageBackend`` over a bucket's Spark state: a ``MapState`` of pages and a
    ``ValueState`` for the meta. Each method is one round trip to the JVM's state server."""

    def __init__(self, pages: MapState, meta: ValueState) -> None:
        self.pages = pages
        self.meta = meta

    def read_meta(self) -> bytes | None:
        value = self.meta.get()  # None when unset: no separate exists() round trip
        return bytes(value[0]) if value and value[0] is not None else None

    def write_meta(self, data: bytes | None) -> None:
        if data is None:
            self.meta.clear()
        else:
            self.meta.update((data,))

    def read_page(self, page: int) -> bytes | None:
        value = self.pages.getValue((page,))
        return bytes(value[0]) if value and value[0] is not None else None

    def write_page(self, page: int, data: bytes | None) -> None:
        if data is None:
            self.pages.removeKey((page,))
        else:
            self.pages.updateValue((page,), (data,))

    def read_pages(self) -> Iterable[tuple[int, bytes]]:
        # Read every page before the caller changes any: the iterator reads the store lazily.
        return [(int(key[0]), bytes(value[0])) for key, value in self.pages.iterator()]


class BucketTimer:
    """The bucket's one event-time timer; which one is armed is kept in the bucket's meta
    (``PagedBucketStore.armed``), so moving it costs no lookup of its own."""

    def __init__(self, handle: StatefulProcessorHandle, store: PagedBucketStore) -> None:
        self.handle = handle
        self.store = store

    def move(self, armed: int | None, wanted: int | None) -> None:
        """From ``armed`` (None: none armed, or the one that just fired) to ``wanted``."""
        self.store.set_armed(wanted)
        if armed is not None and armed == wanted:
            return
        if armed is not None:
            self.handle.deleteTimer(armed)
        if wanted is not None:
            self.handle.registerTimer(wanted)


def _output_frame(rows: list[OutputRow]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(OutputRow._fields))


class _BucketProcessor(StatefulProcessor):
    """One bucket's pages, meta and timer; subclasses say which step runs."""

    STATE_NAME = ""

    def __init__(self, config: ChecksSettings, tune_gc: bool = False) -> None:
        self.config = config
        #: ``stream.worker_gc``: tune the worker's garbage collector at the first init (streaming.workergc).
        self.tune_gc = tune_gc

    def init(self, handle: StatefulProcessorHandle) -> None:
        if self.tune_gc:
            tune_worker_gc()
        # Spark allows state TTLs only in processing-time mode; idle entries expire by event-time timers.
        pages = handle.getMapState(f"{self.STATE_NAME}_pages", PAGE_KEY, PAGE)
        meta = handle.getValueState(f"{self.STATE_NAME}_meta", BUCKET_META)
        self.store = PagedBucketStore(SparkPages(pages, meta))
        self.timer = BucketTimer(handle, self.store)

    def _begin(self) -> int | None:
        """Before a call: the bucket's timer as armed now."""
        self.store.begin()
        return self.store.armed

    def _apply(self, armed: int | None, result: BucketResult) -> list[OutputRow]:
        self.timer.move(armed, result.timer_ms)
        self.store.finish()
        return result.rows

    def close(self) -> None:
        pass


class MonitorProcessor(_BucketProcessor):
    """The stateful stage, grouped by bucket (``streaming.rows.bucket_index`` of a stage key), plus
    ``PASS_BUCKET`` for rows that are already final. Its input rows are bundles (``streaming.router``)."""

    STATE_NAME = "monitor"

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        blobs = [bytes(blob) for pdf in rows for blob in pdf["bundle"].tolist()]
        if int(key[0]) == PASS_BUCKET:
            passed = [row for blob in blobs for row in read_passed(blob)]
            if passed:
                yield _output_frame(passed)
            return
        armed = self._begin()
        result = monitor_bucket(
            self.config,
            self.store,
            [read_bundle(blob) for blob in blobs],
            timerValues.getCurrentWatermarkInMs(),
            armed,
        )
        out = self._apply(armed, result)
        if out:
            yield _output_frame(out)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        self._begin()
        # The timer that fired is gone: nothing to delete.
        out = self._apply(None, monitor_bucket_expired(self.config, self.store, watermark))
        if out:
            yield _output_frame(out)
