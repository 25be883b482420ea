"""Real clients through the tap against a real broker; the tap topic is then read back and checked.

Marked ``integration``: they need a broker (see conftest.py) and skip without one.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import codec
from codec.taprecord import EXCHANGE, parse_records
from tap.flush import FlushLimits
from tests.tap.conftest import TappedCluster
from tests.tap.harness import TapRecord, TapThread, by_connection, read_topic
from tests.tap.helpers import parsed, parts

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        try:
            fut.result(30)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


def check_tap_topic(records: list[TapRecord], capture: str = "full") -> dict[str, int]:
    """Contract checks: schema 3, keyed by connection, contiguous seq per connection from open to close,
    a response only in its request's exchange or after it, every frame decodes. Counts frames."""
    assert records, "nothing mirrored"
    counts = {"req": 0, "resp": 0, "conns": 0, "records": 0, "exchanges": 0}
    for conn, recs in by_connection(records):
        counts["conns"] += 1
        counts["records"] += len(recs)
        assert len({r.partition for r in recs}) == 1, "one connection, one partition"
        assert not any(r.headers for r in recs), "schema 3 writes no Kafka headers"
        parsed = [entry for r in recs for entry in parse_records(None, r.value)]
        assert [p.seq for p in parsed] == list(range(1, len(parsed) + 1)), f"gap or reorder on {conn!r}"
        assert parsed[0].kind == "open"
        assert parsed[-1].kind == "close", f"{conn!r} not closed"
        for record in parsed:
            assert record.schema == 3 and record.connection.conn.encode() == conn
            assert record.connection.capture == capture
            if record.kind == EXCHANGE:
                counts["exchanges"] += 1
                req, resp = record.parts
                assert (req.direction, resp.direction) == ("req", "resp")
                assert req.correlation_id == resp.correlation_id and req.ts_ns <= resp.ts_ns
            for part in record.parts:
                if part.direction in ("open", "close"):
                    continue
                counts[part.direction] += 1
                if part.header_only:
                    continue
                value = part.value or b""
                if part.direction == "req":
                    if capture == "meta":
                        codec.decode_request_header(value)
                    else:
                        req_msg = codec.decode_request(value)
                        assert (req_msg.api_key, req_msg.api_version) == (part.api_key, part.api_version)
                        assert req_msg.correlation_id == part.correlation_id
                elif capture != "meta":
                    assert part.api_key is not None and part.api_version is not None
                    resp_msg = codec.decode_response(value, part.api_key, part.api_version)
                    assert resp_msg.correlation_id == part.correlation_id
    return counts


@pytest.fixture
def tap(tapped_cluster: TappedCluster) -> Iterator[tuple[TapThread, str]]:
    t, topic = tapped_cluster.start_tap(capture="full")
    yield t, topic
    t.stop()


def _drain_tap(t: TapThread, cluster: TappedCluster, topic: str) -> list[TapRecord]:
    t.wait_idle()
    t.tap.sink.close(10)
    return read_topic(cluster.mirror_bootstrap, topic)


def test_idempotent_producer_and_consumer(tapped_cluster: TappedCluster, tap: tuple[TapThread, str]) -> None:
    t, tap_topic = tap
    topic = f"t-{uuid.uuid4().hex[:6]}"
    _create_topic(tapped_cluster.bootstrap, topic)
    producer = Producer(
        {"bootstrap.servers": tapped_cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    for i in range(500):
        producer.produce(topic, f"value-{i}".encode() * 10, f"k{i % 7}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": tapped_cluster.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 500 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value() or b"")
    consumer.close()
    del producer
    assert got == [f"value-{i}".encode() * 10 for i in range(500)]
    counts = check_tap_topic(_drain_tap(t, tapped_cluster, tap_topic))
    assert counts["req"] >= counts["resp"] > 0
    assert t.metric("kpmon_tap_mirror_drops_total") == 0
    assert t.metric("kpmon_tap_active_connections") == 0


def test_transactional_commit_and_abort(tapped_cluster: TappedCluster, tap: tuple[TapThread, str]) -> None:
    t, tap_topic = tap
    topic = f"tx-{uuid.uuid4().hex[:6]}"
    _create_topic(tapped_cluster.bootstrap, topic)
    producer = Producer({"bootstrap.servers": tapped_cluster.bootstrap, "transactional.id": f"txn-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.abort_transaction(30)
    del producer
    consumer = Consumer(
        {
            "bootstrap.servers": tapped_cluster.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not got:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value() or b"")
    consumer.close()
    assert got == [b"committed"]
    records = _drain_tap(t, tapped_cluster, tap_topic)
    check_tap_topic(records)
    apis = {p.api_key for _, p in parts(records) if p.direction == "req"}
    assert {22, 24, 26} <= apis  # InitProducerId, AddPartitionsToTxn, EndTxn


def test_consumer_group_of_two(tapped_cluster: TappedCluster, tap: tuple[TapThread, str]) -> None:
    t, tap_topic = tap
    topic = f"grp-{uuid.uuid4().hex[:6]}"
    _create_topic(tapped_cluster.bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": tapped_cluster.bootstrap})
    for i in range(200):
        producer.produce(topic, str(i).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    del producer
    seen: list[bytes] = []
    lock = threading.Lock()

    def member() -> None:
        c = Consumer(
            {
                "bootstrap.servers": tapped_cluster.bootstrap,
                "group.id": f"g-{topic}",
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
            }
        )
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = c.poll(0.3)
            if msg is not None and not msg.error():
                with lock:
                    seen.append(msg.value() or b"")
            with lock:
                if len(seen) >= 200:
                    break
        c.close()

    threads = [threading.Thread(target=member) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert sorted(seen, key=int) == [str(i).encode() for i in range(200)]
    check_tap_topic(_drain_tap(t, tapped_cluster, tap_topic))


def test_kafka_python_producer_and_consumer(
    tapped_cluster: TappedCluster, tap: tuple[TapThread, str]
) -> None:
    kafka = pytest.importorskip("kafka")
    t, tap_topic = tap
    topic = f"kp-{uuid.uuid4().hex[:6]}"
    _create_topic(tapped_cluster.bootstrap, topic)
    producer = kafka.KafkaProducer(bootstrap_servers=tapped_cluster.bootstrap)
    for i in range(100):
        producer.send(topic, f"kp-{i}".encode())
    producer.flush(30)
    producer.close()
    consumer = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=tapped_cluster.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    got = [m.value for m in consumer]
    consumer.close()
    assert got == [f"kp-{i}".encode() for i in range(100)]
    check_tap_topic(_drain_tap(t, tapped_cluster, tap_topic))


@pytest.mark.parametrize("capture", ["headers", "meta"])
def test_payloads_do_not_leave_in_headers_and_meta(tapped_cluster: TappedCluster, capture: str) -> None:
    t, tap_topic = tapped_cluster.start_tap(capture=capture)
    try:
        topic = f"cap-{uuid.uuid4().hex[:6]}"
        _create_topic(tapped_cluster.bootstrap, topic)
        marker = b"PAYLOAD-MARKER-" + uuid.uuid4().hex.encode()
        producer = Producer({"bootstrap.servers": tapped_cluster.bootstrap, "compression.type": "none"})
        for _ in range(20):
            producer.produce(topic, marker)
        assert producer.flush(30) == 0
        del producer
        consumer = Consumer(
            {
                "bootstrap.servers": tapped_cluster.bootstrap,
                "group.id": f"g-{topic}",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 20
        while got < 20 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                assert msg.value() == marker
                got += 1
        consumer.close()
        assert got == 20
        records = _drain_tap(t, tapped_cluster, tap_topic)
    finally:
        t.stop()
    check_tap_topic(records, capture)
    assert all(marker not in r.value for r in records)
    if capture == "headers":
        produce = [p for _, p in parts(records) if p.direction == "req" and p.api_key == 0]
        assert produce and all("capture_fallback" not in p.flags for p in produce)
        body = codec.decode_request(produce[0].value or b"").body
        batch = body["TopicData"][0]["PartitionData"][0]["Records"]
        assert batch is not None


def _produce_and_consume(bootstrap: str, n: int) -> None:
    topic = f"deg-{uuid.uuid4().hex[:6]}"
    _create_topic(bootstrap, topic)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(n):
        producer.produce(topic, str(i).encode())
        producer.poll(0)
    assert producer.flush(30) == 0
    del producer
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 30
    while got < n and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got += 1
    consumer.close()
    assert got == n


def test_mirror_that_cannot_keep_up_drops_and_leaves_gaps(tapped_cluster: TappedCluster) -> None:
    # A record per entry: the queue's bound of 3 records then fills as it did before records gathered.
    t, tap_topic = tapped_cluster.start_tap(capture="full", max_frames=3, flush=FlushLimits(max_entries=1))
    try:
        _produce_and_consume(tapped_cluster.bootstrap, 2000)
        t.wait_idle()
        t.tap.sink.close(10)
        drops = t.metric("kpmon_tap_mirror_drops_total")
        records = read_topic(tapped_cluster.mirror_bootstrap, tap_topic)
    finally:
        t.stop()
    assert drops > 0
    missing = stamped = 0
    for _, recs in by_connection(records):
        kept = parsed(recs)
        seqs = [r.seq for r in kept]
        assert seqs == sorted(set(seqs)), "order kept; drops only leave gaps"
        # Each record counts the connection's records lost before it: with the tap-topic cluster up,
        # exactly the numbers missing below its own (none failed delivery).
        assert [r.lost for r in kept] == [r.seq - 1 - i for i, r in enumerate(kept)]
        missing += kept[-1].seq - len(kept)
        stamped += sum(1 for r in kept if r.lost)
    # A connection's drops after its last kept record leave no gap: the count can only be higher.
    assert 0 < missing <= drops and stamped > 0


def test_traffic_continues_with_the_tap_topic_cluster_down(tapped_cluster: TappedCluster) -> None:
    down = TappedCluster(
        tapped_cluster.bootstrap,
        tapped_cluster.broker,
        tapped_cluster.broker_id,
        tapped_cluster.tap_addr,
        "127.0.0.1:1",  # nothing listens: the mirror producer can never connect
    )
    t, _ = down.start_tap(capture="full", max_frames=10, flush=FlushLimits(max_entries=1))
    try:
        started = time.monotonic()
        _produce_and_consume(tapped_cluster.bootstrap, 500)
        assert time.monotonic() - started < 30
        assert t.metric("kpmon_tap_mirror_drops_total") > 0
    finally:
        t.tap.sink.close(0.1)
        t.stop()
