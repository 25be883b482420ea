"""The job's one stateful stage, as pure steps over bundles (no Spark in this module).

The stage is keyed by bucket (``streaming.rows.bucket_index`` of a stage key). A bucket holds an entry
per key whose key falls in it, of two kinds:

- a **connection entry** (``conn|<id>``): the connection's frames arrive in seq order (one connection,
  one tap partition), so they are fed at once to ``checks.sharding.ConnectionShard`` (the
  connection-scoped rules, gaps, decode errors, counts); it expires after ``connection_ttl_seconds``
  without frames, or when the connection's ``close`` record comes;
- an **entity entry** (``<key kind>|<state key>``: a producer, a transaction, a group, the cluster): its
  routed frames come from many connections, so they wait until the watermark passes them and are then
  fed to ``checks.sharding.KeyedShard`` in event-time order (ts_ns, conn, seq), as the single monitor
  releases them.

``monitor_bucket`` runs one bucket's bundles of a micro-batch (``streaming.router``);
``monitor_bucket_expired`` its timer. ``streaming.processors`` wraps them in
``transformWithStateInPandas``; ``LocalStages`` calls them the way Spark does, for tests and
benchmarks.

**The batch clock.** Spark moves an event-time watermark only between micro-batches: the watermark a
batch runs with is the newest event time of the batch *before* it, minus the lateness. A routed frame
would therefore wait for the batch after the one whose data passed it. So every bundle carries the
newest event time of its whole source batch, and each bucket waits for the newest of those (this
batch's newest event time, as every source batch sends every bucket a bundle) minus the lateness: the
watermark Spark will hand the next batch, applied in this one. Every routed frame at or before it is
already in this batch's input (a connection's records arrive in order), so the order an entity entry
releases in is the one the single monitor uses; ``checks.sharding``'s property test releases exactly
this way. A summary of a run of routes (``checks.summaries``) waits for its last route's time and holds
back the key's routes that sort after its first: the shard sees them together and can tell whether one
falls inside the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter
from typing import Any, Final, Protocol

import msgpack

from checks.routes import SUMMARY, RouteEntry
from checks.settings import ChecksSettings
from checks.sharding import ConnectionRow, ConnectionShard, KeyedShard, forms_route_key
from checks.summaries import split_held
from streaming.pages import earliest, split_due
from streaming.router import Bundle, route_rows
from streaming.rows import (
    NS_PER_MS,
    OutputRow,
    add_stats,
    bucket_index,
    finding_row,
    is_conn_key,
    read_connection_row,
    resolve_rows,
    stat_row,
)

#: The order an entity entry releases routed frames in, as the single monitor does: (ts_ns, conn, seq).
_RELEASE_ORDER: Final = attrgetter("ts_ns", "conn", "seq")


@dataclass
class StepResult:
    """One key's call: the rows it made, its counters and when it next needs a call (event-time ms)."""

    rows: list[OutputRow] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    next_timer_ms: int | None = None


@dataclass
class KeyedResult(StepResult):
    #: The key's new saved state (the shard's bytes), or None: nothing left to keep, delete it.
    state: bytes | None = None
    buffer: list[RouteEntry] = field(default_factory=list)


def keyed_step(
    config: ChecksSettings, key: str, saved: bytes | None, buffer: list[RouteEntry], watermark_ms: int
) -> KeyedResult:
    """One entity key: release what the watermark passed, in event-time order."""
    # A summary waiting for the watermark holds back the routes that sort after its start, and the
    # due summaries whose runs may reach past it: one of them may fall inside its run, and it must
    # then go as the routes it stands for.
    ready, waiting = split_held(
        buffer,
        [_RELEASE_ORDER(b) for b in buffer],
        [b.at_ms <= watermark_ms for b in buffer],
        [bool(b.flags & SUMMARY) for b in buffer],
        [b.at_ms * NS_PER_MS for b in buffer],
        [b.answer_order for b in buffer],
    )
    try:
        shard = KeyedShard(config, key, saved or None)
    except KeyError:
        # A key no rule of this build forms (state from an older route scheme): drop it, counted.
        return KeyedResult(counts={"unknown_route_keys": 1, "dropped_routes": len(buffer)})
    findings = shard.feed([b.route(key) for b in ready])
    watermark_ns = watermark_ms * NS_PER_MS
    if watermark_ms > 0:
        # A summary held back holds back the answers that sort after its start, as it does routes.
        held_back = min((_RELEASE_ORDER(b) for b in waiting if b.flags & SUMMARY), default=None)
        findings += shard.advance(watermark_ns, held_back)
    out = [finding_row(f) for f in findings]
    out.extend(resolve_rows(shard.ctx.resolved))
    counts: dict[str, int] = {}
    add_stats(counts, shard.ctx.stats)
    timers = [b.at_ms for b in waiting if b.at_ms > watermark_ms]
    for deadline in (shard.next_timer_ns(), shard.next_answer_ns(watermark_ns)):
        if deadline is not None:
            timers.append(-(-deadline // NS_PER_MS))
    if shard.empty:
        return KeyedResult(out, counts, min(timers, default=None), None, waiting)
    expiry_ms = -(-shard.expires_at_ns() // NS_PER_MS)
    if not timers and expiry_ms <= watermark_ms:
        counts["evicted_keys"] = counts.get("evicted_keys", 0) + 1
        return KeyedResult(out, counts, None, None, waiting)
    timers.append(expiry_ms)
    return KeyedResult(out, counts, min(timers), shard.export(), waiting)


class BucketStore(Protocol):
    """One bucket's per-key state: pages of Spark state in the job (``streaming.pages``), a dict in
    tests and benchmarks. ``begin`` and ``finish`` come before and after each call on the bucket.
    An entry is a tuple whose last field is when the key next needs a call (event-time ms, or None)."""

    def begin(self) -> None: ...

    def finish(self) -> None: ...

    def get(self, key: str) -> tuple[Any, ...] | None: ...

    def put(self, key: str, value: tuple[Any, ...]) -> None: ...

    def remove(self, key: str) -> None: ...

    def items(self) -> Iterable[tuple[str, tuple[Any, ...]]]: ...

    def due(self, watermark_ms: int) -> tuple[list[tuple[str, tuple[Any, ...]]], int | None]:
        """The entries whose next call is due at ``watermark_ms``, and the earliest next call of the
        others (``split_due``)."""
        ...


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
    rows: list[OutputRow]
    #: The bucket's one timer (event-time ms): never later than the earliest entry that needs a call,
    #: so it may fire early (a call that finds nothing due re-arms it). None: no entry needs a timer.
    timer_ms: int | None


def _connection_entry(
    config: ChecksSettings,
    store: BucketStore,
    key: str,
    packed: list[list[Any]],
    watermark_ms: int,
) -> StepResult:
    """A connection's rows of this batch (``streaming.rows.pack_connection_row``, one per source batch)
    through its own entry, at once, in seq order.

    Entries are ``(shard state, expiry ms)``."""
    saved = store.get(key)
    row = ConnectionRow()
    for values in packed:
        row.extend(read_connection_row(values))
    shard = ConnectionShard(config, saved[0] if saved else None)
    findings = shard.feed_row(row)
    result = StepResult([finding_row(f) for f in findings])
    result.rows.extend(resolve_rows(shard.ctx.resolved))
    add_stats(result.counts, shard.ctx.stats)
    if row.closed:
        if saved is not None:
            store.remove(key)
        return result
    # A connection that vanished without a close record (a tap restart) expires after its TTL.
    newest_ns = row.newest_ns
    newest = newest_ns // NS_PER_MS if newest_ns is not None else watermark_ms
    expiry = max(newest, watermark_ms) + int(config.connection_ttl_seconds * 1000)
    store.put(key, (shard.export(), expiry))
    result.next_timer_ms = expiry
    return result


def _keyed_entry(
    config: ChecksSettings,
    store: BucketStore,
    key: str,
    saved: tuple[Any, ...] | None,
    arrived: list[Sequence[Any]],
    watermark_ms: int,
) -> StepResult:
    """One entity key's call: its saved entry and the routed frames that ``arrived`` (packed entries).

    Entries are ``(shard state, buffered routes packed with msgpack, next call ms)``. When nothing of
    the key is due yet (its entry's next call and every arrival are past the watermark), the arrivals
    only join the waiting routes: the shard is neither read nor written, and ``keyed_step`` would have
    fed it nothing and found its timers not due. Most arrivals are such: they wait one lateness."""
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
        return StepResult(next_timer_ms=due)
    buffered = [RouteEntry(*item) for item in msgpack.unpackb(packed)] if packed else []
    buffered += [RouteEntry(*entry) for entry in arrived]
    result = keyed_step(config, key, shard, buffered, watermark_ms)
    if result.state is None and not result.buffer:
        if saved is not None:
            store.remove(key)
    else:
        buffer = msgpack.packb(result.buffer)
        store.put(key, (result.state, buffer, result.next_timer_ms))
    return result


def batch_watermark(config: ChecksSettings, watermark_ms: int, bundles: Iterable[Bundle]) -> int:
    """The watermark the stage runs a bucket with: Spark's, or the batch clock's newest event time minus
    the lateness (module docstring)."""
    newest = max((b.newest_ms for b in bundles), default=None)
    if newest is None:
        return watermark_ms
    return max(watermark_ms, newest - int(config.watermark_seconds * 1000))


class _Call:
    """One bucket call's output: the rows, the summed counters, the bucket's next timer."""

    def __init__(self, timer: int | None) -> None:
        self.rows: list[OutputRow] = []
        self.counts: dict[str, int] = {}
        self.timer = timer

    def add(self, result: StepResult) -> None:
        self.rows.extend(result.rows)
        for name, value in result.counts.items():
            self.counts[name] = self.counts.get(name, 0) + value
        self.timer = earliest(self.timer, result.next_timer_ms)

    def result(self, ts_ns: int) -> BucketResult:
        stat = stat_row(self.counts, ts_ns)
        if stat is not None:
            self.rows.append(stat)
        return BucketResult(self.rows, self.timer)


def monitor_bucket(
    config: ChecksSettings,
    store: BucketStore,
    bundles: list[Bundle],
    watermark_ms: int,
    armed_ms: int | None,
) -> BucketResult:
    """One bucket's bundles of a micro-batch: each connection entry fed at once, each entity entry
    stepped with the batch clock's watermark; then, when that watermark passed the bucket's armed
    timer, every entry due by it (what the timer would have done a batch later).

    ``armed_ms`` is the bucket's timer as armed now; it stays when it is earlier than every new one (a
    busy bucket does not move its timer every batch)."""
    watermark = batch_watermark(config, watermark_ms, bundles)
    call = _Call(armed_ms)
    conns: dict[str, list[list[Any]]] = {}
    routes: dict[str, list[Sequence[Any]]] = {}
    for bundle in bundles:
        for key, packed in bundle.conns.items():
            conns.setdefault(key, []).append(packed)
        for key, entries in bundle.routes.items():
            routes.setdefault(key, []).extend(entries)
    for key, packed in conns.items():
        call.add(_connection_entry(config, store, key, packed, watermark_ms))
    # Arrivals first: a key's waiting routes and its new ones are released together, in order.
    for key, arrived in routes.items():
        call.add(_keyed_entry(config, store, key, store.get(key), arrived, watermark))
    if watermark > watermark_ms and armed_ms is not None and armed_ms <= watermark:
        call.timer = None
        _sweep(config, store, watermark, call)
    return call.result(max(watermark, 0) * NS_PER_MS)


def monitor_bucket_expired(config: ChecksSettings, store: BucketStore, watermark_ms: int) -> BucketResult:
    """The bucket's timer fired: step every entry whose next call is due, re-arm for the rest."""
    call = _Call(None)
    _sweep(config, store, watermark_ms, call)
    return call.result(max(watermark_ms, 0) * NS_PER_MS)


def _sweep(config: ChecksSettings, store: BucketStore, watermark_ms: int, call: _Call) -> None:
    ready, later = store.due(watermark_ms)
    call.timer = earliest(call.timer, later)
    for key, saved in ready:
        if is_conn_key(key):
            # Idle past its TTL (counted, never silent).
            store.remove(key)
            call.add(StepResult(counts={"evicted_keys": 1}))
        else:
            call.add(_keyed_entry(config, store, key, saved, [], watermark_ms))


class LocalStages:
    """The router and the stateful stage in one process, called the way Spark calls the job: per
    micro-batch, ``route_rows`` over each source batch (``partitions`` of them, split by connection as
    the tap topic's partitions split them), then each bucket with input once, then each bucket whose
    timer the watermark passed. For tests and benchmarks; the job runs the same steps through
    ``streaming.bundles`` and ``streaming.processors``. ``store`` makes each bucket's store: a dict by
    default, or the job's pages over a ``streaming.pages.DictPageBackend``."""

    def __init__(
        self,
        config: ChecksSettings,
        buckets: int,
        store: Callable[[], BucketStore] = DictBucketStore,
        partitions: int = 1,
    ) -> None:
        self.config = config
        self.stores = [store() for _ in range(buckets)]
        self.timers: list[int | None] = [None] * buckets
        self.partitions = partitions
        #: Python calls made so far (what Spark pays a pandas round trip for).
        self.calls = 0

    def batch(self, rows: list[dict[str, Any]], watermark_ms: int) -> list[OutputRow]:
        """Tap-record rows (``streaming.frames.frame_row``, plus ``EVENT_TIME_MS`` where known) in, what
        ``foreachBatch`` sees out."""
        buckets = len(self.stores)
        per_partition: list[list[dict[str, Any]]] = [[] for _ in range(self.partitions)]
        for row in rows:
            per_partition[bucket_index(str(row.get("conn")), self.partitions)].append(row)
        by_bucket: dict[int, list[Bundle]] = {}
        out: list[OutputRow] = []
        for part in per_partition:
            routed = route_rows(self.config, part, buckets)
            out.extend(routed.passed)
            for b, bundle in routed.bundles.items():
                by_bucket.setdefault(b, []).append(bundle)
        return out + self.stage(by_bucket, watermark_ms)

    def stage(self, by_bucket: dict[int, list[Bundle]], watermark_ms: int) -> list[OutputRow]:
        """The stateful stage alone: each bucket's bundles of a micro-batch in, its rows out."""
        out: list[OutputRow] = []
        for b, bundles in by_bucket.items():
            out.extend(self._call(b, partial(self._input, bundles, watermark_ms, self.timers[b])))
        # A timer armed at or before the watermark by this batch's calls fires in the next batch.
        for b, armed in enumerate(self.timers):
            if armed is not None and armed <= watermark_ms:
                out.extend(self._call(b, partial(self._expired, watermark_ms)))
        return out

    def _expired(self, watermark_ms: int, store: BucketStore) -> BucketResult:
        return monitor_bucket_expired(self.config, store, watermark_ms)

    def _input(
        self, bundles: list[Bundle], watermark_ms: int, armed: int | None, store: BucketStore
    ) -> BucketResult:
        return monitor_bucket(self.config, store, bundles, watermark_ms, armed)

    def _call(self, bucket: int, step: Callable[[BucketStore], BucketResult]) -> list[OutputRow]:
        self.calls += 1
        store = self.stores[bucket]
        store.begin()
        result = step(store)
        store.finish()
        self.timers[bucket] = result.timer_ms
        return result.rows
