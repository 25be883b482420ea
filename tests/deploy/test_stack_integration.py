"""The real stack: brokers start, serve clients and tools, authenticate, and leave nothing behind."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from deploy.local.process import is_alive
from deploy.local.stack import LocalStack
from deploy.local.tools import run_tool
from deploy.versions import KAFKA_LATEST, KAFKA_LEGACY

pytestmark = pytest.mark.integration


def _roundtrip(config: dict[str, Any]) -> None:
    """Produce one message to a fresh topic and consume it back."""
    topic = f"kpmon-test-{uuid.uuid4().hex[:8]}"
    value = uuid.uuid4().bytes
    producer = Producer(config)
    producer.produce(topic, value=value)
    assert producer.flush(30) == 0
    consumer = Consumer(config | {"group.id": topic, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is None or message.error():
                continue
            assert message.value() == value
            return
        pytest.fail(f"nothing consumed from {topic}")
    finally:
        consumer.close()


def _stack_processes(stack: LocalStack) -> list[int]:
    return [pid for pid in map(int, filter(str.isdigit, _proc_names())) if _belongs(pid, stack.home)]


def _proc_names() -> list[str]:
    return [p.name for p in Path("/proc").iterdir()]


def _belongs(pid: int, home: Path) -> bool:
    try:
        return str(home) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def test_produce_and_consume(kafka_stack: LocalStack) -> None:
    _roundtrip(kafka_stack.client_config())


def test_legacy_broker_serves(legacy_kafka_stack: LocalStack) -> None:
    assert legacy_kafka_stack.version == KAFKA_LEGACY
    _roundtrip(legacy_kafka_stack.client_config())


def test_up_twice_is_harmless_and_down_leaves_no_process(stack_home: Path) -> None:
    stack = LocalStack(stack_home)
    try:
        stack.up()
        pids = [n["pid"] for n in stack.status()["nodes"]]
        stack.up()  # a second `up`, also from a new object (as the CLI would)
        again = LocalStack(stack_home)
        again.up()
        assert [n["pid"] for n in again.status()["nodes"]] == pids
        assert again.bootstrap_servers == stack.bootstrap_servers
        assert again.status()["state"] == "running"
    finally:
        stack.down()
    assert _stack_processes(stack) == []
    assert stack.status()["state"] == "stopped"


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_authenticates(sasl_kafka_stack: LocalStack, mechanism: str) -> None:
    _roundtrip(sasl_kafka_stack.client_config(mechanism))


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_sasl_rejects_a_wrong_password(sasl_kafka_stack: LocalStack, mechanism: str) -> None:
    errors: list[KafkaError] = []
    config = sasl_kafka_stack.client_config(mechanism) | {"sasl.password": "wrong", "error_cb": errors.append}
    admin = AdminClient(config)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)  # error_cb is served from poll()
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def test_kafka_topics_through_run_tool(kafka_stack: LocalStack) -> None:
    topic = f"kpmon-tool-{uuid.uuid4().hex[:8]}"
    server = ["--bootstrap-server", kafka_stack.bootstrap_servers]
    run_tool(KAFKA_LATEST, "kafka-topics", [*server, "--create", "--topic", topic], timeout=60, check=True)
    listed = run_tool(KAFKA_LATEST, "kafka-topics", [*server, "--list"], timeout=60, check=True)
    assert topic in listed.stdout.split()


def test_console_tools_on_the_legacy_release(legacy_kafka_stack: LocalStack) -> None:
    # 3.9 keeps ConsoleProducer in the Scala core: this proves the per-release class table.
    topic = f"kpmon-console-{uuid.uuid4().hex[:8]}"
    server = ["--bootstrap-server", legacy_kafka_stack.bootstrap_servers, "--topic", topic]
    run_tool(KAFKA_LEGACY, "kafka-console-producer", server, timeout=60, input="hello\n", check=True)
    consumed = run_tool(
        KAFKA_LEGACY,
        "kafka-console-consumer",
        [*server, "--from-beginning", "--max-messages", "1", "--timeout-ms", "20000"],
        timeout=60,
    )
    assert consumed.stdout.strip() == "hello"


@pytest.mark.slow
def test_three_brokers_and_a_dying_one(stack_home: Path) -> None:
    stack = LocalStack(stack_home, brokers=3)
    try:
        stack.up()
        admin = AdminClient(stack.client_config())
        assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]
        _roundtrip(stack.client_config())
        pid = next(n["pid"] for n in stack.status()["nodes"] if n["node_id"] == 2)
        stack.kill_broker(2)
        assert not is_alive(pid)
        assert stack.status()["state"] == "degraded"
        stack.start_broker(2)
        assert stack.status()["state"] == "running"
    finally:
        stack.down()
    assert _stack_processes(stack) == []
