"""The canary: a tap-topic window in event-time order, the checks over it, and the comparison rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_dags.canary import (
    alert_keys,
    compare,
    finding_in_window,
    processed_offsets,
    replay,
    running_alerts,
)
from airflow_dags.tapwindow import TapRecord, Window, choose_window, merge_in_time, read_window
from kpconfig.model import KafkaClusterConfig
from tests.airflow_dags.traffic import produce, round_frames, tap_records
from tests.checks.exchanges import exchange_records, flatten
from tests.checks.test_sharding import CONFIG, scenario, single_run
from tests.streaming.test_stages import schema_2_record


def record(partition: int, offset: int, ts_ns: int) -> TapRecord:
    return TapRecord({"dir": "req", "ts_ns": str(ts_ns)}, None, partition, offset, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 50), max_size=15), min_size=1, max_size=4), st.randoms())
def test_time_merge_orders_by_event_time_and_keeps_every_record(parts: list[list[int]], rnd: Any) -> None:
    streams = [[record(p, o, ts) for o, ts in enumerate(sorted(tss))] for p, tss in enumerate(parts)]
    # Arrival interleaves partitions arbitrarily, but each partition stays in offset order.
    cursors = [0] * len(streams)
    arrival = []
    while any(c < len(s) for c, s in zip(cursors, streams, strict=True)):
        p = rnd.choice([i for i, s in enumerate(streams) if cursors[i] < len(s)])
        arrival.append(streams[p][cursors[p]])
        cursors[p] += 1
    merged = merge_in_time(arrival, range(len(streams)))
    assert sorted(merged, key=lambda r: (r.partition, r.offset)) == sorted(
        arrival, key=lambda r: (r.partition, r.offset)
    )
    assert [r.ts_ns for r in merged] == sorted(r.ts_ns for r in merged)


def test_a_record_that_is_not_from_a_tap_sorts_by_its_kafka_timestamp() -> None:
    assert TapRecord({}, b"x", 0, 0, 1234).ts_ns == 1234 * 1_000_000


def records_of(frames: list[Any]) -> list[TapRecord]:
    """``frames`` (as ``round_frames`` lists them) as the schema-2 tap records the tap writes."""
    out = []
    for offset, record in enumerate(tap_records(frames)):
        _h, value, _p, _o = schema_2_record(record)
        out.append(TapRecord({}, value, 0, offset, 0))
    return out


def test_replay_raises_what_one_monitor_raises() -> None:
    frames = flatten(exchange_records(scenario()))
    result = replay(records_of(frames), CONFIG)
    # Offsets are the records' (0..n-1), not the builders': compare on (rule, subject, severity).
    expected = alert_keys([f.to_dict() for f in single_run(frames)])
    assert alert_keys(result.alerts) == expected
    assert result.records == len(tap_records(frames))
    assert result.findings_by_rule["envelope.untrusted_source"] == 1
    assert {a["status"] for a in result.alerts} == {"firing", "resolved"}  # txn.hanging resolves at 30 s
    assert all("evidence" not in a for a in result.alerts)


def test_alert_keys_fold_like_the_alert_book() -> None:
    items: list[dict[str, Any]] = [
        {"rule": "producer.sequence_gap", "subject": "pid:1", "severity": "warning", "incomplete": True},
        {"rule": "producer.sequence_gap", "subject": "pid:1", "severity": "info"},
        {"rule": "envelope.untrusted_source", "subject": "conn:x", "severity": "warning"},
        {"rule": "envelope.untrusted_source", "subject": "conn:x", "severity": "critical"},
        {"rule": "quality.decode_error_rate", "subject": "batch", "severity": "critical"},
        {"rule": "ops.redeploy_rolled_back", "subject": "stream:x", "severity": "critical"},
    ]
    assert alert_keys(items) == {
        ("producer.sequence_gap", "pid:1"): "info",
        ("envelope.untrusted_source", "conn:x"): "critical",
    }


def test_which_running_findings_belong_to_the_window() -> None:
    window = Window("t", {0: 10, 1: 0}, {0: 20, 1: 5})
    inside = {
        "rule": "r",
        "subject": "s",
        "severity": "warning",
        "ts_ns": 0,
        "evidence": {"offsets": [[0, 3], [0, 12]]},
    }
    outside = {**inside, "evidence": {"offsets": [[0, 20], [1, 5], [2, 0]]}}
    by_time = {**inside, "ts_ns": 50, "evidence": {"conn": "c", "seq": 1}}
    assert finding_in_window(inside, window, None)
    assert not finding_in_window(outside, window, None)
    assert finding_in_window(by_time, window, (40, 60)) and not finding_in_window(by_time, window, (51, 60))
    assert not finding_in_window(by_time, window, None)
    batches: list[dict[str, Any]] = [
        {"findings": [inside, {**outside, "subject": "other"}]},
        {"findings": []},
    ]
    assert running_alerts(batches, window, None) == {("r", "s"): "warning"}


def test_processed_offsets_from_a_progress_file() -> None:
    progress = {"sources": [{"endOffset": json.dumps({"tap": {"0": 42, "1": 7}}), "latestOffset": None}]}
    assert processed_offsets(progress, "tap") == {0: 42, 1: 7}
    assert processed_offsets({"sources": [{"endOffset": {"tap": {"0": 3}}}]}, "tap") == {0: 3}
    assert processed_offsets(progress, "other") is None
    assert processed_offsets(None, "tap") is None


def test_compare_tells_regressions_from_window_edges() -> None:
    running = {("a", "1"): "critical", ("b", "2"): "critical", ("c", "3"): "warning", ("d", "4"): "info"}
    new = {("a", "1"): "critical", ("e", "5"): "warning"}
    baseline = {("a", "1"): "critical", ("c", "3"): "warning", ("d", "4"): "info"}
    result = compare(running, new, baseline)
    assert (result.running, result.new, result.matched) == (4, 2, 1)
    causes = {(d.rule, d.cause) for d in result.missing}
    assert causes == {("b", "window edge"), ("c", "regression"), ("d", "regression")}
    assert [(d.rule, d.severity) for d in result.extra] == [("e", "warning")]
    assert result.failures("critical") == []  # the lost criticals are all window edges
    assert result.failures("any") == ["warning c on 3 (regression)", "info d on 4 (regression)"]
    assert result.failures("report") == []
    with pytest.raises(ValueError):
        result.failures("strict")
    blind = compare(running, new, None)
    assert {d.cause for d in blind.missing} == {"unexplained"}
    assert blind.failures("critical") == ["critical b on 2 (unexplained)"]


# -- against a real broker ------------------------------------------------------------------------------


@pytest.mark.integration
def test_window_of_a_real_topic_and_the_command_line(kafka_stack: Any, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"kpmon-canary-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    frames = round_frames(0, 10**18)
    produce(kafka_stack.bootstrap_servers, topic, frames)  # keyed by connection: both partitions get some
    written = len(tap_records(frames))
    cluster = KafkaClusterConfig(bootstrap_servers=kafka_stack.bootstrap_servers)
    window = choose_window(cluster, topic, minutes=5)
    assert window.size == written and set(window.start) == {0, 1}
    records = list(read_window(cluster, window))
    assert len(records) == written
    # Merged by time, each partition in its own order (a held request's record is written after
    # records of later frames, so a partition's clocks need not rise).
    for part in (0, 1):
        mine = [r.offset for r in records if r.partition == part]
        assert mine == sorted(mine)
    assert len({r.partition for r in records}) == 2
    # A window in the future is empty; an end below the topic's end is respected.
    assert choose_window(cluster, topic, minutes=-5).size == 0
    capped = choose_window(cluster, topic, minutes=5, end={0: window.start[0] + 1})
    assert capped.end[0] == window.start[0] + 1 and capped.end[1] == window.end[1]

    config = tmp_path / "kpmon.yaml"
    config.write_text(
        f"kafka: {{bootstrap_servers: '{kafka_stack.bootstrap_servers}'}}\n"
        f"tap: {{topic: {topic}}}\nchecks: {{watermark_seconds: 2.0}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "airflow_dags.canary", "--config", str(config), "--minutes", "5"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    out = json.loads(done.stdout)
    assert out["replay"]["records"] == written
    read = Window.from_dict(out["window"])
    assert (read.start, read.end) == (window.start, window.end)
    expected = alert_keys([f.to_dict() for f in single_run(frames)])
    assert alert_keys(out["replay"]["alerts"]) == expected
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_dags.canary",
            "--config",
            str(config),
            "--window",
            json.dumps(out["window"]),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert json.loads(again.stdout)["replay"]["alerts"] == out["replay"]["alerts"]
    missing = subprocess.run(
        [sys.executable, "-m", "airflow_dags.canary", "--config", str(config), "--minutes", "5"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KPMON__TAP__TOPIC": "no-such-topic"},
    )
    assert missing.returncode == 1 and "not found" in missing.stderr
