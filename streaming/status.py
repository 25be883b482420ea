"""Health of a running job, judged from its newest progress file: healthy, lagging, stalled or stopped.

Pure: the progress data and the current time go in, a verdict comes out. ``kpmon stream status`` and the
Airflow health gate both use it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kpconfig.model import StreamConfig


@dataclass
class Health:
    status: str
    reason: str
    batch_id: int | None = None
    age_seconds: float | None = None
    lag_records: int | None = None
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "healthy"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def lag_records(progress: dict[str, Any]) -> int | None:
    """Tap records between what the batch read to and the newest offsets Spark saw in the topic."""
    total = None
    for source in progress.get("sources") or []:
        end, latest = source.get("endOffset"), source.get("latestOffset")
        if isinstance(end, str):
            end, latest = json.loads(end), json.loads(latest) if isinstance(latest, str) else latest
        if not isinstance(end, dict) or not isinstance(latest, dict):
            continue
        for topic, parts in latest.items():
            for part, offset in parts.items():
                behind = int(offset) - int(end.get(topic, {}).get(part, offset))
                total = (total or 0) + max(behind, 0)
    return total


def judge(progress: dict[str, Any] | None, now: float, config: StreamConfig) -> Health:
    if not progress:
        return Health("stopped", "no progress recorded yet: the job has not completed a batch")
    written = float(progress.get("kpmon", {}).get("written_at", 0.0))
    age = now - written
    health = Health(
        "healthy",
        "progress advancing",
        batch_id=progress.get("batchId"),
        age_seconds=round(age, 3),
        lag_records=lag_records(progress),
        input_rows_per_second=progress.get("inputRowsPerSecond"),
        processed_rows_per_second=progress.get("processedRowsPerSecond"),
    )
    state = progress.get("kpmon", {}).get("state")
    if state == "stopped":
        health.status, health.reason = "stopped", "the job stopped"
    elif state == "failed":
        health.status, health.reason = "failed", progress["kpmon"].get("error", "the query failed")
    elif age > config.stall_seconds:
        health.status, health.reason = (
            "stalled",
            f"no progress for {age:.0f} s (> {config.stall_seconds:.0f} s)",
        )
    elif health.lag_records is not None and health.lag_records > config.max_lag_records:
        health.status = "lagging"
        health.reason = f"{health.lag_records} tap records behind (> {config.max_lag_records})"
    return health


def read_progress(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
