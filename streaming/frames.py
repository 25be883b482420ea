"""The decoded-frame table: one row per tap record, decoded with the codec's projected decode.

``decode_batch`` is the body of the job's ``mapInArrow`` stage, and pure: an Arrow batch of Kafka source
rows (value, headers, partition, offset) in, an Arrow batch of ``DECODED_FRAME_SCHEMA`` rows out. It
never raises for a bad frame: the row carries ``decode_error`` instead, so one malformed record cannot
fail a micro-batch. Only the fields the checks and the data-quality suites read are decoded
(``PROJECTIONS``); everything else is skipped without being built.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

import codec
from codec.errors import DecodeError
from codec.protocol import ApiKey
from codec.records import RecordBatches
from codec.taprecord import REQ, RESP, ROW_KEYS, Header, connection_of, header_only, headers_dict, int_header

BATCH_TYPE = pa.struct(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("producer_id", pa.int64()),
        ("producer_epoch", pa.int32()),
        ("base_sequence", pa.int32()),
        ("record_count", pa.int32()),
        ("transactional", pa.bool_()),
        ("control", pa.bool_()),
    ]
)

DECODED_FRAME_SCHEMA = pa.schema(
    [
        (Header.CONN, pa.string()),
        (Header.SEQ, pa.int64()),
        (Header.TS_NS, pa.int64()),
        (Header.DIR, pa.string()),
        (Header.API_KEY, pa.int32()),
        ("api_name", pa.string()),
        (Header.API_VERSION, pa.int32()),
        (Header.CORR_ID, pa.int32()),
        (Header.CLIENT, pa.string()),
        ("client_id", pa.string()),
        (Header.BROKER, pa.string()),
        (Header.BROKER_ID, pa.int32()),
        (Header.LISTENER, pa.string()),
        (Header.TAP, pa.string()),
        (Header.CAPTURE, pa.string()),
        (Header.TRUNCATED, pa.bool_()),
        (ROW_KEYS["partition"], pa.int32()),
        (ROW_KEYS["offset"], pa.int64()),
        ("size", pa.int32()),
        ("decode_error", pa.string()),
        ("error_offset", pa.int32()),
        ("header_version", pa.int32()),
        ("flexible", pa.bool_()),
        ("error_code", pa.int32()),
        ("client_software_name", pa.string()),
        ("client_software_version", pa.string()),
        ("group_id", pa.string()),
        ("protocol_type", pa.string()),
        ("protocol_name", pa.string()),
        ("transactional_id", pa.string()),
        ("producer_id", pa.int64()),
        ("producer_epoch", pa.int32()),
        ("batches", pa.list_(BATCH_TYPE)),
        ("unknown_tags", pa.int32()),
        ("tag_anomalies", pa.int32()),
        #: The mirrored frame itself, for the stateful checks stage (which decodes what its rules need).
        ("value", pa.binary()),
    ]
)

#: Per (direction, api key): the fields the decoded-frame columns need (dotted paths).
PROJECTIONS: dict[tuple[str, int], frozenset[str]] = {
    (REQ, ApiKey.PRODUCE): frozenset(
        {"TransactionalId", "TopicData.Name", "TopicData.TopicId", "TopicData.PartitionData"}
    ),
    (RESP, ApiKey.PRODUCE): frozenset({"Responses.Name", "Responses.PartitionResponses.ErrorCode"}),
    (REQ, ApiKey.JOIN_GROUP): frozenset({"GroupId", "ProtocolType", "Protocols.Name"}),
    (RESP, ApiKey.JOIN_GROUP): frozenset({"ErrorCode", "ProtocolType", "ProtocolName"}),
    (REQ, ApiKey.SYNC_GROUP): frozenset({"GroupId", "ProtocolType", "ProtocolName"}),
    (RESP, ApiKey.SYNC_GROUP): frozenset({"ErrorCode", "ProtocolType", "ProtocolName"}),
    (REQ, ApiKey.API_VERSIONS): frozenset({"ClientSoftwareName", "ClientSoftwareVersion"}),
    (RESP, ApiKey.API_VERSIONS): frozenset({"ErrorCode"}),
    (REQ, ApiKey.INIT_PRODUCER_ID): frozenset({"TransactionalId", "ProducerId", "ProducerEpoch"}),
    (RESP, ApiKey.INIT_PRODUCER_ID): frozenset({"ErrorCode", "ProducerId", "ProducerEpoch"}),
    (REQ, ApiKey.END_TXN): frozenset({"TransactionalId", "ProducerId", "ProducerEpoch"}),
    (RESP, ApiKey.END_TXN): frozenset({"ErrorCode", "ProducerId", "ProducerEpoch"}),
}


def _spark_headers(raw: Any) -> dict[str, str]:
    """The Kafka source's ``headers`` column: an array of ``{key, value}`` structs."""
    return headers_dict((item["key"], item["value"]) for item in raw or ())


def _first_error_code(body: dict[str, Any], direction: str, api_key: int) -> int | None:
    if direction != RESP:
        return None
    code = body.get("ErrorCode")
    if isinstance(code, int):
        return code
    if api_key == ApiKey.PRODUCE:
        for topic in body.get("Responses") or ():
            for part in topic.get("PartitionResponses") or ():
                if part.get("ErrorCode"):
                    return int(part["ErrorCode"])
        return 0
    return None


def _batches(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for topic in body.get("TopicData") or ():
        name = topic.get("Name") or (str(topic["TopicId"]) if topic.get("TopicId") else None)
        for part in topic.get("PartitionData") or ():
            records = part.get("Records")
            if not isinstance(records, RecordBatches):
                continue
            for batch in records.batches:
                out.append(
                    {
                        "topic": name,
                        "partition": part.get("Index"),
                        "producer_id": getattr(batch, "producer_id", None),
                        "producer_epoch": getattr(batch, "producer_epoch", None),
                        "base_sequence": getattr(batch, "base_sequence", None),
                        "record_count": getattr(batch, "record_count", None),
                        "transactional": getattr(batch, "is_transactional", None),
                        "control": getattr(batch, "is_control", None),
                    }
                )
    return out


def _count_tags(value: Any) -> tuple[int, int]:
    unknown = anomalies = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            unknown += len(item.get("_unknown_tags") or ())
            anomalies += len(item.get("_tag_anomalies") or ())
            stack.extend(v for k, v in item.items() if isinstance(v, dict | list) and not k.startswith("_"))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, dict | list))
    return unknown, anomalies


def decode_row(headers: dict[str, str], value: bytes | None, partition: int, offset: int) -> dict[str, Any]:
    direction = headers.get(Header.DIR, "")
    # Header-derived columns are named after their headers; the record's own place gets ROW_KEYS.
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
    if (
        direction not in (REQ, RESP)
        or value is None
        or row[Header.CAPTURE] == "meta"
        or row[Header.TRUNCATED]
    ):
        return row
    api_key = row[Header.API_KEY]
    try:
        if direction == REQ:
            fields = PROJECTIONS.get((REQ, _peek_api_key(value)))
            request = codec.decode_request(value, fields=fields or ())
            row[Header.API_KEY], row[Header.API_VERSION] = request.api_key, request.api_version
            row[Header.CORR_ID] = request.correlation_id
            row["client_id"] = request.client_id
            message: codec.Request | codec.Response = request
        else:
            if api_key is None or row[Header.API_VERSION] is None:
                raise DecodeError("response record without api_key/api_version headers", 0)
            fields = PROJECTIONS.get((RESP, api_key))
            message = codec.decode_response(value, api_key, row[Header.API_VERSION], fields=fields or ())
            row[Header.CORR_ID] = message.correlation_id
    except DecodeError as exc:
        row["decode_error"] = exc.reason
        row["error_offset"] = exc.offset
        return row
    body = message.body
    key = message.api_key
    row["api_name"] = codec.api_name(key)
    row["header_version"] = message.header_version
    row["flexible"] = codec.is_flexible(key, message.api_version) if key in _KNOWN else None
    row["error_code"] = _first_error_code(body, direction, key)
    row["client_software_name"] = body.get("ClientSoftwareName")
    row["client_software_version"] = body.get("ClientSoftwareVersion")
    row["group_id"] = body.get("GroupId")
    row["protocol_type"] = body.get("ProtocolType")
    row["protocol_name"] = body.get("ProtocolName")
    row["transactional_id"] = body.get("TransactionalId")
    row["producer_id"] = body.get("ProducerId")
    row["producer_epoch"] = body.get("ProducerEpoch")
    if key == ApiKey.PRODUCE and direction == REQ:
        row["batches"] = _batches(body)
        if row["batches"] and row["producer_id"] is None:
            row["producer_id"] = row["batches"][0]["producer_id"]
            row["producer_epoch"] = row["batches"][0]["producer_epoch"]
    row["unknown_tags"], row["tag_anomalies"] = _count_tags(body)
    return row


_KNOWN = frozenset(codec.api_keys())


def _peek_api_key(value: bytes) -> int:
    return int.from_bytes(value[:2], "big", signed=True) if len(value) >= 2 else -1


def decode_rows(rows: Iterable[tuple[Any, bytes | None, int, int]]) -> list[dict[str, Any]]:
    return [decode_row(_spark_headers(h), v, p, o) for h, v, p, o in rows]


def decode_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Kafka-source rows (``value``, ``headers``, ``partition``, ``offset``) → decoded-frame rows."""
    rows = decode_rows(
        zip(
            batch.column("headers").to_pylist(),
            batch.column("value").to_pylist(),
            batch.column("partition").to_pylist(),
            batch.column("offset").to_pylist(),
            strict=True,
        )
    )
    return pa.RecordBatch.from_pylist(rows, schema=DECODED_FRAME_SCHEMA)


def decode_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` entry point."""
    for batch in batches:
        yield decode_batch(batch)
