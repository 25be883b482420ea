"""A clean workload of real clients: what a healthy application does, and what must raise no alert.

One round runs an idempotent producer, a transactional producer that commits and one that aborts, a
two-member confluent-kafka consumer group, and a kafka-python producer and consumer.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """Create ``topic`` unless it exists."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "kpmon-admin"})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for future in futures.values():
        # ``exception()`` rather than ``result()``: a raised error's traceback would hold this frame,
        # and through it the AdminClient, in a cycle, keeping its broker connection open until the
        # garbage collector runs (a tapped scenario then never sees its connections close).
        error = future.exception(30)
        if error is not None and "TOPIC_ALREADY_EXISTS" not in str(error):
            raise RuntimeError(f"cannot create topic {topic}: {error}")


def idempotent_produce(bootstrap: str, topic: str, count: int = 50) -> int:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "client.id": "kpmon-idem",
            "linger.ms": 5,
        }
    )
    delivered = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1

    for i in range(count):
        producer.produce(topic, key=str(i % 7).encode(), value=b"x" * 200, on_delivery=on_delivery)
    producer.flush(30)
    return delivered


def transactional_produce(bootstrap: str, topic: str, commit: bool, count: int = 20) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"kpmon-clean-{uuid.uuid4().hex[:8]}",
            "client.id": "kpmon-txn",
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=b"t" * 100)
    # Written before the outcome is decided: librdkafka purges unsent messages on abort, and a
    # transaction that never added a partition ends without any EndTxn, so nothing would be aborted.
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)
    producer.flush(30)


def consumer_group(bootstrap: str, topic: str, group: str, seconds: float = 8.0) -> int:
    """Two confluent-kafka members of one group consume ``topic`` for ``seconds``."""
    from confluent_kafka import Consumer

    consumed = 0
    lock = threading.Lock()

    def member(index: int) -> None:
        nonlocal consumed
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": f"kpmon-member-{index}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
        consumer.subscribe([topic])
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    with lock:
                        consumed += 1
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    return consumed


def kafka_python_round_trip(bootstrap: str, topic: str, count: int = 20) -> int:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="kpmon-kafka-python")
    for i in range(count):
        producer.send(topic, key=str(i).encode(), value=b"k" * 100)
    producer.flush(30)
    producer.close(10)
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        client_id="kpmon-kafka-python-consumer",
        group_id=f"kpmon-kp-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    try:
        return sum(1 for _ in consumer)
    finally:
        consumer.close()


def clean_round(bootstrap: str, topic: str = "kpmon-demo", group: str = "kpmon-demo-group") -> dict[str, Any]:
    """One round of the clean workload; returns what each client did."""
    create_topic(bootstrap, topic, partitions=3)
    out: dict[str, Any] = {"idempotent_delivered": idempotent_produce(bootstrap, topic)}
    transactional_produce(bootstrap, topic, commit=True)
    transactional_produce(bootstrap, topic, commit=False)
    out["group_consumed"] = consumer_group(bootstrap, topic, group)
    out["kafka_python_consumed"] = kafka_python_round_trip(bootstrap, topic)
    return out
