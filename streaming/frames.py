"""The tap-record rows: one row per tap record, its headers as typed columns, plus the frame itself.

``frame_rows_batch`` is the body of the job's ``mapInArrow`` stage, and pure: an Arrow batch of Kafka
source rows (value, headers, partition, offset) in, an Arrow batch of ``FRAME_ROW_SCHEMA`` rows out.
It parses headers only (``codec.taprecord``, the one tap-record contract) and never runs the codec:
the frame is decoded once, in stage one, where the rules that read it run (docs/decisions.md,
"Decode once, in stage one"). What the stages before stage one need is the connection (the bucket)
and the tap clock (the watermark).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from codec.taprecord import ROW_KEYS, Header, connection_of, header_only, headers_dict, int_header

FRAME_ROW_SCHEMA = pa.schema(
    [
        (Header.CONN, pa.string()),
        (Header.SEQ, pa.int64()),
        (Header.TS_NS, pa.int64()),
        (Header.DIR, pa.string()),
        (Header.API_KEY, pa.int32()),
        (Header.API_VERSION, pa.int32()),
        (Header.CORR_ID, pa.int32()),
        (Header.CLIENT, pa.string()),
        (Header.BROKER, pa.string()),
        (Header.BROKER_ID, pa.int32()),
        (Header.LISTENER, pa.string()),
        (Header.TAP, pa.string()),
        (Header.CAPTURE, pa.string()),
        (Header.TRUNCATED, pa.bool_()),
        (ROW_KEYS["partition"], pa.int32()),
        (ROW_KEYS["offset"], pa.int64()),
        ("size", pa.int32()),
        #: The mirrored frame, decoded once by stage one.
        ("value", pa.binary()),
    ]
)


def _spark_headers(raw: Any) -> dict[str, str]:
    """The Kafka source's ``headers`` column: an array of ``{key, value}`` structs."""
    return headers_dict((item["key"], item["value"]) for item in raw or ())


def frame_row(headers: dict[str, str], value: bytes | None, partition: int, offset: int) -> dict[str, Any]:
    """One tap record as a row. Header-derived columns are named after their headers; the record's own
    place gets ``ROW_KEYS``. The api key, version and correlation id come from the tap's headers, on
    requests and responses alike; for a request, stage one's decode replaces them with the frame's
    own header, exactly as ``codec.taprecord.frame_from_record`` does, so a request looks the same
    everywhere (and an undecodable one keeps what the tap read of its header)."""
    direction = headers.get(Header.DIR, "")
    row: dict[str, Any] = {
        Header.CONN: connection_of(headers.get(Header.CONN), partition),
        Header.SEQ: int_header(headers, Header.SEQ),
        Header.TS_NS: int_header(headers, Header.TS_NS),
        Header.DIR: direction,
        Header.API_KEY: int_header(headers, Header.API_KEY),
        Header.API_VERSION: int_header(headers, Header.API_VERSION),
        Header.CORR_ID: int_header(headers, Header.CORR_ID),
        Header.CLIENT: headers.get(Header.CLIENT),
        Header.BROKER: headers.get(Header.BROKER),
        Header.BROKER_ID: int_header(headers, Header.BROKER_ID),
        Header.LISTENER: headers.get(Header.LISTENER),
        Header.TAP: headers.get(Header.TAP),
        Header.CAPTURE: headers.get(Header.CAPTURE),
        Header.TRUNCATED: header_only(headers),
        ROW_KEYS["partition"]: partition,
        ROW_KEYS["offset"]: offset,
        "size": len(value) if value is not None else None,
        "value": value,
    }
    return row


def frame_rows_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Kafka-source rows (``value``, ``headers``, ``partition``, ``offset``) → tap-record rows."""
    rows = [
        frame_row(_spark_headers(h), v, p, o)
        for h, v, p, o in zip(
            batch.column("headers").to_pylist(),
            batch.column("value").to_pylist(),
            batch.column("partition").to_pylist(),
            batch.column("offset").to_pylist(),
            strict=True,
        )
    ]
    return pa.RecordBatch.from_pylist(rows, schema=FRAME_ROW_SCHEMA)


def frame_row_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` entry point."""
    for batch in batches:
        yield frame_rows_batch(batch)
