"""What each micro-batch's output becomes on the driver: alerts, data-quality results, hook deliveries.

``foreachBatch`` is at-least-once: after a crash the last batch runs again with the same id. So this
stage is idempotent per batch id. The alert book is restored from the snapshot taken after the
previous batch (never from a half-applied one), alert ids are deterministic, and the per-batch result
file is rewritten, not appended. A replayed batch therefore re-sends the same alert ids, which hooks
and receivers deduplicate.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from checks.alerts import Alert, AlertBook, AlertContext
from checks.model import Finding
from streaming.paths import StreamPaths
from streaming.quality_suites import FINDINGS_COLUMNS, FRAMES_AGG_COLUMNS

log = logging.getLogger("kpmon.stream")

#: The quality gate's input contract (streaming/quality_suites.py): the sink builds exactly these.
AGG_COLUMNS = list(FRAMES_AGG_COLUMNS)
FINDING_COLUMNS = list(FINDINGS_COLUMNS)


class Publisher(Protocol):
    def publish(self, alerts: list[Alert]) -> None: ...


class Gate(Protocol):
    def validate(self, batch_id: int, frames_agg: pd.DataFrame, findings: pd.DataFrame) -> Any: ...


@dataclass
class BatchResult:
    batch_id: int
    findings: list[Finding]
    alerts: list[Alert]
    stats: dict[str, int]
    frames: int
    quality_success: bool | None = None
    quality_seconds: float = 0.0
    seconds: float = 0.0
    findings_by_rule: dict[str, int] = field(default_factory=dict)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


class AlertBookStore:
    """Alert-book snapshots, one per batch id, so a replayed batch starts from the previous batch's book."""

    def __init__(self, directory: Path, keep: int, context: AlertContext | None = None) -> None:
        self.directory = directory
        self.keep = keep
        self.context = context or AlertContext()
        self._cached: tuple[int, dict[str, Any]] | None = None

    def _ids(self) -> list[int]:
        return sorted(int(p.stem.split("-")[1]) for p in self.directory.glob("book-*.json"))

    def before(self, batch_id: int) -> AlertBook:
        book = AlertBook(self.context)
        if self._cached is not None and self._cached[0] == batch_id - 1:
            data = self._cached[1]
        else:
            earlier = [i for i in self._ids() if i < batch_id]
            data = json.loads((self.directory / f"book-{earlier[-1]}.json").read_text()) if earlier else {}
        for item in data.get("open", []):
            alert = Alert.from_dict(item)
            book.open[(alert.rule, alert.subject)] = alert
        return book

    def save(self, batch_id: int, book: AlertBook) -> None:
        data = {"batch_id": batch_id, "open": [a.to_dict() for a in book.open.values()]}
        _write_json(self.directory / f"book-{batch_id}.json", data)
        self._cached = (batch_id, json.loads(json.dumps(data)))
        for old in self._ids()[: -self.keep]:
            (self.directory / f"book-{old}.json").unlink(missing_ok=True)


class BatchSink:
    """The driver side of the job. ``process`` is pure Python; ``__call__`` is the foreachBatch adapter."""

    def __init__(
        self,
        paths: StreamPaths,
        hooks: Publisher | None,
        gate: Gate | None,
        keep_batches: int = 1000,
        on_result: Callable[[BatchResult], None] | None = None,
        resolve_after_seconds: float = 3600.0,
        context: AlertContext | None = None,
    ) -> None:
        self.paths = paths
        self.hooks = hooks
        self.gate = gate
        self.keep = keep_batches
        self.books = AlertBookStore(paths.alert_books, keep_batches, context)
        self.on_result = on_result
        self.resolve_after_ns = int(resolve_after_seconds * 1e9)

    def __call__(self, df: Any, batch_id: int) -> None:
        self.process(batch_id, [row.asDict() for row in df.collect()])

    def process(self, batch_id: int, rows: Iterable[dict[str, Any]]) -> BatchResult:
        started = time.perf_counter()
        findings: list[Finding] = []
        resolves: list[tuple[str, str, int]] = []
        aggs: list[dict[str, Any]] = []
        stats: Counter[str] = Counter()
        newest_ns = 0
        for row in rows:
            newest_ns = max(newest_ns, int(row.get("ts_ns") or 0))
            payload = json.loads(row["payload"]) if row.get("payload") else {}
            kind = row["kind"]
            if kind == "finding":
                findings.append(Finding.from_dict(payload))
            elif kind == "resolve":
                resolves.append((payload["rule"], payload["subject"], int(payload["ts_ns"])))
            elif kind == "agg":
                aggs.append(payload)
            elif kind == "stat":
                stats.update({k: int(v) for k, v in payload.items()})
        findings.sort(key=lambda f: (f.ts_ns, f.rule, f.subject, f.id))
        frames_agg = self._frames_agg(aggs)
        result = BatchResult(batch_id, findings, [], dict(stats), int(frames_agg["frames"].sum()))
        book = self.books.before(batch_id)
        # The checks' alerts go out before the data-quality gate runs: the gate is a second opinion on
        # the batch, and its time (a tenth to a third of a second a batch, benchmarks/quality_bench.py)
        # must not delay an alert. Its own alerts follow in a second publish of the same batch.
        checked = self._apply(book, findings, resolves)
        self._publish(batch_id, list(checked.values()), result)
        judged: list[Finding] = []
        passed: list[tuple[str, str, int]] = []
        if self.gate is not None:
            q_started = time.perf_counter()
            try:
                quality = self.gate.validate(batch_id, frames_agg, self._findings_frame(findings))
            except Exception as exc:
                # The data-quality layer is a second opinion on the findings: its failure is reported
                # and counted, and must not stop the checks or the alerts.
                log.error("batch %d: data-quality validation failed: %s", batch_id, exc)
                result.stats["quality_errors"] = 1
            else:
                result.quality_success = bool(quality.success)
                judged = list(quality.findings)
                # A suite that passes again clears its alert (the gate reports what it judged and met).
                at = max((f.ts_ns for f in (*findings, *judged)), default=0)
                passed = [(rule, subject, at) for rule, subject in getattr(quality, "passed", ())]
            result.quality_seconds = time.perf_counter() - q_started
        findings.extend(judged)
        later = self._apply(book, judged, passed)
        # Quiet alerts resolve by themselves, in event time, so a replayed batch resolves the same ones.
        for alert in [a for a in book.open.values() if a.last_seen < newest_ns - self.resolve_after_ns]:
            resolved = book.resolve(alert.rule, alert.subject, newest_ns)
            if resolved is not None:
                later[resolved.id] = resolved
                result.stats["quiet_resolved"] = result.stats.get("quiet_resolved", 0) + 1
        result.alerts = list({**checked, **later}.values())
        result.findings_by_rule = dict(Counter(f.rule for f in findings))
        self._write_batch(result)
        self._publish(batch_id, list(later.values()), result)
        self.books.save(batch_id, book)
        result.seconds = time.perf_counter() - started
        if self.on_result is not None:
            self.on_result(result)
        return result

    @staticmethod
    def _apply(
        book: AlertBook, findings: list[Finding], resolves: list[tuple[str, str, int]]
    ) -> dict[str, Alert]:
        """The alerts ``findings`` and ``resolves`` touch in ``book``, by id."""
        touched: dict[str, Alert] = {}
        for finding in findings:
            alert = book.add(finding)
            touched[alert.id] = alert
        for rule, subject, ts in sorted(resolves, key=lambda r: r[2]):
            resolved = book.resolve(rule, subject, ts)
            if resolved is not None:
                touched[resolved.id] = resolved
        return touched

    def _publish(self, batch_id: int, alerts: list[Alert], result: BatchResult) -> None:
        if self.hooks is None or not alerts:
            return
        try:
            self.hooks.publish(alerts)
        except Exception as exc:  # publish() is not supposed to raise; never let a hook stop the stream
            log.error("batch %d: alert hooks raised: %s", batch_id, exc)
            result.stats["hook_errors"] = 1

    @staticmethod
    def _frames_agg(aggs: list[dict[str, Any]]) -> pd.DataFrame:
        counts = ["frames", "decode_errors", "null_protocol_type", "error_responses"]
        frame = pd.DataFrame(aggs, columns=AGG_COLUMNS).astype(
            {"api_key": "Int64", "api_version": "Int64", **dict.fromkeys(counts, "int64")}
        )
        if frame.empty:
            return frame
        keys = ["dir", "api_key", "api_version"]
        summed = frame.groupby(keys, dropna=False, as_index=False).agg(
            api_name=("api_name", "first"),
            frames=("frames", "sum"),
            decode_errors=("decode_errors", "sum"),
            null_protocol_type=("null_protocol_type", "sum"),
            error_responses=("error_responses", "sum"),
        )
        return summed[AGG_COLUMNS]

    @staticmethod
    def _findings_frame(findings: list[Finding]) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {
                    "id": f.id,
                    "rule": f.rule,
                    "severity": f.severity.value,
                    "subject": f.subject,
                    "summary": f.summary,
                    "ts_ns": f.ts_ns,
                    "incomplete": f.incomplete,
                }
                for f in findings
            ],
            columns=FINDING_COLUMNS,
        )

    def _write_batch(self, result: BatchResult) -> None:
        _write_json(
            self.paths.batches / f"batch-{result.batch_id}.json",
            {
                "batch_id": result.batch_id,
                "frames": result.frames,
                "stats": result.stats,
                "findings": [f.to_dict() for f in result.findings],
                "alerts": [a.to_dict() for a in result.alerts],
            },
        )
        kept = sorted(self.paths.batches.glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        for old in kept[: -self.keep]:
            old.unlink(missing_ok=True)


def read_batches(paths: StreamPaths) -> list[dict[str, Any]]:
    """Every kept per-batch result, oldest first (tests, the Airflow canary, ``kpmon stream status``)."""
    files = sorted(paths.batches.glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    out = []
    for path in files:
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out
