"""``transformWithStateInPandas`` adapters around ``streaming.stages``: state in, state out, nothing else.

State lives in Spark's RocksDB state store as JSON text in one value per key (plus, in stage two, a list
of buffered routes), so a new release can read the old layout: the JSON carries its own format number
(``checks.serde.STATE_FORMAT``) and the store's Avro encoding lets the columns evolve. Idle keys expire
through the state TTL, on top of the rules' own event-time TTLs.
"""

from __future__ import annotations

import json
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
from pyspark.sql.types import LongType, StringType, StructField, StructType

from kpmon.config import ChecksConfig
from streaming.stages import (
    PASS_KEY,
    STAGE_ROW_FIELDS,
    Buffered,
    connection_step,
    expired_row,
    keyed_step,
)

#: Stage one's state per connection: the shard (JSON), the armed timer and when the key expires.
CONNECTION_STATE = StructType(
    [
        StructField("shard", StringType()),
        StructField("timer", LongType()),
        StructField("expires", LongType()),
    ]
)
#: Stage two's state per route key: the shard (JSON), the routes waiting for the watermark (JSON) and
#: the armed timer. One value, so a key costs one read and one write per call to the state server.
KEYED_STATE = StructType(
    [
        StructField("shard", StringType()),
        StructField("buffer", StringType()),
        StructField("timer", LongType()),
    ]
)
#: Stage one's output, stage two's input (``event_time`` drives the watermark between them).
STAGE_ROWS_DDL = (
    "kind string, route_key string, event_time timestamp, ts_ns long, at_ms long, conn string, "
    "seq long, frame string, flags int, payload string"
)
#: Stage two's output: what foreachBatch sees.
OUTPUT_DDL = "kind string, ts_ns long, payload string"


def _load(state: ValueState, width: int) -> tuple[Any, ...]:
    value = state.get() if state.exists() else None
    return tuple(value) if value else (None,) * width


def _rearm(handle: StatefulProcessorHandle, armed: int | None, wanted: int | None) -> int | None:
    """Move the key's one timer from ``armed`` to ``wanted`` (two state-server calls at most)."""
    if armed == wanted:
        return armed
    if armed is not None:
        handle.deleteTimer(armed)
    if wanted is not None:
        handle.registerTimer(wanted)
    return wanted


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
        self.state = handle.getValueState("connection", CONNECTION_STATE)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        saved, timer, _ = _load(self.state, 3)
        result = connection_step(self.config, saved, _records(rows), timerValues.getCurrentWatermarkInMs())
        if result.state is None:
            _rearm(self.handle, timer, None)
            self.state.clear()
        else:
            # An armed timer earlier than the new expiry stays: when it fires it re-arms itself, so a
            # busy connection does not move its timer every batch.
            if timer is None:
                timer = _rearm(self.handle, None, result.next_timer_ms)
            self.state.update((result.state, timer, result.next_timer_ms))
        if result.rows:
            yield _stage_frame(result.rows)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        saved, _, expires = _load(self.state, 3)
        watermark = timerValues.getCurrentWatermarkInMs()
        if saved is None:
            return
        if expires is not None and expires > watermark:
            self.handle.registerTimer(expires)
            self.state.update((saved, expires, expires))
            return
        self.state.clear()
        yield _stage_frame([expired_row(watermark + 1)])

    def close(self) -> None:
        pass


class KeyedProcessor(StatefulProcessor):
    """Stage two, keyed by route key (``"<key kind>|<state key>"``), plus the pass-through key."""

    def __init__(self, config: ChecksConfig) -> None:
        self.config = config

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("keyed", KEYED_STATE)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        records = _records(rows)
        if key[0] == PASS_KEY:
            if records:
                yield _output_frame(records)
            return
        arrived = [
            Buffered(
                int(r["at_ms"]), int(r["ts_ns"]), str(r["conn"]), int(r["seq"]), r["frame"], int(r["flags"])
            )
            for r in records
        ]
        yield from self._step(key[0], timerValues.getCurrentWatermarkInMs(), arrived)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield from self._step(key[0], timerValues.getCurrentWatermarkInMs(), [], fired=True)

    def _step(
        self, key: str, watermark_ms: int, arrived: list[Buffered], fired: bool = False
    ) -> Iterator[pd.DataFrame]:
        saved, buffer_json, timer = _load(self.state, 3)
        if fired:
            timer = None  # Spark removed the timer that fired
        buffered = [Buffered(*item) for item in json.loads(buffer_json)] if buffer_json else []
        result = keyed_step(self.config, key, saved, buffered + arrived, watermark_ms)
        timer = _rearm(self.handle, timer, result.next_timer_ms)
        if result.state is None and not result.buffer:
            self.state.clear()
        else:
            waiting = json.dumps([[b.at_ms, b.ts_ns, b.conn, b.seq, b.frame, b.flags] for b in result.buffer])
            self.state.update((result.state, waiting, timer))
        if result.rows:
            yield _output_frame(result.rows)

    def close(self) -> None:
        pass
