"""The streaming job's terminal lines (``kpmon stream``) turned into the live figures ``kpmon run`` shows.

Pure: lines and times go in, figures and text come out. The job prints one line per micro-batch that
read something (``batch N: R frames, X frames/s, M ms, lag L records``) and one per alert it opens or
resolves (``  ALERT firing warning: rule subject: summary``); anything else is informational.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

_BATCH = re.compile(r"^batch (\d+): (\d+) frames, ([\d.]+) frames/s, (\S+) ms, lag (\S+) records$")
_ALERT = re.compile(r"^ALERT (\S+) (\S+): (\S+) ?(.*)$")


@dataclass(frozen=True)
class BatchLine:
    batch: int
    frames: int
    processed_per_second: float
    ms: int | None
    lag_records: int | None


@dataclass(frozen=True)
class AlertLine:
    status: str
    severity: str
    rule: str
    detail: str


@dataclass(frozen=True)
class InfoLine:
    text: str


def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def parse_line(line: str) -> BatchLine | AlertLine | InfoLine | None:
    text = line.strip()
    if not text:
        return None
    if m := _BATCH.match(text):
        return BatchLine(int(m[1]), int(m[2]), float(m[3]), _int_or_none(m[4]), _int_or_none(m[5]))
    if m := _ALERT.match(text):
        return AlertLine(m[1], m[2], m[3], m[4])
    return InfoLine(text.removeprefix("kpmon stream: "))


def format_alert(alert: AlertLine) -> str:
    return f"ALERT {alert.status:<8} {alert.severity:<8} {alert.rule}  {alert.detail}"


def watermark_delay(progress: dict[str, Any] | None, now: float) -> float | None:
    """Seconds between ``now`` and the job's event-time watermark (alerts wait for it), if known."""
    mark = ((progress or {}).get("eventTime") or {}).get("watermark")
    if not mark:
        return None
    try:
        ts = datetime.fromisoformat(str(mark).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return max(now - ts, 0.0) if ts > 0 else None


class Progress:
    """Running figures over the job's lines: ``now`` values are monotonic seconds."""

    def __init__(self, window: float = 30.0) -> None:
        self.window = window
        self._recent: deque[tuple[float, int]] = deque()
        self.first_batch_at: float | None = None
        self.last: BatchLine | None = None
        self.batches = 0
        self.frames = 0
        self.alerts: dict[str, int] = {}

    def on_batch(self, batch: BatchLine, now: float) -> bool:
        """Record a batch; True for the first one (the job is up)."""
        first = self.first_batch_at is None
        if first:
            self.first_batch_at = now
        self.last = batch
        self.batches += 1
        self.frames += batch.frames
        if not first:
            # The first batch is everything written during Spark's start-up: not a rate.
            self._recent.append((now, batch.frames))
        return first

    def on_alert(self, alert: AlertLine) -> None:
        self.alerts[alert.status] = self.alerts.get(alert.status, 0) + 1

    def frames_per_second(self, now: float) -> float:
        """Frames the job took in over the last ``window`` seconds (or since its first batch), per second;
        the first batch (the backlog of Spark's start-up) does not count."""
        while self._recent and self._recent[0][0] < now - self.window:
            self._recent.popleft()
        if self.first_batch_at is None:
            return 0.0
        span = min(self.window, now - self.first_batch_at)
        return sum(n for _, n in self._recent) / span if span > 0 else 0.0

    def status_line(self, now: float, watermark_delay_s: float | None = None) -> str:
        if self.last is None:
            return "monitor: waiting for the streaming job's first batch"
        last = self.last
        rate = (
            f"{self.frames_per_second(now):.1f} frames/s"
            if self.batches > 1
            else f"frames/s after the start-up backlog ({last.frames} frames)"
        )
        parts = [
            f"batch {last.batch}",
            rate,
            f"batch lag {last.lag_records if last.lag_records is not None else '?'} records",
            f"last batch {last.ms if last.ms is not None else '?'} ms",
        ]
        if watermark_delay_s is not None:
            parts.append(f"watermark {watermark_delay_s:.0f} s behind")
        firing, resolved = self.alerts.get("firing", 0), self.alerts.get("resolved", 0)
        parts.append(f"alerts {firing} fired, {resolved} resolved")
        return "monitor: " + " | ".join(parts)
