"""Secrets never leave: real SASL (PLAIN, SCRAM) and SCRAM credential changes through the tap.

The whole tap topic is read back and searched, in keys, values and headers, for the passwords
and salts that crossed the tap.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tap.mirror import KafkaMirror
from tap.proxy import ListenerSpec, TapSettings
from tests.tap.conftest import free_port, start_stack
from tests.tap.harness import TapThread, read_topic
from tests.tap.helpers import parts
from tests.tap.test_real_clients import check_tap_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass
class SaslCluster:
    tap_bootstrap: str
    broker: tuple[str, int]
    mirror_bootstrap: str
    users: dict[str, tuple[str, str]]

    def client(self, mechanism: str) -> dict[str, Any]:
        user, password = self.users[mechanism]
        return {
            "bootstrap.servers": self.tap_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
        }


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslCluster]:
    try:
        from deploy.local.stack import LocalStack  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pytest.skip("deploy.local.stack is missing")
    port = free_port()
    home: Path = tmp_path_factory.mktemp("tapped-sasl-stack")
    stack = LocalStack(home, sasl=True, advertised={1: ("127.0.0.1", port)})
    try:
        start_stack(stack)
        b = stack.listen_endpoints[0]
        yield SaslCluster(
            f"127.0.0.1:{port}", (b.host, b.port), stack.internal_bootstrap_servers, stack.sasl_users
        )
    finally:
        stack.down()


def test_passwords_and_salts_never_reach_the_tap_topic(sasl_cluster: SaslCluster) -> None:
    topic = f"kpmon.tap.sasl.{uuid.uuid4().hex[:6]}"
    sink = KafkaMirror(sasl_cluster.mirror_bootstrap, topic, 100_000, 64 << 20, {"linger.ms": "5"})
    tap_port = int(sasl_cluster.tap_bootstrap.rsplit(":", 1)[1])
    t = TapThread(
        [ListenerSpec("127.0.0.1", tap_port, *sasl_cluster.broker, 1, "SASL_PLAINTEXT")],
        sink,
        TapSettings(capture="full"),
    ).start()
    data_topic = f"sasl-{uuid.uuid4().hex[:6]}"
    new_password = "n3w-Scram-Passw0rd-" + uuid.uuid4().hex
    salt = b"kpmon-salt-" + uuid.uuid4().hex.encode()
    try:
        admin = AdminClient(sasl_cluster.client("PLAIN"))
        for fut in admin.create_topics([NewTopic(data_topic, 1, 1)]).values():
            fut.result(30)
        for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            producer = Producer(sasl_cluster.client(mechanism))
            producer.produce(data_topic, mechanism.encode())
            assert producer.flush(30) == 0, mechanism
            del producer
        consumer = Consumer(
            {**sasl_cluster.client("SCRAM-SHA-512"), "group.id": "g-sasl", "auto.offset.reset": "earliest"}
        )
        consumer.subscribe([data_topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value() or b"")
        consumer.close()
        assert sorted(got) == [b"PLAIN", b"SCRAM-SHA-256", b"SCRAM-SHA-512"]
        # A credential change carries Salt and SaltedPassword in AlterUserScramCredentials.
        upsert = UserScramCredentialUpsertion(
            "kpmon-new-user",
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
            new_password.encode(),
            salt,
        )
        for fut in admin.alter_user_scram_credentials([upsert]).values():
            fut.result(30)
        del admin
        t.wait_idle()
        sink.close(10)
        records = read_topic(sasl_cluster.mirror_bootstrap, topic)
    finally:
        t.stop()
    salted = hashlib.pbkdf2_hmac("sha256", new_password.encode(), salt, 4096)
    secrets = [new_password.encode(), salt, salted] + [pw.encode() for _, pw in sasl_cluster.users.values()]
    for record in records:
        for secret in secrets:
            assert secret not in record.key
            assert secret not in record.value
            assert all(secret not in v for v in record.headers.values())
    check_tap_topic(records)
    redacted = {p.redacted for _, p in parts(records)}
    assert ("AuthBytes",) in redacted
    assert ("Upsertions[].Salt", "Upsertions[].SaltedPassword") in redacted


def test_legacy_handshake_v0_raw_tokens_against_a_3_9_broker(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """SaslHandshake v0 (removed in 4.0) with a real 3.9 broker: raw tokens are tracked, never mirrored."""
    import socket
    import struct

    import codec
    from deploy.versions import KAFKA_LEGACY
    from tap.mirror import MemoryMirror

    try:
        from deploy.local.stack import LocalStack  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pytest.skip("deploy.local.stack is missing")
    port = free_port()
    stack = LocalStack(
        tmp_path_factory.mktemp("legacy-sasl"),
        version=KAFKA_LEGACY,
        sasl=True,
        advertised={1: ("127.0.0.1", port)},
    )
    sink = MemoryMirror()
    try:
        start_stack(stack)
        b = stack.listen_endpoints[0]
        t = TapThread(
            [ListenerSpec("127.0.0.1", port, b.host, b.port, 1)], sink, TapSettings(capture="full")
        ).start()
        user, password = stack.sasl_users["PLAIN"]

        def send(sock: socket.socket, payload: bytes) -> bytes:
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            return sock.recv(size, socket.MSG_WAITALL) if size else b""

        try:
            with socket.create_connection(("127.0.0.1", port), 10) as sock:
                hs = send(sock, codec.encode_request(17, 0, 1, "legacy", {"Mechanism": "PLAIN"}))
                assert codec.decode_response(hs, 17, 0).body["ErrorCode"] == 0
                assert send(sock, f"\0{user}\0{password}".encode()) == b""  # PLAIN success: empty token
                req = codec.encode_request(
                    18, 3, 2, "legacy", {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"}
                )
                resp = codec.decode_response(send(sock, req), 18, 3)
                assert resp.body["ErrorCode"] == 0 and resp.correlation_id == 2
            t.wait_idle()
        finally:
            t.stop()
    finally:
        stack.down()
    for record in sink.records:
        assert password.encode() not in record.value
    dirs = [(r.seq, r.kind, p.direction, p.api_key, p.redacted) for r, p in parts(sink.records)]
    # The handshake and ApiVersions are exchanges; the raw tokens have no correlation id, so each is
    # a record of its own.
    assert dirs == [
        (1, "open", "open", None, ()),
        (2, "ex", "req", 17, ()),
        (2, "ex", "resp", 17, ()),
        (3, "req", "req", None, ("sasl_token",)),
        (4, "resp", "resp", None, ("sasl_token",)),
        (5, "ex", "req", 18, ()),
        (5, "ex", "resp", 18, ()),
        (6, "close", "close", None, ()),
    ]
