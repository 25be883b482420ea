"""``kpmon report`` over a synthetic capture: tap records as JSON lines -> summary, HTML and heatmap PNG."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from checks.report import (
    build_report,
    coverage_grid,
    frames_from_json,
    record_to_json,
    render_coverage_png,
    render_html,
    run_checks,
)
from codec.records import build_record_batch
from codec.taprecord import TapFrame
from kpmon.cli import main
from tests.checks.builders import SECOND, Conversation, shared_offsets
from tests.checks.test_apiversions import STANDARD, handshake, metadata
from tests.checks.test_envelope import envelope
from tests.checks.test_groups import join, subscription, sync

MS = 1_000_000


def record_of(frame: TapFrame) -> str:
    """The tap record a frame came from, as a capture line (headers as the tap writes them)."""
    headers = {"dir": frame.direction, "conn": frame.conn, "seq": str(frame.seq), "ts_ns": str(frame.ts_ns)}
    optional: dict[str, Any] = {
        "api_key": frame.api_key,
        "api_version": frame.api_version,
        "corr_id": frame.correlation_id,
        "broker_id": frame.broker_id,
        "listener": frame.listener,
    }
    headers.update({k: str(v) for k, v in optional.items() if v is not None})
    headers.update(client=frame.client, broker=frame.broker, capture="full")
    value = frame.raw if frame.direction in ("req", "resp") else None
    return record_to_json(headers, value, frame.partition, frame.offset)


def synthetic_capture() -> list[TapFrame]:
    java = Conversation(conn="t1-c1", broker="10.0.0.1:9092", broker_id=1, client_id="orders-app")
    legacy = Conversation(conn="t1-c2", broker="10.0.0.2:9092", broker_id=2, client_id="legacy-etl")
    other = Conversation(conn="t1-c3", broker="10.0.0.2:9092", broker_id=2, client_id="mixed")
    rogue = Conversation(conn="t1-c4", broker="10.0.0.1:9092", broker_id=1, client_id="rogue")
    shared_offsets(java, legacy, other, rogue)
    t = SECOND
    frames = [java.open(0), legacy.open(0), other.open(0), rogue.open(0)]
    frames += handshake(
        java,
        t,
        {**STANDARD, "JoinGroup": (0, 9), "SyncGroup": (0, 5), "InitProducerId": (0, 5)},
        software="apache-kafka-java",
    )
    frames += handshake(legacy, t + MS, {**STANDARD, "Fetch": (4, 16)}, software="kafka-python")
    frames += metadata(java, 12, 2 * t)
    frames += legacy.exchange(1, 3, {"ReplicaId": -1, "MaxWaitMs": 1, "MinBytes": 1, "Topics": []}, {}, 2 * t)
    frames += legacy.exchange(0, 2, {"Acks": 1, "TimeoutMs": 1, "TopicData": []}, {}, 3 * t)
    frames += join(java, 4 * t, "m-1", 1, members=[{"MemberId": "m-1", "Metadata": subscription("orders")}])
    frames += sync(java, 4 * t + 50 * MS, "m-1", 1, ("orders", "payroll"), {"m-1": ("orders", "payroll")})
    frames += metadata(other, 9, 5 * t)
    frames += java.exchange(
        22,
        4,
        {"TransactionalId": None, "TransactionTimeoutMs": 60000, "ProducerId": -1, "ProducerEpoch": -1},
        {"ErrorCode": 0, "ProducerId": 4000, "ProducerEpoch": 3},
        6 * t,
    )
    batch = build_record_batch([(None, b"v")], producer_id=4000, producer_epoch=3, base_sequence=0)
    produce = {
        "TransactionalId": None,
        "Acks": -1,
        "TimeoutMs": 30000,
        "TopicData": [{"Name": "orders", "PartitionData": [{"Index": 0, "Records": batch}]}],
    }
    answer = {
        "Responses": [
            {"Name": "orders", "PartitionResponses": [{"Index": 0, "ErrorCode": 0, "BaseOffset": 0}]}
        ]
    }
    frames += java.exchange(0, 9, produce, answer, 7 * t)
    frames += envelope(rogue, 8 * t)
    frames.append(rogue.garbage("req", b"\x00\x03\x00\x0c\xff\xff", 9 * t))
    return frames


def write_capture(path: Path) -> None:
    path.write_text("".join(record_of(f) + "\n" for f in synthetic_capture()), encoding="utf-8")


def test_capture_lines_round_trip_to_frames(tmp_path: Path) -> None:
    frames = synthetic_capture()
    back = [g for f in frames for g in frames_from_json(record_of(f))]
    assert [(f.direction, f.conn, f.seq, f.api_key, f.correlation_id) for f in back] == [
        (f.direction, f.conn, f.seq, f.api_key, f.correlation_id) for f in frames
    ]
    assert all(b.raw == f.raw for b, f in zip(back, frames, strict=True) if f.direction in ("req", "resp"))


def test_report_content_from_synthetic_capture() -> None:
    frames = [g for f in synthetic_capture() for g in frames_from_json(record_of(f))]
    monitor, findings = run_checks(frames)
    report = build_report(monitor.states, findings, monitor.stats, "synthetic")
    rules = {f["rule"] for f in report.findings}
    assert {
        "apiversions.out_of_range",
        "apiversions.no_handshake",
        "apiversions.removed_in_4_0",
        "apiversions.cluster_skew",
        "group.assignment_outside_subscription",
        "envelope.untrusted_source",
        "frame.decode_error",
    } <= rules
    assert report.findings[0]["severity"] == "critical"  # most severe first
    assert [(g.group, g.protocol_type, g.protocol_name) for g in report.groups] == [
        ("g1", "consumer", "range")
    ]
    assert [(p.producer_id, p.epoch) for p in report.producers] == [(4000, 3)]
    removed = {(r.software, r.api_name, r.version) for r in report.fleet if r.removed_in_4_0}
    assert removed == {("kafka-python/2.6.0", "Fetch", 3), ("kafka-python/2.6.0", "Produce", 2)}
    apis, columns, grid = coverage_grid(report.coverage)
    fetch = grid[apis.index(1)]
    assert fetch[3] == 4 and fetch[12] == 2 and columns >= 18  # used-not-advertised, advertised-unused
    page = render_html(report, render_coverage_png(report.coverage), "r.png")
    for text in (
        "ApiVersions coverage",
        "Consumer groups",
        "Producers",
        "Findings",
        "envelope.untrusted_source",
    ):
        assert text in page


def test_kpmon_report_command_writes_html_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("KPMON__"):
            monkeypatch.delenv(name)
    capture = tmp_path / "tap.jsonl"
    write_capture(capture)
    out = tmp_path / "out" / "report.html"
    assert main(["report", "--capture", str(capture), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "findings:" in printed and "not ready for Kafka 4.0" in printed
    png = (tmp_path / "out" / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    page = out.read_text(encoding="utf-8")
    assert "data:image/png;base64," in page and "report.png" in page
    keep = os.environ.get("KPMON_REPORT_SCREENSHOT")
    if keep:
        # Lets a developer look at the rendered heatmap: KPMON_REPORT_SCREENSHOT=/tmp/x.png pytest ...
        Path(keep).write_bytes(png)


def test_bad_capture_line_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capture = tmp_path / "bad.jsonl"
    capture.write_text("not json\n", encoding="utf-8")
    assert main(["report", "--capture", str(capture), "--out", str(tmp_path / "r.html")]) == 1
    assert "not a capture record" in capsys.readouterr().err
