"""``transformWithStateInPandas`` adapters around ``streaming.stages``: state in, state out, nothing else.

Both stages are grouped by a *bucket* (a hash of the connection, or of the route key, modulo
``stream.state_buckets``), so Spark makes one Python call per bucket and batch instead of one per
connection or route key. Inside a bucket each connection or route key has its own entry in a
``MapState``; the per-key steps in ``streaming.stages`` do the work. Each bucket arms one event-time
timer, at or before the earliest entry that needs a call (TTL expiry, a rule's timer, routes waiting
for the watermark).

State lives in Spark's RocksDB state store. The shard state is bytes carrying their own format number
(``checks.engine.STATE_FORMAT``), and the store's Avro encoding lets the columns evolve.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgpack
import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    MapState,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from checks.settings import ChecksSettings
from streaming.bundles import read_bundle
from streaming.stages import (
    EVENT_TIME_MS,
    STAGE_ROW_FIELDS,
    BucketResult,
    connection_bucket,
    connection_bucket_expired,
    keyed_bucket,
    keyed_bucket_expired,
    split_due,
)
from streaming.workergc import tune_worker_gc

#: Stage two's bucket for rows that are already final (findings, aggregates, counters): passed through.
PASS_BUCKET = -1

#: Map-state key of stage one (a connection) and of stage two (a route key).
ENTRY_KEY = StructType([StructField("key", StringType())])
#: Stage one's entry per connection: the shard's state (bytes) and when the connection expires.
CONNECTION_ENTRY = StructType([StructField("shard", BinaryType()), StructField("expires", LongType())])
#: Stage two's entry per route key: the shard's state (bytes), the routes waiting for the watermark (msgpack) and
#: when the key next needs a call.
KEYED_ENTRY = StructType(
    [
        StructField("shard", BinaryType()),
        StructField("buffer", BinaryType()),
        StructField("due", LongType()),
    ]
)
#: A bucket's due index: ``{key: next call ms}`` of every entry, msgpack (``MapStateStore.due``).
DUE_INDEX = StructType([StructField("dues", BinaryType())])
#: The bucket's one armed timer.
BUCKET_TIMER = StructType([StructField("timer", LongType())])

#: Stage one's output, stage two's input (``event_time`` drives the watermark between them).
STAGE_ROWS_DDL = (
    "kind string, route_key string, event_time timestamp, ts_ns long, at_ms long, conn string, "
    "seq long, frame binary, flags int, payload string"
)
#: Stage two's output: what foreachBatch sees.
OUTPUT_DDL = "kind string, ts_ns long, payload string"


#: A call that brings at least this many connections or route keys lists the bucket's keys once
#: (``MapStateStore.begin``) instead of asking the state server about each.
LIST_KEYS_AT = 8
#: ...unless the bucket held more than this many entries per key the call brings, last time it was listed.
LIST_KEYS_RATIO = 16


class MapStateStore:
    """``streaming.stages.BucketStore`` over a Spark ``MapState`` keyed by one string.

    Every value read or written is a round trip to the JVM's state server (0.1-1 ms each on this
    machine, docs/benchmarks.md), and most of a busy bucket's lookups are for keys it does not hold
    yet (new connections, new producers). With a due index (stage two), ``get`` asks the server only
    about keys the index names; without one (stage one), ``begin`` lists the bucket's keys in one
    round trip when a call brings many keys, and ``get`` then asks only about keys the bucket holds.
    What the stages read is the same either way; only the number of calls changes.
    """

    def __init__(self, state: MapState, index: ValueState | None = None) -> None:
        self.state = state
        #: The bucket's keys, when listed for this call; None: unknown, ask per key.
        self.known: set[str] | None = None
        #: How many entries each bucket held when last listed (a hint: per worker, never persisted).
        self.sizes: dict[Any, int] = {}
        #: The bucket's due index, kept in state (see ``due``); None: list the bucket instead.
        self.index = index
        #: This call's copy of the index ({key: next call ms}), read on first use; and whether it changed.
        self.dues: dict[str, int | None] | None = None
        self.dirty = False

    def begin(self, bucket: Any, keys: int) -> None:
        """Before a call on ``bucket`` (the grouping key Spark set) that will look up ``keys`` entries."""
        self.known = None
        self.dues, self.dirty = None, False
        size = self.sizes.get(bucket)
        # With a due index, ``get`` knows the bucket's keys without listing them.
        if self.index is None and keys >= LIST_KEYS_AT and (size is None or size <= LIST_KEYS_RATIO * keys):
            self.known = {key[0] for key in self.state.keys()}  # noqa: SIM118 (a MapState, not a dict)
            self.sizes[bucket] = len(self.known)

    def get(self, key: str) -> tuple[Any, ...] | None:
        if self.known is not None and key not in self.known:
            return None
        if self.index is not None and key not in self._dues():
            return None  # the index names every entry the bucket holds
        value = self.state.getValue((key,))
        return tuple(value) if value is not None else None

    def put(self, key: str, value: tuple[Any, ...]) -> None:
        self.state.updateValue((key,), value)
        if self.known is not None:
            self.known.add(key)
        if self.index is not None:
            dues = self._dues()
            if dues.get(key, -1) != value[-1]:
                dues[key] = value[-1]
                self.dirty = True

    def remove(self, key: str) -> None:
        self.state.removeKey((key,))
        if self.known is not None:
            self.known.discard(key)
        if self.index is not None and self._dues().pop(key, -1) != -1:
            self.dirty = True

    def items(self) -> Iterable[tuple[str, tuple[Any, ...]]]:
        # Read the whole bucket before the caller changes it: the iterator reads the store lazily.
        return [(key[0], tuple(value)) for key, value in self.state.iterator()]

    def due(self, watermark_ms: int) -> tuple[list[tuple[str, tuple[Any, ...]]], int | None]:
        """``BucketStore.due``. Listing the bucket reads every entry with its shard and buffered routes,
        on every timer fire, so its cost grows with the state held (producers live for days), not with
        the traffic; with an index only the due entries are read."""
        if self.index is None:
            return split_due(self.items(), watermark_ms)
        index = {key: (at,) for key, at in self._dues().items()}
        keys, later = split_due(index.items(), watermark_ms)
        ready: list[tuple[str, tuple[Any, ...]]] = []
        for key, _ in keys:
            value = self.state.getValue((key,))
            if value is None:  # gone without the index knowing: nothing to do for it
                self._dues().pop(key, None)
                self.dirty = True
                continue
            ready.append((key, tuple(value)))
        return ready, later

    def finish(self) -> None:
        """After the call: keep the index if it changed."""
        if self.index is None or not self.dirty or self.dues is None:
            return
        if self.dues:
            self.index.update((msgpack.packb(self.dues),))
        else:
            self.index.clear()
        self.dirty = False

    def _dues(self) -> dict[str, int | None]:
        if self.dues is None:
            saved = self.index.get() if self.index is not None else None
            if saved is not None and saved[0] is not None:
                self.dues = msgpack.unpackb(saved[0])
            else:
                # No index yet (a bucket from before it, or an empty one): made once from the entries.
                self.dues = {key: value[-1] for key, value in self.items()}
                self.dirty = bool(self.dues)
        return self.dues


class BucketTimer:
    """The bucket's one event-time timer, kept in a value state so it can be moved without a lookup."""

    def __init__(self, handle: StatefulProcessorHandle, state: ValueState) -> None:
        self.handle = handle
        self.state = state

    def armed(self) -> int | None:
        value = self.state.get()  # None when unset: no separate exists() round trip
        return int(value[0]) if value and value[0] is not None else None

    def move(self, armed: int | None, wanted: int | None) -> None:
        """From ``armed`` (None: none armed, or the one that just fired) to ``wanted``."""
        if armed is not None and armed == wanted:
            return
        if armed is not None:
            self.handle.deleteTimer(armed)
        if wanted is None:
            self.state.clear()
            return
        self.handle.registerTimer(wanted)
        self.state.update((wanted,))


def _records(rows: Iterator[pd.DataFrame]) -> list[dict[str, Any]]:
    """Rows as dicts, column by column (``to_dict("records")`` boxes every cell on its own)."""
    out: list[dict[str, Any]] = []
    for pdf in rows:
        if "event_time" in pdf.columns:
            # A pandas Timestamp per row costs more than the stage needs: event time in milliseconds.
            millis = pdf["event_time"].to_numpy(dtype="datetime64[ms]").astype("int64")
            pdf = pdf.drop(columns="event_time").assign(**{EVENT_TIME_MS: millis})
        columns = list(pdf.columns)
        out.extend(
            dict(zip(columns, values, strict=True))
            for values in zip(*(pdf[c].tolist() for c in columns), strict=True)
        )
    return out


def _stage_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(STAGE_ROW_FIELDS))
    frame["event_time"] = pd.to_datetime(frame.pop("event_ms"), unit="ms")
    return frame[[c.split()[0] for c in STAGE_ROWS_DDL.split(", ")]]


def _output_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"kind": r["kind"], "ts_ns": r["ts_ns"], "payload": r["payload"]} for r in rows],
        columns=["kind", "ts_ns", "payload"],
    )


class _BucketProcessor(StatefulProcessor):
    """One bucket's map state and timer; subclasses say which step runs."""

    STATE_NAME = ""
    ENTRY: StructType
    #: Keep a due index (``MapStateStore.due``) beside the entries.
    KEEP_DUE_INDEX = False

    def __init__(self, config: ChecksSettings, tune_gc: bool = False) -> None:
        self.config = config
        #: ``stream.worker_gc``: tune the worker's garbage collector at the first init (streaming.workergc).
        self.tune_gc = tune_gc

    def init(self, handle: StatefulProcessorHandle) -> None:
        if self.tune_gc:
            tune_worker_gc()
        # Spark allows state TTLs only in processing-time mode; idle entries expire by event-time timers.
        index = handle.getValueState(f"{self.STATE_NAME}_due", DUE_INDEX) if self.KEEP_DUE_INDEX else None
        self.store = MapStateStore(handle.getMapState(self.STATE_NAME, ENTRY_KEY, self.ENTRY), index)
        self.timer = BucketTimer(handle, handle.getValueState(f"{self.STATE_NAME}_timer", BUCKET_TIMER))

    def _apply(self, armed: int | None, result: BucketResult) -> list[dict[str, Any]]:
        self.store.finish()
        self.timer.move(armed, result.timer_ms)
        return result.rows

    def close(self) -> None:
        pass


class ConnectionProcessor(_BucketProcessor):
    """Stage one, grouped by a bucket of tap connections; its input rows are bundles of tap-record rows
    (``streaming.bundles``). ``clocks``: stage two's bucket count, each sent the batch clock
    (``streaming.stages``)."""

    STATE_NAME = "connections"
    ENTRY = CONNECTION_ENTRY

    def __init__(self, config: ChecksSettings, tune_gc: bool = False, clocks: int = 0) -> None:
        super().__init__(config, tune_gc)
        self.clocks = clocks

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        records = [
            frame for pdf in rows for bundle in pdf["bundle"].tolist() for frame in read_bundle(bundle)
        ]
        self.store.begin(key, len({r["conn"] for r in records}))
        armed = self.timer.armed()
        result = connection_bucket(
            self.config, self.store, records, timerValues.getCurrentWatermarkInMs(), armed, self.clocks
        )
        out = self._apply(armed, result)
        if out:
            yield _stage_frame(out)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        # The timer that fired is gone: nothing to delete.
        self.store.begin(key, 0)
        out = self._apply(None, connection_bucket_expired(self.store, timerValues.getCurrentWatermarkInMs()))
        if out:
            yield _stage_frame(out)


class KeyedProcessor(_BucketProcessor):
    """Stage two, grouped by a bucket of route keys (``"<key kind>|<state key>"``), plus ``PASS_BUCKET``."""

    STATE_NAME = "route_keys"
    ENTRY = KEYED_ENTRY
    # Every route key holds state for its TTL (days for producers), and the bucket's timer fires in
    # nearly every batch, as routes wait one lateness: a fire must read only the due keys.
    KEEP_DUE_INDEX = True

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        records = _records(rows)
        if int(key[0]) == PASS_BUCKET:
            if records:
                yield _output_frame(records)
            return
        self.store.begin(key, len({r["route_key"] for r in records}))
        armed = self.timer.armed()
        result = keyed_bucket(self.config, self.store, records, timerValues.getCurrentWatermarkInMs(), armed)
        out = self._apply(armed, result)
        if out:
            yield _output_frame(out)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        self.store.begin(key, 0)
        out = self._apply(None, keyed_bucket_expired(self.config, self.store, watermark))
        if out:
            yield _output_frame(out)
