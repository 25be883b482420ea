"""Stage one's input bundles: every frame once, in its bucket, with its types and event time intact."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.bundles import BUNDLE_SCHEMA, bundle_batch, read_bundle
from streaming.frames import frame_row
from streaming.job import bucket_labels
from streaming.stages import (
    CLOCK,
    EVENT_TIME_MS,
    NS_PER_MS,
    DictBucketStore,
    bucket_index,
    connection_bucket,
    connection_bucket_expired,
    keyed_bucket,
    keyed_bucket_expired,
)
from tests.checks.test_sharding import CONFIG, LATENESS_NS, single_run, summary, with_headers_only
from tests.streaming.test_frames import Record, source_batch
from tests.streaming.test_stages import findings_of, tap_record

ARRIVAL_MS = 1_234


def source_record(headers: dict[str, str], value: bytes | None, partition: int, offset: int) -> Record:
    return [(k, v.encode()) for k, v in headers.items()], value, partition, offset


def records(count: int, conns: int = 5) -> list[tuple[dict[str, str], bytes, int, int]]:
    return [
        (
            {
                "conn": f"c{i % conns}",
                "seq": str(i // conns),
                "ts_ns": str(1_795_505_029_312_988_929 + i),
                "dir": "req",
            },
            b"\x00\x12\x00\x03" + bytes([i % 256]),
            i % 2,
            i,
        )
        for i in range(count)
    ]


def bundled(
    recs: Sequence[tuple[dict[str, str], bytes | None, int, int]], labels: list[int]
) -> pa.RecordBatch:
    return bundle_batch(source_batch([source_record(*r) for r in recs]), labels, ARRIVAL_MS)


def unbundle(batch: pa.RecordBatch) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for label, bundle in zip(
        batch.column("bucket").to_pylist(), batch.column("bundle").to_pylist(), strict=True
    ):
        out[label].extend(read_bundle(bundle))
    return out


@given(count=st.integers(0, 60), conns=st.integers(1, 9), buckets=st.sampled_from([1, 3, 8]))
@settings(max_examples=60, deadline=None)
def test_every_frame_is_in_exactly_one_bundle_of_its_bucket(count: int, conns: int, buckets: int) -> None:
    recs = records(count, conns)
    labels = bucket_labels(buckets, 2)
    batch = bundled(recs, labels)
    assert batch.schema == BUNDLE_SCHEMA
    by_label = unbundle(batch)
    assert sorted(batch.column("frames").to_pylist()) == sorted(len(rows) for rows in by_label.values())
    assert len(set(batch.column("bucket").to_pylist())) == batch.num_rows, "one bundle per bucket"
    seen = []
    for label, rows in by_label.items():
        for row in rows:
            assert labels[bucket_index(row["conn"], buckets)] == label
            seen.append(row)
    expected = [{**frame_row(*r), EVENT_TIME_MS: int(r[0]["ts_ns"]) // NS_PER_MS} for r in recs]
    # Within a bucket the frames keep their source order.
    assert sorted(seen, key=lambda r: r["tap_offset"]) == expected
    for rows in by_label.values():
        assert [r["tap_offset"] for r in rows] == sorted(r["tap_offset"] for r in rows)


def test_a_bundles_event_time_is_its_newest_frames_and_the_tap_clock_stays_exact() -> None:
    recs = records(6, 1)
    # A record from outside a tap (no ts_ns) in the same bundle: its arrival is its event time, and the
    # others' nanosecond clocks are not rounded through floats on the way.
    no_clock = ({"conn": "c0", "seq": "9", "dir": "req"}, b"", 0, 99)
    batch = bundled([*recs, no_clock], bucket_labels(1, 1))
    (rows,) = unbundle(batch).values()
    assert [r["ts_ns"] for r in rows[:-1]] == [int(r[0]["ts_ns"]) for r in recs]
    assert rows[-1]["ts_ns"] is None and rows[-1][EVENT_TIME_MS] == ARRIVAL_MS
    newest_ms = max(int(r[0]["ts_ns"]) for r in recs) // NS_PER_MS
    assert (
        batch.column("event_time").to_pylist()[0]
        == pa.scalar(newest_ms * 1000, pa.timestamp("us", tz="UTC")).as_py()
    )


def test_a_record_with_numeric_headers_beyond_their_columns_is_bundled_with_them_null() -> None:
    """Any producer can write such a record to the tap topic: it reads as one whose numeric headers
    are not numbers (null; its event time its arrival), and the batch's other records are untouched."""
    recs = records(4, 1)
    beyond = (
        {"conn": "c0", "seq": str(2**64), "ts_ns": str(-(2**63) - 1), "api_key": str(2**31), "dir": "resp"},
        b"",
        0,
        99,
    )
    (rows,) = unbundle(bundled([*recs, beyond], bucket_labels(1, 1))).values()
    assert [r["tap_offset"] for r in rows] == [*(r[3] for r in recs), 99]
    assert [r["ts_ns"] for r in rows[:-1]] == [int(r[0]["ts_ns"]) for r in recs]
    last = rows[-1]
    assert (last["seq"], last["ts_ns"], last["api_key"], last[EVENT_TIME_MS]) == (
        None,
        None,
        None,
        ARRIVAL_MS,
    )


def test_an_empty_batch_makes_no_bundle() -> None:
    batch = bundled([], bucket_labels(4, 2))
    assert batch.num_rows == 0 and batch.schema == BUNDLE_SCHEMA


def run_bundled(batch_size: int, buckets: int) -> list[dict[str, Any]]:
    """The bucketed stages as the job runs them: each micro-batch's records bundled per source batch
    (two source partitions: two bundles per bucket), stage one fed from the bundles of its bucket."""
    frames = with_headers_only()
    labels = bucket_labels(buckets, 2)
    one = {label: DictBucketStore() for label in labels}
    two = [DictBucketStore() for _ in range(buckets)]
    timers_one: dict[int, int | None] = dict.fromkeys(labels)
    timers_two: list[int | None] = [None] * buckets
    out: list[dict[str, Any]] = []
    watermark_ms, max_ts = 0, 0
    batches = [frames[i : i + batch_size] for i in range(0, len(frames), batch_size)] + [[]]
    for n, batch in enumerate(batches):
        if n == len(batches) - 1:
            watermark_ms = max_ts // NS_PER_MS + 1
        recs = [tap_record(f) for f in batch]
        inputs: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for part in (0, 1):
            for label, rows in unbundle(bundled(recs[part::2], labels)).items():
                inputs[label].extend(rows)
        routed: list[dict[str, Any]] = []
        for label, rows in inputs.items():
            result = connection_bucket(CONFIG, one[label], rows, watermark_ms, timers_one[label], buckets)
            timers_one[label] = result.timer_ms
            routed.extend(result.rows)
        for label, armed in timers_one.items():
            if armed is not None and armed <= watermark_ms:
                result = connection_bucket_expired(one[label], watermark_ms)
                timers_one[label] = result.timer_ms
                routed.extend(result.rows)
        keyed: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for row in routed:
            if row["route_key"] == "~pass":
                out.append(row)
            else:
                # Stage one names each route and clock row's stage-two bucket.
                assert row["bucket"] == (
                    row["bucket"] if row["kind"] == CLOCK else bucket_index(row["route_key"], buckets)
                )
                keyed[row["bucket"]].append(row)
        for b, rows in keyed.items():
            result = keyed_bucket(CONFIG, two[b], rows, watermark_ms, timers_two[b])
            timers_two[b] = result.timer_ms
            out.extend(result.rows)
        for b, armed in enumerate(timers_two):
            if armed is not None and armed <= watermark_ms:
                result = keyed_bucket_expired(CONFIG, two[b], watermark_ms)
                timers_two[b] = result.timer_ms
                out.extend(result.rows)
        max_ts = max([max_ts, *(f.ts_ns for f in batch)])
        watermark_ms = max(watermark_ms, (max_ts - LATENESS_NS) // NS_PER_MS)
    return out


@pytest.mark.parametrize("buckets", [1, 3])
def test_bundled_stages_find_what_one_monitor_finds(buckets: int) -> None:
    expected = summary(single_run(with_headers_only()))
    for batch_size in (1, 7, 1000):
        rows = run_bundled(batch_size, buckets)
        assert findings_of(rows) == expected
        assert all(json.loads(r["payload"]) for r in rows if r["kind"] in ("agg", "stat"))
