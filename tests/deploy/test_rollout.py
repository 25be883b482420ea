"""docs/rollout.md followed step by step on this machine, with SASL_SSL everywhere clients are.

One real KRaft broker whose client listener is SASL_SSL (certificates made by the test), and a
plaintext inter-broker listener that stands in for the page's INTERNAL listener: kpmon's own traffic
(the mirror, the job, the alerts) goes there and never through a tap. The steps, as on the page:

1. the tap topic and the alerts topic, created by an admin;
2. `kpmon tap --config kpmon.yaml --listen ADDR`: the tap terminates the clients' TLS with its own
   certificate and opens TLS to the broker; its metrics endpoint answers;
3. the broker restarted to advertise the tap on its client listener (a rolling restart: Kafka cannot
   change advertised.listeners on a running broker, which this test also shows);
4. clients cut over: a SASL_SSL client bootstrapped on the tap stays on it, and the tap topic holds
   its decoded frames, not ciphertext;
5. the job (`kpmon stream`, local Spark standing in for the cluster) and `kpmon stream status`;
6. the end-to-end check: a fenced producer through the tap, its alert read back from the alerts topic;
7. a tap restarted under a live client, which reconnects and keeps producing;
8. rollback: the broker advertises itself again, clients leave the tap, the tap stops cleanly.

The ACL commands of the page are not run: the local stack has no authorizer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from codec import taprecord
from deploy.local.properties import TlsSpec
from deploy.local.stack import LocalStack
from deploy.local.tools import run_tool
from kpmon.traffic.violations import zombie_producer
from tests.certs import Ca, Issued, issue, make_ca
from tests.tap.harness import free_port, start_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
KPMON = str(Path(sys.executable).with_name("kpmon"))
MECHANISM = "SCRAM-SHA-512"
TAP_TOPIC, ALERTS_TOPIC, APP_TOPIC = "kpmon.tap", "kpmon.alerts", "rollout.app"


def wait_for(what: str, check: Any, timeout: float = 120.0, every: float = 0.5) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


@dataclass
class Site:
    """The monitored cluster and the files an operator would have on the tap's host."""

    directory: Path
    broker_ca: Ca
    tap_ca: Ca
    tap_cert: Issued
    tls: TlsSpec
    stack: LocalStack
    tap_port: int

    @property
    def internal(self) -> str:
        """The INTERNAL listener: kpmon's own clients, never tapped."""
        return self.stack.internal_bootstrap_servers

    @property
    def broker(self) -> str:
        (endpoint,) = self.stack.listen_endpoints
        return f"{endpoint.host}:{endpoint.port}"

    def client(self, bootstrap: str, ca: Path) -> dict[str, Any]:
        """A SASL_SSL client's librdkafka settings."""
        return {
            **self.stack.client_config(MECHANISM),
            "bootstrap.servers": bootstrap,
            "ssl.ca.location": str(ca),
        }

    def via_tap(self) -> dict[str, Any]:
        return self.client(f"127.0.0.1:{self.tap_port}", self.tap_ca.pem)

    def restart_advertising(self, advertised: tuple[str, int] | None) -> None:
        """A rolling restart of the (only) broker with its client listener advertised as ``advertised``."""
        self.stack.kill_broker(1, graceful=True)
        self.stack = LocalStack(
            self.stack.home, sasl=True, tls=self.tls, advertised={1: advertised} if advertised else None
        )
        start_stack(self.stack)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    directory = tmp_path_factory.mktemp("rollout")
    broker_ca, tap_ca = make_ca(directory, "broker"), make_ca(directory, "tap")
    broker_cert, tap_cert = issue(directory, broker_ca, "broker"), issue(directory, tap_ca, "tap")
    tls = TlsSpec(str(broker_cert.keystore), str(broker_ca.pem))
    stack = LocalStack(directory / "stack", sasl=True, tls=tls)
    start_stack(stack)
    found = Site(directory, broker_ca, tap_ca, tap_cert, tls, stack, free_port())
    try:
        yield found
    finally:
        found.stack.down()


def kpmon_config(site: Site) -> dict[str, Any]:
    """docs/rollout.md's kpmon.yaml, with this machine's addresses and files."""
    return {
        "state_dir": str(site.directory / "state"),
        "kafka": {"bootstrap_servers": site.internal},
        "tap": {
            "topic": TAP_TOPIC,
            "capture": "headers",
            "instance_id": "tap-rollout",
            "metrics_port": free_port(),
            "listeners": [
                {
                    "listen": f"127.0.0.1:{site.tap_port}",
                    "broker": site.broker,
                    "broker_id": 1,
                    "listener_name": "SASL_SSL",
                    "advertise": f"127.0.0.1:{site.tap_port}",
                    "tls_certfile": str(site.tap_cert.cert),
                    "tls_keyfile": str(site.tap_cert.key),
                    "broker_tls": True,
                    "broker_cafile": str(site.broker_ca.pem),
                }
            ],
        },
        "stream": {
            "master": "local[2]",
            "trigger_seconds": 2,
            "starting_offsets": "earliest",
            "shuffle_partitions": 2,
            "metrics_port": None,
        },
        "checks": {"watermark_seconds": 2},
        "quality": {"data_docs": False},
        "alerts": {"hooks": [{"kind": "kafka", "topic": ALERTS_TOPIC}]},
    }


class Tap:
    """`kpmon tap --config F --listen ADDR`, as a tap serving its host's broker runs it (docs/rollout.md,
    step 5): the `--listen` selects the configured listener and keeps its TLS settings."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.listen = str(yaml.safe_load(config.read_text())["tap"]["listeners"][0]["listen"])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, metrics_port: int) -> Tap:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [KPMON, "tap", "--config", str(self.config), "--listen", self.listen],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )
        wait_for("the tap's metrics endpoint", lambda: self.metrics(metrics_port) is not None, 60)
        return self

    def metrics(self, port: int) -> str | None:
        assert self.proc is not None
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                return str(answer.read().decode())
        except OSError:
            return None

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def counter(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def metadata_brokers(config: dict[str, Any]) -> set[str]:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient(config).list_topics(timeout=30)
    return {f"{b.host}:{b.port}" for b in metadata.brokers.values()}


def produce(config: dict[str, Any], values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({**config, "linger.ms": 0})
    for value in values:
        producer.produce(APP_TOPIC, value)
    assert producer.flush(60) == 0


def read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of ``topic`` (keys and values), read from the INTERNAL listener by assignment."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kpmon-read-{uuid.uuid4().hex[:6]}"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        out: list[tuple[bytes | None, bytes | None]] = []
        pending = {p for p, end in ends.items() if end > 0}
        while pending:
            message = consumer.poll(10)
            assert message is not None, f"{topic}: nothing more to read, {pending} unfinished"
            if message.error():
                continue
            out.append((message.key(), message.value()))
            offset, partition = message.offset(), message.partition()
            assert offset is not None and partition is not None
            if offset + 1 >= ends[partition]:
                pending.discard(partition)
        return out
    finally:
        consumer.close()


class KeepPolling:
    """A SASL_SSL consumer polling through the tap: live Fetches keep the event time, and the job's
    watermark, moving, as on any busy cluster."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer({**self.config, "group.id": "rollout-keepalive", "fetch.wait.max.ms": 300})
        consumer.subscribe([APP_TOPIC])
        try:
            while not self.stop_flag.is_set():
                consumer.poll(0.3)
        finally:
            consumer.close()

    def __enter__(self) -> KeepPolling:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_flag.set()
        self.thread.join(60)


def kpmon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KPMON, *args], capture_output=True, text=True, cwd=REPO, timeout=180, check=False)


def test_the_rollout_page_step_by_step(site: Site, tmp_path: Path) -> None:
    config = kpmon_config(site)
    config_file = tmp_path / "kpmon.yaml"
    config_file.write_text(yaml.safe_dump(config))
    metrics_port = config["tap"]["metrics_port"]

    # 1. The tap topic and the alerts topic, created by an admin (retention and cleanup as on the page).
    for topic, settings in (
        (TAP_TOPIC, ["--config", "cleanup.policy=delete"]),
        (ALERTS_TOPIC, []),
        (APP_TOPIC, []),
    ):
        done = run_tool(
            site.stack.version,
            "kafka-topics",
            [
                "--bootstrap-server",
                site.internal,
                "--create",
                "--topic",
                topic,
                "--partitions",
                "2",
                *settings,
            ],
        )
        assert done.returncode == 0, done.stderr
    described = run_tool(
        site.stack.version,
        "kafka-topics",
        ["--bootstrap-server", site.internal, "--describe", "--topic", TAP_TOPIC],
    )
    assert "cleanup.policy=delete" in described.stdout, described.stdout

    # 2. The tap, with its listener's TLS settings from the config.
    tap = Tap(config_file, tmp_path / "tap.log").start(metrics_port)
    stream = None
    try:
        # Before the broker advertises the tap, a client bootstrapped on it is sent to the broker itself.
        assert metadata_brokers(site.via_tap()) == {site.broker}

        # 3. Kafka refuses to change advertised.listeners on a running broker: a rolling restart it is.
        from confluent_kafka.admin import (
            AdminClient,
            AlterConfigOpType,
            ConfigEntry,
            ConfigResource,
            ResourceType,
        )

        entry = ConfigEntry(
            "advertised.listeners",
            f"SASL_SSL://127.0.0.1:{site.tap_port}",
            incremental_operation=AlterConfigOpType.SET,
        )
        change = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[entry])
        admin = AdminClient({"bootstrap.servers": site.internal})
        (future,) = admin.incremental_alter_configs([change]).values()
        with pytest.raises(Exception, match=r"advertised\.listeners"):
            future.result(30)
        del admin
        site.restart_advertising(("127.0.0.1", site.tap_port))
        assert metadata_brokers(site.client(site.broker, site.broker_ca.pem)) == {
            f"127.0.0.1:{site.tap_port}"
        }

        # 4. Clients cut over: bootstrapped on the tap (its CA), they stay on it, and it sees Kafka, not TLS.
        before = counter(tap.metrics(metrics_port) or "", "kpmon_tap_frames_total")
        assert metadata_brokers(site.via_tap()) == {f"127.0.0.1:{site.tap_port}"}
        produce(site.via_tap(), [b"one", b"two", b"three"])
        assert counter(tap.metrics(metrics_port) or "", "kpmon_tap_frames_total") > before

        def mirrored_apis() -> set[int]:
            """API keys of the tap topic's frames: decoded from the records, so not ciphertext."""
            return {
                part.api_key
                for _, value in read_all(site.internal, TAP_TOPIC)
                if value and taprecord.is_packed(value)
                for entry in taprecord.parse_records(None, value)
                for part in entry.parts
                if part.api_key is not None
            }

        # Produce, Metadata, ApiVersions, SASL: the mirror writes asynchronously, so wait for them.
        wait_for(
            "the clients' frames, decoded, in the tap topic", lambda: {0, 3, 17, 18} <= mirrored_apis(), 60
        )

        # 5. The job, and `kpmon stream status` until it says healthy.
        with (tmp_path / "stream.log").open("ab") as log:
            stream = subprocess.Popen(
                [KPMON, "stream", "--config", str(config_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )
        with KeepPolling(site.via_tap()):

            def healthy() -> bool:
                assert stream is not None and stream.poll() is None, (tmp_path / "stream.log").read_text()[
                    -3000:
                ]
                return kpmon("stream", "status", "--config", str(config_file)).returncode == 0

            wait_for("kpmon stream status: healthy", healthy, 300, 2)

            # 6. End to end: a fenced producer through the tap, its alert read back from the alerts topic.
            fenced = zombie_producer(
                site.via_tap()["bootstrap.servers"],
                APP_TOPIC,
                "rollout-e2e",
                properties=site.via_tap(),
                create=False,
            )
            assert fenced["zombie_write"].startswith("rejected"), fenced

            def alert() -> list[dict[str, Any]]:
                alerts = [json.loads(v) for _, v in read_all(site.internal, ALERTS_TOPIC) if v]
                return [a for a in alerts if a.get("rule") == "producer.stale_epoch_rejected"]

            (found, *_) = wait_for("the fenced producer's alert on kpmon.alerts", alert, 240, 2)
            assert found["severity"] == "warning"

        # The job stops gracefully (after its running batch); its status then says stopped.
        # `kpmon stream stop` waits until the job's pid is gone; the job is this test's child, so reap it.
        stopping = subprocess.Popen([KPMON, "stream", "stop", "--config", str(config_file)], cwd=REPO)
        assert stream.wait(180) == 0
        assert stopping.wait(60) == 0
        assert kpmon("stream", "status", "--config", str(config_file)).returncode == 3

        # 7. A tap restarted under a live client: librdkafka reconnects through the tap and goes on.
        from confluent_kafka import Producer

        producer = Producer({**site.via_tap(), "linger.ms": 0})
        producer.produce(APP_TOPIC, b"before the restart")
        assert producer.flush(60) == 0
        assert tap.stop() == 0
        tap = Tap(config_file, tmp_path / "tap.log").start(metrics_port)
        producer.produce(APP_TOPIC, b"after the restart")
        assert producer.flush(60) == 0
        del producer

        # 8. Rollback: the broker advertises itself again; clients bootstrapped on it leave the tap.
        site.restart_advertising(None)
        direct = site.client(site.broker, site.broker_ca.pem)
        assert metadata_brokers(direct) == {site.broker}
        produce(direct, [b"direct"])
        assert tap.stop() == 0
    finally:
        tap.kill()
        if stream is not None and stream.poll() is None:
            os.killpg(stream.pid, signal.SIGKILL)
            stream.wait(30)
