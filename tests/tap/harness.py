"""A tap running on its own event loop in a background thread, for tests that drive blocking clients."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tap.metrics import TapMetrics
from tap.mirror import MirrorSink
from tap.proxy import ListenerSpec, Tap, TapSettings


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
        return self.tap.metrics.registry.get_sample_value(name, labels or {}) or 0.0

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until every tapped connection is closed (clients closed theirs)."""
        deadline = time.monotonic() + timeout
        while self.tap.connections and time.monotonic() < deadline:
            time.sleep(0.05)


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
            out.append(
                TapRecord(
                    msg.key() or b"",
                    msg.value() or b"",
                    dict(msg.headers() or []),
                    msg.partition(),
                    msg.offset(),
                )
            )
    finally:
        consumer.close()
    return out


def by_connection(records: list[TapRecord]) -> Iterator[tuple[bytes, list[TapRecord]]]:
    conns: dict[bytes, list[TapRecord]] = {}
    for r in records:
        conns.setdefault(r.key, []).append(r)
    yield from conns.items()
