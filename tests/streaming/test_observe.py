"""Health verdicts, the progress file and the metrics the job exports per batch."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from checks.alerts import Alert
from checks.model import Severity
from kpconfig.model import StreamConfig
from streaming.observe import ProgressListener, StreamMetrics, watermark_lag_seconds
from streaming.paths import StreamPaths
from streaming.router import header_exchanges, route_rows, stage_rows
from streaming.sink import BatchResult, BatchSink, read_batches
from streaming.status import judge, lag_records, read_progress
from tests.checks.exchanges import exchange_records, flatten
from tests.checks.test_sharding import CONFIG as CHECKS
from tests.checks.test_sharding import scenario
from tests.streaming.test_stages import rows_of

CONFIG = StreamConfig(stall_seconds=60, max_lag_records=1000)


def progress(batch: int = 7, latest: int = 500, end: int = 400, **extra: Any) -> dict[str, Any]:
    return {
        "batchId": batch,
        "numInputRows": 100,
        "inputRowsPerSecond": 50.0,
        "processedRowsPerSecond": 80.0,
        "batchDuration": 1500,
        "eventTime": {"watermark": "2026-11-23T06:00:00.000Z"},
        "stateOperators": [{"operatorName": "transformWithStateInPandasExec", "numRowsTotal": 12}],
        "sources": [
            {
                "endOffset": json.dumps({"tap": {"0": end, "1": 10}}),
                "latestOffset": json.dumps({"tap": {"0": latest, "1": 10}}),
            }
        ],
        **extra,
    }


def test_lag_is_what_the_topic_has_beyond_the_batch() -> None:
    assert lag_records(progress(latest=500, end=400)) == 100
    assert lag_records({"sources": []}) is None


def test_verdicts() -> None:
    now = 10_000.0
    fresh = {"written_at": now - 5, "state": "running"}
    assert judge(None, now, CONFIG).status == "stopped"
    assert judge(progress(kpmon=fresh), now, CONFIG).status == "healthy"
    lagging = judge(progress(latest=5000, end=400, kpmon=fresh), now, CONFIG)
    assert lagging.status == "lagging" and lagging.lag_records == 4600
    stale = {"written_at": now - 120, "state": "running"}
    assert judge(progress(kpmon=stale), now, CONFIG).status == "stalled"
    assert judge(progress(kpmon={**fresh, "state": "stopped"}), now, CONFIG).status == "stopped"
    failed = judge(progress(kpmon={**fresh, "state": "failed", "error": "boom"}), now, CONFIG)
    assert (failed.status, failed.reason) == ("failed", "boom")


def test_watermark_lag() -> None:
    ts = 1_795_000_000.0
    mark = datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    p = {"eventTime": {"watermark": mark}}
    assert watermark_lag_seconds(p, ts + 30) == 30.0
    assert watermark_lag_seconds({"eventTime": {}}, ts) is None


def test_listener_writes_progress_and_metrics(tmp_path: Path) -> None:
    paths = StreamPaths(tmp_path / "stream")
    paths.make()
    registry = CollectorRegistry()
    metrics = StreamMetrics(registry)
    # From the start, not 0: `time() - x > 300` (KpmonStreamStalled) must not fire during start-up.
    assert (registry.get_sample_value("kpmon_stream_last_progress_timestamp_seconds") or 0) > 0
    lines: list[str] = []
    listener = ProgressListener(paths, metrics, lambda: {"findings": {"tap.gap": 1}}, lines.append)
    event = SimpleNamespace(progress=SimpleNamespace(json=json.dumps(progress())))
    listener.onQueryProgress(event)
    saved = read_progress(paths.progress)
    assert saved is not None and saved["batchId"] == 7 and saved["kpmon"]["state"] == "running"
    assert saved["kpmon"]["findings"] == {"tap.gap": 1}
    assert registry.get_sample_value("kpmon_stream_input_rows_per_second") == 50.0
    assert registry.get_sample_value("kpmon_stream_lag_records") == 100
    assert (
        registry.get_sample_value("kpmon_stream_state_rows", {"operator": "0:transformWithStateInPandasExec"})
        == 12
    )
    assert lines and "batch 7: 100 frames" in lines[0]
    # Liveness: progress, and idle events too (a quiet tap topic is not a stuck job), stamp the time.
    stamped = registry.get_sample_value("kpmon_stream_last_progress_timestamp_seconds")
    assert stamped is not None and abs(stamped - time.time()) < 600
    metrics.last_progress.set(0)
    listener.onQueryIdle(SimpleNamespace())
    assert (registry.get_sample_value("kpmon_stream_last_progress_timestamp_seconds") or 0) > 0
    listener.onQueryTerminated(SimpleNamespace(exception=None))
    assert read_progress(paths.progress)["kpmon"]["state"] == "stopped"  # type: ignore[index]


def test_a_late_event_does_not_undo_the_recorded_end(tmp_path: Path) -> None:
    """Spark delivers listener events on its own thread: progress or idle can land after the job marked its
    end. `kpmon stream status` must keep saying stopped (or failed) once the job said so."""
    paths = StreamPaths(tmp_path / "stream")
    paths.make()
    listener = ProgressListener(paths, StreamMetrics(CollectorRegistry()), dict)
    event = SimpleNamespace(progress=SimpleNamespace(json=json.dumps(progress())))
    listener.onQueryProgress(event)
    listener.mark_ended(None)
    listener.onQueryProgress(event)
    listener.onQueryIdle(SimpleNamespace())
    assert read_progress(paths.progress)["kpmon"]["state"] == "stopped"  # type: ignore[index]
    assert judge(read_progress(paths.progress), time.time(), CONFIG).status == "stopped"
    # A failure reported after a clean stop is still news; a second clean end changes nothing.
    listener.onQueryTerminated(SimpleNamespace(exception="boom"))
    listener.onQueryTerminated(SimpleNamespace(exception=None))
    saved = read_progress(paths.progress)
    assert saved is not None and (saved["kpmon"]["state"], saved["kpmon"]["error"]) == ("failed", "boom")


def test_batch_results_count_findings_and_alerts() -> None:
    registry = CollectorRegistry()
    metrics = StreamMetrics(registry)
    alert = Alert("a" * 24, "tap.gap", Severity.WARNING, "firing", 1, 1, 1, "conn:x", "gap")
    metrics.on_result(BatchResult(3, [], [alert], {"late_frames": 2}, 10, findings_by_rule={"tap.gap": 1}))
    assert registry.get_sample_value("kpmon_stream_findings_total", {"rule": "tap.gap"}) == 1
    assert (
        registry.get_sample_value(
            "kpmon_stream_alerts_published_total", {"severity": "warning", "status": "firing"}
        )
        == 1
    )
    assert registry.get_sample_value("kpmon_stream_engine_events_total", {"event": "late_frames"}) == 2


def test_the_routers_stage_counts_reach_the_batch_file_and_the_metrics(tmp_path: Path) -> None:
    """The counters ``stream_bench`` reads rows per wire frame from (issue 35), summed over a
    micro-batch's source batches (one per Kafka partition's split) on their way out of the job."""
    frames = flatten(exchange_records(scenario()))
    conns = sorted({f.conn for f in frames})
    parts = [[f for f in frames if f.conn in conns[::2]], [f for f in frames if f.conn in conns[1::2]]]
    routed = [route_rows(CHECKS, rows_of(part), 4) for part in parts]
    expected = {
        "wire_frames": sum(1 for f in frames if f.direction in ("req", "resp")),
        "stage_rows": sum(stage_rows(b) for r in routed for b in r.bundles.values()),
        "stage_header_exchanges": sum(header_exchanges(b) for r in routed for b in r.bundles.values()),
    }
    paths = StreamPaths(tmp_path / "stream")
    paths.make()
    registry = CollectorRegistry()
    sink = BatchSink(paths, None, None, on_result=StreamMetrics(registry).on_result)
    result = sink.process(0, [row._asdict() for r in routed for row in r.passed])
    assert {k: result.stats[k] for k in expected} == expected and min(expected.values()) > 0
    assert {k: read_batches(paths)[0]["stats"][k] for k in expected} == expected
    for event, n in expected.items():
        assert registry.get_sample_value("kpmon_stream_engine_events_total", {"event": event}) == n


def test_the_jobs_metrics_bind_loopback_unless_configured() -> None:
    from tests.tap.harness import accepts, free_port

    assert CONFIG.metrics_host == "127.0.0.1"
    port = free_port()
    StreamMetrics(CollectorRegistry()).serve(port, CONFIG.metrics_host)
    assert accepts("127.0.0.1", port) and not accepts("127.0.0.2", port)
