"""Regenerate ``tests/data/tap_frames.jsonl``: real frames captured by the tap from real clients.

Usage: ``python -m tests.tap.make_corpus BROKER_HOST:PORT TAP_HOST:PORT DIRECT_BOOTSTRAP`` against a
broker that advertises TAP_HOST:PORT (see tests/tap/conftest.py). Each line is one frame:
``{"dir", "api_key", "api_version", "corr_id", "source", "hex"}`` (hex without the size prefix).
Kept small: at most a few frames per (source, direction, api, version), each at most 16 KiB.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tap.mirror import MemoryMirror
from tap.proxy import ListenerSpec, TapSettings, parse_hostport
from tests.tap.harness import TapThread

OUT = Path(__file__).resolve().parents[1] / "data" / "tap_frames.jsonl"
PER_KIND = 3
MAX_FRAME = 16 * 1024


def _workload(bootstrap: str) -> None:
    topic = f"corpus-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        fut.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": "gzip"})
    for i in range(200):
        p.produce(topic, f"v{i}".encode(), f"k{i}".encode(), headers=[("h", b"1")])
    p.flush(30)
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"corpus-{topic}"})
    tx.init_transactions(30)
    tx.begin_transaction()
    tx.produce(topic, b"committed")
    tx.commit_transaction(30)
    tx.begin_transaction()
    tx.produce(topic, b"aborted")
    tx.abort_transaction(30)

    def member() -> None:
        c = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"}
        )
        c.subscribe([topic])
        end = time.monotonic() + 8
        while time.monotonic() < end:
            c.poll(0.2)
        c.close()

    threads = [threading.Thread(target=member) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    import kafka

    kp = kafka.KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(20):
        kp.send(topic, f"kp{i}".encode())
    kp.flush()
    kp.close()
    kc = kafka.KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    list(kc)
    kc.close()


def main(argv: list[str]) -> int:
    broker, tap_addr, _direct = argv
    sink = MemoryMirror()
    tap = TapThread(
        [ListenerSpec(*parse_hostport(tap_addr), *parse_hostport(broker), 1)],
        sink,
        TapSettings(capture="full"),
    )
    tap.start()
    try:
        _workload(tap_addr)
        tap.wait_idle()
    finally:
        tap.stop()
    clients: dict[bytes, str] = {}
    kinds: dict[tuple[str, str, str, str], int] = {}
    lines = []
    import codec
    from codec.taprecord import parse_records

    for record in sink.records:
        for part in (part for entry in parse_records(None, record.value) for part in entry.parts):
            value = part.value or b""
            direction = part.direction
            if direction not in ("req", "resp") or len(value) > MAX_FRAME or part.api_key is None:
                continue
            if direction == "req":
                clients[record.key] = codec.decode_request(value).client_id or ""
            source = clients.get(record.key, "")
            kind = (source.split("-")[0], direction, str(part.api_key), str(part.api_version))
            if kinds.get(kind, 0) >= PER_KIND:
                continue
            kinds[kind] = kinds.get(kind, 0) + 1
            lines.append(
                json.dumps(
                    {
                        "dir": direction,
                        "api_key": part.api_key,
                        "api_version": part.api_version,
                        "corr_id": part.correlation_id,
                        "source": source,
                        "hex": value.hex(),
                    }
                )
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} frames, {OUT.stat().st_size} bytes -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
