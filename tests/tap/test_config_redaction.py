"""Password-type config values set or read by real admin clients never reach the tap topic.

confluent-kafka (librdkafka), kafka-python and the Java admin client (``kafka-topics``) send
CreateTopics, AlterConfigs, IncrementalAlterConfigs and DescribeConfigs with secret values through a
real tap to a real broker. Every byte of the tap topic (keys, values, header values) is then searched
for every secret, and each request is shown to have crossed the tap (its record names the redacted
config), so a scan that finds nothing cannot be a scan of nothing. The figures go to docs/security.md.
"""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from codec.protocol import ApiKey
from tests.tap.conftest import TappedCluster
from tests.tap.harness import TapRecord, read_topic_range, secret_count
from tests.tap.helpers import parts
from tests.tap.test_real_clients import check_tap_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Per (client, RPC): the config set, and its secret value.
Case = tuple[str, ApiKey, str, str]


def _secret(tag: str) -> str:
    return f"kpmon-Secret-{tag}-{uuid.uuid4().hex}"


def _quietly(call: Callable[[], Any]) -> None:
    """The broker may refuse a config (a password is not a topic config); the request still crossed."""
    try:
        call()
    except Exception:
        pass


def _settle(futures: dict[Any, Any]) -> None:
    for future in futures.values():
        _quietly(partial(future.result, 30))


def _confluent(bootstrap: str, broker_id: int) -> list[Case]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    broker = str(broker_id)
    cases: list[Case] = []

    name, value = "ssl.keystore.password", _secret("confluent-create")
    topic = NewTopic(f"cfg-{uuid.uuid4().hex[:6]}", 1, 1, config={name: value, "retention.ms": "60000"})
    _settle(admin.create_topics([topic]))
    cases.append(("confluent-kafka", ApiKey.CREATE_TOPICS, name, value))

    name, value = "listener.name.internal.ssl.key.password", _secret("confluent-alter")
    resource = ConfigResource(ResourceType.BROKER, broker, set_config={name: value})
    _settle(admin.alter_configs([resource]))
    cases.append(("confluent-kafka", ApiKey.ALTER_CONFIGS, name, value))

    name, value = "listener.name.internal.plain.sasl.jaas.config", _secret("confluent-incremental")
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.BROKER, broker, incremental_configs=[entry])
    _settle(admin.incremental_alter_configs([resource]))
    cases.append(("confluent-kafka", ApiKey.INCREMENTAL_ALTER_CONFIGS, name, value))

    try:
        for f in admin.describe_configs([ConfigResource(ResourceType.BROKER, broker)]).values():
            f.result(30)
    except KafkaException as exc:
        raise AssertionError(f"DescribeConfigs failed: {exc}") from exc
    return cases


def _in_own_process(client: Callable[[str, int], list[Case]], bootstrap: str, broker_id: int) -> list[Case]:
    """Run a librdkafka client in a child process, so its connections are closed when it returns.

    An ``AdminClient`` has no ``close()``: librdkafka closes its broker connections only when the
    Python object is freed, and once in a full suite run it outlived ``gc.collect()`` and kept a
    tapped connection open. A child's exit closes its sockets whatever still refers to the client.
    """
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(client, bootstrap, broker_id).result(300)


def _kafka_python(bootstrap: str, broker_id: int) -> list[Case]:
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewTopic as KNewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kpmon-kafka-python")
    cases: list[Case] = []
    try:
        name, value = "sasl.jaas.config", _secret("kafka-python-create")
        topic = KNewTopic(f"cfg-{uuid.uuid4().hex[:6]}", 1, 1, topic_configs={name: value})
        _quietly(lambda: admin.create_topics([topic]))
        cases.append(("kafka-python", ApiKey.CREATE_TOPICS, name, value))
        for incremental, api in ((False, ApiKey.ALTER_CONFIGS), (True, ApiKey.INCREMENTAL_ALTER_CONFIGS)):
            name, value = (
                "listener.name.internal.ssl.truststore.password",
                _secret(f"kafka-python-{api.name}"),
            )
            resource = KConfigResource(ConfigResourceType.BROKER, str(broker_id), configs={name: value})
            _quietly(
                lambda r=resource, i=incremental: admin.alter_configs(  # type: ignore[misc]
                    [r], raise_on_unknown=False, incremental=i
                )
            )
            cases.append(("kafka-python", api, name, value))
        admin.describe_configs([KConfigResource(ConfigResourceType.BROKER, str(broker_id))])
    finally:
        admin.close()
    return cases


def _java(bootstrap: str, broker_id: int) -> list[Case]:
    """The Java admin client (kafka-clients of the broker's release), run by ``JavaConfigAdmin.java``."""
    from deploy.local.distribution import fetch_distribution, libs_dir
    from deploy.versions import KAFKA_LATEST

    fetch_distribution(KAFKA_LATEST)
    create = ("ssl.truststore.password", _secret("java-create"))
    alter = ("listener.name.internal.ssl.keystore.password", _secret("java-incremental"))
    done = subprocess.run(
        [
            *(
                "java",
                "-cp",
                f"{libs_dir(KAFKA_LATEST)}/*",
                str(Path(__file__).with_name("JavaConfigAdmin.java")),
            ),
            *(bootstrap, str(broker_id), f"cfg-{uuid.uuid4().hex[:6]}", "=".join(create), "=".join(alter)),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0 and "DescribeConfigs ok" in done.stdout, done.stdout + done.stderr[-2000:]
    return [
        ("java", ApiKey.CREATE_TOPICS, *create),
        ("java", ApiKey.INCREMENTAL_ALTER_CONFIGS, *alter),
    ]


def _redacted_requests(records: list[TapRecord], api: ApiKey, name: str) -> int:
    return sum(
        1
        for _, part in parts(records)
        if part.direction == "req" and part.api_key == api and f"config:{name}" in part.redacted
    )


def test_password_configs_never_reach_the_tap_topic(tapped_cluster: TappedCluster) -> None:
    t, tap_topic = tapped_cluster.start_tap(capture="full")
    try:
        cases = _in_own_process(_confluent, tapped_cluster.bootstrap, tapped_cluster.broker_id)
        cases += _kafka_python(tapped_cluster.bootstrap, tapped_cluster.broker_id)
        if shutil.which("java") is not None:
            cases += _java(tapped_cluster.bootstrap, tapped_cluster.broker_id)
        t.wait_mirrored(60)
        t.tap.sink.close(10)
        records = read_topic_range(tapped_cluster.mirror_bootstrap, tap_topic)
    finally:
        t.stop()
    check_tap_topic(records)
    figures = []
    for client, api, name, value in cases:
        crossed = _redacted_requests(records, api, name)
        found = secret_count(records, value.encode())
        figures.append(
            f"{client:16} {api.name:28} {name:48} requests redacted={crossed} secret bytes found={found}"
        )
        assert crossed >= 1, f"{client} {api.name}: no mirrored request names {name}"
        assert found == 0, f"{client} {api.name}: secret found {found} times in the tap topic"
    described = [
        part
        for _, part in parts(records)
        if part.direction == "resp" and part.api_key == ApiKey.DESCRIBE_CONFIGS
    ]
    assert described, "no DescribeConfigs response was mirrored"
    print("\n" + "\n".join(figures))
