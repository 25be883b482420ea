"""A tap running on its own event loop in a background thread, for tests that drive blocking clients;
the tapped cluster those tests run against; and readers of the tap topic."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from codec.taprecord import TAP_EVENTS, is_packed, parse_records
from tap.metrics import TapMetrics
from tap.mirror import KafkaMirror, MirrorSink
from tap.proxy import ListenerSpec, Tap, TapSettings
from tests.tap.helpers import metric_sum


class TapThread:
    def __init__(self, listeners: list[ListenerSpec], sink: MirrorSink, settings: TapSettings) -> None:
        self.tap = Tap(listeners, sink, settings, TapMetrics())
        self.loop = asyncio.new_event_loop()
        self.bound: list[tuple[str, int]] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tap-under-test", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.bound = self.loop.run_until_complete(self.tap.start())
        self._ready.set()
        self.loop.run_forever()

    def start(self) -> TapThread:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("tap did not start")
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.tap.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.tap.sink.close()

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        return metric_sum(self.tap.metrics.registry, name, labels)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until every tapped connection is closed (clients closed theirs)."""
        deadline = time.monotonic() + timeout
        while self.tap.connections and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait_mirrored(self, timeout: float = 30.0) -> None:
        """Wait until every tapped connection is closed and the sink delivered every record it took.

        Unlike closing the sink, the tap keeps running: several scenarios can share one tap and topic.
        """
        deadline = time.monotonic() + timeout
        self.wait_idle(timeout)
        while self.tap.sink.depth() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.tap.connections or self.tap.sink.depth():
            still_open = sorted(
                f"{c.conn_id} ({c.client_name.decode(errors='replace')})"
                for c in self.tap.connections.values()
            )
            raise TimeoutError(
                f"tap not drained after {timeout}s: connection(s) still open: {still_open}; "
                f"{self.tap.sink.depth()} record(s) not delivered"
            )


# ----- the tapped cluster (fixture ``tapped_cluster`` in tests/conftest.py) -----------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepts(host: str, port: int) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted (a listener bound to 127.0.0.1 refuses
    127.0.0.2, one bound to 0.0.0.0 takes both: how the tests tell a loopback bind on any Linux box)."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


@dataclass
class TappedCluster:
    #: What clients bootstrap from: the tap.
    bootstrap: str
    broker: tuple[str, int]
    broker_id: int
    tap_addr: tuple[str, int]
    #: Cluster holding the tap topic (reached directly, not through the tap).
    mirror_bootstrap: str

    def start_tap(
        self, topic: str | None = None, capture: str = "full", **kw: object
    ) -> tuple[TapThread, str]:
        topic = topic or f"kpmon.tap.{uuid.uuid4().hex[:8]}"
        sink = KafkaMirror(
            self.mirror_bootstrap,
            topic,
            max_frames=int(kw.pop("max_frames", 100_000)),  # type: ignore[call-overload]
            max_bytes=int(kw.pop("max_bytes", 64 << 20)),  # type: ignore[call-overload]
            properties={"linger.ms": "5"},
        )
        spec = ListenerSpec(*self.tap_addr, *self.broker, self.broker_id)
        settings = TapSettings(capture=capture, **kw)  # type: ignore[arg-type]
        return TapThread([spec], sink, settings).start(), topic


def start_stack(stack: Any) -> None:
    """``up()``, tolerating a false "node exited during start-up".

    Under load, LocalStack's liveness check can read /proc/<pid>/cmdline between fork and exec (no
    marker yet) and report a live JVM as dead. If the node is in fact running a moment later, wait
    for it instead of failing; otherwise tear down and try once more.
    """
    try:
        stack.up()
        return
    except Exception:
        time.sleep(2)
        if stack.is_running():
            stack._wait_ready(90)
            return
    stack.down()
    stack.up()


# ----- reading the tap topic ---------------------------------------------------------------------------


@dataclass
class TapRecord:
    key: bytes
    value: bytes
    headers: dict[str, bytes]
    partition: int
    offset: int


def read_topic(
    bootstrap: str, topic: str, idle: float = 3.0, properties: dict[str, Any] | None = None
) -> list[TapRecord]:
    """Every record of ``topic`` from the beginning, stopping after ``idle`` quiet seconds."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"tap-test-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **(properties or {}),
        }
    )
    consumer.subscribe([topic])
    out: list[TapRecord] = []
    last = time.monotonic()
    try:
        while time.monotonic() - last < idle:
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            last = time.monotonic()
            out.append(_record(msg))
    finally:
        consumer.close()
    return out


def _record(msg: Any) -> TapRecord:
    return TapRecord(
        msg.key() or b"", msg.value() or b"", dict(msg.headers() or []), msg.partition(), msg.offset()
    )


def topic_end_offsets(
    bootstrap: str, topic: str, timeout: float = 10.0, properties: dict[str, Any] | None = None
) -> dict[int, int]:
    """Each partition's high watermark; {} when the topic does not exist (yet)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {**(properties or {}), "bootstrap.servers": bootstrap, "group.id": "kpmon-test-offsets"}
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1])
            for p in meta.partitions
        }
    finally:
        consumer.close()


def read_topic_range(
    bootstrap: str,
    topic: str,
    since: dict[int, int] | None = None,
    timeout: float = 30.0,
    properties: dict[str, Any] | None = None,
) -> list[TapRecord]:
    """The records of ``topic`` between ``since`` (default: the beginning) and the current end.

    Reads by partition assignment up to each high watermark: no consumer group, no idle wait. Take
    ``since`` from ``topic_end_offsets`` before a scenario and call this after ``wait_mirrored`` to
    get exactly that scenario's records.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    end = topic_end_offsets(bootstrap, topic, timeout, properties)
    start = {p: (since or {}).get(p, 0) for p in end}
    todo = {p for p in end if end[p] > start[p]}
    if not todo:
        return []
    consumer = Consumer(
        {
            **(properties or {}),
            "bootstrap.servers": bootstrap,
            "group.id": "kpmon-test-reader",
            "enable.auto.commit": False,
        }
    )
    out: list[TapRecord] = []
    try:
        consumer.assign(
            [TopicPartition(topic, p, start[p] if start[p] > 0 else OFFSET_BEGINNING) for p in sorted(todo)]
        )
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(todo)} not read up to {end} in {timeout}s")
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            p, offset = int(msg.partition() or 0), int(msg.offset() or 0)
            if offset < end[p]:
                out.append(_record(msg))
            if offset >= end[p] - 1:
                todo.discard(p)
    finally:
        consumer.close()
    return out


def secret_count(records: list[TapRecord], secret: bytes) -> int:
    """Occurrences of ``secret`` in every byte of the records: keys, values, header names and values."""
    total = 0
    for r in records:
        total += r.key.count(secret) + r.value.count(secret)
        total += sum(k.encode().count(secret) + v.count(secret) for k, v in r.headers.items())
    return total


def by_connection(records: list[TapRecord]) -> Iterator[tuple[bytes, list[TapRecord]]]:
    """Each connection's records, in order; the tap's own events (its start, a worker's death) are
    about no connection and are left out."""
    conns: dict[bytes, list[TapRecord]] = {}
    for r in records:
        if is_packed(r.value) and not r.headers and parse_records(None, r.value)[0].kind in TAP_EVENTS:
            continue
        conns.setdefault(r.key, []).append(r)
    yield from conns.items()
