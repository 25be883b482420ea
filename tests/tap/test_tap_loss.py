"""A tap that loses records is not the client's fault (issue 38), with real processes throughout.

A ``kpmon tap`` process in front of the real broker, idempotent and transactional librdkafka producers
through it, and records the tap holds lost three ways: a worker killed with SIGKILL, the whole tap killed
and restarted under the same fixed instance id, a mirror queue that overflows on connections that then
close. Each run checks that the clients delivered everything, that neither ``kpmon report`` nor the job's
stages (``LocalStages``, the job's router and stateful stage in one process) raise anything above
``info`` about a client or a broker, that the loss left its trace (``tap.*`` findings, incomplete
producer gaps naming the tap), and that a real sequence gap a raw client sends afterwards is still a
warning. The tap's mirror producer lingers, so the records it holds when it dies are many.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer

from checks.model import Severity
from checks.settings import ChecksSettings
from codec.protocol import ApiKey
from codec.records import build_record_batch
from codec.taprecord import TAP_EVENTS, frames_from_record, headers_dict, parse_records
from kpmon.traffic.raw_client import RawKafkaClient
from streaming.frames import record_rows
from streaming.stages import LocalStages
from tests.tap.conftest import TappedCluster
from tests.tap.harness import TapRecord, read_topic_range
from tests.tap.test_real_clients import _create_topic
from tests.tap.test_workers import TapProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: The tap's mirror producer waits this long before it sends: what it holds when it dies is lost.
LINGER = {"linger.ms": "1000"}


class Load:
    """Idempotent and transactional librdkafka producers writing through the tap until ``finish``."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        idempotent: int = 3,
        transactional: int = 1,
        client: dict[str, Any] | None = None,
    ) -> None:
        self.bootstrap, self.topic, self.client = bootstrap, topic, client or {}
        self.halt = threading.Event()
        #: Set: the producers send nothing (their connections go idle).
        self.paused = threading.Event()
        self.lock = threading.Lock()
        #: Values the broker acknowledged (idempotent) or that were committed (transactional).
        self.delivered: list[bytes] = []
        self.errors: list[str] = []
        self.threads = [
            *(threading.Thread(target=self._idempotent, args=(n,), daemon=True) for n in range(idempotent)),
            *(
                threading.Thread(target=self._transactional, args=(n,), daemon=True)
                for n in range(transactional)
            ),
        ]
        for thread in self.threads:
            thread.start()

    def count(self) -> int:
        with self.lock:
            return len(self.delivered)

    def wait_for(self, count: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while self.count() < count:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, f"{self.count()} of {count} delivered"
            time.sleep(0.1)

    def finish(self) -> None:
        self.halt.set()
        for thread in self.threads:
            thread.join(180)
            assert not thread.is_alive(), "a producer did not finish"

    def _config(self, name: str) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "client.id": name, "linger.ms": 5, **self.client}

    def _idempotent(self, n: int) -> None:
        producer = Producer({**self._config(f"idem-{n}"), "enable.idempotence": True})

        def delivered(err: Any, msg: Any) -> None:
            with self.lock:
                if err is not None:
                    self.errors.append(f"idem-{n}: {err}")
                else:
                    self.delivered.append(msg.value())

        i = 0
        while not self.halt.is_set():
            if self.paused.is_set():
                producer.poll(0.05)
                continue
            try:
                producer.produce(self.topic, f"i{n}-{i}".encode(), on_delivery=delivered)
                i += 1
            except BufferError:
                producer.poll(0.1)
            producer.poll(0)
            if i % 20 == 0:
                time.sleep(0.01)
        if producer.flush(180):
            self.errors.append(f"idem-{n}: not flushed")

    def _transactional(self, n: int) -> None:
        producer = Producer(
            {**self._config(f"txn-{n}"), "transactional.id": f"loss-{uuid.uuid4().hex[:6]}-{n}"}
        )
        producer.init_transactions(120)
        i = 0
        while not self.halt.is_set():
            if self.paused.is_set():
                producer.poll(0.05)
                continue
            values = [f"t{n}-{i}-{k}".encode() for k in range(20)]
            for _ in range(20):
                if self._transaction(producer, values):
                    break
            else:
                self.errors.append(f"txn-{n}: transaction {i} never committed")
                return
            with self.lock:
                self.delivered.extend(values)
            i += 1

    def _transaction(self, producer: Producer, values: list[bytes]) -> bool:
        """One transaction; False when it had to be aborted (the client is told, and sends it again)."""
        try:
            producer.begin_transaction()
            for value in values:
                producer.produce(self.topic, value)
            while True:
                try:
                    producer.commit_transaction(120)
                    return True
                except KafkaException as exc:
                    if not exc.args[0].retriable():
                        raise
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise
            producer.abort_transaction(120)
            return False


def consumed(bootstrap: str, topic: str, expected: int, timeout: float = 90.0) -> list[bytes]:
    """Every committed value of ``topic``, read straight from the broker (not through the tap)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append(msg.value() or b"")
        # Anything more (a duplicate) would come right after.
        end = time.monotonic() + 2
        while time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                out.append(msg.value() or b"")
    finally:
        consumer.close()
    return out


def gap_client(bootstrap: str, topic: str) -> int:
    """A raw client that really skips sequence numbers: an idempotent producer id, batch 0, then 5.
    Returns the producer id."""
    with RawKafkaClient(bootstrap, "kpmon-gap") as raw:
        raw.handshake()
        init = raw.request(
            ApiKey.INIT_PRODUCER_ID,
            4,
            {"TransactionalId": None, "TransactionTimeoutMs": 60000, "ProducerId": -1, "ProducerEpoch": -1},
        )
        assert init is not None and init.body["ErrorCode"] == 0
        pid, epoch = init.body["ProducerId"], init.body["ProducerEpoch"]
        for seq in (0, 5):
            batch = build_record_batch(
                [(None, b"gap")], producer_id=pid, producer_epoch=epoch, base_sequence=seq
            )
            raw.request(
                ApiKey.PRODUCE,
                9,
                {
                    "TransactionalId": None,
                    "Acks": -1,
                    "TimeoutMs": 30000,
                    "TopicData": [{"Name": topic, "PartitionData": [{"Index": 0, "Records": batch}]}],
                },
            )
    return int(pid)


def report(cluster: TappedCluster, topic: str, tmp: Path) -> list[dict[str, Any]]:
    """``kpmon report`` over the tap topic: its findings."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kpmon.cli",
            "report",
            "--topic",
            topic,
            "--bootstrap-servers",
            cluster.mirror_bootstrap,
            "--json",
            "-",
            "--out",
            str(tmp / "report.html"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert "tap worker deaths" in done.stderr  # the summary's header counts the tap's own losses
    findings: list[dict[str, Any]] = json.loads(done.stdout)["findings"]
    return findings


def job_findings(records: list[TapRecord]) -> list[dict[str, Any]]:
    """The job's router and stateful stage (``LocalStages``) over the tap topic, in micro-batches of
    500 records with the watermark Spark computes: their findings."""
    config = ChecksSettings()
    lateness = int(config.watermark_seconds * 1e9)
    stages = LocalStages(config, 4)
    rows = [
        row for r in records for row in record_rows(headers_dict(r.headers), r.value, r.partition, r.offset)
    ]
    out: list[Any] = []
    watermark_ms = newest = 0
    batches = [rows[i : i + 500] for i in range(0, len(rows), 500)]
    for n, batch in enumerate([*batches, []]):
        if n == len(batches):
            watermark_ms = newest // 1_000_000 + 1  # end of input: the watermark passes everything
        out.extend(stages.batch(batch, watermark_ms))
        newest = max([newest, *(int(row["ts_ns"] or 0) for row in batch)])
        watermark_ms = max(watermark_ms, (newest - lateness) // 1_000_000)
    return [json.loads(row.payload) for row in out if row.kind == "finding"]


def blaming(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings above ``info`` (as alerts count them: incomplete ones are ``info``) that are not about
    the tap itself: those blame a client or a broker."""
    return [
        f
        for f in findings
        if not f["incomplete"]
        and Severity(f["severity"]) > Severity.INFO
        and not f["rule"].startswith("tap.")
    ]


def check_the_aftermath(
    cluster: TappedCluster, tap_topic: str, pid: int, tmp: Path, event: str
) -> list[dict[str, Any]]:
    """What ``kpmon report`` and the job's stages make of the tap topic: the same verdicts. Returns
    the job's findings."""
    records = read_topic_range(cluster.mirror_bootstrap, tap_topic)
    readers = (("kpmon report", report(cluster, tap_topic, tmp)), ("the job's stages", job_findings(records)))
    for reader, findings in readers:
        rules = {f["rule"] for f in findings}
        assert f"tap.{event}" in rules, f"{reader}: the loss left no trace: {sorted(rules)}"
        real = [f for f in blaming(findings) if f["subject"] == f"producer:{pid}"]
        assert [f["rule"] for f in real] == ["producer.sequence_gap"], f"{reader}: the raw client's gap"
        others = [f for f in blaming(findings) if f not in real]
        assert not others, (
            f"{reader}: a tap loss blamed on a client or broker: {others[:3]}\n"
            + frames_around(records, others[0])
        )
    return readers[-1][1]


#: The transactional requests whose answers the txn rule waits for.
TXN_CONTROL = (ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.END_TXN)


def frames_around(records: list[TapRecord], finding: dict[str, Any], window_ns: int = 400_000_000) -> str:
    """The frames of the finding's connection and the tap's events, and every transactional request
    and answer (InitProducerId, AddPartitionsToTxn, EndTxn), within ``window_ns`` of it: what a failure
    needs to tell a lost record from a rule's mistake."""
    at, conn = int(finding["ts_ns"]), finding["evidence"].get("conn")
    lines = []
    for record in records:
        frames = frames_from_record(
            headers_dict(record.headers), record.value, record.partition, record.offset
        )
        for f in frames:
            wanted = f.conn == conn or f.direction in TAP_EVENTS or f.api_key in TXN_CONTROL
            if wanted and abs(f.ts_ns - at) <= window_ns:
                lines.append(
                    (
                        f.ts_ns,
                        f"{(f.ts_ns - at) / 1e6:+9.1f} ms {f.direction:11} api={f.api_key} {f.conn} "
                        f"corr={f.correlation_id} loss_ns={f.loss_ns} at={f.at()} lone={f.lone}",
                    )
                )
    return "\n".join(line for _, line in sorted(lines))


def excused_gaps(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        f
        for f in findings
        if f["rule"] == "producer.sequence_gap"
        and f["incomplete"]
        and f["severity"] == "info"
        and "tap may have lost records" in f["summary"]
    ]


@pytest.fixture
def data_topic(tapped_cluster: TappedCluster) -> str:
    topic = f"loss-{uuid.uuid4().hex[:6]}"
    _create_topic(tapped_cluster.mirror_bootstrap, topic, partitions=3)
    return topic


@pytest.fixture
def taps() -> Iterator[list[TapProcess]]:
    started: list[TapProcess] = []
    yield started
    for tap in started:
        if tap.proc.poll() is None:
            tap.proc.kill()
            tap.proc.wait(10)


def run_load(cluster: TappedCluster, topic: str, during: Any, client: dict[str, Any] | None = None) -> Load:
    """Producers through the tap; ``during(load)`` once they are under way, then as much load again."""
    load = Load(cluster.bootstrap, topic, client=client)
    try:
        load.wait_for(1500)
        # Past the mirror's linger: the streams' first batches are in the tap topic, so what the loss
        # then costs is the middle of each stream.
        time.sleep(2.5)
        during(load)
        load.wait_for(load.count() + 1500)
    finally:
        load.finish()
    assert not load.errors, load.errors[:5]
    got = consumed(cluster.mirror_bootstrap, topic, len(load.delivered))
    assert sorted(got) == sorted(load.delivered), "a client's message was lost or duplicated"
    return load


def test_a_worker_killed_under_idempotent_and_transactional_load_blames_nobody(
    tapped_cluster: TappedCluster, data_topic: str, taps: list[TapProcess], tmp_path: Path
) -> None:
    tap = TapProcess(tapped_cluster, tmp_path, workers=2, tap={"instance_id": "wloss"}, mirror=LINGER)
    taps.append(tap)
    tap.wait_for("ready")
    pids = {e["worker"]: e["pid"] for e in tap.wait_for("worker_start", 2)}

    def kill_a_worker(load: Load) -> None:
        # The worker with the most records not yet in the tap topic (its mirror lingers a second): the
        # one that carries producers' streams. Handed connections in turn, one worker may carry none.
        deadline = time.monotonic() + 10
        while True:
            depths = {w: tap.metric("kpmon_tap_mirror_queue_depth", worker=str(w)) for w in pids}
            busiest = max(depths, key=lambda w: depths[w])
            if depths[busiest] > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        os.kill(pids[busiest], signal.SIGKILL)
        tap.wait_for("worker_exit", worker=busiest)

    run_load(tapped_cluster, data_topic, kill_a_worker)
    assert tap.metric("kpmon_tap_worker_deaths_total") == 1
    time.sleep(1.5)  # the tap's mirror lingers: what the clients did is in the tap topic
    pid = gap_client(tapped_cluster.bootstrap, data_topic)
    assert tap.stop() == 0
    findings = check_the_aftermath(tapped_cluster, tap.topic, pid, tmp_path, "worker_lost")
    # The kill cost records the producers' streams went on from: their gaps read as the tap's.
    assert excused_gaps(findings), "the kill left no producer gap: the run did not test the excuse"


def test_the_whole_tap_killed_and_restarted_under_a_fixed_id_blames_nobody(
    tapped_cluster: TappedCluster, data_topic: str, taps: list[TapProcess], tmp_path: Path
) -> None:
    """One process, ``instance_id`` fixed (as the systemd unit's ``tap-%H``): SIGKILL, then a new tap
    under the same id. Its connection ids are new ones (issue 39), and what the dead one held is lost."""
    settings = {"instance_id": "rloss"}
    first = TapProcess(tapped_cluster, tmp_path, workers=1, tap=settings, mirror=LINGER)
    taps.append(first)
    first.wait_for("ready")

    def kill_and_restart(load: Load) -> None:
        first.proc.kill()
        first.proc.wait(10)
        second = TapProcess(
            tapped_cluster, tmp_path, workers=1, topic=first.topic, tap=settings, mirror=LINGER
        )
        taps.append(second)
        second.wait_for("ready")

    run_load(tapped_cluster, data_topic, kill_and_restart)
    time.sleep(1.5)
    pid = gap_client(tapped_cluster.bootstrap, data_topic)
    assert taps[-1].stop() == 0
    findings = check_the_aftermath(tapped_cluster, first.topic, pid, tmp_path, "tap_start")
    starts = [f["evidence"]["connections"] for f in findings if f["rule"] == "tap.tap_start"]
    assert len(set(starts)) == 2, f"each start names its connections anew: {starts}"
    assert excused_gaps(findings), "the kill left no producer gap: the run did not test the excuse"

    # Every connection id names one connection: one open record, then its records numbered from 1.
    by_key: dict[bytes, list[int]] = {}
    for record in read_topic_range(tapped_cluster.mirror_bootstrap, first.topic):
        for parsed in parse_records(None, record.value):
            if parsed.kind not in TAP_EVENTS:
                by_key.setdefault(record.key, []).append(parsed.seq)
    assert {key.decode().rsplit("-", 1)[0] for key in by_key} == {s.removesuffix("-*") for s in starts}
    for key, seqs in by_key.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"{key!r}: two connections under one id"


def test_a_mirror_queue_overflow_on_connections_that_then_close_blames_nobody(
    tapped_cluster: TappedCluster, data_topic: str, taps: list[TapProcess], tmp_path: Path
) -> None:
    """A queue of 20 records that drains once a second: most records are dropped. The producers then
    pause until their connections close as idle, and go on through new ones."""
    tap = TapProcess(
        tapped_cluster,
        tmp_path,
        workers=1,
        # A record per entry (schema 3 gathers a connection's entries): the 20-record queue overflows.
        tap={"instance_id": "oloss", "queue_max_frames": 20, "flush_max_entries": 1},
        mirror=LINGER,
    )
    taps.append(tap)
    tap.wait_for("ready")

    def idle_until_closed(load: Load) -> None:
        closed = len([e for e in list(tap.events) if e.get("event") == "close"])
        load.paused.set()
        tap.wait_for("close", closed + 4)  # each producer's connection, closed as idle
        load.paused.clear()

    run_load(tapped_cluster, data_topic, idle_until_closed, client={"connections.max.idle.ms": 1000})
    assert tap.metric("kpmon_tap_mirror_drops_total") > 0, "the queue never overflowed"
    time.sleep(1.5)  # the queue drains: the raw client's records all fit
    pid = gap_client(tapped_cluster.bootstrap, data_topic)
    assert tap.stop() == 0
    findings = check_the_aftermath(tapped_cluster, tap.topic, pid, tmp_path, "tap_start")
    if not excused_gaps(findings):
        # Which records the queue drops depends on the machine's load: sometimes a stream loses none
        # of its batches between two kept ones. Nothing was blamed (checked above); say the excuse
        # itself went untested rather than pass as if it had been.
        pytest.skip("the overflow left no producer gap this run: the excuse was not exercised")
