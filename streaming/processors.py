"""``transformWithStateInPandas`` adapters around ``streaming.stages``: state in, state out, nothing else.

State lives in Spark's RocksDB state store as JSON text in one value per key (plus, in stage two, a list
of buffered routes), so a new release can read the old layout: the JSON carries its own format number
(``checks.serde.STATE_FORMAT``) and the store's Avro encoding lets the columns evolve. Idle keys expire
through the state TTL, on top of the rules' own event-time TTLs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from kpmon.config import ChecksConfig
from streaming.stages import (
    PASS_KEY,
    STAGE_ROW_FIELDS,
    Buffered,
    connection_step,
    expired_row,
    keyed_step,
)

SAVED_STATE = StructType([StructField("json", StringType())])
BUFFERED = StructType(
    [
        StructField("at_ms", LongType()),
        StructField("ts_ns", LongType()),
        StructField("conn", StringType()),
        StructField("seq", LongType()),
        StructField("frame", StringType()),
        StructField("flags", IntegerType()),
    ]
)
#: Stage one's output, stage two's input (``event_time`` drives the watermark between them).
STAGE_ROWS_DDL = (
    "kind string, route_key string, event_time timestamp, ts_ns long, at_ms long, conn string, "
    "seq long, frame string, flags int, payload string"
)
#: Stage two's output: what foreachBatch sees.
OUTPUT_DDL = "kind string, ts_ns long, payload string"


def _saved(state: ValueState) -> str | None:
    value = state.get() if state.exists() else None
    return str(value[0]) if value else None


def _store(state: ValueState, value: str | None) -> None:
    if value is None:
        state.clear()
    else:
        state.update((value,))


def _reschedule(handle: StatefulProcessorHandle, at_ms: int | None) -> None:
    """Keep exactly one timer per key: the next moment its step must run again."""
    for old in handle.listTimers():
        if old != at_ms:
            handle.deleteTimer(old)
    if at_ms is not None:
        handle.registerTimer(at_ms)


def _records(rows: Iterator[pd.DataFrame]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for pdf in rows:
        out.extend(pdf.to_dict("records"))
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


class ConnectionProcessor(StatefulProcessor):
    """Stage one, keyed by tap connection."""

    def __init__(self, config: ChecksConfig) -> None:
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        # Spark allows state TTLs only in processing-time mode; idle keys expire by event-time timers.
        self.handle = handle
        self.saved = handle.getValueState("shard", SAVED_STATE)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        saved = _saved(self.saved)
        result = connection_step(self.config, saved, _records(rows), timerValues.getCurrentWatermarkInMs())
        _store(self.saved, result.state)
        _reschedule(self.handle, result.next_timer_ms)
        if result.rows:
            yield _stage_frame(result.rows)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        # The only timer of this stage is the idle TTL, re-armed by every batch that has rows.
        if self.saved.exists():
            self.saved.clear()
            yield _stage_frame([expired_row(timerValues.getCurrentWatermarkInMs() + 1)])

    def close(self) -> None:
        pass


class KeyedProcessor(StatefulProcessor):
    """Stage two, keyed by route key (``"<rule>|<state key>"``), plus the pass-through key."""

    def __init__(self, config: ChecksConfig) -> None:
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.saved = handle.getValueState("shard", SAVED_STATE)
        self.buffer = handle.getListState("buffer", BUFFERED)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        records = _records(rows)
        if key[0] == PASS_KEY:
            if records:
                yield _output_frame(records)
            return
        for r in records:
            self.buffer.appendValue(
                (int(r["at_ms"]), int(r["ts_ns"]), str(r["conn"]), int(r["seq"]), r["frame"], int(r["flags"]))
            )
        yield from self._step(key[0], timerValues.getCurrentWatermarkInMs())

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield from self._step(key[0], timerValues.getCurrentWatermarkInMs())

    def _step(self, key: str, watermark_ms: int) -> Iterator[pd.DataFrame]:
        buffered = [Buffered(*item) for item in self.buffer.get()] if self.buffer.exists() else []
        saved = _saved(self.saved)
        result = keyed_step(self.config, key, saved, buffered, watermark_ms)
        if result.state is None:
            self.saved.clear()
        else:
            self.saved.update((result.state,))
        if len(result.buffer) != len(buffered):
            self.buffer.clear()
            if result.buffer:
                self.buffer.put([(b.at_ms, b.ts_ns, b.conn, b.seq, b.frame, b.flags) for b in result.buffer])
        for old in self.handle.listTimers():
            if old != result.next_timer_ms:
                self.handle.deleteTimer(old)
        if result.next_timer_ms is not None:
            self.handle.registerTimer(result.next_timer_ms)
        if result.rows:
            yield _output_frame(result.rows)

    def close(self) -> None:
        pass
