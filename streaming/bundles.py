"""Stage one's input: the tap records of one source batch, bundled by stage-one bucket.

Spark hands a grouped stateful stage its rows one by one: each row is an entry of the shuffle and the
sort, and pyspark's ``transformWithStateInPandas`` serializer turns every Arrow batch into pandas,
walks it with ``itertuples`` and builds a DataFrame again from the tuples, per row. At one row per
frame that, and turning the DataFrame into dicts, was a quarter of the stateful workers' Python time
(docs/benchmarks.md, 2026-11-24, `0836b34`).

So the ``mapInArrow`` stage makes one row per (source batch, bucket): the tap-record rows of that
bucket's connections (``streaming.frames.FRAME_ROW_SCHEMA``, plus each frame's event time) as one
Arrow IPC stream. Spark shuffles and groups a few hundred bundles per batch instead of a million rows,
and stage one reads each bundle back in one call (``read_bundle``), with its types intact: no pandas
in between, so a null long never turns a column into floats.

A bundle's event time is the newest of its frames'. Spark drops a bundle as late only when every
frame in it is older than the watermark; a late frame bundled with timely ones reaches stage one,
which needs no event-time order (a connection's frames are in ``seq`` order) and clamps what it
routes on to the watermark, as it does for every frame.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from codec.taprecord import Header
from streaming.frames import FRAME_ROW_SCHEMA, frame_columns
from streaming.stages import EVENT_TIME_MS, NS_PER_MS, bucket_index

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

#: The frames of a bundle: the tap-record rows and each one's event time (ms), as stage one reads them.
BUNDLE_FRAME_SCHEMA = FRAME_ROW_SCHEMA.append(pa.field(EVENT_TIME_MS, pa.int64()))

#: The columns of a bundle row: the grouping value of its bucket, the newest event time of its frames
#: (the watermark's column), how many frames it holds, and the frames as an Arrow IPC stream.
BUNDLE_SCHEMA = pa.schema(
    [
        ("bucket", pa.int32()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("frames", pa.int32()),
        ("bundle", pa.binary()),
    ]
)


def _event_ms(rows: pa.RecordBatch, arrival_ms: int) -> np.ndarray:
    """Each frame's event time: its tap clock, or its arrival for a record without one (not from a tap)."""
    column = rows.column(Header.TS_NS)
    # Never through floats: a double cannot hold the tap clock (~1.8e18 ns) exactly.
    ts_ns = pc.fill_null(column, 0).to_numpy()
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return np.where(valid, ts_ns // NS_PER_MS, arrival_ms).astype(np.int64)


def _ipc(rows: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_batch(rows)
    return sink.getvalue().to_pybytes()


def bundle_batch(batch: pa.RecordBatch, labels: list[int], arrival_ms: int | None = None) -> pa.RecordBatch:
    """Kafka-source rows (``value``, ``headers``, ``partition``, ``offset``) → one bundle row per
    stage-one bucket they touch; ``labels[b]`` is bucket ``b``'s grouping value (``streaming.job``)."""
    rows = frame_columns(batch)
    if rows.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=BUNDLE_SCHEMA)
    now_ms = time.time_ns() // NS_PER_MS if arrival_ms is None else arrival_ms
    millis = _event_ms(rows, now_ms)
    rows = pa.RecordBatch.from_arrays([*rows.columns, pa.array(millis)], schema=BUNDLE_FRAME_SCHEMA)
    # Connections repeat within a batch: hash each distinct one once.
    conns = rows.column(Header.CONN).dictionary_encode()
    buckets = len(labels)
    per_conn = np.array([bucket_index(c, buckets) for c in conns.dictionary.to_pylist()], dtype=np.int64)
    bucket_of_row = per_conn[conns.indices.to_numpy(zero_copy_only=False)]
    # A stable sort keeps each bucket's frames in their source order.
    order = np.argsort(bucket_of_row, kind="stable")
    sorted_buckets = bucket_of_row[order]
    starts = np.flatnonzero(np.r_[True, sorted_buckets[1:] != sorted_buckets[:-1]])
    ends = np.r_[starts[1:], len(order)]
    out: dict[str, list[Any]] = {name: [] for name in BUNDLE_SCHEMA.names}
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        index = order[start:end]
        out["bucket"].append(labels[int(sorted_buckets[start])])
        out["event_time"].append(int(millis[index].max()) * 1000)
        out["frames"].append(end - start)
        out["bundle"].append(_ipc(rows.take(pa.array(index))))
    return pa.RecordBatch.from_pydict(out, schema=BUNDLE_SCHEMA)


def _bundles(labels: list[int], batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield bundle_batch(batch, labels)


def bundler(labels: list[int]) -> Any:
    """The ``mapInArrow`` function for buckets labelled ``labels`` (picklable: Spark ships it to workers)."""
    return partial(_bundles, labels)


def read_bundle(data: bytes) -> list[dict[str, Any]]:
    """A bundle's frames as stage one's rows (``streaming.stages.connection_bucket``)."""
    with pa.ipc.open_stream(data) as reader:
        return reader.read_all().to_pylist()
