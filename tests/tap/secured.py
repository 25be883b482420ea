"""Helpers for the tests on secured clusters (tests/tap/test_secured_legs.py, tests/tap/test_mtls.py)."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient


def roundtrip(config: dict[str, Any], topic: str, value: bytes) -> None:
    producer = Producer(config)
    producer.produce(topic, value)
    assert producer.flush(30) == 0
    consumer = Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    got: list[bytes] = []
    while value not in got and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value() or b"")
    consumer.close()
    assert value in got


def kafka_python_roundtrip(common: dict[str, Any], topic: str, value: bytes) -> None:
    """kafka-python (its own protocol code and Python's ``ssl``) with ``common`` connection settings:
    produce ``value`` and read it back."""
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(**common)
    producer.send(topic, value).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=15000, **common)
    try:
        assert value in [record.value for record in consumer]
    finally:
        consumer.close()


def java_properties_file(path: Path, props: dict[str, str]) -> Path:
    """A Java ``.properties`` file (values escaped: inline PEM holds newlines)."""

    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")

    path.write_text("".join(f"{k}={escape(v)}\n" for k, v in props.items()))
    path.chmod(0o600)
    return path


def refused(config: dict[str, Any]) -> str:
    """The client's error for a connection the other side (or the client itself) refuses."""
    errors: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            errors.append(record.getMessage())

    logger = logging.getLogger(f"kpmon.test.refused.{uuid.uuid4().hex[:6]}")
    logger.addHandler(Collect())
    logger.propagate = False
    settings: dict[str, Any] = {
        **config,
        "error_cb": lambda e: errors.append(e.str()),
        "logger": logger,
        "socket.timeout.ms": 6000,
    }
    admin = AdminClient(settings)
    try:
        admin.list_topics(timeout=6)
    except KafkaException as exc:
        errors.append(exc.args[0].str())
    else:
        raise AssertionError("the connection was accepted")
    admin.poll(1)  # serves error_cb and the log callback
    return " | ".join(dict.fromkeys(errors))


def spark_stream_reads(direct: dict[str, Any], directory: Path) -> tuple[dict[str, str], list[Any]]:
    """Writes three records to a fresh topic with librdkafka ``direct`` properties, then reads them with
    the job's own stream (``streaming.job.frame_rows``: ``readStream`` with ``source_options``, then the
    header parsing) over a tap cluster with the same properties, run once (``availableNow``) into a
    memory table. Returns the source options (the Java translation) and the rows."""
    from kpconfig.model import KpmonConfig
    from streaming.job import frame_rows, source_options
    from streaming.session import build_session

    topic = f"kpmon.tap.spark.{uuid.uuid4().hex[:6]}"
    producer = Producer(direct)
    for i in range(3):
        producer.produce(topic, f"frame-{i}".encode(), key=b"conn-1", headers=[("dir", b"req")])
    assert producer.flush(30) == 0
    config = KpmonConfig.model_validate(
        {
            "state_dir": str(directory / "state"),
            "tap": {
                "topic": topic,
                "cluster": {
                    "bootstrap_servers": direct["bootstrap.servers"],
                    "properties": {k: str(v) for k, v in direct.items() if k != "bootstrap.servers"},
                },
            },
            "stream": {"master": "local[1]", "metrics_port": None},
        }
    )
    spark = build_session(config, "kpmon-secured-source")
    try:
        query = (
            frame_rows(spark, config)
            .writeStream.format("memory")
            .queryName("secured_source")
            .option("checkpointLocation", str(directory / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        rows = spark.table("secured_source").collect()
    finally:
        spark.stop()
    return source_options(config), rows
