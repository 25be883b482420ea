"""The health gate after a swap: is the new job healthy for K batches? Pure: observations in, a verdict out.

The new job shares the state directory with the one it replaced, so a progress file written before the
new job was spawned is the old job's and says nothing about the new one. From the new job's own progress:

* it must report a started query within ``start_timeout`` seconds;
* ``failed``, ``stalled`` (no progress for ``stream.stall_seconds``) or ``stopped``, or the process gone,
  fail the gate at once;
* it passes when K batches after ``baseline_batch`` (the last one the old job completed) have completed
  and the newest verdict is ``healthy``: a job still ``lagging`` after K batches is given until
  ``timeout`` to catch up (lag bounded), then fails.

Spark only runs a batch when there are new tap records, so the gate needs traffic; on an idle tap topic
set K to 0 (started and healthy is enough).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streaming.status import Health

PASS, FAIL, WAIT = "pass", "fail", "wait"


@dataclass
class Verdict:
    outcome: str
    reason: str
    batches: int = 0

    @property
    def done(self) -> bool:
        return self.outcome != WAIT


@dataclass
class HealthGate:
    batches: int
    since: float
    baseline_batch: int | None
    start_timeout: float
    timeout: float
    seen: set[int] = field(default_factory=set)
    started: bool = False

    def _batch_count(self) -> int:
        # Batch ids are consecutive, so the newest one counts those a poll may have missed in between.
        floor = self.baseline_batch if self.baseline_batch is not None else -1
        return max([b - floor for b in self.seen if b > floor], default=0)

    def observe(self, now: float, alive: bool, progress: Mapping[str, Any] | None, health: Health) -> Verdict:
        elapsed = now - self.since
        if not alive:
            return Verdict(FAIL, "the new job's process exited", self._batch_count())
        written = float(((progress or {}).get("kpmon") or {}).get("written_at", 0.0))
        if progress is None or written < self.since:
            if elapsed > self.start_timeout:
                return Verdict(FAIL, f"no progress from the new job within {self.start_timeout:.0f} s")
            return Verdict(WAIT, "starting")
        self.started = True
        if health.status in ("failed", "stalled", "stopped"):
            return Verdict(FAIL, f"{health.status}: {health.reason}", self._batch_count())
        batch = progress.get("batchId")
        if isinstance(batch, int) and not isinstance(batch, bool):
            self.seen.add(batch)
        count = self._batch_count()
        if count >= self.batches and health.status == "healthy":
            return Verdict(PASS, f"{count} batches, {health.reason}", count)
        if elapsed > self.timeout:
            if count >= self.batches:
                return Verdict(
                    FAIL, f"still {health.status} after {self.timeout:.0f} s: {health.reason}", count
                )
            return Verdict(
                FAIL,
                f"only {count} of {self.batches} batches within {self.timeout:.0f} s ({health.reason})",
                count,
            )
        return Verdict(WAIT, f"{count}/{self.batches} batches, {health.status}", count)
