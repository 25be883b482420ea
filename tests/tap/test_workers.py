"""``tap.workers: 2``: a real ``kpmon tap`` process in front of the real broker, driven by real clients.

Connections are spread over both workers, every frame is mirrored, payloads arrive unchanged, a killed
worker is restarted while the other's connections live on, and SIGTERM drains every worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer

from codec.taprecord import parse_records
from tests.tap.conftest import TappedCluster, free_port
from tests.tap.harness import TapRecord, by_connection, read_topic
from tests.tap.helpers import FakeBroker, api_versions_request, frame
from tests.tap.test_listeners import _Broker, _broker, _brokers_via, _call
from tests.tap.test_real_clients import _create_topic, check_tap_topic
from tests.tap.test_tls import TlsFakeBroker, _cert

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


class TapProcess:
    """``python -m kpmon.cli tap`` with a config file; its JSON log events collected as they come."""

    def __init__(
        self,
        cluster: TappedCluster,
        tmp: Path,
        workers: int = 2,
        capture: str = "full",
        topic: str | None = None,
        tap: dict[str, Any] | None = None,
        mirror: dict[str, str] | None = None,
    ) -> None:
        """``topic``: the tap topic (a new one by default); ``tap``: more ``tap`` settings; ``mirror``:
        more properties of the mirror producer."""
        self.topic = topic or f"kpmon.tap.{uuid.uuid4().hex[:8]}"
        self.capture = capture
        self.metrics_port = free_port()
        host, port = cluster.tap_addr
        config = {
            "kafka": {"bootstrap_servers": cluster.mirror_bootstrap},
            "tap": {
                "listeners": [
                    {
                        "listen": f"{host}:{port}",
                        "broker": f"{cluster.broker[0]}:{cluster.broker[1]}",
                        "broker_id": cluster.broker_id,
                    }
                ],
                "topic": self.topic,
                "capture": capture,
                "workers": workers,
                "instance_id": "wtest",
                "metrics_port": self.metrics_port,
                "cluster": {
                    "bootstrap_servers": cluster.mirror_bootstrap,
                    "properties": {"linger.ms": "5", **(mirror or {})},
                },
                **(tap or {}),
            },
        }
        path = tmp / "kpmon.yaml"
        path.write_text(yaml.safe_dump(config))
        self.events: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kpmon.cli", "tap", "--config", str(path)],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                self.events.append({"event": "text", "msg": line})

    def wait_for(
        self, event: str, count: int = 1, timeout: float = 60.0, **fields: object
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            found = [
                e
                for e in list(self.events)
                if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
            ]
            if len(found) >= count:
                return found
            assert self.proc.poll() is None or event in ("worker_stopped",), (
                f"tap exited: {self.events[-20:]}"
            )
            assert time.monotonic() < deadline, f"no {event} {fields} in {timeout}s: {self.events[-20:]}"
            time.sleep(0.05)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        return sum(
            v
            for (sample, lbls), v in self.metrics().items()
            if sample == name and all(dict(lbls).get(k) == x for k, x in labels.items())
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        self._reader.join(10)
        return code


@pytest.fixture
def tap_process(
    tapped_cluster: TappedCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[TapProcess]:
    tap = TapProcess(tapped_cluster, tmp_path, capture=getattr(request, "param", "full"))
    try:
        tap.wait_for("ready")
        yield tap
    finally:
        if tap.proc.poll() is None:
            tap.proc.kill()
            tap.proc.wait(10)


def _worker_of(conn: bytes) -> str:
    """Connection ids are ``<instance>-<worker>.<incarnation>-<n>``: the worker and its incarnation
    ("" for the tap's start record, keyed ``<instance>.<incarnation>``)."""
    return [*conn.decode().split("-"), ""][1]


def _spawn_tap(
    command: list[str],
) -> tuple[subprocess.Popen[str], list[dict[str, Any]], threading.Thread]:
    """``command`` (a ``kpmon.cli`` argv, from ``sys.executable``) as a child process, the JSON events
    its log writes (filled as they come), and the thread that reads them (join it after the child)."""
    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    events: list[dict[str, Any]] = []

    def read() -> None:
        assert proc.stderr is not None
        events.extend(json.loads(line) for line in proc.stderr if line.startswith("{"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, events, reader


async def _ready(proc: subprocess.Popen[str], events: list[dict[str, Any]]) -> None:
    deadline = time.monotonic() + 60
    while not any(e.get("event") == "ready" for e in list(events)):
        assert proc.poll() is None and time.monotonic() < deadline, f"tap not ready: {events}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("tap_process", ["full", "headers", "meta"], indirect=True)
def test_two_workers_spread_connections_and_mirror_every_frame(
    tapped_cluster: TappedCluster, tap_process: TapProcess
) -> None:
    tap = tap_process
    topic = f"t-{uuid.uuid4().hex[:6]}"
    _create_topic(tapped_cluster.bootstrap, topic)
    producer = Producer(
        {"bootstrap.servers": tapped_cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    sent = [os.urandom(200 + i) for i in range(300)]
    for i, value in enumerate(sent):
        producer.produce(topic, value, f"k{i % 7}".encode())
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
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < len(sent) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.append(msg.value() or b"")
    consumer.close()
    assert sorted(got) == sorted(sent), "payloads changed or lost on the way through the workers"

    # Every connection closed in both workers (each publishes its metrics about once a second).
    deadline = time.monotonic() + 30
    while tap.metric("kpmon_tap_active_connections") or tap.metric("kpmon_tap_connections_total") < 4:
        assert time.monotonic() < deadline, "connections still open in the workers"
        time.sleep(0.2)
    time.sleep(1.5)  # one more publication: counters taken after the last close
    forwarded = tap.metric("kpmon_tap_frames_total")
    per_worker = {
        dict(labels)["worker"]
        for (name, labels) in tap.metrics()
        if name == "kpmon_tap_mirror_queue_capacity"
    }
    assert per_worker == {"0", "1"}, "each worker's mirror queue is its own series"
    assert tap.metric("kpmon_tap_mirror_drops_total") == 0
    assert tap.stop() == 0

    records = read_topic(tapped_cluster.mirror_bootstrap, tap.topic)
    counts = check_tap_topic(records, tap.capture)
    assert counts["req"] + counts["resp"] == forwarded, "frames mirrored != frames forwarded"
    workers = {_worker_of(conn).split(".")[0] for conn, _ in by_connection(records)}
    assert workers == {"0", "1"}, f"connections not spread over both workers: {workers}"


def _connect(addr: tuple[str, int]) -> socket.socket:
    return socket.create_connection(addr, timeout=10)


def _round_trip(sock: socket.socket, corr: int) -> bool:
    """An ApiVersions request answered with its correlation id: the connection works end to end."""
    try:
        sock.sendall(frame(api_versions_request(corr)))
        head = b""
        while len(head) < 4:
            chunk = sock.recv(4 - len(head))
            if not chunk:
                return False
            head += chunk
        (size,) = struct.unpack(">i", head)
        body = b""
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            if not chunk:
                return False
            body += chunk
    except OSError:
        return False
    return struct.unpack_from(">i", body)[0] == corr


def test_a_killed_worker_restarts_alone_and_stop_drains_every_worker(
    tapped_cluster: TappedCluster, tap_process: TapProcess
) -> None:
    tap = tap_process
    pids = {e["worker"]: e["pid"] for e in tap.wait_for("worker_start", 2)}
    # Handed over in turn: the first two connections land on different workers.
    first, second = _connect(tapped_cluster.tap_addr), _connect(tapped_cluster.tap_addr)
    assert _round_trip(first, 1) and _round_trip(second, 2)

    os.kill(pids[0], signal.SIGKILL)
    tap.wait_for("worker_exit", worker=0)
    tap.wait_for("worker_ready", 2, worker=0)
    alive = [_round_trip(first, 3), _round_trip(second, 4)]
    assert sorted(alive) == [False, True], f"exactly the killed worker's connection drops: {alive}"
    survivor = first if alive[0] else second
    later = [_connect(tapped_cluster.tap_addr) for _ in range(2)]
    assert all(_round_trip(sock, 10 + i) for i, sock in enumerate(later)), "new connections after the restart"

    assert tap.stop() == 0
    stopped = tap.wait_for("worker_stopped", 2)
    assert {e["worker"] for e in stopped} == {0, 1}
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for sock in [survivor, *later]:
        assert not _round_trip(sock, 99), "stopping closes every connection"
        sock.close()

    starts = [e["connections"] for e in tap.events if e.get("event") == "worker_start" and e["worker"] == 0]
    assert len(set(starts)) == 2, f"the restarted worker names its connections anew: {starts}"
    dead = starts[0].removeprefix("wtest-")
    # What the killed worker had not produced yet is lost with it; every other connection is complete.
    records = read_topic(tapped_cluster.mirror_bootstrap, tap.topic)
    drained: list[TapRecord] = [r for r in records if _worker_of(r.key) != dead]
    counts = check_tap_topic(drained)  # every connection of a stopped worker ends with its close record
    assert counts["conns"] == 3
    reasons = [
        json.loads(entry.parts[0].value or b"{}").get("reason")
        for r in drained
        for entry in parse_records(None, r.value)
        if entry.kind == "close"
    ]
    assert reasons.count("tap stopping") == 3


def test_listeners_opened_on_the_fly_are_shared_by_every_worker() -> None:
    """Broker 2 has no configured listener: whichever worker rewrites a Metadata response naming it,
    clients get the one listener the supervisor opened, and any worker forwards its connections."""

    async def run() -> None:
        one, two = _Broker([]), _Broker([])
        await one.start()
        await two.start()
        one.brokers = [
            _broker(1, one.port) | {"Host": "127.0.0.1"},
            _broker(2, two.port) | {"Host": "127.0.0.1"},
        ]
        port, metrics_port = free_port(), free_port()
        proc, events, reader = _spawn_tap(
            [
                *(sys.executable, "-m", "kpmon.cli", "tap", "--workers", "2", "--no-mirror"),
                *("--listen", f"127.0.0.1:{port}=127.0.0.1:{one.port}@1", "--rewrite-broker-addresses"),
                *("--metrics-port", str(metrics_port), "--instance-id", "wdyn"),
            ]
        )
        try:
            await _ready(proc, events)
            # Connections are handed over in turn: these four Metadata calls are rewritten by both workers.
            seen = [(await _brokers_via(("127.0.0.1", port)))[2] for _ in range(4)]
            assert len(set(seen)) == 1 and seen[0][1] not in (port, two.port), seen
            for corr in range(4):
                response = await _call(seen[0], api_versions_request(corr))
                assert struct.unpack_from(">i", response)[0] == corr
            assert two.api_keys == [18] * 4
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            assert 'kpmon_tap_dynamic_listeners_total{result="opened"} 1.0' in text
        finally:
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 60)
            reader.join(10)
            await one.stop()
            await two.stop()
        assert code == 0
        assert [e["event"] for e in events].count("dynamic_listener") == 1

    asyncio.run(run())


def test_workers_terminate_client_tls(tmp_path: Path) -> None:
    """Sockets are handed over before the TLS handshake: each worker terminates TLS itself."""
    broker_ca, broker_cert, broker_key = _cert(tmp_path, "broker")
    _, tap_cert, tap_key = _cert(tmp_path, "tap")

    async def run() -> None:
        broker_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        broker_ctx.load_cert_chain(broker_cert, broker_key)
        broker = TlsFakeBroker(broker_ctx)
        bport = await broker.start()
        port = free_port()
        listener = {
            "listen": f"127.0.0.1:{port}",
            "broker": f"127.0.0.1:{bport}",
            "broker_id": 1,
            "listener_name": "SSL",
            "tls_certfile": str(tap_cert),
            "tls_keyfile": str(tap_key),
            "broker_tls": True,
            "broker_cafile": str(broker_ca),
        }
        config = tmp_path / "kpmon.yaml"
        config.write_text(yaml.safe_dump({"tap": {"listeners": [listener], "workers": 2}}))
        proc, events, reader_thread = _spawn_tap(
            [
                sys.executable,
                "-m",
                "kpmon.cli",
                "tap",
                "--config",
                str(config),
                "--no-mirror",
                "--no-metrics",
            ]
        )
        try:
            await _ready(proc, events)
            client_ctx = ssl.create_default_context(cafile=str(tmp_path / "tap-ca.pem"))
            # Handed over in turn: one connection per worker.
            for corr in range(2):
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
                writer.write(frame(api_versions_request(corr)))
                await writer.drain()
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                assert struct.unpack_from(">i", await reader.readexactly(size))[0] == corr
                writer.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 60)
            reader_thread.join(10)
            await broker.stop()
        assert code == 0
        tls = [e["tls"] for e in events if e.get("event") == "broker_tls"]
        assert len(tls) == 2 and all(t["version"].startswith("TLS") for t in tls)
        assert {e["conn"].split("-")[-2].split(".")[0] for e in events if e.get("event") == "broker_tls"} == {
            "0",
            "1",
        }, "one TLS connection in each worker"

    asyncio.run(run())


def test_connections_queued_before_the_workers_are_up_are_shared() -> None:
    """Clients that connect while the workers start wait in the backlog, then go to every worker,
    not all to the first one up."""

    async def run() -> None:
        broker = FakeBroker()
        bport = await broker.start()
        port = free_port()
        proc, events, reader_thread = _spawn_tap(
            [
                *(sys.executable, "-m", "kpmon.cli", "tap", "--workers", "2", "--no-mirror", "--no-metrics"),
                *("--listen", f"127.0.0.1:{port}=127.0.0.1:{bport}@1", "--instance-id", "wq"),
            ]
        )
        try:
            deadline = time.monotonic() + 60
            clients: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
            while len(clients) < 4:
                try:
                    clients.append(await asyncio.open_connection("127.0.0.1", port))
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, "tap did not listen"
                    await asyncio.sleep(0.05)
            assert not any(e.get("event") == "worker_ready" for e in events), "connected too late to test"
            for corr, (reader, writer) in enumerate(clients):
                writer.write(frame(api_versions_request(corr)))
                await writer.drain()
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                assert struct.unpack_from(">i", await reader.readexactly(size))[0] == corr
                writer.close()
            while len([e for e in list(events) if e.get("event") == "close"]) < 4:
                assert time.monotonic() < deadline, f"connections not closed: {events}"
                await asyncio.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 60)
            reader_thread.join(10)
            await broker.stop()
        assert code == 0
        workers = [e["conn"].split("-")[1].split(".")[0] for e in events if e.get("event") == "close"]
        assert sorted(workers) == ["0", "0", "1", "1"], workers

    asyncio.run(run())
