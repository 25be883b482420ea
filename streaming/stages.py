"""The two stateful stages of the job, as pure steps over plain rows (no Spark in this module).

``connection_step`` is stage one, per tap connection: it decodes the connection's tap-record rows
once, runs ``checks.sharding.ConnectionShard`` over them and emits findings, routes, per-batch
aggregates and counters. ``keyed_step`` is stage two, per route key: it buffers routed frames until
Spark's event-time watermark passes them, then feeds them to ``checks.sharding.KeyedShard`` in
event-time order. ``connection_bucket`` and ``keyed_bucket`` (and their ``*_expired`` timer calls) run
those steps for every connection or route key of one bucket, which is what
``streaming.processors`` wraps in ``transformWithStateInPandas``; ``LocalStages`` calls them the way
Spark does, for tests and benchmarks.

Rows between the stages all have ``STAGE_ROW_FIELDS``; ``kind`` says which fields mean something:
``route`` (frames for a keyed shard, packed), ``finding``, ``resolve``, ``agg`` (frame counts for the
data-quality suites), ``stat`` (engine counters such as late frames and evictions) and ``clock`` (the
batch clock, below).

**The batch clock.** Spark moves an event-time watermark only between micro-batches: the watermark a
batch runs with is the newest event time of the batch *before* it, minus the lateness. A routed frame
therefore waited in stage two for the batch after the one whose data passed it, one whole batch more
than the data required. So each stage-one call also sends every stage-two bucket a ``clock`` row with
the newest event time among its frames. Stage two waits for the newest of those (this batch's newest
event time, as every stage-one call of the batch has run before any stage-two call) minus the
lateness: the watermark Spark will hand the next batch, applied in this one. Every routed frame at or
before it is already in this batch's input (the frames of a connection arrive in order, and stage one
runs them all before routing on), so the order stage two releases in is the one the single monitor
uses; ``checks.sharding``'s property test releases exactly this way.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Final, Protocol

import msgpack

import codec
from checks.model import Finding
from checks.rule import Stats
from checks.settings import ChecksSettings
from checks.sharding import ConnectionShard, KeyedShard, Route, forms_route_key
from codec import facts, taprecord
from codec.errors import DecodeError
from codec.protocol import ApiKey
from codec.taprecord import REQ, RESP, TapFrame, frame_from_row

#: Stage-two key of rows that are already final (findings, aggregates...): passed through untouched.
PASS_KEY = "~pass"
#: Kind and route key of the batch clock's rows (module docstring). A clock row's ``at_ms`` is the newest
#: event time among the frames of the stage-one call that sent it; ``bucket``, the stage-two bucket it is for.
CLOCK = "clock"
CLOCK_KEY = "~clock"
NS_PER_MS = 1_000_000
INCOMPLETE, REQUEST_ONLY = 1, 2
JOIN_GROUP, SYNC_GROUP = ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP

#: Columns of a row between the stages (Spark DDL: ``streaming.processors.STAGE_ROWS_DDL``).
STAGE_ROW_FIELDS = (
    "kind",
    "route_key",
    "event_ms",
    "ts_ns",
    "at_ms",
    "conn",
    "seq",
    "frame",
    "flags",
    "payload",
    #: The stage-two bucket of a route or clock row (``bucket_index`` of its route key, by the same
    #: function stage one's buckets use); None on rows that pass through.
    "bucket",
)
#: Counters of ``checks.rule.Stats`` reported per batch (``findings`` is reported as findings).
STAT_FIELDS = (
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


def _opt_int(value: Any) -> int | None:
    """Spark hands nullable ints to pandas as floats with NaN for null."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


#: An input row's Spark event time in ms, as the processors hand it over (``event_time`` converted).
EVENT_TIME_MS = "event_time_ms"


def _event_ms(row: dict[str, Any]) -> int:
    """The row's Spark event time (ms): ``ts_ns``, or its arrival for records without one."""
    millis = row.get(EVENT_TIME_MS)
    if millis is not None:
        return int(millis)
    value = row.get("event_time")
    if value is not None and hasattr(value, "value"):  # a pandas Timestamp (ns since the epoch)
        return int(value.value) // NS_PER_MS
    return (_opt_int(row.get("ts_ns")) or 0) // NS_PER_MS


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def pack_frame(frame: TapFrame) -> bytes:
    """A routed frame between the stages: its tap metadata and decoded facts (``codec.facts``), no
    frame bytes."""
    return facts.packb(taprecord.frame_to_packed(frame))


def unpack_frame(data: bytes) -> TapFrame:
    """A routed frame back, its message unpacked from its facts: stage two decodes nothing."""
    return taprecord.frame_from_packed(msgpack.unpackb(data, raw=False))


def _row(kind: str, event_ms: int, ts_ns: int, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(STAGE_ROW_FIELDS)
    row.update(kind=kind, event_ms=event_ms, ts_ns=ts_ns, **fields)
    return row


def finding_row(finding: Finding, event_ms: int) -> dict[str, Any]:
    return _row("finding", event_ms, finding.ts_ns, route_key=PASS_KEY, payload=json.dumps(finding.to_dict()))


#: The counts of an aggregate row (summed when rows are combined).
AGG_COUNTS = ("frames", "decode_errors", "null_protocol_type", "error_responses")


#: Responses whose error code the data-quality error rate counts: the top-level ``ErrorCode`` (for
#: Produce, the first failing partition's). Kept as it was when a projected decode fed the rate.
ERROR_RATE_APIS = frozenset(
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


def _aggregates(frames: list[TapFrame]) -> list[dict[str, Any]]:
    """Per (dir, api, version) counts of this batch, from the one decode: the data-quality suites' input."""
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
    return list(out.values())


def _stat_row(stats: Stats, event_ms: int, encode: bool = True) -> dict[str, Any] | None:
    """The counters row; ``encode=False`` leaves its payload a dict (``combine_rows`` encodes it)."""
    counts = {name: getattr(stats, name) for name in STAT_FIELDS if getattr(stats, name)}
    if not counts:
        return None
    payload = json.dumps(counts) if encode else counts
    return _row("stat", event_ms, event_ms * NS_PER_MS, route_key=PASS_KEY, payload=payload)


def _resolve_rows(resolved: list[tuple[str, str, int]], event_ms: int) -> list[dict[str, Any]]:
    return [
        _row(
            "resolve",
            event_ms,
            ts,
            route_key=PASS_KEY,
            payload=json.dumps({"rule": rule, "subject": subject, "ts_ns": ts}),
        )
        for rule, subject, ts in resolved
    ]


@dataclass
class StepResult:
    #: The key's new saved state (the shard's bytes), or None: nothing left to keep, delete it.
    state: bytes | None
    rows: list[dict[str, Any]]
    #: When to be called again (event-time ms): a buffered route, a rule's timer, or the state's TTL.
    next_timer_ms: int | None = None


@dataclass
class ConnectionResult(StepResult):
    #: The newest event time (ms) among the connection's rows (what the batch clock sends on).
    newest_ms: int | None = None


def connection_step(
    config: ChecksSettings, saved: bytes | None, rows: Iterable[dict[str, Any]], watermark_ms: int
) -> ConnectionResult:
    """Stage one for one connection's rows of a micro-batch."""
    return _connection_step(config, saved, rows, watermark_ms, None)


def _connection_step(
    config: ChecksSettings,
    saved: bytes | None,
    rows: Iterable[dict[str, Any]],
    watermark_ms: int,
    combined: _Combiner | None,
) -> ConnectionResult:
    """``connection_step``; with ``combined`` (a bucket call's), routes go straight to it instead of
    becoming a row each, and the aggregate and counters payloads stay dicts, for it to sum and encode
    once per bucket call (not encoded here to be decoded there)."""
    encode = combined is None
    batch = sorted(rows, key=lambda r: _opt_int(r.get("seq")) or 0)
    shard = ConnectionShard(config, saved or None)
    frames = [frame_from_row(r) for r in batch]
    # Spark refuses rows at or before its watermark from a stage that feeds another stateful stage.
    floor_ms = watermark_ms + 1
    newest = max((_event_ms(r) for r in batch), default=floor_ms)
    event_ms = max(newest, floor_ms)
    findings = shard.feed(frames)
    out = [finding_row(f, event_ms) for f in findings]
    # A frame routed to several keys of one kind is one projected object: packed once.
    packed: dict[int, bytes] = {}
    for route in shard.take_routes():
        data = packed.get(id(route.frame))
        if data is None:
            data = packed[id(route.frame)] = pack_frame(route.frame)
        flags = (INCOMPLETE if route.incomplete else 0) | (REQUEST_ONLY if route.request_only else 0)
        at_ms = max(-(-route.at_ns // NS_PER_MS), floor_ms)
        frame = route.frame
        if combined is not None:
            # ``_ROUTE_ENTRY``, written out.
            combined.add_route(
                route.key, at_ms, frame.ts_ns, [at_ms, frame.ts_ns, frame.conn, frame.seq, data, flags]
            )
            continue
        # ``_row``'s columns, in ``STAGE_ROW_FIELDS`` order, written out: one route row per frame.
        out.append(
            {
                "kind": "route",
                "route_key": route.key,
                "event_ms": at_ms,
                "ts_ns": frame.ts_ns,
                "at_ms": at_ms,
                "conn": frame.conn,
                "seq": frame.seq,
                "frame": data,
                "flags": flags,
                "payload": None,
                "bucket": None,
            }
        )
    out.extend(_resolve_rows(shard.ctx.resolved, event_ms))
    out.extend(
        _row(
            "agg",
            event_ms,
            event_ms * NS_PER_MS,
            route_key=PASS_KEY,
            payload=json.dumps(agg) if encode else agg,
        )
        for agg in _aggregates(frames)
    )
    stat = _stat_row(shard.ctx.stats, event_ms, encode)
    if stat is not None:
        out.append(stat)
    newest_seen = newest if batch else None
    closed = bool(frames) and frames[-1].direction == "close"
    if closed:
        return ConnectionResult(None, out, None, newest_seen)
    # A connection that vanished without a close record (a tap restart) expires after its TTL.
    expiry = (max(newest, watermark_ms) + int(config.connection_ttl_seconds * 1000)) if frames else None
    return ConnectionResult(shard.export(), out, expiry, newest_seen)


def expired_row(event_ms: int) -> dict[str, Any]:
    """Counted when a key's idle state is dropped by its TTL (never silent)."""
    return _row(
        "stat", event_ms, event_ms * NS_PER_MS, route_key=PASS_KEY, payload=json.dumps({"evicted_keys": 1})
    )


@dataclass
class Buffered:
    """A routed frame waiting in stage two for the watermark."""

    at_ms: int
    ts_ns: int
    conn: str
    seq: int
    #: The frame as ``pack_frame`` made it.
    frame: bytes
    flags: int


#: A routed frame as packed between the stages and in stage two's buffer: ``Buffered``'s fields, in order
#: (``_route_entries`` reads them back; ``_connection_step`` writes the same list out, on its hot path).
_ROUTE_ENTRY: Final = tuple(f.name for f in fields(Buffered))
_packed_entry: Final = attrgetter(*_ROUTE_ENTRY)

#: The order stage two releases routed frames in, as the single monitor does: (ts_ns, conn, seq).
_RELEASE_ORDER: Final = attrgetter("ts_ns", "conn", "seq")


@dataclass
class KeyedResult(StepResult):
    buffer: list[Buffered] = field(default_factory=list)


def keyed_step(
    config: ChecksSettings,
    key: str,
    saved: bytes | None,
    buffer: list[Buffered],
    watermark_ms: int,
) -> KeyedResult:
    """Stage two for one route key: release what the watermark passed, in event-time order."""
    ready = sorted([b for b in buffer if b.at_ms <= watermark_ms], key=_RELEASE_ORDER)
    waiting = [b for b in buffer if b.at_ms > watermark_ms]
    try:
        shard = KeyedShard(config, key, saved or None)
    except KeyError:
        # A key no rule of this build forms (state from an older route scheme): drop it, counted.
        dropped = {"unknown_route_keys": 1, "dropped_routes": len(buffer)}
        row = _row("stat", max(watermark_ms, 0), 0, route_key=PASS_KEY, payload=json.dumps(dropped))
        return KeyedResult(None, [row], None, [])
    findings = shard.feed(
        Route(
            key,
            unpack_frame(b.frame),
            b.at_ms * NS_PER_MS,
            bool(b.flags & INCOMPLETE),
            bool(b.flags & REQUEST_ONLY),
        )
        for b in ready
    )
    if watermark_ms > 0:
        findings += shard.advance(watermark_ms * NS_PER_MS)
    event_ms = max(watermark_ms, 0)
    out = [finding_row(f, event_ms) for f in findings]
    out.extend(_resolve_rows(shard.ctx.resolved, event_ms))
    stat = _stat_row(shard.ctx.stats, event_ms)
    if stat is not None:
        out.append(stat)
    timers = [b.at_ms for b in waiting]
    deadline = shard.next_timer_ns()
    if deadline is not None:
        timers.append(-(-deadline // NS_PER_MS))
    if shard.empty:
        return KeyedResult(None, out, min(timers, default=None), waiting)
    expiry_ms = -(-shard.expires_at_ns() // NS_PER_MS)
    if not timers and expiry_ms <= watermark_ms:
        out.append(expired_row(event_ms))
        return KeyedResult(None, out, None, waiting)
    timers.append(expiry_ms)
    return KeyedResult(shard.export(), out, min(timers), waiting)


# ---------------------------------------------------------------------------------------------------
# Buckets: many connections (stage one) or route keys (stage two) under one Spark grouping key.
#
# Spark calls a stateful processor once per grouping key and batch, and each call costs pandas
# conversions and round trips to the JVM. Keyed by connection or route key, a batch made thousands of
# calls; keyed by a bucket of them it makes one per bucket. Each connection or route key keeps its own
# entry in the bucket's map state and runs through the same per-key step as before, so bucketing
# changes where state lives, never what the checks see.


class BucketStore(Protocol):
    """One bucket's per-key state: pages of Spark state in the job (``streaming.pages``), a dict in
    tests and benchmarks. ``begin`` and ``finish`` come before and after each call on the bucket."""

    def begin(self) -> None: ...

    def finish(self) -> None: ...

    def get(self, key: str) -> tuple[Any, ...] | None: ...

    def put(self, key: str, value: tuple[Any, ...]) -> None: ...

    def remove(self, key: str) -> None: ...

    def items(self) -> Iterable[tuple[str, tuple[Any, ...]]]: ...

    def due(self, watermark_ms: int) -> tuple[list[tuple[str, tuple[Any, ...]]], int | None]:
        """The entries whose next call (an entry's last field) is due at ``watermark_ms``, and the
        earliest next call of the others (``split_due``)."""
        ...


def split_due(
    entries: Iterable[tuple[str, tuple[Any, ...]]], watermark_ms: int
) -> tuple[list[tuple[str, tuple[Any, ...]]], int | None]:
    """``BucketStore.due`` over entries: an entry is due when its last field (its next call, event-time
    ms) is at or before the watermark, or unset."""
    due: list[tuple[str, tuple[Any, ...]]] = []
    later: int | None = None
    for key, value in entries:
        at = value[-1]
        if at is not None and at > watermark_ms:
            later = _earliest(later, at)
        else:
            due.append((key, value))
    return due, later


class DictBucketStore:
    """A ``BucketStore`` in memory."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[Any, ...]] = {}

    def begin(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def get(self, key: str) -> tuple[Any, ...] | None:
        return self.entries.get(key)

    def put(self, key: str, value: tuple[Any, ...]) -> None:
        self.entries[key] = value

    def remove(self, key: str) -> None:
        self.entries.pop(key, None)

    def items(self) -> Iterable[tuple[str, tuple[Any, ...]]]:
        return list(self.entries.items())

    def due(self, watermark_ms: int) -> tuple[list[tuple[str, tuple[Any, ...]]], int | None]:
        return split_due(self.items(), watermark_ms)


@dataclass
class BucketResult:
    rows: list[dict[str, Any]]
    #: The bucket's one timer (event-time ms): never later than the earliest entry that needs a call,
    #: so it may fire early (a call that finds nothing due re-arms it). None: no entry needs a timer.
    timer_ms: int | None


def _earliest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def bucket_index(key: str, buckets: int) -> int:
    """The bucket of a connection (stage one's bundles, ``streaming.bundles``) or of a route key (stage
    one's route rows): the one bucketing function of the job and of ``LocalStages``. CRC-32 is fixed,
    so a key keeps its bucket across restarts and releases (its state is stored per bucket)."""
    return zlib.crc32(key.encode()) % buckets


def _group(rows: Iterable[dict[str, Any]], column: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(str(row[column]), []).append(row)
    return out


def connection_bucket(
    config: ChecksSettings,
    store: BucketStore,
    rows: Iterable[dict[str, Any]],
    watermark_ms: int,
    armed_ms: int | None,
    buckets: int = 0,
) -> BucketResult:
    """Stage one for one bucket's rows of a micro-batch: ``connection_step`` per connection.

    Entries are ``(shard state, expiry ms)``. ``armed_ms`` is the bucket's timer as armed now; it stays
    when it is earlier than every new expiry (a busy bucket does not move its timer every batch).
    ``buckets``: how many buckets stage two has: each gets a batch-clock row (module docstring), and
    each route row names its route key's bucket; 0, none (routes then name no bucket).
    """
    combined = _Combiner(buckets)
    timer = armed_ms
    newest: int | None = None
    for conn, conn_rows in _group(rows, "conn").items():
        saved = store.get(conn)
        result = _connection_step(config, saved[0] if saved else None, conn_rows, watermark_ms, combined)
        combined.add_rows(result.rows)
        if result.newest_ms is not None and (newest is None or result.newest_ms > newest):
            newest = result.newest_ms
        if result.state is None:
            if saved is not None:
                store.remove(conn)
            continue
        store.put(conn, (result.state, result.next_timer_ms))
        timer = _earliest(timer, result.next_timer_ms)
    out = combined.rows()
    if newest is not None:
        out.extend(clock_rows(newest, watermark_ms, buckets))
    return BucketResult(out, timer)


def clock_rows(newest_ms: int, watermark_ms: int, buckets: int) -> list[dict[str, Any]]:
    """The batch clock (module docstring): ``newest_ms`` for each of stage two's ``buckets``."""
    # Spark refuses rows at or before its watermark from a stage that feeds another stateful stage.
    event_ms = max(newest_ms, watermark_ms + 1)
    return [
        _row(CLOCK, event_ms, newest_ms * NS_PER_MS, route_key=CLOCK_KEY, at_ms=newest_ms, bucket=bucket)
        for bucket in range(buckets)
    ]


def batch_watermark(config: ChecksSettings, watermark_ms: int, rows: Iterable[dict[str, Any]]) -> int:
    """The watermark stage two runs with: Spark's, or the batch clock's newest event time minus the
    lateness when its rows are among ``rows`` (module docstring)."""
    newest = max((row["at_ms"] for row in rows if row["kind"] == CLOCK), default=None)
    if newest is None:
        return watermark_ms
    return max(watermark_ms, int(newest) - int(config.watermark_seconds * 1000))


def combine_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fewer, larger rows between the stages: one route row per route key (its frames packed in
    order), one aggregate row per (dir, api, version) and one counters row, per bucket call. Every
    row costs Spark a conversion, a shuffle entry and a pandas row on each side, and a busy producer
    sends many frames to one key per batch. Findings and resolves pass unchanged."""
    combined = _Combiner()
    combined.add_rows(rows)
    return combined.rows()


class _Combiner:
    """``combine_rows``, row by row; a bucket call hands it its routes directly (``add_route``), so a
    routed frame is never a row of its own (a ten-column dict per frame, read back at once)."""

    def __init__(self, buckets: int = 0) -> None:
        #: Stage two's bucket count, for each route row's ``bucket`` (0: not known, None).
        self.buckets = buckets
        self.passed: list[dict[str, Any]] = []
        self.routes: dict[str, dict[str, Any]] = {}
        self.packed: dict[str, list[list[Any]]] = {}
        self.aggs: dict[tuple[Any, ...], tuple[dict[str, Any], dict[str, Any]]] = {}
        self.counters: dict[str, Any] | None = None
        self.counts: dict[str, int] = {}

    def add_route(self, key: str, event_ms: int, ts_ns: int, entry: list[Any]) -> None:
        """One routed frame: ``[at_ms, ts_ns, conn, seq, frame, flags]``, its row's ``event_ms`` and ``ts_ns``."""
        route = self.routes.get(key)
        if route is None:
            self.routes[key] = _row("route", event_ms, ts_ns, route_key=key)
            self.packed[key] = [entry]
            return
        if event_ms < route["event_ms"]:
            route["event_ms"] = event_ms
        self.packed[key].append(entry)

    def add_rows(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            kind = row["kind"]
            if kind == "route":
                self.add_route(
                    row["route_key"], row["event_ms"], row["ts_ns"], [row[name] for name in _ROUTE_ENTRY]
                )
            elif kind == "agg":
                agg = _payload(row)
                group = (agg["dir"], agg["api_key"], agg["api_version"])
                if group not in self.aggs:
                    self.aggs[group] = (row, agg)
                    continue
                first, total = self.aggs[group]
                first["event_ms"] = max(first["event_ms"], row["event_ms"])
                total["api_name"] = total["api_name"] or agg["api_name"]
                for name in AGG_COUNTS:
                    total[name] += agg[name]
            elif kind == "stat":
                counters = self.counters = self.counters or row
                counters["event_ms"] = max(counters["event_ms"], row["event_ms"])
                counts = self.counts
                for name, value in _payload(row).items():
                    counts[name] = counts.get(name, 0) + value
            else:
                self.passed.append(row)

    def rows(self) -> list[dict[str, Any]]:
        """The combined rows: findings and resolves as they came, then routes, aggregates, counters."""
        out = self.passed
        for key, route in self.routes.items():
            route["frame"] = facts.packb(self.packed[key])
            if self.buckets:
                route["bucket"] = bucket_index(key, self.buckets)
            out.append(route)
        for row, agg in self.aggs.values():
            row["payload"] = json.dumps(agg)
            out.append(row)
        if self.counters is not None:
            self.counters["payload"] = json.dumps(self.counts)
            out.append(self.counters)
        return out


def _payload(row: dict[str, Any]) -> dict[str, Any]:
    """An aggregate or counters row's payload: JSON text, or still a dict (``_connection_step``)."""
    payload = row["payload"]
    return payload if isinstance(payload, dict) else json.loads(payload)


def connection_bucket_expired(store: BucketStore, watermark_ms: int) -> BucketResult:
    """The bucket's timer fired: drop connections idle past their TTL (counted), re-arm for the rest."""
    out: list[dict[str, Any]] = []
    expired, timer = store.due(watermark_ms)
    for conn, _ in expired:
        store.remove(conn)
        out.append(expired_row(watermark_ms + 1))
    return BucketResult(out, timer)


def buffered_of(row: dict[str, Any]) -> list[Buffered]:
    """A combined route row (``combine_rows``) as the routed frames stage two buffers."""
    return [Buffered(*entry) for entry in _route_entries(row)]


def _route_entries(row: dict[str, Any]) -> list[list[Any]]:
    """A combined route row's routed frames, as packed: ``[at_ms, ts_ns, conn, seq, frame, flags]`` each."""
    return [
        [int(at_ms), int(ts_ns), str(conn), int(seq), bytes(frame), int(flags)]
        for at_ms, ts_ns, conn, seq, frame, flags in msgpack.unpackb(row["frame"], raw=False)
    ]


def _keyed_entry_step(
    config: ChecksSettings,
    store: BucketStore,
    key: str,
    saved: tuple[Any, ...] | None,
    arrived: list[list[Any]],
    watermark_ms: int,
) -> tuple[list[dict[str, Any]], int | None]:
    """One route key's call: its saved entry and the routed frames that ``arrived`` (packed entries);
    the rows it made and when the key next needs a call.

    When nothing of the key is due yet (its entry's next call and every arrival are past the
    watermark), the arrivals only join the waiting routes: the shard is neither read nor written, and
    ``keyed_step`` would have fed it nothing and found its timers not due. Most arrivals are such, as
    stage one routes frames past the watermark and they wait one lateness."""
    shard, packed = (saved[0], saved[1]) if saved else (None, None)
    due = saved[2] if saved else None
    soonest = min((entry[0] for entry in arrived), default=None)
    if (
        soonest is not None
        and soonest > watermark_ms
        and (due is None or due > watermark_ms)
        and forms_route_key(key)
    ):
        waiting = (msgpack.unpackb(packed) if packed else []) + arrived
        due = soonest if due is None else min(due, soonest)
        store.put(key, (shard, msgpack.packb(waiting), due))
        return [], due
    buffered = [Buffered(*item) for item in msgpack.unpackb(packed)] if packed else []
    buffered += [Buffered(*entry) for entry in arrived]
    result = keyed_step(config, key, shard, buffered, watermark_ms)
    if result.state is None and not result.buffer:
        if saved is not None:
            store.remove(key)
    else:
        buffer = msgpack.packb([_packed_entry(b) for b in result.buffer])
        store.put(key, (result.state, buffer, result.next_timer_ms))
    return result.rows, result.next_timer_ms


def keyed_bucket(
    config: ChecksSettings,
    store: BucketStore,
    rows: Iterable[dict[str, Any]],
    watermark_ms: int,
    armed_ms: int | None,
) -> BucketResult:
    """Stage two for one bucket's routed rows: ``keyed_step`` per route key that received frames, then,
    when the batch clock moved the watermark past the bucket's armed timer, every key due by it (what
    the timer would have done a batch later).

    Entries are ``(shard state, buffered routes packed with msgpack, next call ms)``.
    """
    rows = list(rows)
    watermark = batch_watermark(config, watermark_ms, rows)
    out: list[dict[str, Any]] = []
    timer = armed_ms
    routed = (row for row in rows if row["kind"] != CLOCK)
    # Arrivals first: a key's waiting routes and its new ones are released together, in order.
    for key, key_rows in _group(routed, "route_key").items():
        arrived = [entry for r in key_rows for entry in _route_entries(r)]
        made, due = _keyed_entry_step(config, store, key, store.get(key), arrived, watermark)
        out.extend(made)
        timer = _earliest(timer, due)
    if watermark > watermark_ms and armed_ms is not None and armed_ms <= watermark:
        swept = keyed_bucket_expired(config, store, watermark)
        out.extend(swept.rows)
        timer = swept.timer_ms
    return BucketResult(out, timer)


def keyed_bucket_expired(config: ChecksSettings, store: BucketStore, watermark_ms: int) -> BucketResult:
    """The bucket's timer fired: step every route key whose next call is due, re-arm for the rest."""
    out: list[dict[str, Any]] = []
    ready, timer = store.due(watermark_ms)
    for key, saved in ready:
        made, due = _keyed_entry_step(config, store, key, saved, [], watermark_ms)
        out.extend(made)
        timer = _earliest(timer, due)
    return BucketResult(out, timer)


class _LocalBuckets:
    """One bucketed stage's buckets as Spark keeps them: a store and one armed timer each."""

    def __init__(self, buckets: int, store: Callable[[], BucketStore]) -> None:
        self.stores = [store() for _ in range(buckets)]
        self.timers: list[int | None] = [None] * buckets
        self.calls = 0

    def run(
        self,
        rows: list[dict[str, Any]],
        column: str,
        watermark_ms: int,
        on_input: Callable[[BucketStore, list[dict[str, Any]], int, int | None], BucketResult],
        on_timer: Callable[[BucketStore, int], BucketResult],
    ) -> list[dict[str, Any]]:
        by_bucket: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            # Stage one's output names each row's stage-two bucket (``streaming.job.checks_pipeline``
            # groups by it); tap-record rows are bucketed by their connection here, as the bundles do.
            bucket = row.get("bucket")
            if bucket is None:
                bucket = bucket_index(str(row[column]), len(self.stores))
            by_bucket.setdefault(bucket, []).append(row)
        out: list[dict[str, Any]] = []
        for b, bucket_rows in by_bucket.items():
            self.calls += 1
            self.stores[b].begin()
            result = on_input(self.stores[b], bucket_rows, watermark_ms, self.timers[b])
            self.stores[b].finish()
            self.timers[b] = result.timer_ms
            out.extend(result.rows)
        # A timer armed at or before the watermark by this batch's calls fires in the next batch.
        for b, armed in enumerate(self.timers):
            if armed is not None and armed <= watermark_ms:
                self.calls += 1
                self.stores[b].begin()
                result = on_timer(self.stores[b], watermark_ms)
                self.stores[b].finish()
                self.timers[b] = result.timer_ms
                out.extend(result.rows)
        return out


class LocalStages:
    """Both bucketed stages in one process, called the way Spark calls the job's processors: per
    micro-batch, each bucket with input once, then each bucket whose timer the watermark passed.
    For tests and benchmarks; the job runs the same steps through ``streaming.processors``.
    ``store`` makes each bucket's store: a dict by default, or the job's pages over a
    ``streaming.pages.DictPageBackend``."""

    def __init__(
        self, config: ChecksSettings, buckets: int, store: Callable[[], BucketStore] = DictBucketStore
    ) -> None:
        self.config = config
        self.one = _LocalBuckets(buckets, store)
        self.two = _LocalBuckets(buckets, store)

    @property
    def calls(self) -> int:
        """Python calls made so far, both stages (what Spark pays a pandas round trip for)."""
        return self.one.calls + self.two.calls

    def stage_one(self, rows: list[dict[str, Any]], watermark_ms: int) -> list[dict[str, Any]]:
        """Tap-record rows (``streaming.frames.frame_row``) in, stage one's output rows out."""
        return self.one.run(
            rows,
            "conn",
            watermark_ms,
            # The batch clock goes to each of stage two's buckets.
            lambda store, r, wm, armed: connection_bucket(
                self.config, store, r, wm, armed, len(self.two.stores)
            ),
            connection_bucket_expired,
        )

    def stage_two(self, routed: list[dict[str, Any]], watermark_ms: int) -> list[dict[str, Any]]:
        """Stage one's output in; what ``foreachBatch`` sees out (pass-through rows included)."""
        out = [r for r in routed if r["route_key"] == PASS_KEY]
        out += self.two.run(
            [r for r in routed if r["route_key"] != PASS_KEY],
            "route_key",
            watermark_ms,
            lambda store, r, wm, armed: keyed_bucket(self.config, store, r, wm, armed),
            lambda store, wm: keyed_bucket_expired(self.config, store, wm),
        )
        return out
