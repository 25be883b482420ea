"""Tap-record schema 3 (one record per connection flush) through the job's read: the same frames written
as schema-2 records (one per exchange) and as schema-3 flushes give the monitor the same findings, and
two findings on entries of one record keep distinct ids."""

from __future__ import annotations

from itertools import groupby

import checks
from checks.model import Finding
from codec.taprecord import (
    EXCHANGE,
    ROW_COLUMNS,
    Connection,
    Entry,
    Part,
    TapFrame,
    frames_from_columns,
    pack_flush,
    pack_record,
    pack_static,
)
from streaming.frames import frame_columns
from tests.checks.exchanges import exchange_records
from tests.checks.test_sharding import CONFIG, scenario
from tests.streaming.test_frames import Record, source_batch


def _entry(record: list[TapFrame]) -> Entry:
    kind = EXCHANGE if len(record) == 2 else ("resp" if record[0].lone else record[0].direction)
    parts = [Part(f.direction, f.ts_ns, f.api_key, f.api_version, f.correlation_id, f.raw) for f in record]
    return kind, record[0].seq, parts


def _static(frame: TapFrame) -> bytes:
    return pack_static(
        Connection(frame.conn, frame.client, frame.broker, frame.broker_id, frame.listener, "t")
    )


def as_schema_2(records: list[list[TapFrame]]) -> list[Record]:
    out: list[Record] = []
    for offset, record in enumerate(records):
        kind, seq, parts = _entry(record)
        out.append((None, pack_record(kind, seq, _static(record[0]), parts, record[0].lost), 0, offset))
    return out


def as_schema_3(records: list[list[TapFrame]], per_flush: int) -> list[Record]:
    """Each run of one connection's consecutive records, ``per_flush`` at most, as one flush. A flush
    is written or lost whole, so one never holds records on both sides of a tap loss (``lost``)."""
    out: list[Record] = []
    for _, run in groupby(records, key=lambda r: (r[0].conn, r[0].lost)):
        batch = list(run)
        for start in range(0, len(batch), per_flush):
            flush = batch[start : start + per_flush]
            value = pack_flush(_static(flush[0][0]), [_entry(r) for r in flush], flush[0][0].lost)
            out.append((None, value, 0, len(out)))
    return out


def findings_of(records: list[Record]) -> list[Finding]:
    """The job's read (``frame_columns``, then the router's decode ``frames_from_columns``) into one monitor."""
    rows = frame_columns(source_batch(records))
    columns = {name: rows.column(name).to_pylist() for name in ROW_COLUMNS}
    monitor = checks.new_monitor(CONFIG)
    return monitor.feed_all(frames_from_columns(columns, rows.num_rows)) + monitor.flush()


def _what(findings: list[Finding]) -> list[tuple[str, str, str, str, bool]]:
    return sorted((f.rule, f.subject, f.severity.value, f.summary, f.incomplete) for f in findings)


def test_schema_3_finds_what_schema_2_finds() -> None:
    records = exchange_records(scenario())
    two = findings_of(as_schema_2(records))
    assert len({f.rule for f in two}) >= 5
    for per_flush in (1, 3, 64):
        three = findings_of(as_schema_3(records, per_flush))
        assert _what(three) == _what(two), per_flush
        # As distinct as schema 2's: an entry's index keeps findings on one record's entries apart.
        assert len({f.id for f in three}) == len({f.id for f in two}), "findings on two entries share an id"
