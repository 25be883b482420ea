"""Tap records for the DAG tests: rounds of the every-rule scenario, written to a real tap topic.

Round ``k`` is ``tests.checks.test_sharding.scenario()`` on connections of its own (``r<k>-<conn>``),
shifted to ``base + k * ROUND_NS`` in event time, followed by a clean ApiVersions handshake that moves
event time (and so Spark's watermark) past the round. ``TapTraffic`` writes rounds in small chunks from
a thread, so a running job sees batches all the time, and a swap lands in the middle of rounds: the
stateful findings of a round then need the state saved in the checkpoint before the swap.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from codec.taprecord import TapFrame
from tests.checks import test_apiversions as av
from tests.checks.builders import SECOND, Conversation
from tests.checks.exchanges import exchange_records, flatten
from tests.checks.test_sharding import scenario
from tests.streaming.test_stages import schema_2_record

#: Event time between the starts of two rounds (the scenario spans 30 s).
ROUND_NS = 60 * SECOND
#: The clean handshake closing a round: after the scenario, before the next round.
TAIL_AT_NS = 45 * SECOND


def round_frames(k: int, base_ns: int) -> list[TapFrame]:
    """Round ``k``'s frames as the tap writes them (``tests.checks.exchanges``): a request and its
    answer side by side, numbered as one record."""
    shift = base_ns + k * ROUND_NS
    frames = [dataclasses.replace(f, conn=f"r{k}-{f.conn}", ts_ns=f.ts_ns + shift) for f in scenario()]
    tail = av.handshake(Conversation(conn=f"r{k}-tail"), shift + TAIL_AT_NS, av.STANDARD)
    return flatten(exchange_records(sorted([*frames, *tail], key=lambda f: (f.ts_ns, f.conn, f.seq))))


def tap_records(frames: list[TapFrame]) -> list[list[TapFrame]]:
    """Frames as ``round_frames`` lists them, grouped into their tap records (one ``seq`` each)."""
    records: list[list[TapFrame]] = []
    for frame in frames:
        last = records[-1][0] if records else None
        if last is not None and (last.conn, last.seq) == (frame.conn, frame.seq):
            records[-1].append(frame)
        else:
            records.append([frame])
    return records


def produce(bootstrap: str, topic: str, frames: list[TapFrame], producer: Any = None) -> None:
    """``frames`` (whole records, as ``round_frames`` lists them) as schema-2 tap records."""
    from confluent_kafka import Producer

    own = producer is None
    producer = producer or Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    try:
        for record in tap_records(frames):
            _headers, value, _partition, _offset = schema_2_record(record)
            producer.produce(topic, key=record[0].conn.encode(), value=value)
        if producer.flush(30) != 0:
            raise AssertionError("tap records not delivered")
    finally:
        if own:
            producer.close()


class TapTraffic:
    """Rounds written in chunks of ``chunk`` records every ``every`` seconds, from round ``first`` on."""

    def __init__(
        self, bootstrap: str, topic: str, base_ns: int, first: int = 0, chunk: int = 12, every: float = 1.0
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.base_ns = base_ns
        self.next_round = first
        self.chunk = chunk
        self.every = every
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        try:
            while not self._stop.is_set():
                records = tap_records(round_frames(self.next_round, self.base_ns))
                for i in range(0, len(records), self.chunk):
                    produce(self.bootstrap, self.topic, flatten(records[i : i + self.chunk]), producer)
                    if self._stop.wait(self.every) and i + self.chunk < len(records):
                        # Stopping mid-round: finish it, so every round ends with its clean tail.
                        produce(self.bootstrap, self.topic, flatten(records[i + self.chunk :]), producer)
                        break
                self.next_round += 1
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            producer.close()

    def start(self) -> TapTraffic:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tap-traffic", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop after the current round; returns the number of the next round."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        if self.errors:
            raise AssertionError(f"traffic thread failed: {self.errors[0]!r}")
        return self.next_round

    def __enter__(self) -> TapTraffic:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def wait_for(condition: Any, timeout: float, what: str, poll: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
