"""Catalogue violations made to happen for real, against a real broker (normally through the tap).

Each function drives real clients (confluent-kafka, kafka-python) or, where no real client would send
the frame, the codec over a raw socket. They return a short description of what they did, and never
leave a producer or consumer open.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Mapping
from typing import Any

import codec
from codec.protocol import ApiKey, ErrorCode
from codec.samples import random_request_body
from kpmon.traffic.raw_client import RawClientError, RawKafkaClient
from kpmon.traffic.workload import create_topic


def _drain(client: RawKafkaClient, seconds: float = 2.0) -> str:
    """After a request the broker should refuse: read whatever comes back until it closes."""
    client.sock.settimeout(seconds)
    try:
        client.read_frame()
        return "answered"
    except (RawClientError, OSError):
        return "closed"


def zombie_producer(
    bootstrap: str,
    topic: str,
    transactional_id: str,
    timeout: float = 30.0,
    properties: Mapping[str, Any] | None = None,
    create: bool = True,
) -> dict[str, Any]:
    """Two transactional producers share a transactional.id; the fenced one writes again (KIP-98).

    ``properties``: librdkafka settings for both producers (SASL, TLS); ``create=False`` when ``topic``
    exists already (docs/rollout.md's end-to-end check, where kpmon may not create topics)."""
    from confluent_kafka import KafkaException, Producer

    def producer(name: str) -> Producer:
        return Producer(
            {
                **(properties or {}),
                "bootstrap.servers": bootstrap,
                "transactional.id": transactional_id,
                "client.id": name,
                "linger.ms": 0,
                "message.timeout.ms": int(timeout * 1000),
            }
        )

    if create:
        create_topic(bootstrap, topic)
    zombie = producer("kpmon-zombie")
    zombie.init_transactions(timeout)
    zombie.begin_transaction()
    zombie.produce(topic, b"before-fence", partition=0)
    zombie.flush(timeout)
    fencer = producer("kpmon-fencer")
    fencer.init_transactions(timeout)  # bumps the epoch: the zombie is now fenced
    outcome = "accepted"
    try:
        zombie.produce(topic, b"after-fence", partition=0)
        zombie.flush(timeout)
        zombie.commit_transaction(timeout)
    except KafkaException as exc:
        outcome = f"rejected: {exc.args[0].name() if exc.args else exc}"
    fencer.begin_transaction()
    fencer.produce(topic, b"from-fencer", partition=0)
    fencer.commit_transaction(timeout)
    fencer.flush(timeout)
    return {"scenario": "zombie_producer", "transactional_id": transactional_id, "zombie_write": outcome}


def mixed_protocol_group(bootstrap: str, group: str, topic: str, timeout: float = 30.0) -> dict[str, Any]:
    """A kafka-python consumer holds ``group``; a raw member joins it with protocol type ``connect`` (KIP-559)."""
    from kafka import KafkaConsumer

    create_topic(bootstrap, topic)
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        client_id="kpmon-consumer-member",
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
    )
    try:
        deadline = time.monotonic() + timeout
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=500)
        with RawKafkaClient(_coordinator(bootstrap, group), client_id="kpmon-connect-member") as raw:
            raw.handshake()
            error = _join_connect_member(raw, group)
        return {"scenario": "mixed_protocol_group", "group": group, "join_error": error}
    finally:
        consumer.close()


def _coordinator(bootstrap: str, group: str) -> str:
    with RawKafkaClient(bootstrap) as raw:
        raw.handshake()
        response = raw.request(ApiKey.FIND_COORDINATOR, 3, {"Key": group, "KeyType": 0})
        assert response is not None
        body = response.body
        return f"{body['Host']}:{body['Port']}"


def _join_connect_member(raw: RawKafkaClient, group: str) -> int:
    body: dict[str, Any] = {
        "GroupId": group,
        "SessionTimeoutMs": 10000,
        "RebalanceTimeoutMs": 10000,
        "MemberId": "",
        "GroupInstanceId": None,
        "ProtocolType": "connect",
        "Protocols": [{"Name": "sessioned", "Metadata": b"\x00\x01"}],
    }
    for _ in range(2):
        response = raw.request(ApiKey.JOIN_GROUP, 5, body)
        assert response is not None
        error = int(response.body["ErrorCode"])
        if error != ErrorCode.MEMBER_ID_REQUIRED:
            return error
        body["MemberId"] = response.body["MemberId"]
    return error


def _send_unchecked(bootstrap: str, api_key: int, version: int, body: dict[str, Any]) -> str:
    """Handshake, then send one request whatever the broker advertised; the broker's reaction."""
    with RawKafkaClient(bootstrap, client_id="kpmon-old-client") as raw:
        raw.handshake()
        raw.correlation_id += 1
        raw.send_frame(codec.encode_request(api_key, version, raw.correlation_id, raw.client_id, body))
        return _drain(raw)


def out_of_range_versions(bootstrap: str) -> dict[str, Any]:
    """Requests outside the versions the broker advertised (KIP-35), and versions Kafka 4.0 removed (KIP-896).

    One connection per request: a broker closes the connection on a version it does not support.
    """
    sent: list[str] = []
    outcomes: list[str] = []
    with RawKafkaClient(bootstrap) as probe:
        advertised = probe.handshake()
    # Above the advertised maximum: an API whose newest version the broker does not advertise (an
    # unstable latest version), encoded with the codec, which knows it. Absent when the codec and the
    # broker know the same versions.
    for api_key, (lo, hi) in sorted(advertised.items()):
        codec_hi = codec.supported_versions(api_key)[1] if api_key in codec.api_keys() else -1
        if codec_hi <= hi or api_key == ApiKey.ENVELOPE:
            continue
        try:
            body = random_request_body(api_key, codec_hi, random.Random(1), unknown_tags=False)
            codec.encode_request(api_key, codec_hi, 0, "", body)
        except codec.EncodeError:
            continue
        outcomes.append(_send_unchecked(bootstrap, api_key, codec_hi, body))
        sent.append(f"{codec.api_name(api_key)} v{codec_hi} (advertised v{lo}-v{hi})")
        break
    # Below the advertised minimum: Fetch v3, which Kafka 4.0 removed and no longer advertises.
    lo, hi = advertised.get(1, (0, 0))
    fetch = {"ReplicaId": -1, "MaxWaitMs": 100, "MinBytes": 1, "MaxBytes": 1024, "Topics": []}
    outcomes.append(_send_unchecked(bootstrap, 1, 3, fetch))
    sent.append(f"Fetch v3 (advertised v{lo}-v{hi}, removed in 4.0)")
    # Removed in 4.0 but still advertised: 4.x brokers keep advertising Produce v0+ because old
    # librdkafka releases refuse to produce otherwise (KAFKA-18659), and reject v0-v2 when sent.
    lo, hi = advertised.get(0, (0, 0))
    outcomes.append(_send_unchecked(bootstrap, 0, 2, {"Acks": 1, "TimeoutMs": 1000, "TopicData": []}))
    sent.append(f"Produce v2 (advertised v{lo}-v{hi}, removed in 4.0)")
    return {"scenario": "out_of_range_versions", "sent": sent, "broker": "/".join(outcomes)}


def envelope_from_client(bootstrap: str) -> dict[str, Any]:
    """An Envelope (KIP-590) sent on an ordinary client connection, which only brokers may send."""
    inner = codec.encode_request(
        19, 7, 1, "forged-admin", {"Topics": [], "ValidateOnly": True, "TimeoutMs": 1000}
    )
    principal = struct.pack(">h", 0) + codec.encode_data(
        "DefaultPrincipalData", 0, {"Type": "User", "Name": "admin", "TokenAuthenticated": False}
    )
    with RawKafkaClient(bootstrap, client_id="kpmon-forger") as raw:
        raw.handshake()
        raw.correlation_id += 1
        frame = codec.encode_request(
            58,
            0,
            raw.correlation_id,
            raw.client_id,
            {
                "RequestData": inner,
                "RequestPrincipal": principal,
                "ClientHostAddress": socket.inet_aton("10.9.8.7"),
            },
        )
        raw.send_frame(frame)
        outcome = _drain(raw)
    return {"scenario": "envelope_from_client", "broker": outcome}


def malformed_frame(bootstrap: str) -> dict[str, Any]:
    """A frame with a valid size prefix and a body no codec can read."""
    with RawKafkaClient(bootstrap, client_id="kpmon-garbage") as raw:
        raw.handshake()
        # An ApiVersions v3 header followed by a compact string claiming more bytes than the frame has.
        garbage = struct.pack(">hhih", 18, 3, 99, 4) + b"junk" + b"\x00" + b"\x7f" + b"xx"
        raw.send_frame(garbage)
        outcome = _drain(raw)
    return {"scenario": "malformed_frame", "broker": outcome}


SCENARIOS = (
    "zombie_producer",
    "mixed_protocol_group",
    "out_of_range_versions",
    "envelope_from_client",
    "malformed_frame",
)
