"""Every leg on a real KRaft broker whose client listener is SASL_SSL; certificates made by the test.

One broker (``LocalStack(sasl=True, tls=...)``), its listener on TLS with PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512 and OAUTHBEARER. Legs:

- client → tap: the tap terminates TLS with its own certificate; SASL passes through to the broker;
- tap → broker: TLS, verified against the broker's CA;
- tap → tap-topic cluster: the mirror producer on SASL_SSL (SCRAM-SHA-512);
- tap-topic cluster → the Java client, with the properties the Spark Kafka source gets
  (``KafkaClusterConfig.java_client_properties()``: the translation of the librdkafka map);
- hooks → alerts topic: the ``kafka`` hook's producer on SASL_SSL;
- the Spark source: the job's streaming query (``frame_rows``) run once (``availableNow``);
- OAUTHBEARER (unsecured JWS tokens, the broker's default validator): a client through the tap, the
  mirror producer, a librdkafka reader and the Java client with the translated login module.

Clients through the tap: confluent-kafka (librdkafka) with each mechanism, kafka-python, and Kafka's
Java tools. The tap topic is then read whole and searched for every password (figures in
docs/security.md). Bad certificates, an expired certificate, a wrong CA and plaintext fallbacks are
refused with a clear error, the connection closed, and no frame mirrored.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploy.local.properties import TlsSpec
from deploy.local.stack import LocalStack
from kpconfig.model import KafkaClusterConfig, TapConfig, TapListenerConfig
from tap.app import listener_specs
from tap.mirror import KafkaMirror, MemoryMirror, MirrorSink
from tap.proxy import TapSettings
from tests.certs import Ca, Issued, issue, make_ca
from tests.tap.harness import TapThread, free_port, read_topic_range, secret_count, start_stack
from tests.tap.helpers import parts
from tests.tap.secured import java_properties_file, kafka_python_roundtrip, refused, roundtrip

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass
class Secured:
    stack: LocalStack
    directory: Path
    broker_ca: Ca
    tap_ca: Ca
    tap_cert: Issued

    @property
    def broker(self) -> tuple[str, int]:
        b = self.stack.listen_endpoints[0]
        return b.host, b.port

    def direct(self, mechanism: str = "SCRAM-SHA-512") -> dict[str, Any]:
        """librdkafka properties straight to the broker's SASL_SSL listener (the tap-topic cluster)."""
        config = self.stack.client_config(mechanism)
        assert config["security.protocol"] == "SASL_SSL"
        return config

    def via_tap(self, tap_port: int, mechanism: str) -> dict[str, Any]:
        return {
            **self.direct(mechanism),
            "bootstrap.servers": f"127.0.0.1:{tap_port}",
            "ssl.ca.location": str(self.tap_ca.pem),
        }

    def tap_config(self, port: int, **overrides: Any) -> TapConfig:
        listener = {
            "listen": f"127.0.0.1:{port}",
            "broker": "{}:{}".format(*self.broker),
            "broker_id": 1,
            "listener_name": "SASL_SSL",
            "tls_certfile": str(self.tap_cert.cert),
            "tls_keyfile": str(self.tap_cert.key),
            "broker_tls": True,
            "broker_cafile": str(self.broker_ca.pem),
            **overrides,
        }
        return TapConfig(listeners=[TapListenerConfig(**listener)], rewrite_broker_addresses=True)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    directory = tmp_path_factory.mktemp("secured-certs")
    broker_ca, tap_ca = make_ca(directory, "broker"), make_ca(directory, "tap")
    broker_cert = issue(directory, broker_ca, "broker")
    tap_cert = issue(directory, tap_ca, "tap")
    tls = TlsSpec(str(broker_cert.keystore), str(broker_ca.pem))
    stack = LocalStack(tmp_path_factory.mktemp("secured-stack"), sasl=True, tls=tls)
    try:
        start_stack(stack)
        yield Secured(stack, directory, broker_ca, tap_ca, tap_cert)
    finally:
        stack.down()


def _start_tap(secured: Secured, sink: MirrorSink, **overrides: Any) -> tuple[TapThread, int]:
    port = free_port()
    specs = listener_specs(secured.tap_config(port, **overrides))
    return TapThread(specs, sink, TapSettings(capture="full", rewrite_broker_addresses=True)).start(), port


def _kafka_python_roundtrip_sasl(config: dict[str, Any], topic: str, value: bytes, **auth: Any) -> None:
    """kafka-python with ``config``'s mechanism: its user and password, or ``auth`` (a token provider)."""
    common = {
        "bootstrap_servers": config["bootstrap.servers"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": config["sasl.mechanism"],
        "ssl_cafile": config["ssl.ca.location"],
    }
    common |= auth or {
        "sasl_plain_username": config["sasl.username"],
        "sasl_plain_password": config["sasl.password"],
    }
    kafka_python_roundtrip(common, topic, value)


def _java_tool_through_tap(
    secured: Secured, tap_port: int, directory: Path, sasl: dict[str, str] | None = None
) -> str:
    """Kafka's Java tools (the Java client) through the tap on SASL_SSL, with a PEM truststore; SCRAM-SHA-256
    unless ``sasl`` gives the mechanism and its ``sasl.jaas.config``."""
    from deploy.local.tools import run_tool
    from deploy.versions import KAFKA_LEGACY

    user, password = secured.stack.sasl_users["SCRAM-SHA-256"]
    sasl = sasl or {
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{user}" password="{password}";'
        ),
    }
    props = java_properties_file(
        directory / "java-client.properties",
        {
            "security.protocol": "SASL_SSL",
            **sasl,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(secured.tap_ca.pem),
        },
    )
    done = run_tool(
        KAFKA_LEGACY,
        "kafka-topics",
        ["--bootstrap-server", f"127.0.0.1:{tap_port}", "--command-config", str(props), "--list"],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return str(done.stdout)


def _java_reads_tap_topic(secured: Secured, tap_topic: str, directory: Path) -> int:
    """The Java client reads the tap topic with the Spark source's properties (the translation)."""
    direct = secured.direct("SCRAM-SHA-512")
    cluster = KafkaClusterConfig(
        bootstrap_servers=direct["bootstrap.servers"],
        properties={k: str(v) for k, v in direct.items() if k != "bootstrap.servers"},
    )
    java = cluster.java_client_properties()
    assert "sasl.jaas.config" in java and "sasl.password" not in java
    return _java_reads_tap_topic_with(java, cluster.bootstrap_servers, tap_topic, directory)


def _java_reads_tap_topic_with(java: dict[str, str], bootstrap: str, tap_topic: str, directory: Path) -> int:
    """Records ``kafka-console-consumer`` reads (5 at most) from the tap topic with ``java`` properties."""
    from deploy.local.tools import run_tool
    from deploy.versions import KAFKA_LEGACY

    props = java_properties_file(directory / "spark-source.properties", java)
    done = run_tool(
        KAFKA_LEGACY,
        "kafka-console-consumer",
        [
            *("--bootstrap-server", bootstrap, "--consumer.config", str(props)),
            *("--topic", tap_topic, "--from-beginning", "--max-messages", "5", "--timeout-ms", "30000"),
            *("--property", "print.key=true", "--property", "print.value=false"),
        ],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return len(done.stdout.splitlines())


def _send_alert_over_sasl_ssl(secured: Secured) -> str:
    from streaming.hooks.kafka_sender import KafkaSender
    from tests.streaming.hooks.builders import alert

    direct = secured.direct("PLAIN")
    cluster = KafkaClusterConfig(
        bootstrap_servers=direct["bootstrap.servers"],
        properties={k: str(v) for k, v in direct.items() if k != "bootstrap.servers"},
    )
    topic = f"kpmon.alerts.{uuid.uuid4().hex[:6]}"
    sender = KafkaSender(cluster, topic, timeout=20)
    try:
        result = sender.send([alert("secured-1").to_dict()])
    finally:
        sender.close()
    assert not result.error, result.error
    records = read_topic_range(cluster.bootstrap_servers, topic, properties=dict(cluster.properties))
    assert len(records) == 1 and b"secured-1" in records[0].key + records[0].value
    return topic


def test_every_leg_on_sasl_ssl(secured: Secured, tmp_path: Path) -> None:
    direct = secured.direct()
    tap_topic = f"kpmon.tap.secured.{uuid.uuid4().hex[:6]}"
    mirror_props = {k: v for k, v in direct.items() if k != "bootstrap.servers"}
    sink = KafkaMirror(
        direct["bootstrap.servers"], tap_topic, 100_000, 64 << 20, {**mirror_props, "linger.ms": "5"}
    )
    t, tap_port = _start_tap(secured, sink)
    data = f"secured-{uuid.uuid4().hex[:6]}"
    try:
        for mechanism in MECHANISMS:
            roundtrip(secured.via_tap(tap_port, mechanism), data, mechanism.encode())
        _kafka_python_roundtrip_sasl(secured.via_tap(tap_port, "SCRAM-SHA-512"), data, b"kafka-python")
        assert data in _java_tool_through_tap(secured, tap_port, tmp_path)
        t.wait_mirrored(60)
        t.tap.sink.close(10)
    finally:
        t.stop()
    records = read_topic_range(direct["bootstrap.servers"], tap_topic, properties=mirror_props)
    opened = [p for _, p in parts(records) if p.direction == "open"]
    assert opened and all(b'"tls": {"version": "TLS' in (p.value or b"") for p in opened), (
        "a client leg without TLS"
    )
    auth = [p for _, p in parts(records) if p.api_key == 36]
    assert auth and all(p.redacted == ("AuthBytes",) for p in auth)
    figures = {}
    for mechanism, (_user, password) in secured.stack.sasl_users.items():
        figures[mechanism] = secret_count(records, password.encode())
    print(
        f"\nsecured legs: {len(records)} tap records, {len(opened)} TLS connections; secret bytes found: {figures}"
    )
    assert figures == {m: 0 for m in MECHANISMS}
    # The Java client, configured like the Spark source, reads the tap topic on SASL_SSL.
    assert _java_reads_tap_topic(secured, tap_topic, tmp_path) == 5
    _send_alert_over_sasl_ssl(secured)


@pytest.mark.parametrize(
    "case",
    [
        "tap cert from an untrusted CA",
        "expired tap cert",
        "tap trusts the wrong CA for the broker",
        "plaintext to the tap",
    ],
)
def test_bad_certificates_and_plaintext_are_refused_and_nothing_is_mirrored(
    secured: Secured, case: str
) -> None:
    overrides: dict[str, Any] = {}
    client_ca = secured.tap_ca.pem
    if case == "tap cert from an untrusted CA":
        rogue = make_ca(secured.directory, f"rogue-{uuid.uuid4().hex[:4]}")
        cert = issue(secured.directory, rogue, f"rogue-tap-{uuid.uuid4().hex[:4]}")
        overrides = {"tls_certfile": str(cert.cert), "tls_keyfile": str(cert.key)}
    elif case == "expired tap cert":
        cert = issue(secured.directory, secured.tap_ca, f"expired-tap-{uuid.uuid4().hex[:4]}", expired=True)
        overrides = {"tls_certfile": str(cert.cert), "tls_keyfile": str(cert.key)}
    elif case == "tap trusts the wrong CA for the broker":
        overrides = {"broker_cafile": str(secured.tap_ca.pem)}
    sink = MemoryMirror()
    t, tap_port = _start_tap(secured, sink, **overrides)
    try:
        config = {**secured.via_tap(tap_port, "PLAIN"), "ssl.ca.location": str(client_ca)}
        if case == "plaintext to the tap":
            config["security.protocol"] = "SASL_PLAINTEXT"
        error = refused(config)
        t.wait_idle(15)
    finally:
        t.stop()
    frames = [p for _, p in parts(sink.records) if p.direction in ("req", "resp")]
    closes = [p for _, p in parts(sink.records) if p.direction == "close"]
    print(f"\n{case}: client error: {error[:300]}; tap records {len(sink.records)}, frames {len(frames)}")
    assert frames == [], f"{case}: frames mirrored"
    if case == "tap trusts the wrong CA for the broker":
        # The client's TLS to the tap is fine; the tap cannot verify the broker, says so and closes. The
        # client keeps reconnecting, so a connection the client or the tap's stop closes before the tap
        # reached the broker ends for that reason instead; none ends for another.
        reasons = [str(json.loads(p.value or b"{}").get("reason", "")) for p in closes]
        verify_failed = [r for r in reasons if "certificate verify failed" in r]
        assert verify_failed, reasons
        assert set(reasons) - set(verify_failed) <= {"client closed", "tap stopping"}, sorted(set(reasons))
        assert t.metric("kpmon_tap_closed_connections_total", {"reason": "broker_unreachable"}) >= 1
    elif case == "plaintext to the tap":
        assert sink.records == [] and error
    else:
        assert sink.records == []
        assert "certificate verify failed" in error, error


def test_plaintext_to_the_brokers_tls_listener_is_refused(secured: Secured) -> None:
    config = {**secured.direct("PLAIN"), "security.protocol": "SASL_PLAINTEXT"}
    assert refused(config)


def test_a_listener_without_its_tls_settings_relays_and_says_it_is_blind(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    """SASL_SSL clients through a tap listener that has none of its TLS settings (what the shipped
    manifests' ``--listen`` used to leave): the clients still work, and the log, the metrics and the
    monitor all say that the tap sees only ciphertext on that connection."""
    import checks
    from codec.taprecord import frames_from_record

    sink = MemoryMirror()
    port = free_port()
    plain = TapConfig(
        listeners=[
            TapListenerConfig(listen=f"127.0.0.1:{port}", broker="{}:{}".format(*secured.broker), broker_id=1)
        ]
    )
    t = TapThread(listener_specs(plain), sink, TapSettings(capture="full")).start()
    try:
        # The broker's own certificate is for 127.0.0.1, so a client's TLS through the relay verifies.
        config = {**secured.direct("PLAIN"), "bootstrap.servers": f"127.0.0.1:{port}"}
        roundtrip(config, f"blind-{uuid.uuid4().hex[:6]}", b"through a blind tap")
        t.wait_idle(30)
    finally:
        t.stop()
    blind = [p for _, p in parts(sink.records) if p.direction == "blind"]
    assert blind and all(json.loads(p.value or b"")["side"] == "client" for p in blind)
    assert [p for _, p in parts(sink.records) if p.direction in ("req", "resp")] == []
    closes = [json.loads(p.value or b"") for _, p in parts(sink.records) if p.direction == "close"]
    assert closes and all(c["blind"] == "client" and "mid_frame" not in c for c in closes)
    assert t.metric("kpmon_tap_blind_connections_total", {"side": "client"}) == len(blind)
    assert any("speaks TLS that the tap does not terminate" in r.getMessage() for r in caplog.records)
    monitor = checks.new_monitor()
    frames = [f for i, r in enumerate(sink.records) for f in frames_from_record(None, r.value, 0, i)]
    findings = [*monitor.feed_all(frames), *monitor.flush()]
    assert {f.rule for f in findings} == {"tap.blind"}, [f.summary for f in findings]
    assert all("set tls_certfile and tls_keyfile" in f.summary for f in findings)


def test_plaintext_to_a_tls_broker_through_the_tap_is_reported_as_the_brokers_side(secured: Secured) -> None:
    """A listener whose broker speaks TLS but lacks ``broker_tls``: the broker answers the client's
    plaintext with a TLS alert, and the tap names the broker side and the setting to fix."""
    sink = MemoryMirror()
    port = free_port()
    plain = TapConfig(
        listeners=[
            TapListenerConfig(listen=f"127.0.0.1:{port}", broker="{}:{}".format(*secured.broker), broker_id=1)
        ]
    )
    t = TapThread(listener_specs(plain), sink, TapSettings(capture="full")).start()
    try:
        config = {
            **secured.direct("PLAIN"),
            "bootstrap.servers": f"127.0.0.1:{port}",
            "security.protocol": "SASL_PLAINTEXT",
        }
        assert refused(config)
        t.wait_idle(30)
    finally:
        t.stop()
    blind = [json.loads(p.value or b"")["side"] for _, p in parts(sink.records) if p.direction == "blind"]
    assert blind and set(blind) == {"broker"}
    assert t.metric("kpmon_tap_blind_connections_total", {"side": "broker"}) == len(blind)


def test_the_spark_kafka_source_reads_the_tap_topic_on_sasl_ssl(secured: Secured, tmp_path: Path) -> None:
    """The job's own streaming source (Spark's Kafka source, the Java client) with ``source_options``:
    the translated properties, in a Structured Streaming query run once (``availableNow``)."""
    from tests.tap.secured import spark_stream_reads

    direct = secured.direct("SCRAM-SHA-256")
    options, rows = spark_stream_reads(direct, tmp_path)
    assert "kafka.sasl.jaas.config" in options and "kafka.sasl.password" not in options
    assert sorted(bytes(r["value"]) for r in rows) == [b"frame-0", b"frame-1", b"frame-2"]
    assert {r["dir"] for r in rows} == {"req"}


def _unsecured_jws(subject: str, marker: str) -> str:
    """An unsecured JWS (``alg: none``, empty signature) the broker's default OAUTHBEARER validator takes."""

    def part(claims: dict[str, Any]) -> str:
        raw = json.dumps(claims, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    now = int(time.time())
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': now, 'exp': now + 3600, 'jti': marker})}."


#: base64url of ``{"alg":"`` : the start of every JWS header, whoever made the token.
JWS_START = b"eyJhbGciOi"


def test_oauthbearer_through_the_tap_and_to_the_tap_topic(secured: Secured, tmp_path: Path) -> None:
    """SASL_SSL OAUTHBEARER with unsecured JWS tokens (the broker's default validator): librdkafka's own
    unsecured-token builder for the mirror producer and the tap-topic reader; through the tap,
    confluent-kafka and kafka-python with tokens the test makes (``oauth_cb``, a token provider), so the
    exact tokens can be searched for, and Kafka's Java tools with the login module's unsecured token."""
    direct = secured.direct("PLAIN")
    oauth = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "ssl.ca.location": direct["ssl.ca.location"],
        "enable.sasl.oauthbearer.unsecure.jwt": "true",
        "sasl.oauthbearer.config": "principal=kpmon-tap",
    }
    tap_topic = f"kpmon.tap.oauth.{uuid.uuid4().hex[:6]}"
    sink = KafkaMirror(direct["bootstrap.servers"], tap_topic, 100_000, 64 << 20, {**oauth, "linger.ms": "5"})
    t, tap_port = _start_tap(secured, sink)
    token = _unsecured_jws("kpmon-oauth-client", uuid.uuid4().hex)
    client = {
        "bootstrap.servers": f"127.0.0.1:{tap_port}",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "ssl.ca.location": str(secured.tap_ca.pem),
        "oauth_cb": lambda _config: (token, time.time() + 3600),
    }
    from kafka.net.sasl.oauth import AbstractTokenProvider

    kafka_python_token = _unsecured_jws("kpmon-oauth-kafka-python", uuid.uuid4().hex)

    class Token(AbstractTokenProvider):
        def token(self) -> str:
            return kafka_python_token

    topic = f"oauth-{uuid.uuid4().hex[:6]}"
    java_oauth = {
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredLoginStringClaim_sub="kpmon-oauth-java";'
        ),
    }
    try:
        roundtrip(client, topic, b"over OAUTHBEARER")
        _kafka_python_roundtrip_sasl(
            client,
            topic,
            b"kafka-python over OAUTHBEARER",
            sasl_oauth_token_provider=Token(),
        )
        assert topic in _java_tool_through_tap(secured, tap_port, tmp_path, java_oauth)
        t.wait_mirrored(60)
        t.tap.sink.close(10)
    finally:
        t.stop()
    reader = {k: v for k, v in oauth.items() if k != "sasl.oauthbearer.config"}
    reader["sasl.oauthbearer.config"] = "principal=kpmon-reader"
    records = read_topic_range(direct["bootstrap.servers"], tap_topic, properties=reader)
    auth = [p for _, p in parts(records) if p.api_key == 36]
    found = {
        "token": secret_count(records, token.encode()),
        "claims": secret_count(records, token.split(".")[1].encode()),
        "kafka-python token": secret_count(records, kafka_python_token.encode()),
        "any JWS": secret_count(records, JWS_START),
    }
    print(
        f"\nOAUTHBEARER: {len(records)} tap records, {len(auth)} SaslAuthenticate; secret bytes found: {found}"
    )
    assert auth and all(p.redacted == ("AuthBytes",) for p in auth)
    assert any(b"OAUTHBEARER" in (p.value or b"") for _, p in parts(records) if p.api_key == 17)
    assert found == {"token": 0, "claims": 0, "kafka-python token": 0, "any JWS": 0}
    # The Java client (the Spark source's properties) on OAUTHBEARER: the translated unsecured login.
    cluster = KafkaClusterConfig(bootstrap_servers=direct["bootstrap.servers"], properties=reader)
    java = cluster.java_client_properties()
    assert "OAuthBearerLoginModule" in java["sasl.jaas.config"]
    assert _java_reads_tap_topic_with(java, cluster.bootstrap_servers, tap_topic, tmp_path) == 5
