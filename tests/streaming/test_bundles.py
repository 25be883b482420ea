"""The job's ``mapInArrow`` stage: every frame once, in the bundle of its connection's bucket, every
bucket a batch clock, the batch's aggregates passed on."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec.taprecord import TapFrame
from kpconfig.model import KpmonConfig
from streaming.bundles import BUNDLE_SCHEMA, bundle_batch, joined
from streaming.job import bucket_labels, bundle_function
from streaming.router import PASS_BUCKET, Bundle, read_bundle, read_passed
from streaming.rows import NS_PER_MS, OutputRow, bucket_index, conn_key, read_connection_row
from streaming.stages import DictBucketStore, monitor_bucket, monitor_bucket_expired
from tests.checks.exchanges import exchange_records, flatten
from tests.checks.test_sharding import CONFIG, LATENESS_NS, single_run, summary, with_headers_only
from tests.streaming.test_frames import Record, source_batch
from tests.streaming.test_stages import findings_of, schema_2_record

ARRIVAL_MS = 1_234


def conn_frames(packed: list[Any]) -> list[TapFrame]:
    """A connection's frames in a bundle, as its entry feeds them (header exchanges made frames)."""
    return list(read_connection_row(packed).feed_order())


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
    return bundle_batch(CONFIG, source_batch([source_record(*r) for r in recs]), labels, ARRIVAL_MS)


def unbundle(batch: pa.RecordBatch) -> tuple[dict[int, list[Bundle]], list[OutputRow]]:
    """The bundles by bucket label, and the passed rows."""
    out: dict[int, list[Bundle]] = defaultdict(list)
    passed: list[OutputRow] = []
    for label, data in zip(
        batch.column("bucket").to_pylist(), batch.column("bundle").to_pylist(), strict=True
    ):
        if label == PASS_BUCKET:
            passed.extend(read_passed(data))
        else:
            out[label].append(read_bundle(data))
    return out, passed


@given(count=st.integers(1, 60), conns=st.integers(1, 9), buckets=st.sampled_from([1, 3, 8]))
@settings(max_examples=60, deadline=None)
def test_every_frame_is_in_exactly_one_bundle_of_its_bucket(count: int, conns: int, buckets: int) -> None:
    recs = records(count, conns)
    labels = bucket_labels(buckets, 2)
    batch = bundled(recs, labels)
    assert batch.schema == BUNDLE_SCHEMA
    by_label, passed = unbundle(batch)
    assert sorted(by_label) == sorted(labels), "every bucket gets a bundle: the batch clock"
    assert all(len(bundles) == 1 for bundles in by_label.values())
    seen: list[tuple[str, int]] = []
    for label, bundles in by_label.items():
        for key, packed in bundles[0].conns.items():
            assert labels[bucket_index(key, buckets)] == label
            frames = conn_frames(packed)
            assert all(conn_key(f.conn) == key for f in frames)
            # A connection's frames keep their seq order.
            assert [f.seq for f in frames] == sorted(f.seq for f in frames)
            seen.extend((f.conn, f.offset) for f in frames)
    assert sorted(seen) == sorted((r[0]["conn"], r[3]) for r in recs)
    assert sum(json.loads(r.payload)["frames"] for r in passed if r.kind == "agg") == count


def test_a_bundles_event_time_is_its_source_batchs_newest_frame_and_the_tap_clock_stays_exact() -> None:
    recs = records(6, 1)
    # A record from outside a tap (no ts_ns) in the same batch: its arrival is its event time, and the
    # others' nanosecond clocks are not rounded through floats on the way.
    no_clock = ({"conn": "c0", "seq": "9", "dir": "req"}, b"", 0, 99)
    batch = bundled([*recs, no_clock], bucket_labels(2, 1))
    by_label, _ = unbundle(batch)
    frames = [
        f for bundles in by_label.values() for b in bundles for p in b.conns.values() for f in conn_frames(p)
    ]
    by_offset = {f.offset: f for f in frames}
    assert [by_offset[r[3]].ts_ns for r in recs] == [int(r[0]["ts_ns"]) for r in recs]
    newest_ms = max(int(r[0]["ts_ns"]) for r in recs) // NS_PER_MS
    assert {b.newest_ms for bundles in by_label.values() for b in bundles} == {newest_ms}
    expected = pa.scalar(newest_ms * 1000, pa.timestamp("us", tz="UTC")).as_py()
    assert set(batch.column("event_time").to_pylist()) == {expected}


def test_a_record_with_numeric_headers_beyond_their_columns_is_bundled_with_them_null() -> None:
    """Any producer can write such a record to the tap topic: it reads as one whose numeric headers
    are not numbers (its seq and clock 0), and the batch's other records are untouched."""
    recs = records(4, 1)
    beyond = (
        {"conn": "c0", "seq": str(2**64), "ts_ns": str(-(2**63) - 1), "api_key": str(2**31), "dir": "resp"},
        b"",
        0,
        99,
    )
    by_label, _ = unbundle(bundled([*recs, beyond], bucket_labels(1, 1)))
    ((bundle,),) = by_label.values()
    frames = conn_frames(bundle.conns[conn_key("c0")])
    assert sorted(f.offset for f in frames) == sorted([*(r[3] for r in recs), 99])
    last = next(f for f in frames if f.offset == 99)
    assert (last.seq, last.ts_ns, last.api_key) == (0, 0, None) and last.error is not None
    assert [f.ts_ns for f in frames if f.offset != 99] == [int(r[0]["ts_ns"]) for r in recs]


def test_an_empty_batch_makes_no_bundle() -> None:
    batch = bundled([], bucket_labels(4, 2))
    assert batch.num_rows == 0 and batch.schema == BUNDLE_SCHEMA


def run_bundled(batch_size: int, buckets: int) -> list[OutputRow]:
    """The job's path: each micro-batch's schema-2 records bundled per source batch (two source
    partitions, by connection), each bucket's bundles through the stage, its timer fired as Spark would."""
    records_ = exchange_records(with_headers_only())
    labels = bucket_labels(buckets, 2)
    stores = {label: DictBucketStore() for label in labels}
    timers: dict[int, int | None] = dict.fromkeys(labels)
    out: list[OutputRow] = []
    watermark_ms, max_ts = 0, 0
    batches = [records_[i : i + batch_size] for i in range(0, len(records_), batch_size)] + [[]]
    for n, batch in enumerate(batches):
        if n == len(batches) - 1:
            watermark_ms = max_ts // NS_PER_MS + 1
        inputs: dict[int, list[Bundle]] = defaultdict(list)
        for part in (0, 1):
            mine = [schema_2_record(r) for r in batch if bucket_index(r[0].conn, 2) == part]
            by_label, passed = unbundle(bundled(mine, labels))
            out.extend(passed)
            for label, bundles in by_label.items():
                inputs[label].extend(bundles)
        for label, bundles in inputs.items():
            result = monitor_bucket(CONFIG, stores[label], bundles, watermark_ms, timers[label])
            timers[label] = result.timer_ms
            out.extend(result.rows)
        for label, armed in timers.items():
            if armed is not None and armed <= watermark_ms:
                result = monitor_bucket_expired(CONFIG, stores[label], watermark_ms)
                timers[label] = result.timer_ms
                out.extend(result.rows)
        max_ts = max([max_ts, *(f.ts_ns for f in flatten(batch))])
        watermark_ms = max(watermark_ms, (max_ts - LATENESS_NS) // NS_PER_MS)
    return out


@pytest.mark.parametrize("buckets", [1, 3])
def test_bundled_stages_find_what_one_monitor_finds(buckets: int) -> None:
    expected = summary(single_run(flatten(exchange_records(with_headers_only()))))
    for batch_size in (1, 7, 1000):
        rows = run_bundled(batch_size, buckets)
        assert findings_of(rows) == expected
        assert all(json.loads(r.payload) for r in rows if r.kind in ("agg", "stat"))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=12), st.integers(1, 9))
def test_the_router_takes_spark_batches_joined_in_order_to_its_size(sizes: list[int], records: int) -> None:
    counter = iter(range(10_000))
    schema = pa.schema([("n", pa.int64())])  # Spark's batches of one stage share their schema
    batches = [
        pa.RecordBatch.from_pydict({"n": [next(counter) for _ in range(size)]}, schema=schema)
        for size in sizes
    ]
    taken = list(joined(batches, records))
    assert [v for b in taken for v in b.column("n").to_pylist()] == [
        v for b in batches for v in b.column("n").to_pylist()
    ]
    # Each but the last ends with the first Spark batch that brings it to the size.
    expected: list[int] = []
    count = pending = 0
    for size in sizes:
        count, pending = count + size, pending + 1
        if count >= records:
            expected.append(count)
            count = pending = 0
    if pending:
        expected.append(count)
    assert [b.num_rows for b in taken] == expected


def test_the_job_routes_the_configured_records_at_once() -> None:
    config = KpmonConfig.model_validate({"stream": {"route_batch_records": 123}})
    assert bundle_function(config).args[-1] == 123
