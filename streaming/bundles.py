"""The job's ``mapInArrow`` stage: the Kafka source's rows in, the stateful stage's bundles out.

Spark hands a grouped stateful stage its rows one by one: each row is an entry of the shuffle and the
sort, and pyspark's ``transformWithStateInPandas`` serializer turns every Arrow batch into pandas and
back, per row. So this stage makes one row per (source batch, bucket): the bucket's bundle
(``streaming.router``, which decodes and routes the frames with no state), plus one row of the batch's
aggregates for ``PASS_BUCKET``. Spark shuffles and groups a few rows per source batch instead of one
per frame. A source batch here is Spark's Arrow batches joined to ``stream.route_batch_records``
(``joined``).

Every bundle's event time is the newest of its source batch's frames, so Spark drops a bundle as late
only when the whole source batch is older than the watermark; a late frame among timely ones reaches
the stage, whose connection entries need no event-time order and whose entity entries release it at
once, counted late by the rules' engine as the single monitor counts it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import pyarrow as pa

from checks.settings import ChecksSettings
from streaming.frames import batch_frames
from streaming.router import PASS_BUCKET, pack_bundle, pack_passed, route_frames
from streaming.rows import NS_PER_MS
from streaming.workergc import collector_paused, tune_worker_gc

#: What the job's ``mapInArrow`` stage reads: the Kafka source's value, headers, partition and offset,
#: as Spark hands them over (``streaming.job.source_rows``).
KAFKA_SOURCE_SCHEMA = pa.schema(
    [
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
    ]
)

#: The columns of a bundle row: the grouping value of its bucket (``PASS_BUCKET`` for the aggregates),
#: the newest event time of its source batch (the watermark's column) and the bundle.
BUNDLE_SCHEMA = pa.schema(
    [
        ("bucket", pa.int32()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("bundle", pa.binary()),
    ]
)


def batch_clock_ms(ts_ns: list[int | None], arrival_ms: int) -> int:
    """A batch's clock, the newest frame's event time (ms): each frame's tap clock, or its arrival for a
    record without one (not from a tap)."""
    known = [t for t in ts_ns if t is not None]
    newest = max(known) // NS_PER_MS if known else arrival_ms
    return max(newest, arrival_ms) if len(known) < len(ts_ns) else newest


def bundle_batch(
    config: ChecksSettings, batch: pa.RecordBatch, labels: list[int], arrival_ms: int | None = None
) -> pa.RecordBatch:
    """Kafka-source rows (``value``, ``headers``, ``partition``, ``offset``) → one bundle row per bucket
    (every bucket gets the batch clock) and one of aggregates; ``labels[b]`` is bucket ``b``'s grouping
    value (``streaming.job``)."""
    frames, times = batch_frames(batch)
    if not frames:
        return pa.RecordBatch.from_pylist([], schema=BUNDLE_SCHEMA)
    now_ms = time.time_ns() // NS_PER_MS if arrival_ms is None else arrival_ms
    newest_ms = batch_clock_ms(times, now_ms)
    routed = route_frames(config, frames, newest_ms, len(labels))
    event_us = newest_ms * 1000
    out: dict[str, list[Any]] = {
        "bucket": [labels[b] for b in routed.bundles],
        "event_time": [event_us] * len(routed.bundles),
        "bundle": [pack_bundle(bundle) for bundle in routed.bundles.values()],
    }
    if routed.passed:
        out["bucket"].append(PASS_BUCKET)
        out["event_time"].append(event_us)
        out["bundle"].append(pack_passed(routed.passed))
    return pa.RecordBatch.from_pydict(out, schema=BUNDLE_SCHEMA)


def joined(batches: Iterable[pa.RecordBatch], records: int) -> Iterator[pa.RecordBatch]:
    """``batches`` in order, consecutive ones joined until each holds ``records`` or the input ends."""
    waiting: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        waiting.append(batch)
        count += batch.num_rows
        if count >= records:
            yield waiting[0] if len(waiting) == 1 else pa.concat_batches(waiting)
            waiting, count = [], 0
    if waiting:
        yield waiting[0] if len(waiting) == 1 else pa.concat_batches(waiting)


def bundle_batches(
    config: ChecksSettings,
    labels: list[int],
    tune_gc: bool,
    records: int,
    batches: Iterable[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """``bundle_batch`` of the batches Spark hands over, joined to ``records`` each (``joined``: Spark's
    Arrow batches stay its default size, which larger ones cost its JVM more CPU than they save here);
    ``tune_gc`` (``stream.worker_gc``): the worker's collector tuned before the first batch and paused
    while each is routed (``streaming.workergc``)."""
    if tune_gc:
        tune_worker_gc()
    for batch in joined(batches, records):
        with collector_paused(tune_gc):
            bundled = bundle_batch(config, batch, labels)
        yield bundled


def bundler(config: ChecksSettings, labels: list[int], tune_gc: bool = False, records: int = 1) -> Any:
    """The ``mapInArrow`` function for buckets labelled ``labels`` (picklable: Spark ships it to
    workers): ``bundle_batches``."""
    return partial(bundle_batches, config, labels, tune_gc, records)
