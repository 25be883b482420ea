"""The real-client matrix's scenarios: Java kafka-clients 4.4 (``tests/java``, KpmonMatrix compiled with
javac against the cached jars), librdkafka (confluent-kafka), kafka-python and raw frames (the codec over
a socket, where no real client would send the frame). Each takes the tap's bootstrap address first and
returns what happened, for ``ScenarioTap.run``.
"""

from __future__ import annotations

import struct
import subprocess
import time
import uuid
from typing import Any

import codec
from codec.protocol import ApiKey, ErrorCode
from kpmon.traffic.raw_client import RawKafkaClient
from kpmon.traffic.violations import _drain, _join_connect_member
from kpmon.traffic.workload import create_topic
from tests.java.harness import main_command, streams_command

JAVA_KAFKA = "4.4.0"
TIMEOUT = 30.0


# -- Java kafka-clients 4.4 --------------------------------------------------------------------------


def _java(*args: str, timeout: float = 180) -> dict[str, str]:
    """Run KpmonMatrix; its ``key=value`` lines."""
    done = subprocess.run(
        main_command(JAVA_KAFKA, "kpmon.KpmonMatrix", *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"KpmonMatrix {args[0]} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def java_clean(bootstrap: str, topic: str, out_topic: str, group: str) -> dict[str, Any]:
    create_topic(bootstrap, topic)
    create_topic(bootstrap, out_topic)
    return {"scenario": "java_clean", **_java("clean", bootstrap, topic, out_topic, group)}


def java_share(bootstrap: str, topic: str, group: str) -> dict[str, Any]:
    create_topic(bootstrap, topic)
    return {"scenario": "java_share", **_java("share", bootstrap, topic, group)}


def java_zombie(bootstrap: str, topic: str, transactional_id: str) -> dict[str, Any]:
    create_topic(bootstrap, topic)
    return {"scenario": "java_zombie", **_java("zombie", bootstrap, topic, transactional_id)}


def java_streams(bootstrap: str, topic: str, out_topic: str, application_id: str) -> dict[str, Any]:
    """A real Kafka Streams app (``tests/java/streams``) on the KIP-1071 streams protocol."""
    create_topic(bootstrap, topic, partitions=1)
    create_topic(bootstrap, out_topic, partitions=1)
    done = subprocess.run(
        streams_command(bootstrap, topic, out_topic, application_id),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"KpmonStreams exited {done.returncode}:\n{done.stderr[-4000:]}")
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return {"scenario": "java_streams", **lines}


# -- librdkafka ----------------------------------------------------------------------------------------


def _rdkafka_producer(bootstrap: str, name: str, transactional_id: str) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "client.id": name,
            "linger.ms": 0,
            "message.timeout.ms": 10_000,
        }
    )


def librdkafka_zombie_on_add_partitions(bootstrap: str, topic: str, transactional_id: str) -> dict[str, Any]:
    """The issue's case: the fenced instance's next transaction starts with AddPartitionsToTxn, which
    the coordinator answers INVALID_PRODUCER_EPOCH; librdkafka raises _FENCED and sends no Produce."""
    from confluent_kafka import KafkaException

    create_topic(bootstrap, topic)
    zombie = _rdkafka_producer(bootstrap, "kpmon-rdkafka-zombie", transactional_id)
    zombie.init_transactions(TIMEOUT)
    fencer = _rdkafka_producer(bootstrap, "kpmon-rdkafka-fencer", transactional_id)
    fencer.init_transactions(TIMEOUT)  # bumps the epoch
    outcome = "accepted"
    try:
        zombie.begin_transaction()
        zombie.produce(topic, b"after-fence", partition=0)
        zombie.flush(TIMEOUT)
        zombie.commit_transaction(TIMEOUT)
    except KafkaException as exc:
        outcome = f"rejected: {exc.args[0].name() if exc.args else exc}"
    fencer.begin_transaction()
    fencer.produce(topic, b"from-fencer", partition=0)
    fencer.commit_transaction(TIMEOUT)
    fencer.close()
    zombie.close()
    return {"scenario": "librdkafka_zombie", "zombie_write": outcome}


def librdkafka_kip848_and_migration(
    bootstrap: str, topic: str, group: str, migrating_group: str
) -> dict[str, Any]:
    """Clean: a librdkafka consume-transform-produce with a KIP-848 consumer (``group.protocol=consumer``),
    and a KIP-848 online migration: a kafka-python classic member holds a group, then a librdkafka
    member with the consumer protocol joins it (the broker converts the group)."""
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaConsumer

    create_topic(bootstrap, topic)
    out_topic = f"{topic}-out"
    create_topic(bootstrap, out_topic)
    seed = _rdkafka_producer(bootstrap, "kpmon-rdkafka-seed", f"{group}-seed")
    seed.init_transactions(TIMEOUT)
    seed.begin_transaction()
    for i in range(10):
        seed.produce(topic, b"v%d" % i, partition=0)
    seed.commit_transaction(TIMEOUT)
    seed.close()

    def kip848(name: str, group_id: str) -> Any:
        return Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group_id,
                "group.protocol": "consumer",
                "client.id": name,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )

    consumer = kip848("kpmon-rdkafka-kip848", group)
    ctp = _rdkafka_producer(bootstrap, "kpmon-rdkafka-ctp", f"{group}-ctp")
    ctp.init_transactions(TIMEOUT)
    consumer.subscribe([topic])
    moved = 0
    deadline = time.monotonic() + 40
    ctp.begin_transaction()
    while moved < 10 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.error() is not None:
            continue
        ctp.produce(out_topic, msg.value(), partition=0)
        moved += 1
    position = [TopicPartition(topic, 0, 10)]
    ctp.send_offsets_to_transaction(position, consumer.consumer_group_metadata(), TIMEOUT)
    ctp.commit_transaction(TIMEOUT)
    ctp.close()
    consumer.close()

    classic = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=migrating_group,
        client_id="kpmon-kpy-classic",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not classic.assignment() and time.monotonic() < deadline:
            classic.poll(timeout_ms=500)
        # A consumer-protocol member joins the classic group: the broker converts it (KIP-848 online
        # migration) and has the classic member rejoin. A few heartbeats are enough to see it.
        joiner = kip848("kpmon-rdkafka-migrating", migrating_group)
        joiner.subscribe([topic])
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            joiner.poll(0.2)
            classic.poll(timeout_ms=100)
        joiner.close()
    finally:
        classic.close()
    return {"scenario": "librdkafka_kip848", "ctp_moved": moved}


# -- kafka-python ----------------------------------------------------------------------------------------


def kafka_python_zombie(bootstrap: str, topic: str, transactional_id: str) -> dict[str, Any]:
    """The zombie wrote in its transaction before the fence; its commit (EndTxn) comes after it."""
    from kafka import KafkaProducer

    create_topic(bootstrap, topic)

    def producer(name: str) -> KafkaProducer:
        return KafkaProducer(bootstrap_servers=bootstrap, client_id=name, transactional_id=transactional_id)

    zombie = producer("kpmon-kpy-zombie")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send(topic, b"before-fence", partition=0).get(TIMEOUT)
    fencer = producer("kpmon-kpy-fencer")
    fencer.init_transactions()
    outcome = "accepted"
    try:
        zombie.commit_transaction()
    except Exception as exc:  # kafka-python raises its own error classes for a fence
        outcome = f"rejected: {type(exc).__name__}"
    zombie.close(timeout=5)
    fencer.begin_transaction()
    fencer.send(topic, b"from-fencer", partition=0).get(TIMEOUT)
    fencer.commit_transaction()
    fencer.close(timeout=5)
    return {"scenario": "kafka_python_zombie", "zombie_write": outcome}


# -- raw frames --------------------------------------------------------------------------------------------


def _newest(raw: RawKafkaClient, api: int) -> int:
    return raw.versions[api][1]


#: Answers a real client retries: the coordinator is loading, moving or not there yet.
RETRIABLE = frozenset(
    {
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    }
)


def _request(raw: RawKafkaClient, api: int, version: int, body: dict[str, Any]) -> codec.Response:
    """Send ``body`` again while the answer is a retriable coordinator error, as a real client does (a
    broker that just started loads its transaction and group coordinators first)."""
    for _ in range(40):
        response = raw.request(api, version, body)
        assert response is not None
        if response.body.get("ErrorCode") not in RETRIABLE:
            return response
        time.sleep(0.5)
    raise AssertionError(f"{codec.api_name(api)}: the coordinator never became ready")


def _find_coordinator(bootstrap: str, key: str, key_type: int) -> str:
    """The coordinator's address for a group (0) or transactional id (1); asking creates the internal
    topic behind it on a fresh broker, so ask until it answers."""
    with RawKafkaClient(bootstrap) as raw:
        raw.handshake()
        body = _request(raw, ApiKey.FIND_COORDINATOR, 3, {"Key": key, "KeyType": key_type}).body
        assert body["ErrorCode"] == 0, body
        return f"{body['Host']}:{body['Port']}"


def raw_zombie(bootstrap: str, topic: str, transactional_id: str, group: str) -> dict[str, Any]:
    """A zombie that sends AddOffsetsToTxn, TxnOffsetCommit and EndTxn with its fenced epoch: the RPCs
    no real client sends after it learned of the fence."""
    create_topic(bootstrap, topic)
    answers: dict[str, int] = {}
    coordinator = _find_coordinator(bootstrap, transactional_id, 1)
    _find_coordinator(bootstrap, group, 0)
    with (
        RawKafkaClient(coordinator, client_id="kpmon-raw-zombie") as zombie,
        RawKafkaClient(coordinator, client_id="kpmon-raw-fencer") as fencer,
    ):
        zombie.handshake()
        fencer.handshake()
        init = {
            "TransactionalId": transactional_id,
            "TransactionTimeoutMs": 60000,
            "ProducerId": -1,
            "ProducerEpoch": -1,
        }
        version = min(_newest(zombie, ApiKey.INIT_PRODUCER_ID), 4)
        first = _request(zombie, ApiKey.INIT_PRODUCER_ID, version, init)
        assert first.body["ErrorCode"] == 0, first
        pid, epoch = first.body["ProducerId"], first.body["ProducerEpoch"]
        second = _request(fencer, ApiKey.INIT_PRODUCER_ID, version, init)
        assert second.body["ErrorCode"] == 0, second
        ids = {"TransactionalId": transactional_id, "ProducerId": pid, "ProducerEpoch": epoch}
        offsets = zombie.request(
            ApiKey.ADD_OFFSETS_TO_TXN, _newest(zombie, ApiKey.ADD_OFFSETS_TO_TXN), {**ids, "GroupId": group}
        )
        assert offsets is not None
        answers["AddOffsetsToTxn"] = offsets.body["ErrorCode"]
        commit = zombie.request(
            ApiKey.TXN_OFFSET_COMMIT,
            min(_newest(zombie, ApiKey.TXN_OFFSET_COMMIT), 3),
            {
                **ids,
                "GroupId": group,
                "GenerationIdOrMemberEpoch": -1,
                "MemberId": "",
                "GroupInstanceId": None,
                "Topics": [{"Name": topic, "Partitions": [{"PartitionIndex": 0, "CommittedOffset": 1}]}],
            },
        )
        assert commit is not None
        answers["TxnOffsetCommit"] = commit.body["Topics"][0]["Partitions"][0]["ErrorCode"]
        end = zombie.request(
            ApiKey.END_TXN, min(_newest(zombie, ApiKey.END_TXN), 4), {**ids, "Committed": True}
        )
        assert end is not None
        answers["EndTxn"] = end.body["ErrorCode"]
        return {"scenario": "raw_zombie", "producer_id": pid, "fenced_epoch": epoch, "answers": answers}


def _heartbeat(raw: RawKafkaClient, group: str, member: str, epoch: int, topic: str) -> codec.Response:
    body: dict[str, Any] = {
        "GroupId": group,
        "MemberId": member,
        "MemberEpoch": epoch,
        "InstanceId": None,
        "RackId": None,
        "RebalanceTimeoutMs": 30000 if epoch == 0 else -1,
        "SubscribedTopicNames": [topic] if epoch == 0 else None,
        "ServerAssignor": None,
        "TopicPartitions": [] if epoch == 0 else None,
    }
    return _request(raw, ApiKey.CONSUMER_GROUP_HEARTBEAT, _newest(raw, ApiKey.CONSUMER_GROUP_HEARTBEAT), body)


def member_epoch_fencing(bootstrap: str, topic: str, group: str) -> dict[str, Any]:
    """A KIP-848 member joins, then heartbeats twice with an epoch the coordinator never gave it."""
    create_topic(bootstrap, topic)
    with RawKafkaClient(_find_coordinator(bootstrap, group, 0), client_id="kpmon-raw-member") as raw:
        raw.handshake()
        member = uuid.uuid4().hex[:22]
        joined = _heartbeat(raw, group, member, 0, topic)
        assert joined.body["ErrorCode"] == 0, joined.body
        epoch = int(joined.body["MemberEpoch"])
        wrong = epoch + 10
        errors = [int(_heartbeat(raw, group, member, wrong, topic).body["ErrorCode"]) for _ in range(2)]
        left = _heartbeat(raw, group, member, -1, topic)
    return {
        "scenario": "member_epoch_fencing",
        "member": member,
        "epoch": epoch,
        "sent": wrong,
        "errors": errors,
        "left": left.body["ErrorCode"],
    }


def kip848_member_in_a_connect_group(bootstrap: str, group: str) -> dict[str, Any]:
    """A classic member with protocol type ``connect`` holds ``group``; a KIP-848 member asks to join."""
    coordinator = _find_coordinator(bootstrap, group, 0)
    with RawKafkaClient(coordinator, client_id="kpmon-connect-member") as holder:
        holder.handshake()
        join_error = _join_connect_member(holder, group)
        for _ in range(40):
            if join_error not in RETRIABLE:
                break
            time.sleep(0.5)
            join_error = _join_connect_member(holder, group)
        assert join_error == 0, join_error
        with RawKafkaClient(coordinator, client_id="kpmon-kip848-intruder") as raw:
            raw.handshake()
            answer = _heartbeat(raw, group, uuid.uuid4().hex[:22], 0, "unused-topic")
    return {
        "scenario": "kip848_in_connect_group",
        "join_error": join_error,
        "heartbeat_error": answer.body["ErrorCode"],
    }


def undecodable_version(bootstrap: str) -> dict[str, Any]:
    """ApiVersions, then Metadata v99: a version neither the broker nor any codec defines."""
    with RawKafkaClient(bootstrap, client_id="kpmon-v99-client") as raw:
        advertised = raw.handshake()
        raw.correlation_id += 1
        cid = raw.client_id.encode()
        # Request header v2 (flexible): api key, version, correlation id, client id, no tagged fields.
        header = struct.pack(">hhih", ApiKey.METADATA, 99, raw.correlation_id, len(cid)) + cid + b"\x00"
        raw.send_frame(header + b"\x01\x00\x00")
        outcome = _drain(raw)
    return {"scenario": "undecodable_version", "advertised": advertised[ApiKey.METADATA], "broker": outcome}


def decodable_version(bootstrap: str) -> dict[str, Any]:
    """ApiVersions, then InitProducerId at the codec's newest version, which the broker does not advertise
    (4.4's unstable latest, KIP-939's v6): a well-formed request the codec decodes, out of range."""
    with RawKafkaClient(bootstrap, client_id="kpmon-unadvertised-client") as raw:
        advertised = raw.handshake()[ApiKey.INIT_PRODUCER_ID]
        version = codec.supported_versions(ApiKey.INIT_PRODUCER_ID)[1]
        if version <= advertised[1]:
            raise AssertionError(
                f"the broker advertises InitProducerId v{advertised}: pick another unadvertised version"
            )
        body = {
            "TransactionalId": None,
            "TransactionTimeoutMs": 60000,
            "ProducerId": -1,
            "ProducerEpoch": -1,
            "Enable2Pc": False,
            "KeepPreparedTxn": False,
        }
        raw.request(ApiKey.INIT_PRODUCER_ID, version, body, expect_response=False)
        outcome = _drain(raw)
    return {"scenario": "decodable_version", "advertised": advertised, "version": version, "broker": outcome}
