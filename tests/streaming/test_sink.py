"""The driver side of a micro-batch: idempotent per batch id, resilient to a failing quality gate."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from checks.alerts import Alert
from checks.model import Finding, Severity
from streaming.paths import StreamPaths
from streaming.sink import BatchSink, read_batches


def finding_row(rule: str, subject: str, offset: int, severity: str = "warning") -> dict[str, Any]:
    f = Finding(
        rule, Severity(severity), subject, f"{rule} on {subject}", 1000 + offset, {"offsets": [[0, offset]]}
    )
    return {"kind": "finding", "payload": json.dumps(f.to_dict())}


def agg_row(frames: int, errors: int = 0) -> dict[str, Any]:
    agg = {
        "dir": "req",
        "api_key": 0,
        "api_name": "Produce",
        "api_version": 9,
        "frames": frames,
        "decode_errors": errors,
        "null_protocol_type": 0,
        "error_responses": 0,
    }
    return {"kind": "agg", "payload": json.dumps(agg)}


@dataclass
class Recorder:
    published: list[list[Alert]] = field(default_factory=list)

    def publish(self, alerts: list[Alert]) -> None:
        self.published.append([Alert.from_dict(a.to_dict()) for a in alerts])


@dataclass
class Verdict:
    success: bool
    findings: list[Finding]
    passed: list[tuple[str, str]]


class FakeGate:
    def __init__(self, fail: bool = False, raise_: bool = False) -> None:
        self.fail, self.raise_ = fail, raise_
        self.seen: list[pd.DataFrame] = []

    def validate(self, batch_id: int, frames_agg: pd.DataFrame, findings: pd.DataFrame) -> Verdict:
        if self.raise_:
            raise RuntimeError("GX exploded")
        self.seen.append(frames_agg)
        if self.fail:
            f = Finding(
                "quality.x", Severity.WARNING, "kpmon.batch", "bad", 0, {"conn": "quality", "seq": batch_id}
            )
            return Verdict(False, [f], [])
        return Verdict(True, [], [("quality.x", "kpmon.batch")])


def sink(tmp_path: Path, gate: Any = None) -> tuple[BatchSink, Recorder]:
    paths = StreamPaths(tmp_path / "stream")
    paths.make()
    recorder = Recorder()
    return BatchSink(paths, recorder, gate, keep_batches=3), recorder


def test_findings_fold_into_alerts_across_batches(tmp_path: Path) -> None:
    s, _rec = sink(tmp_path)
    first = s.process(0, [finding_row("producer.sequence_gap", "producer:1", 5)])
    second = s.process(1, [finding_row("producer.sequence_gap", "producer:1", 9)])
    assert first.alerts[0].id == second.alerts[0].id
    assert second.alerts[0].count == 2 and second.alerts[0].first_seen == 1005


def test_a_replayed_batch_gives_the_same_alerts(tmp_path: Path) -> None:
    s, rec = sink(tmp_path)
    s.process(0, [finding_row("frame.decode_error", "conn:a", 1)])
    rows = [finding_row("frame.decode_error", "conn:a", 2), finding_row("tap.gap", "conn:b", 3)]
    once = [a.to_dict() for a in s.process(1, rows).alerts]
    # A crash after the batch's effects but before its commit: Spark runs batch 1 again.
    again = [a.to_dict() for a in BatchSink(s.paths, rec, None).process(1, rows).alerts]
    assert once == again
    assert once[0]["count"] == 2  # not 3: the replay started from the book after batch 0


def test_resolve_closes_the_alert(tmp_path: Path) -> None:
    s, _rec = sink(tmp_path)
    s.process(0, [finding_row("txn.hanging", "txn:t", 1)])
    resolve = {
        "kind": "resolve",
        "payload": json.dumps({"rule": "txn.hanging", "subject": "txn:t", "ts_ns": 5000}),
    }
    result = s.process(1, [resolve])
    assert [(a.status, a.last_seen) for a in result.alerts] == [("resolved", 5000)]


def test_quality_failures_alert_and_clear(tmp_path: Path) -> None:
    s, _rec = sink(tmp_path, FakeGate(fail=True))
    failed = s.process(0, [agg_row(10)])
    assert [a.rule for a in failed.alerts] == ["quality.x"] and failed.quality_success is False
    s.gate = FakeGate()
    cleared = s.process(1, [agg_row(10)])
    assert [(a.rule, a.status) for a in cleared.alerts] == [("quality.x", "resolved")]


def test_aggregates_are_summed_per_api_version(tmp_path: Path) -> None:
    gate = FakeGate()
    s, _ = sink(tmp_path, gate)
    s.process(0, [agg_row(10, 1), agg_row(5, 2)])
    summed = gate.seen[0]
    assert (
        len(summed) == 1 and int(summed["frames"].iloc[0]) == 15 and int(summed["decode_errors"].iloc[0]) == 3
    )


def test_a_failing_gate_does_not_stop_the_alerts(tmp_path: Path) -> None:
    s, rec = sink(tmp_path, FakeGate(raise_=True))
    result = s.process(0, [finding_row("envelope.untrusted_source", "conn:x", 1, "critical")])
    assert [a.rule for a in rec.published[0]] == ["envelope.untrusted_source"]
    assert result.stats["quality_errors"] == 1


def test_batch_files_are_kept_bounded(tmp_path: Path) -> None:
    s, _ = sink(tmp_path)
    for batch in range(6):
        s.process(batch, [finding_row("tap.gap", f"conn:{batch}", batch)])
    kept = read_batches(s.paths)
    assert [b["batch_id"] for b in kept] == [3, 4, 5]
    assert len(list(s.paths.alert_books.glob("book-*.json"))) == 3


def test_a_quiet_alert_resolves_after_its_window(tmp_path: Path) -> None:
    paths = StreamPaths(tmp_path / "stream")
    paths.make()
    s = BatchSink(paths, Recorder(), None, resolve_after_seconds=10)
    s.process(0, [finding_row("apiversions.out_of_range", "conn:a", 1)])
    tick = {"kind": "stat", "ts_ns": 1000 + 11 * 10**9, "payload": json.dumps({"frames": 1})}
    result = s.process(1, [tick])
    assert [(a.rule, a.status) for a in result.alerts] == [("apiversions.out_of_range", "resolved")]
    assert result.stats["quiet_resolved"] == 1
    # A fresh finding for the same subject opens a new alert (a new id).
    again = s.process(2, [finding_row("apiversions.out_of_range", "conn:a", 99)])
    assert again.alerts[0].status == "firing" and again.alerts[0].id != result.alerts[0].id


def test_alerts_carry_the_sinks_context_across_a_restart(tmp_path: Path) -> None:
    from checks.alerts import AlertContext

    context = AlertContext("prod-eu-1", "https://runbooks.example/runbook.md")
    paths = StreamPaths(tmp_path / "stream")
    paths.make()
    first = BatchSink(paths, Recorder(), None, context=context).process(
        0, [finding_row("producer.sequence_gap", "producer:1", 5)]
    )
    [alert] = first.alerts
    assert alert.cluster == "prod-eu-1"
    assert alert.runbook_url == "https://runbooks.example/runbook.md#producersequence_gap"
    # A new sink (the job restarted) with the same config folds the next finding into the same alert.
    again = BatchSink(paths, Recorder(), None, context=context).process(
        1, [finding_row("producer.sequence_gap", "producer:1", 9)]
    )
    assert again.alerts[0].id == alert.id and again.alerts[0].count == 2


def test_the_checks_alerts_go_out_before_the_gate_runs(tmp_path: Path) -> None:
    """The gate's time must not delay an alert: its own alerts follow in a second publish."""
    s, rec = sink(tmp_path)

    class WatchingGate(FakeGate):
        def validate(self, batch_id: int, frames_agg: pd.DataFrame, findings: pd.DataFrame) -> Verdict:
            # What was published when the gate started judging the batch.
            self.published_before = [[a.rule for a in alerts] for alerts in rec.published]
            return super().validate(batch_id, frames_agg, findings)

    gate = WatchingGate(fail=True)
    s.gate = gate
    result = s.process(0, [finding_row("producer.stale_epoch", "producer:7", 1, "critical"), agg_row(3)])
    assert gate.published_before == [["producer.stale_epoch"]]
    assert [[a.rule for a in alerts] for alerts in rec.published] == [["producer.stale_epoch"], ["quality.x"]]
    assert sorted(a.rule for a in result.alerts) == ["producer.stale_epoch", "quality.x"]
    assert sorted(f["rule"] for f in read_batches(s.paths)[-1]["findings"]) == [
        "producer.stale_epoch",
        "quality.x",
    ]
