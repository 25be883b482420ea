"""The stateless half of the job: tap-record rows in, one *bundle* per stateful bucket out.

The job's ``mapInArrow`` runs ``route_frames`` where the Kafka source hands over the tap topic's
records, before any shuffle, on each frame decoded once (``streaming.frames.batch_frames``,
``streaming.bundles``). It sends each frame:

- to its connection's key (``conn|<id>``), for the connection-scoped rules, the gap and decode error
  reports and the counts (``checks.sharding.ConnectionShard``, in the stateful stage), with what those
  read (``checks.projections.project_for_connection``);
- to every entity key its exchange forms (producer, transaction, group, cluster), pruned to that key
  kind's declared projection (``checks.sharding.Router``, ``checks.projections``); a run of ordinary
  exchanges of one key as one summary entry (``checks.summaries``, ``checks.routes.summary_entry``).

It keeps nothing between batches: the tap writes a request and its response as one record (tap-record
schema 2), so pairing needs no memory of earlier batches. The three meanings
that stateless routing changes are in ``checks.sharding.Router``'s docstring.

**The bundle** is this module's format, written by ``pack_bundle`` and read by ``read_bundle``: per
(source batch, bucket), the batch clock (the newest event time among the whole source batch's frames,
which every bucket gets, with or without data of its own: the stateful stage applies the watermark
Spark will hand the next batch in this one, ``streaming.stages``), the frames of each connection whose
key falls in the bucket, and the routed frames of each entity key that does. Spark shuffles and groups
a few rows per source batch instead of one per frame, and the stage reads each in one call.

The rules that keep no state across exchanges (``checks.projections.Transitions.in_router``: the
read-committed check) run here too, and their findings go straight to the sink. The per-batch
aggregates the data-quality suites read are counted here (stateless), with the answers no entity key
will see (``unrouted_responses``: their request came in an earlier batch, as a
schema-1 record or a lone one); all go to ``PASS_BUCKET``, which the stage passes through untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from checks.routes import route_entry, summary_entry
from checks.settings import ChecksSettings
from checks.sharding import Router, connection_row
from codec import facts
from codec.taprecord import TapFrame, frame_from_row, pack_frame
from streaming.rows import (
    NS_PER_MS,
    OutputRow,
    aggregate_rows,
    bucket_index,
    conn_key,
    event_ms_of,
    finding_row,
    pack_connection_row,
    resolve_rows,
    stat_row,
)

#: The bucket of rows that are already final (the aggregates): the stage passes them through.
PASS_BUCKET: Final = -1


@dataclass
class Bundle:
    """What one source batch sends one bucket (the module docstring)."""

    #: The newest event time (ms) among the source batch's frames: the batch clock.
    newest_ms: int
    #: Connection key -> its row of the batch (``checks.sharding.connection_row``: the frames its rules'
    #: transitions name, every other exchange by its headers), as ``streaming.rows.pack_connection_row``.
    conns: dict[str, list[Any]] = field(default_factory=dict)
    #: Route key -> its routed frames (``checks.routes.RouteEntry``, read back as lists), in routing order.
    routes: dict[str, list[Any]] = field(default_factory=dict)


def stage_rows(bundle: Bundle) -> int:
    """How many rows the bundle hands the stateful stage's entries: each connection's kept frames and
    the one entry of its header exchanges (``checks.sharding.ConnectionRow``), each routed frame."""
    conns = sum(len(frames) + bool(exchanges) for _, frames, exchanges in bundle.conns.values())
    return conns + sum(len(entries) for entries in bundle.routes.values())


def header_exchanges(bundle: Bundle) -> int:
    """How many exchanges the bundle's connection rows carry by their headers."""
    return sum(len(exchanges[0]) for _, _, exchanges in bundle.conns.values() if exchanges)


def pack_bundle(bundle: Bundle) -> bytes:
    return facts.packb([bundle.newest_ms, bundle.conns, bundle.routes])


def read_bundle(data: bytes) -> Bundle:
    newest_ms, conns, routes = msgpack.unpackb(data, raw=False)
    return Bundle(int(newest_ms), conns, routes)


def pack_passed(rows: list[OutputRow]) -> bytes:
    """Rows for ``PASS_BUCKET``: already the stage's output rows."""
    return facts.packb([list(r) for r in rows])


def read_passed(data: bytes) -> list[OutputRow]:
    return [OutputRow(str(k), int(t), str(p)) for k, t, p in msgpack.unpackb(data, raw=False)]


@dataclass
class RoutedBatch:
    """``route_rows``'s result: a bundle per bucket (every bucket, for the clock) and the passed rows."""

    newest_ms: int | None
    bundles: dict[int, Bundle]
    passed: list[OutputRow]


def route_rows(config: ChecksSettings, rows: Iterable[Mapping[str, Any]], buckets: int) -> RoutedBatch:
    """``route_frames`` over tap-record rows as dicts (``streaming.frames.frame_row``, plus each frame's
    event time where known, ``streaming.rows.EVENT_TIME_MS``): how ``LocalStages`` feeds the router."""
    frames: list[TapFrame] = []
    newest: int | None = None
    for row in rows:
        frames.append(frame_from_row(row))
        millis = event_ms_of(row)
        if newest is None or millis > newest:
            newest = millis
    if newest is None:
        return RoutedBatch(None, {}, [])
    return route_frames(config, frames, newest, buckets)


def route_frames(
    config: ChecksSettings, frames: Sequence[TapFrame], newest_ms: int, buckets: int
) -> RoutedBatch:
    """One source batch's frames, decoded, in record order, and the newest event time (ms) among them
    (the batch clock) as a bundle per bucket of ``buckets``."""
    if not frames:
        return RoutedBatch(None, {}, [])
    per_conn: dict[str, list[TapFrame]] = {}
    for frame in frames:
        conn_frames = per_conn.get(frame.conn)
        if conn_frames is None:
            conn_frames = per_conn[frame.conn] = []
        conn_frames.append(frame)
    bundles = {b: Bundle(newest_ms) for b in range(buckets)}
    unrouted = 0
    judged: list[OutputRow] = []
    for conn, conn_frames in per_conn.items():
        conn_frames.sort(key=_seq)
        key = conn_key(conn)
        bundles[bucket_index(key, buckets)].conns[key] = pack_connection_row(connection_row(conn_frames))
        router = _route(config, conn_frames, bundles, buckets)
        unrouted += router.unrouted_responses
        # The rules the router judges itself (``checks.projections.Transitions.in_router``).
        judged += [finding_row(f) for f in router.findings]
        judged += resolve_rows(router.ctx.resolved)
    passed = judged + aggregate_rows(frames, newest_ms * NS_PER_MS)
    # What the stateful stage is handed per wire frame (requests and responses: tap events are not).
    counts = {
        "unrouted_responses": unrouted,
        "wire_frames": sum(1 for f in frames if f.direction in ("req", "resp")),
        "stage_rows": sum(stage_rows(b) for b in bundles.values()),
        "stage_header_exchanges": sum(header_exchanges(b) for b in bundles.values()),
    }
    counted = stat_row({k: n for k, n in counts.items() if n}, newest_ms * NS_PER_MS)
    if counted is not None:
        passed.append(counted)
    return RoutedBatch(newest_ms, bundles, passed)


def _seq(frame: TapFrame) -> int:
    return frame.seq


def _route(
    config: ChecksSettings, frames: list[TapFrame], bundles: dict[int, Bundle], buckets: int
) -> Router:
    """One connection's routes, into the bundles of their keys' buckets; the router, which counted the
    answers it could not route and holds its own rules' findings."""
    # A frame routed to several keys of one kind is one projected object: packed once.
    packed: dict[int, bytes] = {}
    bucket_of: dict[str, int] = {}
    router = Router(config)

    def pack(frame: TapFrame) -> bytes:
        data = packed.get(id(frame))
        if data is None:
            data = packed[id(frame)] = pack_frame(frame)
        return data

    for route in router.route(frames):
        summary = route.summary
        if summary is None:
            answer = route.answer
            entry = route_entry(route, pack(route.frame), None if answer is None else pack(answer))
        else:
            # One entry, with the routes it stands for (``checks.summaries``).
            entry = summary_entry(route, summary.expand())
        key = route.key
        bucket = bucket_of.get(key)
        if bucket is None:
            bucket = bucket_of[key] = bucket_index(key, buckets)
        entries = bundles[bucket].routes.get(key)
        if entries is None:
            entries = bundles[bucket].routes[key] = []
        entries.append(entry)
    return router
