"""Observability of the running job: Prometheus metrics, a structured log line and a progress file per
batch, and the line a user sees in the terminal.

Spark's ``StreamingQueryListener`` reports query progress (rates, durations, state rows, watermark);
the sink reports what kpmon made of the batch (findings, alerts, hook outcomes). Both meet here.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from pyspark.sql.streaming import StreamingQueryListener

from streaming.paths import StreamPaths
from streaming.sink import BatchResult, _write_json

log = logging.getLogger("kpmon.stream")


class StreamMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.batch_seconds = Histogram(
            "kpmon_stream_batch_duration_seconds",
            "Micro-batch duration",
            buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=registry,
        )
        self.input_rate = Gauge(
            "kpmon_stream_input_rows_per_second", "Tap records/s arriving", registry=registry
        )
        self.processed_rate = Gauge(
            "kpmon_stream_processed_rows_per_second", "Tap records/s processed", registry=registry
        )
        self.input_rows = Counter("kpmon_stream_input_rows", "Tap records read", registry=registry)
        self.state_rows = Gauge(
            "kpmon_stream_state_rows", "Rows in the state store", ["operator"], registry=registry
        )
        self.watermark_lag = Gauge(
            "kpmon_stream_watermark_lag_seconds",
            "Wall clock minus the event-time watermark",
            registry=registry,
        )
        self.lag_records = Gauge(
            "kpmon_stream_lag_records", "Tap records behind the topic's end", registry=registry
        )
        self.late_rows = Counter(
            "kpmon_stream_late_rows_dropped",
            "Rows older than the watermark, dropped by a stateful stage",
            registry=registry,
        )
        self.findings = Counter("kpmon_stream_findings", "Findings raised", ["rule"], registry=registry)
        self.alerts = Counter(
            "kpmon_stream_alerts_published",
            "Alert updates sent to the hooks",
            ["severity", "status"],
            registry=registry,
        )
        self.engine = Counter(
            "kpmon_stream_engine_events",
            "Checks engine counters (late frames, gaps, evictions...)",
            ["event"],
            registry=registry,
        )
        self.quality_seconds = Histogram(
            "kpmon_stream_quality_seconds",
            "Great Expectations validation time per batch",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
            registry=registry,
        )
        self.failed_batches = Counter(
            "kpmon_stream_failed_batches", "Batches whose driver-side processing raised", registry=registry
        )
        self.last_progress = Gauge(
            "kpmon_stream_last_progress_timestamp_seconds",
            "When the query last reported progress or idleness (Unix time): the job's liveness",
            registry=registry,
        )
        # Starting counts as progress: a job still in Spark's start-up is not stalled (yet).
        self.last_progress.set_to_current_time()

    def serve(self, port: int | None, addr: str = "127.0.0.1") -> None:
        if port:
            start_http_server(port, addr=addr, registry=self.registry)

    def on_result(self, result: BatchResult) -> None:
        for rule, n in result.findings_by_rule.items():
            self.findings.labels(rule).inc(n)
        for alert in result.alerts:
            self.alerts.labels(alert.severity.value, alert.status).inc()
        for name, n in result.stats.items():
            self.engine.labels(name).inc(n)
        if result.quality_success is not None:
            self.quality_seconds.observe(result.quality_seconds)


def watermark_lag_seconds(progress: dict[str, Any], now: float) -> float | None:
    mark = (progress.get("eventTime") or {}).get("watermark")
    if not mark:
        return None
    ts = datetime.fromisoformat(mark.replace("Z", "+00:00")).timestamp()
    return max(now - ts, 0.0) if ts > 0 else None


class ProgressListener(StreamingQueryListener):
    """Writes ``progress.json``, updates the metrics and logs one structured line per batch."""

    def __init__(
        self,
        paths: StreamPaths,
        metrics: StreamMetrics,
        extras: Callable[[], dict[str, Any]],
        terminal: Callable[[str], None] | None = None,
    ) -> None:
        self.paths = paths
        self.metrics = metrics
        self.extras = extras
        self.terminal = terminal
        self.last: dict[str, Any] | None = None
        # Spark delivers listener events on its own thread, late: a progress or idle event can arrive after
        # the job has recorded its end, and must not turn "stopped" back into "running".
        self._lock = threading.Lock()
        self._ended = False

    def onQueryStarted(self, event: Any) -> None:
        self._write({"id": str(event.id), "runId": str(event.runId), "batchId": None}, "starting")

    def onQueryProgress(self, event: Any) -> None:
        progress = json.loads(event.progress.json)
        m = self.metrics
        m.last_progress.set_to_current_time()
        m.batch_seconds.observe((progress.get("batchDuration") or 0) / 1000)
        m.input_rate.set(progress.get("inputRowsPerSecond") or 0)
        m.processed_rate.set(progress.get("processedRowsPerSecond") or 0)
        m.input_rows.inc(progress.get("numInputRows") or 0)
        dropped = 0
        for i, op in enumerate(progress.get("stateOperators") or []):
            m.state_rows.labels(f"{i}:{op.get('operatorName', 'state')}").set(op.get("numRowsTotal") or 0)
            dropped += op.get("numRowsDroppedByWatermark") or 0
        m.late_rows.inc(dropped)
        from streaming.status import lag_records

        lag = lag_records(progress)
        if lag is not None:
            m.lag_records.set(lag)
        wm_lag = watermark_lag_seconds(progress, time.time())
        if wm_lag is not None:
            m.watermark_lag.set(wm_lag)
        self._write(progress, "running")
        line = {
            "event": "batch",
            "batch": progress.get("batchId"),
            "rows": progress.get("numInputRows"),
            "input_rps": round(progress.get("inputRowsPerSecond") or 0, 1),
            "processed_rps": round(progress.get("processedRowsPerSecond") or 0, 1),
            "ms": progress.get("batchDuration"),
            "lag_records": lag,
            "watermark_lag_s": round(wm_lag, 1) if wm_lag is not None else None,
            "late_dropped": dropped,
            **{k: v for k, v in self.extras().items() if k in ("findings", "alerts", "hooks")},
        }
        log.info(json.dumps(line, default=str))
        if self.terminal is not None and (progress.get("numInputRows") or line.get("alerts")):
            self.terminal(
                f"batch {line['batch']}: {line['rows']} frames, {line['processed_rps']} frames/s, "
                f"{line['ms']} ms, lag {lag if lag is not None else '?'} records"
            )

    def onQueryIdle(self, event: Any) -> None:
        self.metrics.last_progress.set_to_current_time()  # idle, not stuck: no new tap records
        if self.last is not None:
            self._write(self.last, "running")

    def onQueryTerminated(self, event: Any) -> None:
        self.mark_ended(str(event.exception) if event.exception else None)

    def mark_ended(self, error: str | None = None) -> None:
        """Record that the query ended. Also called by the job itself: Spark delivers listener events
        asynchronously, and the listener may be gone before ``onQueryTerminated`` arrives."""
        self._write(self.last or {}, "failed" if error else "stopped", error=error)

    def _write(self, progress: dict[str, Any], state: str, error: str | None = None) -> None:
        ending = state in ("stopped", "failed")
        with self._lock:
            if self._ended and not (ending and error):
                return  # the end is recorded; only a failure may still replace a clean stop
            self._ended = self._ended or ending
            progress = {k: v for k, v in progress.items() if k != "kpmon"}
            self.last = progress
            extra = {"written_at": time.time(), "state": state, **self.extras()}
            if error:
                extra["error"] = error
            try:
                _write_json(self.paths.progress, {**progress, "kpmon": extra})
            except OSError as exc:
                log.warning("cannot write %s: %s", self.paths.progress, exc)
