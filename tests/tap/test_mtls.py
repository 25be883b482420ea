"""mTLS through the tap against a real broker that requires client certificates.

The tap verifies each client's certificate and presents to the broker the identity it holds for that
client (``tap.listeners[].broker_identities``, docs/decisions.md "mTLS through the tap"). A client the
tap has no identity for is refused, and so is a client without a certificate: nothing is mirrored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploy.local.properties import TlsSpec
from deploy.local.stack import LocalStack
from kpconfig.model import BrokerIdentity, TapConfig, TapListenerConfig
from tap.app import listener_specs
from tap.mirror import KafkaMirror, MemoryMirror, MirrorSink
from tap.proxy import TapSettings
from tests.certs import Ca, Issued, issue, make_ca
from tests.tap.harness import TapThread, free_port, start_stack
from tests.tap.helpers import parts
from tests.tap.secured import refused, roundtrip

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass
class Mtls:
    stack: LocalStack
    tap_ca: Ca
    tap_cert: Issued
    broker_ca: Ca
    clients: dict[str, Issued]
    #: What the tap presents to the broker for alice (issued to the tap, same subject as alice's).
    alice_at_tap: Issued


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mtls]:
    d = tmp_path_factory.mktemp("mtls-certs")
    broker_ca, tap_ca, clients_ca = make_ca(d, "broker"), make_ca(d, "tap"), make_ca(d, "clients")
    broker = issue(d, broker_ca, "broker")
    clients = {name: issue(d, clients_ca, name, client=True) for name in ("alice", "bob", "kpmon")}
    (d / "tap-identities").mkdir()
    alice_at_tap = issue(d / "tap-identities", clients_ca, "alice", client=True)
    tls = TlsSpec(str(broker.keystore), str(clients_ca.pem), client_auth="required")
    stack = LocalStack(tmp_path_factory.mktemp("mtls-stack"), tls=tls)
    try:
        start_stack(stack)
        yield Mtls(stack, tap_ca, issue(d, tap_ca, "tap"), broker_ca, clients, alice_at_tap)
    finally:
        stack.down()


def _tap(m: Mtls, identities: bool = True, sink: MirrorSink | None = None) -> tuple[TapThread, int, Any]:
    port = free_port()
    b = m.stack.listen_endpoints[0]
    config = TapConfig(
        listeners=[
            TapListenerConfig(
                listen=f"127.0.0.1:{port}",
                broker=f"{b.host}:{b.port}",
                broker_id=1,
                listener_name="SSL",
                tls_certfile=str(m.tap_cert.cert),
                tls_keyfile=str(m.tap_cert.key),
                tls_client_cafile=str(m.clients["alice"].cert.parent / "clients-ca.pem"),
                broker_tls=True,
                broker_cafile=str(m.broker_ca.pem),
                broker_identities={
                    "alice": BrokerIdentity(
                        certfile=str(m.alice_at_tap.cert), keyfile=str(m.alice_at_tap.key)
                    )
                }
                if identities
                else {},
            )
        ],
        rewrite_broker_addresses=True,
    )
    sink = sink or MemoryMirror()
    specs = listener_specs(config)
    return (
        TapThread(specs, sink, TapSettings(capture="full", rewrite_broker_addresses=True)).start(),
        port,
        sink,
    )


def _client(m: Mtls, port: int, name: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(m.tap_ca.pem),
    }
    if name is not None:
        config |= {
            "ssl.certificate.location": str(m.clients[name].cert),
            "ssl.key.location": str(m.clients[name].key),
        }
    return config


def test_the_tap_presents_the_clients_identity_to_an_mtls_broker(mtls: Mtls) -> None:
    t, port, sink = _tap(mtls)
    try:
        roundtrip(_client(mtls, port, "alice"), f"mtls-{uuid.uuid4().hex[:6]}", b"from alice")
        t.wait_idle(15)
    finally:
        t.stop()
    opened = [json.loads(p.value or b"") for _, p in parts(sink.records) if p.direction == "open"]
    assert opened and all(o["tls"]["peer"] == "commonName=alice" for o in opened)
    assert any(p.direction == "req" for _, p in parts(sink.records))


@pytest.mark.parametrize("client", ["bob", None], ids=["no identity for the client", "no client certificate"])
def test_clients_the_tap_cannot_represent_are_refused(mtls: Mtls, client: str | None) -> None:
    t, port, sink = _tap(mtls)
    try:
        error = refused(_client(mtls, port, client))
        t.wait_idle(15)
    finally:
        t.stop()
    frames = [p for _, p in parts(sink.records) if p.direction in ("req", "resp")]
    print(f"\n{client}: {error[:200]}; tap records {len(sink.records)}, frames {len(frames)}")
    assert frames == []
    if client == "bob":
        refusal = "no broker identity for client certificate CN='bob'"
        reasons = [
            json.loads(p.value or b"")["reason"] for _, p in parts(sink.records) if p.direction == "close"
        ]
        assert refusal in reasons
        # The client retries until it is closed: a connection it (or the tap's stop) closes before the
        # tap looked up its identity ends with that reason instead. None reached the broker.
        assert set(reasons) <= {refusal, "client closed", "tap stopping"}, sorted(set(reasons))
        assert t.metric("kpmon_tap_closed_connections_total", {"reason": "no_broker_identity"}) >= 1
    else:
        assert sink.records == []  # the TLS handshake with the tap fails: not even an open record


def test_without_identities_the_broker_refuses_the_tap(mtls: Mtls) -> None:
    """The control: the broker really requires a client certificate, which a plain tap does not have."""
    t, port, sink = _tap(mtls, identities=False)
    try:
        assert refused(_client(mtls, port, "alice"))
        t.wait_idle(15)
    finally:
        t.stop()
    assert not [p for _, p in parts(sink.records) if p.direction == "resp"], "the broker answered the tap"


def test_kpmons_own_clients_on_mtls(mtls: Mtls, tmp_path: Path) -> None:
    """The mirror producer, a tap-topic reader, the Java client with the translated properties (a PEM
    keystore made from ``ssl.certificate.location``/``ssl.key.location``), the job's Spark source with
    the same translation and the kafka hook, each with kpmon's own client certificate against a broker
    that requires one."""
    from kpconfig.model import KafkaClusterConfig
    from streaming.hooks.kafka_sender import KafkaSender
    from tests.streaming.hooks.builders import alert
    from tests.tap.harness import read_topic_range
    from tests.tap.secured import java_properties_file

    kpmon = mtls.clients["kpmon"]
    cluster = KafkaClusterConfig(
        bootstrap_servers=mtls.stack.bootstrap_servers,
        properties={
            "security.protocol": "SSL",
            "ssl.ca.location": str(mtls.broker_ca.pem),
            "ssl.certificate.location": str(kpmon.cert),
            "ssl.key.location": str(kpmon.key),
        },
    )
    tap_topic = f"kpmon.tap.mtls.{uuid.uuid4().hex[:6]}"
    sink = KafkaMirror(
        cluster.bootstrap_servers, tap_topic, 100_000, 64 << 20, {**cluster.properties, "linger.ms": "5"}
    )
    t, port, _ = _tap(mtls, sink=sink)
    try:
        roundtrip(_client(mtls, port, "alice"), f"mtls-{uuid.uuid4().hex[:6]}", b"mirrored over mTLS")
        t.wait_mirrored(60)
        t.tap.sink.close(10)
    finally:
        t.stop()
    records = read_topic_range(cluster.bootstrap_servers, tap_topic, properties=dict(cluster.properties))
    assert any(p.direction == "req" for _, p in parts(records))

    from deploy.local.tools import run_tool
    from deploy.versions import KAFKA_LEGACY

    java = cluster.java_client_properties()
    assert java["ssl.keystore.type"] == "PEM" and "BEGIN PRIVATE KEY" in java["ssl.keystore.key"]
    props = java_properties_file(tmp_path / "java-mtls.properties", java)
    done = run_tool(
        KAFKA_LEGACY,
        "kafka-console-consumer",
        [
            *("--bootstrap-server", cluster.bootstrap_servers, "--consumer.config", str(props)),
            *("--topic", tap_topic, "--from-beginning", "--max-messages", "3", "--timeout-ms", "30000"),
            *("--property", "print.key=true", "--property", "print.value=false"),
        ],
        timeout=120,
    )
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 3, done.stderr[-2000:]

    # The job's own streaming source (Spark's Kafka source) with the translated PEM keystore.
    from tests.tap.secured import spark_stream_reads

    options, rows = spark_stream_reads(
        {"bootstrap.servers": cluster.bootstrap_servers, **cluster.properties}, tmp_path
    )
    assert options["kafka.ssl.keystore.type"] == "PEM"
    assert sorted(bytes(r["value"]) for r in rows) == [b"frame-0", b"frame-1", b"frame-2"]

    alerts_topic = f"kpmon.alerts.{uuid.uuid4().hex[:6]}"
    sender = KafkaSender(cluster, alerts_topic, timeout=20)
    try:
        result = sender.send([alert("mtls-1").to_dict()])
    finally:
        sender.close()
    assert not result.error, result.error
    assert (
        len(read_topic_range(cluster.bootstrap_servers, alerts_topic, properties=dict(cluster.properties)))
        == 1
    )


def _kafka_python_roundtrip(m: Mtls, port: int, topic: str, value: bytes) -> None:
    """kafka-python as alice: its own TLS stack (Python's ``ssl``) with her client certificate."""
    from tests.tap.secured import kafka_python_roundtrip

    common: dict[str, Any] = {
        "bootstrap_servers": f"127.0.0.1:{port}",
        "security_protocol": "SSL",
        "ssl_cafile": str(m.tap_ca.pem),
        "ssl_certfile": str(m.clients["alice"].cert),
        "ssl_keyfile": str(m.clients["alice"].key),
        "client_id": "kpmon-mtls-kafka-python",
    }
    kafka_python_roundtrip(common, topic, value)


def _java_roundtrip(m: Mtls, port: int, topic: str, value: str, directory: Path) -> None:
    """Kafka's Java tools (the Java client) as alice: a PEM keystore with her key and certificate."""
    from deploy.local.tools import run_tool
    from deploy.versions import KAFKA_LEGACY
    from tests.tap.secured import java_properties_file

    props = java_properties_file(
        directory / "java-mtls-alice.properties",
        {
            "security.protocol": "SSL",
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(m.tap_ca.pem),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(m.clients["alice"].keystore),
            "client.id": "kpmon-mtls-java",
        },
    )
    bootstrap = f"127.0.0.1:{port}"
    produced = run_tool(
        KAFKA_LEGACY,
        "kafka-console-producer",
        ["--bootstrap-server", bootstrap, "--producer.config", str(props), "--topic", topic],
        timeout=120,
        input=value + "\n",
    )
    assert produced.returncode == 0, produced.stderr[-2000:]
    consumed = run_tool(
        KAFKA_LEGACY,
        "kafka-console-consumer",
        [
            *("--bootstrap-server", bootstrap, "--consumer.config", str(props), "--topic", topic),
            *("--from-beginning", "--max-messages", "1", "--timeout-ms", "30000"),
        ],
        timeout=120,
    )
    assert consumed.returncode == 0 and value in consumed.stdout, consumed.stderr[-2000:]


def test_kafka_python_and_the_java_client_through_the_tap_on_mtls(mtls: Mtls, tmp_path: Path) -> None:
    """The same re-presented identity for the two other client libraries: each TLS stack (Python's
    ``ssl`` in kafka-python, the JDK's with a PEM keystore) presents alice's certificate to the tap,
    and the tap presents its alice identity to the broker that requires one."""
    t, port, sink = _tap(mtls)
    try:
        _kafka_python_roundtrip(mtls, port, f"mtls-kp-{uuid.uuid4().hex[:6]}", b"from kafka-python")
        _java_roundtrip(mtls, port, f"mtls-java-{uuid.uuid4().hex[:6]}", "from-java", tmp_path)
        t.wait_idle(15)
    finally:
        t.stop()
    opened = [json.loads(p.value or b"") for _, p in parts(sink.records) if p.direction == "open"]
    assert opened and all(o["tls"]["peer"] == "commonName=alice" for o in opened)
    requests = [p.value or b"" for _, p in parts(sink.records) if p.direction == "req"]
    per_library = {c: sum(c in v for v in requests) for c in (b"kpmon-mtls-kafka-python", b"kpmon-mtls-java")}
    print(f"\nmTLS through the tap: {len(opened)} connections as alice; requests mirrored: {per_library}")
    assert all(per_library.values()), per_library
