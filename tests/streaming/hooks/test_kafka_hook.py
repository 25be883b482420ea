"""The alerts-topic hook against a real broker: records read back with a consumer."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Message

from deploy.local.stack import LocalStack
from streaming.hooks import AlertHooks
from streaming.hooks.formatters import alert_payload
from tests.streaming.hooks.builders import CLUSTER, alert
from tests.streaming.hooks.conftest import hooks_config

pytestmark = pytest.mark.integration


def test_alerts_topic_round_trip(
    kafka_stack: LocalStack, make_hooks: Callable[..., AlertHooks], caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"kpmon.alerts.test-{uuid.uuid4().hex[:8]}"
    config = hooks_config(
        {"kind": "kafka", "topic": topic, "timeout_seconds": 10.0},
        tap={"cluster": {"bootstrap_servers": kafka_stack.bootstrap_servers}},
    )
    hooks = make_hooks(config)
    published = [
        alert("k1", severity="critical"),
        alert("k2"),
        alert("k1", status="resolved", severity="critical"),
    ]
    with caplog.at_level(logging.INFO, logger="kpmon.alerts.hooks"):
        hooks.publish(published)
        assert hooks.flush(30.0), hooks.stats()
    assert any(f"alerts topic {topic} created" in r.getMessage() for r in caplog.records)
    assert hooks.stats()["kafka"]["delivered"] == 3

    consumer = Consumer(
        kafka_stack.client_config()
        | {"group.id": topic, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([topic])
    records: list[Message] = []
    try:
        while len(records) < 3:
            message = consumer.poll(10.0)
            assert message is not None, f"only {len(records)} alert records arrived"
            assert message.error() is None, message.error()
            records.append(message)
    finally:
        consumer.close()
    assert [m.key() for m in records] == [b"k1", b"k2", b"k1"]
    assert [json.loads(m.value() or b"null") for m in records] == [alert_payload(a) for a in published]
    assert dict(records[2].headers() or []) == {
        "rule": b"group.join.protocol_type_null",
        "severity": b"critical",
        "status": b"resolved",
        "cluster": CLUSTER.encode(),
    }
