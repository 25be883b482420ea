"""The tap-topic readers on a real broker: the live report's stepwise reader and the shared poll loop."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

import codec
from codec.protocol import ApiKey
from deploy.local.stack import LocalStack
from kpmon.commands.report import TapTopicReader
from kpmon.commands.topicopts import InputError, TopicReadError, open_topic, poll_records

pytestmark = [pytest.mark.integration]


def _produce(stack: LocalStack, topic: str, corr_ids: range, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    for corr in corr_ids:
        frame = codec.encode_request(ApiKey.API_VERSIONS, 3, corr, "reader", {})
        headers: list[tuple[str, str | bytes | None]] = [("dir", b"req"), ("conn", f"c{partition}".encode())]
        producer.produce(topic, frame, key=f"c{partition}".encode(), partition=partition, headers=headers)
    assert producer.flush(30) == 0


def _topic(stack: LocalStack, partitions: int) -> str:
    """A new topic whose every partition already answers an offsets request. Right after the creation
    a busy broker can still answer NOT_LEADER_OR_FOLLOWER for a moment (seen with both cores loaded by
    the suite's two workers), and these tests read at once."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"kpmon.tap.reader.{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "kpmon-test-ready"})
    try:
        deadline = time.monotonic() + 30
        for partition in range(partitions):
            while True:
                try:
                    consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
    finally:
        consumer.close()
    return topic


def _corr_ids(reader: TapTopicReader) -> list[int]:
    return sorted(f.correlation_id or 0 for f in reader.read_to_end())


def test_the_live_reader_reads_each_step_up_to_the_end_and_carries_on(kafka_stack: LocalStack) -> None:
    topic = _topic(kafka_stack, 2)
    reader = TapTopicReader(kafka_stack.bootstrap_servers, topic)
    try:
        assert list(reader.read_to_end()) == []  # an empty topic is at its end at once
        _produce(kafka_stack, topic, range(1, 4), partition=0)
        _produce(kafka_stack, topic, range(4, 6), partition=1)
        assert _corr_ids(reader) == [1, 2, 3, 4, 5]
        _produce(kafka_stack, topic, range(6, 8), partition=1)
        assert _corr_ids(reader) == [6, 7]  # only what came since
    finally:
        reader.close()


def test_a_missing_topic_is_an_input_error_and_the_next_try_can_succeed(kafka_stack: LocalStack) -> None:
    missing = f"kpmon.tap.missing.{uuid.uuid4().hex[:6]}"
    reader = TapTopicReader(kafka_stack.bootstrap_servers, missing)
    with pytest.raises(InputError, match="not found"):
        list(reader.read_to_end(timeout=5))
    reader.close()


def test_poll_records_stops_at_max_or_when_idle(kafka_stack: LocalStack) -> None:
    topic = _topic(kafka_stack, 1)
    _produce(kafka_stack, topic, range(1, 6))
    consumer, partitions = open_topic(kafka_stack.bootstrap_servers, {}, topic, "kpmon-test")
    try:
        assert partitions == [0]
        got = list(poll_records(consumer, idle_timeout=10, max_records=3))
        assert [r.offset for r in got] == [0, 1, 2]
        assert got[0].headers["dir"] == "req" and got[0].topic == topic and got[0].value
        rest: list[Any] = list(poll_records(consumer, idle_timeout=2))
        assert [r.offset for r in rest] == [3, 4]  # then two idle seconds end it
        with pytest.raises(TopicReadError, match="no records for"):
            list(poll_records(consumer, idle_timeout=1, idle_error="no records for 1 s"))
    finally:
        consumer.close()
