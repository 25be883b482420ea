"""A window of the tap topic (the last N minutes, or explicit offsets), read in event-time order.

The checks accept frames out of order only within their watermark, so partitions are merged by the
time each record was written (``TimeMerge``, ``codec.taprecord.record_time_ns``) instead of being read one after the other; a partition far ahead is
paused while the others catch up, which bounds memory.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from codec.taprecord import record_time_ns
from kpconfig.model import KafkaClusterConfig

#: Records buffered per partition before that partition is paused.
MAX_BUFFERED = 5_000


class TapWindowError(RuntimeError):
    """The tap topic could not be read (missing topic, broker unreachable, timeout)."""


@dataclass(frozen=True)
class TapRecord:
    headers: dict[str, str]
    value: bytes | None
    partition: int
    offset: int
    timestamp_ms: int

    @cached_property
    def ts_ns(self) -> int:
        ts_ns = record_time_ns(self.headers, self.value)
        if ts_ns is None:
            # Not a tap record: it sorts by when Kafka stored it, and the checks report it as undecodable.
            return self.timestamp_ms * 1_000_000
        return ts_ns


@dataclass
class Window:
    """Offsets ``[start, end)`` per partition of ``topic``; ``since_ms`` when it was chosen by time."""

    topic: str
    start: dict[int, int]
    end: dict[int, int]
    since_ms: int | None = None

    def contains(self, partition: int, offset: int) -> bool:
        return self.start.get(partition, 0) <= offset < self.end.get(partition, -1)

    @property
    def size(self) -> int:
        return sum(max(self.end.get(p, 0) - s, 0) for p, s in self.start.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "start": {str(p): o for p, o in sorted(self.start.items())},
            "end": {str(p): o for p, o in sorted(self.end.items())},
            "since_ms": self.since_ms,
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Window:
        return Window(
            topic=str(data["topic"]),
            start={int(p): int(o) for p, o in data["start"].items()},
            end={int(p): int(o) for p, o in data["end"].items()},
            since_ms=data.get("since_ms"),
        )


@dataclass
class TimeMerge:
    """Merge per-partition record streams (each in offset order) into one stream ordered by ``ts_ns``.

    A record is released only when every partition still open has a record buffered (or is done), so
    no later-arriving record of another partition can be older. Pure: no consumer in here.
    """

    open_partitions: set[int]
    queues: dict[int, deque[TapRecord]] = field(default_factory=dict)

    def push(self, record: TapRecord) -> None:
        self.queues.setdefault(record.partition, deque()).append(record)

    def done(self, partition: int) -> None:
        self.open_partitions.discard(partition)

    def buffered(self, partition: int) -> int:
        return len(self.queues.get(partition, ()))

    def pop_ready(self) -> Iterator[TapRecord]:
        while True:
            if any(not self.queues.get(p) for p in self.open_partitions):
                return
            heads = [(q[0].ts_ns, p, q[0].offset) for p, q in self.queues.items() if q]
            if not heads:
                return
            _, partition, _ = min(heads)
            yield self.queues[partition].popleft()

    def drain(self) -> Iterator[TapRecord]:
        """Everything left, in order (all partitions done)."""
        heap = [(r.ts_ns, r.partition, r.offset, r) for q in self.queues.values() for r in q]
        heapq.heapify(heap)
        self.queues.clear()
        while heap:
            yield heapq.heappop(heap)[-1]


def merge_in_time(records: Iterable[TapRecord], partitions: Iterable[int]) -> list[TapRecord]:
    """``TimeMerge`` over an already-read list (tests, small windows)."""
    merge = TimeMerge(set(partitions))
    out: list[TapRecord] = []
    for record in records:
        merge.push(record)
        out.extend(merge.pop_ready())
    for p in list(merge.open_partitions):
        merge.done(p)
    out.extend(merge.drain())
    return out


def _consumer(cluster: KafkaClusterConfig, purpose: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            # A throwaway group that never commits: reading must not disturb the streaming job.
            "group.id": f"kpmon-{purpose}-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            **cluster.properties,
        }
    )


def choose_window(
    cluster: KafkaClusterConfig,
    topic: str,
    minutes: float,
    end: Mapping[int, int] | None = None,
    now_ms: int | None = None,
    timeout: float = 30.0,
) -> Window:
    """The last ``minutes`` of ``topic`` by record timestamp, up to ``end`` (default: the topic's end)."""
    from confluent_kafka import KafkaException, TopicPartition

    consumer = _consumer(cluster, "window")
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise TapWindowError(f"cannot reach {cluster.bootstrap_servers}: {exc}") from exc
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            raise TapWindowError(f"tap topic {topic!r} not found on {cluster.bootstrap_servers}")
        since = (now_ms if now_ms is not None else int(time.time() * 1000)) - int(minutes * 60_000)
        parts = sorted(info.partitions)
        highs = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in parts
        }
        found = consumer.offsets_for_times([TopicPartition(topic, p, since) for p in parts], timeout=timeout)
        start = {tp.partition: (tp.offset if tp.offset >= 0 else highs[tp.partition]) for tp in found}
        stop = {p: min(int(end[p]), highs[p]) if end and p in end else highs[p] for p in parts}
        return Window(topic, start, {p: max(stop[p], start[p]) for p in parts}, since)
    finally:
        consumer.close()


def read_window(cluster: KafkaClusterConfig, window: Window, timeout: float = 300.0) -> Iterator[TapRecord]:
    """Every record of ``window``, merged by ``ts_ns`` across partitions."""
    from confluent_kafka import KafkaError, TopicPartition

    from codec.taprecord import headers_dict

    wanted = {p for p in window.start if window.end.get(p, 0) > window.start[p]}
    if not wanted:
        return
    consumer = _consumer(cluster, "replay")
    merge = TimeMerge(set(wanted))
    paused: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(window.topic, p, window.start[p]) for p in sorted(wanted)])
        while merge.open_partitions:
            if time.monotonic() > deadline:
                raise TapWindowError(f"reading {window.size} records took more than {timeout:.0f} s")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            partition = int(msg.partition() or 0)
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    merge.done(partition)
                    continue
                raise TapWindowError(f"consumer error: {error}")
            offset = int(msg.offset() or 0)
            if partition not in merge.open_partitions:
                continue
            if offset >= window.end[partition]:
                # Past the window (a control record can make the last offset invisible).
                merge.done(partition)
                continue
            merge.push(
                TapRecord(
                    headers_dict(msg.headers() or []),
                    msg.value(),
                    partition,
                    offset,
                    int(msg.timestamp()[1]),
                )
            )
            if offset >= window.end[partition] - 1:
                merge.done(partition)
                consumer.pause([TopicPartition(window.topic, partition)])
            yield from merge.pop_ready()
            full = {p for p in merge.open_partitions if merge.buffered(p) >= MAX_BUFFERED} - paused
            if full:
                consumer.pause([TopicPartition(window.topic, p) for p in full])
                paused |= full
            ready = {p for p in paused if merge.buffered(p) < MAX_BUFFERED // 2}
            if ready:
                consumer.resume([TopicPartition(window.topic, p) for p in ready])
                paused -= ready
        yield from merge.drain()
    finally:
        consumer.close()
