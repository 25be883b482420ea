"""The whole monitor for real: real clients -> the tap -> the tap topic -> the Spark job -> hooks.

One story, shared by the tests below (a Spark start costs tens of seconds here):
1. the job starts with its webhook receiver down;
2. a clean workload of real clients runs through the tap;
3. real clients make catalogue violations happen (zombie producer, mixed-protocol group), and
   malformed records are written straight into the tap topic;
4. the job is killed with SIGKILL mid-stream, while more violations happen (out-of-range versions,
   an Envelope from a client, a malformed frame), then restarted on the same checkpoint;
5. the webhook receiver comes up; every alert must arrive, with the ids that the reference (the same
   tap records through one in-process monitor and alert book) gives.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from checks.alerts import AlertBook, AlertContext
from checks.model import Severity
from kpmon.traffic import violations, workload
from tests.checks.tapped import read_tap_frames
from tests.streaming.hooks.receiver import Receiver
from tests.streaming.jobproc import KeepTrafficFlowing, StreamProcess, batch_results, write_config
from tests.tap.harness import TappedCluster, TapThread, topic_end_offsets

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: What the real clients' violations must raise.
REAL_RULES = {
    "producer.stale_epoch_rejected",
    "group.protocol_type_mismatch",
    "apiversions.out_of_range",
    "apiversions.removed_version_rejected",  # Produce v2: a 4.x broker closes the connection (KIP-896)
    "envelope.untrusted_source",
    "frame.decode_error",
}
WAIT_SECONDS = 240.0
#: Long enough that the synthetic scenario (written with event times up to 31 s in the past) is not
#: late: it covers the rules no real client can be made to break (a broker accepting a stale epoch...).
LATENESS_SECONDS = 40.0
CLUSTER = "e2e-cluster"
RUNBOOK_BASE = "https://runbooks.example/kpmon/runbook.md"


@dataclass
class Story:
    cluster: TappedCluster
    tap: TapThread
    topic: str
    alerts_topic: str
    receiver: Receiver
    job: StreamProcess
    clean_range: tuple[dict[int, int], dict[int, int]]
    injected: dict[str, int]
    synthetic_rules: set[str]
    killed_at_batch: int
    webhook_up_at: float
    reference: dict[str, Any] = field(default_factory=dict)


def _end_offsets(bootstrap: str, topic: str, timeout: float = 60.0) -> dict[int, int]:
    """The topic's end offsets, once a just-created topic has its leaders."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    while True:
        try:
            return topic_end_offsets(bootstrap, topic)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _drained(tap: TapThread, timeout: float = 30.0) -> None:
    """Every record the tap took is in the tap topic (the keep-alive consumer stays connected)."""
    deadline = time.monotonic() + timeout
    time.sleep(1.0)  # connections the scenario closed have sent their last frames
    while tap.tap.sink.depth() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not tap.tap.sink.depth(), "the tap's mirror did not drain"


def _inject_malformed(bootstrap: str, topic: str) -> dict[str, int]:
    """Records in the tap topic that no codec can read: garbage frames and a foreign record."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    conn = f"injected-{uuid.uuid4().hex[:6]}"
    now = time.time_ns()
    for seq, value in enumerate([b"\xff\xff\x00", b"\x00\x12\x00\x09garbage"]):
        headers = {"dir": "req", "conn": conn, "seq": str(seq), "ts_ns": str(now + seq), "capture": "full"}
        producer.produce(topic, key=conn.encode(), value=value, headers=list(headers.items()))
    producer.produce(topic, key=b"not-a-tap", value=b"hello from something else")
    producer.flush(30)
    return {"garbage_frames": 2, "foreign_records": 1}


def _inject_scenario(bootstrap: str, topic: str) -> set[str]:
    """Every rule family of the catalogue, as tap records of synthetic connections; returns its rules."""
    from confluent_kafka import Producer

    from tests.checks.test_sharding import scenario, single_run
    from tests.streaming.test_stages import tap_record

    frames = scenario()
    base = time.time_ns() - max(f.ts_ns for f in frames) - 1_000_000_000
    producer = Producer({"bootstrap.servers": bootstrap})
    for frame in frames:
        frame.ts_ns += base
        frame.conn = f"synthetic-{frame.conn}"
        headers, value, _, _ = tap_record(frame)
        producer.produce(topic, key=frame.conn.encode(), value=value, headers=list(headers.items()))
    producer.flush(30)
    return {f.rule for f in single_run(scenario())}


def _reference(mirror: str, topic: str) -> dict[str, Any]:
    """What an uninterrupted monitor makes of the same tap records: alerts by id, above info."""
    import checks

    # Read back partition by partition, so put them in event-time order, as the job's watermark does.
    frames = sorted(read_tap_frames(mirror, topic), key=lambda f: (f.ts_ns, f.conn, f.seq))
    monitor = checks.new_monitor(checks.ChecksSettings(watermark_seconds=LATENESS_SECONDS))
    findings = monitor.feed_all(frames) + monitor.flush()
    # The job's alert context comes from its config: the same cluster gives the same ids.
    book = AlertBook(AlertContext(CLUSTER, RUNBOOK_BASE))
    alerts = {}
    for finding in sorted(findings, key=lambda f: f.ts_ns):
        alert = book.add(finding)
        alerts[alert.id] = alert
    return {"frames": len(frames), "alerts": alerts}


def _alerts_topic_records(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    from tests.tap.harness import read_topic_range

    return [json.loads(r.value) for r in read_topic_range(bootstrap, topic)]


@pytest.fixture(scope="module")
def story(tapped_cluster: TappedCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    home = tmp_path_factory.mktemp("stream-e2e")
    topic = f"kpmon.tap.{uuid.uuid4().hex[:8]}"
    alerts_topic = f"kpmon.alerts.{uuid.uuid4().hex[:8]}"
    mirror = tapped_cluster.mirror_bootstrap
    workload.create_topic(mirror, topic, partitions=2)  # two partitions: cross-partition event time
    tap, _ = tapped_cluster.start_tap(topic=topic, capture="headers")
    receiver = Receiver()  # the webhook is down until step 5
    config = {
        "cluster": CLUSTER,
        "state_dir": str(home / "state"),
        "kafka": {"bootstrap_servers": tapped_cluster.bootstrap},
        "tap": {"topic": topic, "cluster": {"bootstrap_servers": mirror}},
        "stream": {
            "master": "local[2]",
            "shuffle_partitions": 2,
            "trigger_seconds": 1.0,
            "metrics_port": None,
            "stall_seconds": 300,
        },
        "checks": {"watermark_seconds": LATENESS_SECONDS},
        "alerts": {
            "runbook_base_url": RUNBOOK_BASE,
            "hooks": [
                {
                    "kind": "webhook",
                    "url": receiver.url,
                    "min_severity": "info",
                    "backoff_initial_seconds": 0.2,
                    "backoff_max_seconds": 2.0,
                },
                {"kind": "kafka", "topic": alerts_topic},
                {"kind": "log"},
            ],
        },
    }
    started = time.monotonic()

    def step(what: str) -> None:
        print(f"[stream-e2e +{time.monotonic() - started:5.1f}s] {what}", file=sys.stderr, flush=True)

    job = StreamProcess(write_config(home / "kpmon.yaml", config), home / "state", home / "job.log").start()
    # Not the tap topic: consuming it through the tap would mirror its own records back into it.
    keepalive = KeepTrafficFlowing(tapped_cluster.bootstrap, f"quiet-{uuid.uuid4().hex[:6]}").start()
    try:
        step("job started; clean workload")
        before = _end_offsets(mirror, topic)
        workload.clean_round(tapped_cluster.bootstrap, f"clean-{uuid.uuid4().hex[:6]}", "clean-group")
        _drained(tap)
        clean_range = (before, _end_offsets(mirror, topic))
        step("violations")
        violations.zombie_producer(tapped_cluster.bootstrap, "zombie-topic", f"tx-{uuid.uuid4().hex[:6]}")
        violations.mixed_protocol_group(
            tapped_cluster.bootstrap, f"mixed-{uuid.uuid4().hex[:6]}", "mixed-topic"
        )
        injected = _inject_malformed(mirror, topic)
        step("waiting for the first batches")
        job.wait_batches(1, timeout=WAIT_SECONDS)
        killed_at = job.batch_id()
        job.kill9()
        step(f"killed at batch {killed_at}; more violations")
        violations.out_of_range_versions(tapped_cluster.bootstrap)
        violations.envelope_from_client(tapped_cluster.bootstrap)
        violations.malformed_frame(tapped_cluster.bootstrap)
        _drained(tap)
        job.start()
        step("restarted; writing the synthetic every-rule scenario")
        synthetic = _inject_scenario(mirror, topic)
        # 5. the webhook comes back
        time.sleep(5)
        receiver.start()
        up_at = time.time()
        result = Story(
            tapped_cluster,
            tap,
            topic,
            alerts_topic,
            receiver,
            job,
            clean_range,
            injected,
            synthetic,
            killed_at,
            up_at,
        )
        result.reference = _reference(mirror, topic)
        step(f"webhook up; waiting for {len(result.reference['alerts'])} alerts")
        expected = set(result.reference["alerts"])
        arrived = receiver.wait_for(
            lambda reqs: expected <= {r.body["id"] for r in reqs}, timeout=WAIT_SECONDS
        )
        step("all alerts arrived" if arrived else f"not every alert arrived within {WAIT_SECONDS:.0f} s")
        job.check_alive()
        yield result
    finally:
        keepalive.stop()
        job.stop()
        receiver.stop()
        tap.stop()


def test_every_violation_alerts_through_the_webhook(story: Story) -> None:
    rules = {r.body["rule"] for r in story.receiver.requests}
    assert rules >= REAL_RULES, f"missing {REAL_RULES - rules}; job log:\n{story.job.tail()}"


def test_every_catalogue_rule_alerts_end_to_end(story: Story) -> None:
    """The synthetic scenario breaks every family; each one's alert went through the job to the webhook."""
    assert len(story.synthetic_rules) >= 15
    synthetic = {r.body["rule"] for r in story.receiver.requests if "synthetic-" in json.dumps(r.body)}
    assert story.synthetic_rules <= synthetic, sorted(story.synthetic_rules - synthetic)


def test_kill_9_and_restart_lose_no_alert_and_invent_none(story: Story) -> None:
    assert story.killed_at_batch >= 1
    reference = story.reference["alerts"]
    assert {r.rule for r in reference.values()} >= REAL_RULES
    webhook = {
        r.body["id"]: r.body for r in story.receiver.requests if not r.body["rule"].startswith("quality.")
    }
    missing = set(reference) - set(webhook)
    invented = set(webhook) - set(reference)
    assert not missing, [(reference[i].rule, reference[i].subject) for i in missing]
    assert not invented, [(webhook[i]["rule"], webhook[i]["subject"]) for i in invented]


def test_every_alert_says_which_cluster_and_links_its_runbook(story: Story) -> None:
    from checks.alerts import runbook_anchor

    bodies = [r.body for r in story.receiver.requests]
    assert bodies
    for body in bodies:
        assert body["cluster"] == CLUSTER
        assert body["runbook_url"] == f"{RUNBOOK_BASE}#{runbook_anchor(body['rule'])}"


def test_alerts_reach_the_alerts_topic_keyed_by_id(story: Story) -> None:
    records = _alerts_topic_records(story.cluster.mirror_bootstrap, story.alerts_topic)
    ids = {r["id"] for r in records}
    # The Kafka hook keeps its default min_severity: warning.
    assert {i for i, a in story.reference["alerts"].items() if a.severity != Severity.INFO} <= ids


def test_webhook_outage_is_ridden_out(story: Story) -> None:
    # Alerts of violations that happened while the receiver was down arrived once it came up.
    early = [r for r in story.receiver.requests if r.body["first_seen"] / 1e9 < story.webhook_up_at - 5]
    assert early, "some alerts were raised before the webhook came up"


def test_malformed_records_are_findings_and_the_job_keeps_running(story: Story) -> None:
    results = batch_results(story.job.paths)
    decode_errors = [
        f
        for b in results
        for f in b["findings"]
        if f["rule"] == "frame.decode_error" and "injected" in f["subject"]
    ]
    foreign = [f for b in results for f in b["findings"] if "not a tap record" in f["summary"]]
    assert len(decode_errors) >= story.injected["garbage_frames"] and foreign
    story.job.check_alive()
    assert story.job.batch_id() > story.killed_at_batch


def test_clean_workload_raises_no_alert_above_info(story: Story) -> None:
    start, end = story.clean_range

    def in_clean(offsets: list[list[int]]) -> bool:
        # [partition, offset], and a schema-3 record's entry index after them when not its first.
        return bool(offsets) and all(start.get(at[0], 0) <= at[1] < end.get(at[0], 0) for at in offsets)

    published = [r.body for r in story.receiver.requests if r.body["severity"] != "info"]
    noisy = [
        a for a in published if a["evidence"] and all(in_clean(e.get("offsets") or []) for e in a["evidence"])
    ]
    assert not noisy, [(a["rule"], a["subject"], a["summary"]) for a in noisy]
