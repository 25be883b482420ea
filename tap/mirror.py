"""Mirror sinks: where tap records go. Offering a record never blocks; a full sink drops it.

``KafkaMirror`` uses confluent-kafka's own bounded queue (``queue.buffering.max.messages`` and
``queue.buffering.max.kbytes`` bound frames and bytes); ``produce`` raises BufferError instead of
waiting, which is exactly the drop-and-count the tap needs. A daemon thread polls for delivery
reports so the event loop never does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class MirrorRecord:
    """A tap record as produced: the connection id and the value ``codec.taprecord.pack_record`` made
    (schema 2 has no Kafka headers)."""

    key: bytes
    value: bytes


class MirrorSink(Protocol):
    def offer(self, record: MirrorRecord) -> bool:
        """Queue ``record``; False (dropped) when the queue is full. Never blocks."""
        ...

    def depth(self) -> int: ...

    def capacity(self) -> int:
        """Records the queue holds before ``offer`` drops (0: it never queues)."""
        ...

    def close(self, timeout: float = 5.0) -> None: ...

    def watch_failures(self, lost: Callable[[bytes | None, bytes | None], None]) -> None:
        """Call ``lost(key)`` for each record ``offer`` accepted and the sink then failed to deliver,
        on whatever thread the sink learns it on."""
        ...


class MemoryMirror:
    """An in-process sink for tests and ``--no-mirror`` runs, bounded like the real one."""

    def __init__(self, max_frames: int = 1 << 30, max_bytes: int = 1 << 62) -> None:
        self.records: list[MirrorRecord] = []
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._bytes = 0

    def offer(self, record: MirrorRecord) -> bool:
        size = len(record.value)
        if len(self.records) >= self.max_frames or self._bytes + size > self.max_bytes:
            return False
        self.records.append(record)
        self._bytes += size
        return True

    def take(self) -> list[MirrorRecord]:
        """The records queued so far, leaving the queue empty (as delivery empties a real one)."""
        taken, self.records, self._bytes = self.records, [], 0
        return taken

    def depth(self) -> int:
        return len(self.records)

    def capacity(self) -> int:
        return self.max_frames

    def close(self, timeout: float = 5.0) -> None:
        return None

    def watch_failures(self, lost: Callable[[bytes | None, bytes | None], None]) -> None:
        # What it accepts it keeps.
        return None


class NullMirror:
    def offer(self, record: MirrorRecord) -> bool:
        return True

    def depth(self) -> int:
        return 0

    def capacity(self) -> int:
        return 0

    def close(self, timeout: float = 5.0) -> None:
        return None

    def watch_failures(self, lost: Callable[[bytes | None, bytes | None], None]) -> None:
        return None


class KafkaMirror:
    """Produces tap records to ``topic`` with an idempotent producer (per-key order survives retries)."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        max_frames: int,
        max_bytes: int,
        properties: dict[str, str] | None = None,
        on_error: Callable[[str], None] | None = None,
        message_timeout_ms: int = 30_000,
    ) -> None:
        from confluent_kafka import Producer

        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            # A record holds a connection's flush (up to 256 KiB, tap.flush_max_bytes), gathered for
            # up to tap.flush_max_age_ms already: a short linger still fills batches across connections.
            "linger.ms": 10,
            # Only failures need Python: a successful delivery reports nothing.
            "delivery.report.only.error": True,
            "compression.type": "lz4",
            "queue.buffering.max.messages": max(1, max_frames),
            "queue.buffering.max.kbytes": max(1, max_bytes // 1024),
            "message.timeout.ms": message_timeout_ms,
            "message.max.bytes": 1_000_000 + 100_000,
            "client.id": "kpmon-tap",
            # librdkafka's own log lines go through Python logging (JSON), not raw to stderr.
            "logger": logging.getLogger("kpmon.tap.producer"),
        }
        conf.update(properties or {})
        self.topic = topic
        self.max_frames = max(1, int(conf["queue.buffering.max.messages"]))
        self._on_error = on_error
        self._lost: Callable[[bytes | None, bytes | None], None] | None = None
        self._producer = Producer(conf)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kpmon-tap-mirror", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.1)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            return
        if self._on_error is not None:
            self._on_error(str(err.name() if hasattr(err, "name") else err))
        if self._lost is not None:
            self._lost(msg.key(), msg.value())

    def watch_failures(self, lost: Callable[[bytes | None, bytes | None], None]) -> None:
        self._lost = lost

    def offer(self, record: MirrorRecord) -> bool:
        try:
            self._producer.produce(self.topic, record.value, record.key, on_delivery=self._delivered)
        except BufferError:
            return False
        return True

    def depth(self) -> int:
        return len(self._producer)

    def capacity(self) -> int:
        return self.max_frames

    def close(self, timeout: float = 5.0) -> None:
        self._producer.flush(timeout)
        self._stop.set()
        self._thread.join(timeout)
