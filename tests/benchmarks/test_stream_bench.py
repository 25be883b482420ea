"""benchmarks/stream_bench.py tells a live run that kept up from one that fell behind (its latencies then
measure a growing backlog, not the job)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from benchmarks.stream_bench import kept_up

START = datetime(2026, 12, 7, 10, 0, tzinfo=UTC).timestamp()


def _batch(second: float, rows: int, arrived: float, processed: float, ms: int) -> dict[str, Any]:
    at = datetime.fromtimestamp(START + second, UTC).isoformat().replace("+00:00", "Z")
    return {
        "timestamp": at,
        "numInputRows": rows,
        "inputRowsPerSecond": arrived,
        "processedRowsPerSecond": processed,
        "durationMs": {"triggerExecution": ms},
    }


def test_a_run_whose_batches_outgrow_the_trigger_fell_behind() -> None:
    """Spark's own progress from a run that fell behind on a 2-vCPU host: each batch took longer than
    its rows took to arrive (batches grew from 1.4 to 8.9 s)."""
    progress = [
        _batch(0, 100, 100, 72, 1391),  # before the warm-up ends: not judged
        *(_batch(20 + 6 * i, 2000 + 200 * i, 395, 320 + 10 * i, 5000 + 500 * i) for i in range(8)),
        _batch(80, 0, 0, 0, 300),  # an empty batch after the feed stopped
    ]
    verdict = kept_up(progress, START + 15)
    assert verdict["kept_up"] is False and verdict["batches_after_warmup"] == 8
    assert verdict["median_input_rows_per_second"] == 395.0


def test_a_run_whose_batches_end_within_the_trigger_kept_up() -> None:
    progress = [_batch(16 + i, 395, 395, 520, 760) for i in range(40)]
    assert kept_up(progress, START + 15)["kept_up"] is True


def test_a_run_with_no_batch_after_the_warm_up_did_not_keep_up() -> None:
    """No batch read anything once the traffic ran: nothing says it kept up."""
    assert kept_up([_batch(5, 100, 100, 500, 200)], START + 15) == {
        "kept_up": False,
        "batches_after_warmup": 0,
    }
