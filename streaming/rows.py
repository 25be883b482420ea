"""The rows of the job, typed in one place: what each key of the stateful stage is called, how a frame
travels between the router and the stage, and the rows the stage hands ``foreachBatch``.

On its way to an alert a frame is a tap record (``codec.taprecord``), a decoded frame and its facts
(``codec.taprecord.TapFrame``, ``codec.facts``), a route (``checks.routes``) in the stage's bundle
(``streaming.router``), and its finding (``checks.model.Finding``), one ``OutputRow`` of kind
``FINDING`` on its way to the sink. tests/streaming/test_frame_path.py counts every shape it takes
between modules (docs/architecture.md).
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

import codec
from checks.engine import ConnectionMeta, HeaderExchange
from checks.model import Finding
from checks.rule import Stats
from checks.sharding import ConnectionRow
from codec import taprecord
from codec.errors import DecodeError
from codec.protocol import ApiKey
from codec.taprecord import REQ, RESP, TapFrame

NS_PER_MS: Final = 1_000_000
#: An input row's Spark event time in ms (``streaming.bundles`` adds it to each tap-record row).
EVENT_TIME_MS: Final = "event_time_ms"

#: Kinds of ``OutputRow``.
FINDING: Final = "finding"
RESOLVE: Final = "resolve"
AGG: Final = "agg"
STAT: Final = "stat"

#: The key kind of a connection's own entry in the stage (its connection-scoped rules).
CONN_KIND: Final = "conn"


class OutputRow(NamedTuple):
    """A row the stage hands ``foreachBatch`` (Spark DDL: ``streaming.processors.OUTPUT_DDL``).
    ``payload`` is JSON: a finding (``Finding.to_dict``), a resolve, an aggregate or the counters."""

    kind: str
    ts_ns: int
    payload: str


def conn_key(conn: str) -> str:
    """The stage key of a connection's own entry."""
    return f"{CONN_KIND}|{conn}"


def is_conn_key(key: str) -> bool:
    return key.startswith(CONN_KIND + "|")


def bucket_index(key: str, buckets: int) -> int:
    """The bucket of a stage key (a connection's or an entity's): the one bucketing function of the job
    and of ``LocalStages``. CRC-32 is fixed, so a key keeps its bucket across restarts and releases (its
    state is stored per bucket)."""
    return zlib.crc32(key.encode()) % buckets


def _opt_int(value: Any) -> int | None:
    """Spark hands nullable ints to pandas as floats with NaN for null."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def event_ms_of(row: Mapping[str, Any]) -> int:
    """A tap-record row's event time (ms): ``EVENT_TIME_MS``, else its tap clock."""
    millis = row.get(EVENT_TIME_MS)
    if millis is not None:
        return int(millis)
    return (_opt_int(row.get("ts_ns")) or 0) // NS_PER_MS


def pack_connection_row(row: ConnectionRow) -> list[Any]:
    """A connection's row of one batch as the bundle carries it: ``[meta, frames, exchanges]``, its
    frames packed as ``codec.taprecord.frame_to_packed`` makes them (packed with the bundle, not one by
    one) and its header exchanges as columns, one list per field of ``checks.engine.HeaderExchange``
    (the row's one entry for all of them, not one per exchange)."""
    return [
        None if row.meta is None else list(row.meta),
        [taprecord.frame_to_packed(f) for f in row.frames],
        [list(column) for column in zip(*row.exchanges, strict=True)],
    ]


def read_connection_row(values: Sequence[Any]) -> ConnectionRow:
    meta, frames, exchanges = values
    return ConnectionRow(
        [taprecord.frame_from_packed(f) for f in frames],
        [HeaderExchange(*e) for e in zip(*exchanges, strict=True)],
        None if meta is None else ConnectionMeta(*meta),
    )


def finding_row(finding: Finding) -> OutputRow:
    return OutputRow(FINDING, finding.ts_ns, json.dumps(finding.to_dict()))


def resolve_rows(resolved: list[tuple[str, str, int]]) -> list[OutputRow]:
    return [
        OutputRow(RESOLVE, ts, json.dumps({"rule": rule, "subject": subject, "ts_ns": ts}))
        for rule, subject, ts in resolved
    ]


#: Counters of ``checks.rule.Stats`` reported per batch (``findings`` is reported as findings).
STAT_FIELDS: Final = (
    "frames",
    "exchanges",
    "late_frames",
    "unpaired_responses",
    "decode_errors",
    "header_only",
    "gaps",
    "evicted_keys",
    "evicted_entries",
)


def add_stats(counts: dict[str, int], stats: Stats) -> None:
    """Add ``stats``' counters to ``counts`` (one ``STAT`` row per call sums every key's)."""
    for name in STAT_FIELDS:
        value = getattr(stats, name)
        if value:
            counts[name] = counts.get(name, 0) + value


def stat_row(counts: Mapping[str, int], ts_ns: int) -> OutputRow | None:
    if not counts:
        return None
    return OutputRow(STAT, ts_ns, json.dumps(dict(counts)))


#: The counts of an aggregate row.
AGG_COUNTS: Final = ("frames", "decode_errors", "null_protocol_type", "error_responses")

#: Responses whose error code the data-quality error rate counts: the top-level ``ErrorCode`` (for
#: Produce, the first failing partition's).
ERROR_RATE_APIS: Final = frozenset(
    {
        ApiKey.PRODUCE,
        ApiKey.JOIN_GROUP,
        ApiKey.SYNC_GROUP,
        ApiKey.API_VERSIONS,
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.END_TXN,
    }
)


def _api_name(api_key: int | None) -> str | None:
    try:
        return codec.api_name(api_key) if api_key is not None else None
    except (KeyError, DecodeError):
        return None


def _first_error_code(body: dict[str, Any], api_key: int) -> int | None:
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


def aggregate_rows(frames: Sequence[TapFrame], ts_ns: int) -> list[OutputRow]:
    """Per (dir, api, version) counts of a batch of frames, from the one decode: the data-quality
    suites' input (``streaming.quality``)."""
    out: dict[tuple[str, int | None, int | None], dict[str, Any]] = {}
    for frame in frames:
        direction = frame.direction
        if direction not in (REQ, RESP):
            continue
        api, version = frame.api_key, frame.api_version
        agg = out.get((direction, api, version))
        if agg is None:
            agg = out[(direction, api, version)] = {
                "dir": direction,
                "api_key": api,
                "api_name": _api_name(api),
                "api_version": version,
                **dict.fromkeys(AGG_COUNTS, 0),
            }
        agg["frames"] += 1
        if frame.error is not None:
            agg["decode_errors"] += 1
            continue
        response = frame.response
        if response is None or api not in ERROR_RATE_APIS:
            continue
        error = _first_error_code(response.body, api)
        if error is None:
            continue
        if error:
            agg["error_responses"] += 1
        elif (
            (api == ApiKey.JOIN_GROUP and (version or 0) >= 7)
            or (api == ApiKey.SYNC_GROUP and (version or 0) >= 5)
        ) and response.body.get("ProtocolType") is None:
            # KIP-559: a successful answer of these versions always names the protocol type.
            agg["null_protocol_type"] += 1
    return [OutputRow(AGG, ts_ns, json.dumps(agg)) for agg in out.values()]
